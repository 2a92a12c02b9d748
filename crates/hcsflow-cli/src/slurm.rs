//! `hcsflow slurm submit|status`: a plate's shards on a Slurm cluster. The
//! work is `hcsflow-slurm`'s (scripts, sbatch, squeue) and the pipeline's
//! (shards); this module reads the flags, compiles the plan once to check
//! everything before anything is queued, and prints what was submitted.

use std::path::PathBuf;

use clap::{Args, Subcommand};
use hcsflow_slurm::{pending_shards, Submission};

use crate::{CliError, CliResult, Exit};

#[derive(Args)]
pub struct SlurmArgs {
    #[command(subcommand)]
    command: SlurmCommand,
}

#[derive(Subcommand)]
enum SlurmCommand {
    /// Write the job scripts into OUT/.hcsflow-shards/slurm/ and submit them: the plate-wide
    /// steps (if any), an array job of the shards, then a finalize job (afterany). Submitting
    /// again runs only the shards missing or incomplete.
    Submit(SubmitArgs),
    /// Where a sharded run in OUT stands: each shard's wells, the submitted jobs still queued
    /// (squeue), and whether it was finalized.
    Status(StatusArgs),
}

#[derive(Args)]
struct SubmitArgs {
    /// The plate folder, as the compute nodes see it.
    plate: PathBuf,
    /// The pipeline file (TOML).
    pipeline: PathBuf,
    /// Output folder, on a file system the compute nodes share.
    out: PathBuf,
    /// Number of shards (array tasks): the wells are split into this many contiguous groups
    /// (default: one per well, at most 16).
    #[arg(long)]
    shards: Option<usize>,
    /// The partition of every job.
    #[arg(long)]
    partition: Option<String>,
    /// At most this many shards at once (the array's %K).
    #[arg(long)]
    max_parallel: Option<usize>,
    /// One more #SBATCH option for every job, e.g. --sbatch-arg=--time=01:00:00 (repeatable).
    #[arg(long = "sbatch-arg", value_name = "OPTION", allow_hyphen_values = true)]
    sbatch_args: Vec<String>,
    /// The sbatch program.
    #[arg(long, default_value = "sbatch", hide = true)]
    sbatch: String,
    /// Flags for every `hcsflow run` of the jobs, after `--` (e.g. -- --device cpu --workers 2).
    #[arg(last = true, value_name = "RUN FLAGS")]
    run_args: Vec<String>,
}

#[derive(Args)]
struct StatusArgs {
    /// The output folder of a sharded run.
    out: PathBuf,
}

pub fn run(a: SlurmArgs) -> CliResult {
    match a.command {
        SlurmCommand::Submit(a) => submit(a),
        SlurmCommand::Status(a) => status(a),
    }
}

fn submit(a: SubmitArgs) -> CliResult {
    let usage = |e: anyhow::Error| CliError::new(Exit::Usage, e);
    let absolute = |p: &PathBuf| std::path::absolute(p).map_err(|e| usage(anyhow::anyhow!("{}: {e}", p.display())));
    let (plate, pipeline, out) = (absolute(&a.plate)?, absolute(&a.pipeline)?, absolute(&a.out)?);
    let run_args = crate::run::forwarded(&plate, &pipeline, &out, &a.run_args)?;
    let (_engine, plan, _options) = crate::run::plan(&run_args)?;
    let wells = plan.wells.len();
    let shards = a.shards.unwrap_or(wells.clamp(1, 16));
    if shards == 0 || shards > wells.max(1) {
        return Err(usage(anyhow::anyhow!("--shards {shards}: the plate has {wells} well(s); choose 1 to {}", wells.max(1))));
    }
    if let Some(previous) = hcsflow_slurm::read_submitted(&out).map_err(|e| CliError::new(Exit::Failure, e))? {
        let queued = hcsflow_slurm::squeue(&previous.job_ids()).map_err(|e| CliError::new(Exit::Failure, e))?.unwrap_or_default();
        if !queued.is_empty() {
            let jobs: Vec<String> = queued.iter().map(|j| format!("{} {}", j.id, j.state)).collect();
            return Err(usage(anyhow::anyhow!(
                "jobs of the previous submission are still queued ({}); wait for them or cancel them: {}",
                jobs.join(", "),
                previous.scancel()
            )));
        }
    }
    let run = pending_shards(&plan, shards).map_err(|e| usage(e.into()))?;
    let submission = Submission {
        hcsflow: std::env::current_exe().map_err(|e| CliError::new(Exit::Failure, anyhow::anyhow!("the hcsflow binary: {e}")))?,
        plate,
        pipeline,
        out,
        run_args: a.run_args.clone(),
        shards,
        plate_job: !plan.plate_steps.is_empty() && !run.is_empty(),
        run: run.clone(),
        partition: a.partition,
        max_parallel: a.max_parallel,
        sbatch_args: a.sbatch_args,
    };
    submission.check().map_err(|e| usage(e.into()))?;
    let done = submission.submit(&a.sbatch).map_err(|e| CliError::new(Exit::Failure, e))?;
    let listed: Vec<String> = run.iter().map(|i| format!("{i}/{shards}")).collect();
    if run.is_empty() {
        outln!("all {shards} shard(s) are complete: submitted the finalize only")?;
    } else {
        outln!("shards: {} of {shards} ({})", run.len(), listed.join(", "))?;
    }
    if let Some(id) = &done.plate_job {
        outln!("plate job: {id} (plate-wide steps)")?;
    }
    if let Some(id) = &done.array_job {
        outln!("array job: {id} (--array={})", done.array.as_deref().unwrap_or(""))?;
    }
    outln!("finalize job: {}", done.finalize_job)?;
    outln!("logs: {}", hcsflow_slurm::slurm_dir(&submission.out).join("logs").display())?;
    outln!("cancel: {}", done.scancel())?;
    Ok(())
}

fn status(a: StatusArgs) -> CliResult {
    let status = hcsflow_slurm::status(&a.out).map_err(|e| CliError::new(Exit::Failure, e))?;
    out!("{status}")?;
    Ok(())
}
