//! The training loop: no read from the device except [`readback`], once per epoch.

use std::time::Instant;

use burn::module::Module;
use burn::optim::{AdamConfig, GradientsParams};
use burn::tensor::{Device, Tensor, TensorData};
use ndarray::ArrayView2;

use crate::config::N2vConfig;
use crate::masking::Masker;
use crate::model::UNet;
use crate::{check_image, pad_reflect, Denoiser, N2vError, Normalization};

/// What a training run did.
#[derive(Debug, Clone, PartialEq)]
pub struct TrainReport {
    /// Mean masked loss of each epoch (normalised units), read once per epoch.
    pub epoch_losses: Vec<f64>,
    /// Learning rate used in each epoch (the plateau schedule acts between epochs).
    pub learning_rates: Vec<f64>,
    /// Optimiser steps run.
    pub steps: usize,
    /// Reads from the device during training: one per epoch.
    pub readbacks: usize,
    /// Wall time of training, seconds: from the first step to the end of the running
    /// statistics' estimate.
    pub seconds: f64,
    /// Masked pixels per patch (a constant of the configuration).
    pub masks_per_patch: usize,
}

/// The one place the training loop reads from the device: the sum of an epoch's losses. Counts
/// its calls in `reads`, which the tests compare with the number of epochs.
fn readback(sum: Tensor<1>, reads: &mut usize) -> Result<f64, N2vError> {
    *reads += 1;
    let data = sum.into_data();
    let value = data.try_to_vec::<f32>().map_err(|e| N2vError::Device(format!("{e:?}")))?;
    value.first().map(|&v| v as f64).ok_or_else(|| N2vError::Device("empty loss".into()))
}

/// MSE over the pixels where `mask` is 1 (CAREamics' `n2v_loss`: `sum(mask · (pred − target)²) /
/// sum(mask)`); a batch without any changed pixel gives 0, not NaN. Returns `[1]`.
pub fn masked_mse(prediction: Tensor<4>, target: Tensor<4>, mask: Tensor<4>) -> Tensor<1> {
    let count = mask.clone().sum().clamp_min(1.0);
    (prediction - target).square().mul(mask).sum().div(count)
}

/// Batch norm's running statistics estimated again with the final weights: the plain mean of
/// the batch statistics of `cfg.norm_batches` forward passes over new batches (the steps after
/// the last), through momentum `1/(k + 1)` for pass `k`; nothing with 0 batches. Training's
/// exponential average (momentum 0.1) weighs the last ten steps' statistics, each of different
/// weights than the final ones, and inference applies it to every pixel.
///
/// The passes run on a copy of `model` whose parameters are not tracked (no autodiff graph is
/// kept: tracked, each pass held its activations, ≈ 1 GiB for 8 batches of 16 × 64²) and whose
/// running statistics are `model`'s own (burn's `RunningState` is shared by clones).
fn estimate_norm_statistics(model: &UNet, masker: &Masker, cfg: &N2vConfig) {
    let mut untracked = model.clone().no_grad();
    for k in 0..cfg.norm_batches {
        untracked.set_norm_momentum(1.0 / (k + 1) as f64);
        let batch = masker.batch((cfg.total_steps() + k) as u64);
        drop(untracked.forward(batch.input));
    }
}

/// PyTorch's `ReduceLROnPlateau` in mode `min` (relative threshold 1e-4, no cooldown), stepped
/// on each epoch's training loss.
#[derive(Debug, Clone)]
struct Plateau {
    factor: f64,
    patience: usize,
    best: f64,
    bad: usize,
}

impl Plateau {
    fn step(&mut self, loss: f64, lr: f64) -> f64 {
        if loss < self.best * (1.0 - 1e-4) {
            self.best = loss;
            self.bad = 0;
            lr
        } else {
            self.bad += 1;
            if self.bad > self.patience {
                self.bad = 0;
                lr * self.factor
            } else {
                lr
            }
        }
    }
}

/// Trains N2V2 on `image` (one 2-D plane, any size, finite values) on `device` (a plain device:
/// training runs on `device.autodiff()`, prediction on `device`).
///
/// Normalises with the image's mean and standard deviation, draws `epochs × steps_per_epoch`
/// batches of masked patches on the device and takes one Adam step per batch, then estimates
/// batch norm's running statistics again with the final weights (`cfg.norm_batches` more
/// batches, forward only; included in [`TrainReport::seconds`]). An image smaller
/// than a patch is mirrored up to the patch size. Deterministic: the same image, settings and
/// backend give the same model.
pub fn train(image: ArrayView2<f32>, cfg: &N2vConfig, device: &Device) -> Result<(Denoiser, TrainReport), N2vError> {
    cfg.validate()?;
    check_image(image)?;
    let norm = Normalization::of(image);
    let (h, w) = image.dim();
    let (ph, pw) = (h.max(cfg.patch_size), w.max(cfg.patch_size));
    // The normalised image is the one copy training keeps (as the masker's tensor); an image at
    // least one patch large is not padded first.
    let values: Vec<f32> = if (ph, pw) == (h, w) {
        image.iter().map(|&v| norm.apply(v)).collect()
    } else {
        pad_reflect(image, ph, pw).iter().map(|&v| norm.apply(v)).collect()
    };

    let ad = device.clone().autodiff();
    let masker = Masker::new(Tensor::from_data(TensorData::new(values, [ph * pw]), &ad), ph, pw, cfg, &ad);
    let mut model = UNet::new(cfg.features, cfg.seed, &ad);
    let mut optim = AdamConfig::new().with_epsilon(1e-8).init();
    let mut plateau = Plateau { factor: cfg.plateau_factor, patience: cfg.plateau_patience, best: f64::INFINITY, bad: 0 };
    let mut lr = cfg.learning_rate;
    let mut report = TrainReport {
        epoch_losses: Vec::with_capacity(cfg.epochs),
        learning_rates: Vec::with_capacity(cfg.epochs),
        steps: 0,
        readbacks: 0,
        seconds: 0.0,
        masks_per_patch: masker.masks_per_patch(),
    };
    let start = Instant::now();
    for epoch in 0..cfg.epochs {
        let mut sum: Option<Tensor<1>> = None;
        for s in 0..cfg.steps_per_epoch {
            let step = (epoch * cfg.steps_per_epoch + s) as u64;
            let batch = masker.batch(step);
            let loss = masked_mse(model.forward(batch.input), batch.target, batch.loss_mask);
            let grads = GradientsParams::from_grads(loss.backward(), &model);
            model = optim.step(lr, model, grads);
            let loss = loss.detach();
            sum = Some(match sum {
                Some(acc) => acc + loss,
                None => loss,
            });
            report.steps += 1;
        }
        let total = match sum {
            Some(sum) => readback(sum, &mut report.readbacks)?,
            None => 0.0,
        };
        let mean = total / cfg.steps_per_epoch as f64;
        report.epoch_losses.push(mean);
        report.learning_rates.push(lr);
        lr = plateau.step(mean, lr);
    }
    estimate_norm_statistics(&model, &masker, cfg);
    report.seconds = start.elapsed().as_secs_f64();
    let model = model.valid();
    Ok((Denoiser::new(model, norm, cfg.clone(), device.clone()), report))
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::rng::SplitMix64;

    /// The largest difference between the network in inference (running statistics) and in
    /// training mode (the batch's statistics) on `input`, relative to the largest output. The
    /// training-mode pass updates the running statistics, as any does.
    fn inference_gap(model: &UNet, input: &Tensor<4>, device: &Device) -> f64 {
        let plain = Tensor::<4>::from_data(input.to_data(), device);
        let inference = model.clone().valid().forward(plain).into_data().try_to_vec::<f32>().unwrap();
        let training = model.forward(input.clone()).into_data().try_to_vec::<f32>().unwrap();
        let scale = training.iter().fold(0f32, |m, v| m.max(v.abs())).max(1e-6) as f64;
        inference.iter().zip(&training).map(|(a, b)| (a - b).abs() as f64).fold(0.0, f64::max) / scale
    }

    #[test]
    fn running_statistics_estimated_again_are_those_of_the_final_weights() {
        let cfg = N2vConfig {
            patch_size: 16,
            batch_size: 4,
            steps_per_epoch: 8,
            epochs: 1,
            features: 8,
            norm_batches: 1,
            ..N2vConfig::default()
        };
        let device = Device::flex();
        let ad = device.clone().autodiff();
        let (h, w) = (40, 36);
        let mut rng = SplitMix64::new(5);
        let values: Vec<f32> = (0..h * w).map(|_| (rng.next_f64() * 2.0 - 1.0) as f32).collect();
        let masker = Masker::new(Tensor::from_data(TensorData::new(values, [h * w]), &ad), h, w, &cfg, &ad);
        let mut model = UNet::new(cfg.features, cfg.seed, &ad);
        let mut optim = AdamConfig::new().with_epsilon(1e-8).init();
        for step in 0..cfg.total_steps() {
            let batch = masker.batch(step as u64);
            let loss = masked_mse(model.forward(batch.input), batch.target, batch.loss_mask);
            let grads = GradientsParams::from_grads(loss.backward(), &model);
            model = optim.step(cfg.learning_rate, model, grads);
        }
        // The batch the estimate uses with one batch: the step after the last.
        let input = masker.batch(cfg.total_steps() as u64).input;
        // Training's exponential average (8 steps of momentum 0.1 from mean 0, variance 1) is far
        // from the final weights' statistics.
        let before = inference_gap(&model, &input, &device);
        estimate_norm_statistics(&model, &masker, &cfg);
        let after = inference_gap(&model, &input, &device);
        assert!(after < 1e-4, "inference vs training mode after the estimate: {after:e}");
        assert!(before > 100.0 * after, "before the estimate {before:e}, after {after:e}");
        // Without batches the running statistics stay as they are (a training-mode forward pass
        // would move them).
        let plain = Tensor::<4>::from_data(input.to_data(), &device);
        let inference = |model: &UNet| model.clone().valid().forward(plain.clone()).into_data().try_to_vec::<f32>().unwrap();
        let kept = inference(&model);
        estimate_norm_statistics(&model, &masker, &N2vConfig { norm_batches: 0, ..cfg });
        assert_eq!(inference(&model), kept);
    }
}
