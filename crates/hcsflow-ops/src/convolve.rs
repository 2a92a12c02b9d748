//! The separable-convolution helper every linear filter uses (Gaussian,
//! unsharp mask, Sobel, and the LoG of focus stacking): symmetric or
//! antisymmetric 1-D kernels applied along Y then X over contiguous rows,
//! in f32, in parallel over rows, with scipy.ndimage's boundary modes.
//!
//! Vertical pass: each output row is a weighted sum of input rows;
//! horizontal pass: the row is padded once into a per-task buffer. Both
//! compute `BLOCK` neighbouring outputs at once with the accumulators in
//! registers (vectorised along X), and run with AVX2 where available.

use rayon::prelude::*;

use hcsflow_core::Pixel;

/// Rows per parallel task on tall planes: each source row the vertical pass
/// loads serves up to 64 output rows of the task.
const ROWS_PER_TASK: usize = 64;
/// Rows per task on short planes (e.g. the slabs of focus stacking), so they
/// still split into several tasks and per-task buffers stay small.
const ROWS_PER_SHORT_TASK: usize = 16;

/// How samples outside the image are taken (scipy.ndimage `mode`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Boundary {
    /// `d c b a | a b c d | d c b a` (scipy `'reflect'`, half-sample symmetric).
    Reflect,
    /// `a a a a | a b c d | d d d d` (scipy `'nearest'`).
    Nearest,
    /// `d c b | a b c d | c b a` (scipy `'mirror'`, whole-sample symmetric).
    Mirror,
}

impl Boundary {
    /// The in-range index for position `i` of a line of `n` samples (`n ≥ 1`),
    /// for any distance outside.
    #[inline]
    pub fn index(self, i: isize, n: usize) -> usize {
        let n_i = n as isize;
        if (0..n_i).contains(&i) {
            return i as usize;
        }
        match self {
            Boundary::Nearest => i.clamp(0, n_i - 1) as usize,
            Boundary::Reflect => {
                let m = i.rem_euclid(2 * n_i);
                (if m >= n_i { 2 * n_i - 1 - m } else { m }) as usize
            }
            Boundary::Mirror => {
                if n == 1 {
                    return 0;
                }
                let period = 2 * n_i - 2;
                let m = i.rem_euclid(period);
                (if m >= n_i { period - m } else { m }) as usize
            }
        }
    }
}

/// A 1-D correlation kernel of odd length `2r + 1` centred on its middle tap,
/// `out[i] = Σ_k w[k] · in[i + k - r]` (scipy `correlate1d`, origin 0).
#[derive(Debug, Clone, PartialEq)]
pub struct Kernel1d {
    pub weights: Vec<f32>,
}

impl Kernel1d {
    pub fn radius(&self) -> usize {
        self.weights.len() / 2
    }

    /// scipy.ndimage's Gaussian: radius `int(truncate·σ + 0.5)`, weights
    /// `exp(-x² / 2σ²)` normalised to sum 1, computed in f64. σ = 0 gives the
    /// identity (as scipy).
    pub fn gaussian(sigma: f64, truncate: f64) -> Kernel1d {
        let radius = (truncate * sigma + 0.5) as usize;
        if sigma <= 0.0 || radius == 0 {
            return Kernel1d { weights: vec![1.0] };
        }
        let s2 = sigma * sigma;
        let phi: Vec<f64> = (0..=2 * radius)
            .map(|i| {
                let x = i as f64 - radius as f64;
                (-0.5 / s2 * x * x).exp()
            })
            .collect();
        let sum: f64 = phi.iter().sum();
        Kernel1d { weights: phi.iter().map(|&p| (p / sum) as f32).collect() }
    }

    /// A kernel from explicit taps (odd length).
    pub fn new(weights: Vec<f32>) -> Kernel1d {
        Kernel1d { weights }
    }
}

/// Correlates one `h × w` plane with `ky` along Y then `kx` along X.
/// `src` is row-major; returns the f32 result, row-major.
pub fn correlate_separable<T: Pixel>(src: &[T], h: usize, w: usize, ky: &Kernel1d, kx: &Kernel1d, boundary: Boundary) -> Vec<f32> {
    let mut out = vec![0f32; h * w];
    correlate_separable_into(src, h, w, ky, kx, boundary, &mut out);
    out
}

/// [`correlate_separable`] into `dst` (`h · w` values). Each parallel task
/// takes `ROWS_PER_TASK` output rows (`ROWS_PER_SHORT_TASK` for planes of
/// fewer than 4·`ROWS_PER_TASK` rows): their vertical pass goes to a small
/// per-task buffer that stays in cache, then the horizontal pass writes `dst`
/// (no full-size intermediate image).
///
/// Every output value is computed with the same operations in the same order
/// whatever the CPU: `w_c·c`, then per tap pair `+= w·(a + b)` (symmetric taps)
/// or `+= w₋·a + w₊·b`, so results do not depend on the SIMD width.
pub fn correlate_separable_into<T: Pixel>(
    src: &[T],
    h: usize,
    w: usize,
    ky: &Kernel1d,
    kx: &Kernel1d,
    boundary: Boundary,
    dst: &mut [f32],
) {
    correlate_blocks(src, h, w, &[(ky, kx)], boundary, dst, |a, _| a);
}

/// Two separable correlations of the same plane combined per pixel:
/// `dst = combine(A, B)` with `A` = `ka.0` along Y then `ka.1` along X and
/// `B` likewise with `kb` (e.g. the Laplacian of Gaussian as the sum of the
/// two second-derivative terms). `A` and `B` are each bit-identical to
/// [`correlate_separable`]; computing them in one sweep reads the source once
/// and needs no full-size buffer for either term.
#[allow(clippy::too_many_arguments)]
pub fn correlate_separable_pair_into<T: Pixel>(
    src: &[T],
    h: usize,
    w: usize,
    ka: (&Kernel1d, &Kernel1d),
    kb: (&Kernel1d, &Kernel1d),
    boundary: Boundary,
    dst: &mut [f32],
    combine: impl Fn(f32, f32) -> f32 + Sync,
) {
    correlate_blocks(src, h, w, &[ka, kb], boundary, dst, combine);
}

/// Row stride of the per-task vertical-pass buffers: `w` rounded up to 16
/// values plus 16, so consecutive rows start in different cache sets (with a
/// power-of-two width every row of a strip would fall in the same L1 set).
fn padded_stride(w: usize) -> usize {
    w.div_ceil(16) * 16 + 16
}

/// Hints the CPU to bring the cache line at `v` into L1.
#[inline(always)]
fn prefetch<T>(v: &T) {
    #[cfg(target_arch = "x86_64")]
    // SAFETY: a prefetch never faults and reads nothing architecturally; the
    // pointer comes from a live reference.
    unsafe {
        std::arch::x86_64::_mm_prefetch::<{ std::arch::x86_64::_MM_HINT_T0 }>(v as *const T as *const i8)
    };
    #[cfg(not(target_arch = "x86_64"))]
    let _ = v;
}

/// The shared row-block driver of [`correlate_separable_into`] (one kernel
/// pair; `combine` unused) and [`correlate_separable_pair_into`] (two pairs
/// over the same source, combined per pixel).
///
/// Vertical pass per [`STRIP`]-column strip: the strip of every source row the
/// block reads (boundary rows resolved) is first gathered, converted to f32,
/// into a compact buffer that stays in L1 (the next strip is prefetched
/// meanwhile), so the taps never walk the image at its row stride; each
/// kernel's vertical result goes to its own padded-stride buffer. Then the
/// horizontal pass per row and kernel: the first writes `dst`, the second a
/// row buffer folded into `dst` by `combine`.
fn correlate_blocks<T: Pixel>(
    src: &[T],
    h: usize,
    w: usize,
    kernels: &[(&Kernel1d, &Kernel1d)],
    boundary: Boundary,
    dst: &mut [f32],
    combine: impl Fn(f32, f32) -> f32 + Sync,
) {
    if h == 0 || w == 0 {
        return;
    }
    let nk = kernels.len();
    let ry = kernels.iter().map(|k| k.0.radius()).max().unwrap_or(0);
    let rx_max = kernels.iter().map(|k| k.1.radius()).max().unwrap_or(0);
    let task = if h >= 4 * ROWS_PER_TASK { ROWS_PER_TASK } else { ROWS_PER_SHORT_TASK };
    let ws = padded_stride(w);
    dst.par_chunks_mut(task * w).enumerate().for_each_init(
        || {
            let strip = vec![0f32; (task.min(h) + 2 * ry) * STRIP];
            (vec![0f32; nk * task.min(h) * ws], vec![0f32; w + 2 * rx_max], Vec::new(), strip, vec![0f32; w])
        },
        |(vbufs, pad, rows, strip, second), (block, out)| {
            let n = out.len() / w;
            let y0 = (block * task) as isize;
            // Source row of every image row the block reads: y0 - ry ..= y0 + n - 1 + ry.
            rows.clear();
            rows.extend((y0 - ry as isize..y0 + (n + ry) as isize).map(|y| boundary.index(y, h)));
            let strip = &mut strip[..rows.len() * STRIP];
            let quads = n / 4 * 4;
            for xa in (0..w).step_by(STRIP) {
                let sw = (xa + STRIP).min(w) - xa;
                for (d, &y) in strip.chunks_mut(STRIP).zip(rows.iter()) {
                    let s = &src[y * w + xa..y * w + xa + sw];
                    for (d, s) in d[..sw].iter_mut().zip(s) {
                        *d = s.to_f32();
                    }
                    if let Some(next) = src.get(y * w + xa + STRIP) {
                        prefetch(next);
                    }
                }
                for (k, &(ky, _)) in kernels.iter().enumerate() {
                    // This kernel's rows start ry - r strip rows in.
                    let strip = &strip[(ry - ky.radius()) * STRIP..];
                    let vbuf = &mut vbufs[k * n * ws..(k + 1) * n * ws];
                    for q in 0..quads / 4 {
                        simd::vertical_rows4(&strip[4 * q * STRIP..], &ky.weights, &mut vbuf[4 * q * ws + xa..], ws, sw);
                    }
                    for j in quads..n {
                        simd::vertical_row(&strip[j * STRIP..], &ky.weights, &mut vbuf[j * ws + xa..j * ws + xa + sw]);
                    }
                }
            }
            for (j, o) in out.chunks_mut(w).enumerate() {
                for (k, &(_, kx)) in kernels.iter().enumerate() {
                    let rx = kx.radius();
                    let s = &vbufs[(k * n + j) * ws..(k * n + j) * ws + w];
                    let pad = &mut pad[..w + 2 * rx];
                    // Interior copied as is; only the 2r border samples need the boundary rule.
                    pad[rx..rx + w].copy_from_slice(s);
                    for i in (0..rx).chain(rx + w..w + 2 * rx) {
                        pad[i] = s[boundary.index(i as isize - rx as isize, w)];
                    }
                    simd::horizontal_row(pad, &kx.weights, if k == 0 { &mut *o } else { &mut second[..] });
                }
                if nk > 1 {
                    o.iter_mut().zip(second.iter()).for_each(|(a, &b)| *a = combine(*a, b));
                }
            }
        },
    );
}

/// Output values computed together, kept in registers across all taps.
const BLOCK: usize = 32;

/// Columns per strip of the vertical pass (a multiple of the vector width).
const STRIP: usize = 32;

/// The row kernels, compiled twice: for the baseline target and with AVX2
/// (chosen at run time). The arithmetic is identical (no FMA contraction), so
/// both give bit-identical results; AVX2 only widens the vectors.
mod simd {
    use super::{BLOCK, STRIP};

    /// `o[x] = Σ_k w[k] · strip[k·STRIP + x]` for `x < o.len()` (the strip's
    /// rows are the 2r + 1 source rows of this output row).
    pub fn vertical_row(strip: &[f32], weights: &[f32], o: &mut [f32]) {
        #[cfg(target_arch = "x86_64")]
        if std::arch::is_x86_feature_detected!("avx2") {
            // SAFETY: the CPU supports AVX2, checked just above.
            return unsafe { vertical_row_avx2(strip, weights, o) };
        }
        vertical_row_impl(strip, weights, o)
    }

    /// [`vertical_row`] for four consecutive output rows: output row `j`
    /// (0..4) goes to `o[j·ostride + x]`, `x < width`, and reads strip rows
    /// `j ..= j + 2r`.
    pub fn vertical_rows4(strip: &[f32], weights: &[f32], o: &mut [f32], ostride: usize, width: usize) {
        #[cfg(target_arch = "x86_64")]
        if std::arch::is_x86_feature_detected!("avx512vl") {
            // SAFETY: the CPU supports AVX-512 VL (and so AVX2), checked just above.
            return unsafe { vertical_rows4_avx512vl(strip, weights, o, ostride, width) };
        }
        #[cfg(target_arch = "x86_64")]
        if std::arch::is_x86_feature_detected!("avx2") {
            // SAFETY: the CPU supports AVX2, checked just above.
            return unsafe { vertical_rows4_avx2(strip, weights, o, ostride, width) };
        }
        vertical_rows4_impl(strip, weights, o, ostride, width)
    }

    /// 256-bit vectors still, but AVX-512 VL gives 32 vector registers: the
    /// four accumulators and eight rolling rows fit without spills.
    #[cfg(target_arch = "x86_64")]
    #[target_feature(enable = "avx2,avx512f,avx512vl")]
    fn vertical_rows4_avx512vl(strip: &[f32], weights: &[f32], o: &mut [f32], ostride: usize, width: usize) {
        vertical_rows4_impl(strip, weights, o, ostride, width)
    }

    #[cfg(target_arch = "x86_64")]
    #[target_feature(enable = "avx2")]
    fn vertical_rows4_avx2(strip: &[f32], weights: &[f32], o: &mut [f32], ostride: usize, width: usize) {
        vertical_rows4_impl(strip, weights, o, ostride, width)
    }

    /// Lanes per vector of [`vertical_rows4_impl`].
    const V: usize = 8;

    /// Four output rows from one sweep over the taps: for 8 columns at a time
    /// the four accumulators and the eight source rows they currently need
    /// stay in registers; each tap step loads two new rows (the outermost
    /// below and above) and shifts the others, instead of eight loads. The
    /// per-value arithmetic is [`one`]'s, in the same order.
    #[inline(always)]
    fn vertical_rows4_impl(strip: &[f32], weights: &[f32], o: &mut [f32], ostride: usize, width: usize) {
        let r = weights.len() / 2;
        let full = width / V * V;
        // Strip row i is image row y0 - r + i; output row j (0..4) is image row y0 + j.
        #[inline(always)]
        fn load(strip: &[f32], at: usize) -> [f32; V] {
            let mut v = [0f32; V];
            v.copy_from_slice(&strip[at..at + V]);
            v
        }
        for x0 in (0..full).step_by(V) {
            let wc = weights[r];
            let at = |i: usize| i * STRIP + x0;
            let mut acc = [[0f32; V]; 4];
            for (j, a) in acc.iter_mut().enumerate() {
                let c = load(strip, at(r + j));
                for l in 0..V {
                    a[l] = wc * c[l];
                }
            }
            if r > 0 {
                // lo[j] = row y0 + j - k, hi[j] = row y0 + j + k, for the current k.
                let mut lo = [load(strip, at(r - 1)), load(strip, at(r)), load(strip, at(r + 1)), load(strip, at(r + 2))];
                let mut hi = [load(strip, at(r + 1)), load(strip, at(r + 2)), load(strip, at(r + 3)), load(strip, at(r + 4))];
                for k in 1..=r {
                    let (wm, wk) = (weights[r - k], weights[r + k]);
                    if wk == wm {
                        for j in 0..4 {
                            for l in 0..V {
                                acc[j][l] += wk * (lo[j][l] + hi[j][l]);
                            }
                        }
                    } else {
                        for j in 0..4 {
                            for l in 0..V {
                                acc[j][l] += wm * lo[j][l] + wk * hi[j][l];
                            }
                        }
                    }
                    if k < r {
                        lo = [load(strip, at(r - k - 1)), lo[0], lo[1], lo[2]];
                        hi = [hi[1], hi[2], hi[3], load(strip, at(r + 3 + k + 1))];
                    }
                }
            }
            for (j, a) in acc.iter().enumerate() {
                o[j * ostride + x0..][..V].copy_from_slice(a);
            }
        }
        for j in 0..4 {
            for x in full..width {
                o[j * ostride + x] = one(weights, r, |i| strip[(j + i) * STRIP + x]);
            }
        }
    }

    /// `o[x] = Σ_k w[k] · pad[x + k]` (pad: the row with r samples added each side).
    pub fn horizontal_row(pad: &[f32], weights: &[f32], o: &mut [f32]) {
        #[cfg(target_arch = "x86_64")]
        if std::arch::is_x86_feature_detected!("avx2") {
            // SAFETY: the CPU supports AVX2, checked just above.
            return unsafe { horizontal_row_avx2(pad, weights, o) };
        }
        horizontal_row_impl(pad, weights, o)
    }

    #[cfg(target_arch = "x86_64")]
    #[target_feature(enable = "avx2")]
    fn vertical_row_avx2(strip: &[f32], weights: &[f32], o: &mut [f32]) {
        vertical_row_impl(strip, weights, o)
    }

    #[cfg(target_arch = "x86_64")]
    #[target_feature(enable = "avx2")]
    fn horizontal_row_avx2(pad: &[f32], weights: &[f32], o: &mut [f32]) {
        horizontal_row_impl(pad, weights, o)
    }

    /// One output value from `at(offset)` = the sample at tap offset `-r..=r`.
    #[inline(always)]
    fn one(weights: &[f32], r: usize, at: impl Fn(usize) -> f32) -> f32 {
        // at(i) is the sample under weights[i].
        let mut s = weights[r] * at(r);
        for k in 1..=r {
            let (wm, wk) = (weights[r - k], weights[r + k]);
            if wk == wm {
                s += wk * (at(r - k) + at(r + k));
            } else {
                s += wm * at(r - k) + wk * at(r + k);
            }
        }
        s
    }

    /// [`BLOCK`] output values at once: `line(i)` is the slice under weights[i].
    #[inline(always)]
    fn block<'a, S: Copy + 'a>(weights: &[f32], r: usize, line: impl Fn(usize) -> &'a [S], f: impl Fn(S) -> f32, o: &mut [f32]) {
        let mut acc = [0f32; BLOCK];
        let (c, wc) = (line(r), weights[r]);
        for l in 0..BLOCK {
            acc[l] = wc * f(c[l]);
        }
        for k in 1..=r {
            let (wm, wk) = (weights[r - k], weights[r + k]);
            let (a, b) = (&line(r - k)[..BLOCK], &line(r + k)[..BLOCK]);
            if wk == wm {
                for l in 0..BLOCK {
                    acc[l] += wk * (f(a[l]) + f(b[l]));
                }
            } else {
                for l in 0..BLOCK {
                    acc[l] += wm * f(a[l]) + wk * f(b[l]);
                }
            }
        }
        o[..BLOCK].copy_from_slice(&acc);
    }

    #[inline(always)]
    fn vertical_row_impl(strip: &[f32], weights: &[f32], o: &mut [f32]) {
        let r = weights.len() / 2;
        let width = o.len();
        let full = width / BLOCK * BLOCK;
        for x0 in (0..full).step_by(BLOCK) {
            block(weights, r, |i| &strip[i * STRIP + x0..][..BLOCK], |v| v, &mut o[x0..]);
        }
        for x in full..width {
            o[x] = one(weights, r, |i| strip[i * STRIP + x]);
        }
    }

    #[inline(always)]
    fn horizontal_row_impl(pad: &[f32], weights: &[f32], o: &mut [f32]) {
        let r = weights.len() / 2;
        let w = o.len();
        let full = w / BLOCK * BLOCK;
        for x0 in (0..full).step_by(BLOCK) {
            block(weights, r, |i| &pad[x0 + i..][..BLOCK], |v| v, &mut o[x0..]);
        }
        for x in full..w {
            o[x] = one(weights, r, |i| pad[x + i]);
        }
    }
}

#[cfg(test)]
mod tests {
    use hcsflow_testkit::random_values;

    use super::*;

    #[test]
    fn boundary_indices_follow_scipy() {
        let n = 4;
        let reflect: Vec<usize> = (-5..9).map(|i| Boundary::Reflect.index(i, n)).collect();
        assert_eq!(reflect, [3, 3, 2, 1, 0, 0, 1, 2, 3, 3, 2, 1, 0, 0]);
        let mirror: Vec<usize> = (-4..8).map(|i| Boundary::Mirror.index(i, n)).collect();
        assert_eq!(mirror, [2, 3, 2, 1, 0, 1, 2, 3, 2, 1, 0, 1]);
        let nearest: Vec<usize> = (-2..6).map(|i| Boundary::Nearest.index(i, n)).collect();
        assert_eq!(nearest, [0, 0, 0, 1, 2, 3, 3, 3]);
        assert_eq!(Boundary::Reflect.index(-7, 1), 0);
        assert_eq!(Boundary::Mirror.index(5, 1), 0);
    }

    /// Scalar reference in the documented operation order: centre tap, then
    /// per pair `+= w·(a + b)` (symmetric) or `+= w₋·a + w₊·b`.
    fn reference(src: &[f32], h: usize, w: usize, ky: &Kernel1d, kx: &Kernel1d) -> Vec<f32> {
        let pass = |get: &dyn Fn(isize) -> f32, k: &Kernel1d| {
            let r = k.radius();
            let mut s = k.weights[r] * get(0);
            for d in 1..=r {
                let (wm, wk) = (k.weights[r - d], k.weights[r + d]);
                let (a, b) = (get(-(d as isize)), get(d as isize));
                if wk == wm {
                    s += wk * (a + b);
                } else {
                    s += wm * a + wk * b;
                }
            }
            s
        };
        let b = Boundary::Reflect;
        let mut tmp = vec![0f32; h * w];
        for y in 0..h {
            for x in 0..w {
                tmp[y * w + x] = pass(&|d| src[b.index(y as isize + d, h) * w + x], ky);
            }
        }
        let mut out = vec![0f32; h * w];
        for y in 0..h {
            for x in 0..w {
                out[y * w + x] = pass(&|d| tmp[y * w + b.index(x as isize + d, w)], kx);
            }
        }
        out
    }

    #[test]
    fn every_path_keeps_the_documented_operation_order() {
        // Sizes that exercise short and tall (64-row) tasks, the 4-row and single-row vertical paths, strips,
        // full blocks and scalar tails; symmetric and antisymmetric kernels.
        for (seed, &(h, w)) in (0u64..).zip(&[(1, 1), (3, 7), (21, 70), (37, 131), (50, 33), (301, 45)]) {
            let src: Vec<f32> = random_values(h * w, seed, |r| (r % 10_000) as f32 * 0.37 - 1000.0);
            for (ky, kx) in [
                (Kernel1d::gaussian(2.0, 4.0), Kernel1d::gaussian(1.0, 4.0)),
                (Kernel1d::gaussian(6.0, 4.0), Kernel1d::gaussian(0.0, 4.0)),
                (Kernel1d::new(vec![-1.0, 0.0, 1.0]), Kernel1d::new(vec![0.25, 0.5, 0.25])),
            ] {
                let ours = correlate_separable(&src, h, w, &ky, &kx, Boundary::Reflect);
                let want = reference(&src, h, w, &ky, &kx);
                let same = ours.iter().zip(&want).all(|(a, b)| a.to_bits() == b.to_bits());
                assert!(same, "{h}x{w} radius {} / {}: not bit-identical to the reference order", ky.radius(), kx.radius());
            }
        }
    }

    #[test]
    fn pair_equals_the_two_single_correlations_combined() {
        // Different radii in Y and X per term, and a term whose Y radius is smaller
        // than the other's (it reads the shared strip with an offset).
        for (seed, &(h, w)) in (10u64..).zip(&[(2, 3), (19, 40), (70, 67), (300, 129)]) {
            let src: Vec<u16> = random_values(h * w, seed, |r| (r % 60_000) as u16);
            let (g3, g1) = (Kernel1d::gaussian(3.0, 4.0), Kernel1d::gaussian(1.0, 4.0));
            let d = Kernel1d::new(vec![0.5, -1.0, 0.0, 1.0, -0.5]);
            for (ka, kb) in [((&g3, &g1), (&g1, &g3)), ((&d, &g3), (&g1, &d)), ((&g1, &g1), (&g3, &d))] {
                let a = correlate_separable(&src, h, w, ka.0, ka.1, Boundary::Reflect);
                let b = correlate_separable(&src, h, w, kb.0, kb.1, Boundary::Reflect);
                let mut pair = vec![0f32; h * w];
                correlate_separable_pair_into(&src, h, w, ka, kb, Boundary::Reflect, &mut pair, |a, b| -(a + b) * 3.5);
                let same = pair.iter().zip(a.iter().zip(&b)).all(|(p, (a, b))| p.to_bits() == (-(a + b) * 3.5).to_bits());
                assert!(same, "{h}x{w}: pair differs from the combined single correlations");
            }
        }
    }

    #[test]
    fn gaussian_kernel_is_normalised_and_symmetric() {
        let k = Kernel1d::gaussian(2.0, 4.0);
        assert_eq!(k.weights.len(), 17);
        let s: f32 = k.weights.iter().sum();
        assert!((s - 1.0).abs() < 1e-6);
        assert_eq!(k.weights[0], k.weights[16]);
        assert_eq!(Kernel1d::gaussian(0.0, 4.0).weights, vec![1.0]);
    }
}
