//! Execute a [`Plan`]: wells in parallel within a memory budget, each well
//! isolated, resumable, with atomic writes and a report.
//!
//! Contract:
//! - One run at a time per output folder: `OUT/.hcsflow.lock` is locked for
//!   the whole run (released by the OS when the process ends, even killed);
//!   a second run into OUT is refused before it writes anything.
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
//! - `execute` returns `Err` only for problems found before any well starts
//!   (OUT not writable or locked by another run, another run's outputs, the
//!   first manifest write); everything later is in the [`RunSummary`].

use std::collections::{BTreeMap, VecDeque};
use std::fs::File;
use std::io::BufWriter;
use std::panic::AssertUnwindSafe;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Condvar, Mutex};
use std::time::Instant;

use hcsflow_core::{Array, CallContext, Conversions, Device, PlaneInfo, Registry, Route, Stack, StackInfo, Table};
pub use hcsflow_io::peak_rss_bytes;
use hcsflow_io::Durability;
use hcsflow_tiff::WriteOptions;
use rayon::prelude::*;
use serde::{Deserialize, Serialize};

use crate::compile::{
    scope_text, Action, GroupPlan, InputPlane, Key, MissingPlane, MissingPolicy, Plan, StepPlan, WellPlan, COLLAPSED, VARIABLE,
};
use crate::outdir;
use crate::spec::Component;
use crate::spec::{InputSource, Materialize};
use crate::zarr::ZarrOutput;
use crate::PipelineError;

/// The run manifest's file name in OUT.
pub const MANIFEST_NAME: &str = "run_manifest.json";
/// The per-plate CSV summary of outputs in OUT.
pub const SUMMARY_NAME: &str = "summary.csv";
/// The per-plate CSV summary of artifact tables in OUT.
pub const ARTIFACTS_NAME: &str = "artifacts.csv";

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
}

/// One written output plane, as recorded in the manifest and the CSV summary.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct OutputRecord {
    pub step: String,
    /// `[site, channel, z_index, timepoint]`; 0 = collapsed by a reduction.
    pub key: Key,
    /// Relative to OUT.
    pub path: PathBuf,
    pub height: usize,
    pub width: usize,
    pub dtype: String,
}

/// One artifact table written for a well (`OUT/<step>/<artifact>/<well>.csv`).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct ArtifactRecord {
    pub step: String,
    pub artifact: String,
    /// Relative to OUT.
    pub path: PathBuf,
    pub rows: usize,
}

/// Something a function said about its result that the user must see (e.g.
/// stitching fell back to stage positions): not an error, never silent.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Note {
    pub well: String,
    pub step: String,
    pub text: String,
}

/// Where a well stands, in the manifest and the report. Written as the
/// strings "complete", "failed", "skipped (resumed)" and "not started".
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
pub enum WellStatus {
    /// Every step ran and every output was written.
    #[serde(rename = "complete")]
    Complete,
    /// The well failed (`error` says why); its outputs are not recorded.
    #[serde(rename = "failed")]
    Failed,
    /// Complete in an earlier run and not run again (`--resume`; the report only).
    #[serde(rename = "skipped (resumed)")]
    Skipped,
    /// The run was cancelled or stopped before the well started (`error` says why).
    #[serde(rename = "not started")]
    NotStarted,
}

impl WellStatus {
    /// The status as written in the manifest and the report.
    pub fn as_str(self) -> &'static str {
        match self {
            WellStatus::Complete => "complete",
            WellStatus::Failed => "failed",
            WellStatus::Skipped => "skipped (resumed)",
            WellStatus::NotStarted => "not started",
        }
    }
}

impl std::fmt::Display for WellStatus {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(self.as_str())
    }
}

/// A well in the manifest.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct WellRecord {
    /// Complete, failed or not started (`error` says why); `--resume` runs
    /// every well that is not complete.
    pub status: WellStatus,
    pub seconds: f64,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub error: Option<String>,
    #[serde(default)]
    pub outputs: Vec<OutputRecord>,
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub artifacts: Vec<ArtifactRecord>,
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub notes: Vec<Note>,
    /// Missing images this well used as planes of zeros (`--missing fill`).
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub filled: Vec<MissingPlane>,
}

impl WellRecord {
    /// The record of a well that wrote nothing.
    fn ended(status: WellStatus, seconds: f64, error: Option<String>) -> WellRecord {
        WellRecord { status, seconds, error, outputs: Vec::new(), artifacts: Vec::new(), notes: Vec::new(), filled: Vec::new() }
    }

    /// The report of `well` from this record: no step timings, nothing read.
    fn report(&self, well: &str) -> WellReport {
        WellReport {
            well: well.to_string(),
            status: self.status,
            seconds: self.seconds,
            error: self.error.clone(),
            steps: Vec::new(),
            bytes_read: 0,
            notes: self.notes.clone(),
            filled: self.filled.clone(),
        }
    }
}

/// `OUT/run_manifest.json`.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Manifest {
    pub version: u32,
    pub pipeline: String,
    pub digest: String,
    pub plate: PathBuf,
    /// Plate-level files the run writes, relative to OUT (summaries, joined
    /// artifact tables): with the wells' outputs, what `--overwrite` removes.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub files: Vec<PathBuf>,
    /// OME-Zarr plates the run writes, relative to OUT.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub zarr_plates: Vec<PathBuf>,
    pub wells: BTreeMap<String, WellRecord>,
}

/// Timings of one step in one well, seconds.
#[derive(Debug, Clone, Default, Serialize)]
pub struct StepTiming {
    pub step: String,
    pub read: f64,
    pub compute: f64,
    pub write: f64,
    pub stacks: usize,
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

/// One step in the report: its chains and total times over wells.
#[derive(Debug, Clone, Serialize)]
pub struct StepReport {
    pub name: String,
    pub chains: Vec<ChainReport>,
    pub read_seconds: f64,
    pub compute_seconds: f64,
    pub write_seconds: f64,
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
    Image(#[from] hcsflow_tiff::TiffError),
    /// A table could not be written.
    #[error(transparent)]
    Output(#[from] PipelineError),
    /// An OME-Zarr plane could not be written.
    #[error("OME-Zarr: {0}")]
    Zarr(#[source] hcsflow_zarr::ZarrError),
}

impl StepError {
    fn io(path: &Path, source: std::io::Error) -> Self {
        StepError::Io { path: path.to_path_buf(), source }
    }
}

/// Writes `bytes` to `path` atomically ([`hcsflow_io::write_atomic_with`], not
/// fsync'ed). If anything fails the temporary is removed and `path` is as it
/// was; the error names `path`.
fn write_atomic(path: &Path, bytes: &[u8]) -> Result<(), PipelineError> {
    write_atomic_with(path, bytes, |w, bytes| disk_full::write(w, bytes))
}

/// [`write_atomic`] with the function that fills the temporary.
fn write_atomic_with(
    path: &Path,
    bytes: &[u8],
    write: impl FnOnce(&mut BufWriter<&File>, &[u8]) -> std::io::Result<()>,
) -> Result<(), PipelineError> {
    let replaced = std::fs::metadata(path).map(|m| m.len()).ok();
    hcsflow_io::write_atomic_with(path, Durability::Process, |w| write(w, bytes)).map_err(io_err(path))?;
    disk_full::freed(replaced.unwrap_or(0));
    Ok(())
}

/// Test-only fault injection, not a feature: with the environment variable
/// `HCSFLOW_TEST_DISK_FULL_AFTER=N` (read once per process), the run's own
/// writes (wells' TIFF planes and CSV tables, the manifest, summaries; not
/// OME-Zarr chunks, which `hcsflow-zarr` writes) behave as on a file system
/// with N bytes free: a write that does not fit writes what fits, then fails
/// with ENOSPC; a replaced file frees its old size. The process-level
/// disk-full tests use it, so they run where no small file system can be mounted.
mod disk_full {
    use std::io::Write;
    use std::sync::{Mutex, OnceLock};

    static FREE: OnceLock<Option<Mutex<u64>>> = OnceLock::new();

    fn free() -> Option<&'static Mutex<u64>> {
        FREE.get_or_init(|| std::env::var("HCSFLOW_TEST_DISK_FULL_AFTER").ok()?.trim().parse().ok().map(Mutex::new)).as_ref()
    }

    /// "No space left on device": ENOSPC is 28 on Linux, macOS and the BSDs.
    fn enospc() -> std::io::Error {
        std::io::Error::from_raw_os_error(28)
    }

    /// Writes `bytes` to `file` (all of them unless the injection is on).
    pub(super) fn write(file: &mut impl Write, bytes: &[u8]) -> std::io::Result<()> {
        let Some(free) = free() else {
            return file.write_all(bytes);
        };
        let mut free = free.lock().unwrap_or_else(|p| p.into_inner());
        let fits = usize::try_from(*free).unwrap_or(usize::MAX).min(bytes.len());
        file.write_all(&bytes[..fits])?;
        if fits < bytes.len() {
            return Err(enospc());
        }
        *free -= fits as u64;
        Ok(())
    }

    /// Takes `len` bytes for a file another crate writes; ENOSPC if they do not fit.
    pub(super) fn reserve(len: u64) -> std::io::Result<()> {
        let Some(free) = free() else { return Ok(()) };
        let mut free = free.lock().unwrap_or_else(|p| p.into_inner());
        *free = free.checked_sub(len).ok_or_else(enospc)?;
        Ok(())
    }

    /// A file of `len` bytes was replaced or removed.
    pub(super) fn freed(len: u64) {
        if let Some(free) = free() {
            let mut free = free.lock().unwrap_or_else(|p| p.into_inner());
            *free = free.saturating_add(len);
        }
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

impl Manifest {
    fn new(plan: &Plan, zarr_plates: &[PathBuf]) -> Manifest {
        let rel = |p: &Path| p.strip_prefix(&plan.out).map(Path::to_path_buf).unwrap_or_else(|_| p.to_path_buf());
        let mut files = vec![PathBuf::from(SUMMARY_NAME), PathBuf::from(ARTIFACTS_NAME)];
        for step in &plan.steps {
            files.extend(step.produces.iter().map(|name| rel(&step.out_dir.join(format!("{name}.csv")))));
        }
        Manifest {
            version: 1,
            pipeline: plan.pipeline_name.clone(),
            digest: plan.digest.clone(),
            plate: plan.plate_root.clone(),
            files,
            zarr_plates: zarr_plates.iter().map(|p| rel(p)).collect(),
            wells: BTreeMap::new(),
        }
    }

    /// Reads `OUT/run_manifest.json`, `None` if absent.
    pub fn read(out: &Path) -> Result<Option<Manifest>, PipelineError> {
        let path = out.join(MANIFEST_NAME);
        match std::fs::read(&path) {
            Ok(bytes) => serde_json::from_slice(&bytes).map(Some).map_err(|source| PipelineError::Manifest { path, source }),
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => Ok(None),
            Err(e) => Err(io_err(&path)(e)),
        }
    }

    /// Writes the manifest atomically; if that fails (a full disk), once more
    /// as compact JSON, which is smaller. The error is the last attempt's.
    fn write(&self, out: &Path) -> Result<(), PipelineError> {
        let path = out.join(MANIFEST_NAME);
        let json = |pretty: bool| {
            (if pretty { serde_json::to_vec_pretty(self) } else { serde_json::to_vec(self) })
                .map_err(|e| PipelineError::io(&path, e.into()))
        };
        write_atomic(&path, &json(true)?).or_else(|_| write_atomic(&path, &json(false)?))
    }
}

/// The manifest in memory (every well's outcome, always) and what the file
/// on disk holds.
struct ManifestState {
    manifest: Manifest,
    /// Well → status of the last manifest written.
    on_disk: BTreeMap<String, WellStatus>,
    /// The last write's error, if it failed.
    error: Option<PipelineError>,
}

impl ManifestState {
    /// Records `record` for `well` and rewrites the file.
    fn record(&mut self, out: &Path, well: &str, record: WellRecord) {
        self.manifest.wells.insert(well.to_string(), record);
        self.save(out);
    }

    fn save(&mut self, out: &Path) {
        match self.manifest.write(out) {
            Ok(()) => {
                self.on_disk = self.manifest.wells.iter().map(|(w, r)| (w.clone(), r.status)).collect();
                self.error = None;
            }
            Err(e) => self.error = Some(e),
        }
    }

    /// The wells whose outcome the file on disk misses or misstates.
    fn unrecorded(&self) -> Vec<String> {
        self.manifest
            .wells
            .iter()
            .filter(|(w, r)| self.on_disk.get(*w) != Some(&r.status))
            .map(|(w, r)| format!("{w} ({})", r.status))
            .collect()
    }
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
    let (_lock, manifest, zarr) = prepare_out(plan, options)?;
    let on_disk = manifest.wells.iter().map(|(w, r)| (w.clone(), r.status)).collect();

    let mut skipped = Vec::new();
    let mut queue = VecDeque::new();
    for (i, w) in plan.wells.iter().enumerate() {
        if manifest.wells.contains_key(&w.well) {
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
        queue: Mutex::new(queue),
        budget: MemoryBudget::new(options.max_memory),
        manifest: Mutex::new(ManifestState { manifest, on_disk, error: None }),
        reports: Mutex::new(Vec::new()),
        done: Mutex::new(skipped.len()),
        stopped: Mutex::new(None),
    };
    std::thread::scope(|scope| {
        for _ in 0..workers {
            scope.spawn(|| run.run_worker());
        }
    });
    let Run { queue, manifest, reports, stopped, .. } = run;
    let stopped = stopped.into_inner().unwrap_or_else(|p| p.into_inner());
    let state = manifest.into_inner().unwrap_or_else(|p| p.into_inner());
    let wells = reports.into_inner().unwrap_or_else(|p| p.into_inner());
    let not_started: Vec<String> =
        queue.into_inner().unwrap_or_else(|p| p.into_inner()).into_iter().map(|i| plan.wells[i].well.clone()).collect();
    let ended = EndedRun { workers, started, skipped, not_started, stopped, wells };
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
    let layouts = crate::zarr::layouts(plan, &plan.channel_names, options.zarr_format);
    let zarr_roots: Vec<PathBuf> = layouts.iter().map(|l| l.root.clone()).collect();
    let stale = outdir::remove_stale_temps(&plan.out, plan, previous.as_ref(), &zarr_roots);
    if stale > 0 {
        tracing::info!("removed {stale} temporary file(s) left in {} by an interrupted run", plan.out.display());
    }
    let mut manifest = Manifest::new(plan, &zarr_roots);
    if let (true, Some(previous)) = (options.resume, previous) {
        manifest.wells = previous.wells.into_iter().filter(|(_, r)| r.status == WellStatus::Complete).collect();
    }
    manifest.write(&plan.out)?;
    let zarr = ZarrOutput::open(layouts)?;
    Ok((lock, manifest, zarr))
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

    /// One worker: takes wells off the queue until it is empty or the run
    /// halts, each within the memory budget, and records each outcome.
    fn run_worker(&self) {
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
            let result = self.run_isolated(well, &missing);
            drop(reservation);
            let seconds = t0.elapsed().as_secs_f64();
            let (record, report) = self.outcome(well, result, missing, seconds);
            self.record(well, record, report, seconds);
        }
    }

    /// Runs `well`, a panic included in its failure; under skip-well a well
    /// with `missing` images is not run.
    fn run_isolated(&self, well: &WellPlan, missing: &[&MissingPlane]) -> WellResult {
        if self.plan.missing_policy != MissingPolicy::Fill && !missing.is_empty() {
            // Compile refuses missing images under `error`: this is skip-well.
            return Err((WellError::NotRun(skipped_for_missing(missing)), Vec::new()));
        }
        // Trace spans (`hcsflow run --trace`): well > step > read | stack > call | conversion, and write.
        let span = tracing::info_span!("well", well = %well.well);
        std::panic::catch_unwind(AssertUnwindSafe(|| {
            span.in_scope(|| run_well(self.plan, well, self.registry, self.conversions, self.zarr, self.progress))
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
            m.record(&self.plan.out, &well.well, record);
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
        let total = self.plan.wells.len();
        (self.progress)(Progress::Finished { well: &well.well, done: n.unwrap_or(0), total, seconds, error: error.as_deref() });
    }
}

/// A run whose workers have ended: what [`EndedRun::finish`] turns into the summary.
struct EndedRun {
    workers: usize,
    started: Instant,
    /// Wells complete in an earlier run (`--resume`).
    skipped: Vec<String>,
    /// Wells never started (cancelled or stopped).
    not_started: Vec<String>,
    stopped: Option<String>,
    /// Reports of the wells that ran.
    wells: Vec<WellReport>,
}

impl EndedRun {
    /// Records the wells never started in the manifest, writes the
    /// plate-level outputs (OME-Zarr metadata, summaries, joined tables) and
    /// assembles the summary and its report.
    fn finish(self, plan: &Plan, options: &RunOptions, mut state: ManifestState, zarr: ZarrOutput) -> RunSummary {
        let EndedRun { workers, started, skipped, not_started, stopped, mut wells } = self;
        // Every well's outcome is in the manifest, the wells never started too.
        let why_not = match &stopped {
            Some(reason) => format!("not started: {reason}"),
            None => "not started: the run was interrupted".to_string(),
        };
        for w in &not_started {
            state.manifest.wells.insert(w.clone(), WellRecord::ended(WellStatus::NotStarted, 0.0, Some(why_not.clone())));
        }
        if !not_started.is_empty() || state.error.is_some() {
            state.save(&plan.out);
        }
        let manifest_error =
            state.error.as_ref().map(|e| format!("{e}; the file on disk misses the outcome of well(s) {}", state.unrecorded().join(", ")));
        let manifest = state.manifest;
        let mut write_errors = Vec::new();
        let zarr_plates = zarr.finish().unwrap_or_else(|e| {
            write_errors.push(e.to_string());
            Vec::new()
        });
        if let Err(e) = write_summary_csv(&plan.out, &manifest) {
            write_errors.push(e.to_string());
        }
        let artifact_tables = write_artifact_tables(plan, &manifest).unwrap_or_else(|e| {
            write_errors.push(e.to_string());
            Vec::new()
        });

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
        let run = RunOutcome { workers, seconds: started.elapsed().as_secs_f64(), stopped, manifest_error, write_errors };
        let report = RunReport::from_wells(plan, options, wells, &run);
        RunSummary {
            total: plan.wells.len(),
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
            report,
        }
    }
}

/// What a run says about itself besides its wells, for [`RunReport::from_wells`].
struct RunOutcome {
    workers: usize,
    seconds: f64,
    stopped: Option<String>,
    manifest_error: Option<String>,
    write_errors: Vec<String>,
}

impl RunReport {
    /// The report of a run of `plan` from its wells' reports (in plate
    /// order): failures, notes and filled planes gathered, step times summed
    /// over wells, throughput over the run's time.
    fn from_wells(plan: &Plan, options: &RunOptions, wells: Vec<WellReport>, run: &RunOutcome) -> RunReport {
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
        for t in timings {
            r += t.read;
            c += t.compute;
            wr += t.write;
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
        StepReport { name: step.name.clone(), chains, read_seconds: r, compute_seconds: c, write_seconds: wr }
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
            let paths: Option<Vec<&Path>> = inputs.iter().map(|i| i.path.as_deref()).collect();
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
/// well without the memory it claims.
fn read_planes(plan: &Plan, inputs: &[&InputPlane]) -> Result<Vec<Stack>, StepError> {
    let (h, w, dtype) = plan.plane;
    let expected = hcsflow_tiff::Expected::one_plane(hcsflow_tiff::PlaneFormat::new(h, w, dtype));
    inputs
        .par_iter()
        .map(|input| match &input.path {
            None if plan.missing_policy == MissingPolicy::Fill => Ok(Stack::zeros(dtype, [1, h, w])),
            None => {
                Err(StepError::Failed(format!("{}: the image is missing (policy --missing {})", input.rel.display(), plan.missing_policy)))
            }
            Some(p) => hcsflow_tiff::read_stack_expecting(p, expected).map_err(|e| match e {
                hcsflow_tiff::TiffError::PageCount { path, found, .. } => {
                    StepError::Failed(format!("{}: {found} pages; plate images have one plane each", path.display()))
                }
                e => StepError::Image(e),
            }),
        })
        .collect()
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
struct Produced {
    name: String,
    table: Table,
    keys: Vec<Key>,
    scope: Key,
}

/// Artifacts of the steps run so far in a well, by (step, group).
type ProducedByGroup = BTreeMap<(usize, usize), Vec<Produced>>;

/// What one stack's chain returned.
struct GroupResult {
    planes: Vec<(Key, Stack)>,
    produced: Vec<Produced>,
    notes: Vec<String>,
}

fn run_well(
    plan: &Plan,
    well: &WellPlan,
    registry: &Registry,
    conversions: &Conversions,
    zarr: &ZarrOutput,
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
        let mut timing = StepTiming { step: step.name.clone(), stacks: ws.groups.len(), ..Default::default() };
        let fail = |source: StepError, timing: StepTiming, mut timings: Vec<StepTiming>| {
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
        let results: Vec<Result<GroupResult, StepError>> = work
            .into_par_iter()
            .map(|(g, planes)| {
                // Rayon threads: the step is the explicit parent.
                let _in_stack =
                    tracing::info_span!(parent: &step_span, "stack", planes = planes.iter().map(Stack::depth).sum::<usize>()).entered();
                run_group(plan, &well.well, ws.step, g, planes, registry, conversions, &produced)
            })
            .collect();
        let mut out = Planes::new();
        let mut step_produced: Vec<(usize, Vec<Produced>)> = Vec::new();
        for (gi, r) in results.into_iter().enumerate() {
            match r {
                Ok(result) => {
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
            let files: Vec<(&Key, PathBuf)> =
                ws.groups.iter().flat_map(|g| g.outputs.iter()).map(|o| (&o.key, step.out_dir.join(&o.rel))).collect();
            let options = WriteOptions { pixel_size_um: plan.pixel_size_um.filter(|p| p.is_finite() && *p > 0.0), ..Default::default() };
            let written: Result<Vec<OutputRecord>, StepError> = files
                .par_iter()
                .map(|(key, path)| {
                    let stack =
                        out.get(*key).ok_or_else(|| StepError::Failed(format!("output plane {} was not produced", key_text(key))))?;
                    if let Some(parent) = path.parent() {
                        std::fs::create_dir_all(parent).map_err(|e| StepError::io(parent, e))?;
                    }
                    disk_full::reserve(stack.nbytes() as u64).map_err(|e| StepError::io(path, e))?;
                    hcsflow_tiff::write_stack(path, stack, &options)?;
                    let [_, h, w] = stack.shape();
                    Ok(OutputRecord {
                        step: step.name.clone(),
                        key: **key,
                        path: path.strip_prefix(&plan.out).map(Path::to_path_buf).unwrap_or_else(|_| path.clone()),
                        height: h,
                        width: w,
                        dtype: stack.dtype().to_string(),
                    })
                })
                .collect();
            match written {
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
        drop(_in_write);
        timings.push(timing);
        current = Some(out);
    }
    Ok(WellOutcome { outputs, artifacts, notes, timings })
}

/// Runs one stack through its chain and splits the result into output planes.
/// Each call gets a context: the metadata of the planes it sees and the
/// artifacts it consumes, rows re-indexed to those planes.
#[allow(clippy::too_many_arguments)]
fn run_group(
    plan: &Plan,
    well: &str,
    step_index: usize,
    group: &GroupPlan,
    planes: Vec<Stack>,
    registry: &Registry,
    conversions: &Conversions,
    produced: &ProducedByGroup,
) -> Result<GroupResult, StepError> {
    let step = &plan.steps[step_index];
    let chain = match group.action {
        Action::Skip => return Ok(GroupResult { planes: Vec::new(), produced: Vec::new(), notes: Vec::new() }),
        Action::Passthrough => {
            let planes = group.outputs.iter().map(|o| o.key).zip(planes).collect();
            return Ok(GroupResult { planes, produced: Vec::new(), notes: Vec::new() });
        }
        Action::Chain(i) => &step.chains[i],
    };
    let first = group.inputs.first().map(key_text).unwrap_or_default();
    let stack =
        Stack::concat_owned(planes).ok_or_else(|| StepError::Failed(format!("stack at {first}: planes differ in size or dtype")))?;
    let input_dtype = stack.dtype();
    let mut array = Array::from(stack);
    let mut made = Vec::new();
    let mut notes = Vec::new();
    for (ci, call) in chain.calls.iter().enumerate() {
        let keys: Vec<Key> = if chain.reduced_before.get(ci).copied().unwrap_or(false) {
            group.outputs.iter().map(|o| o.key).take(1).collect()
        } else {
            group.inputs.clone()
        };
        let info = StackInfo {
            well: well.to_string(),
            planes: keys.iter().map(|k| plane_info(plan, well, k)).collect(),
            pixel_size_um: plan.pixel_size_um,
        };
        let mut inputs = BTreeMap::new();
        for d in &call.artifacts.consumes {
            let Some(idx) = step.consumes.iter().position(|c| c.name == d.name) else { continue };
            let (Some(from), Some(Some(source))) = (step.consumes[idx].from_step, group.sources.get(idx)) else { continue };
            let table = produced.get(&(from, *source)).and_then(|list| list.iter().find(|p| p.name == d.name)).ok_or_else(|| {
                StepError::Failed(format!("stack at {first}: the '{}' artifact of step '{}' is missing", d.name, plan.steps[from].name))
            })?;
            inputs.insert(d.name.to_string(), reindex(&table.table, &table.keys, &plan.steps[from].variable, &keys));
        }
        let mut context = CallContext::new(info, inputs);
        // The conversion into the call (`route_in`, e.g. an upload) runs inside
        // Registry::execute_in: a "conversion" span inside this one.
        let _in_call = tracing::info_span!("call", function = %call.function, device = %call.device, route_in = %call.route_in).entered();
        array =
            registry.execute_in(call, array, conversions, &mut context).map_err(|e| StepError::Failed(format!("stack at {first}: {e}")))?;
        let (outputs, call_notes) = context.take_results();
        made.extend(outputs.into_iter().map(|(name, table)| Produced { name, table, keys: keys.clone(), scope: group.scope }));
        notes.extend(call_notes);
    }
    let array = tracing::info_span!("conversion", route = %chain.route_out)
        .in_scope(|| conversions.execute(&chain.route_out, array, Device::Cpu))
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
    Ok(GroupResult { planes, produced: made, notes })
}

/// The metadata of the plane with components `key` in `well`.
fn plane_info(plan: &Plan, well: &str, key: &Key) -> PlaneInfo {
    let site = key[Component::Site.index()];
    let known = site != COLLAPSED;
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

/// Columns every artifact CSV starts with: where each row belongs.
const ARTIFACT_KEY_COLUMNS: &str = "well,site,channel,z_index,timepoint";

/// Writes the tables of artifact `name` of one step in one well to
/// `OUT/<step>/<name>/<well>.csv` (atomically): the key columns, then the table's.
fn write_well_artifact(plan: &Plan, well: &str, step: &str, name: &str, tables: &[&Produced]) -> Result<ArtifactRecord, StepError> {
    let columns = tables.first().map(|p| p.table.columns.clone()).unwrap_or_default();
    if let Some(other) = tables.iter().find(|p| p.table.columns != columns) {
        return Err(StepError::Failed(format!(
            "artifact '{name}': stacks produced different columns ([{}] vs [{}])",
            columns.join(", "),
            other.table.columns.join(", ")
        )));
    }
    let mut csv = String::from(ARTIFACT_KEY_COLUMNS);
    for c in &columns {
        csv.push(',');
        csv.push_str(&hcsflow_core::Cell::Text(c.clone()).to_string());
    }
    csv.push('\n');
    let cell = |v: u32| {
        if v == COLLAPSED || v == VARIABLE {
            String::new()
        } else {
            v.to_string()
        }
    };
    let mut rows = 0;
    for p in tables {
        for row in &p.table.rows {
            let key = row.plane.and_then(|i| p.keys.get(i)).copied().unwrap_or(p.scope);
            csv.push_str(&format!("{well},{},{},{},{}", cell(key[0]), cell(key[1]), cell(key[2]), cell(key[3])));
            for c in &row.cells {
                csv.push(',');
                csv.push_str(&c.to_string());
            }
            csv.push('\n');
            rows += 1;
        }
    }
    let dir = plan.out.join(step).join(name);
    std::fs::create_dir_all(&dir).map_err(|e| StepError::io(&dir, e))?;
    let path = dir.join(format!("{well}.csv"));
    write_atomic(&path, csv.as_bytes())?;
    Ok(ArtifactRecord {
        step: step.to_string(),
        artifact: name.to_string(),
        path: path.strip_prefix(&plan.out).map(Path::to_path_buf).unwrap_or(path),
        rows,
    })
}

/// Joins the per-well artifact CSVs of the complete wells into
/// `OUT/<step>/<artifact>.csv` (wells in plate order) and writes the
/// `OUT/artifacts.csv` summary. Rebuilt from the manifest, so a resumed run's
/// tables include the wells of earlier runs.
fn write_artifact_tables(plan: &Plan, manifest: &Manifest) -> Result<Vec<PathBuf>, PipelineError> {
    let mut wells: Vec<(&String, &WellRecord)> = manifest.wells.iter().filter(|(_, r)| r.status == WellStatus::Complete).collect();
    wells.sort_by(|a, b| hcsflow_plate::cmp_wells(a.0, b.0));
    let mut summary = String::from("well,step,artifact,rows,path\n");
    let mut written = Vec::new();
    for step in &plan.steps {
        for name in &step.produces {
            let mut joined: Option<String> = None;
            for (well, record) in &wells {
                for a in record.artifacts.iter().filter(|a| a.step == step.name && &a.artifact == name) {
                    summary.push_str(&format!("{well},{},{},{},{}\n", a.step, a.artifact, a.rows, a.path.display()));
                    let path = plan.out.join(&a.path);
                    let text = std::fs::read_to_string(&path).map_err(io_err(&path))?;
                    let (header, body) = text.split_once('\n').unwrap_or((text.as_str(), ""));
                    let j = joined.get_or_insert_with(|| format!("{header}\n"));
                    j.push_str(body);
                }
            }
            if let Some(j) = joined {
                let path = step.out_dir.join(format!("{name}.csv"));
                write_atomic(&path, j.as_bytes())?;
                written.push(path);
            }
        }
    }
    write_atomic(&plan.out.join(ARTIFACTS_NAME), summary.as_bytes())?;
    Ok(written)
}

fn key_text(k: &Key) -> String {
    let names = ["site", "channel", "z", "t"];
    k.iter().zip(names).filter(|(v, _)| **v != COLLAPSED).map(|(v, n)| format!("{n} {v}")).collect::<Vec<_>>().join(", ")
}

/// `OUT/summary.csv`: one row per output plane of every complete well.
fn write_summary_csv(out: &Path, manifest: &Manifest) -> Result<(), PipelineError> {
    let mut csv = String::from("well,step,site,channel,z_index,timepoint,path,height,width,dtype\n");
    let cell = |v: u32| {
        if v == COLLAPSED {
            String::new()
        } else {
            v.to_string()
        }
    };
    let mut wells: Vec<(&String, &WellRecord)> = manifest.wells.iter().filter(|(_, r)| r.status == WellStatus::Complete).collect();
    wells.sort_by(|a, b| hcsflow_plate::cmp_wells(a.0, b.0));
    for (well, record) in wells {
        for o in &record.outputs {
            let path = o.path.to_string_lossy();
            let path = if path.contains([',', '"']) { format!("\"{}\"", path.replace('"', "\"\"")) } else { path.into_owned() };
            csv.push_str(&format!(
                "{well},{},{},{},{},{},{path},{},{},{}\n",
                o.step,
                cell(o.key[0]),
                cell(o.key[1]),
                cell(o.key[2]),
                cell(o.key[3]),
                o.height,
                o.width,
                o.dtype
            ));
        }
    }
    write_atomic(&out.join(SUMMARY_NAME), csv.as_bytes())
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A write that fails half-way (the disk fills) leaves no temporary and
    /// the target as it was.
    #[test]
    fn a_failed_atomic_write_removes_its_temporary() {
        let dir = tempfile::tempdir().expect("tempdir");
        let target = dir.path().join("table.csv");
        std::fs::write(&target, "old").expect("write");
        let e = write_atomic_with(&target, b"new contents", |f, bytes| {
            std::io::Write::write_all(f, &bytes[..4])?;
            Err(std::io::Error::from_raw_os_error(28))
        })
        .expect_err("the write fails");
        let text = e.to_string();
        assert!(text.starts_with(&target.display().to_string()) && text.contains("(os error 28)"), "{text}");
        assert!(storage_exhausted(&e));
        let names: Vec<String> = std::fs::read_dir(dir.path())
            .expect("read_dir")
            .map(|e| e.expect("entry").file_name().to_string_lossy().into_owned())
            .collect();
        assert_eq!(names, ["table.csv"]);
        assert_eq!(std::fs::read_to_string(&target).expect("read"), "old");
        write_atomic(&target, b"new").expect("write");
        assert_eq!(std::fs::read_to_string(&target).expect("read"), "new");
    }

    #[test]
    fn full_quota_and_read_only_file_systems_stop_the_run() {
        let step = |source: StepError| WellError::Step { step: "x".into(), source };
        let path = Path::new("/o/a.tif");
        for code in [28, 122, 30] {
            let os = || std::io::Error::from_raw_os_error(code);
            for e in [
                step(StepError::io(path, os())),
                step(StepError::Image(hcsflow_tiff::TiffError::Io { path: path.into(), source: os() })),
                step(StepError::Output(PipelineError::io(path, os()))),
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

    #[test]
    fn the_manifest_state_names_the_wells_the_file_misses() {
        let record = |status: WellStatus| WellRecord {
            status,
            seconds: 0.0,
            error: None,
            outputs: Vec::new(),
            artifacts: Vec::new(),
            notes: Vec::new(),
            filled: Vec::new(),
        };
        let manifest = Manifest {
            version: 1,
            pipeline: "p".into(),
            digest: "d".into(),
            plate: PathBuf::from("/plate"),
            files: Vec::new(),
            zarr_plates: Vec::new(),
            wells: [
                ("A01".to_string(), record(WellStatus::Complete)),
                ("A02".to_string(), record(WellStatus::Failed)),
                ("A03".to_string(), record(WellStatus::NotStarted)),
            ]
            .into(),
        };
        let on_disk = [("A01".to_string(), WellStatus::Complete), ("A03".to_string(), WellStatus::Failed)].into();
        let state = ManifestState { manifest, on_disk, error: None };
        assert_eq!(state.unrecorded(), ["A02 (failed)", "A03 (not started)"]);
    }

    /// The manifest and the report keep the status strings of earlier
    /// versions, so their manifests are read for `--resume` and the files
    /// written are the same bytes.
    #[test]
    fn well_status_is_written_and_read_as_before() {
        for (status, text) in [
            (WellStatus::Complete, "complete"),
            (WellStatus::Failed, "failed"),
            (WellStatus::Skipped, "skipped (resumed)"),
            (WellStatus::NotStarted, "not started"),
        ] {
            assert_eq!(serde_json::to_string(&status).expect("json"), format!("\"{text}\""));
            assert_eq!(serde_json::from_str::<WellStatus>(&format!("\"{text}\"")).expect("parse"), status);
            assert_eq!(status.to_string(), text);
        }
        let old = concat!(
            r#"{"version":1,"pipeline":"p","digest":"d","plate":"/plate","wells":{"#,
            r#""A01":{"status":"complete","seconds":1.5,"outputs":[]},"#,
            r#""A02":{"status":"failed","seconds":0.5,"error":"step 'x': boom","outputs":[]},"#,
            r#""A03":{"status":"not started","seconds":0.0,"error":"not started: the run was interrupted","outputs":[]}}}"#
        );
        let manifest: Manifest = serde_json::from_str(old).expect("an earlier version's manifest");
        let statuses: Vec<WellStatus> = manifest.wells.values().map(|r| r.status).collect();
        assert_eq!(statuses, [WellStatus::Complete, WellStatus::Failed, WellStatus::NotStarted]);
        assert_eq!(serde_json::to_string(&manifest).expect("json"), old);
    }
}
