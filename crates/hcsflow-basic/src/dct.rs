//! The orthonormal 2D DCT-II and its inverse (DCT-III), as
//! `scipy.fft.dctn(x, type=2, norm="ortho")` / `idctn(..., norm="ortho")` and
//! `torch_dct.dct_2d` / `idct_2d` with `norm="ortho"` (what BaSiCPy 2.0 calls):
//!
//! `X[k] = s(k) Σₙ x[n] cos(π k (2n + 1) / 2N)`, `s(0) = √(1/N)`, `s(k>0) = √(2/N)`,
//! applied along rows, then along columns. The transform is orthogonal, so the
//! inverse is its transpose.
//!
//! Each 1D transform is one complex FFT of length N (Makhoul's reordering:
//! even samples forward, odd samples backward), computed in f64 and rounded to
//! f32 once.

use std::sync::Arc;

use rustfft::num_complex::Complex;
use rustfft::{Fft, FftPlanner};

/// A planned 1D orthonormal DCT of one length.
struct Dct1d {
    n: usize,
    forward: Arc<dyn Fft<f64>>,
    inverse: Arc<dyn Fft<f64>>,
    /// `exp(-iπk / 2N)`, k = 0..N.
    twiddle: Vec<Complex<f64>>,
}

impl Dct1d {
    fn new(n: usize, planner: &mut FftPlanner<f64>) -> Dct1d {
        let twiddle = (0..n).map(|k| Complex::from_polar(1.0, -std::f64::consts::PI * k as f64 / (2.0 * n as f64))).collect();
        Dct1d { n, forward: planner.plan_fft_forward(n), inverse: planner.plan_fft_inverse(n), twiddle }
    }

    fn scale(&self, k: usize) -> f64 {
        let n = self.n as f64;
        if k == 0 {
            (1.0 / (4.0 * n)).sqrt()
        } else {
            (1.0 / (2.0 * n)).sqrt()
        }
    }

    /// DCT-II (orthonormal) of `x` in place; `buf` holds N complex values.
    fn forward(&self, x: &mut [f64], buf: &mut [Complex<f64>]) {
        let n = self.n;
        for i in 0..n.div_ceil(2) {
            buf[i] = Complex::new(x[2 * i], 0.0);
        }
        for i in 0..n / 2 {
            buf[n - 1 - i] = Complex::new(x[2 * i + 1], 0.0);
        }
        self.forward.process(buf);
        for k in 0..n {
            x[k] = 2.0 * (self.twiddle[k] * buf[k]).re * self.scale(k);
        }
    }

    /// DCT-III (orthonormal, the inverse of [`Dct1d::forward`]) of `x` in place.
    fn inverse(&self, x: &mut [f64], buf: &mut [Complex<f64>]) {
        let n = self.n;
        // Unnormalised DCT-II coefficients y[k] = x[k] / scale(k); then
        // V[k] = conj(twiddle[k]) · (y[k] − i·y[N−k]) / 2 is the FFT of the reordered signal.
        for k in 0..n {
            let y = x[k] / self.scale(k);
            let y_mirror = if k == 0 { 0.0 } else { x[n - k] / self.scale(n - k) };
            buf[k] = self.twiddle[k].conj() * Complex::new(y, -y_mirror) * 0.5;
        }
        self.inverse.process(buf);
        let inv_n = 1.0 / n as f64;
        for i in 0..n.div_ceil(2) {
            x[2 * i] = buf[i].re * inv_n;
        }
        for i in 0..n / 2 {
            x[2 * i + 1] = buf[n - 1 - i].re * inv_n;
        }
    }
}

/// A planned orthonormal 2D DCT of `height × width` row-major images, with
/// its scratch space (so a transform allocates nothing).
pub struct Dct2d {
    height: usize,
    width: usize,
    rows: Dct1d,
    cols: Dct1d,
    /// The image in f64 between the row and column passes.
    work: Vec<f64>,
    line: Vec<f64>,
    buf: Vec<Complex<f64>>,
}

impl Dct2d {
    /// Plans the transforms for `height × width` images (both ≥ 1).
    pub fn new(height: usize, width: usize) -> Dct2d {
        let mut planner = FftPlanner::new();
        let rows = Dct1d::new(width, &mut planner);
        let cols = Dct1d::new(height, &mut planner);
        let longest = height.max(width);
        Dct2d {
            height,
            width,
            rows,
            cols,
            work: vec![0.0; height * width],
            line: vec![0.0; height],
            buf: vec![Complex::new(0.0, 0.0); longest],
        }
    }

    /// `scipy.fft.dctn(x, norm="ortho")` of the image `x` (`height × width`, row-major), in place.
    ///
    /// # Panics
    /// If `x` does not hold `height × width` values (a caller's bug: the plan is for one size).
    pub fn forward(&mut self, x: &mut [f32]) {
        self.apply(x, false);
    }

    /// `scipy.fft.idctn(x, norm="ortho")` of `x`, in place.
    pub fn inverse(&mut self, x: &mut [f32]) {
        self.apply(x, true);
    }

    fn apply(&mut self, x: &mut [f32], inverse: bool) {
        let (h, w) = (self.height, self.width);
        assert_eq!(x.len(), h * w, "Dct2d: the image has {} pixels, the plan is for {h}x{w}", x.len());
        let Dct2d { rows, cols, work, line, buf, .. } = self;
        work.iter_mut().zip(x.iter()).for_each(|(d, &v)| *d = f64::from(v));
        for row in work.chunks_exact_mut(w) {
            if inverse {
                rows.inverse(row, &mut buf[..w]);
            } else {
                rows.forward(row, &mut buf[..w]);
            }
        }
        for c in 0..w {
            for (r, l) in line.iter_mut().enumerate() {
                *l = work[r * w + c];
            }
            if inverse {
                cols.inverse(line, &mut buf[..h]);
            } else {
                cols.forward(line, &mut buf[..h]);
            }
            for (r, &l) in line.iter().enumerate() {
                x[r * w + c] = l as f32;
            }
        }
    }
}
