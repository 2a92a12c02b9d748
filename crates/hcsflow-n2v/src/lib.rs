//! N2V2 self-supervised denoising (Höck et al. 2022) on burn: train on the noisy image itself,
//! predict tiled, on the host (`flex`) or, with the `wgpu` feature, on a GPU, from the same code.
//!
//! ```no_run
//! use burn::tensor::Device;
//! use hcsflow_n2v::{train, N2vConfig};
//! # let noisy = ndarray::Array2::<f32>::zeros((512, 512));
//! let (denoiser, report) = train(noisy.view(), &N2vConfig::default(), &Device::flex())?;
//! let clean = denoiser.predict(noisy.view())?;
//! denoiser.save(std::path::Path::new("model"))?;
//! # Ok::<(), hcsflow_n2v::N2vError>(())
//! ```
//!
//! As CAREamics' N2V2 mode (U-Net depth 2, 32 features, batch norm, MaxBlurPool, no top skip, no
//! residual; stratified masking at 0.2 % with the median of the 11 × 11 neighbourhood without
//! its centre; MSE on the masked pixels whose value changed; Adam with a plateau schedule;
//! mean/std normalisation; random flips and 90° rotations). Where it differs, and why:
//! - masking has a fixed count per patch (one pixel per box of an exact `g × g` grid) and a
//!   replacement window shifted inside the patch at its borders ([`masking`]): fixed shapes on
//!   the device and an exact blind spot;
//! - random numbers come from a counter-based hash evaluated on the device ([`rng`]), so a seed
//!   gives the same run on every backend and thread;
//! - the plateau schedule watches the training loss (CAREamics: the validation loss); batch norm's
//!   running variance is the biased one (PyTorch keeps the unbiased one; the difference is
//!   `1/(B·P²)` relative);
//! - prediction pads to multiples of 4 and blends overlapping tiles linearly, so any size works
//!   (CAREamics fails on sizes not divisible by 2^depth without tiling, careamics#363);
//! - after the last step, batch norm's running statistics are estimated again with the final
//!   weights (their mean over [`N2vConfig::norm_batches`] batches, 8, forward only; 0 keeps
//!   CAREamics' behaviour). Training's exponential average mixes in statistics of earlier
//!   weights: after bench_n2v.py's 208 steps it left outputs too bright by up to 1.5× on both
//!   sides (the slope of the best affine fit of the truth to the output: 0.67 for our seed 3,
//!   0.76 for CAREamics' seed 1), which cost up to 7 dB of PSNR; estimated again, seeds 1–6 gave
//!   35.2–38.0 dB where they gave 28.0–35.3 (CAREamics: 30.5–34.5).
//!
//! **Host–device synchronisation**: the training loop reads from the device in exactly one place,
//! once per epoch (the epoch's summed loss, [`TrainReport::readbacks`]); prediction reads once per
//! image (the blended canvas).
//!
//! **On the host** the U-Net's layers run as host kernels written for `flex` ([`host`]: 3 × 3
//! convolutions as Winograd or direct AVX-512 kernels, gemms on a padded copy elsewhere, forward
//! and backward; the 1 × 1 head; MaxBlurPool, upsampling and batch norm + ReLU as single passes;
//! masking's medians as a selection per row), checked against burn's own formulation of each
//! (which the wgpu path runs) for values and gradients.
//!
//! **Measured** (`examples/bench_n2v.rs` on bench_n2v.py's 1024² pair, 208 steps of patch 64 ×
//! batch 16, `flex`, on the shared 2-core AVX-512 machine, 2026-11-28 at ca47830, side by side
//! with CAREamics 0.3.5 on torch 2.10): PSNR 22.00 → 34.62 dB (CAREamics 30.48; seeds 1–6 34.0–37.0
//! against 30.5–34.5), 0.144 s per step (CAREamics 0.241), 0.58 s to predict 1024² and 2.38 s for
//! 2048² (4.76 and 20.3), peak RSS 275 MiB (1.8 GiB). A seed's PSNR moves by up to 3 dB from one
//! build's rounding to another's (each trains along another path). The README's benchmark section
//! has the history and where the time goes.

pub mod config;
pub mod function;
pub mod host;
pub mod masking;
pub mod model;
mod predict;
pub mod rng;
mod store;
mod train;

use std::path::PathBuf;

use burn::tensor::Device;
use ndarray::{Array2, ArrayView2};
use serde::{Deserialize, Serialize};

pub use config::N2vConfig;
pub use function::{n2v_denoise, register, N2vDenoiseArgs, N2V_DENOISE};
pub use model::UNet;
pub use store::{FORMAT, META_FILE, WEIGHTS_FILE};
pub use train::{masked_mse, train, TrainReport};

/// What can go wrong training, predicting, saving or loading.
#[derive(Debug, thiserror::Error)]
pub enum N2vError {
    /// A setting out of range.
    #[error("bad N2V setting: {0}")]
    Config(String),
    /// An image that cannot be used (empty, NaN or infinite values).
    #[error("bad image: {0}")]
    Image(String),
    /// Reading a result back from the device failed.
    #[error("reading from the device: {0}")]
    Device(String),
    /// A file of a saved model could not be read or written.
    #[error("{}: {source}", path.display())]
    Io {
        /// The file.
        path: PathBuf,
        /// What failed.
        source: std::io::Error,
    },
    /// A saved model that is not one (bad JSON, wrong format, weights that do not fit).
    #[error("{}: {reason}", path.display())]
    Model {
        /// The file.
        path: PathBuf,
        /// What is wrong.
        reason: String,
    },
}

/// Mean/std normalisation (CAREamics' default): the network sees `(x − mean) / std`.
#[derive(Debug, Clone, Copy, PartialEq, Serialize, Deserialize)]
pub struct Normalization {
    /// Mean of the training image.
    pub mean: f64,
    /// Standard deviation of the training image (1 for a constant image).
    pub std: f64,
}

impl Normalization {
    /// The mean and (population) standard deviation of `image`, accumulated in f64.
    pub fn of(image: ArrayView2<f32>) -> Self {
        let n = image.len().max(1) as f64;
        let mean = image.iter().map(|&v| v as f64).sum::<f64>() / n;
        let var = image.iter().map(|&v| (v as f64 - mean).powi(2)).sum::<f64>() / n;
        let std = var.sqrt();
        Self { mean, std: if std > 0.0 && std.is_finite() { std } else { 1.0 } }
    }

    /// `(v − mean) / std`.
    pub fn apply(&self, v: f32) -> f32 {
        ((v as f64 - self.mean) / self.std) as f32
    }

    /// `v · std + mean`.
    pub fn invert(&self, v: f32) -> f32 {
        (v as f64 * self.std + self.mean) as f32
    }
}

/// A trained N2V2 network with its normalisation and settings: predicts, saves, loads.
#[derive(Debug, Clone)]
pub struct Denoiser {
    model: UNet,
    norm: Normalization,
    config: N2vConfig,
    device: Device,
}

impl Denoiser {
    fn new(model: UNet, norm: Normalization, config: N2vConfig, device: Device) -> Self {
        Self { model, norm, config, device }
    }

    /// The normalisation of the training image.
    pub fn normalization(&self) -> Normalization {
        self.norm
    }

    /// The settings it was trained with (tiling settings apply to [`Denoiser::predict`]).
    pub fn config(&self) -> &N2vConfig {
        &self.config
    }

    /// The network (inference mode: batch norm uses its running statistics).
    pub fn model(&self) -> &UNet {
        &self.model
    }

    /// The device it predicts on.
    pub fn device(&self) -> &Device {
        &self.device
    }

    /// The same network with other prediction tiling (`tile_size`, `tile_overlap`,
    /// `tile_batch`); the other settings are kept.
    pub fn with_tiling(mut self, tile_size: usize, tile_overlap: usize, tile_batch: usize) -> Result<Self, N2vError> {
        let mut cfg = self.config.clone();
        cfg.tile_size = tile_size;
        cfg.tile_overlap = tile_overlap;
        cfg.tile_batch = tile_batch;
        cfg.validate()?;
        self.config = cfg;
        Ok(self)
    }

    /// The network on another device (e.g. trained on the GPU, predicting on the host).
    pub fn to_device(self, device: &Device) -> Self {
        use burn::module::Module;
        Self { model: self.model.to_device(device), device: device.clone(), ..self }
    }
}

/// Refuses empty images and NaN or infinite values.
fn check_image(image: ArrayView2<f32>) -> Result<(), N2vError> {
    let (h, w) = image.dim();
    if h == 0 || w == 0 {
        return Err(N2vError::Image(format!("the image is {h}×{w}")));
    }
    if let Some(((y, x), v)) = image.indexed_iter().find(|(_, v)| !v.is_finite()) {
        return Err(N2vError::Image(format!("pixel (row {y}, column {x}) is {v}")));
    }
    Ok(())
}

/// Index `i` of an axis of length `n` mirrored into `0..n` (`dcb|abcd|cba`, as `numpy.pad` mode
/// `reflect`), repeating the edge for `n == 1`.
fn reflect_index(i: isize, n: usize) -> usize {
    if n == 1 {
        return 0;
    }
    let period = 2 * (n as isize - 1);
    let m = i.rem_euclid(period);
    (if m < n as isize { m } else { period - m }) as usize
}

/// `image` extended to `height × width` (at least its own size) by mirroring at the bottom and
/// right edges.
fn pad_reflect(image: ArrayView2<f32>, height: usize, width: usize) -> Array2<f32> {
    let (h, w) = image.dim();
    Array2::from_shape_fn((height.max(h), width.max(w)), |(y, x)| image[[reflect_index(y as isize, h), reflect_index(x as isize, w)]])
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn reflect_index_mirrors_without_repeating_the_edge() {
        let got: Vec<usize> = (-3..8).map(|i| reflect_index(i, 4)).collect();
        assert_eq!(got, vec![3, 2, 1, 0, 1, 2, 3, 2, 1, 0, 1]);
        assert!((-5..5).all(|i| reflect_index(i, 1) == 0));
    }
}
