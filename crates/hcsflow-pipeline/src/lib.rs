//! Pipelines: a plate plus a pipeline file in, processed images and tables out.
//!
//! Three phases, so that every user mistake is found before any pixel is read
//! (semantics.md §2–§3):
//!
//! 1. [`PipelineSpec`] — the TOML file as written ([`spec`]).
//! 2. [`compile`] — plate + pipeline + [`CompileConfig`] → a frozen [`Plan`]:
//!    per step the function chain with chosen implementations, memory types,
//!    device and conversion routes; per well × step the stacks (grouping by
//!    the components that are not variable, numeric order) and output paths.
//! 3. [`execute`] — wells in parallel within a memory budget, each well
//!    isolated (a failing well does not lose the others), resumable through
//!    `OUT/run_manifest.json`, atomic writes, cancellation between wells, one
//!    run at a time per output folder (`OUT/.hcsflow.lock`), or the wells
//!    split into shards run side by side, then merged by [`finalize`].
//!
//! The pipeline receives the functions it may call as a
//! [`Registry`](hcsflow_core::Registry) and their converters as
//! [`Conversions`](hcsflow_core::Conversions): it links no implementation and
//! no GPU runtime. The engine facade (`hcsflow::builtin()`) assembles the ones
//! a build has.

mod compile;
mod error;
mod exec;
mod outdir;
mod output;
mod plate_run;
mod scope;
mod shard;
pub mod spec;
pub mod split;

pub use compile::{
    compile, Action, ArtifactInput, ChainPlan, CompileConfig, GroupPlan, HostCall, InputPlane, Key, MissingPlane, MissingPolicy, OutPlane,
    Plan, PlannedHostWork, Slot, StepPlan, WellPlan, WellStepPlan, COLLAPSED, VARIABLE,
};
pub use error::PipelineError;
pub use exec::{execute, peak_rss_bytes, Progress, RunOptions, RunReport, RunSummary, WellReport};
pub use outdir::LOCK_NAME;
pub use output::manifest::{
    ArtifactRecord, Manifest, Note, OutputRecord, PlateOutputRecord, PlateStepRecord, WellRecord, WellStatus, MANIFEST_NAME,
};
pub use output::tables::{ARTIFACTS_NAME, SUMMARY_NAME};
pub use output::{REPORT_HTML_NAME, REPORT_MQC_NAME, RUN_REPORT_NAME};
pub use scope::{plate_scope_text, PlateGroupPlan, PlatePlane, PlateSampling, PlateStepPlan};
pub use shard::{finalize, prepare_shards, recorded_shards, shard_state, Shard, ShardError, ShardRecord, ShardState, SHARDS_DIR};
pub use spec::{CallSpec, Component, FuncSpec, InputSource, Materialize, MissingGroups, PipelineSpec, Scope, StepSpec, DEFAULT_SAMPLE};
pub use split::{DeviceMemoryError, GpuSplit, NoFit};

pub use hcsflow_zarr::NgffVersion;
