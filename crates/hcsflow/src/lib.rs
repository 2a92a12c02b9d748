//! The hcsflow engine: the one library every front end (the `hcsflow` CLI,
//! the Python package, cluster workers) stands on.
//!
//! The engine crates each have one job ([`core`] stacks, memory types and the
//! function registry; [`plate`] microscope layouts; [`tiff`] and [`zarr`]
//! image files; [`stitch`] tile registration and assembly; [`n2v`] N2V2
//! denoising (the function `n2v_denoise`); [`pipeline`]
//! compile and run). They do not choose which implementations of the
//! functions a build has: this crate does, with cargo features, as ripgrep's
//! `grep` and burn's facades do. It also owns what every front end would
//! otherwise rewrite: device choice and its report ([`choose_device`],
//! [`device_report`]), the options of a run with their defaults
//! ([`RunOptions`]), plate + pipeline → [`Plan`](pipeline::Plan) as one call
//! ([`Engine::plan`]), execution with progress and cancellation
//! ([`Engine::execute`]), one function on one stack ([`Engine::plan_call`],
//! [`Engine::run_call`]), the texts a person reads ([`plan_text`],
//! [`summary_text`], [`run_problems`]) and one error type whose
//! [`kind`](Error::kind) says what to do about it.
//!
//! | feature | default | what it adds |
//! |---|---|---|
//! | `wgpu` | on | GPU implementations on wgpu (CubeCL), the host ↔ wgpu converters and adapter discovery |
//!
//! Without default features the engine is CPU-only: every function keeps its
//! host implementation, no adapter is found, and a GPU request is
//! [`Error::Device`] (never a silent CPU fallback).
//!
//! A whole run: a small synthetic plate, the demo pipeline, on the CPU.
//!
//! ```
//! use std::sync::atomic::AtomicBool;
//! use std::sync::Arc;
//!
//! # fn main() -> Result<(), Box<dyn std::error::Error>> {
//! let dir = tempfile::tempdir()?;
//! let plate = dir.path().join("plate");
//! let config = hcsflow_synth::SynthConfig {
//!     wells: vec!["A01".into()],
//!     size: 64,
//!     z_planes: 2,
//!     ..Default::default()
//! };
//! hcsflow_synth::generate(&config, &plate)?;
//!
//! let engine = hcsflow::Engine::builtin();
//! let options = hcsflow::RunOptions { device: hcsflow::DeviceOptions::cpu(), workers: 1, ..Default::default() };
//! let spec = hcsflow::demo_pipeline()?;
//! let out = dir.path().join("out");
//! let plan = engine.plan_spec(&plate, &spec, &out, &options)?;
//! let cancel = Arc::new(AtomicBool::new(false));
//! let summary = engine.execute(&plan, &options, cancel, &|_progress| {})?;
//!
//! assert_eq!(summary.completed, ["A01"]);
//! assert!(hcsflow::run_problems(&summary, "cancelled").is_empty());
//! let text = hcsflow::summary_text(&plan, &summary);
//! assert!(text.starts_with("1 of 1 well(s) complete (0 skipped as already complete), 0 failed, 0 not started;"));
//! assert!(out.join(hcsflow::pipeline::SUMMARY_NAME).is_file());
//! # Ok(())
//! # }
//! ```
//!
//! The functions of this build:
//!
//! ```
//! let (registry, _conversions) = hcsflow::builtin();
//! let max = registry.get("max_projection").expect("a built-in function");
//! assert!(max.memory_types().contains(&hcsflow::core::MemoryType::Host));
//! ```

mod catalogue;
mod demo;
mod device;
mod engine;
mod error;
pub mod mega_flex;
mod options;
mod text;

pub use hcsflow_core as core;
pub use hcsflow_n2v as n2v;
pub use hcsflow_pipeline as pipeline;
pub use hcsflow_plate as plate;
pub use hcsflow_report as report;
pub use hcsflow_stitch as stitch;
pub use hcsflow_tiff as tiff;
pub use hcsflow_zarr as zarr;

pub use catalogue::FunctionListing;
pub use demo::{demo_pipeline, DEMO_PIPELINE, DEMO_PIPELINE_ORIGIN};
pub use device::{choose_device, default_gpu_memory, device_report, discover_adapters, software_gpu_allowed, DeviceOptions, DeviceReport};
pub use engine::{Engine, PreparedCall};
pub use error::{Error, ErrorKind, OptionsError};
pub use options::{default_workers, parse_size, RunOptions};
pub use text::{budget_warning, plan_text, run_problems, start_text, summary_text, RunProblem};

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
    hcsflow_n2v::register(&mut registry);
    #[cfg(feature = "wgpu")]
    hcsflow_gpu::register(&mut registry, &mut conversions);
    (registry, conversions)
}
