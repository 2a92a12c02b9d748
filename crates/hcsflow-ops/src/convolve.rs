//! The separable-convolution helper every linear filter uses (Gaussian,
//! unsharp mask, Sobel, and the LoG of focus stacking): symmetric or
//! antisymmetric 1-D kernels applied along Y then X over contiguous rows,
//! in f32, in parallel over rows, with scipy.ndimage's boundary modes.
//!
//! Vertical pass: each output row is a weighted sum of input rows;
//! horizontal pass: the row is padded once into a per-task buffer. Both
//! compute [`BLOCK`] neighbouring outputs at once with the accumulators in
//! registers (vectorised along X), and run with AVX2 where available.

use rayon::prelude::*;

use hcsflow_core::Pixel;

/// Rows per parallel task.
const ROWS_PER_TASK: usize = 16;

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
/// takes [`ROWS_PER_TASK`] output rows: their vertical pass goes to a small
/// per-task buffer that stays in cache, then the horizontal pass writes `dst`
/// (no full-size intermediate image).
///
/// Every output value is computed with the same operations in the same order
/// whatever the CPU: `w_c·c`, then per tap pair `+= w·(a + b)` (symmetric taps)
/// or `+= w₋·a + w₊·b`, so results do not depend on the SIMD width.
pub fn correlate_separable_into<T: Pixel>(src: &[T], h: usize, w: usize, ky: &Kernel1d, kx: &Kernel1d, boundary: Boundary, dst: &mut [f32]) {
    if h == 0 || w == 0 {
        return;
    }
    let rx = kx.radius();
    dst.par_chunks_mut(ROWS_PER_TASK * w).enumerate().for_each_init(
        || (vec![0f32; ROWS_PER_TASK * w], vec![0f32; w + 2 * rx], Vec::new()),
        |(vbuf, pad, rows), (block, out)| {
            let n = out.len() / w;
            let vbuf = &mut vbuf[..n * w];
            for (j, o) in vbuf.chunks_mut(w).enumerate() {
                let y = (block * ROWS_PER_TASK + j) as isize;
                let r = ky.radius() as isize;
                rows.clear();
                rows.extend((-r..=r).map(|d| boundary.index(y + d, h)));
                simd::vertical_row(src, w, &ky.weights, rows, o);
            }
            for (o, s) in out.chunks_mut(w).zip(vbuf.chunks(w)) {
                // Interior copied as is; only the 2r border samples need the boundary rule.
                pad[rx..rx + w].copy_from_slice(s);
                for i in (0..rx).chain(rx + w..w + 2 * rx) {
                    pad[i] = s[boundary.index(i as isize - rx as isize, w)];
                }
                simd::horizontal_row(pad, &kx.weights, o);
            }
        },
    );
}

/// Output values computed together, kept in registers across all taps.
const BLOCK: usize = 32;

/// The row kernels, compiled twice: for the baseline target and with AVX2
/// (chosen at run time). The arithmetic is identical (no FMA contraction), so
/// both give bit-identical results; AVX2 only widens the vectors.
mod simd {
    use hcsflow_core::Pixel;

    use super::BLOCK;

    /// `o[x] = Σ_k w[k] · src[rows[k]·w + x]` (rows: the 2r + 1 source row indices).
    pub fn vertical_row<T: Pixel>(src: &[T], w: usize, weights: &[f32], rows: &[usize], o: &mut [f32]) {
        #[cfg(target_arch = "x86_64")]
        if std::arch::is_x86_feature_detected!("avx2") {
            // SAFETY: the CPU supports AVX2, checked just above.
            return unsafe { vertical_row_avx2(src, w, weights, rows, o) };
        }
        vertical_row_impl(src, w, weights, rows, o)
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
    fn vertical_row_avx2<T: Pixel>(src: &[T], w: usize, weights: &[f32], rows: &[usize], o: &mut [f32]) {
        vertical_row_impl(src, w, weights, rows, o)
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
    fn vertical_row_impl<T: Pixel>(src: &[T], w: usize, weights: &[f32], rows: &[usize], o: &mut [f32]) {
        let r = weights.len() / 2;
        let full = w / BLOCK * BLOCK;
        for x0 in (0..full).step_by(BLOCK) {
            block(weights, r, |i| &src[rows[i] * w + x0..][..BLOCK], Pixel::to_f32, &mut o[x0..]);
        }
        for x in full..w {
            o[x] = one(weights, r, |i| src[rows[i] * w + x].to_f32());
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
