//! White top-hat against scikit-image (exact), and the fast variant against
//! its documented definition computed by numpy/skimage in float64 (≤ 1 DN for
//! integers: f32 vs f64 bilinear weights can move a value across a rounding tie).

use crate::common;

use common::{random_stack, values, Oracle};
use hcsflow_core::{DType, Stack};
use hcsflow_ops::tophat::{tophat, white_tophat};
use ndarray::Array3;
use serde_json::json;

#[test]
fn white_tophat_equals_skimage_exactly() {
    let Some(mut oracle) = Oracle::tophat_focus_count() else { return };
    let mut cases: Vec<(Stack, usize)> = Vec::new();
    for (i, dtype) in DType::ALL.into_iter().enumerate() {
        cases.push((random_stack(dtype, [2, 37, 53], 10 + i as u64), 3));
        cases.push((random_stack(dtype, [1, 64, 61], 20 + i as u64), 15));
        cases.push((common::blobs_stack(dtype, [1, 96, 80], 12, 200.0, 0.1, 30 + i as u64).0, 7));
    }
    // Edge cases: 1×1, single row/column, radius larger than the image, radius 0, constant.
    cases.push((random_stack(DType::U16, [1, 1, 1], 1), 5));
    cases.push((random_stack(DType::U16, [1, 1, 40], 2), 4));
    cases.push((random_stack(DType::U8, [1, 33, 1], 3), 4));
    cases.push((random_stack(DType::U16, [1, 21, 17], 4), 100));
    cases.push((random_stack(DType::U16, [1, 21, 17], 5), 0));
    cases.push((Stack::from(Array3::<u16>::from_elem((1, 9, 11), 777)), 2));
    // skimage's default mode="reflect" is only valid while the disk is not much
    // larger than the image (scipy's reflect padding then returns values that are
    // not in the image); beyond that compare with mode="ignore", which is the same
    // definition (see the module docs).
    let mode = |s: &Stack, r: usize| if r > s.shape()[1].max(s.shape()[2]) { "ignore" } else { "reflect" };
    let jobs: Vec<usize> = cases.iter().map(|(s, r)| oracle.add("white_tophat", &[s], json!({"radius": r, "mode": mode(s, *r)}))).collect();
    let refs = oracle.run();
    for ((s, r), j) in cases.iter().zip(jobs) {
        let ours = white_tophat(s, *r).unwrap();
        assert_eq!(ours.dtype(), s.dtype());
        assert_eq!(ours.shape(), s.shape());
        let ours = values(&ours);
        let reference: Vec<f64> = refs[j].iter().copied().collect();
        // Exact for every dtype: for f32 the reference value is an f32 too.
        assert_eq!(ours, reference, "{} {:?} r={r}", s.dtype(), s.shape());
    }
}

#[test]
fn fast_tophat_matches_its_definition() {
    let Some(mut oracle) = Oracle::tophat_focus_count() else { return };
    let mut cases: Vec<(Stack, usize, usize)> = Vec::new();
    for (i, dtype) in DType::ALL.into_iter().enumerate() {
        let (s, _) = common::blobs_stack(dtype, [2, 101, 127], 25, if dtype == DType::U8 { 250.0 } else { 60000.0 }, 0.05, 40 + i as u64);
        cases.push((s.clone(), 50, 4));
        cases.push((s, 9, 3));
    }
    cases.push((random_stack(DType::U16, [1, 5, 6], 7), 50, 4)); // smaller than a block in places
    cases.push((random_stack(DType::U16, [1, 30, 30], 8), 3, 4)); // radius/downsample = 0
    let jobs: Vec<usize> = cases
        .iter()
        .map(|(s, r, f)| {
            let small = s.shape()[1].div_ceil(*f).max(s.shape()[2].div_ceil(*f));
            let mode = if r / f > small { "ignore" } else { "reflect" };
            oracle.add("tophat_fast", &[s], json!({"radius": r, "downsample": f, "mode": mode}))
        })
        .collect();
    let refs = oracle.run();
    for ((s, r, f), j) in cases.iter().zip(jobs) {
        let ours = tophat(s, *r, *f).unwrap();
        assert_eq!(ours.dtype(), s.dtype());
        let tol = if s.dtype() == DType::F32 { 0.05 } else { 1.0 };
        for (k, (a, b)) in values(&ours).iter().zip(refs[j].iter()).enumerate() {
            let b = match s.dtype() {
                DType::U8 => b.round().clamp(0.0, 255.0),
                DType::U16 => b.round().clamp(0.0, 65535.0),
                DType::F32 => *b,
            };
            assert!((a - b).abs() <= tol, "{} r={r} f={f} pixel {k}: ours {a} ref {b}", s.dtype());
        }
    }
}

#[test]
fn fast_tophat_with_downsample_one_is_exact() {
    let s = random_stack(DType::U16, [1, 40, 30], 9);
    assert_eq!(tophat(&s, 6, 1).unwrap(), white_tophat(&s, 6).unwrap());
}

#[test]
fn tophat_rejects_bad_input() {
    let s = random_stack(DType::F32, [1, 8, 8], 9);
    let Stack::F32(mut a) = s.clone() else { unreachable!() };
    a[[0, 3, 3]] = f32::NAN;
    assert!(white_tophat(&Stack::F32(a), 2).unwrap_err().to_string().contains("NaN"));
    assert!(white_tophat(&s, 100_000).is_err());
    assert!(tophat(&s, 5, 0).is_err());
    // Empty stacks and constant images are fine.
    assert_eq!(white_tophat(&Stack::zeros(DType::U16, [0, 4, 4]), 3).unwrap().shape(), [0, 4, 4]);
    let c = Stack::from(Array3::<u8>::from_elem((2, 5, 5), 9));
    assert_eq!(white_tophat(&c, 2).unwrap(), Stack::from(Array3::<u8>::zeros((2, 5, 5))));
}

#[test]
fn registered_with_contract_and_args() {
    let mut reg = hcsflow_core::Registry::new();
    hcsflow_ops::register(&mut reg);
    let f = reg.get("white_tophat").unwrap();
    assert_eq!(f.spec.contract, hcsflow_core::Contract::Pure2d);
    assert!(f.parse_args(&["radius=-1".into()]).is_err());
    let f = reg.get("tophat").unwrap();
    let args = <hcsflow_ops::tophat::TophatArgs as hcsflow_core::FunctionArgs>::from_args(&f.validate_args(vec![]).unwrap());
    assert_eq!((args.radius, args.downsample), (50, 4));
}
