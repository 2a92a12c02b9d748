//! What `builtin()` holds in this build: every function has a host
//! implementation; the wgpu implementations are there exactly when the
//! `wgpu` feature is on (`cargo test -p hcsflow --no-default-features` runs
//! the CPU-only side).

use hcsflow::core::MemoryType;

#[test]
fn every_function_has_a_host_implementation() {
    let (registry, _) = hcsflow::builtin();
    let names: Vec<&str> = registry.functions().map(|f| f.spec.name).collect();
    assert!(names.len() >= 20, "{names:?}");
    for f in registry.functions() {
        assert!(f.memory_types().contains(&MemoryType::Host), "{} has no host implementation", f.spec.name);
    }
}

#[test]
fn wgpu_implementations_follow_the_feature() {
    let (registry, _) = hcsflow::builtin();
    let on_gpu = registry.functions().filter(|f| f.memory_types().contains(&MemoryType::Wgpu)).count();
    if cfg!(feature = "wgpu") {
        assert!(on_gpu > 0, "the wgpu feature is on but no function has a wgpu implementation");
    } else {
        assert_eq!(on_gpu, 0, "a CPU-only build registered wgpu implementations");
    }
}
