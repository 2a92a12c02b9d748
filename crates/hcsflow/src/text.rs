//! The texts a front end shows a person about a run: the plan (`--dry-run`),
//! the line that starts a run, the summary after it and its problems. They
//! name the CLI's flags (`--missing fill`, `--resume`), which every front end
//! documents under the same names.

use std::collections::{BTreeMap, BTreeSet};
use std::fmt::{self, Write as _};

use hcsflow_pipeline::{plate_scope_text, Action, InputSource, MissingPolicy, Plan, RunSummary, MANIFEST_NAME, SUMMARY_NAME};

/// The plan as a person reads it (`hcsflow run --dry-run`): plate, missing
/// images, device, the GPU adapter of each well, and output folder; per step the function chain with
/// contracts, memory types, routes and devices, the artifacts it produces and
/// consumes, and per well the number of stacks (for a plate-wide step: its
/// sample size and seed, the reduction applied as planes are read, and per
/// group the planes sampled of those available and the result's file); then
/// the disabled steps.
///
/// ```
/// # fn main() -> Result<(), Box<dyn std::error::Error>> {
/// # let dir = tempfile::tempdir()?;
/// # let config = hcsflow_synth::SynthConfig {
/// #     wells: vec!["A01".into()], size: 64, z_planes: 2, grid_rows: 2, grid_cols: 2,
/// #     ..Default::default()
/// # };
/// # hcsflow_synth::generate(&config, &dir.path().join("plate"))?;
/// let engine = hcsflow::Engine::builtin();
/// let spec = hcsflow::pipeline::PipelineSpec::parse(
///     r#"
///     name = "max_z"
///     [[steps]]
///     name = "max_z"
///     func = "max_projection"
///     variable_components = ["z_index"]
///     "#,
///     "inline",
/// )?;
/// let options = hcsflow::RunOptions { device: hcsflow::DeviceOptions::cpu(), ..Default::default() };
/// let plan = engine.plan_spec(&dir.path().join("plate"), &spec, &dir.path().join("out"), &options)?;
/// let text = hcsflow::plan_text(&plan);
/// assert!(text.starts_with("plan: pipeline 'max_z'"));
/// assert!(text.contains("device: cpu (requested: --device cpu)"));
/// assert!(text.contains("chain: max_projection (volumetric_to_slice, host → host on cpu)"));
/// # Ok(())
/// # }
/// ```
pub fn plan_text(plan: &Plan) -> String {
    let mut s = String::new();
    let _ = writeln!(s, "plan: pipeline '{}' (digest {})", plan.pipeline_name, plan.digest);
    let _ = writeln!(
        s,
        "plate: {} ({} wells, planes {}×{} {})",
        plan.plate_root.display(),
        plan.wells.len(),
        plan.plane.0,
        plan.plane.1,
        plan.plane.2
    );
    s.push_str(&missing_text(plan));
    if let Some(w) = plan.wells.iter().max_by_key(|w| w.estimate_bytes) {
        let _ = writeln!(
            s,
            "memory: a well needs about {} at its peak (largest: {}), what --max-memory budgets",
            hcsflow_pipeline::split::bytes_text(w.estimate_bytes),
            w.well
        );
    }
    let _ = writeln!(s, "device: {} ({})", plan.device, plan.device_reason);
    s.push_str(&gpus_text(plan));
    let _ = writeln!(s, "output: {}", plan.out.display());
    for (i, step) in plan.steps.iter().enumerate() {
        let variable: Vec<&str> = step.variable.iter().map(|c| c.name()).collect();
        let _ = writeln!(
            s,
            "step {} '{}': variable_components [{}], group_by {}, input {}, materialize [{}], dtype {:?}",
            i + 1,
            step.name,
            variable.join(", "),
            step.group_by.map(|g| g.name()).unwrap_or("none"),
            match step.input_source {
                InputSource::Previous => "previous",
                InputSource::PipelineStart => "pipeline_start (re-read from the plate)",
            },
            step.materialize.iter().map(|m| format!("{m:?}").to_lowercase()).collect::<Vec<_>>().join(", "),
            step.dtype.output,
        );
        for chain in &step.chains {
            let prefix = chain.label.as_ref().map(|l| format!("  [{l}] ")).unwrap_or_else(|| "  ".into());
            let calls: Vec<String> = chain
                .calls
                .iter()
                .map(|c| {
                    format!(
                        "{} ({}, {} → {} on {})",
                        c.function, c.contract, c.implementation.memory_in, c.implementation.memory_out, c.device
                    )
                })
                .collect();
            let _ = writeln!(s, "{prefix}chain: {}", calls.join(" → "));
            for (c, host_work) in chain.calls.iter().zip(&chain.host_work) {
                let _ = writeln!(s, "      route into {}: {}", c.function, c.route_in);
                if let Some(w) = host_work {
                    let _ = writeln!(
                        s,
                        "      route inside {} (no '{}' from an earlier step; it {} on the host): {}",
                        c.function, w.without, w.work, w.route
                    );
                }
            }
            let _ = writeln!(s, "      route out: {}", chain.route_out);
        }
        for a in &step.produces {
            let _ = writeln!(s, "  produces '{a}': {}", step.out_dir.join(format!("{a}.csv")).display());
        }
        for a in &step.consumes {
            match a.from_step {
                Some(from) if plan.steps[from].plate.is_some() => {
                    let _ = writeln!(
                        s,
                        "  consumes '{}' from the plate-wide step '{}': each stack gets the result of its own group",
                        a.name, plan.steps[from].name
                    );
                }
                Some(from) => {
                    let _ = writeln!(s, "  consumes '{}' from step '{}'", a.name, plan.steps[from].name);
                }
                None => {
                    let _ = writeln!(s, "  consumes '{}': no earlier step produces it (optional: the function works without it)", a.name);
                }
            }
        }
        match step.plate {
            Some(_) => s.push_str(&plate_text(plan, i)),
            None => s.push_str(&stacks_text(plan, i)),
        }
    }
    for d in &plan.disabled {
        let _ = writeln!(s, "step '{d}': disabled");
    }
    s
}

/// The plan's lines on step `i`'s stacks: per well the groups and their
/// inputs, and the groups without a map entry.
fn stacks_text(plan: &Plan, i: usize) -> String {
    let mut s = String::new();
    let (mut pass, mut skip) = (0, 0);
    let counts: Vec<String> = plan
        .wells
        .iter()
        .filter_map(|w| w.steps.iter().find(|ws| ws.step == i).map(|ws| (w, ws)))
        .map(|(w, ws)| {
            pass += ws.groups.iter().filter(|g| g.action == Action::Passthrough).count();
            skip += ws.groups.iter().filter(|g| g.action == Action::Skip).count();
            let n_in = ws.groups.first().map(|g| g.inputs.len()).unwrap_or(0);
            format!("{} {}×[{n_in}]", w.well, ws.groups.len())
        })
        .collect();
    let _ = writeln!(s, "  stacks per well: {}", counts.join(", "));
    if pass + skip > 0 {
        let _ = writeln!(s, "  groups without a map entry: {pass} passed through, {skip} skipped");
    }
    s
}

/// The plan's lines on plate-wide step `i`: sample size, seed, reduction,
/// and per group the planes sampled of those available and the result's file.
fn plate_text(plan: &Plan, i: usize) -> String {
    let mut s = String::new();
    let Some(ps) = plan.plate_steps.iter().find(|p| p.step == i) else { return s };
    let _ = writeln!(
        s,
        "  plate-wide: runs once before the wells, on a sample of at most {} plane(s) per group across all wells (seed {})",
        ps.sampling.sample, ps.sampling.seed
    );
    match &ps.reduction {
        Some(r) => {
            let _ = writeln!(s, "  reads only the sampled planes; {}", r.what);
        }
        None => {
            let _ = writeln!(s, "  reads only the sampled planes, at full size");
        }
    }
    let (h, w, dtype) = plan.plane;
    let threads = std::thread::available_parallelism().map(|n| n.get()).unwrap_or(1);
    let _ = writeln!(
        s,
        "  memory: at most {:.1} MB held for the largest group (its sample, plus one full plane per reading thread)",
        ps.estimate_bytes((h, w), dtype.size_bytes(), threads) as f64 / 1e6
    );
    for g in &ps.groups {
        let scope = plate_scope_text(&plan.channel_names, &g.scope);
        if g.action == Action::Skip {
            let _ = writeln!(s, "  group {scope}: skipped (no func map entry)");
            continue;
        }
        let _ = writeln!(
            s,
            "  group {scope}: sampled {} of {} plane(s) from {} well(s) → {}",
            g.inputs.len(),
            g.available,
            g.wells,
            g.output.display()
        );
    }
    s
}

/// Why `max_memory` (`--max-memory`) cannot hold for the run of `plan`:
/// a well is estimated to need more than the whole budget at its peak. Such a
/// well still runs, alone (no other well in flight), and may go over it.
/// `None` when there is no budget or every well fits it.
pub fn budget_warning(plan: &Plan, max_memory: Option<u64>) -> Option<String> {
    let budget = max_memory?;
    let w = plan.wells.iter().filter(|w| w.estimate_bytes > budget).max_by_key(|w| w.estimate_bytes)?;
    let over = plan.wells.iter().filter(|w| w.estimate_bytes > budget).count();
    let bytes = hcsflow_pipeline::split::bytes_text;
    Some(format!(
        "{over} of {} well(s) are estimated to need more than --max-memory {} at their peak (largest: {} needs {}): they run \
         one at a time and may go over it; a budget of at least {} holds one well",
        plan.wells.len(),
        bytes(budget),
        w.well,
        bytes(w.estimate_bytes),
        bytes(w.estimate_bytes)
    ))
}

/// `gpus: gpu:0 runs 2 wells (A01, A03); gpu:1 runs 1 well (A02)`: the
/// adapter of each well whose calls run on a GPU ([`hcsflow_pipeline::WellPlan::gpu`]),
/// each well on the worker's own queue of it; nothing when no call runs on a GPU.
fn gpus_text(plan: &Plan) -> String {
    let mut by_gpu: BTreeMap<usize, Vec<&str>> = BTreeMap::new();
    for w in &plan.wells {
        if let Some(g) = w.gpu {
            by_gpu.entry(g).or_default().push(&w.well);
        }
    }
    if by_gpu.is_empty() {
        return String::new();
    }
    let parts: Vec<String> = by_gpu
        .iter()
        .map(|(g, wells)| format!("gpu:{g} runs {} well{} ({})", wells.len(), if wells.len() == 1 { "" } else { "s" }, wells.join(", ")))
        .collect();
    format!("gpus: {} (each worker submits to its own queue of its adapter)\n", parts.join("; "))
}

/// The plan's lines on missing images: the policy and what the run does.
fn missing_text(plan: &Plan) -> String {
    let mut s = String::new();
    let policy = plan.missing_policy;
    if plan.missing.is_empty() {
        let _ = writeln!(s, "missing images: none (--missing {policy})");
        return s;
    }
    let mut wells: Vec<&str> = plan.missing.iter().map(|m| m.well.as_str()).collect();
    wells.dedup();
    let what = match policy {
        MissingPolicy::SkipWell => format!("well(s) {} will not be run and are recorded failed", wells.join(", ")),
        MissingPolicy::Fill => "each becomes a plane of zeros in memory, reported per well".to_string(),
        // Compile refuses the run: no plan to print.
        MissingPolicy::Error => "the run is refused".to_string(),
    };
    let _ = writeln!(s, "missing images: {} in {} well(s) (--missing {policy}): {what}", plan.missing.len(), wells.len());
    const LISTED: usize = 10;
    for m in plan.missing.iter().take(LISTED) {
        let _ = writeln!(s, "  {m}");
    }
    if plan.missing.len() > LISTED {
        let _ = writeln!(s, "  … and {} more", plan.missing.len() - LISTED);
    }
    s
}

/// The line that starts a run: steps, wells, plate, device and why, workers.
pub fn start_text(plan: &Plan, workers: usize) -> String {
    format!(
        "running {} step(s) on {} well(s) of {} on {} ({}); {} worker(s)\n",
        plan.steps.len(),
        plan.wells.len(),
        plan.plate_root.display(),
        plan.device,
        plan.device_reason,
        workers
    )
}

/// The summary of a finished run, one line each: wells complete, skipped,
/// failed and not started with time, throughput and peak memory; where the
/// outputs, OME-Zarr plates and tables are; the planes filled with zeros;
/// the stacks that ran in chunks on the GPU; then every note functions made about their results (never silent).
pub fn summary_text(plan: &Plan, summary: &RunSummary) -> String {
    let r = &summary.report;
    let mut s = String::new();
    let _ = writeln!(
        s,
        "{} of {} well(s) complete ({} skipped as already complete), {} failed, {} not started; {:.2} s, {:.1} MB/s, peak RSS {}",
        summary.completed.len() + summary.skipped.len(),
        summary.total,
        summary.skipped.len(),
        summary.failed.len(),
        summary.not_started.len(),
        r.seconds,
        r.mb_per_s,
        r.peak_rss_bytes.map(|b| format!("{:.0} MiB", b as f64 / (1u64 << 20) as f64)).unwrap_or_else(|| "unknown".into())
    );
    match summary.shard {
        Some(shard) => {
            let _ = writeln!(
                s,
                "outputs: {} (shard {shard}: its wells only; `hcsflow run … --finalize` writes the summaries, tables and report once every shard is done)",
                plan.out.display()
            );
        }
        None => {
            let _ = writeln!(s, "outputs: {} (summary: {})", plan.out.display(), plan.out.join(SUMMARY_NAME).display());
        }
    }
    for z in &summary.zarr_plates {
        let _ = writeln!(s, "OME-Zarr: {}", z.display());
    }
    for t in &summary.artifact_tables {
        let _ = writeln!(s, "table: {}", t.display());
    }
    if !summary.filled.is_empty() {
        let wells: BTreeSet<&str> = summary.filled.iter().map(|m| m.well.as_str()).collect();
        let _ = writeln!(
            s,
            "missing images: {} filled with zeros in {} well(s) (--missing fill); each is a note below and in {}",
            summary.filled.len(),
            wells.len(),
            plan.out.join(MANIFEST_NAME).display()
        );
    }
    // Stacks run in chunks on the GPU (over --gpu-memory): how many, where the details are.
    let split: usize = r.steps.iter().map(|st| st.split_stacks).sum();
    if split > 0 {
        let budget = r.gpu_memory.map(hcsflow_pipeline::split::bytes_text).unwrap_or_else(|| "none".into());
        let _ = writeln!(
            s,
            "GPU memory: {split} stack(s) ran in chunks of planes (budget {budget}, --gpu-memory); how, per well and step: {}",
            plan.out.join(hcsflow_pipeline::RUN_REPORT_NAME).display()
        );
    }
    // What functions said about their results (e.g. stitching fell back to
    // stage positions) and the planes filled with zeros.
    for n in &r.notes {
        if n.well.is_empty() {
            let _ = writeln!(s, "note: plate-wide step '{}': {}", n.step, n.text);
        } else {
            let _ = writeln!(s, "note: well {}, step '{}': {}", n.well, n.step, n.text);
        }
    }
    s
}

/// Something a finished run could not do, for the person to act on. Its
/// text ([`fmt::Display`]) says what and how to recover.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum RunProblem {
    /// The run manifest could not be written at the end.
    ManifestNotWritten(String),
    /// A plate-level output could not be written (the error names the file).
    NotWritten(String),
    /// Wells failed: `(well, error)` each; the others' results are kept.
    WellsFailed(Vec<(String, String)>),
    /// The run stopped starting wells on its own (full or read-only output
    /// file system): `not_started` wells left, and why.
    Stopped { not_started: usize, reason: String },
    /// The run was cancelled (its cancel flag was set), by `cause` (e.g.
    /// `SIGTERM`), with `not_started` wells left.
    Cancelled { not_started: usize, cause: String },
    /// A finalize found shards that did not run or did not complete, one
    /// text each ([`RunSummary::shard_problems`]).
    ShardsIncomplete(Vec<String>),
}

impl fmt::Display for RunProblem {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            RunProblem::ManifestNotWritten(e) => write!(
                f,
                "the run manifest could not be written: {e}. Its wells' outputs on disk are intact; a --resume run redoes the wells it misses"
            ),
            RunProblem::NotWritten(e) => write!(f, "could not write: {e}"),
            RunProblem::WellsFailed(failed) => {
                let list: Vec<String> = failed.iter().map(|(well, error)| format!("  {well}: {error}")).collect();
                write!(
                    f,
                    "{} well(s) failed (the others' results are kept; fix and re-run with --resume):\n{}",
                    failed.len(),
                    list.join("\n")
                )
            }
            RunProblem::Stopped { not_started, reason } => write!(
                f,
                "stopped: {not_started} well(s) not started because {reason}; free space (or fix the output folder) and re-run with --resume"
            ),
            RunProblem::Cancelled { not_started, cause } => {
                write!(f, "interrupted ({cause}): {not_started} well(s) not started; re-run with --resume to finish")
            }
            RunProblem::ShardsIncomplete(shards) => {
                let list: Vec<String> = shards.iter().map(|s| format!("  {s}")).collect();
                write!(
                    f,
                    "{} shard(s) incomplete (re-run them: a shard skips its complete wells; then finalize again):\n{}",
                    shards.len(),
                    list.join("\n")
                )
            }
        }
    }
}

/// The problems of a finished run, in the order to report them (none: every
/// well is complete and every output written). `cancel_cause` names what set
/// the cancel flag, for [`RunProblem::Cancelled`].
pub fn run_problems(summary: &RunSummary, cancel_cause: &str) -> Vec<RunProblem> {
    let mut problems = Vec::new();
    if let Some(e) = &summary.manifest_error {
        problems.push(RunProblem::ManifestNotWritten(e.clone()));
    }
    problems.extend(summary.write_errors.iter().map(|e| RunProblem::NotWritten(e.clone())));
    if !summary.failed.is_empty() {
        problems.push(RunProblem::WellsFailed(summary.failed.iter().map(|f| (f.well.clone(), f.error.clone())).collect()));
    }
    if !summary.shard_problems.is_empty() {
        // Its wells not started are those of shards that did not run or stopped.
        problems.push(RunProblem::ShardsIncomplete(summary.shard_problems.clone()));
    } else if !summary.not_started.is_empty() {
        let not_started = summary.not_started.len();
        problems.push(match &summary.stopped {
            Some(reason) => RunProblem::Stopped { not_started, reason: reason.clone() },
            None => RunProblem::Cancelled { not_started, cause: cancel_cause.to_string() },
        });
    }
    problems
}
