//! Contrast-limited adaptive histogram equalisation (CLAHE) per plane, with
//! scikit-image's `exposure.equalize_adapthist` semantics, step for step:
//!
//! 1. The plane becomes 16-bit as skimage's `img_as_uint` does (u8: `v·257`;
//!    f32 in [-1, 1]: `rint(v·65535)` in f32, negatives clip to 0), then its
//!    min..max is stretched to the 16,384 grey levels `0..=16383` in f64 and
//!    rounded (ties to even); a constant plane keeps its value, clipped.
//! 2. Grey levels fall into bins of `1 + 16384 / nbins` levels.
//! 3. Contextual regions are `ky × kx` tiles from the top-left corner
//!    (`kernel_size`, default `max(dim / 8, 1)` per dimension), as many as
//!    cover the plane; tiles reaching past the plane see it mirrored
//!    (numpy's `'reflect'` padding, no repeated edge sample).
//! 4. Each tile's histogram is clipped at `max(int(clip_limit·ky·kx), 1)`
//!    (no clipping when `clip_limit` is 0) and the excess redistributed with
//!    skimage's integer procedure, then cumulated into a grey-level map
//!    `trunc(min(cdf·16383 / (ky·kx), 16383))`.
//! 5. Every pixel mixes the maps of the four tiles around it bilinearly, with
//!    skimage's weights and f32 accumulation, truncated to an integer level.
//! 6. The levels' min..max is stretched to [0, 1] (a constant result clips to [0, 1]).
//!
//! Output dtype policy: the result keeps the input dtype. f32 input gives
//! skimage's f32 result in [0, 1] exactly. u8 / u16 input gives skimage's
//! float64 result scaled to the full integer range and rounded, which is
//! `img_as_ubyte` / `img_as_uint` of skimage's output, exactly — so the default
//! clip-to-input-dtype policy keeps the contrast instead of collapsing [0, 1]
//! to two levels. f32 planes with values outside [-1, 1] (which skimage rejects)
//! are first stretched from their min..max to [0, 1] in f32
//! (`rescale_intensity(x, out_range=(0, 1))`); NaN or ±inf is an error.

use hcsflow_core::{with_pixels, ArgProblem, Contract, FunctionDecl, FunctionError, Pixel, Registry, Stack, StackArray, StackShape};
use rayon::prelude::*;

use crate::convolve::Boundary;
use crate::histogram::Binned;

const NAME: &str = "clahe";
/// skimage's `NR_OF_GRAY`: the grey levels CLAHE works with.
const LEVELS: usize = 1 << 14;
/// The largest grey level, as skimage's `NR_OF_GRAY - 1`.
const TOP: f64 = (LEVELS - 1) as f64;

/// CLAHE arguments (skimage's names and defaults).
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct ClaheParams {
    /// Contextual region `(ky, kx)` in pixels; `None`: `max(dim / 8, 1)` per dimension.
    pub kernel_size: Option<(usize, usize)>,
    /// Clip limit as a fraction of the region's pixels; 0 (or ≥ 1) disables clipping.
    pub clip_limit: f64,
    /// Histogram bins over the 16,384 grey levels.
    pub nbins: usize,
}

impl Default for ClaheParams {
    fn default() -> Self {
        ClaheParams { kernel_size: None, clip_limit: 0.01, nbins: 256 }
    }
}

/// CLAHE of every plane of `stack`; see the module docs for the contract.
pub fn clahe(stack: &Stack, params: &ClaheParams) -> Result<Stack, FunctionError> {
    if params.nbins == 0 {
        return Err(FunctionError::invalid(NAME, "nbins must be at least 1"));
    }
    if params.clip_limit.is_nan() || params.clip_limit < 0.0 {
        return Err(FunctionError::invalid(NAME, format!("clip_limit must be >= 0, got {}", params.clip_limit)));
    }
    if let Some((ky, kx)) = params.kernel_size {
        if ky == 0 || kx == 0 {
            return Err(FunctionError::invalid(NAME, format!("kernel_size must be >= 1, got ({ky}, {kx})")));
        }
    }
    let [n, h, w] = stack.shape();
    Ok(with_pixels!(Stack, stack, a, T => {
        let mut out = StackArray::<T>::zeros([n, h, w]);
        let mut planes: Vec<&mut [T]> = out.planes_mut().collect();
        planes.par_iter_mut().enumerate().try_for_each(|(z, dst)| -> Result<(), FunctionError> {
            dst.copy_from_slice(&T::clahe_plane(a.plane(z), h, w, params)?);
            Ok(())
        })?;
        Stack::from(out)
    }))
}

/// Per-dtype entry: quantisation to 16 bits and the output mapping differ.
trait ClahePixel: Pixel {
    fn clahe_plane(data: &[Self], h: usize, w: usize, p: &ClaheParams) -> Result<Vec<Self>, FunctionError>;
}

impl ClahePixel for u8 {
    fn clahe_plane(data: &[u8], h: usize, w: usize, p: &ClaheParams) -> Result<Vec<u8>, FunctionError> {
        let levels = clahe_levels(data, h, w, p, |v| u16::from(v) * 257);
        Ok(to_integer_range(&levels))
    }
}

impl ClahePixel for u16 {
    fn clahe_plane(data: &[u16], h: usize, w: usize, p: &ClaheParams) -> Result<Vec<u16>, FunctionError> {
        let levels = clahe_levels(data, h, w, p, |v| v);
        Ok(to_integer_range(&levels))
    }
}

impl ClahePixel for f32 {
    fn clahe_plane(data: &[f32], h: usize, w: usize, p: &ClaheParams) -> Result<Vec<f32>, FunctionError> {
        let u16s = f32_to_uint(data)?;
        let levels = clahe_levels(&u16s, h, w, p, |v| v);
        let Some((lo, hi)) = min_max(&levels) else { return Ok(Vec::new()) };
        let lut = f32_output_lut(lo, hi);
        Ok(levels.iter().map(|&r| lut[r as usize]).collect())
    }
}

/// skimage's `img_as_uint` of an f32 plane, after stretching planes outside
/// [-1, 1] to [0, 1] (see the module docs).
fn f32_to_uint(data: &[f32]) -> Result<Vec<u16>, FunctionError> {
    if data.iter().any(|v| !v.is_finite()) {
        return Err(FunctionError::invalid(NAME, "the plane holds NaN or infinite values"));
    }
    let (mn, mx) = data.iter().fold((f32::INFINITY, f32::NEG_INFINITY), |(a, b), &v| (a.min(v), b.max(v)));
    let to_u16 = |v: f32| (v * 65535.0).round_ties_even().clamp(0.0, 65535.0) as u16;
    Ok(if mn < -1.0 || mx > 1.0 {
        // rescale_intensity in f32: the span is a Python float (f64) cast to f32;
        // a constant plane clips to [0, 1].
        let span = (mx as f64 - mn as f64) as f32;
        if mn == mx {
            data.iter().map(|&v| to_u16(v.clamp(0.0, 1.0))).collect()
        } else {
            data.iter().map(|&v| to_u16((v - mn) / span)).collect()
        }
    } else {
        data.iter().map(|&v| to_u16(v)).collect()
    })
}

/// The smallest and largest value, `None` when empty.
fn min_max(levels: &[u16]) -> Option<(u16, u16)> {
    let first = *levels.first()?;
    Some(
        levels
            .par_chunks(1 << 16)
            .map(|c| c.iter().fold((first, first), |(a, b), &v| (a.min(v), b.max(v))))
            .reduce(|| (first, first), |x, y| (x.0.min(y.0), x.1.max(y.1))),
    )
}

/// Final stretch of integer-input results: skimage's float64 result in [0, 1]
/// times the dtype's max, rounded ties-to-even (`img_as_ubyte` / `img_as_uint`).
fn to_integer_range<T: Pixel>(levels: &[u16]) -> Vec<T> {
    let Some((lo, hi)) = min_max(levels) else { return Vec::new() };
    let lut = integer_output_lut::<T>(lo, hi);
    levels.par_iter().map(|&r| lut[r as usize]).collect()
}

/// Step 6 for u8/u16 output: the value of every level `0..=hi` of a plane
/// whose levels span `lo..=hi` (see `to_integer_range`). The GPU implementation uses it too.
pub fn integer_output_lut<T: Pixel>(lo: u16, hi: u16) -> Vec<T> {
    let max = T::max_value().to_f32() as f64;
    (0..=hi as usize)
        .map(|r| {
            let unit = if hi == lo { (r as f64).clamp(0.0, 1.0) } else { (r as f64 - lo as f64) / (hi - lo) as f64 };
            T::from_f32_clip((unit * max).round_ties_even() as f32)
        })
        .collect()
}

/// Step 6 for f32 output: the value in [0, 1] of every level `0..=hi` of a
/// plane whose levels span `lo..=hi`. The GPU implementation uses it too.
pub fn f32_output_lut(lo: u16, hi: u16) -> Vec<f32> {
    let (lo_f, span) = (lo as f32, (hi - lo) as f32);
    (0..=hi as usize).map(|r| if hi == lo { (r as f32).clamp(0.0, 1.0) } else { (r as f32 - lo_f) / span }).collect()
}

/// Steps 1–5 of the module docs: the CLAHE grey level (0..=16383) of every
/// pixel, before the final stretch. `to_u16` is skimage's `img_as_uint` of one value.
fn clahe_levels<T: Binned + Copy + Sync>(data: &[T], h: usize, w: usize, p: &ClaheParams, to_u16: impl Fn(T) -> u16 + Sync) -> Vec<u16> {
    if h == 0 || w == 0 {
        return Vec::new();
    }
    let bins = bin_lut(data, p.nbins, &to_u16);
    let (ky, kx) = p.kernel_size.unwrap_or(((h / 8).max(1), (w / 8).max(1)));
    let maps = tile_maps(data, h, w, ky, kx, &bins, p);
    interpolate(data, h, w, ky, kx, &bins, &maps)
}

/// Bin of every possible input value: `round(stretch to 0..=16383) / (1 + 16384 / nbins)`.
fn bin_lut<T: Binned + Copy + Sync>(data: &[T], nbins: usize, to_u16: &(impl Fn(T) -> u16 + Sync)) -> Vec<u16> {
    let (lo, hi) = data
        .par_chunks(1 << 16)
        .map(|c| c.iter().fold((u16::MAX, 0u16), |(a, b), &v| (a.min(to_u16(v)), b.max(to_u16(v)))))
        .reduce(|| (u16::MAX, 0), |x, y| (x.0.min(y.0), x.1.max(y.1)));
    bin_lut_for_range(lo, hi, nbins, T::BINS == 256)
}

/// The bin of every input value of a plane whose 16-bit values (skimage's
/// `img_as_uint`) span `lo..=hi`: indexed by the u8 value (256 entries, its
/// 16-bit value `v·257`) when `u8_input`, else by the 16-bit value (65,536).
/// Step 2 of the module docs; the GPU implementation uses it too.
pub fn bin_lut_for_range(lo: u16, hi: u16, nbins: usize, u8_input: bool) -> Vec<u16> {
    let bin_size = 1 + LEVELS / nbins;
    let (lo_f, span) = (lo as f64, hi as f64 - lo as f64);
    let fill = |u: u16| -> u16 {
        let level = if hi == lo { (u as f64).clamp(0.0, TOP) } else { ((u as f64 - lo_f) / span * TOP).round_ties_even() };
        (level as usize / bin_size) as u16
    };
    if u8_input {
        (0..256u32).map(|v| fill((v as u16) * 257)).collect()
    } else {
        (0..=u16::MAX).map(fill).collect()
    }
}

/// The histogram clip of a `elements`-pixel region: `max(int(clip_limit·elements), 1)`,
/// or `elements` (no clipping) when `clip_limit` is 0.
pub fn clip_count(clip_limit: f64, elements: i64) -> i64 {
    if clip_limit > 0.0 {
        ((clip_limit * elements as f64).max(1.0)) as i64
    } else {
        elements
    }
}

/// Step 4 of the module docs for one tile: `hist` (`nbins` counts of an
/// `elements`-pixel region) clipped at `clip` in place, then its grey-level
/// map (exact integers as f64) appended to `out`. The GPU implementation uses it too.
pub fn tile_map(hist: &mut [i64], clip: i64, elements: i64, out: &mut Vec<f64>) {
    let scale = TOP / elements as f64;
    clip_histogram(hist, clip);
    let mut acc = 0i64;
    out.extend(hist.iter().map(|&c| {
        acc += c;
        ((acc as f64 * scale).min(TOP) as i64) as f64
    }));
}

/// The clipped, cumulated grey-level map of every tile, `[ty][tx][bin]` flattened,
/// as f64 (exact integers) for the interpolation.
fn tile_maps<T: Binned + Copy + Sync>(data: &[T], h: usize, w: usize, ky: usize, kx: usize, bins: &[u16], p: &ClaheParams) -> TileMaps {
    let (ny, nx) = (h.div_ceil(ky), w.div_ceil(kx));
    let nbins = p.nbins;
    let elements = (ky * kx) as i64;
    let clip = clip_count(p.clip_limit, elements);
    let cols: Vec<usize> = (0..nx * kx).map(|j| Boundary::Mirror.index(j as isize, w)).collect();
    let maps: Vec<f64> = (0..ny)
        .into_par_iter()
        .flat_map_iter(|ty| {
            let mut hist = vec![0i64; nx * nbins];
            for i in ty * ky..(ty + 1) * ky {
                let row = &data[Boundary::Mirror.index(i as isize, h) * w..][..w];
                for (tx, tile_cols) in cols.chunks(kx).enumerate() {
                    let hist = &mut hist[tx * nbins..][..nbins];
                    for &c in tile_cols {
                        hist[bins[row[c].bin()] as usize] += 1;
                    }
                }
            }
            let mut out = Vec::with_capacity(nx * nbins);
            for hist in hist.chunks_mut(nbins) {
                tile_map(hist, clip, elements, &mut out);
            }
            out
        })
        .collect();
    TileMaps { ny, nx, nbins, maps }
}

struct TileMaps {
    ny: usize,
    nx: usize,
    nbins: usize,
    maps: Vec<f64>,
}

impl TileMaps {
    /// The map of tile `(ty, tx)`, indices clamped to the grid (skimage pads the maps by edge copy).
    fn tile(&self, ty: isize, tx: isize) -> &[f64] {
        let ty = ty.clamp(0, self.ny as isize - 1) as usize;
        let tx = tx.clamp(0, self.nx as isize - 1) as usize;
        &self.maps[(ty * self.nx + tx) * self.nbins..][..self.nbins]
    }
}

/// skimage's `clip_histogram`: clip at `clip`, spread the excess evenly over
/// the bins below, then hand out the remainder one per bin in strides, with
/// skimage's integer arithmetic (the remainder may end negative, as there).
fn clip_histogram(hist: &mut [i64], clip: i64) {
    let n = hist.len() as i64;
    let mut excess: i64 = hist.iter().filter(|&&c| c > clip).map(|&c| c - clip).sum();
    hist.iter_mut().for_each(|c| *c = (*c).min(clip));
    let incr = excess / n;
    let upper = clip - incr;
    for c in hist.iter_mut() {
        if *c < upper {
            *c += incr;
            excess -= incr;
        }
    }
    for c in hist.iter_mut() {
        if *c >= upper && *c < clip {
            excess += *c - clip;
            *c = clip;
        }
    }
    while excess > 0 {
        let before = excess;
        for start in 0..hist.len() {
            let under = hist.iter().filter(|&&c| c < clip).count() as i64;
            let step = (under / excess).max(1) as usize;
            let mut added = 0;
            for c in hist[start..].iter_mut().step_by(step) {
                if *c < clip {
                    *c += 1;
                    added += 1;
                }
            }
            excess -= added;
            if excess <= 0 {
                break;
            }
        }
        if before == excess {
            break;
        }
    }
}

/// Bilinear mix of the four surrounding tile maps per pixel. Pixel `(y, x)`
/// sits at `(y + ky/2, x + kx/2)` of skimage's padded grid: block
/// `(by, bx) = pos / k`, fraction `f = (pos % k) / k`; it mixes tiles
/// `by-1, by` × `bx-1, bx` with weights `(1-fx or fx)·(1-fy or fy)` in f64,
/// each term rounded to f32 and summed in f32 in skimage's order, truncated.
fn interpolate<T: Binned + Copy + Sync>(data: &[T], h: usize, w: usize, ky: usize, kx: usize, bins: &[u16], maps: &TileMaps) -> Vec<u16> {
    let mut out = vec![0u16; h * w];
    // Per column: block and the two x weights (skimage: coeffs = arange(k)/k, inv = 1 - coeffs).
    let xs: Vec<(isize, f64, f64)> = (0..w)
        .map(|x| {
            let pos = x + kx / 2;
            let f = (pos % kx) as f64 / kx as f64;
            ((pos / kx) as isize, 1.0 - f, f)
        })
        .collect();
    out.par_chunks_mut(w).enumerate().for_each(|(y, o)| {
        let pos = y + ky / 2;
        let by = (pos / ky) as isize;
        let fy = (pos % ky) as f64 / ky as f64;
        let (wy0, wy1) = (1.0 - fy, fy);
        let row = &data[y * w..][..w];
        let mut x = 0;
        while x < w {
            // A run of columns in the same block shares its four maps.
            let bx = xs[x].0;
            let (m00, m01, m10, m11) = (maps.tile(by - 1, bx - 1), maps.tile(by - 1, bx), maps.tile(by, bx - 1), maps.tile(by, bx));
            while x < w && xs[x].0 == bx {
                let (_, wx0, wx1) = xs[x];
                let b = bins[row[x].bin()] as usize;
                let mut r = 0f32;
                r += (m00[b] * (wx0 * wy0)) as f32;
                r += (m01[b] * (wx1 * wy0)) as f32;
                r += (m10[b] * (wx0 * wy1)) as f32;
                r += (m11[b] * (wx1 * wy1)) as f32;
                o[x] = r as u16;
                x += 1;
            }
        }
    });
    out
}

/// Largest `kernel_size` the registered function declares. The plane bounds
/// it further ([`check_kernel_size`]).
pub const MAX_KERNEL_SIZE: i64 = 1 << 16;

hcsflow_core::function_args! {
    /// The arguments of [`CLAHE`].
    pub struct ClaheArgs {
        kernel_size: i64 = int(
            0,
            Some(0),
            Some(MAX_KERNEL_SIZE),
            "contextual region side in pixels (0: 1/8 of each dimension); at most the plane's larger side",
        ),
        clip_limit: f64 = float(0.01, Some(0.0), Some(1.0), "clip limit as a fraction of the region's pixels (0: no clipping)"),
        nbins: i64 = int(256, Some(1), Some(65_536), "histogram bins over the 16,384 grey levels"),
    }
}

/// `clahe`'s check: the contextual region is at most the plane's larger side.
///
/// scikit-image accepts a larger kernel: it pads the image by reflection to
/// whole regions, so a `k × k` region over a smaller plane sees the plane
/// mirrored again and again, and the work grows as `k²` per region whatever
/// the plane (hours for k = 2²⁰ on a 64² plane). Clamping `k` to the plane
/// would give a different histogram (fewer mirrored copies) than skimage's
/// for the value written, so the function refuses instead and names the
/// largest value this plane allows; every accepted value keeps skimage's result.
pub fn check_kernel_size(args: &ClaheArgs, shape: &StackShape) -> Result<(), ArgProblem> {
    let k = args.kernel_size;
    let side = shape.height.max(shape.width);
    if usize::try_from(k).map_or(true, |k| k > side) {
        return Err(ArgProblem::new(
            "kernel_size",
            format!("kernel_size {k} is larger than the {}x{} plane", shape.height, shape.width),
            format!("use at most {side} (one contextual region covering the plane), or 0 for 1/8 of each dimension"),
        ));
    }
    Ok(())
}

pub static CLAHE: FunctionDecl<ClaheArgs> = FunctionDecl::new(
    NAME,
    Contract::Pure2d,
    "CLAHE per plane (skimage.exposure.equalize_adapthist); keeps the dtype: f32 in [0, 1], u8/u16 scaled to the full range.",
)
.with_check(check_kernel_size);

pub(crate) fn register(registry: &mut Registry) {
    registry.add(crate::host_all_planes(&CLAHE, |s, a| {
        let k = a.kernel_size as usize;
        let params = ClaheParams { kernel_size: (k > 0).then_some((k, k)), clip_limit: a.clip_limit, nbins: a.nbins as usize };
        clahe(s, &params)
    }));
}
