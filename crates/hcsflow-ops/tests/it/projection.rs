//! Projections against numpy (max/min/sum exact, mean/std within f32 rounding).

use crate::common;

use common::{assert_close, assert_exact, random_stack, Oracle};
use hcsflow_core::{DType, Stack};
use hcsflow_ops::projection::{max_projection, mean_projection, min_projection, std_projection, sum_projection};
use serde_json::json;

// 1-plane, odd sizes, a 30-plane stack, and a constant stack.
fn inputs() -> Vec<(String, Stack)> {
    let mut v = Vec::new();
    for dtype in DType::ALL {
        for (i, shape) in [[1, 5, 7], [3, 17, 33], [30, 32, 31]].into_iter().enumerate() {
            v.push((format!("{dtype} {shape:?}"), random_stack(dtype, shape, 10 + i as u64)));
        }
        let c = Stack::from_f32_array(ndarray::Array3::from_elem((4, 6, 5), 200.0), dtype);
        v.push((format!("{dtype} constant"), c));
    }
    v
}

#[test]
fn projections_match_numpy() {
    let Some(mut oracle) = Oracle::new() else { return };
    let inputs = inputs();
    let ops = ["max", "min", "sum", "mean", "std"];
    let mut jobs = Vec::new();
    for (name, s) in &inputs {
        for op in ops {
            jobs.push((name, s, op, oracle.add(op, &[s], json!({}))));
        }
    }
    let refs = oracle.run();
    for (name, s, op, j) in jobs {
        let what = format!("{op}_projection {name}");
        let r = &refs[j];
        match op {
            "max" => {
                let out = max_projection(s).unwrap();
                assert_eq!(out.dtype(), s.dtype());
                assert_exact(&out, r, &what);
            }
            "min" => {
                let out = min_projection(s).unwrap();
                assert_eq!(out.dtype(), s.dtype());
                assert_exact(&out, r, &what);
            }
            // Integer sums are exact in f32 below 2^24; f32 sums differ from
            // numpy's float64 by f32 rounding of each partial sum.
            "sum" => {
                let out = sum_projection(s).unwrap();
                if s.dtype() == DType::F32 {
                    assert_close(&out, r, 1e-3, 1e-6, &what);
                } else {
                    assert_exact(&out, r, &what);
                }
            }
            "mean" => assert_close(&mean_projection(s).unwrap(), r, 1e-4, 1e-6, &what),
            "std" => assert_close(&std_projection(s).unwrap(), r, 1e-3, 1e-5, &what),
            _ => unreachable!(),
        }
    }
}

#[test]
fn constant_stack_has_zero_std_and_empty_stack_is_an_error() {
    let c = Stack::from_f32_array(ndarray::Array3::from_elem((7, 3, 3), 12345.0), DType::U16);
    let Stack::F32(sd) = std_projection(&c).unwrap() else { panic!() };
    assert!(sd.pixels().iter().all(|&v| v == 0.0));
    let e = Stack::zeros(DType::U16, [0, 4, 4]);
    for f in [max_projection, min_projection, sum_projection, std_projection, mean_projection] {
        let err = f(&e).unwrap_err().to_string();
        assert!(err.ends_with("the stack has no planes"), "{err}");
    }
}
