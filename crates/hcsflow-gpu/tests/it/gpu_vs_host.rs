//! GPU (wgpu, lavapipe in CI) against the host implementations of the same
//! functions. One shared device per test process (GpuContext caches it).

use crate::common;

use common::{gpu, random_stack};

use hcsflow_core::{
    stack_slices, unstack_slices, Array, CallContext, CallError, ConversionPolicy, DType, Device, HostArray, MemoryType, RouteKind, Stack,
};
use ndarray::Array3;

/// Runs `name` through the registry on `device`, returning the host result.
fn call(name: &str, stack: &Stack, device: Device) -> Stack {
    let (registry, conversions) = common::registry();
    let f = registry.get(name).unwrap();
    let args = f.validate_args(vec![]).unwrap();
    let plan = registry.plan_call(name, args, MemoryType::Host, device, &conversions, ConversionPolicy::default()).unwrap();
    let expected_route = if device == Device::Cpu { RouteKind::Identity } else { RouteKind::DeviceCopy };
    assert_eq!(plan.route_in.kind, expected_route);
    registry.run_to_host(&plan, stack.clone(), &conversions, ConversionPolicy::default(), &mut CallContext::default()).unwrap()
}

// Odd widths exercise the per-plane word padding of packed u8/u16 storage.
const SHAPES: [[usize; 3]; 4] = [[1, 1, 1], [5, 7, 3], [4, 33, 65], [30, 64, 64]];

#[test]
fn upload_download_round_trip_is_exact() {
    let Some(dev) = gpu() else { return };
    for dtype in DType::ALL {
        for (i, shape) in SHAPES.iter().enumerate() {
            let s = random_stack(dtype, *shape, i as u64 + 1);
            let g = hcsflow_gpu::upload_stack(&s, dev).unwrap();
            let back = hcsflow_gpu::download(&g).unwrap().into_stack().unwrap();
            assert_eq!(back, s, "{dtype} {shape:?}");
        }
    }
}

#[test]
fn max_projection_gpu_is_bit_exact_with_host() {
    let Some(dev) = gpu() else { return };
    for dtype in DType::ALL {
        for (i, shape) in SHAPES.iter().enumerate() {
            let s = random_stack(dtype, *shape, 100 + i as u64);
            let host = call("max_projection", &s, Device::Cpu);
            let gpu = call("max_projection", &s, dev);
            assert_eq!(host.shape(), [1, shape[1], shape[2]]);
            assert_eq!(gpu.dtype(), dtype);
            assert_eq!(gpu, host, "{dtype} {shape:?}");
        }
    }
}

#[test]
fn mean_projection_gpu_is_bit_exact_with_host() {
    let Some(dev) = gpu() else { return };
    for dtype in DType::ALL {
        for (i, shape) in SHAPES.iter().enumerate() {
            let s = random_stack(dtype, *shape, 200 + i as u64);
            let host = call("mean_projection", &s, Device::Cpu);
            let gpu = call("mean_projection", &s, dev);
            assert_eq!(gpu.dtype(), DType::F32);
            assert_eq!(gpu, host, "{dtype} {shape:?}");
        }
    }
}

#[test]
fn stack_and_unstack_on_wgpu() {
    let Some(dev) = gpu() else { return };
    let (_, conversions) = common::registry();
    let p = ConversionPolicy::default();
    let s = random_stack(DType::U16, [3, 5, 7], 7);
    let slices = unstack_slices(Array::from(s.clone()), MemoryType::Wgpu, dev, &conversions, p).unwrap();
    assert_eq!(slices.len(), 3);
    assert!(slices.iter().all(|a| a.memory_type() == MemoryType::Wgpu && a.shape() == [5, 7]));
    let stacked = stack_slices(slices, MemoryType::Host, Device::Cpu, &conversions, p).unwrap();
    assert_eq!(stacked.into_host_stack().unwrap(), s);
    // Wrong dtype among wgpu slices is caught before any transfer.
    let a = Array::Device(std::sync::Arc::new(hcsflow_gpu::upload(&HostArray::from_2d(2, 2, vec![1u8; 4]).unwrap(), dev).unwrap()));
    let b = Array::Device(std::sync::Arc::new(hcsflow_gpu::upload(&HostArray::from_2d(2, 2, vec![1.0f32; 4]).unwrap(), dev).unwrap()));
    let err = stack_slices(vec![a, b], MemoryType::Wgpu, dev, &conversions, p).unwrap_err();
    assert!(err.to_string().contains("slice 1 has dtype f32 but slice 0 has dtype u8"), "{err}");
}

#[test]
fn gpu_function_without_gpu_implementation_is_refused() {
    // A function with only a host implementation must not silently fall back.
    let (mut registry, conversions) = common::registry();
    registry.register(
        hcsflow_core::FunctionSpec { name: "host_only", doc: "test", contract: hcsflow_core::Contract::Pure3d, args: vec![] },
        hcsflow_core::Implementation::host(|s, _, _| Ok(s.clone())),
    );
    let err = registry
        .plan_call("host_only", Default::default(), MemoryType::Host, Device::Gpu(0), &conversions, ConversionPolicy::default())
        .unwrap_err();
    assert_eq!(
        err.to_string(),
        "host_only has no implementation for gpu:0 (it has: host): host arrays live in host memory, not on gpu:0; use device cpu"
    );
}

/// Asserts every value of `gpu` is within `atol + rtol·|host|` of `host` (same dtype and shape).
fn assert_close_stacks(gpu: &Stack, host: &Stack, atol: f32, rtol: f32, what: &str) {
    assert_eq!(gpu.dtype(), host.dtype(), "{what}");
    assert_eq!(gpu.shape(), host.shape(), "{what}");
    let (g, h) = (gpu.to_f32(), host.to_f32());
    for (i, (a, b)) in g.iter().zip(h.iter()).enumerate() {
        assert!((a - b).abs() <= atol + rtol * b.abs(), "{what}: value {i}: gpu {a}, host {b}");
    }
}

#[test]
fn min_and_sum_projection_gpu_are_bit_exact_with_host() {
    let Some(dev) = gpu() else { return };
    for name in ["min_projection", "sum_projection"] {
        for dtype in DType::ALL {
            for (i, shape) in SHAPES.iter().enumerate() {
                let s = random_stack(dtype, *shape, 300 + i as u64);
                let host = call(name, &s, Device::Cpu);
                let gpu = call(name, &s, dev);
                assert_eq!(gpu, host, "{name} {dtype} {shape:?}");
            }
        }
    }
}

/// Std: same operations in the same order, but the shader compiler may fuse
/// `d += t * t` into one FMA, so agreement is to 1e-6 relative, not bits.
#[test]
fn std_projection_gpu_matches_host() {
    let Some(dev) = gpu() else { return };
    for dtype in DType::ALL {
        for (i, shape) in SHAPES.iter().enumerate() {
            let s = random_stack(dtype, *shape, 400 + i as u64);
            let host = call("std_projection", &s, Device::Cpu);
            let gpu = call("std_projection", &s, dev);
            assert_close_stacks(&gpu, &host, 1e-3, 1e-6, &format!("std {dtype} {shape:?}"));
        }
    }
}

/// Like [`call`], with `name=value` arguments.
fn call_args(name: &str, args: &[&str], stack: &Stack, device: Device) -> Stack {
    try_call_args(name, args, stack, device).unwrap()
}

/// u8/u16: same histogram, same f64 lookup table → bit-exact. f32: exact
/// percentiles, mapping in f32 → within 1e-6 of the target range.
#[test]
fn percentile_normalize_gpu_matches_host() {
    let Some(dev) = gpu() else { return };
    let settings: [&[&str]; 2] = [&[], &["low_percentile=10", "high_percentile=90", "target_min=100", "target_max=200"]];
    for name in ["percentile_normalize", "stack_percentile_normalize"] {
        for dtype in DType::ALL {
            for (i, shape) in SHAPES.iter().enumerate() {
                for args in settings {
                    let s = random_stack(dtype, *shape, 500 + i as u64);
                    let host = call_args(name, args, &s, Device::Cpu);
                    let gpu = call_args(name, args, &s, dev);
                    let what = format!("{name} {dtype} {shape:?} {args:?}");
                    if dtype == DType::F32 {
                        assert_close_stacks(&gpu, &host, 0.07, 1e-6, &what);
                    } else {
                        assert_eq!(gpu, host, "{what}");
                    }
                }
            }
        }
    }
    // A constant stack maps to target_min on both.
    let c = Stack::from_f32_array(Array3::from_elem((2, 3, 5), 9.0), DType::U16);
    assert_eq!(
        call_args("stack_percentile_normalize", &["target_min=7"], &c, dev),
        Stack::from_f32_array(Array3::from_elem((2, 3, 5), 7.0), DType::U16)
    );
}

/// Same histogram, same lookup table: bit-exact for u8/u16.
#[test]
fn stack_equalize_histogram_gpu_is_bit_exact_with_host() {
    let Some(dev) = gpu() else { return };
    for dtype in [DType::U8, DType::U16] {
        for (i, shape) in SHAPES.iter().enumerate() {
            let s = random_stack(dtype, *shape, 600 + i as u64);
            let host = call("stack_equalize_histogram", &s, Device::Cpu);
            let gpu = call("stack_equalize_histogram", &s, dev);
            assert_eq!(gpu, host, "{dtype} {shape:?}");
        }
    }
}

/// Runs `name` with `args` on `device`, returning the error message if it fails.
fn try_call_args(name: &str, args: &[&str], stack: &Stack, device: Device) -> Result<Stack, String> {
    let (registry, conversions) = common::registry();
    match hcsflow_testkit::call(&registry, &conversions, name, args, stack, device) {
        Err(CallError::Function(e)) => Err(e.to_string()),
        other => Ok(other.unwrap()),
    }
}

/// f32: the same bins (exact counts), interpolation in f32 instead of the
/// host's f64: within 2e-6 of the host (outputs in [0, 1]); NaN stays NaN;
/// the host's errors for non-finite and all-NaN stacks.
#[test]
fn stack_equalize_histogram_f32_gpu_matches_host() {
    let Some(dev) = gpu() else { return };
    const NAME: &str = "stack_equalize_histogram";
    let mut cases: Vec<(String, Stack, &[&str])> = Vec::new();
    for (i, shape) in SHAPES.iter().enumerate() {
        for args in [&[][..], &["nbins=1"][..], &["nbins=7"][..], &["nbins=4096"][..]] {
            cases.push((format!("{shape:?} {args:?}"), random_stack(DType::F32, *shape, 650 + i as u64), args));
        }
    }
    // Few distinct values (many ties on bin edges), a constant stack, NaNs.
    let steps = random_stack(DType::F32, [3, 17, 19], 660).to_f32().mapv(|v| (v / 250.0).round() * 0.25);
    cases.push(("ties".into(), Stack::from_f32_array(steps, DType::F32), &["nbins=9"][..]));
    cases.push(("constant".into(), Stack::from_f32_array(Array3::from_elem((2, 3, 5), 4.5), DType::F32), &[][..]));
    let mut nan = random_stack(DType::F32, [2, 9, 11], 661).to_f32();
    nan.iter_mut().step_by(7).for_each(|v| *v = f32::NAN);
    cases.push(("NaN".into(), Stack::from_f32_array(nan, DType::F32), &["nbins=16"][..]));
    let mut worst = 0.0f32;
    for (what, s, args) in &cases {
        let host = call_args(NAME, args, s, Device::Cpu);
        let gpu = call_args(NAME, args, s, dev);
        assert_eq!(gpu.dtype(), DType::F32, "{what}");
        assert_eq!(gpu.shape(), host.shape(), "{what}");
        for (i, (a, b)) in gpu.to_f32().iter().zip(host.to_f32().iter()).enumerate() {
            assert_eq!(a.is_nan(), b.is_nan(), "{what}: value {i}: gpu {a}, host {b}");
            assert!(a.is_nan() || (a - b).abs() <= 2e-6, "{what}: value {i}: gpu {a}, host {b}");
            if !a.is_nan() {
                worst = worst.max((a - b).abs());
            }
        }
    }
    eprintln!("f32 equalisation: max |gpu - host| = {worst:e}");
    let mut inf = random_stack(DType::F32, [1, 4, 4], 662).to_f32();
    inf[[0, 1, 2]] = f32::INFINITY;
    let all_nan = Array3::from_elem((1, 2, 3), f32::NAN);
    for bad in [inf, all_nan] {
        let s = Stack::from_f32_array(bad, DType::F32);
        let host = try_call_args(NAME, &[], &s, Device::Cpu).unwrap_err();
        let gpu = try_call_args(NAME, &[], &s, dev).unwrap_err();
        assert_eq!(gpu, host);
    }
}

/// Same weights and tap order as the host; FMA contraction in the shader
/// allows 1e-6 × max|input| of difference.
#[test]
fn gaussian_sharpen_composite_gpu_match_host() {
    let Some(dev) = gpu() else { return };
    let cases: [(&str, &[&str]); 7] = [
        ("gaussian_blur", &[]),
        ("gaussian_blur", &["sigma=2", "sigma_x=0.5"]),
        ("gaussian_blur", &["sigma=30"]),
        ("sharpen", &[]),
        ("sharpen", &["radius=2.5", "amount=0.7"]),
        ("composite", &[]),
        ("composite", &["weights=3,1,0,2,1"]),
    ];
    for (name, args) in cases {
        for dtype in DType::ALL {
            for (i, shape) in SHAPES.iter().enumerate() {
                if name == "composite" && args.len() == 1 && shape[0] != 5 {
                    continue; // 5 weights need a 5-plane stack
                }
                let s = random_stack(dtype, *shape, 700 + i as u64);
                let host = call_args(name, args, &s, Device::Cpu);
                let gpu = call_args(name, args, &s, dev);
                let scale = s.to_f32().iter().fold(1.0f32, |m, v| m.max(v.abs()));
                assert_close_stacks(&gpu, &host, 1e-6 * scale, 0.0, &format!("{name} {args:?} {dtype} {shape:?}"));
            }
        }
    }
}

/// apply_mask moves pixels only: bit-exact, padding lanes of packed planes included.
#[test]
fn apply_mask_gpu_is_bit_exact_with_host() {
    let Some(dev) = gpu() else { return };
    for dtype in DType::ALL {
        for (i, shape) in SHAPES.iter().enumerate().skip(1) {
            // Threshold the random values into a mask with zeros.
            let s = random_stack(dtype, *shape, 800 + i as u64);
            let masked = Stack::from_f32_array(s.to_f32().mapv(|v| if v.rem_euclid(3.0) < 1.0 { 0.0 } else { v }), dtype);
            for args in [&["fill=5"][..], &["mask_index=0"][..]] {
                let host = call_args("apply_mask", args, &masked, Device::Cpu);
                let gpu = call_args("apply_mask", args, &masked, dev);
                assert_eq!(gpu, host, "{dtype} {shape:?} {args:?}");
            }
        }
    }
}
