//! The Richardson–Lucy iteration on FFTs.
//!
//! # Layout
//!
//! The transform grid is `pz × py × px` (the image `nz × ny × nx` zero-padded
//! for [`Boundary::Same`], the image itself for [`Boundary::Circular`]). A
//! spectrum is stored plane by plane (only the `nz` planes the image has: the
//! others are zero going into a z transform and not needed coming out of
//! one), each plane *column-major* over the `hx = px/2 + 1` non-redundant x
//! frequencies: `spec[z][u · py + v]`. So the y FFTs of a plane are one
//! batched, contiguous `rustfft` call, and x rows are transposed in blocks of
//! 8 (one cache line of a column). The z FFTs gather short blocks of lines
//! across planes. With a one-plane PSF there is no z transform at all: every
//! plane is deconvolved on its own.
//!
//! One iteration is two sweeps over the spectrum, each fused as far as it
//! goes: (z FFT, × OTF, inverse z FFT) over lines, then per plane (inverse y
//! FFT, per row: inverse x FFT → ratio or update → forward x FFT, forward y
//! FFT). The FFT normalisation is folded into the OTF.

use std::borrow::Cow;
use std::sync::Arc;

use ndarray::{Array3, ArrayView3};
use rayon::prelude::*;
use realfft::{ComplexToReal, RealFftPlanner, RealToComplex};
use rustfft::num_complex::Complex32;
use rustfft::{Fft, FftPlanner};

use crate::fast::next_fast_len;
use crate::separable::{self, Kernels};
use crate::{DeconError, Psf};

/// How the image continues beyond its edges.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum Boundary {
    /// Zero outside the image, the model compared with the image only inside
    /// it: scikit-image's `richardson_lucy` (`scipy.signal.convolve(mode="same")`).
    #[default]
    Same,
    /// Periodic: the image wraps around (a plain FFT convolution, no padding).
    Circular,
}

/// How the blur is computed.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum Method {
    /// Direct 1D convolutions when the PSF is separable (every Gaussian is)
    /// and has at most [`SEPARABLE_MAX_TAPS`] taps in all (`kz + ky + kx`),
    /// FFTs otherwise.
    #[default]
    Auto,
    /// Always FFTs.
    Fft,
    /// Always direct 1D convolutions (an error for a PSF that is not separable).
    Separable,
}

/// [`Method::Auto`]'s limit for direct separable convolution: its cost grows
/// with the taps, the FFT's only with the logarithm of the size. Measured on
/// 30×512² ("same", 10 iterations, 2 cores): 45 taps 0.42 s against 2.2 s by
/// FFT, 75 taps 0.89 s against 3.5 s, 111 taps 1.35 s against 3.0 s; the
/// crossing is near 250 taps, so the limit leaves a margin for smaller stacks.
pub const SEPARABLE_MAX_TAPS: usize = 160;

/// Parameters of [`richardson_lucy`].
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct RlParams {
    /// Iterations (≥ 1); they act as the regularisation.
    pub iterations: usize,
    pub boundary: Boundary,
    /// Biggs–Andrews vector extrapolation (two more volume buffers).
    pub acceleration: bool,
    /// Floor of the blurred estimate before dividing (finite, ≥ 0).
    pub epsilon: f32,
    /// FFTs or direct separable convolution (same operator, same iterates to f32 rounding).
    pub method: Method,
}

impl Default for RlParams {
    fn default() -> Self {
        RlParams { iterations: 10, boundary: Boundary::Same, acceleration: false, epsilon: 1e-12, method: Method::Auto }
    }
}

/// Rows per transposition block: 8 complex values = one 64-byte cache line.
const BLOCK: usize = 8;
/// z lines per gathered block of the z pass.
const LINES: usize = 32;

/// Richardson–Lucy on `image` (`[z, y, x]`, finite, ≥ 0) with `psf`: the
/// estimate after `params.iterations` iterations (see the crate documentation
/// for the update, boundary, ε and non-negativity policy).
///
/// Memory, in volume-sized f32 buffers (`V = nz·ny·nx·4` bytes): the
/// estimate (1, returned), one spectrum (`nz · (px/2+1) · py` complex ≈
/// `(px·py)/(nx·ny)` V), the OTF (3D PSF: `(px/2+1) · py · pz` complex ≈
/// `px·py·pz / (nx·ny·nz)` V; one-plane PSF: a single plane), and with
/// acceleration two more (the previous estimate and the last step). So ≈ 3–3.5 V
/// for a 3D PSF (30×512² with a 15³ PSF, "same": 3.5 V), the caller's f32
/// image besides, ≈ 5.5 V accelerated ([`Plan::describe`] gives the numbers).
/// By direct separable convolution: the estimate and one work buffer (2 V;
/// 4 V accelerated) and about 1 MB per worker thread. Nothing volume-sized
/// is allocated per iteration (the separable sweep lists its row blocks'
/// slices each time: a few KB).
pub fn richardson_lucy(image: ArrayView3<f32>, psf: &Psf, params: &RlParams) -> Result<Array3<f32>, DeconError> {
    let (nz, ny, nx) = image.dim();
    Plan::new([nz, ny, nx], psf, params)?.run(image)
}

/// FFT plans and the OTF for one image shape, PSF and parameters: build once,
/// [`Plan::run`] on any number of images of that shape.
pub struct Plan {
    /// Image shape `[nz, ny, nx]`.
    n: [usize; 3],
    /// Transform sizes `[pz, py, px]` (`pz` = 1 without a z transform).
    p: [usize; 3],
    hx: usize,
    z_fft: bool,
    params: RlParams,
    r2c: Arc<dyn RealToComplex<f32>>,
    c2r: Arc<dyn ComplexToReal<f32>>,
    y_fwd: Arc<dyn Fft<f32>>,
    y_inv: Arc<dyn Fft<f32>>,
    z_fwd: Arc<dyn Fft<f32>>,
    z_inv: Arc<dyn Fft<f32>>,
    /// With a z transform: line-major `otf[j · pz + z]` (`j = u · py + v`);
    /// without: one plane `otf[j]`. Scaled by 1 / (number of transformed points).
    /// Empty when `separable`.
    otf: Vec<Complex32>,
    /// The PSF's 1D kernels when the blur is done by direct convolution.
    separable: Option<Kernels>,
}

/// Per-worker buffers of the plane passes.
struct Scratch {
    row: Vec<f32>,
    conv: Vec<f32>,
    block: Vec<Complex32>,
    fft: Vec<Complex32>,
}

/// A `Send`able pointer for the disjoint per-line writes of the z pass.
#[derive(Clone, Copy)]
struct SpecPtr(*mut Complex32);
// SAFETY: every task of a z pass reads and writes only the elements of its own
// range of lines `j`, in every plane; the ranges are disjoint.
unsafe impl Send for SpecPtr {}
unsafe impl Sync for SpecPtr {}

impl SpecPtr {
    /// The element `i` (a method, so closures capture the whole `Send` wrapper).
    fn at(self, i: usize) -> *mut Complex32 {
        self.0.wrapping_add(i)
    }
}

impl Plan {
    /// Plans the transforms for images of `shape` (`[z, y, x]`) and computes
    /// the OTF. Errors: an empty shape, a PSF larger than the image along an
    /// axis, no iterations, a negative or non-finite epsilon.
    pub fn new(shape: [usize; 3], psf: &Psf, params: &RlParams) -> Result<Plan, DeconError> {
        let [nz, ny, nx] = shape;
        if nz == 0 || ny == 0 || nx == 0 {
            return Err(DeconError::Image(format!("the image is empty ({nz}×{ny}×{nx})")));
        }
        if params.iterations == 0 {
            return Err(DeconError::Params("iterations must be ≥ 1".into()));
        }
        if !params.epsilon.is_finite() || params.epsilon < 0.0 {
            return Err(DeconError::Params(format!("epsilon must be finite and ≥ 0, got {}", params.epsilon)));
        }
        let k = psf.shape();
        for (i, axis) in ["z", "y", "x"].into_iter().enumerate() {
            if k[i] > shape[i] {
                return Err(DeconError::PsfTooLarge { psf_origin: psf.origin().to_string(), psf: k, image: shape, axis });
            }
        }
        let z_fft = k[0] > 1;
        let (pz, py, px) = match params.boundary {
            Boundary::Same => (
                if z_fft { next_fast_len(nz + k[0] / 2, false) } else { 1 },
                next_fast_len(ny + k[1] / 2, false),
                next_fast_len(nx + k[2] / 2, true),
            ),
            Boundary::Circular => (if z_fft { nz } else { 1 }, ny, nx),
        };
        let mut real = RealFftPlanner::<f32>::new();
        let mut complex = FftPlanner::<f32>::new();
        let mut plan = Plan {
            n: shape,
            p: [pz, py, px],
            hx: px / 2 + 1,
            z_fft,
            params: *params,
            r2c: real.plan_fft_forward(px),
            c2r: real.plan_fft_inverse(px),
            y_fwd: complex.plan_fft_forward(py),
            y_inv: complex.plan_fft_inverse(py),
            z_fwd: complex.plan_fft_forward(pz),
            z_inv: complex.plan_fft_inverse(pz),
            otf: Vec::new(),
            separable: None,
        };
        let kernels = match params.method {
            Method::Fft => None,
            Method::Auto => separable::factor(psf).filter(|k| k.taps() <= SEPARABLE_MAX_TAPS),
            Method::Separable => Some(separable::factor(psf).ok_or_else(|| {
                DeconError::Params(format!(
                    "method = separable, but the PSF ({}) is not separable (not an outer product of three 1D profiles); use the FFT",
                    psf.origin()
                ))
            })?),
        };
        match kernels {
            Some(k) => plan.separable = Some(k),
            None => plan.otf = plan.compute_otf(psf),
        }
        Ok(plan)
    }

    /// `[pz, py, px]`, the transform grid.
    pub fn transform_shape(&self) -> [usize; 3] {
        self.p
    }

    /// One line for logs and run notes: grid, boundary, buffers.
    pub fn describe(&self) -> String {
        let [nz, ny, nx] = self.n;
        let [pz, py, px] = self.p;
        let volume = (nz * ny * nx * 4) as f64;
        if let Some(k) = &self.separable {
            return format!(
                "Richardson–Lucy {} iterations, {:?} boundary{}, image {nz}×{ny}×{nx}, separable PSF by direct convolution ({} taps); \
                 buffers {} volumes (estimate, work{}) and {:.1} MB per worker thread",
                self.params.iterations,
                self.params.boundary,
                if self.params.acceleration { ", Biggs–Andrews acceleration" } else { "" },
                k.taps(),
                if self.params.acceleration { 4 } else { 2 },
                if self.params.acceleration { ", previous estimate, step" } else { "" },
                separable::scratch_bytes(self.n, self.params.acceleration) as f64 / 1e6,
            );
        }
        let spec = (nz * self.hx * py * 8) as f64;
        let otf = (self.otf.len() * 8) as f64;
        let extra = if self.params.acceleration { 2.0 } else { 0.0 };
        format!(
            "Richardson–Lucy {} iterations, {:?} boundary{}, image {nz}×{ny}×{nx} on a {}×{py}×{px} FFT grid; buffers ≈ {:.1} volumes \
             (estimate 1, spectrum {:.1}, OTF {:.1}{})",
            self.params.iterations,
            self.params.boundary,
            if self.params.acceleration { ", Biggs–Andrews acceleration" } else { "" },
            if self.z_fft { pz } else { nz },
            1.0 + extra + (spec + otf) / volume,
            spec / volume,
            otf / volume,
            if self.params.acceleration { ", acceleration 2" } else { "" },
        )
    }

    fn plane_len(&self) -> usize {
        self.hx * self.p[1]
    }

    fn scratch(&self) -> Scratch {
        let fft = [
            self.r2c.get_scratch_len(),
            self.c2r.get_scratch_len(),
            self.y_fwd.get_inplace_scratch_len(),
            self.y_inv.get_inplace_scratch_len(),
        ]
        .into_iter()
        .max()
        .unwrap_or(0);
        Scratch {
            row: vec![0.0; self.p[2]],
            conv: vec![0.0; self.p[2]],
            block: vec![Complex32::default(); BLOCK * self.hx],
            fft: vec![Complex32::default(); fft.max(1)],
        }
    }

    /// The OTF of `psf`, its centre voxel moved to index 0 (circularly), on
    /// the transform grid, scaled by 1 / (transformed points).
    fn compute_otf(&self, psf: &Psf) -> Vec<Complex32> {
        let [pz, py, px] = self.p;
        let [kz, ky, kx] = psf.shape();
        let (cz, cy, cx) = ((kz - 1) / 2, (ky - 1) / 2, (kx - 1) / 2);
        let h = psf.view();
        let plane_len = self.plane_len();
        let mut planes = vec![Complex32::default(); kz * plane_len];
        planes.par_chunks_mut(plane_len).enumerate().for_each_init(
            || self.scratch(),
            |s, (iz, plane)| {
                self.load_plane(plane, s, |y, row| {
                    // Row y of the wrapped PSF plane holds PSF row (y + cy) mod py.
                    let iy = (y + cy) % py;
                    if iy >= ky {
                        return false;
                    }
                    row.fill(0.0);
                    for ix in 0..kx {
                        row[(ix + px - cx) % px] = h[[iz, iy, ix]];
                    }
                    true
                })
            },
        );
        let points = if self.z_fft { pz * py * px } else { py * px };
        let scale = 1.0 / points as f32;
        if !self.z_fft {
            planes.iter_mut().for_each(|c| *c *= scale);
            return planes;
        }
        let mut otf = vec![Complex32::default(); plane_len * pz];
        let scratch_len = self.z_fwd.get_inplace_scratch_len().max(1);
        otf.par_chunks_mut(LINES * pz).enumerate().for_each_init(
            || vec![Complex32::default(); scratch_len],
            |fft, (chunk, lines)| {
                let j0 = chunk * LINES;
                for (k, line) in lines.chunks_mut(pz).enumerate() {
                    for iz in 0..kz {
                        line[(iz + pz - cz) % pz] = planes[iz * plane_len + j0 + k];
                    }
                }
                self.z_fwd.process_with_scratch(lines, fft);
                lines.iter_mut().for_each(|c| *c *= scale);
            },
        );
        otf
    }

    /// Forward 2D transform of one plane whose rows `row(y, buffer)` writes
    /// (returning false for an all-zero row) into `plane` (column-major).
    fn load_plane(&self, plane: &mut [Complex32], s: &mut Scratch, mut row: impl FnMut(usize, &mut [f32]) -> bool) {
        let (py, hx) = (self.p[1], self.hx);
        for y0 in (0..py).step_by(BLOCK) {
            let rows = BLOCK.min(py - y0);
            for k in 0..rows {
                let out = &mut s.block[k * hx..(k + 1) * hx];
                if row(y0 + k, &mut s.row) {
                    // Lengths come from this plan: realfft cannot fail here.
                    let _ = self.r2c.process_with_scratch(&mut s.row, out, &mut s.fft);
                } else {
                    out.fill(Complex32::default());
                }
            }
            scatter_block(plane, &s.block, y0, rows, py, hx);
        }
        self.y_fwd.process_with_scratch(plane, &mut s.fft);
    }

    /// The inverse 2D transform of `plane` (after an optional element-wise
    /// product with `pre`, conjugated or not), row by row through `op(y,
    /// inverse row, out row)` for the image's rows; when `forward` the rows
    /// `op` filled (it returns true) are transformed back into `plane`.
    fn plane_pass(
        &self,
        plane: &mut [Complex32],
        s: &mut Scratch,
        pre: Option<(&[Complex32], bool)>,
        forward: bool,
        mut op: impl FnMut(usize, &[f32], &mut [f32]) -> bool,
    ) {
        let [_, ny, _] = self.n;
        let (py, px, hx) = (self.p[1], self.p[2], self.hx);
        if let Some((otf, conj)) = pre {
            multiply(plane, otf, conj);
        }
        self.y_inv.process_with_scratch(plane, &mut s.fft);
        for y0 in (0..py).step_by(BLOCK) {
            let rows = BLOCK.min(py - y0);
            let live = rows.min(ny.saturating_sub(y0));
            if live == 0 && !forward {
                break;
            }
            gather_block(plane, &mut s.block, y0, live, py, hx);
            for k in 0..rows {
                let spec_row = &mut s.block[k * hx..(k + 1) * hx];
                let mut filled = false;
                if k < live {
                    // A real signal's DC and Nyquist bins are real; round-off
                    // leaves a tiny imaginary part that realfft rejects.
                    spec_row[0].im = 0.0;
                    if px % 2 == 0 {
                        spec_row[hx - 1].im = 0.0;
                    }
                    let _ = self.c2r.process_with_scratch(spec_row, &mut s.conv, &mut s.fft);
                    filled = op(y0 + k, &s.conv, &mut s.row);
                }
                if forward {
                    if filled {
                        let _ = self.r2c.process_with_scratch(&mut s.row, spec_row, &mut s.fft);
                    } else {
                        spec_row.fill(Complex32::default());
                    }
                }
            }
            if forward {
                scatter_block(plane, &s.block, y0, rows, py, hx);
            }
        }
        if forward {
            self.y_fwd.process_with_scratch(plane, &mut s.fft);
        }
    }

    /// The z transforms of a 3D spectrum: per line, forward FFT, × OTF (or its
    /// conjugate), inverse FFT. Planes ≥ nz enter as zeros and are dropped.
    fn z_pass(&self, spec: &mut [Complex32], conj: bool) {
        let [nz, _, _] = self.n;
        let pz = self.p[0];
        let plane_len = self.plane_len();
        let threads = rayon::current_num_threads().max(1);
        let group = plane_len.div_ceil(threads * 8).max(LINES);
        let groups = plane_len.div_ceil(group);
        debug_assert_eq!(spec.len(), nz * plane_len);
        let base = SpecPtr(spec.as_mut_ptr());
        let scratch_len = self.z_fwd.get_inplace_scratch_len().max(self.z_inv.get_inplace_scratch_len()).max(1);
        (0..groups).into_par_iter().for_each_init(
            || (vec![Complex32::default(); LINES * pz], vec![Complex32::default(); scratch_len]),
            |(buf, fft), g| {
                let (g0, g1) = (g * group, ((g + 1) * group).min(plane_len));
                for j0 in (g0..g1).step_by(LINES) {
                    let c = LINES.min(g1 - j0);
                    let lines = &mut buf[..c * pz];
                    for z in 0..nz {
                        // SAFETY: j0..j0 + c lies in this task's range of plane z (see SpecPtr).
                        let src = unsafe { std::slice::from_raw_parts(base.at(z * plane_len + j0), c) };
                        for (k, &v) in src.iter().enumerate() {
                            lines[k * pz + z] = v;
                        }
                    }
                    for k in 0..c {
                        lines[k * pz + nz..(k + 1) * pz].fill(Complex32::default());
                    }
                    self.z_fwd.process_with_scratch(lines, fft);
                    multiply(lines, &self.otf[j0 * pz..(j0 + c) * pz], conj);
                    self.z_inv.process_with_scratch(lines, fft);
                    for z in 0..nz {
                        // SAFETY: as above; no other task touches these elements.
                        let dst = unsafe { std::slice::from_raw_parts_mut(base.at(z * plane_len + j0), c) };
                        for (k, d) in dst.iter_mut().enumerate() {
                            *d = lines[k * pz + z];
                        }
                    }
                }
            },
        );
    }

    /// The OTF to multiply inside the plane passes (one-plane PSFs only).
    fn pre(&self, conj: bool) -> Option<(&[Complex32], bool)> {
        (!self.z_fft).then_some((self.otf.as_slice(), conj))
    }

    /// Forward transform of a real volume (`nz × ny × nx`, zero-padded).
    fn load(&self, spec: &mut [Complex32], volume: &[f32]) {
        let [_, ny, nx] = self.n;
        spec.par_chunks_mut(self.plane_len()).zip(volume.par_chunks(ny * nx)).for_each_init(
            || self.scratch(),
            |s, (plane, v)| {
                self.load_plane(plane, s, |y, row| {
                    if y >= ny {
                        return false;
                    }
                    row[..nx].copy_from_slice(&v[y * nx..(y + 1) * nx]);
                    row[nx..].fill(0.0);
                    true
                })
            },
        );
    }

    /// Transforms `spec` = F(x) into F(A x), in place (3D: the z pass; one-plane
    /// PSFs: nothing, the product happens in the next plane pass).
    fn blur(&self, spec: &mut [Complex32], conj: bool) {
        if self.z_fft {
            self.z_pass(spec, conj);
        }
    }

    /// `spec` ← F(image / max(A x, ε)) from `spec` = F(A x) (3D) or F(x) (one-plane PSFs).
    fn ratio_pass(&self, spec: &mut [Complex32], image: &[f32]) {
        let [_, ny, nx] = self.n;
        let eps = self.params.epsilon;
        spec.par_chunks_mut(self.plane_len()).zip(image.par_chunks(ny * nx)).for_each_init(
            || self.scratch(),
            |s, (plane, img)| {
                self.plane_pass(plane, s, self.pre(false), true, |y, conv, out| {
                    let img = &img[y * nx..(y + 1) * nx];
                    for ((o, &c), &d) in out.iter_mut().zip(conv).zip(img) {
                        *o = d / c.max(eps);
                    }
                    out[nx..].fill(0.0);
                    true
                })
            },
        );
    }

    /// `x ← x · max(Aᵀ r, 0)` from `spec` = F(Aᵀ r) (3D) or F(r); then `spec` ← F(x) when `forward`.
    fn update_pass(&self, spec: &mut [Complex32], x: &mut [f32], forward: bool) {
        let [_, ny, nx] = self.n;
        spec.par_chunks_mut(self.plane_len()).zip(x.par_chunks_mut(ny * nx)).for_each_init(
            || self.scratch(),
            |s, (plane, x)| {
                self.plane_pass(plane, s, self.pre(true), forward, |y, corr, out| {
                    let x = &mut x[y * nx..(y + 1) * nx];
                    for (v, &c) in x.iter_mut().zip(corr) {
                        *v *= c.max(0.0);
                    }
                    if forward {
                        out[..nx].copy_from_slice(x);
                        out[nx..].fill(0.0);
                    }
                    forward
                })
            },
        );
    }

    /// Biggs–Andrews: `spec` ← F(y), `y = max(x + α (x − x_prev), 0)`.
    fn load_extrapolated(&self, spec: &mut [Complex32], x: &[f32], prev: &[f32], alpha: f32) {
        let [_, ny, nx] = self.n;
        let plane = ny * nx;
        spec.par_chunks_mut(self.plane_len()).zip(x.par_chunks(plane).zip(prev.par_chunks(plane))).for_each_init(
            || self.scratch(),
            |s, (spec_plane, (x, prev))| {
                self.load_plane(spec_plane, s, |y, row| {
                    if y >= ny {
                        return false;
                    }
                    let r = y * nx..(y + 1) * nx;
                    for ((o, &a), &b) in row.iter_mut().zip(&x[r.clone()]).zip(&prev[r]) {
                        *o = (a + alpha * (a - b)).max(0.0);
                    }
                    row[nx..].fill(0.0);
                    true
                })
            },
        );
    }

    /// Biggs–Andrews update from `spec` = F(Aᵀ r) at `y` (recomputed from `x`,
    /// `prev`, `alpha`): `x_new = y · max(Aᵀ r, 0)`, `g_new = x_new − y`;
    /// `prev ← x`, `x ← x_new`, `g ← g_new`. Returns `(Σ g_new g_old, Σ g_old²)`.
    fn update_extrapolated(&self, spec: &mut [Complex32], x: &mut [f32], prev: &mut [f32], g: &mut [f32], alpha: f32) -> (f64, f64) {
        let [_, ny, nx] = self.n;
        let plane = ny * nx;
        spec.par_chunks_mut(self.plane_len())
            .zip(x.par_chunks_mut(plane).zip(prev.par_chunks_mut(plane).zip(g.par_chunks_mut(plane))))
            .map_init(
                || self.scratch(),
                |s, (spec_plane, (x, (prev, g)))| {
                    let (mut num, mut den) = (0.0f64, 0.0f64);
                    self.plane_pass(spec_plane, s, self.pre(true), false, |yy, corr, _| {
                        let r = yy * nx..(yy + 1) * nx;
                        let (mut n, mut d) = (0.0f32, 0.0f32);
                        for (((xv, pv), gv), &c) in x[r.clone()].iter_mut().zip(&mut prev[r.clone()]).zip(&mut g[r]).zip(corr) {
                            let y = (*xv + alpha * (*xv - *pv)).max(0.0);
                            let new = y * c.max(0.0);
                            let step = new - y;
                            n += step * *gv;
                            d += *gv * *gv;
                            *gv = step;
                            *pv = *xv;
                            *xv = new;
                        }
                        num += f64::from(n);
                        den += f64::from(d);
                        false
                    });
                    (num, den)
                },
            )
            .reduce(|| (0.0, 0.0), |a, b| (a.0 + b.0, a.1 + b.1))
    }

    /// Deconvolves `image` (the plan's shape, finite, ≥ 0).
    pub fn run(&self, image: ArrayView3<f32>) -> Result<Array3<f32>, DeconError> {
        let (nz, ny, nx) = image.dim();
        if [nz, ny, nx] != self.n {
            return Err(DeconError::Image(format!("the image is {nz}×{ny}×{nx}, the plan was made for {:?}", self.n)));
        }
        let image: Cow<[f32]> = match image.as_slice() {
            Some(s) => Cow::Borrowed(s),
            None => Cow::Owned(image.iter().copied().collect()),
        };
        check_image(&image, [nz, ny, nx])?;
        if let Some(kernels) = &self.separable {
            let x = separable::run(kernels, &image, self.n, &self.params);
            return Array3::from_shape_vec((nz, ny, nx), x).map_err(|e| DeconError::Image(e.to_string()));
        }
        let mut spec = vec![Complex32::default(); nz * self.plane_len()];
        let mut x = vec![0.5f32; nz * ny * nx];
        let iterations = self.params.iterations;
        if !self.params.acceleration {
            self.load(&mut spec, &x);
            for it in 0..iterations {
                self.blur(&mut spec, false);
                self.ratio_pass(&mut spec, &image);
                self.blur(&mut spec, true);
                self.update_pass(&mut spec, &mut x, it + 1 < iterations);
            }
        } else {
            let mut prev = x.clone();
            let mut g = vec![0.0f32; x.len()];
            let mut alpha = 0.0f32;
            for _ in 0..iterations {
                self.load_extrapolated(&mut spec, &x, &prev, alpha);
                self.blur(&mut spec, false);
                self.ratio_pass(&mut spec, &image);
                self.blur(&mut spec, true);
                let (num, den) = self.update_extrapolated(&mut spec, &mut x, &mut prev, &mut g, alpha);
                alpha = if den > 0.0 { (num / den).clamp(0.0, 1.0) as f32 } else { 0.0 };
            }
        }
        Array3::from_shape_vec((nz, ny, nx), x).map_err(|e| DeconError::Image(e.to_string()))
    }
}

/// Rejects non-finite and negative values, naming the first one found.
fn check_image(image: &[f32], [_, ny, nx]: [usize; 3]) -> Result<(), DeconError> {
    // A branch-free test per chunk (it vectorises), then the first bad value
    // of the first bad chunk: NaN fails both comparisons, +∞ the second.
    const CHUNK: usize = 1 << 14;
    let good = |v: f32| (0.0..=f32::MAX).contains(&v);
    let bad = image
        .par_chunks(CHUNK)
        .position_first(|c| !c.iter().fold(true, |ok, &v| ok & good(v)))
        .and_then(|c| image[c * CHUNK..].iter().position(|&v| !good(v)).map(|i| c * CHUNK + i));
    match bad {
        None => Ok(()),
        Some(i) => {
            let (z, y, x) = (i / (ny * nx), (i / nx) % ny, i % nx);
            Err(DeconError::Image(format!(
                "value {} at (z, y, x) = ({z}, {y}, {x}): Richardson–Lucy needs finite, non-negative intensities (nothing is clipped \
                 for you: subtract a background only down to 0, or clip explicitly)",
                image[i]
            )))
        }
    }
}

/// `a *= b` (or `conj(b)`), element-wise.
fn multiply(a: &mut [Complex32], b: &[Complex32], conj: bool) {
    if conj {
        a.iter_mut().zip(b).for_each(|(x, y)| *x *= y.conj());
    } else {
        a.iter_mut().zip(b).for_each(|(x, y)| *x *= y);
    }
}

/// `block[k][u] = plane[u · py + y0 + k]` for `k < rows`.
fn gather_block(plane: &[Complex32], block: &mut [Complex32], y0: usize, rows: usize, py: usize, hx: usize) {
    if rows == 0 {
        return;
    }
    for u in 0..hx {
        let col = &plane[u * py + y0..u * py + y0 + rows];
        for (k, &c) in col.iter().enumerate() {
            block[k * hx + u] = c;
        }
    }
}

/// `plane[u · py + y0 + k] = block[k][u]` for `k < rows`.
fn scatter_block(plane: &mut [Complex32], block: &[Complex32], y0: usize, rows: usize, py: usize, hx: usize) {
    for u in 0..hx {
        let col = &mut plane[u * py + y0..u * py + y0 + rows];
        for (k, c) in col.iter_mut().enumerate() {
            *c = block[k * hx + u];
        }
    }
}
