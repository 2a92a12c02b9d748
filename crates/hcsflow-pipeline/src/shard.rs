//! Sharded runs: one plate's wells split over several processes (cluster
//! array tasks, Nextflow or Snakemake jobs), then one finalize.
//!
//! Contract:
//! - **Shards.** [`Shard`] `I/N` (1-based) owns the I-th of N contiguous
//!   groups of the plate's wells in plate order ([`hcsflow_plate::cmp_wells`]),
//!   the first `wells % N` groups one well larger: never a part of a well.
//!   A shard writes only its own wells' outputs (TIFFs, OME-Zarr fields,
//!   per-well tables) and its own manifest, `OUT/.hcsflow-shards/shard-I-of-N.json`
//!   (same format as `run_manifest.json`, its wells only), rewritten after
//!   each well.
//! - **Side by side.** Shards hold `OUT/.hcsflow.lock` shared, so any number
//!   run at once into the same OUT, while a whole run or a finalize (which
//!   take it exclusively) is refused, naming the running shards. Each shard
//!   holds its own `shard-I-of-N.lock`: the same shard twice at once is
//!   refused. Shards of another count than N already in OUT are refused.
//! - **Set-up once.** Creating the OME-Zarr plates and the plate-wide steps
//!   (`scope = "plate"`) happen under `OUT/.hcsflow-shards/setup.lock`, one
//!   process at a time: the first shard (or [`prepare_shards`], the
//!   scheduler's plate job) runs the plate-wide steps and records them in
//!   `plate-steps.json`; later shards wait for the lock and re-read the
//!   results (same digest, files unchanged, as under `--resume`).
//! - **Idempotent.** A shard re-run skips its wells recorded complete whose
//!   recorded files are all present; a finished shard re-run does nothing.
//! - **Finalize.** [`finalize`] (exclusive lock: no shard may be running)
//!   merges the shard manifests into `OUT/run_manifest.json`, removes stale
//!   temporaries, and writes what a whole run writes at its end (summaries,
//!   joined tables, TIFF plate descriptors, OME-Zarr plate metadata, the run
//!   report): the same files, byte for byte (timings aside), as one
//!   `hcsflow run` of the plate. Shards that did not run, or whose wells did
//!   not all complete, are named in [`RunSummary::shard_problems`]; their
//!   wells are recorded failed or not started, so that re-running those
//!   shards then finalizing again completes the output.

use std::collections::BTreeMap;
use std::fmt;
use std::path::{Path, PathBuf};
use std::str::FromStr;
use std::time::Instant;

use hcsflow_core::{Conversions, Registry};
use serde::{Deserialize, Serialize};

use crate::compile::Plan;
use crate::exec::{Failure, Prepared, Progress, RunOptions, RunOutcome, RunReport, RunSummary, StepTiming, WellReport};
use crate::outdir;
use crate::output;
use crate::output::manifest::{Manifest, ManifestState, WellRecord, WellStatus};
use crate::output::zarr::ZarrOutput;
use crate::plate_run::{run_plate_steps, PlateResults};
use crate::PipelineError;

/// The hidden folder in OUT that holds the shards' manifests, locks and timings.
pub const SHARDS_DIR: &str = ".hcsflow-shards";
/// Held (exclusively, waiting) while a shard creates the OME-Zarr plates and
/// runs or re-reads the plate-wide steps.
const SETUP_LOCK: &str = "setup.lock";
/// The plate-wide steps of a sharded run (a run manifest without wells).
const PLATE_STEPS_NAME: &str = "plate-steps.json";

/// Shard `index` of `count` (1-based): written and parsed as `I/N`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct Shard {
    index: usize,
    count: usize,
}

/// Why a shard could not be made (a bad `--shard I/N`).
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum ShardError {
    #[error("bad shard '{0}': expected I/N, e.g. 2/8 (shard 2 of 8)")]
    Syntax(String),
    #[error("bad shard '{0}': the number of shards N must be at least 1")]
    NoShards(String),
    #[error("bad shard '{text}': I must be between 1 and N = {count}")]
    OutOfRange { text: String, count: usize },
}

impl Shard {
    /// Shard `index` of `count`; `index` in `1..=count`.
    pub fn new(index: usize, count: usize) -> Result<Shard, ShardError> {
        let text = format!("{index}/{count}");
        if count == 0 {
            return Err(ShardError::NoShards(text));
        }
        if index == 0 || index > count {
            return Err(ShardError::OutOfRange { text, count });
        }
        Ok(Shard { index, count })
    }

    /// I, from 1.
    pub fn index(self) -> usize {
        self.index
    }

    /// N.
    pub fn count(self) -> usize {
        self.count
    }

    /// The positions (in plate order) of this shard's wells among `wells`
    /// wells: the I-th of N contiguous groups, the first `wells % N` one larger.
    pub fn range(self, wells: usize) -> std::ops::Range<usize> {
        let (base, extra) = (wells / self.count, wells % self.count);
        let i = self.index - 1;
        let start = i * base + i.min(extra);
        start..start + base + usize::from(i < extra)
    }

    /// This shard's wells of `plan`, as indices into [`Plan::wells`], in plate order.
    pub fn wells(self, plan: &Plan) -> Vec<usize> {
        let sorted = plate_order(plan);
        sorted[self.range(sorted.len())].to_vec()
    }

    /// `shard-I-of-N`: the stem of this shard's files in [`SHARDS_DIR`].
    fn stem(self) -> String {
        format!("shard-{}-of-{}", self.index, self.count)
    }

    /// Its manifest, `OUT/.hcsflow-shards/shard-I-of-N.json`.
    pub fn manifest_path(self, out: &Path) -> PathBuf {
        out.join(SHARDS_DIR).join(format!("{}.json", self.stem()))
    }

    fn lock_path(self, out: &Path) -> PathBuf {
        out.join(SHARDS_DIR).join(format!("{}.lock", self.stem()))
    }

    fn timings_path(self, out: &Path) -> PathBuf {
        out.join(SHARDS_DIR).join(format!("{}.timings.json", self.stem()))
    }

    /// The shard whose file in [`SHARDS_DIR`] is named `name` with `ext` (`json`, `lock`).
    fn from_file_name(name: &str, ext: &str) -> Option<Shard> {
        let body = name.strip_prefix("shard-")?.strip_suffix(ext)?.strip_suffix('.')?;
        let (i, n) = body.split_once("-of-")?;
        Shard::new(i.parse().ok()?, n.parse().ok()?).ok()
    }
}

impl fmt::Display for Shard {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}/{}", self.index, self.count)
    }
}

impl FromStr for Shard {
    type Err = ShardError;

    /// `I/N` with decimal I and N (spaces around either allowed).
    fn from_str(text: &str) -> Result<Shard, ShardError> {
        let syntax = || ShardError::Syntax(text.to_string());
        let (i, n) = text.split_once('/').ok_or_else(syntax)?;
        let (i, n): (usize, usize) = (i.trim().parse().map_err(|_| syntax())?, n.trim().parse().map_err(|_| syntax())?);
        Shard::new(i, n).map_err(|e| match e {
            ShardError::NoShards(_) => ShardError::NoShards(text.to_string()),
            ShardError::OutOfRange { count, .. } => ShardError::OutOfRange { text: text.to_string(), count },
            other => other,
        })
    }
}

/// Indices into [`Plan::wells`] in plate order.
fn plate_order(plan: &Plan) -> Vec<usize> {
    let mut order: Vec<usize> = (0..plan.wells.len()).collect();
    order.sort_by(|&a, &b| hcsflow_plate::cmp_wells(&plan.wells[a].well, &plan.wells[b].well));
    order
}

/// Shards running now in `out` (their lock is held), each as
/// `shard I/N (holder)`, for the message refusing a whole run or a finalize.
pub(crate) fn running_shards(out: &Path) -> Vec<String> {
    let Ok(entries) = std::fs::read_dir(out.join(SHARDS_DIR)) else { return Vec::new() };
    let mut running: Vec<(Shard, String)> = entries
        .flatten()
        .filter_map(|e| Some((Shard::from_file_name(&e.file_name().to_string_lossy(), "lock")?, e.path())))
        .filter(|(_, path)| std::fs::File::open(path).is_ok_and(|f| matches!(f.try_lock_shared(), Err(std::fs::TryLockError::WouldBlock))))
        .map(|(s, path)| (s, format!("shard {s} ({})", outdir::holder_text(&path))))
        .collect();
    running.sort();
    running.into_iter().map(|(_, t)| t).collect()
}

/// The shard manifests in `out`, by shard count, then index.
fn shard_manifests(out: &Path) -> Result<BTreeMap<usize, BTreeMap<usize, PathBuf>>, PipelineError> {
    let dir = out.join(SHARDS_DIR);
    let mut found: BTreeMap<usize, BTreeMap<usize, PathBuf>> = BTreeMap::new();
    let entries = match std::fs::read_dir(&dir) {
        Ok(e) => e,
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Ok(found),
        Err(e) => return Err(PipelineError::io(&dir, e)),
    };
    for entry in entries.flatten() {
        if let Some(s) = Shard::from_file_name(&entry.file_name().to_string_lossy(), "json") {
            found.entry(s.count).or_default().insert(s.index, entry.path());
        }
    }
    Ok(found)
}

/// Refuses a manifest at `path` written by another pipeline or for another plate.
fn check_same_run(path: &Path, manifest: &Manifest, plan: &Plan) -> Result<(), PipelineError> {
    match outdir::difference(manifest, plan) {
        None => Ok(()),
        Some(difference) => Err(PipelineError::Config {
            message: format!("{} was written by a run of {difference}; shards of two runs cannot share an output folder", path.display()),
            fix: format!("choose another output folder, or remove {} and that run's outputs", path.parent().unwrap_or(path).display()),
        }),
    }
}

/// Reads a shard-side manifest; one that cannot be read is a usage error.
fn read_manifest(path: &Path) -> Result<Option<Manifest>, PipelineError> {
    Manifest::read_from(path)
        .map_err(|e| PipelineError::Config { message: e.to_string(), fix: format!("delete {} (its wells run again)", path.display()) })
}

/// Takes the shared OUT lock and refuses an OUT holding another run's
/// manifest: the start of both a shard and the plate job.
fn enter(plan: &Plan, options: &RunOptions) -> Result<outdir::OutputLock, PipelineError> {
    if options.overwrite {
        return Err(PipelineError::Config {
            message: "--overwrite cannot be used with shards: each shard would remove what the others wrote".into(),
            fix: "run `hcsflow run … --overwrite` once without --shard, or choose another output folder".into(),
        });
    }
    std::fs::create_dir_all(plan.out.join(SHARDS_DIR)).map_err(|e| PipelineError::io(&plan.out, e))?;
    let lock = outdir::lock_shared(&plan.out, plan)?;
    if let Some(previous) = outdir::previous_manifest(&plan.out)? {
        check_same_run(&plan.out.join(crate::MANIFEST_NAME), &previous, plan)?;
    }
    Ok(lock)
}

/// Creates (or reopens) the OME-Zarr plates and runs (or re-reads) the
/// plate-wide steps, under the set-up lock.
fn set_up(
    plan: &Plan,
    registry: &Registry,
    conversions: &Conversions,
    options: &RunOptions,
    progress: &(dyn Fn(Progress<'_>) + Sync),
) -> Result<(ZarrOutput, PlateResults, Vec<crate::Note>), PipelineError> {
    let dir = plan.out.join(SHARDS_DIR);
    let _setup = outdir::wait_for(&dir.join(SETUP_LOCK))?;
    let layouts = output::zarr::layouts(plan, &plan.channel_names, options.zarr_format);
    let roots: Vec<PathBuf> = layouts.iter().map(|l| l.root.clone()).collect();
    let zarr = ZarrOutput::open(layouts)?;
    let path = dir.join(PLATE_STEPS_NAME);
    let mut manifest = Manifest::new(plan, &roots);
    if let Some(previous) = read_manifest(&path)? {
        check_same_run(&path, &previous, plan)?;
        manifest.plate_steps = previous.plate_steps.into_iter().filter(|(_, r)| r.status == WellStatus::Complete).collect();
    }
    manifest.write_to(&path)?;
    let results = run_plate_steps(plan, registry, conversions, true, &mut manifest, &path, progress)?;
    let notes = manifest.plate_steps.values().flat_map(|r| r.notes.iter().cloned()).collect();
    Ok((zarr, results, notes))
}

/// The plate job of a sharded run: creates the OME-Zarr plates and runs the
/// plate-wide steps (or finds them done), so that the shards only re-read
/// their results. Shards do this themselves when it has not been done; a
/// scheduler runs it first so that they do not wait on each other for it.
pub fn prepare_shards(
    plan: &Plan,
    registry: &Registry,
    conversions: &Conversions,
    options: &RunOptions,
    progress: &(dyn Fn(Progress<'_>) + Sync),
) -> Result<(), PipelineError> {
    let _lock = enter(plan, options)?;
    set_up(plan, registry, conversions, options, progress).map(|_| ())
}

/// Everything shard `shard` of `plan` needs before its wells start (see the
/// module's contract): the locks, the set-up, its manifest with the wells a
/// previous run of it completed (and whose files are all present).
pub(crate) fn prepare(
    plan: &Plan,
    shard: Shard,
    registry: &Registry,
    conversions: &Conversions,
    options: &RunOptions,
    progress: &(dyn Fn(Progress<'_>) + Sync),
) -> Result<Prepared, PipelineError> {
    let out_lock = enter(plan, options)?;
    let others: Vec<usize> = shard_manifests(&plan.out)?.into_keys().filter(|&n| n != shard.count).collect();
    if let Some(n) = others.first() {
        return Err(PipelineError::Config {
            message: format!(
                "{} holds shards of {n} (files shard-*-of-{n}.json); shard {shard} would split the wells differently",
                plan.out.join(SHARDS_DIR).display()
            ),
            fix: format!("run the shards as I/{n}, or use another output folder"),
        });
    }
    let shard_lock = match outdir::take(&shard.lock_path(&plan.out), plan, false)? {
        Ok(lock) => lock,
        Err(who) => {
            return Err(PipelineError::Config {
                message: format!("shard {shard} of {} is already running: {who}", plan.out.display()),
                fix: "wait for it to finish; a finished shard re-run skips its complete wells".into(),
            })
        }
    };
    let (zarr, plate, plate_notes) = set_up(plan, registry, conversions, options, progress)?;
    let wells = shard.wells(plan);
    let path = shard.manifest_path(&plan.out);
    let mut manifest = Manifest::new(plan, &zarr.roots());
    if let Some(previous) = read_manifest(&path)? {
        check_same_run(&path, &previous, plan)?;
        let mine: Vec<&str> = wells.iter().map(|&i| plan.wells[i].well.as_str()).collect();
        manifest.wells = previous.wells.into_iter().filter(|(w, r)| mine.contains(&w.as_str()) && verified(&plan.out, r)).collect();
    }
    manifest.write_to(&path)?;
    let on_disk = manifest.wells.iter().map(|(w, r)| (w.clone(), r.status)).collect();
    Ok(Prepared {
        locks: vec![out_lock, shard_lock],
        state: ManifestState { path, manifest, on_disk, error: None },
        zarr,
        plate,
        plate_notes,
        wells,
    })
}

/// True if `record` is complete and every file it lists is present.
fn verified(out: &Path, record: &WellRecord) -> bool {
    record.status == WellStatus::Complete
        && record.outputs.iter().map(|o| &o.path).chain(record.artifacts.iter().map(|a| &a.path)).all(|p| out.join(p).is_file())
}

/// Where a shard of a run stands in OUT, from its manifest and lock.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum ShardState {
    /// No manifest: it never started in this folder.
    NotRun,
    /// Its lock is held: it runs now.
    Running,
    /// Every one of its wells is complete, with its files present.
    Complete,
    /// It ran, and `complete` of its `wells` are complete (the others failed,
    /// were not started, or were lost when it was killed).
    Incomplete { complete: usize, wells: usize },
}

/// Where shard `shard` of `plan`'s run stands in `plan.out`. A manifest of
/// another run is an error ([`PipelineError::Config`]).
pub fn shard_state(plan: &Plan, shard: Shard) -> Result<ShardState, PipelineError> {
    let lock = shard.lock_path(&plan.out);
    if std::fs::File::open(&lock).is_ok_and(|f| matches!(f.try_lock_shared(), Err(std::fs::TryLockError::WouldBlock))) {
        return Ok(ShardState::Running);
    }
    let path = shard.manifest_path(&plan.out);
    let Some(manifest) = read_manifest(&path)? else { return Ok(ShardState::NotRun) };
    check_same_run(&path, &manifest, plan)?;
    let wells = shard.wells(plan);
    let complete = wells.iter().filter(|&&i| manifest.wells.get(&plan.wells[i].well).is_some_and(|r| verified(&plan.out, r))).count();
    Ok(if complete == wells.len() { ShardState::Complete } else { ShardState::Incomplete { complete, wells: wells.len() } })
}

/// What a shard's manifest in OUT records, read without the plan
/// ([`recorded_shards`]): how many wells it completed, failed or did not start.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ShardRecord {
    pub shard: Shard,
    pub complete: usize,
    pub failed: usize,
    pub not_started: usize,
    /// Its lock is held: it runs now.
    pub running: bool,
}

/// Every shard manifest in `out` (all counts), in shard order.
pub fn recorded_shards(out: &Path) -> Result<Vec<ShardRecord>, PipelineError> {
    let mut records = Vec::new();
    for (count, files) in shard_manifests(out)? {
        for (index, path) in files {
            let shard = Shard { index, count };
            let manifest = read_manifest(&path)?;
            let wells = manifest.as_ref().map(|m| m.wells.values().map(|r| r.status).collect::<Vec<_>>()).unwrap_or_default();
            let lock = shard.lock_path(out);
            records.push(ShardRecord {
                shard,
                complete: wells.iter().filter(|s| **s == WellStatus::Complete).count(),
                failed: wells.iter().filter(|s| **s == WellStatus::Failed).count(),
                not_started: wells.iter().filter(|s| **s == WellStatus::NotStarted).count(),
                running: std::fs::File::open(&lock).is_ok_and(|f| matches!(f.try_lock_shared(), Err(std::fs::TryLockError::WouldBlock))),
            });
        }
    }
    Ok(records)
}

/// A shard's step timings per well, the GPU adapter and queue of its wells
/// that had them, and the wall time of its runs, kept for the finalize's run
/// report.
#[derive(Debug, Default, Serialize, Deserialize)]
pub(crate) struct ShardTimings {
    /// Seconds of every run of the shard, summed.
    seconds: f64,
    wells: BTreeMap<String, Vec<StepTiming>>,
    /// Absent in the files of earlier versions: read as none.
    #[serde(default, skip_serializing_if = "BTreeMap::is_empty")]
    gpus: BTreeMap<String, WellGpu>,
}

/// Where a well's GPU calls ran, as its report names it ([`WellReport::adapter`], [`WellReport::queue`]).
#[derive(Debug, Clone, Default, Serialize, Deserialize)]
struct WellGpu {
    adapter: Option<String>,
    queue: Option<String>,
}

/// Adds the timings of the wells that ran in this run of `shard` to its timings file.
pub(crate) fn write_timings(plan: &Plan, shard: Shard, seconds: f64, wells: &[WellReport]) -> Result<(), PipelineError> {
    let path = shard.timings_path(&plan.out);
    let mut timings = read_timings(&path);
    timings.seconds += seconds;
    for w in wells.iter().filter(|w| !w.steps.is_empty()) {
        timings.wells.insert(w.well.clone(), w.steps.clone());
        if w.adapter.is_some() || w.queue.is_some() {
            timings.gpus.insert(w.well.clone(), WellGpu { adapter: w.adapter.clone(), queue: w.queue.clone() });
        }
    }
    let json = serde_json::to_vec_pretty(&timings).map_err(|e| PipelineError::io(&path, std::io::Error::other(e)))?;
    output::write_atomic(&path, &json)
}

fn read_timings(path: &Path) -> ShardTimings {
    std::fs::read(path).ok().and_then(|b| serde_json::from_slice(&b).ok()).unwrap_or_default()
}

/// Merges the shards of `plan`'s run in OUT into one run (see the module's
/// contract) and returns its summary. `Err` only for what stops it before it
/// writes anything: OUT in use (a shard still running), manifests of another
/// run, shards of several counts.
pub fn finalize(plan: &Plan, options: &RunOptions) -> Result<RunSummary, PipelineError> {
    let started = Instant::now();
    std::fs::create_dir_all(&plan.out).map_err(|e| PipelineError::io(&plan.out, e))?;
    let _lock = outdir::lock(&plan.out, plan)?;
    let previous = outdir::previous_manifest(&plan.out)?;
    if let Some(previous) = &previous {
        check_same_run(&plan.out.join(crate::MANIFEST_NAME), previous, plan)?;
    }
    let found = shard_manifests(&plan.out)?;
    if found.len() > 1 {
        let counts: Vec<String> = found.keys().map(|n| format!("shard-*-of-{n}.json")).collect();
        return Err(PipelineError::Config {
            message: format!("{} holds shards of several counts ({})", plan.out.join(SHARDS_DIR).display(), counts.join(", ")),
            fix: "remove the manifests of the count not in use, re-run its wells' shards, then finalize".into(),
        });
    }
    let dir = plan.out.join(SHARDS_DIR);
    let plate_steps_path = dir.join(PLATE_STEPS_NAME);
    let plate_steps = match read_manifest(&plate_steps_path)? {
        Some(m) => {
            check_same_run(&plate_steps_path, &m, plan)?;
            m.plate_steps
        }
        None => BTreeMap::new(),
    };
    let layouts = output::zarr::layouts(plan, &plan.channel_names, options.zarr_format);
    let roots: Vec<PathBuf> = layouts.iter().map(|l| l.root.clone()).collect();
    let mut merged = Manifest::new(plan, &roots);
    merged.plate_steps = plate_steps;

    let mut problems = Vec::new();
    let mut timings = Vec::new();
    let mut shard_seconds = 0.0;
    let names = |idx: &[usize]| idx.iter().map(|&i| plan.wells[i].well.as_str()).collect::<Vec<_>>().join(", ");
    match found.into_iter().next() {
        None => {
            let why = "not started: no shard of this run has run".to_string();
            problems.push(format!("no shard has run in {} (no {SHARDS_DIR}/shard-*-of-N.json)", plan.out.display()));
            for w in &plan.wells {
                merged.wells.insert(w.well.clone(), WellRecord::ended(WellStatus::NotStarted, 0.0, Some(why.clone())));
            }
        }
        Some((count, files)) => {
            for index in 1..=count {
                // 1 ≤ index ≤ count: always a shard.
                let Ok(shard) = Shard::new(index, count) else { continue };
                let wells = shard.wells(plan);
                let Some(path) = files.get(&index) else {
                    problems.push(format!("shard {shard} did not run (well(s) {})", names(&wells)));
                    for &i in &wells {
                        let why = format!("not started: shard {shard} did not run");
                        merged.wells.insert(plan.wells[i].well.clone(), WellRecord::ended(WellStatus::NotStarted, 0.0, Some(why)));
                    }
                    continue;
                };
                let manifest = read_manifest(path)?.unwrap_or_else(|| Manifest::new(plan, &roots));
                check_same_run(path, &manifest, plan)?;
                let shard_timings = read_timings(&shard.timings_path(&plan.out));
                shard_seconds += shard_timings.seconds;
                timings.push((shard_timings.wells, shard_timings.gpus));
                let mut incomplete = Vec::new();
                for &i in &wells {
                    let well = &plan.wells[i].well;
                    let record = manifest.wells.get(well).cloned().unwrap_or_else(|| {
                        let why = format!("not started: shard {shard} stopped before this well (killed or cancelled)");
                        WellRecord::ended(WellStatus::NotStarted, 0.0, Some(why))
                    });
                    if record.status != WellStatus::Complete {
                        incomplete.push(format!("{well} {}", record.status));
                    }
                    merged.wells.insert(well.clone(), record);
                }
                if !incomplete.is_empty() {
                    problems.push(format!(
                        "shard {shard}: {} of {} well(s) not complete ({})",
                        incomplete.len(),
                        wells.len(),
                        incomplete.join(", ")
                    ));
                }
            }
        }
    }

    let stale = outdir::remove_stale_temps(&plan.out, plan, previous.as_ref(), &roots);
    if stale > 0 {
        tracing::info!("removed {stale} temporary file(s) left in {} by interrupted shards", plan.out.display());
    }
    let mut state = ManifestState { path: plan.out.join(crate::MANIFEST_NAME), on_disk: BTreeMap::new(), manifest: merged, error: None };
    state.save();
    let manifest_error = state.error.as_ref().map(|e| e.to_string());
    let manifest = state.manifest;
    let mut write_errors = Vec::new();
    let (zarr_plates, artifact_tables) = match ZarrOutput::open(layouts) {
        Ok(zarr) => {
            let written = crate::exec::write_plate_outputs(plan, &manifest, zarr);
            write_errors.extend(written.write_errors);
            (written.zarr_plates, written.artifact_tables)
        }
        Err(e) => {
            write_errors.push(e.to_string());
            (Vec::new(), Vec::new())
        }
    };

    let order = plate_order(plan);
    let wells: Vec<WellReport> = order
        .iter()
        .map(|&i| {
            let w = &plan.wells[i];
            // Every well of the plan was recorded above; a gap would be "not started".
            let missing = WellRecord::ended(WellStatus::NotStarted, 0.0, Some("not started".into()));
            let record = manifest.wells.get(&w.well).unwrap_or(&missing);
            let steps = timings.iter().find_map(|(t, _)| t.get(&w.well)).cloned().unwrap_or_default();
            let gpu = timings.iter().find_map(|(_, g)| g.get(&w.well)).cloned().unwrap_or_default();
            let bytes_read = if record.status == WellStatus::Complete { w.input_bytes } else { 0 };
            WellReport { steps, bytes_read, adapter: gpu.adapter, queue: gpu.queue, ..record.report(&w.well) }
        })
        .collect();
    let by = |status: WellStatus| wells.iter().filter(move |w| w.status == status).map(|w| w.well.clone());
    let completed: Vec<String> = by(WellStatus::Complete).collect();
    let not_started: Vec<String> = by(WellStatus::NotStarted).collect();
    let plate_notes: Vec<crate::Note> = manifest.plate_steps.values().flat_map(|r| r.notes.iter().cloned()).collect();
    let seconds = if shard_seconds > 0.0 { shard_seconds } else { started.elapsed().as_secs_f64() };
    let mut run = RunOutcome { workers: options.workers, seconds, stopped: None, manifest_error, write_errors };
    let mut report = RunReport::from_wells(plan, options, wells, &run);
    report.notes.splice(0..0, plate_notes);
    if let Err(e) = output::write_run_report(&plan.out, &report) {
        report.write_errors.push(e.to_string());
        run.write_errors.push(e.to_string());
    }
    let failed: Vec<Failure> = report.failures.clone();
    Ok(RunSummary {
        total: plan.wells.len(),
        completed,
        skipped: Vec::new(),
        failed,
        not_started,
        stopped: None,
        filled: report.filled.clone(),
        manifest_error: run.manifest_error,
        write_errors: run.write_errors,
        zarr_plates,
        artifact_tables,
        shard_problems: problems,
        shard: None,
        report,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn shards_are_contiguous_near_equal_and_cover_every_well_once() {
        for wells in 0..40 {
            for count in 1..12 {
                let ranges: Vec<_> = (1..=count).map(|i| Shard::new(i, count).expect("shard").range(wells)).collect();
                assert_eq!(ranges.first().map(|r| r.start), Some(0));
                assert_eq!(ranges.last().map(|r| r.end), Some(wells));
                for pair in ranges.windows(2) {
                    assert_eq!(pair[0].end, pair[1].start, "{wells} wells / {count}");
                    assert!(pair[0].len() == pair[1].len() || pair[0].len() == pair[1].len() + 1, "{wells} wells / {count}: {ranges:?}");
                }
            }
        }
        assert_eq!(Shard::new(1, 3).expect("shard").range(8), 0..3);
        assert_eq!(Shard::new(2, 3).expect("shard").range(8), 3..6);
        assert_eq!(Shard::new(3, 3).expect("shard").range(8), 6..8);
    }

    #[test]
    fn shards_parse_as_i_of_n_and_bad_ones_say_why() {
        assert_eq!("2/3".parse::<Shard>(), Shard::new(2, 3));
        assert_eq!(" 1 / 1 ".parse::<Shard>().map(|s| s.to_string()), Ok("1/1".to_string()));
        assert_eq!("0/3".parse::<Shard>(), Err(ShardError::OutOfRange { text: "0/3".into(), count: 3 }));
        assert_eq!("4/3".parse::<Shard>(), Err(ShardError::OutOfRange { text: "4/3".into(), count: 3 }));
        assert_eq!("3/0".parse::<Shard>(), Err(ShardError::NoShards("3/0".into())));
        for bad in ["x", "1", "1/", "/3", "-1/3", "1/3/4", "a/b"] {
            assert_eq!(bad.parse::<Shard>(), Err(ShardError::Syntax(bad.into())), "{bad}");
        }
        assert_eq!(ShardError::OutOfRange { text: "4/3".into(), count: 3 }.to_string(), "bad shard '4/3': I must be between 1 and N = 3");
    }

    #[test]
    fn shard_files_are_named_by_index_and_count() {
        let s = Shard::new(2, 12).expect("shard");
        let path = s.manifest_path(Path::new("/o"));
        assert_eq!(path, Path::new("/o/.hcsflow-shards/shard-2-of-12.json"));
        let name = path.file_name().map(|n| n.to_string_lossy().into_owned()).unwrap_or_default();
        assert_eq!(Shard::from_file_name(&name, "json"), Some(s));
        assert_eq!(Shard::from_file_name("shard-2-of-12.lock", "lock"), Some(s));
        for other in ["shard-0-of-2.json", "shard-3-of-2.json", "shard-2-of-12.timings.json", "plate-steps.json", "shard-2-of-12json"] {
            assert_eq!(Shard::from_file_name(other, "json"), None, "{other}");
        }
    }
}
