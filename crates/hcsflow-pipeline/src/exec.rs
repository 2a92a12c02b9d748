//! Execute a [`Plan`]: wells in parallel within a memory budget, each well
//! isolated, resumable, with atomic writes and a report.
//!
//! Contract:
//! - One run at a time per output folder: `OUT/.hcsflow.lock` is locked for
//!   the whole run (released by the OS when the process ends, even killed);
//!   a second run into OUT is refused before it writes anything. Shards
//!   ([`RunOptions::shard`]) hold it shared and run side by side, each with
//!   its own manifest and no plate-level output ([`crate::shard`]).
//! - OUT holding another run (its manifest names another pipeline digest or
//!   plate) is refused, unless [`RunOptions::overwrite`]: then what that
//!   manifest lists, and only that, is removed first.
//! - hcsflow's own temporaries left in OUT by a killed run are removed at the
//!   start (under the lock; only names [`hcsflow_io::is_temp_name`] matches).
//! - A well's failure (unreadable TIFF, function error, even a panic) is
//!   recorded with its reason; the other wells run to the end. The run's
//!   [`RunSummary::failed`] lists them; the CLI exits non-zero. A failure
//!   because the output file system takes no more data (full, over quota,
//!   read-only) stops starting wells: the rest are recorded "not started"
//!   with that reason ([`RunSummary::stopped`]).
//! - Missing images follow [`Plan::missing_policy`]: under skip-well a well
//!   with one is recorded failed (naming them) and not run; under fill every
//!   plane filled with zeros is listed (manifest per well, report, notes).
//! - After every well, `OUT/run_manifest.json` is rewritten atomically
//!   (temporary file, then rename) with the outcome of every well so far
//!   (complete, failed, and at the end not started). A failed write is
//!   retried (compact JSON); if it still fails the run goes on and returns its
//!   summary with [`RunSummary::manifest_error`] naming the wells the file on
//!   disk misses. [`RunOptions::resume`] skips wells recorded complete by a
//!   run of the same pipeline (same digest) on the same plate.
//! - Every image file is written atomically by `hcsflow-tiff`; cancellation
//!   ([`RunOptions::cancel`]) stops *starting* wells, in-flight wells finish,
//!   so no half-written file is ever visible under its final name. A write
//!   that fails removes its temporary.
//! - Nothing is written inside the input plate (compile refuses such outputs).
//! - Plate-wide steps (`scope = "plate"`) run first, once, before any well
//!   ([`crate::plate_run`]: bounded memory, results written and recorded,
//!   re-read under `--resume`); each well's consumers get the result of their
//!   group. A plate-wide step that fails stops the run before any well starts.
//! - `execute` returns `Err` only for problems found before any well starts
//!   (OUT not writable or locked by another run, another run's outputs, the
//!   first manifest write, a plate-wide step that failed); everything later
//!   is in the [`RunSummary`].

use std::collections::{BTreeMap, VecDeque};
use std::panic::AssertUnwindSafe;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Condvar, Mutex};
use std::time::Instant;

use hcsflow_core::queue::queue_slot_of_worker;
use hcsflow_core::{
    Array, ArtifactKind, CallContext, CallPlan, Conversions, Device, FunctionError, PlaneInfo, QueueId, QueueScope, Registry, Route, Stack,
    StackInfo, Table, TransferMeter, Transfers,
};
pub use hcsflow_io::peak_rss_bytes;
use hcsflow_plate::{ImageError, PlaneAt};
use rayon::prelude::*;
use serde::{Deserialize, Serialize};

use crate::compile::{scope_text, Action, GroupPlan, InputPlane, Key, MissingPlane, MissingPolicy, Plan, Slot, StepPlan, WellPlan};
use crate::outdir;
use crate::output::manifest::{ArtifactRecord, Manifest, ManifestState, Note, OutputRecord, WellRecord, WellStatus};
use crate::output::tables::{write_artifact_tables, write_summary_csv, write_well_artifact};
use crate::output::zarr::ZarrOutput;
use crate::output::{self};
use crate::plate_run::{run_plate_steps, PlateResults};
use crate::shard::Shard;
use crate::spec::Component;
use crate::spec::{InputSource, Materialize};
use crate::split::{ChainError, ChainRun, DeviceMemoryError, GpuSplit};
use crate::PipelineError;

/// How to run.
#[derive(Debug, Clone)]
pub struct RunOptions {
    /// Wells processed at the same time (≥ 1).
    pub workers: usize,
    /// Bytes the wells in flight may use (by [`WellPlan::estimate_bytes`]);
    /// a well that alone exceeds it still runs, alone.
    pub max_memory: Option<u64>,
    /// Skip wells the manifest records complete.
    pub resume: bool,
    /// Set (e.g. by Ctrl-C) to stop starting wells.
    pub cancel: Arc<AtomicBool>,
    /// NGFF version of the OME-Zarr plates (`materialize = ["zarr"]`).
    pub zarr_format: hcsflow_zarr::NgffVersion,
    /// Run even if OUT holds another run's outputs (another pipeline or
    /// plate): remove what its manifest lists first. Not with `resume`.
    pub overwrite: bool,
    /// Run only this shard's wells, side by side with the other shards
    /// (see the `shard` module: its own manifest, no plate-level outputs; always
    /// resuming its complete wells). Not with `overwrite`.
    pub shard: Option<Shard>,
    /// Device-memory budget in bytes of one GPU call on one stack (input,
    /// output and scratch: [`hcsflow_core::CallPlan::working_set`]); a stack
    /// over it runs in chunks of planes where its functions allow
    /// ([`crate::split`]), else its well fails with the sizes. `None`: no
    /// budget (stacks split only when the device runs out of memory). The
    /// facade sets the adapter's largest binding by default.
    pub gpu_memory: Option<u64>,
    /// Whether `gpu_memory` was asked for (`--gpu-memory`): then a call over
    /// it that cannot run in chunks fails its well before it runs. A default
    /// budget (a guess at what the device holds) only chooses chunks: such a
    /// call runs whole and fails only if the device runs out of memory.
    pub gpu_memory_firm: bool,
}

impl Default for RunOptions {
    fn default() -> Self {
        RunOptions {
            workers: 1,
            max_memory: None,
            resume: false,
            cancel: Arc::new(AtomicBool::new(false)),
            zarr_format: Default::default(),
            overwrite: false,
            shard: None,
            gpu_memory: None,
            gpu_memory_firm: false,
        }
    }
}

/// Progress events, for the CLI to print.
#[derive(Debug, Clone)]
pub enum Progress<'a> {
    Skipped {
        well: &'a str,
    },
    Started {
        well: &'a str,
    },
    /// The well (on the worker running it) starts step `index` (0-based) of `steps`.
    StepStarted {
        well: &'a str,
        step: &'a str,
        index: usize,
        steps: usize,
    },
    Finished {
        well: &'a str,
        done: usize,
        total: usize,
        seconds: f64,
        error: Option<&'a str>,
    },
    /// A plate-wide step starts, before any well: `planes` sampled planes in
    /// `groups` groups (one result each).
    PlateStepStarted {
        step: &'a str,
        groups: usize,
        planes: usize,
    },
    /// A plate-wide step ended: it ran, or (`reused`) its results were re-read
    /// from an earlier run under `--resume`; `error` when it failed, which
    /// stops the run before any well.
    PlateStepFinished {
        step: &'a str,
        seconds: f64,
        reused: bool,
        error: Option<&'a str>,
    },
}

/// One step in one well: where it ran, what it copied to and from the GPU,
/// and its times (seconds).
#[derive(Debug, Clone, Default, Serialize, Deserialize)]
pub struct StepTiming {
    pub step: String,
    pub read: f64,
    pub compute: f64,
    pub write: f64,
    /// Wall time of the step in this well, from its first read to its last write.
    #[serde(default)]
    pub seconds: f64,
    pub stacks: usize,
    /// The devices its calls were planned on (`cpu`, `gpu:0`), each once.
    #[serde(default)]
    pub devices: Vec<String>,
    /// Host ↔ GPU copies of its stacks, counted where they happened (the GPU
    /// runtime's uploads and read-backs), with the adapters that made them:
    /// the proof that a GPU step ran on the GPU.
    #[serde(default)]
    pub transfers: Transfers,
    /// Stacks that ran in chunks of planes on the GPU (over the budget, or
    /// out of device memory), and how.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub splits: Vec<GpuSplit>,
}

/// One well in the report.
#[derive(Debug, Clone, Serialize)]
pub struct WellReport {
    pub well: String,
    pub status: WellStatus,
    pub seconds: f64,
    /// Why it failed or was not started.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub error: Option<String>,
    pub steps: Vec<StepTiming>,
    pub bytes_read: u64,
    #[serde(skip_serializing_if = "Vec::is_empty")]
    pub notes: Vec<Note>,
    /// Missing images used as planes of zeros (`--missing fill`).
    #[serde(skip_serializing_if = "Vec::is_empty")]
    pub filled: Vec<MissingPlane>,
    /// The GPU adapter its GPU calls ran on (`gpu:1`, [`WellPlan::gpu`]).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub adapter: Option<String>,
    /// The queue of that adapter they were submitted to (`gpu:1/q0`): the
    /// queue of the worker that ran the well ([`hcsflow_core::queue`]).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub queue: Option<String>,
}

/// A function chain of a step, for the report.
#[derive(Debug, Clone, Serialize)]
pub struct ChainReport {
    #[serde(skip_serializing_if = "Option::is_none")]
    pub group: Option<String>,
    /// `name (memory_in → memory_out on device)`.
    pub functions: Vec<String>,
    /// Route into each call, then back to the host.
    pub routes: Vec<Route>,
}

/// One step in the report: its chains, total times and GPU copies over wells.
#[derive(Debug, Clone, Serialize)]
pub struct StepReport {
    pub name: String,
    pub chains: Vec<ChainReport>,
    pub read_seconds: f64,
    pub compute_seconds: f64,
    pub write_seconds: f64,
    /// Host ↔ GPU copies of the step in all wells, and the adapters that made them.
    pub transfers: Transfers,
    /// Stacks of the step that ran in chunks on the GPU, all wells (each
    /// well's steps say how).
    pub split_stacks: usize,
}

/// A failed well.
#[derive(Debug, Clone, Serialize)]
pub struct Failure {
    pub well: String,
    pub error: String,
}

/// What `--report` writes.
#[derive(Debug, Clone, Serialize)]
pub struct RunReport {
    pub pipeline: String,
    pub plate: PathBuf,
    pub out: PathBuf,
    pub device: String,
    pub device_reason: String,
    pub workers: usize,
    pub max_memory: Option<u64>,
    /// The device-memory budget of a GPU call on one stack (`--gpu-memory`,
    /// by default the adapter's largest binding); `None` on the CPU.
    pub gpu_memory: Option<u64>,
    pub seconds: f64,
    /// Bytes of input planes of the wells processed in this run.
    pub input_bytes: u64,
    pub mb_per_s: f64,
    /// Peak resident set size of the process (VmHWM), if known.
    pub peak_rss_bytes: Option<u64>,
    pub steps: Vec<StepReport>,
    pub wells: Vec<WellReport>,
    pub failures: Vec<Failure>,
    /// What functions said about their results, all wells (also in `wells`).
    pub notes: Vec<Note>,
    /// What was done with missing images: "error", "skip-well" or "fill".
    pub missing_policy: String,
    /// Missing images used as planes of zeros, all wells (also in `wells`).
    pub filled: Vec<MissingPlane>,
    /// Why the run stopped starting wells (the output file system is full…).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub stopped: Option<String>,
    /// The manifest could not be written (see [`RunSummary::manifest_error`]).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub manifest_error: Option<String>,
    /// Plate-level outputs that could not be written (summaries, tables, OME-Zarr metadata).
    #[serde(skip_serializing_if = "Vec::is_empty")]
    pub write_errors: Vec<String>,
}

/// The outcome of a run.
#[derive(Debug, Clone)]
pub struct RunSummary {
    pub total: usize,
    pub completed: Vec<String>,
    pub skipped: Vec<String>,
    pub failed: Vec<Failure>,
    /// Wells not started because the run was cancelled or `stopped`.
    pub not_started: Vec<String>,
    /// Why the run stopped starting wells on its own (the output file system
    /// is full, over quota or read-only); `None` if it did not, or was cancelled.
    pub stopped: Option<String>,
    /// Missing images used as planes of zeros (`--missing fill`), in the
    /// wells complete in this run or an earlier one.
    pub filled: Vec<MissingPlane>,
    /// `OUT/run_manifest.json` could not be written at the end: the error
    /// and the wells whose outcome the file on disk misses or misstates.
    pub manifest_error: Option<String>,
    /// Plate-level outputs that could not be written (OME-Zarr metadata,
    /// `summary.csv`, artifact tables): each error names its file.
    pub write_errors: Vec<String>,
    /// OME-Zarr plates written (`materialize = ["zarr"]`).
    pub zarr_plates: Vec<PathBuf>,
    /// Plate-level artifact tables written (`OUT/<step>/<artifact>.csv`).
    pub artifact_tables: Vec<PathBuf>,
    /// A finalize ([`crate::finalize`]): the shards that did not run or did
    /// not complete all their wells, one text each (e.g. `shard 2/3 did not
    /// run (well(s) A03, A04)`); re-run them, then finalize again.
    pub shard_problems: Vec<String>,
    /// The shard this run was ([`RunOptions::shard`]): it wrote its wells'
    /// outputs only, no plate-level output.
    pub shard: Option<Shard>,
    pub report: RunReport,
}

fn io_err(path: &Path) -> impl Fn(std::io::Error) -> PipelineError + '_ {
    move |e| PipelineError::io(path, e)
}

/// Why a well failed. Its text is what the manifest and the report record;
/// its [source](std::error::Error::source) chain keeps the operating
/// system's error when one caused it ([`storage_exhausted`] reads it).
#[derive(Debug, thiserror::Error)]
pub(crate) enum WellError {
    /// A step of the well failed.
    #[error("step '{step}': {source}")]
    Step { step: String, source: StepError },
    /// The well was not run (missing images under `--missing skip-well`) or panicked.
    #[error("{0}")]
    NotRun(String),
}

/// Why a step of a well failed.
#[derive(Debug, thiserror::Error)]
pub(crate) enum StepError {
    /// Plan and data disagree, a function failed, a chain returned the wrong
    /// planes…: what the text says.
    #[error("{0}")]
    Failed(String),
    /// The operating system refused an operation on `path`.
    #[error("{path}: {source}")]
    Io { path: PathBuf, source: std::io::Error },
    /// An image could not be read or written.
    #[error(transparent)]
    Image(Box<hcsflow_tiff::TiffError>),
    /// A table could not be written.
    #[error(transparent)]
    Output(Box<PipelineError>),
    /// An OME-Zarr plane could not be read or written.
    #[error("OME-Zarr: {0}")]
    Zarr(#[source] Box<hcsflow_zarr::ZarrError>),
    /// A function of the chain failed; its error keeps its kind (invalid
    /// input, too large, out of device memory…) as this error's source.
    #[error(transparent)]
    Function(Box<FunctionFailure>),
    /// A stack did not fit the GPU's memory budget, whole or in chunks.
    #[error("stack at {at}: {source}")]
    DeviceMemory { at: String, source: Box<DeviceMemoryError> },
}

/// A function of a chain that failed on the stack at `at`.
#[derive(Debug, thiserror::Error)]
#[error("stack at {at}: {source}")]
pub(crate) struct FunctionFailure {
    at: String,
    source: FunctionError,
}

impl From<hcsflow_tiff::TiffError> for StepError {
    fn from(e: hcsflow_tiff::TiffError) -> Self {
        StepError::Image(Box::new(e))
    }
}

impl From<PipelineError> for StepError {
    fn from(e: PipelineError) -> Self {
        StepError::Output(Box::new(e))
    }
}

impl StepError {
    pub(crate) fn io(path: &Path, source: std::io::Error) -> Self {
        StepError::Io { path: path.to_path_buf(), source }
    }
}

/// True if `error` was caused by an operating-system error meaning that the
/// output file system takes no more data: full (ENOSPC), over quota (EDQUOT)
/// or read-only (EROFS), found as a [`std::io::Error`] anywhere in its
/// [source](std::error::Error::source) chain.
pub(crate) fn storage_exhausted(error: &(dyn std::error::Error + 'static)) -> bool {
    use std::io::ErrorKind::{QuotaExceeded, ReadOnlyFilesystem, StorageFull};
    std::iter::successors(Some(error), |e| e.source())
        .filter_map(|e| e.downcast_ref::<std::io::Error>())
        .any(|e| matches!(e.kind(), StorageFull | QuotaExceeded | ReadOnlyFilesystem))
}

/// Runs `plan` (see the module's contract). Returns `Err` only for problems
/// found before any well starts: OUT not writable, OUT in use by another run
/// (its lock), OUT holding another run's outputs without
/// [`RunOptions::overwrite`], a manifest from another run under `--resume`;
/// all of these but I/O errors are usage errors ([`PipelineError::is_usage`]).
/// Per-well failures and later write errors are in the [`RunSummary`].
pub fn execute(
    plan: &Plan,
    registry: &Registry,
    conversions: &Conversions,
    options: &RunOptions,
    progress: &(dyn Fn(Progress<'_>) + Sync),
) -> Result<RunSummary, PipelineError> {
    let started = Instant::now();
    let Prepared { locks: _locks, state, zarr, plate, plate_notes, wells } = match options.shard {
        None => prepare_run(plan, registry, conversions, options, progress)?,
        Some(shard) => crate::shard::prepare(plan, shard, registry, conversions, options, progress)?,
    };

    let mut skipped = Vec::new();
    let mut queue = VecDeque::new();
    for &i in &wells {
        let w = &plan.wells[i];
        if state.manifest.wells.contains_key(&w.well) {
            progress(Progress::Skipped { well: &w.well });
            skipped.push(w.well.clone());
        } else {
            queue.push_back(i);
        }
    }
    let workers = options.workers.max(1).min(queue.len().max(1));
    let run = Run {
        plan,
        registry,
        conversions,
        options,
        progress,
        zarr: &zarr,
        plate: &plate,
        total: wells.len(),
        queue: Mutex::new(queue),
        budget: MemoryBudget::new(options.max_memory),
        manifest: Mutex::new(state),
        reports: Mutex::new(Vec::new()),
        done: Mutex::new(skipped.len()),
        stopped: Mutex::new(None),
    };
    std::thread::scope(|scope| {
        for worker in 0..workers {
            let run = &run;
            scope.spawn(move || run.run_worker(worker));
        }
    });
    let Run { queue, manifest, reports, stopped, total, .. } = run;
    let stopped = stopped.into_inner().unwrap_or_else(|p| p.into_inner());
    let state = manifest.into_inner().unwrap_or_else(|p| p.into_inner());
    let wells = reports.into_inner().unwrap_or_else(|p| p.into_inner());
    let not_started: Vec<String> =
        queue.into_inner().unwrap_or_else(|p| p.into_inner()).into_iter().map(|i| plan.wells[i].well.clone()).collect();
    let ended = EndedRun { workers, started, total, skipped, not_started, stopped, wells, plate_notes };
    Ok(ended.finish(plan, options, state, zarr))
}

/// Prepares OUT for the run of `plan`: creates it, takes its lock (held
/// while the returned guard lives), checks and (`--overwrite`) clears what an
/// earlier run left, removes stale temporaries, writes the first manifest
/// (under `--resume`, with the wells complete before) and opens the OME-Zarr
/// plates.
fn prepare_out(plan: &Plan, options: &RunOptions) -> Result<(outdir::OutputLock, Manifest, ZarrOutput), PipelineError> {
    std::fs::create_dir_all(&plan.out).map_err(io_err(&plan.out))?;
    let lock = outdir::lock(&plan.out, plan)?;
    let previous = outdir::previous_manifest(&plan.out)?;
    outdir::check_previous(previous.as_ref(), plan, options.resume, options.overwrite)?;
    if let (true, Some(previous)) = (options.overwrite, &previous) {
        let removed = outdir::remove_recorded(&plan.out, previous, &plan.plate_root)?;
        tracing::info!("--overwrite: removed {removed} output(s) of the previous run in {}", plan.out.display());
    }
    let layouts = output::zarr::layouts(plan, &plan.channel_names, options.zarr_format);
    let zarr_roots: Vec<PathBuf> = layouts.iter().map(|l| l.root.clone()).collect();
    let stale = outdir::remove_stale_temps(&plan.out, plan, previous.as_ref(), &zarr_roots);
    if stale > 0 {
        tracing::info!("removed {stale} temporary file(s) left in {} by an interrupted run", plan.out.display());
    }
    let mut manifest = Manifest::new(plan, &zarr_roots);
    if let (true, Some(previous)) = (options.resume, previous) {
        manifest.wells = previous.wells.into_iter().filter(|(_, r)| r.status == WellStatus::Complete).collect();
        manifest.plate_steps = previous.plate_steps.into_iter().filter(|(_, r)| r.status == WellStatus::Complete).collect();
    }
    manifest.write(&plan.out)?;
    let zarr = ZarrOutput::open(layouts)?;
    Ok((lock, manifest, zarr))
}

/// What a run has before its wells start: the locks it holds for its whole
/// length, its manifest, its OME-Zarr plates, the plate-wide steps' results,
/// and the wells it is for.
pub(crate) struct Prepared {
    pub(crate) locks: Vec<outdir::OutputLock>,
    /// Wells complete before (`--resume`, a shard re-run) are in its manifest.
    pub(crate) state: ManifestState,
    pub(crate) zarr: ZarrOutput,
    pub(crate) plate: PlateResults,
    /// What the plate-wide steps' functions said.
    pub(crate) plate_notes: Vec<Note>,
    /// The wells of this run, as indices into [`Plan::wells`]: all of them, or a shard's.
    pub(crate) wells: Vec<usize>,
}

/// [`Prepared`] for a whole run: [`prepare_out`], then the plate-wide steps.
fn prepare_run(
    plan: &Plan,
    registry: &Registry,
    conversions: &Conversions,
    options: &RunOptions,
    progress: &(dyn Fn(Progress<'_>) + Sync),
) -> Result<Prepared, PipelineError> {
    let (lock, mut manifest, zarr) = prepare_out(plan, options)?;
    let path = plan.out.join(crate::MANIFEST_NAME);
    let plate = run_plate_steps(plan, registry, conversions, options.resume, &mut manifest, &path, progress)?;
    let plate_notes = manifest.plate_steps.values().flat_map(|r| r.notes.iter().cloned()).collect();
    let on_disk = manifest.wells.iter().map(|(w, r)| (w.clone(), r.status)).collect();
    Ok(Prepared {
        locks: vec![lock],
        state: ManifestState { path, manifest, on_disk, error: None },
        zarr,
        plate,
        plate_notes,
        wells: (0..plan.wells.len()).collect(),
    })
}

/// The `--max-memory` budget of the wells in flight: a counting semaphore
/// over their estimated bytes ([`WellPlan::estimate_bytes`]). A well that
/// alone exceeds the budget still runs, alone.
struct MemoryBudget {
    max: Option<u64>,
    used: Mutex<u64>,
    released: Condvar,
}

/// Bytes taken from a [`MemoryBudget`], given back when dropped.
struct Reservation<'a> {
    budget: &'a MemoryBudget,
    bytes: u64,
}

impl MemoryBudget {
    fn new(max: Option<u64>) -> MemoryBudget {
        MemoryBudget { max, used: Mutex::new(0), released: Condvar::new() }
    }

    /// Waits until `bytes` fit the budget (or nothing else is in flight) and
    /// takes them; `None` if the budget's lock is poisoned.
    fn reserve(&self, bytes: u64) -> Option<Reservation<'_>> {
        let mut used = self.used.lock().ok()?;
        if let Some(max) = self.max {
            while *used > 0 && *used + bytes > max {
                used = self.released.wait(used).unwrap_or_else(|p| p.into_inner());
            }
        }
        *used += bytes;
        Some(Reservation { budget: self, bytes })
    }
}

impl Drop for Reservation<'_> {
    fn drop(&mut self) {
        if let Ok(mut used) = self.budget.used.lock() {
            *used = used.saturating_sub(self.bytes);
        }
        self.budget.released.notify_all();
    }
}

/// What the workers of one run share.
struct Run<'a> {
    plan: &'a Plan,
    registry: &'a Registry,
    conversions: &'a Conversions,
    options: &'a RunOptions,
    progress: &'a (dyn Fn(Progress<'_>) + Sync),
    zarr: &'a ZarrOutput,
    /// The plate-wide steps' results, for the wells' consumers.
    plate: &'a PlateResults,
    /// Wells of this run (the plate's, or a shard's).
    total: usize,
    /// Wells not started yet, as indices into [`Plan::wells`].
    queue: Mutex<VecDeque<usize>>,
    budget: MemoryBudget,
    manifest: Mutex<ManifestState>,
    reports: Mutex<Vec<WellReport>>,
    /// Wells finished (or skipped), for progress.
    done: Mutex<usize>,
    /// Set when the output file system takes no more data: start no more wells.
    stopped: Mutex<Option<String>>,
}

impl Run<'_> {
    fn stop(&self, reason: String) {
        if let Ok(mut s) = self.stopped.lock() {
            s.get_or_insert(reason);
        }
    }

    /// True once the run was cancelled or stopped: start no more wells.
    fn halted(&self) -> bool {
        self.options.cancel.load(Ordering::SeqCst) || self.stopped.lock().map(|s| s.is_some()).unwrap_or(true)
    }

    /// One worker (`worker`, 0-based): takes wells off the queue until it is
    /// empty or the run halts, each within the memory budget, and records
    /// each outcome. Its wells' GPU work goes to its own queue of their
    /// adapter ([`queue_slot_of_worker`]).
    fn run_worker(&self, worker: usize) {
        loop {
            if self.halted() {
                break;
            }
            let Some(i) = self.queue.lock().ok().and_then(|mut q| q.pop_front()) else { break };
            let well = &self.plan.wells[i];
            let Some(reservation) = self.budget.reserve(well.estimate_bytes) else { break };
            if self.halted() {
                if let Ok(mut q) = self.queue.lock() {
                    q.push_front(i);
                }
                break;
            }
            (self.progress)(Progress::Started { well: &well.well });
            let t0 = Instant::now();
            let missing: Vec<&MissingPlane> = self.plan.missing.iter().filter(|m| m.well == well.well).collect();
            let queue = well.gpu.map(|adapter| QueueId { adapter, slot: queue_slot_of_worker(worker) });
            let result = self.run_isolated(well, queue, &missing);
            drop(reservation);
            let seconds = t0.elapsed().as_secs_f64();
            let (record, mut report) = self.outcome(well, result, missing, seconds);
            report.adapter = queue.map(|q| Device::Gpu(q.adapter).to_string());
            report.queue = queue.map(|q| q.to_string());
            self.record(well, record, report, seconds);
        }
    }

    /// Runs `well` (its GPU calls on `queue`), a panic included in its
    /// failure; under skip-well a well with `missing` images is not run.
    fn run_isolated(&self, well: &WellPlan, queue: Option<QueueId>, missing: &[&MissingPlane]) -> WellResult {
        if self.plan.missing_policy != MissingPolicy::Fill && !missing.is_empty() {
            // Compile refuses missing images under `error`: this is skip-well.
            return Err((WellError::NotRun(skipped_for_missing(missing)), Vec::new()));
        }
        // Trace spans (`hcsflow run --trace`): well > step > read | stack > call | conversion, and write.
        let span = tracing::info_span!("well", well = %well.well, queue = tracing::field::Empty);
        if let Some(q) = queue {
            span.record("queue", tracing::field::display(q));
        }
        std::panic::catch_unwind(AssertUnwindSafe(|| {
            let engine = Engine {
                registry: self.registry,
                conversions: self.conversions,
                gpu_memory: self.options.gpu_memory,
                gpu_memory_firm: self.options.gpu_memory_firm,
                queue,
            };
            span.in_scope(|| run_well(self.plan, well, &engine, self.zarr, self.plate, self.progress))
        }))
        .unwrap_or_else(|p| {
            let msg = p
                .downcast_ref::<String>()
                .cloned()
                .or_else(|| p.downcast_ref::<&str>().map(|s| s.to_string()))
                .unwrap_or_else(|| "unknown panic".into());
            Err((WellError::NotRun(format!("internal error (panic): {msg}")), Vec::new()))
        })
    }

    /// The manifest record and the report of a well that ran; a failure
    /// because the output file system takes no more data stops the run.
    fn outcome(&self, well: &WellPlan, result: WellResult, missing: Vec<&MissingPlane>, seconds: f64) -> (WellRecord, WellReport) {
        match result {
            Ok(WellOutcome { outputs, artifacts, mut notes, timings }) => {
                let filled: Vec<MissingPlane> = missing.into_iter().cloned().collect();
                let step = well.steps.first().map(|ws| self.plan.steps[ws.step].name.clone()).unwrap_or_default();
                notes.extend(filled.iter().map(|m| Note { well: well.well.clone(), step: step.clone(), text: filled_text(m) }));
                let record = WellRecord {
                    status: WellStatus::Complete,
                    seconds,
                    error: None,
                    outputs,
                    artifacts,
                    notes: notes.clone(),
                    filled: filled.clone(),
                };
                let report = WellReport { steps: timings, bytes_read: well.input_bytes, notes, filled, ..record.report(&well.well) };
                (record, report)
            }
            Err((error, steps)) => {
                if storage_exhausted(&error) {
                    self.stop(format!("the output file system takes no more data: well {} failed with: {error}", well.well));
                }
                let record = WellRecord::ended(WellStatus::Failed, seconds, Some(error.to_string()));
                let report = WellReport { steps, ..record.report(&well.well) };
                (record, report)
            }
        }
    }

    /// Writes `well`'s outcome to the manifest and the report, and says so.
    fn record(&self, well: &WellPlan, record: WellRecord, report: WellReport, seconds: f64) {
        let error = report.error.clone();
        if let Ok(mut m) = self.manifest.lock() {
            m.record(&well.well, record);
            if let Some(e) = m.error.as_ref().filter(|e| storage_exhausted(*e)) {
                self.stop(format!("the output file system takes no more data: the run manifest could not be written: {e}"));
            }
        }
        if let Ok(mut r) = self.reports.lock() {
            r.push(report);
        }
        let n = self.done.lock().map(|mut d| {
            *d += 1;
            *d
        });
        let total = self.total;
        (self.progress)(Progress::Finished { well: &well.well, done: n.unwrap_or(0), total, seconds, error: error.as_deref() });
    }
}

/// A run whose workers have ended: what [`EndedRun::finish`] turns into the summary.
struct EndedRun {
    workers: usize,
    started: Instant,
    /// Wells of the run.
    total: usize,
    /// Wells complete in an earlier run (`--resume`).
    skipped: Vec<String>,
    /// Wells never started (cancelled or stopped).
    not_started: Vec<String>,
    stopped: Option<String>,
    /// Reports of the wells that ran.
    wells: Vec<WellReport>,
    /// What the plate-wide steps' functions said (this run's or, resumed, an earlier one's).
    plate_notes: Vec<Note>,
}

impl EndedRun {
    /// Records the wells never started in the manifest, writes the
    /// plate-level outputs (OME-Zarr metadata, summaries, joined tables) and
    /// assembles the summary and its report.
    fn finish(self, plan: &Plan, options: &RunOptions, mut state: ManifestState, zarr: ZarrOutput) -> RunSummary {
        let EndedRun { workers, started, total, skipped, not_started, stopped, mut wells, plate_notes } = self;
        // Every well's outcome is in the manifest, the wells never started too.
        let why_not = match &stopped {
            Some(reason) => format!("not started: {reason}"),
            None => "not started: the run was interrupted".to_string(),
        };
        for w in &not_started {
            state.manifest.wells.insert(w.clone(), WellRecord::ended(WellStatus::NotStarted, 0.0, Some(why_not.clone())));
        }
        if !not_started.is_empty() || state.error.is_some() {
            state.save();
        }
        let manifest_error =
            state.error.as_ref().map(|e| format!("{e}; the file on disk misses the outcome of well(s) {}", state.unrecorded().join(", ")));
        let manifest = state.manifest;
        // A shard writes no plate-level output: the finalize does, for all shards.
        let PlateOutputs { zarr_plates, artifact_tables, write_errors } = match options.shard {
            None => write_plate_outputs(plan, &manifest, zarr),
            Some(shard) => {
                drop(zarr);
                let timings = crate::shard::write_timings(plan, shard, started.elapsed().as_secs_f64(), &wells);
                PlateOutputs { write_errors: timings.err().map(|e| e.to_string()).into_iter().collect(), ..PlateOutputs::default() }
            }
        };

        for w in &skipped {
            let record = manifest.wells.get(w);
            let notes = record.map(|r| r.notes.clone()).unwrap_or_default();
            let filled = record.map(|r| r.filled.clone()).unwrap_or_default();
            wells.push(WellReport { notes, filled, ..WellRecord::ended(WellStatus::Skipped, 0.0, None).report(w) });
        }
        for w in &not_started {
            wells.push(WellRecord::ended(WellStatus::NotStarted, 0.0, Some(why_not.clone())).report(w));
        }
        let order: BTreeMap<&str, usize> = plan.wells.iter().enumerate().map(|(i, w)| (w.well.as_str(), i)).collect();
        wells.sort_by_key(|w| order.get(w.well.as_str()).copied().unwrap_or(usize::MAX));
        let completed: Vec<String> = wells.iter().filter(|w| w.status == WellStatus::Complete).map(|w| w.well.clone()).collect();
        let mut run = RunOutcome { workers, seconds: started.elapsed().as_secs_f64(), stopped, manifest_error, write_errors };
        let mut report = RunReport::from_wells(plan, options, wells, &run);
        report.notes.splice(0..0, plate_notes);
        if options.shard.is_none() {
            if let Err(e) = crate::output::write_run_report(&plan.out, &report) {
                report.write_errors.push(e.to_string());
                run.write_errors.push(e.to_string());
            }
        }
        RunSummary {
            total,
            completed,
            skipped,
            failed: report.failures.clone(),
            not_started,
            stopped: run.stopped,
            filled: report.filled.clone(),
            manifest_error: run.manifest_error,
            write_errors: run.write_errors,
            zarr_plates,
            artifact_tables,
            shard_problems: Vec::new(),
            shard: options.shard,
            report,
        }
    }
}

/// The plate-level outputs a run writes at its end, and what could not be written.
#[derive(Default)]
pub(crate) struct PlateOutputs {
    pub(crate) zarr_plates: Vec<PathBuf>,
    pub(crate) artifact_tables: Vec<PathBuf>,
    pub(crate) write_errors: Vec<String>,
}

/// Writes the plate-level outputs of a run from its `manifest`: the OME-Zarr
/// plate metadata, `summary.csv`, the joined artifact tables with
/// `artifacts.csv`, and each TIFF step's plate descriptor. Each failure is
/// kept (naming its file) and the others are still written.
pub(crate) fn write_plate_outputs(plan: &Plan, manifest: &Manifest, zarr: ZarrOutput) -> PlateOutputs {
    let mut write_errors = Vec::new();
    let zarr_plates = zarr.finish().unwrap_or_else(|e| {
        write_errors.push(e.to_string());
        Vec::new()
    });
    if let Err(e) = write_summary_csv(&plan.out, manifest) {
        write_errors.push(e.to_string());
    }
    let artifact_tables = write_artifact_tables(plan, manifest).unwrap_or_else(|e| {
        write_errors.push(e.to_string());
        Vec::new()
    });
    if let Err(e) = crate::output::plate::write_output_plates(plan, manifest) {
        write_errors.push(e.to_string());
    }
    PlateOutputs { zarr_plates, artifact_tables, write_errors }
}

/// What a run says about itself besides its wells, for [`RunReport::from_wells`].
pub(crate) struct RunOutcome {
    pub(crate) workers: usize,
    pub(crate) seconds: f64,
    pub(crate) stopped: Option<String>,
    pub(crate) manifest_error: Option<String>,
    pub(crate) write_errors: Vec<String>,
}

impl RunReport {
    /// The report of a run of `plan` from its wells' reports (in plate
    /// order): failures, notes and filled planes gathered, step times summed
    /// over wells, throughput over the run's time.
    pub(crate) fn from_wells(plan: &Plan, options: &RunOptions, wells: Vec<WellReport>, run: &RunOutcome) -> RunReport {
        let failures: Vec<Failure> = wells
            .iter()
            .filter(|w| w.status == WellStatus::Failed)
            .map(|w| Failure { well: w.well.clone(), error: w.error.clone().unwrap_or_default() })
            .collect();
        let filled: Vec<MissingPlane> = wells.iter().flat_map(|w| w.filled.iter().cloned()).collect();
        let input_bytes: u64 = wells.iter().map(|w| w.bytes_read).sum();
        let steps = plan.steps.iter().map(|s| StepReport::of(s, &wells)).collect();
        RunReport {
            pipeline: plan.pipeline_name.clone(),
            plate: plan.plate_root.clone(),
            out: plan.out.clone(),
            device: plan.device.to_string(),
            device_reason: plan.device_reason.clone(),
            workers: run.workers,
            max_memory: options.max_memory,
            gpu_memory: options.gpu_memory,
            seconds: run.seconds,
            input_bytes,
            mb_per_s: if run.seconds > 0.0 { input_bytes as f64 / 1e6 / run.seconds } else { 0.0 },
            peak_rss_bytes: peak_rss_bytes(),
            steps,
            notes: wells.iter().flat_map(|w| w.notes.iter().cloned()).collect(),
            wells,
            failures,
            missing_policy: plan.missing_policy.name().to_string(),
            filled,
            stopped: run.stopped.clone(),
            manifest_error: run.manifest_error.clone(),
            write_errors: run.write_errors.clone(),
        }
    }
}

impl StepReport {
    /// Step `step`'s chains and its times summed over `wells`.
    fn of(step: &StepPlan, wells: &[WellReport]) -> StepReport {
        let timings = wells.iter().flat_map(|w| w.steps.iter().filter(|t| t.step == step.name));
        let (mut r, mut c, mut wr) = (0.0, 0.0, 0.0);
        let mut transfers = Transfers::default();
        let mut split_stacks = 0;
        for t in timings {
            r += t.read;
            c += t.compute;
            wr += t.write;
            transfers.add(&t.transfers);
            split_stacks += t.splits.len();
        }
        let chains = step
            .chains
            .iter()
            .map(|ch| ChainReport {
                group: ch.label.clone(),
                functions: ch
                    .calls
                    .iter()
                    .map(|c| format!("{} ({} → {} on {})", c.function, c.implementation.memory_in, c.implementation.memory_out, c.device))
                    .collect(),
                routes: ch.calls.iter().map(|c| c.route_in).chain([ch.route_out]).collect(),
            })
            .collect();
        StepReport { name: step.name.clone(), chains, read_seconds: r, compute_seconds: c, write_seconds: wr, transfers, split_stacks }
    }
}

/// The failure of a well not run under `--missing skip-well`: its missing images.
fn skipped_for_missing(missing: &[&MissingPlane]) -> String {
    const LISTED: usize = 10;
    let mut text = format!("not run: {} missing image(s) (--missing skip-well): ", missing.len());
    let listed: Vec<String> = missing.iter().take(LISTED).map(|m| m.to_string()).collect();
    text.push_str(&listed.join("; "));
    if missing.len() > LISTED {
        text.push_str(&format!("; … and {} more", missing.len() - LISTED));
    }
    text
}

/// The note for a missing image used as a plane of zeros (`--missing fill`).
fn filled_text(m: &MissingPlane) -> String {
    format!("missing image filled with zeros (--missing fill): {m}")
}

/// Planes of the well currently held in memory, by key.
type Planes = BTreeMap<Key, Stack>;

/// Each group of a step that reads the plate, with its input planes. A chain
/// over several planes gets them as one stack read straight from the files
/// (`hcsflow_tiff::read_stacks_expecting`: no per-plane stacks to
/// concatenate); other groups, and any group whose files that read refuses,
/// get one stack per file, as read by [`read_planes`] (whose errors name the
/// file). Every file must be one page of the plan's plane size and dtype,
/// checked from its tags before its pixels are decoded. A missing image is a
/// plane of zeros.
fn load<'g>(plan: &Plan, well: &WellPlan, groups: &'g [GroupPlan]) -> Result<Vec<(&'g GroupPlan, Vec<Stack>)>, StepError> {
    let (h, w, dtype) = plan.plane;
    let expected = hcsflow_tiff::Expected::one_plane(hcsflow_tiff::PlaneFormat::new(h, w, dtype));
    let files: BTreeMap<Key, &InputPlane> = well.inputs.iter().map(|i| (i.key, i)).collect();
    groups
        .par_iter()
        .map(|g| {
            let inputs = g
                .inputs
                .iter()
                .map(|k| files.get(k).copied().ok_or_else(|| unavailable(k)))
                .collect::<Result<Vec<&InputPlane>, StepError>>()?;
            // One read of several files applies to one-plane files only.
            let paths: Option<Vec<&Path>> = inputs.iter().map(|i| i.path.as_deref().filter(|_| i.at.is_none())).collect();
            let planes = match (&g.action, paths) {
                (Action::Skip, _) => Vec::new(),
                (Action::Chain(_), Some(paths)) if paths.len() > 1 => match hcsflow_tiff::read_stacks_expecting(&paths, expected) {
                    Ok(stack) if stack.depth() == paths.len() => vec![stack],
                    _ => read_planes(plan, &inputs)?,
                },
                _ => read_planes(plan, &inputs)?,
            };
            Ok((g, planes))
        })
        .collect()
}

/// One one-plane stack per input, in parallel; a missing image is zeros
/// under [`MissingPolicy::Fill`] (execute reports it), an error otherwise.
/// Each file must be one page of the plan's plane size and dtype, checked
/// from its tags before its pixels are decoded (the error names the file and
/// both sizes and dtypes), so a small file claiming a huge image fails its
/// well without the memory it claims; an OME-Zarr array's planes likewise,
/// from its metadata ([`hcsflow_plate::read_image`]).
fn read_planes(plan: &Plan, inputs: &[&InputPlane]) -> Result<Vec<Stack>, StepError> {
    let (h, w, dtype) = plan.plane;
    inputs
        .par_iter()
        .map(|input| match &input.path {
            None if plan.missing_policy == MissingPolicy::Fill => Ok(Stack::zeros(dtype, [1, h, w])),
            None => {
                Err(StepError::Failed(format!("{}: the image is missing (policy --missing {})", input.rel.display(), plan.missing_policy)))
            }
            Some(p) => read_plate_image(plan, p, input.at.as_ref()),
        })
        .collect()
}

/// The plate image at `path` (`at` inside it, for a container) as a
/// one-plane stack of the plan's plane size and dtype
/// ([`hcsflow_plate::read_image`]), its error naming the file: the one read
/// of a plate image for per-well and plate-wide steps alike.
pub(crate) fn read_plate_image(plan: &Plan, path: &Path, at: Option<&PlaneAt>) -> Result<Stack, StepError> {
    hcsflow_plate::read_image(path, at, plan.plane).map_err(|e| match e {
        ImageError::Tiff(hcsflow_tiff::TiffError::PageCount { path, found, .. }) => {
            StepError::Failed(format!("{}: {found} pages; plate images have one plane each", path.display()))
        }
        ImageError::Tiff(e) => StepError::from(e),
        ImageError::Zarr(e) => StepError::Zarr(Box::new(e)),
    })
}

/// The error for a plane the plan expects and neither the plate nor the previous step has.
fn unavailable(k: &Key) -> StepError {
    StepError::Failed(format!("plane {} is not available (plan and data disagree)", key_text(k)))
}

/// Each group of a step with the planes the previous step left, moved (not copied).
fn hand_out(mut input: Planes, groups: &[GroupPlan]) -> Result<Vec<(&GroupPlan, Vec<Stack>)>, StepError> {
    groups
        .iter()
        .map(|g| {
            let planes =
                g.inputs.iter().map(|k| input.remove(k).ok_or_else(|| unavailable(k))).collect::<Result<Vec<Stack>, StepError>>()?;
            Ok((g, planes))
        })
        .collect()
}

/// What a complete well produced.
struct WellOutcome {
    outputs: Vec<OutputRecord>,
    artifacts: Vec<ArtifactRecord>,
    notes: Vec<Note>,
    timings: Vec<StepTiming>,
}

type WellResult = Result<WellOutcome, (WellError, Vec<StepTiming>)>;

/// An artifact table produced for one stack. Row planes index `keys` (the
/// planes of the call that produced it); `scope` is the stack's group scope.
#[derive(Debug, Clone)]
pub(crate) struct Produced {
    pub(crate) name: String,
    pub(crate) table: Table,
    pub(crate) keys: Vec<Key>,
    pub(crate) scope: Key,
}

/// Artifacts of the steps run so far in a well, by (step, group).
type ProducedByGroup = BTreeMap<(usize, usize), Vec<Produced>>;

/// What one stack's chain returned.
struct GroupResult {
    planes: Vec<(Key, Stack)>,
    produced: Vec<Produced>,
    notes: Vec<String>,
    /// The host ↔ GPU copies its calls made.
    transfers: Transfers,
    /// How it ran in chunks on the GPU, if it did.
    splits: Vec<GpuSplit>,
}

/// The devices the calls of `step` run on in a well whose GPU calls run on
/// adapter `gpu` ([`calls_on`]), each once, in chain order.
fn step_devices(step: &StepPlan, gpu: Option<usize>) -> Vec<String> {
    let mut devices: Vec<String> = Vec::new();
    for call in step.chains.iter().flat_map(|c| calls_on(&c.calls, gpu).into_owned()) {
        let d = call.device.to_string();
        if !devices.contains(&d) {
            devices.push(d);
        }
    }
    devices
}

/// What runs the functions of a well: the registry, the converters, the
/// GPU memory budget ([`RunOptions::gpu_memory`]) and the well's GPU queue.
struct Engine<'a> {
    registry: &'a Registry,
    conversions: &'a Conversions,
    gpu_memory: Option<u64>,
    gpu_memory_firm: bool,
    /// The adapter the well's GPU calls run on ([`WellPlan::gpu`]) and the
    /// queue slot of the worker running it; `None` without GPU calls.
    queue: Option<QueueId>,
}

fn run_well(
    plan: &Plan,
    well: &WellPlan,
    engine: &Engine<'_>,
    zarr: &ZarrOutput,
    plate: &PlateResults,
    progress: &(dyn Fn(Progress<'_>) + Sync),
) -> WellResult {
    let mut timings: Vec<StepTiming> = Vec::new();
    let mut outputs = Vec::new();
    let mut artifacts = Vec::new();
    let mut notes = Vec::new();
    let mut produced: ProducedByGroup = BTreeMap::new();
    let mut current: Option<Planes> = None;
    for ws in &well.steps {
        let step = &plan.steps[ws.step];
        progress(Progress::StepStarted { well: &well.well, step: &step.name, index: ws.step, steps: plan.steps.len() });
        let step_span = tracing::info_span!("step", step = %step.name, well = %well.well);
        let _in_step = step_span.enter();
        let step_started = Instant::now();
        let mut timing = StepTiming {
            step: step.name.clone(),
            stacks: ws.groups.len(),
            devices: step_devices(step, engine.queue.map(|q| q.adapter)),
            ..Default::default()
        };
        let fail = |source: StepError, mut timing: StepTiming, mut timings: Vec<StepTiming>| {
            timing.seconds = step_started.elapsed().as_secs_f64();
            timings.push(timing);
            Err((WellError::Step { step: step.name.clone(), source }, timings))
        };
        let t = Instant::now();
        let work = match (step.input_source, current.take()) {
            (InputSource::Previous, Some(planes)) => hand_out(planes, &ws.groups),
            _ => tracing::info_span!("read").in_scope(|| load(plan, well, &ws.groups)),
        };
        let work = match work {
            Ok(w) => w,
            Err(e) => return fail(e, timing, timings),
        };
        timing.read = t.elapsed().as_secs_f64();
        let t = Instant::now();
        let run_stack = |(g, planes): (&GroupPlan, Vec<Stack>)| {
            // Rayon threads: the step is the explicit parent.
            let _in_stack =
                tracing::info_span!(parent: &step_span, "stack", planes = planes.iter().map(Stack::depth).sum::<usize>()).entered();
            let sources = Sources { produced: &produced, plate };
            // This stack's uploads (and the kernels on them) go to the
            // well's queue; the copies its calls make on this thread are
            // counted (nested work stolen by rayon meanwhile opens its
            // own scope and window).
            let _queue = engine.queue.map(|q| QueueScope::enter(q.slot));
            let meter = TransferMeter::start();
            let result = run_group(plan, &well.well, ws.step, g, planes, engine, &sources);
            let transfers = meter.finish();
            result.map(|r| GroupResult { transfers, ..r })
        };
        // Stacks run side by side, unless a function of the step asks for
        // one at a time (it uses every core on one stack and holds a large
        // working set: two at once would double the well's memory).
        let results: Vec<Result<GroupResult, StepError>> = if step.runs_one_stack_at_a_time() {
            work.into_iter().map(run_stack).collect()
        } else {
            work.into_par_iter().map(run_stack).collect()
        };
        let mut out = Planes::new();
        let mut step_produced: Vec<(usize, Vec<Produced>)> = Vec::new();
        for (gi, r) in results.into_iter().enumerate() {
            match r {
                Ok(result) => {
                    timing.transfers.add(&result.transfers);
                    timing.splits.extend(result.splits);
                    out.extend(result.planes);
                    let scope = ws.groups.get(gi).map(|g| scope_text(&g.scope)).unwrap_or_default();
                    notes.extend(result.notes.into_iter().map(|text| Note {
                        well: well.well.clone(),
                        step: step.name.clone(),
                        text: format!("stack at {scope}: {text}"),
                    }));
                    step_produced.push((gi, result.produced));
                }
                Err(e) => return fail(e, timing, timings),
            }
        }
        timing.compute = t.elapsed().as_secs_f64();

        let t = Instant::now();
        let _in_write = tracing::info_span!("write").entered();
        for name in &step.produces {
            let tables: Vec<&Produced> = step_produced.iter().flat_map(|(_, p)| p.iter()).filter(|p| &p.name == name).collect();
            match write_well_artifact(plan, &well.well, &step.name, name, &tables) {
                Ok(record) => artifacts.push(record),
                Err(e) => return fail(e, timing, timings),
            }
        }
        for (gi, p) in step_produced {
            produced.insert((ws.step, gi), p);
        }
        if step.materialize.contains(&Materialize::Tiff) {
            match output::tiff::write_planes(plan, step, ws, &out) {
                Ok(w) => outputs.extend(w),
                Err(e) => return fail(e, timing, timings),
            }
        }
        if step.materialize.contains(&Materialize::Zarr) {
            let planes: Vec<(&Key, &Stack)> = out.iter().collect();
            if let Err(e) = planes.par_iter().try_for_each(|(k, s)| zarr.write(ws.step, &well.well, k, s)) {
                return fail(e, timing, timings);
            }
        }
        timing.write = t.elapsed().as_secs_f64();
        timing.seconds = step_started.elapsed().as_secs_f64();
        drop(_in_write);
        timings.push(timing);
        current = Some(out);
    }
    Ok(WellOutcome { outputs, artifacts, notes, timings })
}

/// Where a stack's consumed artifacts come from: the well's earlier steps,
/// and the plate-wide steps.
struct Sources<'a> {
    produced: &'a ProducedByGroup,
    plate: &'a PlateResults,
}

/// `calls` with their GPU calls on adapter `gpu` (the well's, when wells are
/// spread over several adapters); the planned calls themselves when they
/// are there already.
fn calls_on(calls: &[CallPlan], gpu: Option<usize>) -> std::borrow::Cow<'_, [CallPlan]> {
    let moved = |c: &CallPlan| matches!((c.device, gpu), (Device::Gpu(n), Some(g)) if n != g);
    match gpu {
        Some(g) if calls.iter().any(moved) => calls
            .iter()
            .map(|c| if moved(c) { CallPlan { device: Device::Gpu(g), ..c.clone() } } else { c.clone() })
            .collect::<Vec<_>>()
            .into(),
        _ => calls.into(),
    }
}

/// Runs one stack through its chain and splits the result into output planes.
/// Each call gets a context: the metadata of the planes it sees and the
/// artifacts it consumes, table rows re-indexed to those planes, planes
/// artifacts as the plate-wide result of the stack's group. GPU calls run
/// within the memory budget, in chunks of planes if need be ([`crate::split`]).
fn run_group(
    plan: &Plan,
    well: &str,
    step_index: usize,
    group: &GroupPlan,
    planes: Vec<Stack>,
    engine: &Engine<'_>,
    sources: &Sources<'_>,
) -> Result<GroupResult, StepError> {
    let step = &plan.steps[step_index];
    let nothing =
        |planes| GroupResult { planes, produced: Vec::new(), notes: Vec::new(), transfers: Transfers::default(), splits: Vec::new() };
    let chain = match group.action {
        Action::Skip => return Ok(nothing(Vec::new())),
        Action::Passthrough => return Ok(nothing(group.outputs.iter().map(|o| o.key).zip(planes).collect())),
        Action::Chain(i) => &step.chains[i],
    };
    let first = group.inputs.first().map(key_text).unwrap_or_default();
    let stack =
        Stack::concat_owned(planes).ok_or_else(|| StepError::Failed(format!("stack at {first}: planes differ in size or dtype")))?;
    let input_dtype = stack.dtype();
    // The planes call `ci` sees: the group's inputs, or the one collapsed
    // plane after a reduction.
    let keys_of = |ci: usize| -> Vec<Key> {
        if chain.reduced_before.get(ci).copied().unwrap_or(false) {
            group.outputs.iter().map(|o| o.key).take(1).collect()
        } else {
            group.inputs.clone()
        }
    };
    let context = |ci: usize, keys: &[Key]| call_context(plan, well, step, group, sources, &chain.calls[ci], keys, &first);
    let calls = calls_on(&chain.calls, engine.queue.map(|q| q.adapter));
    let mut run = ChainRun {
        registry: engine.registry,
        conversions: engine.conversions,
        budget: engine.gpu_memory,
        firm: engine.gpu_memory_firm,
        at: first.clone(),
        made: Vec::new(),
        notes: Vec::new(),
        splits: Vec::new(),
        chunking: false,
    };
    let array = run.run(&calls, Array::from(stack), &keys_of, &context).map_err(|e| match e {
        ChainError::Function(source) => StepError::Function(Box::new(FunctionFailure { at: first.clone(), source })),
        ChainError::Memory(source) => StepError::DeviceMemory { at: first.clone(), source },
        ChainError::Failed(text) => StepError::Failed(text),
    })?;
    let ChainRun { made, notes, splits, .. } = run;
    let made = made.into_iter().map(|(name, table, keys)| Produced { name, table, keys, scope: group.scope }).collect();
    // Back to the host: the planned route, or none for a result that is
    // there already (chunks' results are concatenated on the host).
    let array = if array.memory_type() == chain.route_out.source {
        tracing::info_span!("conversion", route = %chain.route_out)
            .in_scope(|| engine.conversions.execute(&chain.route_out, array, Device::Cpu))
    } else {
        Ok(array)
    }
    .map_err(|e| StepError::Failed(format!("stack at {first}: {e}")))?;
    let result = array
        .into_host_stack()
        .ok_or_else(|| StepError::Failed(format!("stack at {first}: the chain did not return a 3D host stack")))?
        .apply_policy(input_dtype, step.dtype);
    if result.depth() != group.outputs.len() {
        return Err(StepError::Failed(format!(
            "stack at {first}: the chain returned {} planes for {} input planes; expected {}",
            result.depth(),
            group.inputs.len(),
            group.outputs.len()
        )));
    }
    let planes = group.outputs.iter().map(|o| o.key).zip(result.into_planes()).collect();
    Ok(GroupResult { planes, produced: made, notes, transfers: Transfers::default(), splits })
}

/// The context of `call` (of `step`, for `group`) on planes `keys`: their
/// metadata, and the artifacts it consumes (table rows re-indexed to `keys`,
/// planes artifacts as the plate-wide result of the group).
#[allow(clippy::too_many_arguments)]
fn call_context(
    plan: &Plan,
    well: &str,
    step: &StepPlan,
    group: &GroupPlan,
    sources: &Sources<'_>,
    call: &hcsflow_core::CallPlan,
    keys: &[Key],
    first: &str,
) -> Result<CallContext, ChainError> {
    let info = StackInfo {
        well: well.to_string(),
        planes: keys.iter().map(|k| plane_info(plan, well, k)).collect(),
        pixel_size_um: plan.pixel_size_um,
    };
    let mut inputs = BTreeMap::new();
    let mut plate_planes = BTreeMap::new();
    for d in &call.artifacts.consumes {
        let Some(idx) = step.consumes.iter().position(|c| c.name == d.name) else { continue };
        let (Some(from), Some(Some(source))) = (step.consumes[idx].from_step, group.sources.get(idx)) else { continue };
        if d.kind == ArtifactKind::Planes {
            let result = sources.plate.get(&(from, *source)).ok_or_else(|| {
                ChainError::Failed(format!("stack at {first}: the result of plate-wide step '{}' is missing", plan.steps[from].name))
            })?;
            plate_planes.insert(d.name.to_string(), Arc::clone(result));
            continue;
        }
        let table = sources.produced.get(&(from, *source)).and_then(|list| list.iter().find(|p| p.name == d.name)).ok_or_else(|| {
            ChainError::Failed(format!("stack at {first}: the '{}' artifact of step '{}' is missing", d.name, plan.steps[from].name))
        })?;
        inputs.insert(d.name.to_string(), reindex(&table.table, &table.keys, &plan.steps[from].variable, keys));
    }
    let mut context = CallContext::new(info, inputs);
    context.planes = plate_planes;
    Ok(context)
}

/// The metadata of the plane with components `key` in `well`.
pub(crate) fn plane_info(plan: &Plan, well: &str, key: &Key) -> PlaneInfo {
    let site = key[Component::Site.index()];
    let known = Slot::of(site) != Slot::Collapsed;
    PlaneInfo {
        site,
        channel: key[Component::Channel.index()],
        z_index: key[Component::ZIndex.index()],
        timepoint: key[Component::Timepoint.index()],
        stage_um: plan.stage_positions.get(&(well.to_string(), site)).copied().filter(|_| known),
        grid_cell: plan.site_cells.get(&site).copied().filter(|_| known),
    }
}

/// Rows of a producer's table given to a consumer whose planes are `to`:
/// a row of producer plane `p` goes to every consumer plane that agrees with
/// `p` on the producer's variable components (positions computed per site on a
/// composite reach each channel's tile of that site). Rows of no plane stay as they are.
fn reindex(table: &Table, from: &[Key], variable: &[Component], to: &[Key]) -> Table {
    let mut out = Table { columns: table.columns.clone(), rows: table.rows.iter().filter(|r| r.plane.is_none()).cloned().collect() };
    for (q, kq) in to.iter().enumerate() {
        for row in &table.rows {
            let Some(kp) = row.plane.and_then(|p| from.get(p)) else { continue };
            if variable.iter().all(|c| kp[c.index()] == kq[c.index()]) {
                out.rows.push(hcsflow_core::Row { plane: Some(q), cells: row.cells.clone() });
            }
        }
    }
    out
}

pub(crate) fn key_text(k: &Key) -> String {
    let names = ["site", "channel", "z", "t"];
    k.iter().zip(names).filter(|(v, _)| Slot::of(**v) != Slot::Collapsed).map(|(v, n)| format!("{n} {v}")).collect::<Vec<_>>().join(", ")
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_wells_gpu_calls_move_to_its_adapter_and_host_calls_stay() {
        use hcsflow_core::convert::Converter;
        use hcsflow_core::{Contract, ConversionError, ConversionPolicy, FunctionDecl, MemoryType, NoArgs};
        static ID: FunctionDecl<NoArgs> = FunctionDecl::new("id", Contract::Pure2d, "x");
        struct Never;
        impl Converter for Never {
            fn convert(&self, array: Array, _: Device) -> Result<Array, ConversionError> {
                Ok(array)
            }
        }
        let mut registry = Registry::new();
        registry.add(ID.host(|s, _, _| Ok(s.clone())));
        registry.add(ID.device(MemoryType::Wgpu, |a, _, _| Ok(a)));
        let mut conversions = Conversions::default();
        conversions.register(MemoryType::Host, MemoryType::Wgpu, Arc::new(Never));
        conversions.register(MemoryType::Wgpu, MemoryType::Host, Arc::new(Never));
        let plan = |device| {
            let args = registry.get("id").unwrap().validate_args(vec![]).unwrap();
            registry.plan_call("id", args, MemoryType::Host, device, &conversions, ConversionPolicy::default()).unwrap()
        };
        let calls = [plan(Device::Gpu(0)), plan(Device::Cpu), plan(Device::Gpu(0))];
        let devices = |calls: &[CallPlan]| calls.iter().map(|c| c.device).collect::<Vec<_>>();
        let moved = calls_on(&calls, Some(1));
        assert_eq!(devices(&moved), [Device::Gpu(1), Device::Cpu, Device::Gpu(1)]);
        assert!(matches!(calls_on(&calls, Some(0)), std::borrow::Cow::Borrowed(_)), "already there: no copy");
        assert_eq!(devices(&calls_on(&calls, None)), devices(&calls));
    }

    #[test]
    fn a_failed_function_keeps_its_error_under_the_same_text() {
        let e = StepError::Function(Box::new(FunctionFailure {
            at: "A01 s1".into(),
            source: FunctionError::invalid("apply_mask", "no mask plane"),
        }));
        assert_eq!(e.to_string(), "stack at A01 s1: apply_mask: no mask plane");
        let source = std::error::Error::source(&e).and_then(|s| s.downcast_ref::<FunctionError>());
        assert!(matches!(source, Some(FunctionError::InvalidInput { .. })), "{e}");
    }

    #[test]
    fn full_quota_and_read_only_file_systems_stop_the_run() {
        let step = |source: StepError| WellError::Step { step: "x".into(), source };
        let path = Path::new("/o/a.tif");
        for code in [28, 122, 30] {
            let os = || std::io::Error::from_raw_os_error(code);
            for e in [
                step(StepError::io(path, os())),
                step(hcsflow_tiff::TiffError::Io { path: path.into(), source: os() }.into()),
                step(PipelineError::io(path, os()).into()),
                // A chunk the OME-Zarr store could not write: zarrs' text, the store's io::Error kept.
                step(StepError::Zarr(Box::new(hcsflow_zarr::ZarrError::Zarr {
                    path: path.into(),
                    message: "plane t=0 c=0 z=0: No space left on device".into(),
                    io: Some(os()),
                }))),
            ] {
                assert!(storage_exhausted(&e), "{e}");
            }
            assert!(storage_exhausted(&PipelineError::io(path, os())));
        }
        // Other errors, and text that merely looks like one, do not stop it.
        let not_found = std::io::Error::from_raw_os_error(2);
        for e in [
            step(StepError::io(path, not_found)),
            step(StepError::Failed("/o/a.tif: No space left on device (os error 28)".into())),
            WellError::NotRun("internal error (panic): (os error 28)".into()),
        ] {
            assert!(!storage_exhausted(&e), "{e}");
        }
    }
}
