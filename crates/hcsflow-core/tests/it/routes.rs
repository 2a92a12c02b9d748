//! Every (source, target) pair of memory types has exactly the planned route.

use std::sync::Arc;

use hcsflow_core::convert::Converter;
use hcsflow_core::{plan_route, Array, ConversionError, ConversionPolicy, Conversions, Device, MemoryType, RouteKind, Runtime, Stack};
use MemoryType::*;

const ALLOW: ConversionPolicy = ConversionPolicy { allow_host_round_trip: true };
const DENY: ConversionPolicy = ConversionPolicy { allow_host_round_trip: false };

/// The expected route kind for each pair in `runtime` (`None`: no route),
/// written out independently of the planner's rules: host space holds host
/// and numpy, and torch, jax and tensorflow on the host runtime (which have
/// no arrays on a wgpu device); CUDA space cuda and cupy; wgpu and
/// pyclesperanto are each alone, without DLPack. Another library's host
/// array is copied into a Rust stack.
fn expected(source: MemoryType, target: MemoryType, runtime: Runtime) -> Option<RouteKind> {
    let cpu_tensors = [Torch, Jax, Tensorflow];
    let mut host = vec![Host, Numpy];
    if runtime == Runtime::Host {
        host.extend(cpu_tensors);
    }
    let cuda = [Cuda, Cupy];
    Some(if source == target {
        RouteKind::Identity
    } else if runtime == Runtime::Wgpu && (cpu_tensors.contains(&source) || cpu_tensors.contains(&target)) {
        return None;
    } else if host.contains(&source) && host.contains(&target) {
        if target == Host {
            RouteKind::HostCopy
        } else {
            RouteKind::ZeroCopy
        }
    } else if cuda.contains(&source) && cuda.contains(&target) {
        RouteKind::ZeroCopy
    } else if host.contains(&source) || host.contains(&target) {
        RouteKind::DeviceCopy
    } else {
        RouteKind::HostRoundTrip
    })
}

#[test]
fn every_pair_has_the_expected_route() {
    for runtime in [Runtime::Host, Runtime::Wgpu] {
        let mut counts = std::collections::HashMap::new();
        for source in MemoryType::ALL {
            for target in MemoryType::ALL {
                let Some(want) = expected(source, target, runtime) else {
                    let err = plan_route(source, target, runtime, ALLOW).unwrap_err();
                    assert_eq!((err.from, err.to), (source, target));
                    assert!(err.reason.contains("has no arrays on a wgpu device"), "{err}");
                    *counts.entry(None).or_insert(0) += 1;
                    continue;
                };
                let allowed = plan_route(source, target, runtime, ALLOW).unwrap();
                assert_eq!(allowed.kind, want, "{source} → {target} in {runtime}");
                assert_eq!((allowed.source, allowed.target), (source, target));
                let denied = plan_route(source, target, runtime, DENY);
                if want == RouteKind::HostRoundTrip {
                    let err = denied.unwrap_err();
                    assert_eq!((err.from, err.to), (source, target));
                    assert_eq!(err.method, "host round-trip");
                    assert!(err.reason.contains("cannot share memory"), "{}", err.reason);
                    assert!(err.to_string().contains(&format!("{source} → {target}")), "{err}");
                } else {
                    assert_eq!(denied.unwrap(), allowed, "{source} → {target}");
                }
                *counts.entry(Some(want)).or_insert(0) += 1;
            }
        }
        let count = |k| counts.get(&k).copied().unwrap_or(0);
        assert_eq!(count(Some(RouteKind::Identity)), 9);
        if runtime == Runtime::Host {
            // Host space has 5 types, 20 ordered pairs: 4 copies into a Rust stack, 16 shared.
            assert_eq!(count(Some(RouteKind::HostCopy)), 4);
            assert_eq!(count(Some(RouteKind::ZeroCopy)), 16 + 2);
            // 5 host-space types × 4 others × 2 directions.
            assert_eq!(count(Some(RouteKind::DeviceCopy)), 40);
            assert_eq!(count(None), 0);
        } else {
            assert_eq!(count(Some(RouteKind::HostCopy)), 1);
            assert_eq!(count(Some(RouteKind::ZeroCopy)), 1 + 2);
            // 2 host-space types × 4 others × 2 directions.
            assert_eq!(count(Some(RouteKind::DeviceCopy)), 16);
            // Pairs with one of the 3 CPU-tensor types, but not their identities.
            assert_eq!(count(None), 81 - 36 - 3);
        }
    }
}

#[test]
fn methods_name_the_mechanism() {
    let host = Runtime::Host;
    assert_eq!(plan_route(Host, Wgpu, host, DENY).unwrap().method, "upload");
    assert_eq!(plan_route(Wgpu, Host, host, DENY).unwrap().method, "download");
    assert_eq!(plan_route(Cuda, Cupy, host, DENY).unwrap().method, "dlpack");
    assert_eq!(plan_route(Host, Torch, host, DENY).unwrap().method, "dlpack");
    assert_eq!(plan_route(Host, Jax, host, DENY).unwrap().method, "dlpack");
    assert_eq!(plan_route(Numpy, Jax, host, DENY).unwrap().method, "dlpack; jax copies a buffer not 64-byte aligned");
    assert_eq!(plan_route(Host, Numpy, host, DENY).unwrap().method, "numpy view");
    assert_eq!(plan_route(Torch, Host, host, DENY).unwrap().method, "copy");
    assert_eq!(plan_route(Host, Pyclesperanto, host, DENY).unwrap().method, "push");
    assert_eq!(plan_route(Pyclesperanto, Numpy, host, DENY).unwrap().method, "pull");
    assert_eq!(plan_route(Wgpu, Cupy, host, ALLOW).unwrap().method, "download + upload");
}

/// A converter that records the edge by tagging nothing; it re-labels host
/// data as "arrived" by returning it unchanged (host → host edges only).
struct Passthrough;
impl Converter for Passthrough {
    fn convert(&self, array: Array, _device: Device) -> Result<Array, ConversionError> {
        Ok(array)
    }
}

#[test]
fn build_availability_is_checked_at_plan_time() {
    let conversions = Conversions::default();
    // Identity needs no converter.
    assert_eq!(conversions.plan(Host, Host, Runtime::Host, DENY).unwrap().kind, RouteKind::Identity);
    // No wgpu runtime registered: upload is refused before anything runs.
    let err = conversions.plan(Host, Wgpu, Runtime::Host, DENY).unwrap_err();
    assert!(err.reason.contains("no host → wgpu converter"), "{err}");
    assert!(err.reason.contains("wgpu runtime is not built in"), "{err}");
    // A disallowed round trip is reported as such even without converters.
    let err = conversions.plan(Wgpu, Cupy, Runtime::Host, DENY).unwrap_err();
    assert_eq!(err.method, "host round-trip");
    // Allowed round trip still needs both edges.
    let err = conversions.plan(Wgpu, Cupy, Runtime::Host, ALLOW).unwrap_err();
    assert!(err.reason.contains("wgpu → host"), "{err}");
    // A refused edge fails with the reason the front end gave.
    let mut conversions = Conversions::default();
    conversions.refuse(Host, Torch, "torch is not installed (pip install torch)");
    let err = conversions.plan(Host, Torch, Runtime::Host, DENY).unwrap_err();
    assert_eq!((err.from, err.to, err.method.as_str()), (Host, Torch, "dlpack"));
    assert_eq!(err.reason, "torch is not installed (pip install torch)");
    // Torch has no tensors on a wgpu device, whatever converters exist.
    let err = conversions.plan(Host, Torch, Runtime::Wgpu, ALLOW).unwrap_err();
    assert!(err.reason.contains("torch has no arrays on a wgpu device"), "{err}");
}

#[test]
fn execute_runs_identity_and_checks_the_source() {
    let mut conversions = Conversions::default();
    conversions.register(Numpy, Host, Arc::new(Passthrough));
    let stack = Stack::zeros(hcsflow_core::DType::U16, [2, 3, 4]);
    let route = conversions.plan(Host, Host, Runtime::Host, DENY).unwrap();
    let out = conversions.execute(&route, Array::from(stack.clone()), Device::Cpu).unwrap();
    assert_eq!(out.into_host_stack().unwrap(), stack);
    // A route planned for numpy input refuses a host array.
    let route = conversions.plan(Numpy, Host, Runtime::Host, DENY).unwrap();
    let err = conversions.execute(&route, Array::from(stack), Device::Cpu).unwrap_err();
    assert!(err.reason.contains("expected numpy input"), "{err}");
}
