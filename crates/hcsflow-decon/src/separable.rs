//! Richardson–Lucy with a separable PSF (`h = a ⊗ b ⊗ c`, as every Gaussian
//! is) by direct 1D convolutions along x, y and z instead of FFTs: the same
//! operator (zero outside the image for [`Boundary::Same`], wrapped for
//! [`Boundary::Circular`]; the adjoint is the correlation with the same
//! kernels), so the same iterates to f32 rounding, in `kz + ky + kx` multiply-
//! adds per voxel and blur instead of an FFT's transform passes.
//!
//! # Sweeps
//!
//! The three axis operators commute, so one iteration is two sweeps over the
//! volume, each keeping its working set in the core's cache:
//!
//! - **planes** (one z plane at a time): the y adjoint of the previous
//!   iteration's correction and the update `x ← x · max(c, 0)`, then the y
//!   blur of the new estimate;
//! - **row blocks** (the same few rows of every plane, gathered): the x blur,
//!   the z blur, the ratio `image / max(blur, ε)`, the z adjoint and the x
//!   adjoint.
//!
//! Every convolution computes a strip of output columns for all outputs of
//! the axis before moving on, so the inputs it re-reads (the `k` taps) are in
//! L1; AVX-512 (or AVX2) + FMA when the CPU has them.
//!
//! Memory: the estimate, one volume-sized work buffer (with acceleration two
//! more), and per worker thread two row blocks (≈ 1 MB together; with
//! acceleration one plane more), allocated once per call.

use std::ops::Range;
use std::sync::{Mutex, PoisonError};

use rayon::prelude::*;

use crate::engine::{Boundary, RlParams};
use crate::Psf;

/// The three 1D kernels of a separable PSF and their centres (`(k − 1) / 2`).
#[derive(Debug, Clone)]
pub(crate) struct Kernels {
    /// z, y, x.
    k: [Vec<f32>; 3],
}

/// A PSF's 1D factors when it is separable: its marginals (each sums to 1
/// since the PSF does) reproduce every value to `1e-5` of its peak. `None`
/// otherwise.
pub(crate) fn factor(psf: &Psf) -> Option<Kernels> {
    let h = psf.view();
    let (kz, ky, kx) = h.dim();
    let (mut a, mut b, mut c) = (vec![0.0f64; kz], vec![0.0f64; ky], vec![0.0f64; kx]);
    for ((z, y, x), &v) in h.indexed_iter() {
        let v = f64::from(v);
        a[z] += v;
        b[y] += v;
        c[x] += v;
    }
    let peak = h.iter().fold(0.0f32, |m, &v| m.max(v)) as f64;
    let separable = h.indexed_iter().all(|((z, y, x), &v)| (f64::from(v) - a[z] * b[y] * c[x]).abs() <= 1e-5 * peak);
    let f32s = |v: Vec<f64>| v.into_iter().map(|x| x as f32).collect();
    separable.then(|| Kernels { k: [f32s(a), f32s(b), f32s(c)] })
}

impl Kernels {
    /// Multiply-adds per voxel for one blur.
    pub(crate) fn taps(&self) -> usize {
        self.k.iter().map(Vec::len).sum()
    }
}

/// The vector instructions the kernels are compiled for, chosen once per call.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Isa {
    Scalar,
    #[cfg(target_arch = "x86_64")]
    Avx2,
    #[cfg(target_arch = "x86_64")]
    Avx512,
}

impl Isa {
    fn detect() -> Isa {
        #[cfg(target_arch = "x86_64")]
        {
            let fma = std::arch::is_x86_feature_detected!("avx2") && std::arch::is_x86_feature_detected!("fma");
            if fma && std::arch::is_x86_feature_detected!("avx512f") {
                return Isa::Avx512;
            }
            if fma {
                return Isa::Avx2;
            }
        }
        Isa::Scalar
    }
}

/// `a · b + c`, fused when `FMA` (the AVX2/AVX-512 builds: one instruction; a
/// fused multiply-add without the hardware is a slow library call).
#[inline(always)]
fn madd<const FMA: bool>(a: f32, b: f32, c: f32) -> f32 {
    if FMA {
        a.mul_add(b, c)
    } else {
        a * b + c
    }
}

/// The taps of every output of one axis (length `n`) for one direction:
/// output `i` is `Σ k_j · src[m]` over `of(i)`'s `(m, k_j)`, with `m = i + s_j`,
/// `s_j = c − j` (convolution) or `j − c` (adjoint: correlation), `c = (k − 1) / 2`;
/// a tap outside `[0, n)` is dropped (zero boundary) or wrapped (circular).
/// Taps keep the kernel's order, so every output sums in the same order.
struct AxisTaps {
    /// `start[i]..start[i + 1]` indexes `taps` for output `i`.
    start: Vec<usize>,
    taps: Vec<(usize, f32)>,
}

impl AxisTaps {
    fn new(n: usize, k: &[f32], adjoint: bool, circular: bool) -> AxisTaps {
        let c = (k.len() as isize - 1) / 2;
        let mut start = Vec::with_capacity(n + 1);
        let mut taps = Vec::with_capacity(n * k.len());
        for i in 0..n as isize {
            start.push(taps.len());
            for (j, &kj) in k.iter().enumerate() {
                let s = if adjoint { j as isize - c } else { c - j as isize };
                let m = i + s;
                if (0..n as isize).contains(&m) {
                    taps.push((m as usize, kj));
                } else if circular {
                    taps.push((m.rem_euclid(n as isize) as usize, kj));
                }
            }
        }
        start.push(taps.len());
        AxisTaps { start, taps }
    }

    fn len(&self) -> usize {
        self.start.len() - 1
    }

    fn of(&self, i: usize) -> &[(usize, f32)] {
        &self.taps[self.start[i]..self.start[i + 1]]
    }
}

/// Where [`conv_cols`] puts output `i`, column `t` (its value `v`).
trait Sink {
    fn put<const L: usize>(&mut self, i: usize, t: usize, v: [f32; L]);
    fn put_one(&mut self, i: usize, t: usize, v: f32);
}

/// `dst[i · w + t] = v`.
struct Store<'a> {
    dst: &'a mut [f32],
    w: usize,
}

impl Sink for Store<'_> {
    #[inline(always)]
    fn put<const L: usize>(&mut self, i: usize, t: usize, v: [f32; L]) {
        self.dst[i * self.w + t..i * self.w + t + L].copy_from_slice(&v);
    }
    #[inline(always)]
    fn put_one(&mut self, i: usize, t: usize, v: f32) {
        self.dst[i * self.w + t] = v;
    }
}

/// The ratio: `dst[i · w + t] = image[i · stride + t] / max(v, ε)`.
struct Ratio<'a> {
    dst: &'a mut [f32],
    w: usize,
    image: &'a [f32],
    stride: usize,
    eps: f32,
}

impl Sink for Ratio<'_> {
    #[inline(always)]
    fn put<const L: usize>(&mut self, i: usize, t: usize, v: [f32; L]) {
        let d = &mut self.dst[i * self.w + t..i * self.w + t + L];
        let img = &self.image[i * self.stride + t..i * self.stride + t + L];
        for l in 0..L {
            d[l] = img[l] / v[l].max(self.eps);
        }
    }
    #[inline(always)]
    fn put_one(&mut self, i: usize, t: usize, v: f32) {
        self.dst[i * self.w + t] = self.image[i * self.stride + t] / v.max(self.eps);
    }
}

/// The update: `x[i · w + t] *= max(v, 0)`.
struct Update<'a> {
    x: &'a mut [f32],
    w: usize,
}

impl Sink for Update<'_> {
    #[inline(always)]
    fn put<const L: usize>(&mut self, i: usize, t: usize, v: [f32; L]) {
        let x = &mut self.x[i * self.w + t..i * self.w + t + L];
        for l in 0..L {
            x[l] *= v[l].max(0.0);
        }
    }
    #[inline(always)]
    fn put_one(&mut self, i: usize, t: usize, v: f32) {
        self.x[i * self.w + t] *= v.max(0.0);
    }
}

/// The convolution along an axis of `n` vectors of `w` contiguous values
/// (`src`: `[n][w]`, `n = taps.len()`), for the columns `cols`: output
/// `(i, t)` is `Σ k_j · src[m][t]` over `taps.of(i)`, given to `sink`.
fn conv_cols<S: Sink>(isa: Isa, src: &[f32], w: usize, cols: Range<usize>, taps: &AxisTaps, sink: &mut S) {
    match isa {
        // SAFETY: `Isa::detect` found the features these are compiled for.
        #[cfg(target_arch = "x86_64")]
        Isa::Avx512 => unsafe { conv_cols_avx512(src, w, cols, taps, sink) },
        #[cfg(target_arch = "x86_64")]
        Isa::Avx2 => unsafe { conv_cols_avx2(src, w, cols, taps, sink) },
        Isa::Scalar => conv_cols_impl::<32, false, S>(src, w, cols, taps, sink),
    }
}

#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx512f,avx2,fma")]
unsafe fn conv_cols_avx512<S: Sink>(src: &[f32], w: usize, cols: Range<usize>, taps: &AxisTaps, sink: &mut S) {
    conv_cols_impl::<128, true, S>(src, w, cols, taps, sink)
}

#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx2,fma")]
unsafe fn conv_cols_avx2<S: Sink>(src: &[f32], w: usize, cols: Range<usize>, taps: &AxisTaps, sink: &mut S) {
    conv_cols_impl::<64, true, S>(src, w, cols, taps, sink)
}

/// [`conv_cols`] with `L` outputs accumulated in registers: for each strip of
/// `L` columns, every output of the axis (the taps' inputs stay in L1).
#[inline(always)]
fn conv_cols_impl<const L: usize, const FMA: bool, S: Sink>(src: &[f32], w: usize, cols: Range<usize>, taps: &AxisTaps, sink: &mut S) {
    let n = taps.len();
    let full = cols.start + (cols.end - cols.start) / L * L;
    for t0 in (cols.start..full).step_by(L) {
        for i in 0..n {
            let mut acc = [0.0f32; L];
            for &(m, kj) in taps.of(i) {
                let s = &src[m * w + t0..m * w + t0 + L];
                for t in 0..L {
                    acc[t] = madd::<FMA>(kj, s[t], acc[t]);
                }
            }
            sink.put(i, t0, acc);
        }
    }
    for i in 0..n {
        for t in full..cols.end {
            sink.put_one(i, t, taps.of(i).iter().fold(0.0, |a, &(m, kj)| madd::<FMA>(kj, src[m * w + t], a)));
        }
    }
}

/// The convolution along one contiguous row (`taps`' definition with `w = 1`,
/// the row's length the kernel's `n`) through a padded copy (`pad`, `out`:
/// scratch of at least [`row_scratch_len`]), so every output is computed in
/// full-width chunks.
#[allow(clippy::too_many_arguments)]
fn conv_row(isa: Isa, src: &[f32], dst: &mut [f32], k: &[f32], adjoint: bool, circular: bool, pad: &mut [f32], out: &mut [f32]) {
    match isa {
        // SAFETY: `Isa::detect` found the features these are compiled for.
        #[cfg(target_arch = "x86_64")]
        Isa::Avx512 => unsafe { conv_row_avx512(src, dst, k, adjoint, circular, pad, out) },
        #[cfg(target_arch = "x86_64")]
        Isa::Avx2 => unsafe { conv_row_avx2(src, dst, k, adjoint, circular, pad, out) },
        Isa::Scalar => conv_row_impl::<32, false>(src, dst, k, adjoint, circular, pad, out),
    }
}

#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx512f,avx2,fma")]
unsafe fn conv_row_avx512(src: &[f32], dst: &mut [f32], k: &[f32], adjoint: bool, circular: bool, pad: &mut [f32], out: &mut [f32]) {
    conv_row_impl::<128, true>(src, dst, k, adjoint, circular, pad, out);
}

#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx2,fma")]
unsafe fn conv_row_avx2(src: &[f32], dst: &mut [f32], k: &[f32], adjoint: bool, circular: bool, pad: &mut [f32], out: &mut [f32]) {
    conv_row_impl::<64, true>(src, dst, k, adjoint, circular, pad, out);
}

/// Scratch length of [`conv_row`] for rows of `n` and `k` taps (any ISA).
fn row_scratch_len(n: usize, k: usize) -> usize {
    n.div_ceil(128) * 128 + k
}

#[inline(always)]
fn conv_row_impl<const L: usize, const FMA: bool>(
    src: &[f32],
    dst: &mut [f32],
    k: &[f32],
    adjoint: bool,
    circular: bool,
    pad: &mut [f32],
    out: &mut [f32],
) {
    let n = src.len();
    let c = (k.len() - 1) / 2;
    let m = n.div_ceil(L) * L;
    // pad[p] = the row's value at p − c (zero or wrapped outside), p < m + 2c
    let pad = &mut pad[..m + 2 * c];
    if circular {
        pad[..c].copy_from_slice(&src[n - c..]);
        pad[c + n..2 * c + n].copy_from_slice(&src[..c]);
    } else {
        pad[..c].fill(0.0);
        pad[c + n..2 * c + n].fill(0.0);
    }
    pad[c..c + n].copy_from_slice(src);
    pad[2 * c + n..].fill(0.0);
    for i0 in (0..m).step_by(L) {
        let mut acc = [0.0f32; L];
        for (j, &kj) in k.iter().enumerate() {
            // value at i + s_j = pad[i + c + s_j]
            let off = if adjoint { j } else { 2 * c - j };
            let s = &pad[i0 + off..i0 + off + L];
            for t in 0..L {
                acc[t] = madd::<FMA>(kj, s[t], acc[t]);
            }
        }
        if i0 + L <= n {
            dst[i0..i0 + L].copy_from_slice(&acc);
        } else {
            out[..L].copy_from_slice(&acc);
            dst[i0..].copy_from_slice(&out[..n - i0]);
        }
    }
}

/// One lazily made value per worker thread of the current rayon pool, reused
/// by every task that thread runs (scratch buffers allocated once per call,
/// not once per task).
struct PerThread<T> {
    slots: Vec<Mutex<Option<T>>>,
}

impl<T> PerThread<T> {
    fn new() -> PerThread<T> {
        PerThread { slots: (0..rayon::current_num_threads().max(1)).map(|_| Mutex::new(None)).collect() }
    }

    /// `f` on this thread's value (made by `make` on first use). `f` must not
    /// start rayon work (a task waiting on the lock could hold it).
    fn with<R>(&self, make: impl FnOnce() -> T, f: impl FnOnce(&mut T) -> R) -> R {
        let i = rayon::current_thread_index().unwrap_or(0) % self.slots.len();
        let mut slot = self.slots[i].lock().unwrap_or_else(PoisonError::into_inner);
        f(slot.get_or_insert_with(make))
    }
}

/// Columns per strip of the plane sweep (a multiple of every ISA's lanes).
const STRIP: usize = 128;

/// An f32 buffer whose values start on a 64-byte boundary, so the kernels'
/// vector loads (64 bytes with AVX-512) do not straddle cache lines (that
/// halves their speed; large allocations are only 16-byte aligned).
struct Aligned {
    v: Vec<f32>,
    offset: usize,
    len: usize,
}

impl Aligned {
    fn new(len: usize, value: f32) -> Aligned {
        let v = vec![value; len + 15];
        // ≤ 15 for a 4-byte aligned pointer; 0 (unaligned, still correct) if unknown.
        let offset = v.as_ptr().align_offset(64);
        Aligned { offset: if offset <= 15 { offset } else { 0 }, v, len }
    }

    fn get_mut(&mut self) -> &mut [f32] {
        &mut self.v[self.offset..self.offset + self.len]
    }

    /// The values as a `Vec` (moved to the front of the same allocation).
    fn into_vec(mut self) -> Vec<f32> {
        self.v.copy_within(self.offset..self.offset + self.len, 0);
        self.v.truncate(self.len);
        self.v
    }
}

/// Per-worker buffers of the row-block sweep.
struct BlockScratch {
    a: Aligned,
    b: Aligned,
    pad: Vec<f32>,
    out: Vec<f32>,
}

/// Scratch bytes per worker thread for an image of `n` (`[z, y, x]`): two
/// row blocks, and one plane with acceleration.
pub(crate) fn scratch_bytes(n: [usize; 3], acceleration: bool) -> usize {
    let [nz, ny, nx] = n;
    4 * (2 * nz * block_rows(nz, ny, nx) * nx + if acceleration { ny * nx } else { 0 })
}

/// Rows per block of the row-block sweep: two blocks of every plane (`a`,
/// `b`) in about 1 MB, so they stay in the core's L2.
fn block_rows(nz: usize, ny: usize, nx: usize) -> usize {
    ((1 << 20) / (2 * 4 * nz * nx).max(1)).clamp(1, ny.max(1))
}

/// The operators and buffers shared by the sweeps of one call.
struct Sweeps<'a> {
    isa: Isa,
    n: [usize; 3],
    circular: bool,
    eps: f32,
    kx: &'a [f32],
    /// y: blur, adjoint.
    ty: [AxisTaps; 2],
    /// z: blur, adjoint.
    tz: [AxisTaps; 2],
    rows: usize,
    planes: PerThread<Vec<f32>>,
    blocks: PerThread<BlockScratch>,
}

impl Sweeps<'_> {
    fn plane_scratch(&self) -> Vec<f32> {
        vec![0.0; self.n[1] * self.n[2]]
    }

    /// `work ← Aₓᵀ A_zᵀ (image / max(A_z Aₓ work, ε))`, block by block (a
    /// block: the same rows of every plane).
    fn ratio(&self, work: &mut [f32], image: &[f32]) {
        let [nz, ny, nx] = self.n;
        let plane = ny * nx;
        let bw = self.rows * nx;
        let make = || BlockScratch {
            a: Aligned::new(nz * bw, 0.0),
            b: Aligned::new(nz * bw, 0.0),
            pad: vec![0.0; row_scratch_len(nx, self.kx.len())],
            out: vec![0.0; row_scratch_len(nx, self.kx.len())],
        };
        blocks_mut(work, plane, bw).into_par_iter().enumerate().for_each(|(block, mut parts)| {
            self.blocks.with(make, |s| {
                let w = parts[0].len();
                let BlockScratch { a, b, pad, out } = s;
                let (a, b) = (&mut a.get_mut()[..nz * w], &mut b.get_mut()[..nz * w]);
                for (z, part) in parts.iter().enumerate() {
                    for (src, dst) in part.chunks_exact(nx).zip(a[z * w..(z + 1) * w].chunks_exact_mut(nx)) {
                        conv_row(self.isa, src, dst, self.kx, false, self.circular, pad, out);
                    }
                }
                let image = &image[block * bw..];
                conv_cols(self.isa, a, w, 0..w, &self.tz[0], &mut Ratio { dst: b, w, image, stride: plane, eps: self.eps });
                conv_cols(self.isa, b, w, 0..w, &self.tz[1], &mut Store { dst: a, w });
                for (z, part) in parts.iter_mut().enumerate() {
                    for (src, dst) in a[z * w..(z + 1) * w].chunks_exact(nx).zip(part.chunks_exact_mut(nx)) {
                        conv_row(self.isa, src, dst, self.kx, true, self.circular, pad, out);
                    }
                }
            })
        });
    }
}

/// Richardson–Lucy (the crate's update, ε and non-negativity policy) with a
/// separable PSF on `image` (`[nz][ny][nx]`, checked by the caller).
pub(crate) fn run(kernels: &Kernels, image: &[f32], n: [usize; 3], params: &RlParams) -> Vec<f32> {
    let [nz, ny, nx] = n;
    let plane = ny * nx;
    let circular = params.boundary == Boundary::Circular;
    let [kz, ky, kx] = &kernels.k;
    let sweeps = Sweeps {
        isa: Isa::detect(),
        n,
        circular,
        eps: params.epsilon,
        kx,
        ty: [AxisTaps::new(ny, ky, false, circular), AxisTaps::new(ny, ky, true, circular)],
        tz: [AxisTaps::new(nz, kz, false, circular), AxisTaps::new(nz, kz, true, circular)],
        rows: block_rows(nz, ny, nx),
        planes: PerThread::new(),
        blocks: PerThread::new(),
    };
    let (mut x_buf, mut work_buf) = (Aligned::new(nz * plane, 0.5), Aligned::new(nz * plane, 0.0));
    iterate(&sweeps, x_buf.get_mut(), work_buf.get_mut(), image, params);
    x_buf.into_vec()
}

/// The iterations of [`run`] on the estimate `x` (filled with the start) and the work buffer.
fn iterate(s: &Sweeps, x: &mut [f32], work: &mut [f32], image: &[f32], params: &RlParams) {
    let [nz, ny, nx] = s.n;
    let plane = ny * nx;
    let iterations = params.iterations;
    if !params.acceleration {
        for it in 0..=iterations {
            // Planes: the update from the last ratio sweep (not before the
            // first), then the y blur of the new estimate (not after the last).
            // Strips of columns, so the x strip just updated is still in
            // cache when it is blurred.
            x.par_chunks_mut(plane).zip(work.par_chunks_mut(plane)).for_each(|(xz, wz)| {
                for t0 in (0..nx).step_by(STRIP) {
                    let cols = t0..(t0 + STRIP).min(nx);
                    if it > 0 {
                        conv_cols(s.isa, wz, nx, cols.clone(), &s.ty[1], &mut Update { x: xz, w: nx });
                    }
                    if it < iterations {
                        conv_cols(s.isa, xz, nx, cols, &s.ty[0], &mut Store { dst: wz, w: nx });
                    }
                }
            });
            if it < iterations {
                s.ratio(work, image);
            }
        }
        return;
    }
    let mut prev = x.to_vec();
    let mut g = vec![0.0f32; nz * plane];
    let mut alpha = 0.0f32;
    for _ in 0..iterations {
        // y = max(x + α (x − x_prev), 0); work = A_y y.
        x.par_chunks(plane).zip(prev.par_chunks(plane)).zip(work.par_chunks_mut(plane)).for_each(|((xz, pz), wz)| {
            s.planes.with(
                || s.plane_scratch(),
                |yz| {
                    for ((o, &a), &b) in yz.iter_mut().zip(xz).zip(pz) {
                        *o = (a + alpha * (a - b)).max(0.0);
                    }
                    conv_cols(s.isa, yz, nx, 0..nx, &s.ty[0], &mut Store { dst: wz, w: nx });
                },
            )
        });
        s.ratio(work, image);
        // The update at y (recomputed): x_new = y · max(A_yᵀ work, 0), g_new = x_new − y.
        let (num, den) = x
            .par_chunks_mut(plane)
            .zip(prev.par_chunks_mut(plane).zip(g.par_chunks_mut(plane)))
            .zip(work.par_chunks(plane))
            .map(|((xz, (pz, gz)), wz)| {
                s.planes.with(
                    || s.plane_scratch(),
                    |corr| {
                        conv_cols(s.isa, wz, nx, 0..nx, &s.ty[1], &mut Store { dst: corr, w: nx });
                        let (mut num, mut den) = (0.0f64, 0.0f64);
                        for (((xr, pr), gr), cr) in xz.chunks_mut(nx).zip(pz.chunks_mut(nx)).zip(gz.chunks_mut(nx)).zip(corr.chunks(nx)) {
                            let (mut nn, mut dd) = (0.0f32, 0.0f32);
                            for (((xv, pv), gv), &c) in xr.iter_mut().zip(pr.iter_mut()).zip(gr.iter_mut()).zip(cr) {
                                let y = (*xv + alpha * (*xv - *pv)).max(0.0);
                                let new = y * c.max(0.0);
                                let step = new - y;
                                nn += step * *gv;
                                dd += *gv * *gv;
                                *gv = step;
                                *pv = *xv;
                                *xv = new;
                            }
                            num += f64::from(nn);
                            den += f64::from(dd);
                        }
                        (num, den)
                    },
                )
            })
            .reduce(|| (0.0, 0.0), |a, b| (a.0 + b.0, a.1 + b.1));
        alpha = if den > 0.0 { (num / den).clamp(0.0, 1.0) as f32 } else { 0.0 };
    }
}

/// The volume's planes (`plane` values each) cut into blocks of `bw`
/// values: `result[b][z]` is block `b` of plane `z` (disjoint borrows).
fn blocks_mut(volume: &mut [f32], plane: usize, bw: usize) -> Vec<Vec<&mut [f32]>> {
    let mut blocks: Vec<Vec<&mut [f32]>> = Vec::new();
    for p in volume.chunks_mut(plane) {
        for (b, part) in p.chunks_mut(bw).enumerate() {
            if blocks.len() <= b {
                blocks.push(Vec::new());
            }
            blocks[b].push(part);
        }
    }
    blocks
}

#[cfg(test)]
mod tests {
    use super::*;

    /// conv_cols and conv_row against the definition, both boundaries, both
    /// directions, every instruction set this CPU has.
    #[test]
    fn convolutions_are_the_definition() {
        let k = [0.2f32, 0.5, 0.1, 0.15, 0.05];
        let mut isas = vec![Isa::Scalar];
        if Isa::detect() != Isa::Scalar {
            #[cfg(target_arch = "x86_64")]
            isas.push(Isa::Avx2);
        }
        #[cfg(target_arch = "x86_64")]
        if Isa::detect() == Isa::Avx512 {
            isas.push(Isa::Avx512);
        }
        for isa in isas {
            for n in [5usize, 7, 131, 300] {
                // w: below one strip, several full strips plus a tail
                for w in [1usize, 3, 259] {
                    let src: Vec<f32> = (0..n * w).map(|i| ((i * i + 3 * i) % 17) as f32 + 1.0).collect();
                    for circular in [false, true] {
                        for adjoint in [false, true] {
                            let want = |i: usize, t: usize| {
                                let mut want = 0.0;
                                for (j, kj) in k.iter().enumerate() {
                                    let s = if adjoint { j as isize - 2 } else { 2 - j as isize };
                                    let m = i as isize + s;
                                    if (0..n as isize).contains(&m) {
                                        want += kj * src[m as usize * w + t];
                                    } else if circular {
                                        want += kj * src[m.rem_euclid(n as isize) as usize * w + t];
                                    }
                                }
                                want
                            };
                            let mut dst = vec![0.0; n * w];
                            conv_cols(isa, &src, w, 0..w, &AxisTaps::new(n, &k, adjoint, circular), &mut Store { dst: &mut dst, w });
                            for i in 0..n {
                                for t in 0..w {
                                    let (d, e) = (dst[i * w + t], want(i, t));
                                    assert!((d - e).abs() < 1e-5, "{isa:?} n {n} w {w} circular {circular} adjoint {adjoint}: {d} vs {e}");
                                }
                            }
                            if w == 1 {
                                let mut row = vec![0.0; n];
                                let (mut pad, mut out) = (vec![0.0; row_scratch_len(n, k.len())], vec![0.0; row_scratch_len(n, k.len())]);
                                conv_row(isa, &src, &mut row, &k, adjoint, circular, &mut pad, &mut out);
                                for (a, b) in row.iter().zip(&dst) {
                                    assert!((a - b).abs() < 1e-5, "{isa:?} conv_row n {n}: {a} vs {b}");
                                }
                            }
                        }
                    }
                }
            }
        }
    }
}
