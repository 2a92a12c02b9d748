//! Percentile normalisation (contrast stretching), per slice and whole stack.
//!
//! `lo, hi = np.percentile(x, (low_percentile, high_percentile))` (numpy's
//! default `'linear'` method, exact: for u8 / u16 from the windows of a
//! sample or a full 256 / 65,536-bin histogram, see
//! [`crate::histogram::order_statistics_int`], and by exact histogram
//! selection for f32, where NaN is ignored like `np.nanpercentile`), then
//! `(clip(x, lo, hi) - lo) * (target_max - target_min) / (hi - lo) + target_min`
//! in f64. If `hi == lo` every pixel becomes `target_min` (as OpenHCS).
//!
//! Output dtype = input dtype. u8/u16 go through a lookup table of every
//! possible value, rounded to nearest (ties to even) and clipped to the dtype
//! range (OpenHCS truncates with `astype(uint16)`; we round, like the dtype
//! policy). For u16 on CPUs with AVX-512 the table is applied as fixed-point
//! arithmetic when that reproduces every entry (module `affine`). f32 output
//! is the f64 value rounded to f32, NaN stays NaN. Results equal numpy's
//! float64 formula rounded the same way, exactly.

use hcsflow_core::{same_shape, ArgProblem, Contract, FunctionDecl, FunctionError, Pixel, Registry, Stack, StackShape};
use rayon::prelude::*;

use crate::histogram::{percentiles_f32, percentiles_int, Binned};

mod affine;
use affine::AffineStretch;

/// Pixels per parallel task when applying a lookup table.
const CHUNK: usize = 1 << 18;

hcsflow_core::function_args! {
    /// Arguments of percentile normalisation (OpenHCS names and defaults):
    /// those of [`PERCENTILE_NORMALIZE`] and [`STACK_PERCENTILE_NORMALIZE`].
    #[derive(Copy)]
    pub struct PercentileNormalize {
        low_percentile: f64 = float(1.0, Some(0.0), Some(100.0), "lower percentile (numpy 'linear'), mapped to target_min"),
        high_percentile: f64 = float(99.0, Some(0.0), Some(100.0), "upper percentile, mapped to target_max"),
        target_min: f64 = float(0.0, None, None, "output value of the low percentile"),
        target_max: f64 = float(65535.0, None, None, "output value of the high percentile (use 255 for u8)"),
    }
}

impl Default for PercentileNormalize {
    fn default() -> Self {
        PercentileNormalize { low_percentile: 1.0, high_percentile: 99.0, target_min: 0.0, target_max: 65535.0 }
    }
}

impl PercentileNormalize {
    /// The mapping of one value once `lo`/`hi` are known (f64, unrounded).
    #[inline]
    pub fn map(&self, v: f64, lo: f64, hi: f64) -> f64 {
        if hi == lo {
            return self.target_min;
        }
        (v.clamp(lo, hi) - lo) * (self.target_max - self.target_min) / (hi - lo) + self.target_min
    }
}

/// Rounds to nearest (ties to even) in f64 and saturates to `[0, max]`; NaN → 0.
///
/// `max` must be below 2⁵²: inside `(0, max)` the rounding is `(v + 2⁵²) − 2⁵²`,
/// exact ties-to-even in the default rounding mode (the same value as
/// `round_ties_even`, which without SSE4.1 is a library call: a 65,536-entry
/// lookup table would spend a third of a millisecond in it).
#[inline]
pub(crate) fn round_clip(v: f64, max: f64) -> f64 {
    const TWO_52: f64 = 4_503_599_627_370_496.0;
    if v.is_nan() || v <= 0.0 {
        0.0
    } else if v >= max {
        max
    } else {
        ((v + TWO_52) - TWO_52).min(max)
    }
}

/// A lookup table over every value of an integer dtype: `f` then round/clip.
pub fn integer_lut<T: Binned + Pixel>(f: impl Fn(f64) -> f64) -> Vec<T> {
    integer_lut_flat_outside(0, T::BINS - 1, f)
}

/// [`integer_lut`] for an `f` that is constant on `0..=first` and on
/// `last..`: only `first..=last` is evaluated, the rest copies the ends.
/// (A percentile stretch is flat outside its two percentiles, an
/// equalisation outside the data's range; a 65,536-entry table costs a
/// quarter of a millisecond to evaluate in full.) `first <= last < T::BINS`,
/// else the whole table is evaluated.
pub fn integer_lut_flat_outside<T: Binned + Pixel>(first: usize, last: usize, f: impl Fn(f64) -> f64) -> Vec<T> {
    let (first, last) = if first <= last && last < T::BINS { (first, last) } else { (0, T::BINS - 1) };
    let max = T::max_value().to_f32() as f64;
    let at = |v: usize| T::from_f32_clip(round_clip(f(v as f64), max) as f32);
    let mut lut = vec![at(first); T::BINS];
    lut[first..=last].iter_mut().zip(first..).for_each(|(e, v)| *e = at(v));
    let end = at(last);
    lut[last..].fill(end);
    lut
}

/// Replaces every pixel by `lut[pixel]`, in place and in parallel. `lut`
/// holds one entry per value of the dtype (`T::BINS`); a pixel beyond a
/// shorter table is left as it is.
pub(crate) fn apply_lut_in_place<T: Binned + Pixel>(data: &mut [T], lut: &[T]) {
    // As an array of the dtype's constant length every pixel is a valid
    // index: the loop carries no bounds check (which it kept with a slice).
    match (<&[T; 256]>::try_from(lut), <&[T; 65_536]>::try_from(lut)) {
        (Ok(lut), _) => apply_table(data, lut),
        (_, Ok(lut)) => apply_table(data, lut),
        // Not a table of the dtype's length: checked indexing.
        _ => data.par_chunks_mut(CHUNK).for_each(|c| c.iter_mut().for_each(|v| *v = lut.get(v.bin()).copied().unwrap_or(*v))),
    }
}

fn apply_table<T: Binned + Pixel, const N: usize>(data: &mut [T], lut: &[T; N]) {
    data.par_chunks_mut(CHUNK).for_each(|c| c.iter_mut().for_each(|v| *v = lut[v.bin()]));
}

fn normalize_int<T: Binned + Pixel>(data: &mut [T], p: &PercentileNormalize) -> Option<()> {
    let q = percentiles_int(data, &[p.low_percentile, p.high_percentile])?;
    let (lo, hi) = (q[0], q[1]);
    // The stretch is flat below the low and above the high percentile.
    let lut = integer_lut_flat_outside::<T>(lo.floor() as usize, hi.ceil() as usize, |v| p.map(v, lo, hi));
    if let (Some(pixels), Some(table)) = (T::as_u16_mut(data), T::as_u16(&lut)) {
        if AffineStretch::available() {
            let (a, b) = (lo.ceil() as usize, hi.floor() as usize);
            if let Some(stretch) = AffineStretch::fit(table, a, b, p.map(a as f64, lo, hi), p.map(b as f64, lo, hi)) {
                stretch.apply(pixels);
                return Some(());
            }
        }
    }
    apply_lut_in_place(data, &lut);
    Some(())
}

fn normalize_f32(data: &mut [f32], p: &PercentileNormalize) -> Option<()> {
    let q = percentiles_f32(data, &[p.low_percentile, p.high_percentile])?;
    data.par_chunks_mut(CHUNK).for_each(|c| {
        c.iter_mut().for_each(|v| {
            if !v.is_nan() {
                *v = p.map(*v as f64, q[0], q[1]) as f32;
            }
        })
    });
    Some(())
}

/// Percentile-normalises the whole stack with one pair of percentiles computed
/// over all its pixels (see the module docs for the exact contract).
pub fn percentile_normalize(stack: &Stack, p: &PercentileNormalize) -> Result<Stack, FunctionError> {
    let mut out = stack.clone();
    percentile_normalize_in_place(&mut out, p, false)?;
    Ok(out)
}

/// Percentile-normalises each plane with its own percentiles (the per-slice
/// registered function `percentile_normalize`).
pub fn percentile_normalize_slices(stack: &Stack, p: &PercentileNormalize) -> Result<Stack, FunctionError> {
    let mut out = stack.clone();
    percentile_normalize_in_place(&mut out, p, true)?;
    Ok(out)
}

/// [`percentile_normalize`] (or, with `per_plane`, [`percentile_normalize_slices`])
/// overwriting the stack: no second copy of the data, which matters for whole stacks.
pub fn percentile_normalize_in_place(stack: &mut Stack, p: &PercentileNormalize, per_plane: bool) -> Result<(), FunctionError> {
    const NAME: &str = "percentile_normalize";
    if p.low_percentile > p.high_percentile {
        return Err(FunctionError::invalid(
            NAME,
            format!("low_percentile ({}) must not exceed high_percentile ({})", p.low_percentile, p.high_percentile),
        ));
    }
    let empty = || FunctionError::invalid(NAME, "the stack has no pixels (or only NaN)");
    let [_, h, w] = stack.shape();
    let unit = if per_plane { (h * w).max(1) } else { usize::MAX };
    fn each<T: Send>(data: &mut [T], unit: usize, f: impl Fn(&mut [T]) -> Option<()> + Sync + Send) -> Option<()> {
        if data.is_empty() {
            return None;
        }
        data.par_chunks_mut(unit.min(data.len())).map(f).collect::<Option<Vec<()>>>().map(|_| ())
    }
    match stack {
        Stack::U8(a) => each(a.pixels_mut(), unit, |d| normalize_int(d, p)),
        Stack::U16(a) => each(a.pixels_mut(), unit, |d| normalize_int(d, p)),
        Stack::F32(a) => each(a.pixels_mut(), unit, |d| normalize_f32(d, p)),
    }
    .ok_or_else(empty)
}

/// The check both registered normalisations declare: the low percentile must
/// be below the high one (equal percentiles map every pixel to `target_min`).
fn check_percentiles(args: &PercentileNormalize, _: &StackShape) -> Result<(), ArgProblem> {
    let (low, high) = (args.low_percentile, args.high_percentile);
    if low >= high {
        return Err(ArgProblem::new(
            "low_percentile",
            format!("low_percentile ({low}) must be below high_percentile ({high})"),
            "make low_percentile the smaller one, e.g. low_percentile = 1, high_percentile = 99",
        ));
    }
    Ok(())
}

pub static PERCENTILE_NORMALIZE: FunctionDecl<PercentileNormalize> = FunctionDecl::new(
    "percentile_normalize",
    Contract::Pure2d,
    "Per-slice percentile contrast stretch (np.percentile 'linear', exact via histograms); keeps the dtype.",
)
.with_check(check_percentiles);

pub static STACK_PERCENTILE_NORMALIZE: FunctionDecl<PercentileNormalize> = FunctionDecl::new(
    "stack_percentile_normalize",
    Contract::Pure3d,
    "Whole-stack percentile contrast stretch (one np.percentile pair over all planes, exact); keeps the dtype.",
)
.with_check(check_percentiles)
.with_output_shape(same_shape);

pub(crate) fn register(registry: &mut Registry) {
    registry.add(PERCENTILE_NORMALIZE.host_owned(|mut s, p, _| {
        percentile_normalize_in_place(&mut s, p, true)?;
        Ok(s)
    }));
    registry.add(STACK_PERCENTILE_NORMALIZE.host_owned(|mut s, p, _| {
        percentile_normalize_in_place(&mut s, p, false)?;
        Ok(s)
    }));
}

#[cfg(test)]
mod tests {
    use super::round_clip;

    #[test]
    fn round_clip_is_round_ties_even_then_clamp() {
        let mut vals = vec![f64::NAN, f64::INFINITY, f64::NEG_INFINITY, -1e300, -0.5, -0.0, 0.0, 0.5, 1.5, 2.5, 1e300];
        for k in 0..70_000u32 {
            let b = k as f64;
            vals.extend([b - 0.5, b + 0.5, b + 0.49999999999999994, b + 0.5000000000000001, b + 0.25, b - 1e-9]);
        }
        for max in [255.0, 65535.0] {
            for &v in &vals {
                let want = if v.is_nan() { 0.0 } else { v.round_ties_even().clamp(0.0, max) };
                assert_eq!(round_clip(v, max), want, "{v} (max {max})");
            }
        }
    }
}
