//! Private separable-convolution helpers shared by the part-B functions
//! (focus stacking, `blob_log`): scipy.ndimage-compatible Gaussian kernels
//! (orders 0 and 2) and row-block separable correlation with scipy's
//! `mode="reflect"` borders.
//!
//! TODO: use the shared separable convolution from filters.rs / convolve.rs when it lands
//! (issue 5 part A); these helpers exist only so part B does not wait for it.

use hcsflow_core::Pixel;

/// scipy.ndimage's `mode="reflect"` (half-sample symmetric, `d c b a | a b c d | d c b a`)
/// index for any offset, including kernels wider than the image.
#[inline]
pub(crate) fn reflect(i: isize, n: usize) -> usize {
    if n == 1 {
        return 0;
    }
    let period = 2 * n as isize;
    let m = i.rem_euclid(period);
    if m < n as isize {
        m as usize
    } else {
        (period - 1 - m) as usize
    }
}

/// The kernel radius scipy uses: `int(truncate * sigma + 0.5)`.
pub(crate) fn kernel_radius(sigma: f64, truncate: f64) -> usize {
    (truncate * sigma + 0.5).floor().max(0.0) as usize
}

/// scipy.ndimage `_gaussian_kernel1d(sigma, order, radius)` for order 0 or 2,
/// computed in f64 and rounded to f32. Symmetric, so correlation equals convolution.
/// Order 0: `phi(x) / sum(phi)`; order 2: `(x²/σ⁴ − 1/σ²) · phi(x)/sum(phi)`.
pub(crate) fn gaussian_kernel(sigma: f64, order: u32, radius: usize) -> Vec<f32> {
    let r = radius as i64;
    let s2 = sigma * sigma;
    let phi: Vec<f64> = (-r..=r).map(|x| (-0.5 / s2 * (x * x) as f64).exp()).collect();
    let sum: f64 = phi.iter().sum();
    (-r..=r)
        .zip(&phi)
        .map(|(x, p)| {
            let p = p / sum;
            let v = match order {
                0 => p,
                _ => ((x * x) as f64 / (s2 * s2) - 1.0 / s2) * p,
            };
            v as f32
        })
        .collect()
}

/// Scratch buffers for [`separable_rows`], reused across calls by one worker.
#[derive(Default)]
pub(crate) struct Scratch {
    /// The block's rows after the vertical pass, each with `rx` reflected values each side.
    vert: Vec<f32>,
    /// Offsets of the source rows of each output row, per tap.
    rows: Vec<usize>,
}

/// Output columns computed together in registers: `WIDE` (8 AVX2 vectors, enough
/// independent chains to hide the FMA latency), then `LANES`, then one at a time.
const WIDE: usize = 64;
const LANES: usize = 16;
/// Columns per tile of the vertical pass (a multiple of `LANES`).
const TILE: usize = 256;


/// Rows `y0..y1` of the separable correlation of one `h × w` plane: first along
/// Y with `wy`, then along X with `wx` (scipy's axis order), borders by
/// [`reflect`]. Each output value is `Σ_k w[k]·v[k]` accumulated in f32 in tap
/// order starting from 0, each step a fused multiply-add (`f32::mul_add`; scipy
/// accumulates in f64: results agree to ~1e-6 relative). `out` holds `(y1 - y0) × w`
/// values. Compiled for AVX2+FMA when the CPU has them; elsewhere `mul_add` is the
/// (slower) exact software FMA, so every CPU gives identical results.
#[allow(clippy::too_many_arguments)]
pub(crate) fn separable_rows<T: Pixel>(
    plane: &[T],
    h: usize,
    w: usize,
    y0: usize,
    y1: usize,
    wy: &[f32],
    wx: &[f32],
    scratch: &mut Scratch,
    out: &mut [f32],
) {
    #[cfg(target_arch = "x86_64")]
    #[target_feature(enable = "avx2,fma")]
    #[allow(clippy::too_many_arguments)]
    unsafe fn avx2<T: Pixel>(
        plane: &[T],
        h: usize,
        w: usize,
        y0: usize,
        y1: usize,
        wy: &[f32],
        wx: &[f32],
        scratch: &mut Scratch,
        out: &mut [f32],
    ) {
        separable_rows_impl(plane, h, w, y0, y1, wy, wx, scratch, out)
    }
    #[cfg(target_arch = "x86_64")]
    {
        if std::arch::is_x86_feature_detected!("avx2") && std::arch::is_x86_feature_detected!("fma") {
            // SAFETY: the CPU supports AVX2 and FMA, checked just above.
            unsafe { avx2(plane, h, w, y0, y1, wy, wx, scratch, out) };
            return;
        }
    }
    separable_rows_impl(plane, h, w, y0, y1, wy, wx, scratch, out)
}

#[inline(always)]
#[allow(clippy::too_many_arguments)]
fn separable_rows_impl<T: Pixel>(
    plane: &[T],
    h: usize,
    w: usize,
    y0: usize,
    y1: usize,
    wy: &[f32],
    wx: &[f32],
    scratch: &mut Scratch,
    out: &mut [f32],
) {
    let ry = (wy.len() / 2) as isize;
    let rx = wx.len() / 2;
    let rows_out = y1 - y0;
    let stride = w + 2 * rx;
    scratch.vert.clear();
    scratch.vert.resize(rows_out * stride, 0.0);
    scratch.rows.clear();
    scratch.rows.resize(rows_out * wy.len(), 0);
    for y in y0..y1 {
        for (k, r) in scratch.rows[(y - y0) * wy.len()..(y - y0 + 1) * wy.len()].iter_mut().enumerate() {
            *r = reflect(y as isize + k as isize - ry, h) * w;
        }
    }
    // Vertical pass, in column tiles so that the source rows of a tile stay in cache
    // while the output rows advance; results go to the middle of each padded row.
    let mut x0 = 0;
    while x0 < w {
        let x1 = (x0 + TILE).min(w);
        for yi in 0..rows_out {
            let taps = &scratch.rows[yi * wy.len()..(yi + 1) * wy.len()];
            let acc_row = &mut scratch.vert[yi * stride + rx..yi * stride + rx + w];
            let mut x = x0;
            while x + WIDE <= x1 {
                vertical_chunk::<T, WIDE>(plane, taps, wy, x, &mut acc_row[x..x + WIDE]);
                x += WIDE;
            }
            while x + LANES <= x1 {
                vertical_chunk::<T, LANES>(plane, taps, wy, x, &mut acc_row[x..x + LANES]);
                x += LANES;
            }
            for xi in x..x1 {
                vertical_chunk::<T, 1>(plane, taps, wy, xi, &mut acc_row[xi..xi + 1]);
            }
        }
        x0 = x1;
    }
    for yi in 0..rows_out {
        let pad = &mut scratch.vert[yi * stride..(yi + 1) * stride];
        for i in 0..rx {
            pad[rx - 1 - i] = pad[rx + reflect(-(i as isize) - 1, w)];
            pad[rx + w + i] = pad[rx + reflect((w + i) as isize, w)];
        }
        // Horizontal pass.
        let o = &mut out[yi * w..(yi + 1) * w];
        let mut x = 0;
        while x + WIDE <= w {
            horizontal_chunk::<WIDE>(pad, wx, x, &mut o[x..x + WIDE]);
            x += WIDE;
        }
        while x + LANES <= w {
            horizontal_chunk::<LANES>(pad, wx, x, &mut o[x..x + LANES]);
            x += LANES;
        }
        for xi in x..w {
            horizontal_chunk::<1>(pad, wx, xi, &mut o[xi..xi + 1]);
        }
    }
}

/// `out[l] = Σ_k wy[k]·plane[taps[k] + x + l]` for `l < N`, fused multiply-adds in
/// tap order. `N` independent accumulators hide the FMA latency.
#[inline(always)]
fn vertical_chunk<T: Pixel, const N: usize>(plane: &[T], taps: &[usize], wy: &[f32], x: usize, out: &mut [f32]) {
    let mut acc = [0f32; N];
    for (&r, &wk) in taps.iter().zip(wy) {
        let src = &plane[r + x..r + x + N];
        for l in 0..N {
            acc[l] = wk.mul_add(src[l].to_f32(), acc[l]);
        }
    }
    out.copy_from_slice(&acc);
}

/// `out[l] = Σ_k wx[k]·pad[x + l + k]` for `l < N`, fused multiply-adds in tap order.
#[inline(always)]
fn horizontal_chunk<const N: usize>(pad: &[f32], wx: &[f32], x: usize, out: &mut [f32]) {
    let mut acc = [0f32; N];
    for (k, &wk) in wx.iter().enumerate() {
        let p = &pad[x + k..x + k + N];
        for l in 0..N {
            acc[l] = wk.mul_add(p[l], acc[l]);
        }
    }
    out.copy_from_slice(&acc);
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn reflect_matches_scipy_convention() {
        // n = 3: ... 2 1 0 | 0 1 2 | 2 1 0 ...
        let got: Vec<usize> = (-4..7).map(|i| reflect(i, 3)).collect();
        assert_eq!(got, vec![2, 2, 1, 0, 0, 1, 2, 2, 1, 0, 0]);
        assert_eq!(reflect(-5, 1), 0);
    }

    #[test]
    fn kernels_sum_like_scipy() {
        let k0 = gaussian_kernel(2.0, 0, 8);
        assert!((k0.iter().map(|&v| v as f64).sum::<f64>() - 1.0).abs() < 1e-6);
        // Second-derivative kernel: zero sum of x²·k / 2 = 1 for a continuous Gaussian.
        let k2 = gaussian_kernel(3.0, 2, 12);
        assert!(k2[12] < 0.0 && k2[0] > 0.0);
    }
}
