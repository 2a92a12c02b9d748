//! Whole-stack histogram equalisation against skimage.exposure.equalize_hist
//! (on the whole stack): integers exact after scaling to the dtype range,
//! f32 within 1 ulp.

use crate::common;

use common::{assert_close, assert_exact, cells_stack, random_stack, Oracle};
use hcsflow_core::{DType, Stack};
use hcsflow_ops::equalize::stack_equalize_histogram;
use ndarray::Array3;
use serde_json::json;

#[test]
fn equalisation_matches_skimage() {
    let Some(mut oracle) = Oracle::new() else { return };
    let mut cases = Vec::new();
    for dtype in DType::ALL {
        cases.push((format!("{dtype} random"), random_stack(dtype, [3, 17, 33], 1), 256));
        cases.push((format!("{dtype} cells"), cells_stack(dtype, [2, 64, 61], 2), 256));
        cases.push((format!("{dtype} 1 pixel"), random_stack(dtype, [1, 1, 1], 3), 256));
        cases.push((format!("{dtype} constant"), Stack::from_f32_array(Array3::from_elem((2, 5, 5), 77.0), dtype), 256));
    }
    cases.push(("f32 cells 1000 bins".into(), cells_stack(DType::F32, [2, 64, 61], 4), 1000));
    cases.push(("f32 cells 3 bins".into(), cells_stack(DType::F32, [2, 64, 61], 5), 3));
    cases.push(("f32 cells 1 bin".into(), cells_stack(DType::F32, [1, 16, 16], 6), 1));
    let jobs: Vec<_> = cases
        .into_iter()
        .map(|(name, s, nbins)| {
            let j = oracle.add("equalize_hist", &[&s], json!({"nbins": nbins}));
            (name, s, nbins, j)
        })
        .collect();
    let refs = oracle.run();
    for (name, s, nbins, j) in jobs {
        let out = stack_equalize_histogram(&s, nbins).unwrap();
        assert_eq!(out.dtype(), s.dtype(), "{name}");
        match s.dtype().integer_range() {
            Some((_, max)) => {
                let expected = refs[j].mapv(|v| (v * max as f64).round_ties_even());
                assert_exact(&out, &expected, &name);
            }
            None => assert_close(&out, &refs[j], 1e-7, 1.2e-7, &name),
        }
    }
}

#[test]
fn non_finite_and_empty_input_are_errors() {
    let mut a = Array3::from_elem((1, 2, 2), 1.0f32);
    a[[0, 0, 0]] = f32::INFINITY;
    let err = stack_equalize_histogram(&Stack::from(a), 256).unwrap_err().to_string();
    assert_eq!(err, "stack_equalize_histogram: the value range [1, inf] is not finite");
    let err = stack_equalize_histogram(&Stack::zeros(DType::U16, [0, 3, 3]), 256).unwrap_err().to_string();
    assert!(err.contains("no pixels"), "{err}");
}
