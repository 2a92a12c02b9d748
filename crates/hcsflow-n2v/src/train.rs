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
    /// Wall time of the loop, seconds (from the first step to the last epoch's read).
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
/// batches of masked patches on the device and takes one Adam step per batch. An image smaller
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
    report.seconds = start.elapsed().as_secs_f64();
    let model = model.valid();
    Ok((Denoiser::new(model, norm, cfg.clone(), device.clone()), report))
}
