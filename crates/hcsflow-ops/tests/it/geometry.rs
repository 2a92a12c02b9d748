//! Binning and crop against numpy (reshape-mean/sum, slicing), composite and
//! apply-mask against numpy tensordot / where.

use crate::common;

use common::{assert_close, assert_exact, random_stack, Oracle};
use hcsflow_core::{ArgValue, Array, ConversionPolicy, Conversions, DType, Device, MemoryType, Registry, Stack};
use hcsflow_ops::composite::{apply_mask, composite};
use hcsflow_ops::geometry::{bin, crop};
use serde_json::json;

fn max_abs(s: &Stack) -> f64 {
    s.to_f32().iter().fold(1.0f64, |m, &v| m.max(v.abs() as f64))
}

#[test]
fn binning_crop_composite_mask_match_numpy() {
    let Some(mut oracle) = Oracle::new() else { return };
    let mut jobs = Vec::new();
    for dtype in DType::ALL {
        for (i, shape) in [[1, 1, 1], [3, 17, 33], [2, 64, 61]].into_iter().enumerate() {
            let s = random_stack(dtype, shape, 20 + i as u64);
            let what = format!("{dtype} {shape:?}");
            for k in [1usize, 2, 3, 4] {
                if k > shape[1] || k > shape[2] {
                    continue;
                }
                for mode in ["mean", "sum"] {
                    let j = oracle.add("bin", &[&s], json!({"factor": k, "mode": mode}));
                    jobs.push((format!("bin {k} {mode} {what}"), bin(&s, k, mode == "mean").unwrap(), j, 1e-6));
                }
            }
            let (y, x) = (shape[1] / 3, shape[2] / 4);
            let (hh, ww) = (shape[1] - y, (shape[2] - x).min(5));
            let j = oracle.add("crop", &[&s], json!({"y": y, "x": x, "height": hh, "width": ww}));
            jobs.push((format!("crop {what}"), crop(&s, y, x, hh, ww).unwrap(), j, 0.0));
            let weights: Vec<f64> = (0..shape[0]).map(|i| 0.5 + i as f64 * 0.25).collect();
            for w in [Vec::new(), weights] {
                let j = oracle.add("composite", &[&s], json!({"weights": w}));
                // f32 sums of weighted terms: error relative to the inputs' magnitude.
                jobs.push((format!("composite {w:?} {what}"), composite(&s, &w).unwrap(), j, -1e-6 * max_abs(&s)));
            }
            if shape[0] >= 2 {
                let mut m = s.clone();
                if let Stack::U8(a) = &mut m {
                    a.plane_mut(1).iter_mut().for_each(|v| *v %= 2)
                }
                if let Stack::U16(a) = &mut m {
                    a.plane_mut(1).iter_mut().for_each(|v| *v %= 2)
                }
                if let Stack::F32(a) = &mut m {
                    a.plane_mut(1).iter_mut().for_each(|v| *v = if *v > 0.0 { 1.0 } else { 0.0 })
                }
                let j = oracle.add("apply_mask", &[&m], json!({"mask_index": 1, "fill": 7.0}));
                jobs.push((format!("apply_mask {what}"), apply_mask(&m, 1, 7.0).unwrap(), j, 0.0));
            }
        }
    }
    let refs = oracle.run();
    // tol 0: exact; > 0: relative; < 0: absolute |tol|.
    for (what, ours, j, tol) in jobs {
        if tol == 0.0 {
            assert_exact(&ours, &refs[j], &what);
        } else if tol > 0.0 {
            assert_close(&ours, &refs[j], 1e-6, tol, &what);
        } else {
            assert_close(&ours, &refs[j], -tol, 0.0, &what);
        }
    }
}

#[test]
fn geometry_and_composite_errors_are_specific() {
    let s = random_stack(DType::U16, [3, 8, 8], 1);
    assert_eq!(bin(&s, 9, true).unwrap_err().to_string(), "bin: factor 9 is larger than the 8x8 plane");
    assert_eq!(
        crop(&s, 4, 4, 5, 1).unwrap_err().to_string(),
        "crop: the rectangle y=4, x=4, height=5, width=1 does not fit inside the 8x8 plane"
    );
    assert_eq!(crop(&s, 2, 3, 0, 0).unwrap().shape(), [3, 6, 5]);
    assert_eq!(composite(&s, &[1.0, 2.0]).unwrap_err().to_string(), "composite: 2 weights given for a stack of 3 planes");
    assert_eq!(composite(&s, &[0.0, 0.0, 0.0]).unwrap_err().to_string(), "composite: the weights sum to 0");
    assert!(apply_mask(&s, 3, 0.0).unwrap_err().to_string().contains("mask_index 3 is not a plane"));
    assert_eq!(apply_mask(&s, -1, 0.0).unwrap().shape(), [2, 8, 8]);
}

#[test]
fn weights_argument_parses_and_validates() {
    let mut r = Registry::new();
    hcsflow_ops::register(&mut r);
    let f = r.get("composite").unwrap();
    let texts = |v: &[&str]| v.iter().map(|s| s.to_string()).collect::<Vec<_>>();
    let a = f.parse_args(&texts(&["weights=0.5, 0.3,0.2"])).unwrap();
    assert_eq!(a.get("weights"), Some(&ArgValue::FloatList(vec![0.5, 0.3, 0.2])));
    assert_eq!(f.parse_args(&texts(&["weights=[1,2]"])).unwrap().get("weights"), Some(&ArgValue::FloatList(vec![1.0, 2.0])));
    assert_eq!(
        f.parse_args(&texts(&["weights=1,x"])).unwrap_err().to_string(),
        "composite: argument 'weights' expects a comma-separated list of numbers, got '1,x'"
    );
    assert_eq!(
        f.parse_args(&texts(&["weights=1,-2"])).unwrap_err().to_string(),
        "composite: argument 'weights' = [1, -2] (element -2) is out of range: must be every element >= 0"
    );
    // Through the registry: 3 planes, N → 1.
    let s = random_stack(DType::U16, [3, 4, 5], 2);
    let conv = Conversions::default();
    let plan = r.plan_call("composite", a, MemoryType::Host, Device::Cpu, &conv, ConversionPolicy::default()).unwrap();
    let out = r.execute(&plan, Array::from(s), &conv).unwrap().into_host_stack().unwrap();
    assert_eq!(out.shape(), [1, 4, 5]);
}
