//! `hcsflow run PLATE PIPELINE.toml OUT`: compile a pipeline for a plate, then
//! run it (or print the plan with `--dry-run`). Never writes into the plate.

use std::fmt::Write as _;
use std::io::IsTerminal;
use std::path::{Path, PathBuf};
use std::sync::atomic::AtomicBool;
use std::sync::Arc;

use anyhow::Context;
use clap::Args;
use hcsflow_core::{ConversionPolicy, Conversions, DeviceRequest, Registry};
use hcsflow_pipeline::{
    Action, CompileConfig, MissingPolicy, NgffVersion, PipelineError, PipelineSpec, Plan, Progress, RunOptions, RunSummary,
};
use hcsflow_plate::Format;

use crate::progress::Reporter;
use crate::{engine, CliError, CliResult, Exit};

#[derive(Args)]
pub struct RunArgs {
    /// The plate folder (or its .HTD / index XML). Read only.
    plate: PathBuf,
    /// The pipeline file (TOML; see examples/*.toml).
    pipeline: PathBuf,
    /// Output folder (created). Must not be inside the plate.
    out: PathBuf,
    /// Print the compiled plan and stop: nothing is read or written.
    #[arg(long)]
    dry_run: bool,
    /// auto | cpu | gpu | gpu:N.
    #[arg(long, default_value = "auto")]
    device: String,
    /// Allow a software GPU adapter (lavapipe/llvmpipe), for tests and CI.
    #[arg(long)]
    allow_software_gpu: bool,
    /// Allow copies through host memory between two GPU libraries that cannot share memory.
    #[arg(long)]
    allow_host_round_trip: bool,
    /// Wells processed at the same time (default: 2, or 1 on a single core).
    #[arg(long)]
    workers: Option<usize>,
    /// Memory budget for wells in flight, e.g. 4G, 512M (estimated from stack sizes).
    #[arg(long)]
    max_memory: Option<String>,
    /// Skip wells recorded complete in OUT/run_manifest.json by a previous run of the same pipeline.
    #[arg(long, conflicts_with = "overwrite")]
    resume: bool,
    /// OUT holds another run's outputs (another pipeline or plate): remove them first
    /// (only the files its run_manifest.json lists), then run.
    #[arg(long)]
    overwrite: bool,
    /// Images the plate declares but does not have: error (refuse the run, list them),
    /// skip-well (run the other wells; those wells are recorded failed) or fill (planes
    /// of zeros, each reported).
    #[arg(long, value_name = "POLICY", default_value = "error")]
    missing: MissingPolicy,
    /// Write a JSON report (device, timings, conversions, peak RSS, failures).
    #[arg(long)]
    report: Option<PathBuf>,
    /// Override plate auto-detection: imagexpress | opera-phenix.
    #[arg(long)]
    format: Option<String>,
    #[command(flatten)]
    pub output: OutputArgs,
}

/// Output flags of every command that executes a pipeline (`run`, `demo`):
/// one definition, so both accept the same flags with the same meaning.
#[derive(Args)]
pub struct OutputArgs {
    /// OME-Zarr output (`materialize = ["zarr"]`): NGFF 0.5 on Zarr v3, or 0.4 on
    /// Zarr v2 for readers that predate Zarr v3 (zarr-python 2, older Fiji/MoBIE).
    #[arg(long, default_value = "0.5")]
    zarr_format: String,
    /// Write a Chrome/Perfetto trace (chrome://tracing, ui.perfetto.dev): spans per
    /// well, step, read, stack, function call, conversion and write.
    #[arg(long)]
    pub trace: Option<PathBuf>,
}

impl OutputArgs {
    /// The NGFF version asked for; an unknown one is a usage error (exit 2).
    pub fn zarr_format(&self) -> Result<NgffVersion, CliError> {
        self.zarr_format.parse::<NgffVersion>().map_err(|e| CliError::new(Exit::Usage, e))
    }
}

/// Parses `4G`, `512M`, `100k`, `1000` (bytes; binary multiples).
pub fn parse_size(text: &str) -> Result<u64, String> {
    let t = text.trim();
    let (num, mult) = match t.char_indices().find(|(_, c)| c.is_ascii_alphabetic()) {
        Some((i, _)) => {
            let unit = t[i..].to_ascii_lowercase();
            let m: u64 = match unit.trim_end_matches("ib").trim_end_matches('b') {
                "" => 1,
                "k" => 1 << 10,
                "m" => 1 << 20,
                "g" => 1 << 30,
                "t" => 1 << 40,
                _ => return Err(format!("bad size '{text}': expected a number with an optional K, M, G or T suffix")),
            };
            (&t[..i], m)
        }
        None => (t, 1),
    };
    let n: f64 = num.trim().parse().map_err(|_| format!("bad size '{text}': expected e.g. 4G or 512M"))?;
    if !(n.is_finite() && n > 0.0) {
        return Err(format!("bad size '{text}': must be positive"));
    }
    Ok((n * mult as f64) as u64)
}

/// Compile-phase problems are usage errors (exit 2); others are failures.
fn pipeline_err(e: PipelineError) -> CliError {
    let exit = if e.is_usage() { Exit::Usage } else { Exit::Failure };
    CliError::new(exit, e)
}

/// Everything `run` and `demo` share: options resolved from flags.
pub struct Setup {
    pub device: DeviceRequest,
    pub allow_software_gpu: bool,
    pub policy: ConversionPolicy,
    pub workers: usize,
    pub max_memory: Option<u64>,
    pub resume: bool,
    pub overwrite: bool,
    pub missing: MissingPolicy,
    pub report: Option<PathBuf>,
    pub zarr_format: NgffVersion,
}

pub fn run(a: RunArgs) -> CliResult {
    let usage = |e: anyhow::Error| CliError::new(Exit::Usage, e);
    let device: DeviceRequest = a.device.parse().map_err(|e: hcsflow_core::BadDevice| usage(e.into()))?;
    let max_memory = a.max_memory.as_deref().map(parse_size).transpose().map_err(|e| usage(anyhow::anyhow!(e)))?;
    let format = a.format.as_deref().map(str::parse::<Format>).transpose().map_err(|e| usage(e.into()))?;
    let zarr_format = a.output.zarr_format()?;
    // Any problem with the pipeline file (missing, a folder, not UTF-8, bad TOML) is found before any pixel.
    let spec = PipelineSpec::read(&a.pipeline).map_err(|e| CliError::new(Exit::Usage, e))?;
    let setup = Setup {
        device,
        allow_software_gpu: a.allow_software_gpu,
        policy: ConversionPolicy { allow_host_round_trip: a.allow_host_round_trip },
        workers: a.workers.unwrap_or_else(default_workers),
        max_memory,
        resume: a.resume,
        overwrite: a.overwrite,
        missing: a.missing,
        report: a.report,
        zarr_format,
    };
    if setup.workers == 0 {
        return Err(usage(anyhow::anyhow!("--workers must be at least 1")));
    }
    let plate = hcsflow_plate::open_plate(&a.plate, format).with_context(|| format!("opening plate {}", a.plate.display()))?;
    let (registry, conversions) = hcsflow::builtin();
    let plan = compile(&plate, &spec, &registry, &conversions, &setup, &a.out)?;
    if a.dry_run {
        out!("{}", plan_text(&plan))?;
        return Ok(());
    }
    let summary = execute(&plan, &registry, &conversions, &setup)?;
    finish(&plan, &summary, &setup)
}

pub fn default_workers() -> usize {
    std::thread::available_parallelism().map(|n| n.get().clamp(1, 2)).unwrap_or(1)
}

/// Chooses the device and compiles; errors carry their exit codes.
pub fn compile(
    plate: &hcsflow_plate::Plate,
    spec: &PipelineSpec,
    registry: &Registry,
    conversions: &Conversions,
    setup: &Setup,
    out: &Path,
) -> Result<Plan, CliError> {
    let allow = engine::software_gpu_allowed(setup.allow_software_gpu);
    let (choice, _) = engine::choose_device(setup.device, allow).map_err(|e| CliError::new(Exit::DeviceUnavailable, e))?;
    let config = CompileConfig {
        device: choice.device,
        device_reason: choice.reason,
        policy: setup.policy,
        out: out.to_path_buf(),
        missing: setup.missing,
    };
    hcsflow_pipeline::compile(plate, spec, registry, conversions, &config).map_err(pipeline_err)
}

/// Runs a compiled plan with the graceful stop of `signals` and progress lines on stderr.
pub fn execute(plan: &Plan, registry: &Registry, conversions: &Conversions, setup: &Setup) -> Result<RunSummary, CliError> {
    let cancel = Arc::new(AtomicBool::new(false));
    // First SIGINT/SIGTERM/SIGHUP: finish the wells in flight (their files
    // are written atomically), start no more. Second: exit at once; atomic
    // writes still leave no partial file under a final name (see signals.rs).
    if let Err(e) = crate::signals::install(&cancel) {
        tracing::warn!("cannot install the interrupt handlers: {e}");
    }
    let options = RunOptions {
        workers: setup.workers,
        max_memory: setup.max_memory,
        resume: setup.resume,
        cancel,
        zarr_format: setup.zarr_format,
        overwrite: setup.overwrite,
    };
    let tty = std::io::stderr().is_terminal();
    errln!(
        "running {} step(s) on {} well(s) of {} on {} ({}); {} worker(s)",
        plan.steps.len(),
        plan.wells.len(),
        plan.plate_root.display(),
        plan.device,
        plan.device_reason,
        setup.workers
    );
    let reporter = Reporter::new(plan.wells.len(), tty);
    let result = hcsflow_pipeline::execute(plan, registry, conversions, &options, &|p: Progress<'_>| reporter.event(p));
    reporter.finish();
    result.map_err(pipeline_err)
}

/// Prints the summary, writes the report, maps the outcome to an exit code.
/// The summary comes first, always: even when the manifest could not be
/// written, the user learns which wells completed.
pub fn finish(plan: &Plan, summary: &RunSummary, setup: &Setup) -> CliResult {
    let r = &summary.report;
    let report_error = setup.report.as_ref().and_then(|path| {
        let json = match serde_json::to_vec_pretty(r) {
            Ok(json) => json,
            Err(e) => return Some(format!("serialising the report: {e}")),
        };
        std::fs::write(path, json).err().map(|e| format!("writing the report {}: {e}", path.display()))
    });
    errln!(
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
    errln!("outputs: {} (summary: {})", plan.out.display(), plan.out.join(hcsflow_pipeline::SUMMARY_NAME).display());
    for z in &summary.zarr_plates {
        errln!("OME-Zarr: {}", z.display());
    }
    for t in &summary.artifact_tables {
        errln!("table: {}", t.display());
    }
    if !summary.filled.is_empty() {
        let wells: std::collections::BTreeSet<&str> = summary.filled.iter().map(|m| m.well.as_str()).collect();
        errln!(
            "missing images: {} filled with zeros in {} well(s) (--missing fill); each is a note below and in {}",
            summary.filled.len(),
            wells.len(),
            plan.out.join(hcsflow_pipeline::MANIFEST_NAME).display()
        );
    }
    // What functions said about their results (e.g. stitching fell back to
    // stage positions) and the planes filled with zeros: never silent.
    for n in &r.notes {
        errln!("note: well {}, step '{}': {}", n.well, n.step, n.text);
    }
    let mut problems: Vec<String> = Vec::new();
    let mut exit = Exit::Failure;
    if let Some(e) = &report_error {
        problems.push(e.clone());
    }
    if let Some(e) = &summary.manifest_error {
        problems.push(format!(
            "the run manifest could not be written: {e}. Its wells' outputs on disk are intact; a --resume run redoes the wells it misses"
        ));
    }
    problems.extend(summary.write_errors.iter().map(|e| format!("could not write: {e}")));
    if !summary.failed.is_empty() {
        let list: Vec<String> = summary.failed.iter().map(|f| format!("  {}: {}", f.well, f.error)).collect();
        problems.push(format!(
            "{} well(s) failed (the others' results are kept; fix and re-run with --resume):\n{}",
            summary.failed.len(),
            list.join("\n")
        ));
    }
    if !summary.not_started.is_empty() {
        match &summary.stopped {
            Some(reason) => problems.push(format!(
                "stopped: {} well(s) not started because {reason}; free space (or fix the output folder) and re-run with --resume",
                summary.not_started.len()
            )),
            None => {
                // A graceful stop by a signal is exit 130, unless wells also failed.
                if problems.is_empty() {
                    exit = Exit::Interrupted;
                }
                let signal = crate::signals::received().unwrap_or("cancelled");
                problems.push(format!(
                    "interrupted ({signal}): {} well(s) not started; re-run with --resume to finish",
                    summary.not_started.len()
                ));
            }
        }
    }
    if problems.is_empty() {
        return Ok(());
    }
    Err(CliError::new(
        exit,
        anyhow::anyhow!(problems.join(
            "
error: "
        )),
    ))
}

/// The `--dry-run` text: per step the chain, memory types, routes and device;
/// per well the number of stacks of each step.
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
    let _ = writeln!(s, "device: {} ({})", plan.device, plan.device_reason);
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
                hcsflow_pipeline::InputSource::Previous => "previous",
                hcsflow_pipeline::InputSource::PipelineStart => "pipeline_start (re-read from the plate)",
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
            for c in &chain.calls {
                let _ = writeln!(s, "      route into {}: {}", c.function, c.route_in);
            }
            let _ = writeln!(s, "      route out: {}", chain.route_out);
        }
        for a in &step.produces {
            let _ = writeln!(s, "  produces '{a}': {}", step.out_dir.join(format!("{a}.csv")).display());
        }
        for a in &step.consumes {
            match a.from_step {
                Some(from) => {
                    let _ = writeln!(s, "  consumes '{}' from step '{}'", a.name, plan.steps[from].name);
                }
                None => {
                    let _ = writeln!(s, "  consumes '{}': no earlier step produces it (optional: the function works without it)", a.name);
                }
            }
        }
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
    }
    for d in &plan.disabled {
        let _ = writeln!(s, "step '{d}': disabled");
    }
    s
}

/// The `--dry-run` lines on missing images: the policy and what the run does.
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
