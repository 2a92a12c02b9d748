//! Helpers shared by the GPU test binaries: the adapter to test on and
//! deterministic test stacks (hcsflow-testkit's).
#![allow(dead_code)]

use hcsflow_core::{Conversions, Device, Registry, Stack};

/// The adapter to test on: the first one found (lavapipe in CI). Fails, rather
/// than skips, when there is none, unless HCSFLOW_SKIP_GPU_TESTS=1 outside CI
/// (the oracles' policy: nothing skips under `CI=true`).
pub fn gpu() -> Option<Device> {
    let adapters = hcsflow_gpu::discover_adapters();
    if !hcsflow_testkit::gpu_test_may_run(!adapters.is_empty()) {
        return None;
    }
    Some(Device::Gpu(adapters[0].index))
}

#[allow(unused_imports)] // not every test binary uses it
pub use hcsflow_testkit::random_stack;

/// A wgpu array back on the host, as a stack.
pub fn to_host(a: &hcsflow_gpu::WgpuArray) -> Stack {
    hcsflow_gpu::download(a).unwrap().into_stack().unwrap()
}

/// The host functions of `hcsflow-ops` and their wgpu implementations, with the
/// host ↔ wgpu conversions: what a GPU test plans and runs calls with.
pub fn registry() -> (Registry, Conversions) {
    let mut registry = Registry::new();
    let mut conversions = Conversions::default();
    hcsflow_ops::register(&mut registry);
    hcsflow_gpu::register(&mut registry, &mut conversions);
    (registry, conversions)
}
