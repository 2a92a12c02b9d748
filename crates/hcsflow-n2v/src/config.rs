//! Training and prediction settings, with CAREamics' N2V2 defaults.

use serde::{Deserialize, Serialize};

use crate::N2vError;

/// Settings of one N2V2 training run and of tiled prediction.
///
/// The defaults are CAREamics' N2V2 choices (`create_n2v_config(..., use_n2v2=True)`) where
/// CAREamics has one, so results are comparable; see the crate documentation for where and why
/// this crate differs.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct N2vConfig {
    /// Side of the square training patches, in pixels: a multiple of 4 (2^depth) and at least 16
    /// (the 11 × 11 replacement window must fit). CAREamics: 64.
    pub patch_size: usize,
    /// Patches per training step. CAREamics: user choice; the benchmark uses 16.
    pub batch_size: usize,
    /// Optimiser steps per epoch. CAREamics' `num_steps`; the benchmark uses 100.
    pub steps_per_epoch: usize,
    /// Epochs; the training loss is read from the device once per epoch.
    pub epochs: usize,
    /// Seed of the patch origins, augmentations, masks and initial weights. The same seed, data
    /// and settings give the same model.
    pub seed: u64,
    /// Percentage of pixels masked per patch (CAREamics `masked_pixel_percentage`, 0.2 %;
    /// allowed 0.05 to 10 as in CAREamics).
    pub masked_pixel_percentage: f64,
    /// Side of the odd window whose median (without its centre) replaces a masked pixel
    /// (CAREamics `roi_size`, 11; allowed 3 to 21).
    pub roi_size: usize,
    /// Adam's learning rate. CAREamics leaves PyTorch's default, 1e-3.
    pub learning_rate: f64,
    /// Factor of the plateau schedule (PyTorch `ReduceLROnPlateau` default 0.1).
    pub plateau_factor: f64,
    /// Epochs without improvement before the learning rate is reduced (PyTorch default 10).
    pub plateau_patience: usize,
    /// Random flips and 90° rotations of training patches (CAREamics' default augmentations).
    pub augment: bool,
    /// Batches of masked patches over which batch norm's running statistics are estimated
    /// again with the final weights after the last step (forward passes only, their plain
    /// mean), 8 by default; 0 keeps the exponential average of the training steps, as CAREamics
    /// does. That average mixes in statistics of earlier weights: on the benchmark pair it left
    /// outputs up to 1.5× too bright after 208 steps, on both sides.
    pub norm_batches: usize,
    /// Features of the first U-Net level (CAREamics `num_channels_init`, 32).
    pub features: usize,
    /// Largest side of the square prediction tiles, a multiple of 4: an image is cut into the
    /// fewest tiles of at most this side. 512 by default: a tile's overlapping border is then a
    /// smaller share of it than with CAREamics' usual 256 (≈ 1.2× the pixels of a 1024² or 2048²
    /// image run through the network instead of ≈ 1.5×), in the same memory as 4 tiles of 256.
    pub tile_size: usize,
    /// Overlap of neighbouring prediction tiles, blended linearly. CAREamics benchmark: 48.
    pub tile_overlap: usize,
    /// Tiles per forward pass in prediction (1 by default: the host kernels share one tile's
    /// channels among the threads, and more tiles at once cost memory for little speed).
    pub tile_batch: usize,
}

impl Default for N2vConfig {
    fn default() -> Self {
        Self {
            patch_size: 64,
            batch_size: 16,
            steps_per_epoch: 100,
            epochs: 2,
            seed: 1,
            masked_pixel_percentage: 0.2,
            roi_size: 11,
            learning_rate: 1e-3,
            plateau_factor: 0.1,
            plateau_patience: 10,
            augment: true,
            norm_batches: 8,
            features: 32,
            tile_size: 512,
            tile_overlap: 48,
            tile_batch: 1,
        }
    }
}

/// Depth of the U-Net (CAREamics N2V2: 2): images and tiles are padded to multiples of
/// `2^DEPTH`.
pub const DEPTH: usize = 2;
/// The multiple every network input side must be.
pub const SIDE_MULTIPLE: usize = 1 << DEPTH;

impl N2vConfig {
    /// Checks every setting; the error names the first bad one.
    pub fn validate(&self) -> Result<(), N2vError> {
        let bad = |what: String| Err(N2vError::Config(what));
        if self.patch_size < 16 || !self.patch_size.is_multiple_of(SIDE_MULTIPLE) {
            return bad(format!("patch_size must be a multiple of {SIDE_MULTIPLE} and at least 16, got {}", self.patch_size));
        }
        if self.roi_size < 3 || self.roi_size > 21 || self.roi_size.is_multiple_of(2) {
            return bad(format!("roi_size must be odd, 3 to 21, got {}", self.roi_size));
        }
        if self.roi_size > self.patch_size {
            return bad(format!("roi_size {} exceeds patch_size {}", self.roi_size, self.patch_size));
        }
        if self.batch_size == 0 || self.steps_per_epoch == 0 || self.epochs == 0 {
            return bad(format!(
                "batch_size, steps_per_epoch and epochs must be at least 1, got {}, {}, {}",
                self.batch_size, self.steps_per_epoch, self.epochs
            ));
        }
        if !(0.05..=10.0).contains(&self.masked_pixel_percentage) {
            return bad(format!("masked_pixel_percentage must be 0.05 to 10, got {}", self.masked_pixel_percentage));
        }
        if !(self.learning_rate.is_finite() && self.learning_rate > 0.0) {
            return bad(format!("learning_rate must be positive, got {}", self.learning_rate));
        }
        if !(self.plateau_factor > 0.0 && self.plateau_factor <= 1.0) {
            return bad(format!("plateau_factor must be in (0, 1], got {}", self.plateau_factor));
        }
        if self.features == 0 || self.features > 1024 {
            return bad(format!("features must be 1 to 1024, got {}", self.features));
        }
        if self.tile_size < 16 || !self.tile_size.is_multiple_of(SIDE_MULTIPLE) {
            return bad(format!("tile_size must be a multiple of {SIDE_MULTIPLE} and at least 16, got {}", self.tile_size));
        }
        if self.tile_overlap > self.tile_size / 2 || !self.tile_overlap.is_multiple_of(2) {
            return bad(format!("tile_overlap must be even and at most half the tile size, got {}", self.tile_overlap));
        }
        if self.tile_batch == 0 {
            return bad("tile_batch must be at least 1".into());
        }
        // The device-side random numbers are 31-bit integers: keep every index below 2^31.
        if self.batch_size * self.patch_size * self.patch_size >= 1 << 30 {
            return bad("batch_size × patch_size² is too large".into());
        }
        Ok(())
    }

    /// Masked pixels per patch: one per box of a `g × g` grid, `g = ceil(patch / s)`, where `s =
    /// sqrt(100 / masked_pixel_percentage)` is CAREamics' box side. A constant, so the masks
    /// have fixed shapes on the device.
    pub fn masks_per_side(&self) -> usize {
        let side = (100.0 / self.masked_pixel_percentage).sqrt();
        ((self.patch_size as f64 / side).ceil() as usize).max(1)
    }

    /// Total optimiser steps (`epochs × steps_per_epoch`).
    pub fn total_steps(&self) -> usize {
        self.epochs * self.steps_per_epoch
    }
}
