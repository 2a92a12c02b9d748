//! Focus stacking (extended depth of field): one all-in-focus image and a depth
//! map from a z-stack.
//!
//! Methods (argument `method`):
//! - `log` (default): focus measure `m_z = |laplace(gaussian(I_z, σ))|` per pixel
//!   (Gaussian blur then the 5-point Laplacian, both with scipy.ndimage's
//!   `mode="reflect"` borders, truncate 4.0); depth = `argmax_z m_z` (first plane
//!   on ties, like `numpy.argmax`); the image gathers `I[depth]` per pixel, so it
//!   keeps the input dtype and every value is an input value.
//! - `weighted`: Gaussian-difference weights `w_z = |I_z − gaussian(I_z, σ)|`; the
//!   image is `Σ w_z I_z / Σ w_z` (f32; where all weights are 0 the plain mean),
//!   depth = `argmax_z w_z`. The dtype policy brings the f32 image back to the input dtype.
//!
//! Reference: scipy.ndimage `gaussian_filter` and `laplace` in float64. We compute in
//! f32 with the shared separable correlation (`crate::convolve`: weights in f64
//! rounded to f32, symmetric taps folded), so
//! measures agree to ~1e-6 relative and the chosen plane can differ only where two
//! planes' measures are that close (the tests check that our plane's reference
//! measure is within 1e-4 relative of the reference maximum).
//!
//! # Artifacts
//! The registered function `focus_stack` (contract `volumetric_to_slice`) returns
//! the all-in-focus image. The depth map is returned by [`focus_stack`] as a typed
//! [`DepthMap`]; once the pipeline engine carries special outputs between steps,
//! the registration will declare a `depth_map` output and attach
//! [`DepthMap::to_stack`] (a u16 image: plane index per pixel) under that name,
//! written beside the images. Until then library users call [`focus_stack`].

use hcsflow_core::{one_plane, with_pixels, Contract, FunctionDecl, FunctionError, Pixel, Registry, Stack, StackArray};
use ndarray::{Array3, ShapeError};
use rayon::prelude::*;
use serde::Serialize;

use crate::convolve::{correlate_separable, Boundary, Kernel1d};

/// How planes are combined.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
#[serde(rename_all = "snake_case")]
pub enum FocusMethod {
    /// Argmax of the Laplacian-of-Gaussian magnitude, gather.
    Log,
    /// Gaussian-difference weighted average.
    Weighted,
}

impl FocusMethod {
    pub fn parse(s: &str) -> Option<FocusMethod> {
        match s {
            "log" => Some(FocusMethod::Log),
            "weighted" => Some(FocusMethod::Weighted),
            _ => None,
        }
    }
}

/// Index of the chosen (sharpest) plane per pixel, row-major `height × width`.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct DepthMap {
    pub height: usize,
    pub width: usize,
    pub index: Vec<u16>,
}

impl DepthMap {
    /// The depth map as a one-plane u16 image; an error if `index` does not
    /// hold `height · width` values.
    pub fn to_stack(&self) -> Result<Stack, ShapeError> {
        Stack::from_vec([1, self.height, self.width], self.index.clone())
    }
}

/// The result of [`focus_stack`].
#[derive(Debug, Clone, PartialEq)]
pub struct FocusResult {
    /// One plane: input dtype for `log`, f32 for `weighted`.
    pub image: Stack,
    pub depth: DepthMap,
}

/// Largest σ accepted.
pub const MAX_SIGMA: f64 = 100.0;
/// Most planes a depth map can index.
pub const MAX_PLANES: usize = u16::MAX as usize + 1;

/// Output rows per parallel task of `focus_stack`.
const ROWS_PER_TASK: usize = 64;
const TRUNCATE: f64 = 4.0;

fn validate(stack: &Stack, sigma: f64) -> Result<(), FunctionError> {
    const NAME: &str = "focus_stack";
    if stack.depth() == 0 {
        return Err(FunctionError::invalid(NAME, "the stack has no planes"));
    }
    if stack.depth() > MAX_PLANES {
        return Err(FunctionError::invalid(NAME, format!("{} planes; at most {MAX_PLANES} supported", stack.depth())));
    }
    if !(sigma.is_finite() && sigma > 0.0 && sigma <= MAX_SIGMA) {
        return Err(FunctionError::invalid(NAME, format!("sigma {sigma} must be in (0, {MAX_SIGMA}]")));
    }
    Ok(())
}

/// The Gaussian kernel used for the focus measure (scipy's, truncate 4.0), in f32.
pub fn focus_kernel(sigma: f64) -> Vec<f32> {
    Kernel1d::gaussian(sigma, TRUNCATE).weights
}

/// 5-point Laplacian magnitude at column `x` of row `mid` (rows `up`/`dn` above and
/// below, already reflected), reflect borders, in the operation order the GPU kernel
/// repeats: `((up + down) − (c + c)) + ((left + right) − (c + c))`.
#[inline(always)]
fn laplace_abs(up: &[f32], mid: &[f32], dn: &[f32], x: usize, w: usize) -> f32 {
    let c = mid[x];
    let l = mid[if x == 0 { 0 } else { x - 1 }];
    let r = mid[if x + 1 == w { x } else { x + 1 }];
    (((up[x] + dn[x]) - (c + c)) + ((l + r) - (c + c))).abs()
}

/// The measure of row `y` of one plane into `d` (`w` values), from `blur`, the
/// blurred rows `s0..` of the plane (and the plane's pixels `px` for `weighted`).
#[inline(always)]
#[allow(clippy::too_many_arguments)]
fn measure_row<T: Pixel>(blur: &[f32], s0: usize, px: &[T], h: usize, w: usize, y: usize, method: FocusMethod, d: &mut [f32]) {
    let row = |yy: usize| &blur[(yy - s0) * w..(yy - s0 + 1) * w];
    match method {
        FocusMethod::Log => {
            let up = row(if y == 0 { 0 } else { y - 1 });
            let dn = row(if y + 1 == h { y } else { y + 1 });
            let mid = row(y);
            d[0] = laplace_abs(up, mid, dn, 0, w);
            if w > 2 {
                // Interior: the same expression as `laplace_abs`, on slices (vectorises).
                let (u, dd, l, c, r) = (&up[1..w - 1], &dn[1..w - 1], &mid[..w - 2], &mid[1..w - 1], &mid[2..]);
                for (i, v) in d[1..w - 1].iter_mut().enumerate() {
                    let cc = c[i] + c[i];
                    *v = (((u[i] + dd[i]) - cc) + ((l[i] + r[i]) - cc)).abs();
                }
            }
            if w > 1 {
                d[w - 1] = laplace_abs(up, mid, dn, w - 1, w);
            }
        }
        FocusMethod::Weighted => {
            for ((v, &b), &p) in d.iter_mut().zip(row(y)).zip(&px[y * w..(y + 1) * w]) {
                *v = (p.to_f32() - b).abs();
            }
        }
    }
}

/// The Gaussian blur of one plane (shared separable correlation, reflect borders).
fn blur_plane<T: Pixel>(plane: &[T], h: usize, w: usize, g: &Kernel1d) -> Vec<f32> {
    correlate_separable(plane, h, w, g, g, Boundary::Reflect)
}

/// Blurred rows of one plane for output rows `y0..y1` and their neighbours:
/// `(s0, rows s0..s1)`. The correlation runs on the slab of rows `y0−r−1 ..
/// y1+r+1` (clamped to the image) so a row block stays in cache; the rows used
/// (`y0−1 ..= y1`, clamped) only read slab rows, and where the slab touches an
/// image edge its reflection is the image's (the slab is then at least r+1 rows,
/// or the whole plane), so they are bit-identical to blurring the whole plane.
fn blur_slab<T: Pixel>(plane: &[T], h: usize, w: usize, y0: usize, y1: usize, g: &Kernel1d) -> (usize, Vec<f32>) {
    let r = g.radius();
    let s0 = y0.saturating_sub(r + 1);
    let s1 = (y1 + r + 1).min(h);
    (s0, correlate_separable(&plane[s0 * w..s1 * w], s1 - s0, w, g, g, Boundary::Reflect))
}

/// Per-plane focus measure: `|laplace(gaussian(I_z, σ))|` (`log`) or
/// `|I_z − gaussian(I_z, σ)|` (`weighted`), f32, same shape as the stack.
pub fn focus_measure(stack: &Stack, sigma: f64, method: FocusMethod) -> Result<Array3<f32>, FunctionError> {
    validate(stack, sigma)?;
    let [n, h, w] = stack.shape();
    let g = Kernel1d::gaussian(sigma, TRUNCATE);
    let mut out = StackArray::<f32>::zeros([n, h, w]);
    with_pixels!(Stack, stack, a, T => {
        for (plane, o) in a.planes().zip(out.planes_mut()) {
            let blur = blur_plane(plane, h, w, &g);
            o.par_chunks_mut(w.max(1)).enumerate().for_each(|(y, d)| measure_row(&blur, 0, plane, h, w, y, method, d));
        }
    });
    Ok(out.into_array())
}

/// Running sums of the `weighted` method for one row block: Σ w·I, Σ w, Σ I.
type Sums<'a> = (&'a mut [f32], &'a mut [f32], &'a mut [f32]);

/// One row block `bi` of [`focus_stack`]: planes in order, each plane's slab
/// blurred, measured and folded into the running argmax (`b`, `d`) while in
/// cache, plus the weighted sums. Compiled with AVX2 where available (the
/// measure and the select are vector loops; same arithmetic either way).
#[allow(clippy::too_many_arguments)]
fn fold_block<T: Pixel>(
    planes: &[&[T]],
    h: usize,
    w: usize,
    g: &Kernel1d,
    method: FocusMethod,
    bi: usize,
    b: &mut [f32],
    d: &mut [u16],
    m: &mut Vec<f32>,
    acc: Option<Sums<'_>>,
) {
    #[cfg(target_arch = "x86_64")]
    if std::arch::is_x86_feature_detected!("avx2") {
        // SAFETY: the CPU supports AVX2, checked just above.
        return unsafe { fold_block_avx2(planes, h, w, g, method, bi, b, d, m, acc) };
    }
    fold_block_impl(planes, h, w, g, method, bi, b, d, m, acc)
}

#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx2")]
#[allow(clippy::too_many_arguments)]
fn fold_block_avx2<T: Pixel>(
    planes: &[&[T]],
    h: usize,
    w: usize,
    g: &Kernel1d,
    method: FocusMethod,
    bi: usize,
    b: &mut [f32],
    d: &mut [u16],
    m: &mut Vec<f32>,
    acc: Option<Sums<'_>>,
) {
    fold_block_impl(planes, h, w, g, method, bi, b, d, m, acc)
}

#[inline(always)]
#[allow(clippy::too_many_arguments)]
fn fold_block_impl<T: Pixel>(
    planes: &[&[T]],
    h: usize,
    w: usize,
    g: &Kernel1d,
    method: FocusMethod,
    bi: usize,
    b: &mut [f32],
    d: &mut [u16],
    m: &mut Vec<f32>,
    mut acc: Option<Sums<'_>>,
) {
    let y0 = bi * ROWS_PER_TASK;
    let y1 = y0 + b.len() / w.max(1);
    m.resize(b.len(), 0.0);
    for (z, plane) in planes.iter().enumerate() {
        let (s0, blur) = blur_slab(plane, h, w, y0, y1, g);
        for (j, mr) in m.chunks_mut(w.max(1)).enumerate() {
            measure_row(&blur, s0, plane, h, w, y0 + j, method, mr);
        }
        let zz = z as u16;
        if z == 0 {
            b.copy_from_slice(m);
            d.iter_mut().for_each(|v| *v = 0);
        } else {
            for ((b, &v), di) in b.iter_mut().zip(m.iter()).zip(d.iter_mut()) {
                // Branch-free select (vectorises); strict `>` keeps the first plane on ties.
                let gt = v > *b;
                *b = if gt { v } else { *b };
                *di = if gt { zz } else { *di };
            }
        }
        if let Some((nu, de, su)) = acc.as_mut() {
            let px = &plane[y0 * w..y0 * w + nu.len()];
            for i in 0..nu.len() {
                let (wt, v) = (m[i], px[i].to_f32());
                nu[i] += wt * v;
                de[i] += wt;
                su[i] += v;
            }
        }
    }
}

/// Focus-stacks `stack` (`[Z, Y, X]`, Z ≥ 1) with `method` and Gaussian `sigma` (pixels).
///
/// Contract: `volumetric_to_slice` (N → 1). `log`: image in the input dtype,
/// exact gather of the sharpest plane; `weighted`: f32 image. Both return the
/// depth map (u16 plane index per pixel). A one-plane stack returns that plane
/// (`log`) and depth 0. Errors: empty stack, more than [`MAX_PLANES`] planes,
/// σ outside (0, [`MAX_SIGMA`]].
pub fn focus_stack(stack: &Stack, sigma: f64, method: FocusMethod) -> Result<FocusResult, FunctionError> {
    validate(stack, sigma)?;
    let [n, h, w] = stack.shape();
    let g = Kernel1d::gaussian(sigma, TRUNCATE);
    let rows = ROWS_PER_TASK * w.max(1);
    let mut depth = vec![0u16; h * w];
    let mut best = vec![0f32; h * w];
    // weighted: Σ w·I, Σ w, Σ I
    let (mut num, mut den, mut sum) = match method {
        FocusMethod::Weighted => (vec![0f32; h * w], vec![0f32; h * w], vec![0f32; h * w]),
        FocusMethod::Log => (Vec::new(), Vec::new(), Vec::new()),
    };
    let image = with_pixels!(Stack, stack, a, T => {
        let planes: Vec<&[T]> = a.planes().collect();
        // Row blocks in parallel; within a block, planes in order (each plane's slab
        // is blurred, measured and folded into the running argmax while in cache).
        let fold = |bi: usize, b: &mut [f32], d: &mut [u16], m: &mut Vec<f32>, acc: Option<Sums<'_>>| {
            fold_block(&planes, h, w, &g, method, bi, b, d, m, acc)
        };
        match method {
            FocusMethod::Log => {
                best.par_chunks_mut(rows)
                    .zip(depth.par_chunks_mut(rows))
                    .enumerate()
                    .for_each_init(Vec::new, |m, (bi, (b, d))| fold(bi, b, d, m, None));
            }
            FocusMethod::Weighted => {
                best.par_chunks_mut(rows)
                    .zip(depth.par_chunks_mut(rows))
                    .zip(num.par_chunks_mut(rows).zip(den.par_chunks_mut(rows)).zip(sum.par_chunks_mut(rows)))
                    .enumerate()
                    .for_each_init(Vec::new, |m, (bi, ((b, d), ((nu, de), su)))| fold(bi, b, d, m, Some((nu, de, su))));
            }
        }
        match method {
            FocusMethod::Log => {
                let mut out = StackArray::<T>::zeros([1, h, w]);
                out.pixels_mut()
                    .par_iter_mut()
                    .zip(depth.par_iter())
                    .enumerate()
                    .with_min_len(1 << 14)
                    .for_each(|(i, (o, &d))| *o = planes[d as usize][i]);
                Stack::from(out)
            }
            FocusMethod::Weighted => {
                let nf = n as f32;
                let mut out = StackArray::<f32>::zeros([1, h, w]);
                for (i, o) in out.pixels_mut().iter_mut().enumerate() {
                    *o = if den[i] > 0.0 { num[i] / den[i] } else { sum[i] / nf };
                }
                Stack::from(out)
            }
        }
    });
    Ok(FocusResult { image, depth: DepthMap { height: h, width: w, index: depth } })
}

hcsflow_core::function_args! {
    /// The arguments of [`FOCUS_STACK`].
    pub struct FocusStackArgs {
        method: String = choice("log", &["log", "weighted"], "log: sharpest plane per pixel (keeps dtype); weighted: weighted mean (f32)"),
        sigma: f64 = float(1.0, Some(0.1), Some(MAX_SIGMA), "Gaussian sigma in pixels (truncate 4.0, as scipy)"),
    }
}

impl FocusStackArgs {
    /// The method argument as a [`FocusMethod`].
    pub fn focus_method(&self) -> Result<FocusMethod, FunctionError> {
        FocusMethod::parse(&self.method).ok_or_else(|| FunctionError::invalid("focus_stack", format!("unknown method '{}'", self.method)))
    }
}

pub static FOCUS_STACK: FunctionDecl<FocusStackArgs> = FunctionDecl::new(
    "focus_stack",
    Contract::VolumetricToSlice,
    "All-in-focus image from a z-stack: argmax of |laplace(gaussian)| per pixel (log) or Gaussian-difference weighted mean (weighted); scipy.ndimage borders.",
)
.with_output_shape(one_plane);

pub(crate) fn register(registry: &mut Registry) {
    registry.add(FOCUS_STACK.host(|s, a, _| Ok(focus_stack(s, a.sigma, a.focus_method()?)?.image)));
}
