//! GPU (wgpu, lavapipe in CI) against the host implementations of the same
//! functions. One shared device per test process (GpuContext caches it).

use hcsflow_core::{
    stack_slices, unstack_slices, Array, ConversionPolicy, Conversions, DType, Device, HostArray,
    MemoryType, Registry, RouteKind, Stack,
};
use ndarray::Array3;

/// The adapter to test on: the first one found (lavapipe in CI). Fails, rather
/// than skips, when there is none, unless HCSFLOW_SKIP_GPU_TESTS=1.
fn gpu() -> Option<Device> {
    let adapters = hcsflow_gpu::discover_adapters();
    if adapters.is_empty() {
        if std::env::var("HCSFLOW_SKIP_GPU_TESTS").as_deref() == Ok("1") {
            eprintln!("skipping GPU test: no adapter and HCSFLOW_SKIP_GPU_TESTS=1");
            return None;
        }
        panic!("no GPU adapter found: install mesa-vulkan-drivers libvulkan1 (or set HCSFLOW_SKIP_GPU_TESTS=1)");
    }
    Some(Device::Gpu(adapters[0].index))
}

/// Deterministic pseudo-random stack (xorshift), values spread over the dtype's range.
fn random_stack(dtype: DType, shape: [usize; 3], seed: u64) -> Stack {
    let mut s = seed.wrapping_mul(0x9E37_79B9_7F4A_7C15) | 1;
    let mut next = move || {
        s ^= s << 13;
        s ^= s >> 7;
        s ^= s << 17;
        s
    };
    let n = shape.iter().product();
    let f: Vec<f32> = (0..n)
        .map(|_| match dtype {
            DType::U8 => (next() % 256) as f32,
            DType::U16 => (next() % 65536) as f32,
            DType::F32 => (next() % 2_000_001) as f32 / 1000.0 - 1000.0,
        })
        .collect();
    Stack::from_f32_array(Array3::from_shape_vec(shape, f).unwrap(), dtype)
}

fn setup() -> (Registry, Conversions) {
    let mut registry = Registry::new();
    let mut conversions = Conversions::default();
    hcsflow_ops::register(&mut registry);
    hcsflow_gpu::register(&mut registry, &mut conversions);
    (registry, conversions)
}

/// Runs `name` through the registry on `device`, returning the host result.
fn call(name: &str, stack: &Stack, device: Device) -> Stack {
    let (registry, conversions) = setup();
    let f = registry.get(name).unwrap();
    let args = f.validate_args(vec![]).unwrap();
    let plan = registry
        .plan_call(name, args, MemoryType::Host, device, &conversions, ConversionPolicy::default())
        .unwrap();
    let expected_route = if device == Device::Cpu { RouteKind::Identity } else { RouteKind::DeviceCopy };
    assert_eq!(plan.route_in.kind, expected_route);
    let out = registry.execute(&plan, Array::from(stack.clone()), &conversions).unwrap();
    let back = conversions
        .plan(out.memory_type(), MemoryType::Host, ConversionPolicy::default())
        .unwrap();
    conversions.execute(&back, out, Device::Cpu).unwrap().into_host_stack().unwrap()
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
    let (_, conversions) = setup();
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
    let (mut registry, conversions) = setup();
    registry.register(
        hcsflow_core::FunctionSpec { name: "host_only", doc: "test", contract: hcsflow_core::Contract::Pure3d, args: vec![] },
        hcsflow_core::Implementation::host(|s, _| Ok(s.clone())),
    );
    let err = registry
        .plan_call("host_only", Default::default(), MemoryType::Host, Device::Gpu(0), &conversions, ConversionPolicy::default())
        .unwrap_err();
    assert_eq!(err.to_string(), "host_only has no implementation for gpu:0 (it has: host); run it with --device cpu");
}
