//! Conversion routes between memory types, planned before anything runs.
//!
//! [`plan_route`] is a pure function of (source, target, runtime, policy):
//! every pair of [`MemoryType`]s has exactly one answer in a runtime, either a
//! [`Route`] or a [`ConversionError`] naming source, target, method and
//! reason. The runtime matters because torch, jax and tensorflow hold CPU
//! tensors on the host runtime ([`MemoryType::space_in`]). There is no silent
//! fallback: a round trip through host memory between two GPU libraries
//! happens only when [`ConversionPolicy::allow_host_round_trip`] says so, and
//! a copy is planned as a copy, never tried after a zero-copy attempt.
//!
//! [`Conversions`] holds the converters this build actually has (host ↔ wgpu
//! from `hcsflow-gpu`, the Python libraries from the Python package) and
//! refuses, at plan time, routes whose converters are missing, with the reason
//! a front end gave ([`Conversions::refuse`]: "torch is not installed").

use std::collections::HashMap;
use std::fmt;
use std::sync::Arc;

use serde::Serialize;

use crate::memory::{Array, Device, Exchange, MemorySpace, MemoryType, Runtime};

/// The kind of move a route makes.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize)]
#[serde(rename_all = "snake_case")]
pub enum RouteKind {
    /// Same memory type: nothing to do.
    Identity,
    /// Same memory, another library's view of it (DLPack, shared host buffer).
    ZeroCopy,
    /// One copy within host memory: a Python library's host array into a
    /// Rust stack (which owns its buffer).
    HostCopy,
    /// One copy between host memory and a device (upload or download).
    DeviceCopy,
    /// Two copies: download from one device library, upload to another.
    HostRoundTrip,
}

impl fmt::Display for RouteKind {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(match self {
            RouteKind::Identity => "identity",
            RouteKind::ZeroCopy => "zero-copy",
            RouteKind::HostCopy => "host copy",
            RouteKind::DeviceCopy => "device copy",
            RouteKind::HostRoundTrip => "host round-trip",
        })
    }
}

/// A planned conversion.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize)]
pub struct Route {
    pub source: MemoryType,
    pub target: MemoryType,
    pub kind: RouteKind,
    /// How the move is done, for plans and reports ("upload", "dlpack", ...).
    pub method: &'static str,
}

impl fmt::Display for Route {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{} → {} ({}, {})", self.source, self.target, self.kind, self.method)
    }
}

/// What the planner may do.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, Serialize)]
pub struct ConversionPolicy {
    /// Allow copying through host memory between two device libraries that
    /// cannot share memory (e.g. wgpu ↔ torch). Off by default: such a
    /// pipeline is usually a mistake that costs two PCIe transfers per call.
    pub allow_host_round_trip: bool,
}

/// A conversion that cannot be planned or failed to run.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("cannot convert {from} → {to} ({method}): {reason}")]
pub struct ConversionError {
    pub from: MemoryType,
    pub to: MemoryType,
    pub method: String,
    pub reason: String,
}

/// The route from `source` to `target` for a step in `runtime`, under
/// `policy`. Pure: depends on nothing but its arguments, so plans are
/// reproducible and testable without devices.
pub fn plan_route(source: MemoryType, target: MemoryType, runtime: Runtime, policy: ConversionPolicy) -> Result<Route, ConversionError> {
    let route = |kind, method| Ok(Route { source, target, kind, method });
    if source == target {
        return route(RouteKind::Identity, "none");
    }
    let place = |m: MemoryType| {
        m.space_in(runtime).ok_or_else(|| ConversionError {
            from: source,
            to: target,
            method: "none".into(),
            reason: format!("{m} has no arrays on a {runtime} device; {m} functions run with device cpu"),
        })
    };
    let (s, t) = (place(source)?, place(target)?);
    if s == t {
        if source.exchange() != Exchange::Dlpack || target.exchange() != Exchange::Dlpack {
            // Same space but no sharing protocol: only reachable through the host.
            return round_trip(source, target, policy);
        }
        return match (s, source, target) {
            (MemorySpace::Host, MemoryType::Host, MemoryType::Numpy) => route(RouteKind::ZeroCopy, "numpy view"),
            // A Rust stack owns its pixels: another library's host array is copied in.
            (MemorySpace::Host, _, MemoryType::Host) => route(RouteKind::HostCopy, "copy"),
            // JAX shares only 64-byte aligned host buffers: the engine's are,
            // numpy's (16-byte aligned) may not be, and then JAX copies.
            (MemorySpace::Host, s, MemoryType::Jax) if s != MemoryType::Host => {
                route(RouteKind::ZeroCopy, "dlpack; jax copies a buffer not 64-byte aligned")
            }
            _ => route(RouteKind::ZeroCopy, "dlpack"),
        };
    }
    match (s, t) {
        (MemorySpace::Host, MemorySpace::OpenCl) => route(RouteKind::DeviceCopy, "push"),
        (MemorySpace::OpenCl, MemorySpace::Host) => route(RouteKind::DeviceCopy, "pull"),
        (MemorySpace::Host, _) => route(RouteKind::DeviceCopy, "upload"),
        (_, MemorySpace::Host) => route(RouteKind::DeviceCopy, "download"),
        _ => round_trip(source, target, policy),
    }
}

fn round_trip(source: MemoryType, target: MemoryType, policy: ConversionPolicy) -> Result<Route, ConversionError> {
    if policy.allow_host_round_trip {
        Ok(Route { source, target, kind: RouteKind::HostRoundTrip, method: "download + upload" })
    } else {
        Err(ConversionError {
            from: source,
            to: target,
            method: "host round-trip".into(),
            reason: format!(
                "{source} and {target} cannot share memory, and copying through the host is disabled; \
                 allow it with `allow_host_round_trip = true` (--allow-host-round-trip) or use \
                 functions with matching memory types"
            ),
        })
    }
}

/// Moves an array along one direct edge (no round trips: those compose two edges).
pub trait Converter: Send + Sync {
    /// `array` has the edge's source memory type; the result has its target,
    /// on `device` when the target is device memory.
    fn convert(&self, array: Array, device: Device) -> Result<Array, ConversionError>;
}

/// One direct edge of [`Conversions`]: its converter, or why this build
/// cannot take it.
#[derive(Clone)]
enum Edge {
    Converter(Arc<dyn Converter>),
    Refused(String),
}

/// The converters available in this build.
#[derive(Clone, Default)]
pub struct Conversions {
    edges: HashMap<(MemoryType, MemoryType), Edge>,
}

impl fmt::Debug for Conversions {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let mut keys: Vec<_> = self.edges.iter().filter(|(_, e)| matches!(e, Edge::Converter(_))).map(|(k, _)| k).collect();
        keys.sort();
        f.debug_struct("Conversions").field("edges", &keys).finish()
    }
}

impl Conversions {
    /// Registers the converter for the direct edge `source → target`.
    pub fn register(&mut self, source: MemoryType, target: MemoryType, converter: Arc<dyn Converter>) {
        self.edges.insert((source, target), Edge::Converter(converter));
    }

    /// Records that this build cannot take the edge `source → target`, and
    /// why ("torch is not installed"): plans needing it fail with `reason`.
    pub fn refuse(&mut self, source: MemoryType, target: MemoryType, reason: impl Into<String>) {
        self.edges.insert((source, target), Edge::Refused(reason.into()));
    }

    fn edges_of(&self, route: &Route) -> Vec<(MemoryType, MemoryType)> {
        match route.kind {
            RouteKind::Identity => vec![],
            RouteKind::ZeroCopy | RouteKind::HostCopy | RouteKind::DeviceCopy => vec![(route.source, route.target)],
            RouteKind::HostRoundTrip => {
                vec![(route.source, MemoryType::Host), (MemoryType::Host, route.target)]
            }
        }
    }

    /// Plans `source → target` for a step in `runtime` and checks this build
    /// can carry it out.
    pub fn plan(
        &self,
        source: MemoryType,
        target: MemoryType,
        runtime: Runtime,
        policy: ConversionPolicy,
    ) -> Result<Route, ConversionError> {
        let route = plan_route(source, target, runtime, policy)?;
        for (a, b) in self.edges_of(&route) {
            let refused = |reason: String| ConversionError { from: source, to: target, method: route.method.to_string(), reason };
            match self.edges.get(&(a, b)) {
                Some(Edge::Converter(_)) => {}
                Some(Edge::Refused(reason)) => return Err(refused(reason.clone())),
                None => {
                    let runtime = if a == MemoryType::Host { b } else { a };
                    return Err(refused(format!("this build has no {a} → {b} converter (the {runtime} runtime is not built in)")));
                }
            }
        }
        Ok(route)
    }

    /// Runs a planned route. `device` is where the result should live.
    pub fn execute(&self, route: &Route, array: Array, device: Device) -> Result<Array, ConversionError> {
        if array.memory_type() != route.source {
            return Err(ConversionError {
                from: array.memory_type(),
                to: route.target,
                method: route.method.to_string(),
                reason: format!("the plan expected {} input", route.source),
            });
        }
        let mut current = array;
        for (a, b) in self.edges_of(route) {
            let missing = |reason: String| ConversionError { from: a, to: b, method: route.method.to_string(), reason };
            let converter = match self.edges.get(&(a, b)) {
                Some(Edge::Converter(c)) => c,
                Some(Edge::Refused(reason)) => return Err(missing(reason.clone())),
                None => return Err(missing("no converter registered for this edge".into())),
            };
            let dev = if b.on_host_in(device.runtime()) { Device::Cpu } else { device };
            current = converter.convert(current, dev)?;
        }
        Ok(current)
    }
}
