//! Helpers shared by the GPU test binaries: the adapter to test on and
//! deterministic test stacks.
#![allow(dead_code)]

use hcsflow_core::{DType, Device, Stack};
use ndarray::Array3;

/// The adapter to test on: the first one found (lavapipe in CI). Fails, rather
/// than skips, when there is none, unless HCSFLOW_SKIP_GPU_TESTS=1.
pub fn gpu() -> Option<Device> {
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
pub fn random_stack(dtype: DType, shape: [usize; 3], seed: u64) -> Stack {
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

/// A wgpu array back on the host, as a stack.
pub fn to_host(a: &hcsflow_gpu::WgpuArray) -> Stack {
    hcsflow_gpu::download(a).unwrap().into_stack().unwrap()
}
