//! `hcsflow run PLATE PIPELINE.toml OUT`: compile a pipeline for a plate, then
//! run it (or print the plan with `--dry-run`). Never writes into the plate.
//! The work is the engine's (`hcsflow::Engine`); this module reads the flags,
//! installs the signal handlers and prints progress, summary and problems.

use std::io::IsTerminal;
use std::path::{Path, PathBuf};
use std::sync::atomic::AtomicBool;
use std::sync::Arc;

use clap::Args;
use hcsflow::pipeline::{MissingPolicy, Plan, Progress, RunSummary, Shard};
use hcsflow::plate::Format;
use hcsflow::{Engine, RunOptions, RunProblem};

use crate::flags::{DeviceArgs, OutputArgs};
use crate::progress::Reporter;
use crate::{CliError, CliResult, Exit};

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
    #[command(flatten)]
    device: DeviceArgs,
    /// Refuse the run (exit 2, before anything is read or written) if any step would
    /// run a function on the host: the CPU device, a step with device = "cpu", or a GPU
    /// function doing part of its work on the host. The error names the steps and functions.
    #[arg(long)]
    require_gpu: bool,
    /// Wells processed at the same time (default: 2, or 1 on a single core).
    #[arg(long)]
    workers: Option<usize>,
    /// Memory budget for wells in flight, e.g. 4G, 512M (estimated from stack sizes).
    #[arg(long)]
    max_memory: Option<String>,
    /// GPU memory budget of one function on one stack (input, output and scratch), e.g.
    /// 2G, 64M (default: the adapter's largest buffer binding, 128M on lavapipe). A stack
    /// over it runs in chunks of planes where the function allows it (per-plane functions,
    /// max/min projections); otherwise its well fails naming the sizes. Never on the CPU.
    #[arg(long, value_name = "SIZE")]
    gpu_memory: Option<String>,
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
    /// Run only shard I of N (1-based): the I-th of N contiguous groups of the plate's
    /// wells in plate order. Shards run side by side into the same OUT, each with its
    /// own manifest under OUT/.hcsflow-shards/; a shard re-run skips its complete wells.
    /// Then --finalize merges them.
    #[arg(long, value_name = "I/N", conflicts_with_all = ["overwrite", "finalize", "plate_steps_only"])]
    shard: Option<Shard>,
    /// Only the set-up of a sharded run: create the OME-Zarr plates and run the
    /// plate-wide steps (scope = "plate") once, before the shards (a cluster's first job).
    #[arg(long, conflicts_with_all = ["overwrite", "finalize", "resume"])]
    plate_steps_only: bool,
    /// Merge the shards run into OUT: run_manifest.json, summaries, tables, OME-Zarr
    /// plate metadata, run report and report.html, as one run writes them. Names the
    /// shards that did not run or did not complete (exit 1 then).
    #[arg(long, conflicts_with_all = ["overwrite", "resume"])]
    finalize: bool,
    #[command(flatten)]
    pub output: OutputArgs,
}

pub fn run(a: RunArgs) -> CliResult {
    let (engine, plan, options) = plan(&a)?;
    if let Some(w) = hcsflow::budget_warning(&plan, options.max_memory) {
        errln!("warning: {w}");
    }
    if a.dry_run {
        out!("{}", hcsflow::plan_text(&plan))?;
        return Ok(());
    }
    if a.plate_steps_only {
        let tty = std::io::stderr().is_terminal();
        let reporter = Reporter::new(0, tty);
        let result = engine.prepare_shards(&plan, &options, &|p: Progress<'_>| reporter.event(p));
        reporter.finish();
        result?;
        errln!("plate-wide steps of {} done ({} step(s)); run the shards next", plan.out.display(), plan.plate_steps.len());
        return Ok(());
    }
    if a.finalize {
        let summary = engine.finalize(&plan, &options)?;
        return finish(&plan, &summary, a.report.as_deref());
    }
    if let Some(shard) = a.shard {
        let wells: Vec<&str> = shard.wells(&plan).into_iter().map(|i| plan.wells[i].well.as_str()).collect();
        errln!("shard {shard}: {} well(s){}{}", wells.len(), if wells.is_empty() { "" } else { ": " }, wells.join(", "));
    }
    let summary = execute(&engine, &plan, &options)?;
    finish(&plan, &summary, a.report.as_deref())
}

/// The engine, the compiled plan and the run options of `a`.
pub fn plan(a: &RunArgs) -> Result<(Engine, Plan, RunOptions), CliError> {
    let usage = |e: anyhow::Error| CliError::new(Exit::Usage, e);
    let device = a.device.options()?;
    let max_memory = a.max_memory.as_deref().map(hcsflow::parse_size).transpose().map_err(|e| usage(anyhow::anyhow!(e)))?;
    let gpu_memory =
        a.gpu_memory.as_deref().map(hcsflow::parse_size).transpose().map_err(|e| usage(anyhow::anyhow!("--gpu-memory: {e}")))?;
    let format = a.format.as_deref().map(str::parse::<Format>).transpose().map_err(|e| usage(e.into()))?;
    let zarr_format = a.output.zarr_format()?;
    let options = RunOptions {
        device,
        format,
        missing: a.missing,
        workers: a.workers.unwrap_or_else(hcsflow::default_workers),
        max_memory,
        resume: a.resume,
        overwrite: a.overwrite,
        zarr_format,
        shard: a.shard,
        require_gpu: a.require_gpu,
        gpu_memory,
    };
    let engine = Engine::builtin();
    let plan = engine.plan(&a.plate, &a.pipeline, &a.out, &options)?;
    Ok((engine, plan, options))
}

/// The flags of `hcsflow run` given after `--` to `hcsflow slurm submit`,
/// parsed as the jobs will parse them (errors are usage errors). Flags that
/// choose what a job does (`--shard`, `--finalize`, …) are refused: the
/// submission sets them.
pub fn forwarded(plate: &Path, pipeline: &Path, out: &Path, args: &[String]) -> Result<RunArgs, CliError> {
    #[derive(clap::Parser)]
    #[command(name = "hcsflow run")]
    struct Forwarded {
        #[command(flatten)]
        run: RunArgs,
    }
    let usage = |e: anyhow::Error| CliError::new(Exit::Usage, e);
    let mut argv: Vec<std::ffi::OsString> = vec!["run".into(), plate.into(), pipeline.into(), out.into()];
    argv.extend(args.iter().map(Into::into));
    let parsed = <Forwarded as clap::Parser>::try_parse_from(argv).map_err(|e| usage(anyhow::anyhow!("the flags after --: {e}")))?.run;
    let chosen = [
        (parsed.shard.is_some(), "--shard"),
        (parsed.finalize, "--finalize"),
        (parsed.plate_steps_only, "--plate-steps-only"),
        (parsed.resume, "--resume"),
        (parsed.overwrite, "--overwrite"),
        (parsed.dry_run, "--dry-run"),
        (parsed.report.is_some(), "--report"),
        (parsed.output.trace.is_some(), "--trace"),
    ];
    if let Some((_, flag)) = chosen.iter().find(|(set, _)| *set) {
        return Err(usage(anyhow::anyhow!("{flag} cannot be given to the jobs: the submission chooses what each job runs")));
    }
    Ok(parsed)
}

/// Runs a compiled plan with the graceful stop of `signals` and progress lines on stderr.
pub fn execute(engine: &Engine, plan: &Plan, options: &RunOptions) -> Result<RunSummary, CliError> {
    let cancel = Arc::new(AtomicBool::new(false));
    // First SIGINT/SIGTERM/SIGHUP: finish the wells in flight (their files
    // are written atomically), start no more. Second: exit at once; atomic
    // writes still leave no partial file under a final name (see signals.rs).
    if let Err(e) = crate::signals::install(&cancel) {
        tracing::warn!("cannot install the interrupt handlers: {e}");
    }
    let tty = std::io::stderr().is_terminal();
    err!("{}", hcsflow::start_text(plan, options.workers));
    let wells = options.shard.map(|s| s.wells(plan).len()).unwrap_or(plan.wells.len());
    let reporter = Reporter::new(wells, tty);
    let result = engine.execute(plan, options, cancel, &|p: Progress<'_>| reporter.event(p));
    reporter.finish();
    Ok(result?)
}

/// Prints the summary, writes the report (`--report`), maps the outcome to an
/// exit code. The summary comes first, always: even when the manifest could
/// not be written, the user learns which wells completed. Exit 130 when the
/// only problem is a graceful stop by a signal.
pub fn finish(plan: &Plan, summary: &RunSummary, report: Option<&Path>) -> CliResult {
    let report_error = report.and_then(|path| {
        let json = match serde_json::to_vec_pretty(&summary.report) {
            Ok(json) => json,
            Err(e) => return Some(format!("serialising the report: {e}")),
        };
        std::fs::write(path, json).err().map(|e| format!("writing the report {}: {e}", path.display()))
    });
    err!("{}", hcsflow::summary_text(plan, summary));
    let problems = hcsflow::run_problems(summary, crate::signals::received().unwrap_or("cancelled"));
    let interrupted = report_error.is_none() && matches!(problems.as_slice(), [RunProblem::Cancelled { .. }]);
    let lines: Vec<String> = report_error.into_iter().chain(problems.iter().map(ToString::to_string)).collect();
    if lines.is_empty() {
        return Ok(());
    }
    let exit = if interrupted { Exit::Interrupted } else { Exit::Failure };
    Err(CliError::new(exit, anyhow::anyhow!(lines.join("\nerror: "))))
}
