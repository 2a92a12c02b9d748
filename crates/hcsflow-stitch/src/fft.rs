//! 2-D real FFTs of strips, planned once per strip size and shared by all edges.
//!
//! Layout: a strip is `h × w` real values, row-major. Its spectrum holds the
//! `w/2 + 1` non-redundant columns of the 2-D DFT, stored *column-major*
//! (`spec[u * h + v]`), so that the column FFTs run on contiguous memory and
//! one `process` call covers all of them. Products of spectra are element-wise,
//! so the layout never leaks out of this module.

use std::collections::HashMap;
use std::sync::Arc;

use realfft::{ComplexToReal, RealFftPlanner, RealToComplex};
use rustfft::num_complex::Complex32;
use rustfft::{Fft, FftPlanner};

/// Plans for one strip size.
pub(crate) struct Fft2d {
    pub h: usize,
    pub w: usize,
    /// Number of spectrum columns, `w / 2 + 1`.
    pub wh: usize,
    r2c: Arc<dyn RealToComplex<f32>>,
    c2r: Arc<dyn ComplexToReal<f32>>,
    col_fwd: Arc<dyn Fft<f32>>,
    col_inv: Arc<dyn Fft<f32>>,
}

/// Plans keyed by strip size `(h, w)`. Built before the parallel loop over
/// edges (planning is the expensive, allocation-heavy part), then read-only.
pub(crate) struct PlanCache {
    real: RealFftPlanner<f32>,
    complex: FftPlanner<f32>,
    plans: HashMap<(usize, usize), Arc<Fft2d>>,
}

impl Default for PlanCache {
    fn default() -> Self {
        PlanCache { real: RealFftPlanner::new(), complex: FftPlanner::new(), plans: HashMap::new() }
    }
}

impl PlanCache {
    pub fn get_or_plan(&mut self, h: usize, w: usize) -> Arc<Fft2d> {
        if let Some(p) = self.plans.get(&(h, w)) {
            return p.clone();
        }
        let plan = Arc::new(Fft2d {
            h,
            w,
            wh: w / 2 + 1,
            r2c: self.real.plan_fft_forward(w),
            c2r: self.real.plan_fft_inverse(w),
            col_fwd: self.complex.plan_fft_forward(h),
            col_inv: self.complex.plan_fft_inverse(h),
        });
        self.plans.insert((h, w), plan.clone());
        plan
    }

    pub fn get(&self, h: usize, w: usize) -> Option<Arc<Fft2d>> {
        self.plans.get(&(h, w)).cloned()
    }
}

/// Reusable buffers of one worker, fitted to a plan by [`Fft2d::fit_scratch`].
#[derive(Default)]
pub(crate) struct Scratch {
    row_in: Vec<f32>,
    /// `BLOCK` rows of row spectra (`wh` each).
    block: Vec<Complex32>,
    fft: Vec<Complex32>,
}

/// Rows transformed per block in [`Fft2d::forward`] and [`Fft2d::inverse`]:
/// 8 complex values = one 64-byte cache line of a spectrum column.
const BLOCK: usize = 8;

impl Fft2d {
    /// Sizes `s` for this plan, keeping its allocations: a worker moving
    /// between the strip sizes of horizontal and vertical edges reallocates
    /// only when a buffer has to grow beyond its capacity.
    pub fn fit_scratch(&self, s: &mut Scratch) {
        let s1 = self.r2c.get_scratch_len().max(self.c2r.get_scratch_len());
        let s2 = self.col_fwd.get_inplace_scratch_len().max(self.col_inv.get_inplace_scratch_len());
        s.row_in.resize(self.w, 0.0);
        s.block.resize(BLOCK * self.wh, Complex32::default());
        // Longer scratch than a transform needs is fine for realfft and rustfft.
        s.fft.resize(s1.max(s2).max(s.fft.len()), Complex32::default());
    }

    /// Forward transform of `input` (`h × w`, row-major) into `spec`
    /// (`wh × h`, column-major). Sizes are the plan's; callers allocate them so.
    pub fn forward(&self, input: &[f32], spec: &mut [Complex32], s: &mut Scratch) {
        let (h, w, wh) = (self.h, self.w, self.wh);
        // Rows go through the real FFT `BLOCK` at a time, so the transposed
        // writes fill whole cache lines of each spectrum column.
        for y0 in (0..h).step_by(BLOCK) {
            let rows = BLOCK.min(h - y0);
            for k in 0..rows {
                let y = y0 + k;
                s.row_in.copy_from_slice(&input[y * w..(y + 1) * w]);
                // Length mismatches are impossible here: buffers come from this plan.
                let _ = self.r2c.process_with_scratch(&mut s.row_in, &mut s.block[k * wh..(k + 1) * wh], &mut s.fft);
            }
            for u in 0..wh {
                let col = &mut spec[u * h + y0..u * h + y0 + rows];
                for (k, c) in col.iter_mut().enumerate() {
                    *c = s.block[k * wh + u];
                }
            }
        }
        debug_assert_eq!(spec.len(), wh * h);
        self.col_fwd.process_with_scratch(spec, &mut s.fft);
    }

    /// 1-D spectra of a column signal `d` (length `h`, complex FFT) and of a
    /// row signal `e` (length `w`, real FFT: `wh` bins), with the same sign
    /// convention as [`Fft2d::forward`].
    pub fn spectra_1d(&self, d: &[f32], e: &[f32], s: &mut Scratch) -> (Vec<Complex32>, Vec<Complex32>) {
        let mut dh: Vec<Complex32> = d.iter().map(|&v| Complex32::new(v, 0.0)).collect();
        self.col_fwd.process_with_scratch(&mut dh, &mut s.fft);
        s.row_in.copy_from_slice(e);
        let mut eh = vec![Complex32::default(); self.wh];
        let _ = self.r2c.process_with_scratch(&mut s.row_in, &mut eh, &mut s.fft);
        (dh, eh)
    }

    /// Inverse transform of `spec` (destroyed) into `out` (`h × w`), unnormalised.
    pub fn inverse(&self, spec: &mut [Complex32], out: &mut [f32], s: &mut Scratch) {
        let (h, w, wh) = (self.h, self.w, self.wh);
        self.col_inv.process_with_scratch(spec, &mut s.fft);
        for y0 in (0..h).step_by(BLOCK) {
            let rows = BLOCK.min(h - y0);
            for u in 0..wh {
                let col = &spec[u * h + y0..u * h + y0 + rows];
                for (k, &c) in col.iter().enumerate() {
                    s.block[k * wh + u] = c;
                }
            }
            for k in 0..rows {
                let y = y0 + k;
                let row = &mut s.block[k * wh..(k + 1) * wh];
                // A real signal's DC and Nyquist bins are real; rounding leaves a
                // tiny imaginary part that realfft would reject.
                row[0].im = 0.0;
                if w % 2 == 0 {
                    row[wh - 1].im = 0.0;
                }
                let _ = self.c2r.process_with_scratch(row, &mut out[y * w..(y + 1) * w], &mut s.fft);
            }
        }
    }
}

/// The largest `2^a 3^b 5^c` not above `n` (n ≥ 1): strip lengths the FFT
/// handles at full speed. Cropping a strip by a few pixels costs nothing in
/// accuracy; a prime length would cost a Bluestein transform.
pub(crate) fn smooth_floor(n: usize) -> usize {
    let mut m = n.max(1);
    loop {
        let mut k = m;
        for p in [2, 3, 5] {
            while k.is_multiple_of(p) {
                k /= p;
            }
        }
        if k == 1 {
            return m;
        }
        m -= 1;
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn smooth_floor_values() {
        assert_eq!(smooth_floor(2048), 2048);
        assert_eq!(smooth_floor(307), 300);
        assert_eq!(smooth_floor(1), 1);
        assert_eq!(smooth_floor(7), 6);
    }

    #[test]
    fn roundtrip() {
        let mut cache = PlanCache::default();
        let p = cache.get_or_plan(6, 10);
        let x: Vec<f32> = (0..60).map(|i| ((i * 37) % 11) as f32 - 3.0).collect();
        let mut spec = vec![Complex32::default(); p.wh * p.h];
        let mut s = Scratch::default();
        p.fit_scratch(&mut s);
        p.forward(&x, &mut spec, &mut s);
        let mut y = vec![0.0; 60];
        p.inverse(&mut spec, &mut y, &mut s);
        for (a, b) in x.iter().zip(&y) {
            assert!((a - b / 60.0).abs() < 1e-4);
        }
    }
}
