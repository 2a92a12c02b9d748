//! Plate-wide steps, run side: each runs once, before any well, on its
//! sample of the plate ([`crate::scope`]), and its results reach the wells.
//!
//! Contract:
//! - **Memory.** A group's planes are read in parallel, and each is reduced
//!   by the step's [`PlaneReduction`](hcsflow_core::PlaneReduction) (if its
//!   first function declares one) as soon as it is read, so the step holds at
//!   most `sampled × reduced plane` bytes plus one full plane per reading
//!   thread (`basic_fit` at its default working size: `sample × 128² × 4`
//!   bytes, 13 MB for 200 planes, plus a few tiles), never the sample at full
//!   size. Without a reduction it holds the sampled planes at full size.
//!   [`PlateStepPlan::estimate_bytes`] states the bound.
//! - **Outputs.** Each group's result is written atomically to
//!   `OUT/<step>/<group>.tif` (e.g. `channel_1_DAPI.tif`, `[flat-field,
//!   dark-field]` as f32 pages for `basic_fit`), its tables to
//!   `OUT/<step>/<artifact>.csv` (a row per sampled plane, with its well), and
//!   the step to the run manifest (`plate_steps`: digest, files with size and
//!   checksum, notes) before any well starts.
//! - **Resume.** With `--resume`, a step the manifest records complete with
//!   the plan's digest, whose files are all present with the recorded size
//!   and checksum, is not run again: its results are read back.
//! - **Failure.** A step that fails (a sampled image that cannot be read —
//!   the error names the file —, its function failing) is recorded failed in
//!   the manifest and stops the run before any well starts
//!   ([`PipelineError::PlateStep`]): no well is corrected with nothing.

use std::collections::BTreeMap;
use std::path::Path;
use std::sync::Arc;
use std::time::Instant;

use hcsflow_core::{Array, CallContext, Conversions, Device, OutputDType, Registry, Stack, StackInfo, Table};
use hcsflow_tiff::WriteOptions;
use rayon::prelude::*;

use crate::compile::{Action, Key, Plan, StepPlan};
use crate::exec::{plane_info, read_plate_image, Progress, StepError};
use crate::output::manifest::{ArtifactRecord, Manifest, Note, PlateOutputRecord, PlateStepRecord, WellStatus};
use crate::output::tables::write_plate_artifact;
use crate::scope::{fnv1a, plate_scope_text, PlateGroupPlan, PlatePlane, PlateStepPlan};
use crate::PipelineError;

/// The results of the plate-wide steps by (step index, group index).
pub(crate) type PlateResults = BTreeMap<(usize, usize), Arc<Stack>>;

/// A table a group produced, with the (well, plane) of each sampled plane its rows index.
pub(crate) type SampledTable = (Table, Vec<(String, Key)>);

/// What one group of a plate-wide step produced.
struct GroupOutcome {
    result: Stack,
    tables: Vec<(String, Table)>,
    notes: Vec<String>,
}

/// Runs (or, with `reuse` — `--resume`, shards —, re-reads) every plate-wide
/// step of `plan` in order and records each in `manifest` (written to
/// `manifest_path` after each step). A failure is recorded and returned: the
/// run must not start its wells.
pub(crate) fn run_plate_steps(
    plan: &Plan,
    registry: &Registry,
    conversions: &Conversions,
    reuse_results: bool,
    manifest: &mut Manifest,
    manifest_path: &Path,
    progress: &(dyn Fn(Progress<'_>) + Sync),
) -> Result<PlateResults, PipelineError> {
    let mut results = PlateResults::new();
    for ps in &plan.plate_steps {
        let step = &plan.steps[ps.step];
        let started = Instant::now();
        let finished = |reused: bool, error: Option<&str>| {
            progress(Progress::PlateStepFinished { step: &step.name, seconds: started.elapsed().as_secs_f64(), reused, error });
        };
        if reuse_results {
            if let Some(previous) = manifest.plate_steps.get(&step.name).and_then(|r| reuse(plan, ps, r)) {
                tracing::info!("plate-wide step '{}': complete in an earlier run, its results re-read (--resume)", step.name);
                results.extend(previous.into_iter().map(|(gi, s)| ((ps.step, gi), Arc::new(s))));
                finished(true, None);
                continue;
            }
        }
        let span = tracing::info_span!("plate step", step = %step.name);
        let _in_step = span.enter();
        let running = ps.groups.iter().filter(|g| g.action != Action::Skip);
        let (groups, planes) = running.fold((0, 0), |(g, p), group| (g + 1, p + group.inputs.len()));
        progress(Progress::PlateStepStarted { step: &step.name, groups, planes });
        match run_plate_step(plan, ps, registry, conversions) {
            Ok((groups, record)) => {
                let record = PlateStepRecord { seconds: started.elapsed().as_secs_f64(), ..record };
                manifest.plate_steps.insert(step.name.clone(), record);
                manifest.write_to(manifest_path)?;
                results.extend(groups.into_iter().map(|(gi, s)| ((ps.step, gi), Arc::new(s))));
                finished(false, None);
            }
            Err(e) => {
                let message = e.to_string();
                finished(false, Some(&message));
                let record = PlateStepRecord {
                    status: WellStatus::Failed,
                    digest: ps.digest.clone(),
                    seconds: started.elapsed().as_secs_f64(),
                    error: Some(message.clone()),
                    outputs: Vec::new(),
                    artifacts: Vec::new(),
                    notes: Vec::new(),
                };
                manifest.plate_steps.insert(step.name.clone(), record);
                if let Err(write) = manifest.write_to(manifest_path) {
                    tracing::warn!("the run manifest could not record the failure of plate-wide step '{}': {write}", step.name);
                }
                return Err(PipelineError::PlateStep { step: step.name.clone(), message });
            }
        }
    }
    Ok(results)
}

/// The results of `ps` as an earlier run recorded them, if that run
/// completed the same step (digest) and every file is as it wrote it.
fn reuse(plan: &Plan, ps: &PlateStepPlan, record: &PlateStepRecord) -> Option<Vec<(usize, Stack)>> {
    if record.status != WellStatus::Complete || record.digest != ps.digest {
        return None;
    }
    let mut out = Vec::new();
    for (gi, g) in ps.groups.iter().enumerate().filter(|(_, g)| g.action != Action::Skip) {
        let rel = g.output.strip_prefix(&plan.out).ok()?;
        let o = record.outputs.iter().find(|o| o.scope == g.scope && o.path == rel)?;
        let bytes = std::fs::read(&g.output).ok()?;
        if bytes.len() as u64 != o.bytes || format!("{:016x}", fnv1a(&bytes)) != o.checksum {
            tracing::info!("{}: changed since the earlier run; plate-wide step runs again", g.output.display());
            return None;
        }
        out.push((gi, hcsflow_tiff::read_stack(&g.output).ok()?));
    }
    Some(out)
}

/// Runs every group of `ps`, writes its results and tables, and returns
/// them with the step's manifest record (its time left to the caller).
fn run_plate_step(
    plan: &Plan,
    ps: &PlateStepPlan,
    registry: &Registry,
    conversions: &Conversions,
) -> Result<(Vec<(usize, Stack)>, PlateStepRecord), StepError> {
    let step = &plan.steps[ps.step];
    let mut results = Vec::new();
    let mut outputs = Vec::new();
    let mut notes = Vec::new();
    let mut tables: BTreeMap<String, Vec<SampledTable>> = BTreeMap::new();
    for (gi, g) in ps.groups.iter().enumerate() {
        let Action::Chain(ci) = g.action else { continue };
        let scope = plate_scope_text(&plan.channel_names, &g.scope);
        let outcome = run_plate_group(plan, ps, step, ci, g, registry, conversions)
            .map_err(|e| StepError::Failed(format!("{scope} ({} sampled plane(s)): {e}", g.inputs.len())))?;
        let written = write_result(plan, g, &outcome.result)?;
        outputs.push(written);
        notes.extend(outcome.notes.into_iter().map(|text| Note {
            well: String::new(),
            step: step.name.clone(),
            text: format!("{scope}: {text}"),
        }));
        let planes: Vec<(String, Key)> = g.inputs.iter().map(|p| (p.well.clone(), p.key)).collect();
        for (name, table) in outcome.tables {
            tables.entry(name).or_default().push((table, planes.clone()));
        }
        results.push((gi, outcome.result));
    }
    let artifacts: Vec<ArtifactRecord> =
        tables.iter().map(|(name, t)| write_plate_artifact(plan, &step.name, name, t)).collect::<Result<_, PipelineError>>()?;
    let record =
        PlateStepRecord { status: WellStatus::Complete, digest: ps.digest.clone(), seconds: 0.0, error: None, outputs, artifacts, notes };
    Ok((results, record))
}

/// Reads the group's sampled planes (each reduced as it is read), runs the
/// chain on them as one stack and brings the result to the host.
fn run_plate_group(
    plan: &Plan,
    ps: &PlateStepPlan,
    step: &StepPlan,
    ci: usize,
    g: &PlateGroupPlan,
    registry: &Registry,
    conversions: &Conversions,
) -> Result<GroupOutcome, StepError> {
    let chain = &step.chains[ci];
    let (h, w, dtype) = plan.plane;
    let read = |p: &PlatePlane| -> Result<Stack, StepError> {
        let plane = read_plate_image(plan, &p.path, p.at.as_ref())?;
        match &ps.reduction {
            // The full plane is dropped here: only the reduced one is kept.
            Some(r) => (r.reduce)(&plane).map_err(|e| StepError::Failed(format!("{}: reducing the plane: {e}", p.path.display()))),
            None => Ok(plane),
        }
    };
    let planes = tracing::info_span!("read").in_scope(|| g.inputs.par_iter().map(read).collect::<Result<Vec<Stack>, StepError>>())?;
    let stack = Stack::concat_owned(planes).ok_or_else(|| StepError::Failed("the sampled planes differ in size or dtype".into()))?;
    let input_dtype = dtype;
    let mut array = Array::from(stack);
    let mut tables = Vec::new();
    let mut notes = Vec::new();
    for (k, call) in chain.calls.iter().enumerate() {
        let planes = if chain.reduced_before.get(k).copied().unwrap_or(false) {
            Vec::new()
        } else {
            g.inputs.iter().map(|p| plane_info(plan, &p.well, &p.key)).collect()
        };
        let info = StackInfo { well: String::new(), planes, pixel_size_um: plan.pixel_size_um };
        let mut context = CallContext::new(info, BTreeMap::new());
        if k == 0 && ps.reduction.is_some() {
            context.reduced_from = Some((h, w));
        }
        let _in_call = tracing::info_span!("call", function = %call.function, device = %call.device).entered();
        array = registry.execute_in(call, array, conversions, &mut context).map_err(|e| StepError::Failed(e.to_string()))?;
        let (produced, call_notes) = context.take_results();
        // Tables of a later call of the chain no longer index the sampled planes.
        tables.extend(produced.into_iter().filter(|_| k == 0 || !chain.reduces));
        notes.extend(call_notes);
    }
    let array = conversions.execute(&chain.route_out, array, Device::Cpu).map_err(|e| StepError::Failed(e.to_string()))?;
    let result = array.into_host_stack().ok_or_else(|| StepError::Failed("the chain did not return a 3D host stack".into()))?;
    // A plate-wide result keeps the function's dtype (basic_fit: f32) unless the step names one.
    let result = match step.dtype.output {
        OutputDType::Input => result,
        OutputDType::Fixed(_) => result.apply_policy(input_dtype, step.dtype),
    };
    Ok(GroupOutcome { result, tables, notes })
}

/// Writes a group's result to its TIFF (atomically) and returns its record
/// with the file's size and checksum.
fn write_result(plan: &Plan, g: &PlateGroupPlan, result: &Stack) -> Result<PlateOutputRecord, StepError> {
    if let Some(parent) = g.output.parent() {
        std::fs::create_dir_all(parent).map_err(|e| StepError::io(parent, e))?;
    }
    crate::output::disk_full::reserve(result.nbytes() as u64).map_err(|e| StepError::io(&g.output, e))?;
    let options = WriteOptions { pixel_size_um: plan.pixel_size_um.filter(|p| p.is_finite() && *p > 0.0), ..Default::default() };
    hcsflow_tiff::write_stack(&g.output, result, &options)?;
    let bytes = std::fs::read(&g.output).map_err(|e| StepError::io(&g.output, e))?;
    Ok(PlateOutputRecord {
        scope: g.scope,
        path: g.output.strip_prefix(&plan.out).map(Path::to_path_buf).unwrap_or_else(|_| g.output.clone()),
        sampled: g.inputs.len(),
        available: g.available,
        bytes: bytes.len() as u64,
        checksum: format!("{:016x}", fnv1a(&bytes)),
    })
}
