//! Helpers shared by the GPU test binaries: the adapter to test on and
//! deterministic test stacks (hcsflow-testkit's).
#![allow(dead_code)]

use hcsflow_core::{Device, Stack};

/// The adapter to test on: the first one found (lavapipe in CI). Fails, rather
/// than skips, when there is none, unless HCSFLOW_SKIP_GPU_TESTS=1 outside CI
/// (the oracles' policy: nothing skips under `CI=true`).
pub fn gpu() -> Option<Device> {
    let adapters = hcsflow_gpu::discover_adapters();
    if adapters.is_empty() {
        if !hcsflow_testkit::in_ci() && std::env::var("HCSFLOW_SKIP_GPU_TESTS").as_deref() == Ok("1") {
            eprintln!("SKIPPED: GPU test (no adapter, HCSFLOW_SKIP_GPU_TESTS=1)");
            return None;
        }
        panic!("no GPU adapter found: install mesa-vulkan-drivers libvulkan1 (or, outside CI, set HCSFLOW_SKIP_GPU_TESTS=1)");
    }
    Some(Device::Gpu(adapters[0].index))
}

#[allow(unused_imports)] // not every test binary uses it
pub use hcsflow_testkit::random_stack;

/// A wgpu array back on the host, as a stack.
pub fn to_host(a: &hcsflow_gpu::WgpuArray) -> Stack {
    hcsflow_gpu::download(a).unwrap().into_stack().unwrap()
}
