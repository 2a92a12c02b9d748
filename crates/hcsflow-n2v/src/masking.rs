//! Training batches drawn on the device: random patches (with flips and 90° rotations) and
//! N2V2's stratified blind-spot masking with median replacement.
//!
//! Everything here has fixed shapes and runs on the device: patch origins, augmentations and
//! mask positions come from [`DeviceRandom`], the medians from a selection per row on `flex` and
//! from a rank count on GPU backends (no sort, which they would run on the host), and nothing is
//! read back.
//!
//! Masking, as CAREamics' `median_manipulate` with these differences (all to keep shapes fixed
//! and the blind spot exact):
//! - the patch is cut into a `g × g` grid of equal boxes, `g = ceil(P / s)` with CAREamics' box
//!   side `s = sqrt(100 / p)`, and one pixel is drawn uniformly in each box: exactly `g²` masked
//!   pixels per patch. CAREamics lays boxes of side `s` from the corner and drops the points
//!   falling outside the patch, so its count varies (8.2 on average for 64² at 0.2 %; here 9);
//! - the `R × R` replacement window is shifted to lie inside the patch at its borders, so it holds
//!   `R² − 1` distinct pixels besides the centre; CAREamics clips coordinates, which repeats
//!   border pixels and may repeat the centre itself;
//! - the replacement is the lower median of those `R² − 1` values (what `torch.median` returns).

use burn::tensor::{Bool, Device, IndexingUpdateOp, Int, Tensor};

use crate::config::N2vConfig;
use crate::rng::DeviceRandom;

/// Streams of the device generator, one per kind of draw.
const STREAM_ORIGIN_Y: u64 = 1;
const STREAM_ORIGIN_X: u64 = 2;
const STREAM_AUGMENT: u64 = 3;
const STREAM_MASK_Y: u64 = 4;
const STREAM_MASK_X: u64 = 5;

/// One training batch on the device.
#[derive(Debug, Clone)]
pub struct MaskedBatch {
    /// The patches with their masked pixels replaced, `[B, 1, P, P]`: the network's input.
    pub input: Tensor<4>,
    /// The original patches, `[B, 1, P, P]`: the target.
    pub target: Tensor<4>,
    /// 1 where the loss counts (a masked pixel whose value changed), else 0, `[B, 1, P, P]`.
    pub loss_mask: Tensor<4>,
    /// Flat index (`b·P² + y·P + x`) of every masked pixel, `[B·n]`, patch after patch.
    pub centres: Tensor<1, Int>,
}

/// Draws masked training batches from one normalised image that lives on the device.
#[derive(Debug, Clone)]
pub struct Masker {
    rng: DeviceRandom,
    image: Tensor<1>,
    height: usize,
    width: usize,
    patch: usize,
    batch: usize,
    per_side: usize,
    roi: usize,
    augment: bool,
    // Constant index tensors, made once.
    counters_batch: Tensor<1, Int>,
    counters_masks: Tensor<1, Int>,
    rows: Tensor<3, Int>,
    cols: Tensor<3, Int>,
    box_rows: Tensor<2>,
    box_cols: Tensor<2>,
    window_rows: Tensor<3, Int>,
    window_cols: Tensor<3, Int>,
    window_pos: Tensor<3, Int>,
    batch_base: Tensor<2, Int>,
}

impl Masker {
    /// A masker of `image` (row-major `height × width`, already normalised and on `device`).
    /// The image must be at least one patch in each direction (the caller pads smaller ones).
    pub fn new(image: Tensor<1>, height: usize, width: usize, cfg: &N2vConfig, device: &Device) -> Self {
        let (p, b, g, r) = (cfg.patch_size, cfg.batch_size, cfg.masks_per_side(), cfg.roi_size);
        let n = g * g;
        let idx = |n: usize| Tensor::<1, Int>::arange(0..n as i64, device);
        let rows = idx(p).reshape([1, p, 1]).expand([1, p, p]);
        let cols = idx(p).reshape([1, 1, p]).expand([1, p, p]);
        let grid = idx(n);
        let box_rows = grid.clone().div_scalar(g as i64).float().reshape([1, n]);
        let box_cols = grid.remainder_scalar(g as i64).float().reshape([1, n]);
        let k = idx(r * r);
        let window_rows = k.clone().div_scalar(r as i64).reshape([1, 1, r * r]);
        let window_cols = k.clone().remainder_scalar(r as i64).reshape([1, 1, r * r]);
        let window_pos = k.reshape([1, 1, r * r]);
        let batch_base = idx(b).mul_scalar((p * p) as i64).reshape([b, 1]);
        Self {
            rng: DeviceRandom::new(cfg.seed),
            image,
            height,
            width,
            patch: p,
            batch: b,
            per_side: g,
            roi: r,
            augment: cfg.augment,
            counters_batch: DeviceRandom::counters(b, device),
            counters_masks: DeviceRandom::counters(b * n, device),
            rows,
            cols,
            box_rows,
            box_cols,
            window_rows,
            window_cols,
            window_pos,
            batch_base,
        }
    }

    /// Masked pixels per patch (a constant).
    pub fn masks_per_patch(&self) -> usize {
        self.per_side * self.per_side
    }

    /// The patches of training step `step`, `[B, P, P]`: random origins, then (if enabled) one of
    /// the 8 flips/rotations per patch.
    pub fn patches(&self, step: u64) -> Tensor<3> {
        let (p, b) = (self.patch, self.batch);
        let c = || self.counters_batch.clone();
        let oy = self.rng.below(c(), step, STREAM_ORIGIN_Y, self.height - p + 1).reshape([b, 1, 1]);
        let ox = self.rng.below(c(), step, STREAM_ORIGIN_X, self.width - p + 1).reshape([b, 1, 1]);
        let (mut a, mut bb) = (self.rows.clone(), self.cols.clone());
        if self.augment {
            let t = self.rng.below(c(), step, STREAM_AUGMENT, 8).reshape([b, 1, 1]);
            let transpose = t.clone().bitwise_right_shift_scalar(2).bitwise_and_scalar(1);
            let flip_y = t.clone().bitwise_and_scalar(1);
            let flip_x = t.bitwise_right_shift_scalar(1).bitwise_and_scalar(1);
            // a' = a + s·(b − a) swaps the axes where s = 1; a'' = a' + f·(P − 1 − 2a') flips.
            let d = bb.clone() - a.clone();
            let a1 = a.clone() + transpose.clone() * d.clone();
            let b1 = bb - transpose * d;
            a = a1.clone() + flip_y * (a1.mul_scalar(-2).add_scalar(p as i64 - 1));
            bb = b1.clone() + flip_x * (b1.mul_scalar(-2).add_scalar(p as i64 - 1));
        }
        let index = (a + oy).mul_scalar(self.width as i64) + (bb + ox);
        self.image.clone().select(0, index.reshape([b * p * p])).reshape([b, p, p])
    }

    /// The masked batch of training step `step`.
    pub fn batch(&self, step: u64) -> MaskedBatch {
        self.mask(self.patches(step), step)
    }

    /// Masks `patches` (`[B, P, P]`) with the draws of step `step`.
    pub fn mask(&self, patches: Tensor<3>, step: u64) -> MaskedBatch {
        let (p, b, g, r) = (self.patch, self.batch, self.per_side, self.roi);
        let n = g * g;
        let box_side = p as f64 / g as f64;
        let half = (r / 2) as i64;
        let cm = || self.counters_masks.clone();
        // One pixel per box: floor((box + u) · P / g), kept inside the patch against rounding.
        let draw = |boxes: &Tensor<2>, stream: u64| -> Tensor<2, Int> {
            let u = self.rng.uniform(cm(), step, stream).reshape([b, n]);
            (u + boxes.clone()).mul_scalar(box_side).int().clamp(0, p as i64 - 1)
        };
        let y = draw(&self.box_rows, STREAM_MASK_Y);
        let x = draw(&self.box_cols, STREAM_MASK_X);
        let centres = (self.batch_base.clone() + y.clone().mul_scalar(p as i64) + x.clone()).reshape([b * n]);

        // The R × R window around each centre, shifted inside the patch.
        let sy = y.clone().sub_scalar(half).clamp(0, (p - r) as i64);
        let sx = x.clone().sub_scalar(half).clamp(0, (p - r) as i64);
        let centre_pos = ((y - sy.clone()).mul_scalar(r as i64) + (x - sx.clone())).reshape([b * n, 1, 1]);
        let base = self.batch_base.clone() + sy.mul_scalar(p as i64) + sx;
        let window = base.reshape([b * n, 1, 1]) + self.window_rows.clone().mul_scalar(p as i64) + self.window_cols.clone();
        let flat = patches.clone().reshape([b * p * p]);
        let values = flat.clone().select(0, window.reshape([b * n * r * r])).reshape([b * n, 1, r * r]);
        let is_centre: Tensor<3, Bool> = self.window_pos.clone().equal(centre_pos);
        let medians = lower_median_excluding(values, is_centre);

        let masked = flat.clone().scatter(0, centres.clone(), medians, IndexingUpdateOp::Assign);
        let loss_mask = masked.clone().not_equal(flat).float();
        MaskedBatch {
            input: masked.reshape([b, 1, p, p]),
            target: patches.reshape([b, 1, p, p]),
            loss_mask: loss_mask.reshape([b, 1, p, p]),
            centres,
        }
    }
}

/// The lower median of each row of `values` (`[N, 1, K]`, K ≥ 2, finite) without the one entry
/// per row where `excluded` is true: the value of rank `(K − 2) / 2` among the other `K − 1`.
/// The excluded entry becomes the largest value (`f32::MAX`), so it never has that rank; the
/// rank is then found by a selection per row on `flex` ([`crate::host::row_rank`]), by
/// [`rank_by_counting`] elsewhere. Returns `[N]`.
pub fn lower_median_excluding(values: Tensor<3>, excluded: Tensor<3, Bool>) -> Tensor<1> {
    let [n, _, k] = values.dims();
    let rank = (k - 2) / 2;
    let v = values.mask_fill(excluded, f32::MAX);
    match crate::host::row_rank(v.clone().reshape([n, k]), rank) {
        Some(median) => median,
        None => rank_by_counting(v, rank),
    }
}

/// The value of rank `rank` of each row of `v` (`[N, 1, K]`), found by counting (fixed shapes,
/// no sort, so GPU backends need nothing from the host): what [`lower_median_excluding`] runs
/// where the host kernel does not apply. Returns `[N]`.
pub fn rank_by_counting(v: Tensor<3>, rank: usize) -> Tensor<1> {
    let [n, _, k] = v.dims();
    let rank = rank as i64;
    let column = v.clone().reshape([n, k, 1]);
    let less = v.clone().lower(column.clone()).int().sum_dim(2);
    let less_or_equal = v.lower_equal(column.clone()).int().sum_dim(2);
    // Entry i has rank `rank` iff #(v < v_i) <= rank < #(v <= v_i); every such entry holds the
    // same value.
    let hit = less.lower_equal_elem(rank).bool_and(less_or_equal.greater_elem(rank));
    column.mask_fill(hit.bool_not(), f32::MIN).max_dim(1).reshape([n])
}
