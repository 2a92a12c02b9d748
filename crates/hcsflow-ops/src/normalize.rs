//! Percentile normalisation (contrast stretching), per slice and whole stack.
//!
//! `lo, hi = np.percentile(x, (low_percentile, high_percentile))` (numpy's
//! default `'linear'` method, exact: computed from a 256 / 65,536-bin histogram
//! for u8 / u16 and by exact histogram selection for f32, where NaN is ignored
//! like `np.nanpercentile`), then
//! `(clip(x, lo, hi) - lo) * (target_max - target_min) / (hi - lo) + target_min`
//! in f64. If `hi == lo` every pixel becomes `target_min` (as OpenHCS).
//!
//! Output dtype = input dtype. u8/u16 go through a lookup table of every
//! possible value, rounded to nearest (ties to even) and clipped to the dtype
//! range (OpenHCS truncates with `astype(uint16)`; we round, like the dtype
//! policy). f32 output is the f64 value rounded to f32, NaN stays NaN.
//! Results equal numpy's float64 formula rounded the same way, exactly.

use std::borrow::Cow;

use hcsflow_core::{
    ArgSpec, Args, Contract, FunctionError, FunctionSpec, Implementation, Pixel, Registry, Stack,
};
use ndarray::Array3;
use rayon::prelude::*;

use crate::histogram::{percentiles_f32, percentiles_int, Binned};

/// Pixels per parallel task when applying a lookup table.
const CHUNK: usize = 1 << 18;

/// Arguments of percentile normalisation (OpenHCS names and defaults).
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct PercentileNormalize {
    pub low_percentile: f64,
    pub high_percentile: f64,
    pub target_min: f64,
    pub target_max: f64,
}

impl Default for PercentileNormalize {
    fn default() -> Self {
        PercentileNormalize { low_percentile: 1.0, high_percentile: 99.0, target_min: 0.0, target_max: 65535.0 }
    }
}

impl PercentileNormalize {
    /// From the validated arguments of the registered functions.
    pub fn from_args(args: &Args) -> Self {
        PercentileNormalize {
            low_percentile: args.float("low_percentile"),
            high_percentile: args.float("high_percentile"),
            target_min: args.float("target_min"),
            target_max: args.float("target_max"),
        }
    }

    /// The mapping of one value once `lo`/`hi` are known (f64, unrounded).
    #[inline]
    pub fn map(&self, v: f64, lo: f64, hi: f64) -> f64 {
        if hi == lo {
            return self.target_min;
        }
        (v.clamp(lo, hi) - lo) * (self.target_max - self.target_min) / (hi - lo) + self.target_min
    }
}

/// The pixels of a stack as one contiguous slice (a copy only if the array is
/// not in standard layout).
pub(crate) fn contiguous<T: Pixel>(a: &Array3<T>) -> Cow<'_, [T]> {
    match a.as_slice() {
        Some(s) => Cow::Borrowed(s),
        None => Cow::Owned(a.iter().copied().collect()),
    }
}

/// Rounds to nearest (ties to even) in f64 and saturates to `[0, max]`; NaN → 0.
#[inline]
pub(crate) fn round_clip(v: f64, max: f64) -> f64 {
    if v.is_nan() {
        0.0
    } else {
        v.round_ties_even().clamp(0.0, max)
    }
}

/// A lookup table over every value of an integer dtype: `f` then round/clip.
pub fn integer_lut<T: Binned + Pixel>(f: impl Fn(f64) -> f64) -> Vec<T> {
    let max = T::max_value().to_f32() as f64;
    (0..T::BINS).map(|v| T::from_f32_clip(round_clip(f(v as f64), max) as f32)).collect()
}

/// Applies `lut` to every pixel, in parallel (the output is written once, not zeroed first).
pub(crate) fn apply_lut<T: Binned + Pixel>(data: &[T], lut: &[T]) -> Vec<T> {
    let mut out = Vec::with_capacity(data.len());
    data.par_iter().with_min_len(CHUNK).map(|&v| lut[v.bin()]).collect_into_vec(&mut out);
    out
}

fn normalize_int<T: Binned + Pixel>(a: &Array3<T>, p: &PercentileNormalize) -> Option<Array3<T>> {
    let data = contiguous(a);
    let q = percentiles_int(&data, &[p.low_percentile, p.high_percentile])?;
    let lut = integer_lut::<T>(|v| p.map(v, q[0], q[1]));
    Array3::from_shape_vec(a.raw_dim(), apply_lut(&data, &lut)).ok()
}

fn normalize_f32(a: &Array3<f32>, p: &PercentileNormalize) -> Option<Array3<f32>> {
    let data = contiguous(a);
    let q = percentiles_f32(&data, &[p.low_percentile, p.high_percentile])?;
    let mut out = vec![0f32; data.len()];
    out.par_chunks_mut(CHUNK).zip(data.par_chunks(CHUNK)).for_each(|(o, d)| {
        o.iter_mut().zip(d).for_each(|(o, &v)| *o = if v.is_nan() { v } else { p.map(v as f64, q[0], q[1]) as f32 });
    });
    Array3::from_shape_vec(a.raw_dim(), out).ok()
}

/// Percentile-normalises the whole stack with one pair of percentiles computed
/// over all its pixels (see the module docs for the exact contract). Per-slice
/// normalisation is the same call on each plane (`percentile_normalize`,
/// pure_2d, in the registry).
pub fn percentile_normalize(stack: &Stack, p: &PercentileNormalize) -> Result<Stack, FunctionError> {
    const NAME: &str = "percentile_normalize";
    if p.low_percentile > p.high_percentile {
        return Err(FunctionError::failed(
            NAME,
            format!("low_percentile ({}) must not exceed high_percentile ({})", p.low_percentile, p.high_percentile),
        ));
    }
    let empty = || FunctionError::failed(NAME, "the stack has no pixels (or only NaN)");
    Ok(match stack {
        Stack::U8(a) => Stack::U8(normalize_int(a, p).ok_or_else(empty)?),
        Stack::U16(a) => Stack::U16(normalize_int(a, p).ok_or_else(empty)?),
        Stack::F32(a) => Stack::F32(normalize_f32(a, p).ok_or_else(empty)?),
    })
}

/// The arguments both registered normalisations take.
fn normalize_args() -> Vec<ArgSpec> {
    vec![
        ArgSpec::float("low_percentile", 1.0, Some(0.0), Some(100.0), "lower percentile (numpy 'linear'), mapped to target_min"),
        ArgSpec::float("high_percentile", 99.0, Some(0.0), Some(100.0), "upper percentile, mapped to target_max"),
        ArgSpec::float("target_min", 0.0, None, None, "output value of the low percentile"),
        ArgSpec::float("target_max", 65535.0, None, None, "output value of the high percentile (use 255 for u8)"),
    ]
}

pub(crate) fn register(registry: &mut Registry) {
    registry.register(
        FunctionSpec {
            name: "percentile_normalize",
            doc: "Per-slice percentile contrast stretch (np.percentile 'linear', exact via histograms); keeps the dtype.",
            contract: Contract::Pure2d,
            args: normalize_args(),
        },
        Implementation::host(|s, a| percentile_normalize(s, &PercentileNormalize::from_args(a))),
    );
    registry.register(
        FunctionSpec {
            name: "stack_percentile_normalize",
            doc: "Whole-stack percentile contrast stretch (one np.percentile pair over all planes, exact); keeps the dtype.",
            contract: Contract::Pure3d,
            args: normalize_args(),
        },
        Implementation::host(|s, a| percentile_normalize(s, &PercentileNormalize::from_args(a))),
    );
}
