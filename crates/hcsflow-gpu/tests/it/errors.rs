//! Errors of GPU kernels keep their kind: a caller tells a buffer over the
//! device's limit from a bad input without reading the message.

use crate::common;

use hcsflow_core::{Array, ConversionPolicy, Conversions, FunctionError, MemoryType, Registry, Stack};
use hcsflow_gpu::{GpuContext, GpuError};
use ndarray::Array3;

#[test]
fn a_working_buffer_over_the_binding_limit_is_a_too_large_error() {
    let Some(device) = common::gpu() else { return };
    let limit = GpuContext::get(device).unwrap().max_binding_bytes();
    // Per-plane percentiles of u16 keep one 65,536-bin histogram (256 KiB)
    // per plane on the device: one plane more than the limit holds. The
    // planes themselves are tiny (two pixels), so nothing large is allocated.
    let planes = (limit / (65_536 * 4) + 1) as usize;
    let stack = Stack::from(Array3::<u16>::from_shape_fn((planes, 1, 2), |(z, _, x)| (z + x) as u16));
    let mut registry = Registry::new();
    let mut conversions = Conversions::default();
    hcsflow_ops::register(&mut registry);
    hcsflow_gpu::register(&mut registry, &mut conversions);
    let args = registry.get("percentile_normalize").unwrap().validate_args(vec![]).unwrap();
    let plan =
        registry.plan_call("percentile_normalize", args, MemoryType::Host, device, &conversions, ConversionPolicy::default()).unwrap();
    let e = registry.execute(&plan, Array::from(stack), &conversions).unwrap_err();
    let FunctionError::TooLarge { function, source } = &e else { panic!("expected TooLarge, got {e:?}") };
    assert_eq!(function, "percentile_normalize");
    match source.downcast_ref::<GpuError>() {
        Some(GpuError::TooLarge { bytes, limit: l, .. }) => {
            assert_eq!(*l, limit);
            assert_eq!(*bytes, planes as u64 * 65_536 * 4);
        }
        other => panic!("expected GpuError::TooLarge as the source, got {other:?}"),
    }
    assert!(e.to_string().starts_with("percentile_normalize: "), "{e}");
    assert!(e.to_string().contains("bytes per binding"), "{e}");
}

#[test]
fn an_empty_stack_is_an_invalid_input() {
    let Some(device) = common::gpu() else { return };
    let mut registry = Registry::new();
    let mut conversions = Conversions::default();
    hcsflow_ops::register(&mut registry);
    hcsflow_gpu::register(&mut registry, &mut conversions);
    let args = registry.get("stack_percentile_normalize").unwrap().validate_args(vec![]).unwrap();
    let plan = registry
        .plan_call("stack_percentile_normalize", args, MemoryType::Host, device, &conversions, ConversionPolicy::default())
        .unwrap();
    let e = registry.execute(&plan, Array::from(Stack::from(Array3::<f32>::zeros((1, 0, 4)))), &conversions).unwrap_err();
    assert!(matches!(&e, FunctionError::InvalidInput { function, .. } if function == "stack_percentile_normalize"), "{e:?}");
}
