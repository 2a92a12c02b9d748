//! Filters against scipy.ndimage / scikit-image on the pixel values as float64:
//! Gaussian, unsharp and Sobel within 2e-5 × max|input| (f32 arithmetic with
//! f32 weights), median exact (every path: fused 3×3, comparator network up to 9×9, per-pixel selection above).

use crate::common;

use common::{assert_close, assert_exact, cells_stack, random_stack, Oracle};
use hcsflow_core::{DType, Stack};
use hcsflow_ops::filters::{gaussian_blur, median_filter, sobel, unsharp_mask, MedianNetwork};
use ndarray::Array3;
use serde_json::json;

fn inputs() -> Vec<(String, Stack)> {
    let mut v = Vec::new();
    for dtype in DType::ALL {
        v.push((format!("{dtype} cells 2x64x61"), cells_stack(dtype, [2, 64, 61], 1)));
        v.push((format!("{dtype} random 1x17x9"), random_stack(dtype, [1, 17, 9], 2)));
    }
    v.push(("u16 1x1".into(), random_stack(DType::U16, [1, 1, 1], 3)));
    v.push(("u16 1x5 row".into(), random_stack(DType::U16, [1, 1, 5], 4)));
    v.push(("u16 constant".into(), Stack::from_f32_array(Array3::from_elem((1, 6, 7), 1234.0), DType::U16)));
    v
}

/// Tolerance scale: the largest |value| of the input (at least 1); f32 weights
/// and sums carry relative errors of a few 1e-7 of the values summed.
fn range_of(s: &Stack) -> f64 {
    s.to_f32().iter().fold(1.0f64, |m, &v| m.max(v.abs() as f64))
}

#[test]
fn gaussian_and_unsharp_match_scipy_skimage() {
    let Some(mut oracle) = Oracle::new() else { return };
    // (σy, σx, truncate): small, anisotropic, zero on one axis, larger than the image.
    let sigmas = [(1.0, 1.0, 4.0), (2.0, 0.5, 4.0), (0.0, 3.0, 4.0), (40.0, 40.0, 4.0), (1.5, 1.5, 2.0)];
    let unsharp = [(1.0, 1.0), (2.0, 0.5), (0.5, 3.0), (30.0, 1.0)];
    let mut jobs = Vec::new();
    for (name, s) in inputs() {
        for &(sy, sx, t) in &sigmas {
            let j = oracle.add("gaussian", &[&s], json!({"sigma_y": sy, "sigma_x": sx, "truncate": t}));
            jobs.push((format!("gaussian {sy},{sx},{t} {name}"), gaussian_blur(&s, sy, sx, t), range_of(&s), j));
        }
        for &(r, a) in &unsharp {
            let j = oracle.add("unsharp", &[&s], json!({"radius": r, "amount": a}));
            jobs.push((format!("unsharp {r},{a} {name}"), unsharp_mask(&s, r, a), range_of(&s) * (1.0 + 2.0 * a), j));
        }
        let j = oracle.add("sobel", &[&s], json!({}));
        jobs.push((format!("sobel {name}"), sobel(&s), range_of(&s), j));
    }
    let refs = oracle.run();
    for (what, ours, range, j) in jobs {
        assert_eq!(ours.dtype(), DType::F32);
        assert_close(&ours, &refs[j], 2e-5 * range, 0.0, &what);
    }
}

/// [`MedianNetwork`] applied plane by plane, whatever path `median_filter` takes.
fn network_median(s: &Stack, k: usize) -> Stack {
    let net = MedianNetwork::new(k);
    let [n, h, w] = s.shape();
    match s {
        Stack::U8(a) => Stack::from(
            Array3::from_shape_vec((n, h, w), a.view().outer_iter().flat_map(|p| net.apply(p.as_slice().unwrap(), h, w)).collect())
                .unwrap(),
        ),
        Stack::U16(a) => Stack::from(
            Array3::from_shape_vec((n, h, w), a.view().outer_iter().flat_map(|p| net.apply(p.as_slice().unwrap(), h, w)).collect())
                .unwrap(),
        ),
        Stack::F32(a) => Stack::from(
            Array3::from_shape_vec((n, h, w), a.view().outer_iter().flat_map(|p| net.apply(p.as_slice().unwrap(), h, w)).collect())
                .unwrap(),
        ),
    }
}

#[test]
fn median_matches_scipy_exactly() {
    let Some(mut oracle) = Oracle::new() else { return };
    let mut jobs = Vec::new();
    for (name, s) in inputs() {
        for size in [1usize, 3, 5, 7, 9, 11] {
            let j = oracle.add("median", &[&s], json!({"size": size}));
            jobs.push((format!("median {size} {name}"), s.clone(), median_filter(&s, size).unwrap(), j));
            if size == 3 {
                // median_filter fuses 3×3 by hand; the generic network must agree too.
                jobs.push((format!("median network 3 {name}"), s.clone(), network_median(&s, 3), j));
            }
        }
    }
    let refs = oracle.run();
    for (what, s, ours, j) in jobs {
        assert_eq!(ours.dtype(), s.dtype(), "{what}");
        assert_exact(&ours, &refs[j], &what);
    }
    let err = median_filter(&random_stack(DType::U8, [1, 4, 4], 1), 4).unwrap_err().to_string();
    assert_eq!(err, "median_filter: size must be odd, got 4");
}
