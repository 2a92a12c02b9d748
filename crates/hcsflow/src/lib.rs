//! The hcsflow engine: the one library every front end (the `hcsflow` CLI,
//! the Python package, cluster workers) stands on.
//!
//! The engine crates each have one job ([`core`] stacks, memory types and the
//! function registry; [`plate`] microscope layouts; [`tiff`] and [`zarr`]
//! image files; [`pipeline`] compile and run). They do not choose which
//! implementations of the functions a build has: this crate does, with cargo
//! features, as ripgrep's `grep` and burn's facades do.
//!
//! | feature | default | what it adds |
//! |---|---|---|
//! | `wgpu` | on | GPU implementations on wgpu (CubeCL) and the host ↔ wgpu converters |
//!
//! Without default features the engine is CPU-only: every function keeps its
//! host implementation, and `--device gpu` finds none (a compile error, never
//! a silent CPU fallback).
//!
//! ```
//! let (registry, _conversions) = hcsflow::builtin();
//! let max = registry.get("max_projection").expect("a built-in function");
//! assert!(max.memory_types().contains(&hcsflow::core::MemoryType::Host));
//! ```

pub use hcsflow_core as core;
pub use hcsflow_pipeline as pipeline;
pub use hcsflow_plate as plate;
pub use hcsflow_tiff as tiff;
pub use hcsflow_zarr as zarr;

use hcsflow_core::{Conversions, Registry};

/// Every function this build has, with the implementations its features
/// enable (host first, then GPU ones attached to the same functions), and the
/// converters between their memory types.
pub fn builtin() -> (Registry, Conversions) {
    let mut registry = Registry::new();
    #[allow(unused_mut)] // only the GPU runtimes add converters
    let mut conversions = Conversions::default();
    hcsflow_ops::register(&mut registry);
    hcsflow_stitch::register(&mut registry);
    #[cfg(feature = "wgpu")]
    hcsflow_gpu::register(&mut registry, &mut conversions);
    (registry, conversions)
}
