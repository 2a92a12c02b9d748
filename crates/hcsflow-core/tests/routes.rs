//! Every (source, target) pair of memory types has exactly the planned route.

use std::sync::Arc;

use hcsflow_core::convert::Converter;
use hcsflow_core::{plan_route, Array, ConversionError, ConversionPolicy, Conversions, Device, MemoryType, RouteKind, Stack};
use MemoryType::*;

const ALLOW: ConversionPolicy = ConversionPolicy { allow_host_round_trip: true };
const DENY: ConversionPolicy = ConversionPolicy { allow_host_round_trip: false };

/// The expected route kind for each pair, written out independently of the
/// planner's rules (host space: host, numpy; CUDA space: cuda, torch, cupy,
/// jax, tensorflow; wgpu and pyclesperanto each alone without DLPack).
fn expected(source: MemoryType, target: MemoryType) -> RouteKind {
    let host = [Host, Numpy];
    let cuda = [Cuda, Torch, Cupy, Jax, Tensorflow];
    if source == target {
        RouteKind::Identity
    } else if (host.contains(&source) && host.contains(&target)) || (cuda.contains(&source) && cuda.contains(&target)) {
        RouteKind::ZeroCopy
    } else if host.contains(&source) || host.contains(&target) {
        RouteKind::DeviceCopy
    } else {
        RouteKind::HostRoundTrip
    }
}

#[test]
fn every_pair_has_the_expected_route() {
    let mut counts = std::collections::HashMap::new();
    for source in MemoryType::ALL {
        for target in MemoryType::ALL {
            let want = expected(source, target);
            let allowed = plan_route(source, target, ALLOW).unwrap();
            assert_eq!(allowed.kind, want, "{source} → {target}");
            assert_eq!((allowed.source, allowed.target), (source, target));
            let denied = plan_route(source, target, DENY);
            if want == RouteKind::HostRoundTrip {
                let err = denied.unwrap_err();
                assert_eq!((err.from, err.to), (source, target));
                assert_eq!(err.method, "host round-trip");
                assert!(err.reason.contains("cannot share memory"), "{}", err.reason);
                assert!(err.to_string().contains(&format!("{source} → {target}")), "{err}");
            } else {
                assert_eq!(denied.unwrap(), allowed, "{source} → {target}");
            }
            *counts.entry(want).or_insert(0) += 1;
        }
    }
    // 9 identities; zero-copy: 2 host-space + 5·4 CUDA-space ordered pairs.
    assert_eq!(counts[&RouteKind::Identity], 9);
    assert_eq!(counts[&RouteKind::ZeroCopy], 2 + 20);
    // Device copies: 2 host-space types × 7 device types × 2 directions.
    assert_eq!(counts[&RouteKind::DeviceCopy], 28);
    assert_eq!(counts[&RouteKind::HostRoundTrip], 81 - 9 - 22 - 28);
}

#[test]
fn methods_name_the_mechanism() {
    assert_eq!(plan_route(Host, Wgpu, DENY).unwrap().method, "upload");
    assert_eq!(plan_route(Wgpu, Host, DENY).unwrap().method, "download");
    assert_eq!(plan_route(Torch, Cupy, DENY).unwrap().method, "dlpack");
    assert_eq!(plan_route(Numpy, Host, DENY).unwrap().method, "buffer protocol");
    assert_eq!(plan_route(Wgpu, Torch, ALLOW).unwrap().method, "download + upload");
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
    assert_eq!(conversions.plan(Host, Host, DENY).unwrap().kind, RouteKind::Identity);
    // No wgpu runtime registered: upload is refused before anything runs.
    let err = conversions.plan(Host, Wgpu, DENY).unwrap_err();
    assert!(err.reason.contains("no host → wgpu converter"), "{err}");
    assert!(err.reason.contains("wgpu runtime is not built in"), "{err}");
    // A disallowed round trip is reported as such even without converters.
    let err = conversions.plan(Wgpu, Torch, DENY).unwrap_err();
    assert_eq!(err.method, "host round-trip");
    // Allowed round trip still needs both edges.
    let err = conversions.plan(Wgpu, Torch, ALLOW).unwrap_err();
    assert!(err.reason.contains("wgpu → host"), "{err}");
}

#[test]
fn execute_runs_identity_and_checks_the_source() {
    let mut conversions = Conversions::default();
    conversions.register(Numpy, Host, Arc::new(Passthrough));
    let stack = Stack::zeros(hcsflow_core::DType::U16, [2, 3, 4]);
    let route = conversions.plan(Host, Host, DENY).unwrap();
    let out = conversions.execute(&route, Array::from(stack.clone()), Device::Cpu).unwrap();
    assert_eq!(out.into_host_stack().unwrap(), stack);
    // A route planned for numpy input refuses a host array.
    let route = conversions.plan(Numpy, Host, DENY).unwrap();
    let err = conversions.execute(&route, Array::from(stack), Device::Cpu).unwrap_err();
    assert!(err.reason.contains("expected numpy input"), "{err}");
}
