//! The noisy nuclei images the tests train and denoise on.

use hcsflow_n2v::rng::SplitMix64;
use ndarray::{Array3, Axis};

/// `depth` planes of Gaussian nuclei (one per `pixels_per_nucleus` pixels) on a background, in
/// photon counts up to `peak`, and a noisy copy: Gaussian approximation of Poisson noise plus
/// read noise of 2 — bench_n2v.py's pair in miniature. Each plane's nuclei are drawn in turn,
/// then the noise in raster order, all from one `SplitMix64` of `seed`.
pub fn noisy_stack(depth: usize, h: usize, w: usize, seed: u64, peak: f64, pixels_per_nucleus: usize) -> (Array3<f32>, Array3<f32>) {
    let mut rng = SplitMix64::new(seed);
    let n = (h * w / pixels_per_nucleus).max(1);
    let blobs: Vec<Vec<(f64, f64, f64, f64)>> = (0..depth)
        .map(|_| {
            (0..n)
                .map(|_| (rng.next_f64() * h as f64, rng.next_f64() * w as f64, 2.0 + 4.0 * rng.next_f64(), 0.5 + rng.next_f64()))
                .collect()
        })
        .collect();
    let clean = Array3::from_shape_fn((depth, h, w), |(z, y, x)| {
        let v: f64 =
            blobs[z].iter().map(|&(by, bx, s, a)| a * (-((y as f64 - by).powi(2) + (x as f64 - bx).powi(2)) / (2.0 * s * s)).exp()).sum();
        ((0.15 + v.min(1.5)) / 1.65 * peak) as f32
    });
    let mut gauss = || {
        let (u, v) = (rng.next_f64().max(1e-12), rng.next_f64());
        (-2.0 * u.ln()).sqrt() * (2.0 * std::f64::consts::PI * v).cos()
    };
    let noisy = clean.mapv(|c| (c as f64 + (c as f64).sqrt() * gauss() + 2.0 * gauss()) as f32);
    (clean, noisy)
}

/// One plane of [`noisy_stack`]: (clean, noisy).
pub fn noisy_plane(h: usize, w: usize, seed: u64, peak: f64, pixels_per_nucleus: usize) -> (ndarray::Array2<f32>, ndarray::Array2<f32>) {
    let (clean, noisy) = noisy_stack(1, h, w, seed, peak, pixels_per_nucleus);
    (clean.index_axis_move(Axis(0), 0), noisy.index_axis_move(Axis(0), 0))
}
