//! Histogram equalisation of the whole stack, with scikit-image's
//! `exposure.equalize_hist` semantics.
//!
//! - u8 / u16: skimage histograms integer images with one bin per value (its
//!   `nbins` is ignored for integers), so `cdf(v) = #{pixels ≤ v} / N`
//!   exactly; we compute it from the shared 256 / 65,536-bin histogram and
//!   return `round(cdf(v) · dtype max)` (ties to even) in the input dtype,
//!   through a lookup table. Equal to `round(equalize_hist(stack) · max)`.
//! - f32: `nbins` equal bins between the (non-NaN) min and max with float32
//!   edges from `np.linspace` in float32 (min == max widens the range by ±0.5), bin
//!   centres in float32, cdf in float32, then `np.interp` between bin centres
//!   in f64, returned as f32 in [0, 1]: skimage's arithmetic operation for
//!   operation (agreement to 1 ulp of f32 in tests). NaN stays NaN; ±inf is an error.

use hcsflow_core::{same_shape, Contract, FunctionDecl, FunctionError, Pixel, Registry, Stack};
use rayon::prelude::*;

use crate::histogram::{cumulative, histogram, histogram_by, Binned};
use crate::normalize::{apply_lut_in_place, integer_lut_flat_outside};

const NAME: &str = "stack_equalize_histogram";
const CHUNK: usize = 1 << 18;

/// The equalisation lookup table of an integer dtype from the histogram of
/// the data: `round(cdf(v) · max)`. `None` for an empty histogram.
pub fn equalize_lut<T: Binned + Pixel>(hist: &[u64]) -> Option<Vec<T>> {
    let cdf = cumulative(hist);
    let n = *cdf.last()? as f64;
    if n == 0.0 {
        return None;
    }
    let max = T::max_value().to_f32() as f64;
    // The cdf is 0 below the smallest value present and n from the largest on.
    let lowest = hist.iter().position(|&c| c > 0)?;
    let highest = hist.iter().rposition(|&c| c > 0)?;
    Some(integer_lut_flat_outside::<T>(lowest.saturating_sub(1), highest, |v| cdf[v as usize] as f64 / n * max))
}

fn equalize_int<T: Binned + Pixel>(data: &mut [T]) -> Option<()> {
    let lut = equalize_lut::<T>(&histogram(data))?;
    apply_lut_in_place(data, &lut);
    Some(())
}

/// The bin edges of `np.histogram(x_f32, nbins)`: `np.linspace(lo, hi, n + 1)`
/// with float32 `lo`/`hi` (the data's min and max as numpy float32 scalars), so
/// numpy computes in float32: `i · ((hi - lo) / n) + lo`, the last edge `hi`.
pub fn linspace_f32(lo: f32, hi: f32, nbins: usize) -> Vec<f32> {
    let step = (hi - lo) / nbins as f32;
    let mut e: Vec<f32> = (0..=nbins).map(|i| i as f32 * step + lo).collect();
    if let Some(last) = e.last_mut() {
        *last = hi;
    }
    e
}

fn equalize_f32(data: &mut [f32], nbins: usize) -> Result<(), FunctionError> {
    let (mn, mx) = data
        .par_chunks(CHUNK)
        .map(|c| c.iter().filter(|v| !v.is_nan()).fold((f32::INFINITY, f32::NEG_INFINITY), |(a, b), &v| (a.min(v), b.max(v))))
        .reduce(|| (f32::INFINITY, f32::NEG_INFINITY), |x, y| (x.0.min(y.0), x.1.max(y.1)));
    if mn > mx {
        return Err(FunctionError::invalid(NAME, "the stack has no pixels (or only NaN)"));
    }
    if !mn.is_finite() || !mx.is_finite() {
        return Err(FunctionError::invalid(NAME, format!("the value range [{mn}, {mx}] is not finite")));
    }
    let (lo, hi) = if mn == mx { (mn - 0.5, mx + 0.5) } else { (mn, mx) };
    let edges = linspace_f32(lo, hi, nbins);
    // numpy: bin i holds edges[i] <= v < edges[i+1]; the last bin is closed.
    let bin = |v: f32| -> Option<usize> {
        if v.is_nan() {
            return None;
        }
        let i = edges.partition_point(|&e| e <= v);
        Some(i.saturating_sub(1).min(nbins - 1))
    };
    let hist = histogram_by(data, nbins, bin);
    let cdf = cumulative(&hist);
    let total = *cdf.last().unwrap_or(&0) as f64;
    let cdf32: Vec<f64> = cdf.iter().map(|&c| (c as f64 / total) as f32 as f64).collect();
    let centres: Vec<f64> = edges.windows(2).map(|w| ((w[0] + w[1]) / 2.0) as f64).collect();
    let slopes: Vec<f64> = (0..nbins.saturating_sub(1)).map(|j| (cdf32[j + 1] - cdf32[j]) / (centres[j + 1] - centres[j])).collect();
    // np.interp(x, centres, cdf): clamp outside, exact at the last centre.
    let interp = |x: f64| -> f64 {
        let last = nbins - 1;
        if x.is_nan() {
            return x;
        }
        if x < centres[0] {
            return cdf32[0];
        }
        if x >= centres[last] {
            return cdf32[last];
        }
        let j = centres.partition_point(|&c| c <= x) - 1;
        let r = slopes[j] * (x - centres[j]) + cdf32[j];
        if r.is_nan() {
            slopes[j] * (x - centres[j + 1]) + cdf32[j + 1]
        } else {
            r
        }
    };
    data.par_chunks_mut(CHUNK).for_each(|d| d.iter_mut().for_each(|v| *v = interp(*v as f64) as f32));
    Ok(())
}

/// Equalises the histogram of the whole stack (all planes form one
/// population); see the module docs for the exact contract per dtype.
/// `nbins` (≥ 1) applies to f32 input only.
pub fn stack_equalize_histogram(stack: &Stack, nbins: usize) -> Result<Stack, FunctionError> {
    let mut out = stack.clone();
    stack_equalize_histogram_in_place(&mut out, nbins)?;
    Ok(out)
}

/// [`stack_equalize_histogram`] overwriting the stack (no second copy of the data).
pub fn stack_equalize_histogram_in_place(stack: &mut Stack, nbins: usize) -> Result<(), FunctionError> {
    let empty = || FunctionError::invalid(NAME, "the stack has no pixels (or only NaN)");
    match stack {
        Stack::U8(a) => equalize_int(a.pixels_mut()).ok_or_else(empty),
        Stack::U16(a) => equalize_int(a.pixels_mut()).ok_or_else(empty),
        Stack::F32(a) => equalize_f32(a.pixels_mut(), nbins.max(1)),
    }
}

hcsflow_core::function_args! {
    /// The arguments of [`STACK_EQUALIZE_HISTOGRAM`].
    pub struct EqualizeArgs {
        nbins: i64 = int(256, Some(1), Some(1 << 20), "histogram bins for f32 input (u8/u16 use one bin per value, like skimage)"),
    }
}

pub static STACK_EQUALIZE_HISTOGRAM: FunctionDecl<EqualizeArgs> = FunctionDecl::new(
    NAME,
    Contract::Pure3d,
    "Histogram equalisation of the whole stack (skimage.exposure.equalize_hist on all planes; integers: exact per-value cdf scaled to the dtype range).",
)
.with_output_shape(same_shape);

pub(crate) fn register(registry: &mut Registry) {
    registry.add(STACK_EQUALIZE_HISTOGRAM.host_owned(|mut s, a, _| {
        stack_equalize_histogram_in_place(&mut s, a.nbins as usize)?;
        Ok(s)
    }));
}
