//! `image_quality` against numpy/scipy in float64 (tests/oracle/ops_oracle.py):
//! mean, std, min, max exactly up to f64 summation order; the variance of
//! scipy.ndimage's Laplacian of the plane over its mean, on the interior, to
//! 1e-9 relative; the saturated and zero percentages exactly. Through the
//! registry: the table's rows are the planes and the stack passes unchanged.

use crate::common;

use common::{cells_stack, random_stack, run_registered, Oracle};
use hcsflow_core::artifact::CallContext;
use hcsflow_core::{Array, ConversionPolicy, Conversions, DType, Device, MemoryType, Registry, Stack, StackArray};
use hcsflow_ops::quality::{quality_table, saturation_level, QUALITY_COLUMNS, QUALITY_TABLE};
use serde_json::json;

/// A u16 stack whose planes hold saturated pixels, zeros, a flat plane and a
/// blurred copy of a sharp one (the focus measure must drop).
fn edge_cases() -> Stack {
    let (h, w) = (24, 30);
    let sharp: Vec<u16> = (0..h * w).map(|i| if (i / w + i % w) % 2 == 0 { 4000 } else { 1000 }).collect();
    let blurred: Vec<u16> = (0..h * w)
        .map(|i| {
            let (y, x) = (i / w, i % w);
            let at = |y: usize, x: usize| f64::from(sharp[y.min(h - 1) * w + x.min(w - 1)]);
            ((at(y, x) + at(y + 1, x) + at(y, x + 1) + at(y + 1, x + 1)) / 4.0) as u16
        })
        .collect();
    let clipped: Vec<u16> = (0..h * w).map(|i| [0, 65535, 300, 65535, 12][i % 5]).collect();
    let flat = vec![500u16; h * w];
    let zeros = vec![0u16; h * w];
    let planes = [sharp, blurred, clipped, flat, zeros].concat();
    Stack::from(StackArray::from_vec([5, h, w], planes).unwrap())
}

#[test]
fn quality_matches_numpy_and_scipy() {
    let Some(mut oracle) = Oracle::new() else { return };
    let mut cases = vec![edge_cases(), cells_stack(DType::U16, [3, 40, 52], 7)];
    for (i, dtype) in DType::ALL.into_iter().enumerate() {
        cases.push(random_stack(dtype, [2, 17, 23], 30 + i as u64));
    }
    cases.push(random_stack(DType::U8, [1, 2, 9], 3)); // too small for a Laplacian: focus 0
    let jobs: Vec<usize> =
        cases.iter().map(|s| oracle.add("image_quality", &[s], json!({ "saturation": saturation_level(s.dtype()) }))).collect();
    let results = oracle.run();
    for (k, (stack, job)) in cases.iter().zip(jobs).enumerate() {
        let table = quality_table(stack).unwrap();
        let want = &results[job];
        assert_eq!(want.shape(), [stack.depth(), QUALITY_COLUMNS.len()], "case {k}");
        for z in 0..stack.depth() {
            for (c, column) in QUALITY_COLUMNS.iter().enumerate() {
                let ours = table.plane_value(z, column).unwrap();
                let theirs = want[[z, c]];
                let tolerance = 1e-9 * theirs.abs().max(1.0);
                assert!(
                    (ours - theirs).abs() <= tolerance,
                    "case {k} ({:?}) plane {z} {column}: ours {ours}, numpy {theirs}",
                    stack.dtype()
                );
            }
        }
    }
    // The measures say what they are for: saturation and zeros counted, blur lowers the focus measure.
    let t = quality_table(&cases[0]).unwrap();
    let v = |z: usize, c: &str| t.plane_value(z, &format!("ImageQuality_{c}")).unwrap();
    assert!(v(1, "LaplacianVariance") < 0.5 * v(0, "LaplacianVariance"), "blur must lower the focus measure");
    assert_eq!((v(2, "PercentSaturated"), v(2, "PercentZero")), (40.0, 20.0));
    assert_eq!((v(3, "LaplacianVariance"), v(3, "StdIntensity")), (0.0, 0.0));
    assert_eq!((v(4, "LaplacianVariance"), v(4, "PercentZero")), (0.0, 100.0));
}

#[test]
fn the_registered_function_produces_one_row_per_plane_and_passes_the_stack_through() {
    let stack = cells_stack(DType::U16, [4, 20, 25], 11);
    let out = run_registered("image_quality", &[], &stack);
    assert_eq!(out, stack, "image_quality returns its input unchanged");

    let mut registry = Registry::new();
    hcsflow_ops::register(&mut registry);
    let function = registry.get("image_quality").unwrap();
    let args = function.validate_args(vec![]).unwrap();
    let conversions = Conversions::default();
    let plan = registry.plan_call("image_quality", args, MemoryType::Host, Device::Cpu, &conversions, ConversionPolicy::default()).unwrap();
    let mut ctx = CallContext::default();
    registry.execute_in(&plan, Array::from(stack.clone()), &conversions, &mut ctx).unwrap();
    let (tables, _) = ctx.take_results();
    let (name, table) = &tables[0];
    assert_eq!(name, QUALITY_TABLE);
    assert_eq!(*table, quality_table(&stack).unwrap());
    assert_eq!((0..4).filter(|&z| table.plane_value(z, "ImageQuality_MeanIntensity").is_some()).count(), 4);
}
