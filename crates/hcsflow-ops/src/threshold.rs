//! Global thresholds (Otsu, Li, manual) and the binary mask they give.
//!
//! - [`threshold_otsu`]: scikit-image's `threshold_otsu` (0.26) on the same
//!   histogram. Integer images: one bin per integer value over `[min, max]`, counts
//!   as f32, class weights, means and the between-class variance computed with the
//!   same operations and precisions as skimage, so the threshold is identical. f32
//!   images: 256 bins over `[min, max]` (`numpy.histogram` edges); the bin centre
//!   chosen can differ from skimage's by at most one bin where numpy's float32 edge
//!   arithmetic puts a value in the neighbouring bin.
//! - [`threshold_li`]: skimage's `threshold_li` (iterative minimum cross entropy,
//!   initial guess the mean, tolerance 0.5 for integers and half the smallest gap
//!   between distinct values for f32). Integer images: same histogram iteration as
//!   skimage with exact class means → identical up to the last ulp of `ln`. f32: means
//!   in f64 (skimage: float32 `np.mean`), agreeing to ~1e-6 relative.
//! - Manual: a given value.
//!
//! The mask is `value > threshold` (skimage's convention), as u8 0/1.

use hcsflow_core::{with_pixels, Contract, DType, FunctionDecl, FunctionError, Pixel, Registry, Stack, StackArray};
use rayon::prelude::*;

/// Pixels per task of the parallel passes over a plane.
const CHUNK: usize = 1 << 16;

/// The smallest and largest value of `plane` (as f32, in f64) and whether it
/// holds a NaN (then the extremes are of the other values), in one parallel pass.
/// Eight running extremes per chunk (independent, so they vectorise); a NaN
/// compares false and is never taken.
fn extremes<T: Pixel>(plane: &[T]) -> (f64, f64, bool) {
    plane
        .par_chunks(CHUNK)
        .map(|c| {
            let (mut lo, mut hi, mut nan) = ([f32::INFINITY; 8], [f32::NEG_INFINITY; 8], [false; 8]);
            let mut lanes = c.chunks_exact(8);
            for q in &mut lanes {
                for (k, v) in q.iter().enumerate() {
                    let v = v.to_f32();
                    lo[k] = if v < lo[k] { v } else { lo[k] };
                    hi[k] = if v > hi[k] { v } else { hi[k] };
                    nan[k] |= v.is_nan();
                }
            }
            for v in lanes.remainder() {
                let v = v.to_f32();
                lo[0] = if v < lo[0] { v } else { lo[0] };
                hi[0] = if v > hi[0] { v } else { hi[0] };
                nan[0] |= v.is_nan();
            }
            let lo = lo.iter().fold(f64::INFINITY, |a, &v| a.min(f64::from(v)));
            let hi = hi.iter().fold(f64::NEG_INFINITY, |a, &v| a.max(f64::from(v)));
            (lo, hi, nan.iter().any(|&n| n))
        })
        .reduce(|| (f64::INFINITY, f64::NEG_INFINITY, false), |a, b| (a.0.min(b.0), a.1.max(b.1), a.2 | b.2))
}

/// How the threshold of a plane is chosen.
#[derive(Debug, Clone, Copy, PartialEq)]
pub enum ThresholdMethod {
    Otsu,
    Li,
    Manual(f64),
}

impl ThresholdMethod {
    /// From the registry arguments `method` and `value`.
    pub fn from_args(method: &str, value: f64) -> Option<ThresholdMethod> {
        match method {
            "otsu" => Some(ThresholdMethod::Otsu),
            "li" => Some(ThresholdMethod::Li),
            "manual" => Some(ThresholdMethod::Manual(value)),
            _ => None,
        }
    }
}

fn nan_error(function: &str) -> FunctionError {
    FunctionError::invalid(function, "the image contains NaN")
}

fn is_integer<T: Pixel>() -> bool {
    T::DTYPE != DType::F32
}

/// Integer histogram over `[min, max]`: (min, counts).
fn int_histogram<T: Pixel>(plane: &[T]) -> (i64, Vec<u64>) {
    let mut lo = i64::MAX;
    let mut hi = i64::MIN;
    for v in plane {
        let v = v.to_f32() as i64;
        lo = lo.min(v);
        hi = hi.max(v);
    }
    let mut counts = vec![0u64; (hi - lo + 1).max(1) as usize];
    for v in plane {
        counts[(v.to_f32() as i64 - lo) as usize] += 1;
    }
    (lo, counts)
}

/// Otsu's threshold of one plane (skimage `threshold_otsu(plane)`, nbins=256 for f32).
/// A constant plane returns its value. Errors: empty plane, NaN.
pub fn threshold_otsu<T: Pixel>(plane: &[T]) -> Result<f64, FunctionError> {
    const NAME: &str = "threshold_otsu";
    let first = *plane.first().ok_or_else(|| FunctionError::invalid(NAME, "empty image"))?;
    let (lo, hi, nan) = extremes(plane);
    if nan {
        return Err(nan_error(NAME));
    }
    // Every value equal (−0 and +0 too, as `==` has them).
    if lo == hi {
        return Ok(first.to_f32() as f64);
    }
    let (counts, centers): (Vec<f32>, Vec<f64>) = if is_integer::<T>() {
        let (lo, c) = int_histogram(plane);
        (c.iter().map(|&v| v as f32).collect(), (0..c.len()).map(|i| (lo + i as i64) as f64).collect())
    } else {
        let (c, centers) = float_histogram(plane, lo, hi);
        (c.iter().map(|&v| v as f32).collect(), centers)
    };
    let n = counts.len();
    // weight1 = cumsum(counts) (f32), weight2 = reversed cumsum (f32)
    let mut w1 = vec![0f32; n];
    let mut acc = 0f32;
    for i in 0..n {
        acc += counts[i];
        w1[i] = acc;
    }
    let mut w2 = vec![0f32; n];
    acc = 0.0;
    for i in (0..n).rev() {
        acc += counts[i];
        w2[i] = acc;
    }
    // counts * bin_centers in f64, cumulated both ways, divided by the f32 weights.
    let prod: Vec<f64> = counts.iter().zip(&centers).map(|(&c, &b)| c as f64 * b).collect();
    let mut m1 = vec![0f64; n];
    let mut s = 0f64;
    for i in 0..n {
        s += prod[i];
        m1[i] = s / w1[i] as f64;
    }
    let mut m2 = vec![0f64; n];
    s = 0.0;
    for i in (0..n).rev() {
        s += prod[i];
        m2[i] = s / w2[i] as f64;
    }
    let mut best = f64::NEG_INFINITY;
    let mut idx = 0;
    for i in 0..n - 1 {
        let d = m1[i] - m2[i + 1];
        let v = (w1[i] * w2[i + 1]) as f64 * (d * d);
        if v > best {
            best = v;
            idx = i;
        }
    }
    Ok(centers[idx])
}

/// Bins of [`threshold_otsu`]'s histogram of a float plane (skimage's `nbins`).
const FLOAT_BINS: usize = 256;

/// The smallest f32 not below `e`: for every f32 `v`, `v ≥ e` exactly when
/// `v ≥ f32_at_least(e)` (the f32 values are a subset of the f64 ones).
fn f32_at_least(e: f64) -> f32 {
    let f = e as f32;
    if f64::from(f) < e {
        f.next_up()
    } else {
        f
    }
}

/// `numpy.histogram(plane, FLOAT_BINS, range=(min, max))` counts and bin
/// centres (f64 edges); `lo`, `hi`: the plane's extremes ([`extremes`]), `lo < hi`.
fn float_histogram<T: Pixel>(plane: &[T], lo: f64, hi: f64) -> (Vec<u64>, Vec<f64>) {
    const BINS: usize = FLOAT_BINS;
    let edges: Vec<f64> = (0..=BINS).map(|i| if i == BINS { hi } else { lo + (hi - lo) / BINS as f64 * i as f64 }).collect();
    // Each comparison of a pixel (an f32) with an f64 edge made as f32 with the
    // same outcome, against the edge rounded up to an f32.
    let mut up = [0f32; BINS + 1];
    up.iter_mut().zip(&edges).for_each(|(u, &e)| *u = f32_at_least(e));
    let (lo32, norm32) = (lo as f32, (BINS as f64 / (hi - lo)) as f32);
    // The bin of pixel v: a first guess in f32, within one bin of the exact one
    // (its rounding is ~1e-4 bins), then numpy's correction against the edges.
    let bin = |v: f32| {
        let mut i = (((v - lo32) * norm32) as i32).clamp(0, BINS as i32 - 1) as usize;
        if v < up[i] && i > 0 {
            i -= 1;
        } else if i + 1 < BINS && v >= up[i + 1] {
            i += 1;
        }
        i
    };
    // Counts per chunk in parallel, summed: the same integers as one pass.
    // Within a chunk four interleaved histograms: neighbouring pixels often
    // share a bin, and one counter incremented again and again waits on its
    // own store each time.
    let counts = plane
        .par_chunks(CHUNK)
        .fold(
            || vec![0u64; BINS],
            |mut counts, c| {
                let mut part = [[0u32; 4]; BINS];
                let mut quads = c.chunks_exact(4);
                for q in &mut quads {
                    for (k, v) in q.iter().enumerate() {
                        part[bin(v.to_f32())][k] += 1;
                    }
                }
                for v in quads.remainder() {
                    part[bin(v.to_f32())][0] += 1;
                }
                counts.iter_mut().zip(&part).for_each(|(c, p)| *c += p.iter().map(|&n| u64::from(n)).sum::<u64>());
                counts
            },
        )
        .reduce(
            || vec![0u64; BINS],
            |mut a, b| {
                a.iter_mut().zip(&b).for_each(|(x, y)| *x += y);
                a
            },
        );
    let centers = (0..BINS).map(|i| (edges[i] + edges[i + 1]) / 2.0).collect();
    (counts, centers)
}

/// Li's minimum cross-entropy threshold of one plane (skimage `threshold_li(plane)`).
/// A constant plane returns its value. Errors: empty plane, NaN.
pub fn threshold_li<T: Pixel>(plane: &[T]) -> Result<f64, FunctionError> {
    const NAME: &str = "threshold_li";
    let first = *plane.first().ok_or_else(|| FunctionError::invalid(NAME, "empty image"))?;
    if plane.iter().any(|v| v.to_f32().is_nan()) {
        return Err(nan_error(NAME));
    }
    if plane.iter().all(|&v| v == first) {
        return Ok(first.to_f32() as f64);
    }
    if is_integer::<T>() {
        // Histogram of image - min; exact integer sums → exactly rounded means.
        let (lo, counts) = int_histogram(plane);
        let total: u64 = counts.iter().sum();
        let sum: u64 = counts.iter().enumerate().map(|(v, &c)| v as u64 * c).sum();
        let tolerance = 0.5;
        let mut t_next = sum as f64 / total as f64;
        let mut t_curr = -2.0 * tolerance;
        while (t_next - t_curr).abs() > tolerance {
            t_curr = t_next;
            let (mut cf, mut sf, mut cb, mut sb) = (0u64, 0u64, 0u64, 0u64);
            for (v, &c) in counts.iter().enumerate() {
                if v as f64 > t_curr {
                    cf += c;
                    sf += v as u64 * c;
                } else {
                    cb += c;
                    sb += v as u64 * c;
                }
            }
            if cf == 0 || cb == 0 {
                break;
            }
            let mean_fore = sf as f64 / cf as f64;
            let mean_back = sb as f64 / cb as f64;
            if mean_back == 0.0 {
                break;
            }
            t_next = (mean_back - mean_fore) / (mean_back.ln() - mean_fore.ln());
        }
        Ok(t_next + lo as f64)
    } else {
        let mut v: Vec<f64> = plane.iter().map(|p| p.to_f32() as f64).collect();
        let lo = v.iter().cloned().fold(f64::INFINITY, f64::min);
        v.iter_mut().for_each(|x| *x -= lo);
        let mut sorted = v.clone();
        sorted.sort_by(|a, b| a.total_cmp(b));
        let min_gap = sorted.windows(2).map(|w| w[1] - w[0]).filter(|&d| d > 0.0).fold(f64::INFINITY, f64::min);
        let tolerance = min_gap / 2.0;
        let mut t_next = v.iter().sum::<f64>() / v.len() as f64;
        let mut t_curr = -2.0 * tolerance;
        while (t_next - t_curr).abs() > tolerance {
            t_curr = t_next;
            let (mut cf, mut sf, mut cb, mut sb) = (0usize, 0f64, 0usize, 0f64);
            for &x in &v {
                if x > t_curr {
                    cf += 1;
                    sf += x;
                } else {
                    cb += 1;
                    sb += x;
                }
            }
            if cf == 0 || cb == 0 {
                break;
            }
            let mean_fore = sf / cf as f64;
            let mean_back = sb / cb as f64;
            if mean_back == 0.0 {
                break;
            }
            t_next = (mean_back - mean_fore) / (mean_back.ln() - mean_fore.ln());
        }
        Ok(t_next + lo)
    }
}

/// The threshold of one plane by `method`.
pub fn threshold_value<T: Pixel>(plane: &[T], method: ThresholdMethod) -> Result<f64, FunctionError> {
    match method {
        ThresholdMethod::Otsu => threshold_otsu(plane),
        ThresholdMethod::Li => threshold_li(plane),
        ThresholdMethod::Manual(v) => Ok(v),
    }
}

/// Per plane: threshold by `method`, then `mask = value > threshold` as u8 0/1.
/// Contract: `pure_2d`; returns the mask stack and the threshold of each plane.
pub fn threshold_mask(stack: &Stack, method: ThresholdMethod) -> Result<(Stack, Vec<f64>), FunctionError> {
    let [n, h, w] = stack.shape();
    let mut out = StackArray::<u8>::zeros([n, h, w]);
    let mut thresholds = Vec::with_capacity(n);
    with_pixels!(Stack, stack, a, T => {
        for (p, dst) in a.planes().zip(out.planes_mut()) {
            let t = threshold_value(p, method)?;
            thresholds.push(t);
            for (o, v) in dst.iter_mut().zip(p) {
                *o = u8::from(v.to_f32() as f64 > t);
            }
        }
    });
    Ok((Stack::from(out), thresholds))
}

hcsflow_core::function_args! {
    /// The arguments of [`THRESHOLD`].
    pub struct ThresholdArgs {
        method: String = choice("otsu", &["otsu", "li", "manual"], "how the threshold is chosen"),
        value: f64 = float(0.0, None, None, "the threshold for method=manual (in pixel units)"),
    }
}

pub static THRESHOLD: FunctionDecl<ThresholdArgs> = FunctionDecl::new(
    "threshold",
    Contract::Pure2d,
    "Binary mask value > threshold per plane (u8 0/1); threshold by Otsu or Li (skimage threshold_otsu / threshold_li) or a manual value.",
);

pub(crate) fn register(registry: &mut Registry) {
    registry.add(THRESHOLD.host(|s, a, _| {
        let m = ThresholdMethod::from_args(&a.method, a.value)
            .ok_or_else(|| FunctionError::failed("threshold", format!("unknown method '{}'", a.method)))?;
        Ok(threshold_mask(s, m)?.0)
    }));
}

#[cfg(test)]
mod tests {
    use super::*;

    /// numpy.histogram's own procedure in f64, pixel by pixel: the index from
    /// `(v − lo) / (hi − lo) · bins`, then its correction against the edges.
    fn numpy_histogram(plane: &[f32], lo: f64, hi: f64) -> Vec<u64> {
        let bins = FLOAT_BINS;
        let edges: Vec<f64> = (0..=bins).map(|i| if i == bins { hi } else { lo + (hi - lo) / bins as f64 * i as f64 }).collect();
        let mut counts = vec![0u64; bins];
        for &v in plane {
            let v = f64::from(v);
            let mut i = (((v - lo) / (hi - lo) * bins as f64) as usize).min(bins - 1);
            if v < edges[i] {
                i -= 1;
            }
            if i != bins - 1 && v >= edges[i + 1] {
                i += 1;
            }
            counts[i] += 1;
        }
        counts
    }

    #[test]
    fn float_histogram_bins_as_numpy_does_in_f64() {
        // Random values, and every edge's neighbouring f32 values (the pixels
        // whose bin the rounding of the f32 first guess could change).
        let mut rng = hcsflow_testkit::Rng::from_state(0x2545_f491_4f6c_dd1d);
        let mut unit = || rng.unit();
        for (lo, hi) in [(0.0f32, 1.0f32), (-3.7, 1234.5), (100.25, 100.5), (0.1, 65535.0)] {
            let (l, h) = (f64::from(lo), f64::from(hi));
            let mut plane: Vec<f32> = (0..20_000).map(|_| (l + unit() * (h - l)) as f32).map(|v| v.clamp(lo, hi)).collect();
            for i in 0..=FLOAT_BINS {
                let e = l + (h - l) / FLOAT_BINS as f64 * i as f64;
                let at = f32_at_least(e);
                plane.extend([at.next_down(), at, at.next_up()].into_iter().filter(|v| (lo..=hi).contains(v)));
            }
            plane.extend([lo, hi]);
            let (counts, centers) = float_histogram(&plane, l, h);
            assert_eq!(counts, numpy_histogram(&plane, l, h), "range {lo}..{hi}");
            assert_eq!(counts.iter().sum::<u64>(), plane.len() as u64);
            assert_eq!(centers.len(), FLOAT_BINS);
        }
    }
}
