//! Focus stacking against scipy.ndimage (gaussian_filter + laplace in float64).
//!
//! Tolerances: our f32 measures agree with scipy's float64 ones to 1e-4 of the
//! stack's largest measure plus 4e-6 of the largest |pixel| (f32 rounding of the
//! blurred values, amplified by the Laplacian's cancellation); the chosen plane's
//! reference measure is within that (plus 1e-4 of the pixel's best) of the
//! reference maximum — i.e. we pick the reference's plane or one whose
//! measure ties it to rounding. The `log` image is an exact gather.

use crate::common;

use common::{blobs_stack, random_stack, values, Oracle};
use hcsflow_core::{DType, Stack};
use hcsflow_ops::focus::{focus_measure, focus_stack, FocusMethod};
use ndarray::{Array3, ArrayD};
use serde_json::json;

/// A defocus-like stack: plane z of a blob image blurred by |z - zf(x)| (zf varies across x).
fn defocus_stack(dtype: DType, n: usize, h: usize, w: usize, seed: u64) -> Stack {
    let top = if dtype == DType::U8 { 250.0 } else { 50000.0 };
    let (base, _) = blobs_stack(DType::F32, [1, h, w], (h * w / 150).max(3), 1.0, 0.02, seed);
    let Stack::F32(b) = base else { unreachable!() };
    let mut out = Array3::<f32>::zeros((n, h, w));
    for z in 0..n {
        for y in 0..h {
            for x in 0..w {
                let zf = (x * n) as f32 / w as f32;
                let s = ((z as f32 - zf).abs() * 0.7).min(3.0);
                // cheap blur: average with neighbours weighted by s
                let wgt = s / (1.0 + s);
                let yy = (y + 1).min(h - 1);
                let xx = (x + 1).min(w - 1);
                let v = (1.0 - wgt) * b[[0, y, x]] + wgt * 0.5 * (b[[0, yy, x]] + b[[0, y, xx]]);
                out[[z, y, x]] = v * top;
            }
        }
    }
    Stack::from_f32_array(out, dtype)
}

fn check_depth(reference: &ArrayD<f64>, depth: &[u16], n: usize, hw: usize, atol: f64, what: &str) {
    let gmax = reference.iter().cloned().fold(0.0, f64::max);
    let r = reference.as_slice().unwrap();
    for p in 0..hw {
        let best = (0..n).map(|z| r[z * hw + p]).fold(f64::NEG_INFINITY, f64::max);
        let ours = r[depth[p] as usize * hw + p];
        assert!(
            best - ours <= 1e-4 * best + 1e-5 * gmax + atol,
            "{what}: pixel {p}: plane {} has ref measure {ours}, best {best}",
            depth[p]
        );
    }
}

#[test]
fn focus_measure_and_choice_match_scipy() {
    let Some(mut oracle) = Oracle::tophat_focus_count() else { return };
    let mut cases: Vec<(Stack, f64)> = Vec::new();
    for (i, dtype) in DType::ALL.into_iter().enumerate() {
        cases.push((defocus_stack(dtype, 7, 45, 61, 50 + i as u64), 1.0));
        cases.push((random_stack(dtype, [3, 17, 23], 60 + i as u64), 2.0));
    }
    cases.push((defocus_stack(DType::U16, 1, 20, 31, 70), 1.0)); // one plane
    cases.push((defocus_stack(DType::U16, 4, 9, 7, 71), 6.0)); // kernel wider than the image
    cases.push((defocus_stack(DType::U16, 5, 33, 1, 72), 1.5)); // single column
    let log_jobs: Vec<usize> = cases.iter().map(|(s, sg)| oracle.add("focus_measure_log", &[s], json!({"sigma": sg}))).collect();
    let w_jobs: Vec<usize> = cases.iter().map(|(s, sg)| oracle.add("focus_weights", &[s], json!({"sigma": sg}))).collect();
    let refs = oracle.run();
    for (k, (s, sigma)) in cases.iter().enumerate() {
        let [n, h, w] = s.shape();
        let what = format!("{} {:?} sigma={sigma}", s.dtype(), s.shape());
        for (method, j) in [(FocusMethod::Log, log_jobs[k]), (FocusMethod::Weighted, w_jobs[k])] {
            let reference = &refs[j];
            let ours = focus_measure(s, *sigma, method).unwrap();
            let scale = reference.iter().cloned().fold(0.0, f64::max).max(1e-3);
            let atol = 4e-6 * values(s).iter().fold(0.0f64, |m, v| m.max(v.abs()));
            for (a, b) in ours.iter().zip(reference.iter()) {
                assert!((*a as f64 - b).abs() <= 1e-4 * scale + atol, "{what} {method:?}: measure {a} vs {b}");
            }
            let res = focus_stack(s, *sigma, method).unwrap();
            assert_eq!(res.image.shape(), [1, h, w]);
            check_depth(reference, &res.depth.index, n, h * w, atol, &format!("{what} {method:?}"));
            let px = values(s);
            match method {
                FocusMethod::Log => {
                    assert_eq!(res.image.dtype(), s.dtype());
                    let img = values(&res.image);
                    for p in 0..h * w {
                        assert_eq!(img[p], px[res.depth.index[p] as usize * h * w + p], "{what}: gather");
                    }
                }
                FocusMethod::Weighted => {
                    assert_eq!(res.image.dtype(), DType::F32);
                    let r = reference.as_slice().unwrap();
                    let img = values(&res.image);
                    for p in 0..h * w {
                        let (mut num, mut den, mut sum) = (0.0, 0.0, 0.0);
                        for z in 0..n {
                            num += r[z * h * w + p] * px[z * h * w + p];
                            den += r[z * h * w + p];
                            sum += px[z * h * w + p];
                        }
                        let want = if den > 0.0 { num / den } else { sum / n as f64 };
                        let range = px.iter().cloned().fold(0.0, |m: f64, v| m.max(v.abs())).max(1.0);
                        assert!((img[p] - want).abs() <= 2e-3 * range, "{what}: weighted pixel {p}: {} vs {want}", img[p]);
                    }
                }
            }
        }
    }
}

#[test]
fn constant_and_one_plane_stacks() {
    let c = Stack::from(Array3::<u16>::from_elem((4, 10, 13), 1234));
    let r = focus_stack(&c, 1.0, FocusMethod::Log).unwrap();
    assert!(r.depth.index.iter().all(|&d| d == 0));
    assert_eq!(r.image, Stack::from(Array3::<u16>::from_elem((1, 10, 13), 1234)));
    let r = focus_stack(&c, 1.0, FocusMethod::Weighted).unwrap();
    assert_eq!(r.image, Stack::from(Array3::<f32>::from_elem((1, 10, 13), 1234.0)));
    let one = random_stack(DType::U8, [1, 9, 8], 3);
    let r = focus_stack(&one, 2.0, FocusMethod::Log).unwrap();
    assert_eq!(r.image, one);
    assert_eq!(r.depth.to_stack().unwrap(), Stack::from(Array3::<u16>::zeros((1, 9, 8))));
}

#[test]
fn picks_the_sharp_plane() {
    // Plane 2 holds the sharp blobs; the others are flat.
    let (sharp, _) = blobs_stack(DType::U16, [1, 40, 40], 10, 30000.0, 0.0, 5);
    let Stack::U16(s) = sharp else { unreachable!() };
    let mut a = Array3::<u16>::from_elem((5, 40, 40), 1500);
    a.index_axis_mut(ndarray::Axis(0), 2).assign(&s.view().index_axis(ndarray::Axis(0), 0));
    let r = focus_stack(&Stack::from(a), 1.0, FocusMethod::Log).unwrap();
    let at_two = r.depth.index.iter().filter(|&&d| d == 2).count();
    assert!(at_two > 40 * 40 * 9 / 10, "{at_two}");
}

#[test]
fn rejects_bad_arguments() {
    let s = random_stack(DType::U16, [2, 8, 8], 1);
    assert!(focus_stack(&Stack::zeros(DType::U16, [0, 8, 8]), 1.0, FocusMethod::Log).is_err());
    assert!(focus_stack(&s, 0.0, FocusMethod::Log).is_err());
    assert!(focus_stack(&s, f64::NAN, FocusMethod::Weighted).is_err());
    let mut reg = hcsflow_core::Registry::new();
    hcsflow_ops::register(&mut reg);
    let f = reg.get("focus_stack").unwrap();
    assert_eq!(f.spec.contract, hcsflow_core::Contract::VolumetricToSlice);
    assert!(f.parse_args(&["method=sharpest".into()]).is_err());
}

#[test]
fn row_blocks_equal_whole_plane_blur() {
    // focus_stack blurs row slabs; focus_measure blurs whole planes: the argmax must
    // agree exactly (several row blocks, kernels from 1 to beyond the block size).
    for (sigma, h) in [(1.0, 200usize), (3.0, 150), (20.0, 140)] {
        for method in [FocusMethod::Log, FocusMethod::Weighted] {
            let s = defocus_stack(DType::U16, 4, h, 37, 99);
            let m = focus_measure(&s, sigma, method).unwrap();
            let r = focus_stack(&s, sigma, method).unwrap();
            for y in 0..h {
                for x in 0..37 {
                    let mut best = 0;
                    for z in 1..4 {
                        if m[[z, y, x]] > m[[best, y, x]] {
                            best = z;
                        }
                    }
                    assert_eq!(r.depth.index[y * 37 + x] as usize, best, "sigma {sigma} {method:?} ({y}, {x})");
                }
            }
        }
    }
}
