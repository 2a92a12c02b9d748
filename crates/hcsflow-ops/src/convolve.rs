//! The separable-convolution helper every linear filter uses (Gaussian,
//! unsharp mask, Sobel, and the LoG of focus stacking): symmetric or
//! antisymmetric 1-D kernels applied along Y then X over contiguous rows,
//! in f32, in parallel over rows, with scipy.ndimage's boundary modes.
//!
//! Vertical pass: each output row is a weighted sum of whole input rows
//! (vectorised along X). Horizontal pass: the row is padded once into a
//! per-task buffer, then every tap is a vectorised multiply-add over the row.

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
    let mut tmp = vec![0f32; h * w];
    if h == 0 || w == 0 {
        return tmp;
    }
    vertical(src, h, w, ky, boundary, &mut tmp);
    let mut out = vec![0f32; h * w];
    horizontal(&tmp, w, kx, boundary, &mut out);
    out
}

/// `dst[y] = Σ_k ky[k] · src[reflect(y + k - r)]`, whole rows at a time.
fn vertical<T: Pixel>(src: &[T], h: usize, w: usize, ky: &Kernel1d, boundary: Boundary, dst: &mut [f32]) {
    let r = ky.radius() as isize;
    let row = |y: isize| &src[boundary.index(y, h) * w..][..w];
    dst.par_chunks_mut(ROWS_PER_TASK * w).enumerate().for_each(|(block, out)| {
        for (j, o) in out.chunks_mut(w).enumerate() {
            let y = (block * ROWS_PER_TASK + j) as isize;
            let centre = row(y);
            let wc = ky.weights[r as usize];
            o.iter_mut().zip(centre).for_each(|(o, &v)| *o = wc * v.to_f32());
            for k in 1..=r {
                let wk = ky.weights[(r + k) as usize];
                let wm = ky.weights[(r - k) as usize];
                let (a, b) = (row(y - k), row(y + k));
                if wk == wm {
                    o.iter_mut().zip(a.iter().zip(b)).for_each(|(o, (&a, &b))| *o += wk * (a.to_f32() + b.to_f32()));
                } else {
                    o.iter_mut().zip(a.iter().zip(b)).for_each(|(o, (&a, &b))| *o += wm * a.to_f32() + wk * b.to_f32());
                }
            }
        }
    });
}

/// `dst[x] = Σ_k kx[k] · src[reflect(x + k - r)]` per row, via a padded row.
fn horizontal(src: &[f32], w: usize, kx: &Kernel1d, boundary: Boundary, dst: &mut [f32]) {
    let r = kx.radius();
    dst.par_chunks_mut(ROWS_PER_TASK * w).zip(src.par_chunks(ROWS_PER_TASK * w)).for_each(|(out, inp)| {
        let mut pad = vec![0f32; w + 2 * r];
        for (o, s) in out.chunks_mut(w).zip(inp.chunks(w)) {
            // Interior copied as is; only the 2r border samples need the boundary rule.
            pad[r..r + w].copy_from_slice(s);
            for i in (0..r).chain(r + w..w + 2 * r) {
                pad[i] = s[boundary.index(i as isize - r as isize, w)];
            }
            let wc = kx.weights[r];
            o.iter_mut().zip(&pad[r..r + w]).for_each(|(o, &v)| *o = wc * v);
            for k in 1..=r {
                let wk = kx.weights[r + k];
                let wm = kx.weights[r - k];
                let (a, b) = (&pad[r - k..r - k + w], &pad[r + k..r + k + w]);
                if wk == wm {
                    o.iter_mut().zip(a.iter().zip(b)).for_each(|(o, (&a, &b))| *o += wk * (a + b));
                } else {
                    o.iter_mut().zip(a.iter().zip(b)).for_each(|(o, (&a, &b))| *o += wm * a + wk * b);
                }
            }
        }
    });
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
