//! A plate's shards on the Slurm cluster a site already has (issue 21): no
//! scheduler of our own, only `sbatch`, `squeue` and `scancel`.
//!
//! Contract:
//! - **Jobs.** [`Submission::submit`] writes three job scripts into
//!   `OUT/.hcsflow-shards/slurm/` and submits them with `sbatch --parsable`:
//!   the plate job (`hcsflow run … --plate-steps-only`: OME-Zarr plates and
//!   plate-wide steps, once; only when the pipeline has plate-wide steps), an
//!   array job of the shards (`--array=<indices>%K`, task `i` runs shard
//!   `i + 1` of N, logs `logs/shard_%A_%a.out`; `afterok` on the plate job
//!   with `--kill-on-invalid-dep=yes`, so a failed plate job cancels it), and
//!   the finalize job (`afterany` on the array: it runs whatever the shards
//!   did, and names the shards that failed or did not run). Job ids and the
//!   array's indices are recorded in `submitted.json`; cancelling is
//!   [`Submitted::scancel`] (`scancel` of those ids).
//! - **Re-submitting** is the caller choosing [`Submission::run`]: the
//!   shards missing or incomplete ([`hcsflow_pipeline::shard_state`]); a
//!   shard run again skips its complete wells anyway.
//! - **Status** ([`status`]) reads the shard manifests and locks in OUT, the
//!   recorded job ids and, when `squeue` is on `PATH`, their queue states,
//!   and with `sacct` (which needs an accounting database, which minimal
//!   clusters lack) their final states and exit codes. Without either, the
//!   manifests and the finalize's report say what each shard did.
//! - Scripts quote every argument for the shell; the job runs the same
//!   `hcsflow` binary with the same plate, pipeline, output folder and run
//!   flags, so a shard computes exactly what `hcsflow run` would.

use std::path::{Path, PathBuf};
use std::process::Command;

use hcsflow_pipeline::{recorded_shards, shard_state, Plan, Shard, ShardRecord, ShardState, SHARDS_DIR};
use serde::{Deserialize, Serialize};

/// The folder (in OUT) of the job scripts, `submitted.json` and `logs/`.
pub fn slurm_dir(out: &Path) -> PathBuf {
    out.join(SHARDS_DIR).join("slurm")
}

/// The record of the last submission, in [`slurm_dir`].
pub const SUBMITTED_NAME: &str = "submitted.json";

/// What went wrong talking to Slurm or writing the scripts.
#[derive(Debug, thiserror::Error)]
pub enum SlurmError {
    /// A file or folder could not be written or read.
    #[error("{path}: {source}")]
    Io { path: PathBuf, source: std::io::Error },
    /// `sbatch`/`squeue` could not be started (not installed, not on `PATH`).
    #[error("cannot run {program}: {source} (is Slurm installed, and {program} on PATH?)")]
    Missing { program: String, source: std::io::Error },
    /// `sbatch` refused a job; its message is kept.
    #[error("sbatch refused {script}: {message}")]
    Refused { script: PathBuf, message: String },
    /// A submission that cannot be written as a job script.
    #[error("{0}")]
    Invalid(String),
    /// `submitted.json` is not a submission record.
    #[error("{path}: not a submission record: {source}")]
    Record { path: PathBuf, source: serde_json::Error },
}

/// A sharded run to submit.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Submission {
    /// The `hcsflow` binary the jobs run (visible from the compute nodes).
    pub hcsflow: PathBuf,
    /// Plate, pipeline file and output folder: absolute, as the jobs see them.
    pub plate: PathBuf,
    pub pipeline: PathBuf,
    pub out: PathBuf,
    /// Flags given to every `hcsflow run` of the jobs (`--device cpu`, `--workers 2`, …).
    pub run_args: Vec<String>,
    /// N: the plate's wells are split into this many shards (≤ the wells).
    pub shards: usize,
    /// The shards (1-based) this submission runs: all of them, or on
    /// re-submission those missing or incomplete. Empty: only the finalize.
    pub run: Vec<usize>,
    /// Submit the plate job first (the pipeline has plate-wide steps).
    pub plate_job: bool,
    /// `--partition` of every job.
    pub partition: Option<String>,
    /// At most this many shards at once (the array's `%K`).
    pub max_parallel: Option<usize>,
    /// More `#SBATCH` options for every job, each one `--option=value`.
    pub sbatch_args: Vec<String>,
}

/// The job scripts of a [`Submission`].
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Scripts {
    pub plate: Option<String>,
    pub shards: Option<String>,
    pub finalize: String,
}

/// What was submitted: job ids as `sbatch --parsable` printed them.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Submitted {
    pub shards: usize,
    /// The array's indices (0-based task ids; shard = task + 1), e.g. `0-2%2`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub array: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub plate_job: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub array_job: Option<String>,
    pub finalize_job: String,
}

impl Submitted {
    /// Every job id, in submission order.
    pub fn job_ids(&self) -> Vec<&str> {
        [self.plate_job.as_deref(), self.array_job.as_deref(), Some(self.finalize_job.as_str())].into_iter().flatten().collect()
    }

    /// The command that cancels them all.
    pub fn scancel(&self) -> String {
        format!("scancel {}", self.job_ids().join(" "))
    }
}

/// `text` quoted for a POSIX shell: in single quotes, `'` as `'\''`.
pub fn shell_quote(text: &str) -> String {
    let plain = !text.is_empty() && text.chars().all(|c| c.is_ascii_alphanumeric() || "-_./=:,+@%".contains(c));
    if plain {
        text.to_string()
    } else {
        format!("'{}'", text.replace('\'', r"'\''"))
    }
}

/// 0-based array indices of 1-based `shards` in Slurm's syntax: ranges of
/// consecutive indices (`0-2,5`), then `%K`.
pub fn array_spec(shards: &[usize], max_parallel: Option<usize>) -> String {
    let mut sorted: Vec<usize> = shards.iter().map(|s| s.saturating_sub(1)).collect();
    sorted.sort_unstable();
    sorted.dedup();
    let mut parts: Vec<String> = Vec::new();
    let mut i = 0;
    while i < sorted.len() {
        let mut j = i;
        while j + 1 < sorted.len() && sorted[j + 1] == sorted[j] + 1 {
            j += 1;
        }
        parts.push(if i == j { sorted[i].to_string() } else { format!("{}-{}", sorted[i], sorted[j]) });
        i = j + 1;
    }
    let mut spec = parts.join(",");
    if let Some(k) = max_parallel {
        spec.push_str(&format!("%{k}"));
    }
    spec
}

impl Submission {
    /// Refuses what cannot be submitted: no shards, a shard out of `1..=N`, a
    /// zero `--max-parallel`, an sbatch option that is not one `--option[=value]`
    /// line, relative paths.
    pub fn check(&self) -> Result<(), SlurmError> {
        let invalid = |m: String| Err(SlurmError::Invalid(m));
        if self.shards == 0 {
            return invalid("the number of shards must be at least 1".into());
        }
        if let Some(bad) = self.run.iter().find(|&&s| s == 0 || s > self.shards) {
            return invalid(format!("shard {bad} is not one of 1..={}", self.shards));
        }
        if self.max_parallel == Some(0) {
            return invalid("--max-parallel must be at least 1".into());
        }
        if let Some(bad) = self.sbatch_args.iter().find(|a| !a.starts_with('-') || a.contains(['\n', '\r'])) {
            return invalid(format!("sbatch option {bad:?}: expected one option such as --time=01:00:00 or --mem=8G"));
        }
        if let Some(p) = [&self.hcsflow, &self.plate, &self.pipeline, &self.out].into_iter().find(|p| p.is_relative()) {
            return invalid(format!("{}: the jobs need absolute paths", p.display()));
        }
        Ok(())
    }

    /// The `#SBATCH` header of a job named `name` logging to `log`, then the
    /// shell's strict mode.
    fn header(&self, name: &str, log: &str, array: Option<&str>) -> String {
        let mut s = String::from("#!/bin/bash\n");
        s.push_str(&format!("#SBATCH --job-name={name}\n"));
        if let Some(array) = array {
            s.push_str(&format!("#SBATCH --array={array}\n"));
        }
        s.push_str(&format!("#SBATCH --output={}\n", slurm_dir(&self.out).join("logs").join(log).display()));
        if let Some(p) = &self.partition {
            s.push_str(&format!("#SBATCH --partition={p}\n"));
        }
        for a in &self.sbatch_args {
            s.push_str(&format!("#SBATCH {a}\n"));
        }
        s.push_str("# Written by `hcsflow slurm submit`.\nset -eu\n");
        s
    }

    /// `exec hcsflow run PLATE PIPELINE OUT <mode> <run_args>`, quoted.
    fn command(&self, mode: &str) -> String {
        let paths = [&self.hcsflow, &self.plate, &self.pipeline, &self.out].map(|p| shell_quote(&p.to_string_lossy()));
        let args: Vec<String> = self.run_args.iter().map(|a| shell_quote(a)).collect();
        let [bin, plate, pipeline, out] = paths;
        let mut line = format!("exec {bin} run {plate} {pipeline} {out} {mode}");
        if !args.is_empty() {
            line.push(' ');
            line.push_str(&args.join(" "));
        }
        line.push('\n');
        line
    }

    /// The job scripts (see the crate's contract).
    pub fn scripts(&self) -> Scripts {
        let plate = self.plate_job.then(|| self.header("hcsflow-plate", "plate_%j.out", None) + &self.command("--plate-steps-only"));
        let shards = (!self.run.is_empty()).then(|| {
            let array = array_spec(&self.run, self.max_parallel);
            let mode = format!("--shard \"$((SLURM_ARRAY_TASK_ID + 1))/{}\"", self.shards);
            self.header("hcsflow-shards", "shard_%A_%a.out", Some(&array)) + &self.command(&mode)
        });
        let finalize = self.header("hcsflow-finalize", "finalize_%j.out", None) + &self.command("--finalize");
        Scripts { plate, shards, finalize }
    }

    /// Writes the scripts (and the logs folder), then submits them with
    /// `sbatch` (the program at `sbatch`, e.g. `"sbatch"` from `PATH`):
    /// plate job, array with `afterok` on it, finalize with `afterany` on the
    /// array (or on the plate job, or none). Records `submitted.json`. A
    /// refused job is an error naming its script; jobs already submitted stay
    /// queued (the error says which, to cancel them).
    pub fn submit(&self, sbatch: &str) -> Result<Submitted, SlurmError> {
        self.check()?;
        let dir = slurm_dir(&self.out);
        let logs = dir.join("logs");
        std::fs::create_dir_all(&logs).map_err(|source| SlurmError::Io { path: logs.clone(), source })?;
        let scripts = self.scripts();
        let write = |name: &str, text: &str| -> Result<PathBuf, SlurmError> {
            let path = dir.join(name);
            std::fs::write(&path, text).map_err(|source| SlurmError::Io { path: path.clone(), source })?;
            Ok(path)
        };
        let plate = scripts.plate.as_deref().map(|t| write("plate.sh", t)).transpose()?;
        let shards = scripts.shards.as_deref().map(|t| write("shards.sh", t)).transpose()?;
        let finalize = write("finalize.sh", &scripts.finalize)?;

        let mut submitted: Vec<String> = Vec::new();
        let mut run = |script: &Path, extra: Vec<String>| -> Result<String, SlurmError> {
            let id = sbatch_parsable(sbatch, script, &extra).map_err(|e| match e {
                SlurmError::Refused { script, message } if !submitted.is_empty() => SlurmError::Refused {
                    script,
                    message: format!("{message} (already queued: cancel with `scancel {}`)", submitted.join(" ")),
                },
                other => other,
            })?;
            submitted.push(id.clone());
            Ok(id)
        };
        let plate_job = plate.as_deref().map(|p| run(p, Vec::new())).transpose()?;
        let array_job = match &shards {
            Some(script) => {
                let extra = match &plate_job {
                    Some(id) => vec![format!("--dependency=afterok:{id}"), "--kill-on-invalid-dep=yes".into()],
                    None => Vec::new(),
                };
                Some(run(script, extra)?)
            }
            None => None,
        };
        let after = array_job.as_ref().or(plate_job.as_ref()).map(|id| vec![format!("--dependency=afterany:{id}")]).unwrap_or_default();
        let finalize_job = run(&finalize, after)?;
        let record = Submitted {
            shards: self.shards,
            array: shards.as_ref().map(|_| array_spec(&self.run, self.max_parallel)),
            plate_job,
            array_job,
            finalize_job,
        };
        let path = dir.join(SUBMITTED_NAME);
        let json = serde_json::to_vec_pretty(&record).map_err(|source| SlurmError::Record { path: path.clone(), source })?;
        std::fs::write(&path, json).map_err(|source| SlurmError::Io { path, source })?;
        Ok(record)
    }
}

/// The shards of `plan`'s run to submit with `count` shards: those that did
/// not run or did not complete all their wells. A shard running now (its
/// lock held) is an error: re-submitting it would run it twice.
pub fn pending_shards(plan: &Plan, count: usize) -> Result<Vec<usize>, SlurmError> {
    let mut pending = Vec::new();
    for index in 1..=count {
        let shard = Shard::new(index, count).map_err(|e| SlurmError::Invalid(e.to_string()))?;
        match shard_state(plan, shard).map_err(|e| SlurmError::Invalid(e.to_string()))? {
            ShardState::Complete => {}
            ShardState::Running => {
                return Err(SlurmError::Invalid(format!(
                    "shard {shard} is running in {}; wait for it (or scancel its job) before submitting again",
                    plan.out.display()
                )))
            }
            ShardState::NotRun | ShardState::Incomplete { .. } => pending.push(index),
        }
    }
    Ok(pending)
}

/// `sbatch --parsable EXTRA SCRIPT`: the job id it prints (`id` or `id;cluster`).
fn sbatch_parsable(sbatch: &str, script: &Path, extra: &[String]) -> Result<String, SlurmError> {
    let output = Command::new(sbatch)
        .arg("--parsable")
        .args(extra)
        .arg(script)
        .output()
        .map_err(|source| SlurmError::Missing { program: sbatch.to_string(), source })?;
    let stdout = String::from_utf8_lossy(&output.stdout);
    let id = job_id(&stdout);
    match (output.status.success(), id) {
        (true, Some(id)) => Ok(id),
        _ => {
            let stderr = String::from_utf8_lossy(&output.stderr);
            Err(SlurmError::Refused { script: script.to_path_buf(), message: format!("{} {}", output.status, stderr.trim()) })
        }
    }
}

/// The job id in `sbatch --parsable` output: the first line up to `;`, digits only.
pub fn job_id(stdout: &str) -> Option<String> {
    let first = stdout.lines().next()?.split(';').next()?.trim();
    (!first.is_empty() && first.chars().all(|c| c.is_ascii_digit())).then(|| first.to_string())
}

/// Reads `submitted.json` of OUT, `None` if nothing was submitted.
pub fn read_submitted(out: &Path) -> Result<Option<Submitted>, SlurmError> {
    let path = slurm_dir(out).join(SUBMITTED_NAME);
    match std::fs::read(&path) {
        Ok(bytes) => serde_json::from_slice(&bytes).map(Some).map_err(|source| SlurmError::Record { path, source }),
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => Ok(None),
        Err(source) => Err(SlurmError::Io { path, source }),
    }
}

/// A job (or array task, `123_4`) in the queue and its state (`PENDING`, `RUNNING`…).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct QueuedJob {
    pub id: String,
    pub state: String,
}

/// The jobs of `ids` still in the queue (`squeue`), or `None` when `squeue`
/// is not on `PATH`. Jobs that ended are not listed (Slurm forgets them after
/// `MinJobAge`).
pub fn squeue(ids: &[&str]) -> Result<Option<Vec<QueuedJob>>, SlurmError> {
    if ids.is_empty() {
        return Ok(Some(Vec::new()));
    }
    let output = match Command::new("squeue").arg("--noheader").arg("--format=%i %T").arg(format!("--jobs={}", ids.join(","))).output() {
        Ok(o) => o,
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Ok(None),
        Err(source) => return Err(SlurmError::Missing { program: "squeue".into(), source }),
    };
    // squeue fails for ids it no longer knows: nothing of them is queued.
    if !output.status.success() {
        return Ok(Some(Vec::new()));
    }
    Ok(Some(parse_squeue(&String::from_utf8_lossy(&output.stdout))))
}

/// Lines `ID STATE` of `squeue --noheader --format='%i %T'`.
pub fn parse_squeue(text: &str) -> Vec<QueuedJob> {
    text.lines()
        .filter_map(|l| {
            let mut parts = l.split_whitespace();
            Some(QueuedJob { id: parts.next()?.to_string(), state: parts.next()?.to_string() })
        })
        .collect()
}

/// A job (or array task) as the accounting database recorded it (`sacct`):
/// its final or current state and exit code (`0:0`).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct AccountedJob {
    pub id: String,
    pub state: String,
    pub exit_code: String,
}

/// The jobs of `ids` (array tasks included, job steps left out) as `sacct`
/// records them; `None` when `sacct` is missing or has no accounting
/// database (minimal clusters: "Slurm accounting storage is disabled").
pub fn sacct(ids: &[&str]) -> Option<Vec<AccountedJob>> {
    if ids.is_empty() {
        return Some(Vec::new());
    }
    let output = Command::new("sacct")
        .args(["--noheader", "--parsable2", "--format=JobID,State,ExitCode"])
        .arg(format!("--jobs={}", ids.join(",")))
        .output()
        .ok()?;
    output.status.success().then(|| parse_sacct(&String::from_utf8_lossy(&output.stdout)))
}

/// Lines `ID|STATE|EXIT` of `sacct --parsable2`, without job steps (`12.batch`).
pub fn parse_sacct(text: &str) -> Vec<AccountedJob> {
    text.lines()
        .filter_map(|l| {
            let mut parts = l.split('|');
            let (id, state, exit_code) = (parts.next()?.trim(), parts.next()?.trim(), parts.next()?.trim());
            (!id.is_empty() && !id.contains('.')).then(|| AccountedJob { id: id.into(), state: state.into(), exit_code: exit_code.into() })
        })
        .collect()
}

/// Where a sharded run in OUT stands.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Status {
    /// The last submission, if any.
    pub submitted: Option<Submitted>,
    /// What each shard's manifest records.
    pub shards: Vec<ShardRecord>,
    /// The submitted jobs still queued; `None` without `squeue`.
    pub queue: Option<Vec<QueuedJob>>,
    /// The submitted jobs as accounting recorded them; `None` without `sacct`
    /// or an accounting database.
    pub accounting: Option<Vec<AccountedJob>>,
    /// `OUT/run_manifest.json` exists: a finalize (or a whole run) wrote it.
    pub finalized: bool,
}

/// Reads the status of the sharded run in `out` (see the crate's contract).
pub fn status(out: &Path) -> Result<Status, SlurmError> {
    let submitted = read_submitted(out)?;
    let shards = recorded_shards(out).map_err(|e| SlurmError::Invalid(e.to_string()))?;
    let ids = submitted.as_ref().map(Submitted::job_ids).unwrap_or_default();
    let queue = squeue(&ids)?;
    let accounting = if ids.is_empty() { None } else { sacct(&ids) };
    Ok(Status { submitted, shards, queue, accounting, finalized: out.join(hcsflow_pipeline::MANIFEST_NAME).is_file() })
}

impl std::fmt::Display for Status {
    /// One line per shard (`shard 2/3: 4 complete, 1 failed, 0 not started`,
    /// `running`, or `no manifest`), the queued jobs and the finalize.
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let count = self.submitted.as_ref().map(|s| s.shards).or_else(|| self.shards.first().map(|r| r.shard.count()));
        if let Some(s) = &self.submitted {
            writeln!(f, "submitted: {} shard(s), jobs {} (cancel: {})", s.shards, s.job_ids().join(", "), s.scancel())?;
        }
        match count {
            None => writeln!(f, "no shard has run here")?,
            Some(n) => {
                for i in 1..=n {
                    match self.shards.iter().find(|r| r.shard.index() == i && r.shard.count() == n) {
                        Some(r) => writeln!(
                            f,
                            "shard {}: {} complete, {} failed, {} not started{}",
                            r.shard,
                            r.complete,
                            r.failed,
                            r.not_started,
                            if r.running { " (running)" } else { "" }
                        )?,
                        None => writeln!(f, "shard {i}/{n}: no manifest (not run yet)")?,
                    }
                }
            }
        }
        match &self.queue {
            None => writeln!(f, "queue: squeue not found")?,
            Some(q) if q.is_empty() => writeln!(f, "queue: none of the submitted jobs is queued")?,
            Some(q) => {
                let jobs: Vec<String> = q.iter().map(|j| format!("{} {}", j.id, j.state)).collect();
                writeln!(f, "queue: {}", jobs.join(", "))?
            }
        }
        if let Some(jobs) = self.accounting.as_ref().filter(|j| !j.is_empty()) {
            let jobs: Vec<String> = jobs.iter().map(|j| format!("{} {} (exit {})", j.id, j.state, j.exit_code)).collect();
            writeln!(f, "accounting: {}", jobs.join(", "))?;
        }
        writeln!(f, "finalized: {}", if self.finalized { "yes (run_manifest.json written)" } else { "no" })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn submission() -> Submission {
        Submission {
            hcsflow: "/opt/hcsflow/bin/hcsflow".into(),
            plate: "/data/plate 1".into(),
            pipeline: "/data/p.toml".into(),
            out: "/scratch/out".into(),
            run_args: vec!["--device".into(), "cpu".into(), "--workers".into(), "2".into()],
            shards: 4,
            run: vec![1, 2, 3, 4],
            plate_job: true,
            partition: Some("short".into()),
            max_parallel: Some(2),
            sbatch_args: vec!["--time=01:00:00".into(), "--mem=8G".into()],
        }
    }

    #[test]
    fn array_indices_are_zero_based_ranges_with_the_throttle() {
        assert_eq!(array_spec(&[1, 2, 3], None), "0-2");
        assert_eq!(array_spec(&[1, 2, 3], Some(2)), "0-2%2");
        assert_eq!(array_spec(&[4, 1, 2, 6, 7, 9], Some(3)), "0-1,3,5-6,8%3");
        assert_eq!(array_spec(&[2], None), "1");
    }

    #[test]
    fn scripts_run_the_same_command_per_shard_with_dependencies_left_to_sbatch() {
        let s = submission().scripts();
        let plate = s.plate.expect("a plate job");
        assert!(plate.starts_with("#!/bin/bash\n#SBATCH --job-name=hcsflow-plate\n"), "{plate}");
        assert!(plate.contains("#SBATCH --output=/scratch/out/.hcsflow-shards/slurm/logs/plate_%j.out\n"), "{plate}");
        assert!(plate.contains("#SBATCH --partition=short\n#SBATCH --time=01:00:00\n#SBATCH --mem=8G\n"), "{plate}");
        assert!(
            plate.ends_with(
                "exec /opt/hcsflow/bin/hcsflow run '/data/plate 1' /data/p.toml /scratch/out --plate-steps-only --device cpu --workers 2\n"
            ),
            "{plate}"
        );
        let shards = s.shards.expect("an array job");
        assert!(shards.contains("#SBATCH --array=0-3%2\n"), "{shards}");
        assert!(shards.contains("#SBATCH --output=/scratch/out/.hcsflow-shards/slurm/logs/shard_%A_%a.out\n"), "{shards}");
        assert!(shards.contains(" --shard \"$((SLURM_ARRAY_TASK_ID + 1))/4\" --device cpu"), "{shards}");
        assert!(s.finalize.contains("/scratch/out --finalize --device cpu --workers 2\n"), "{}", s.finalize);
        assert!(!s.finalize.contains("--dependency"), "dependencies are given to sbatch with the job ids");

        let resubmit = Submission { run: vec![3], plate_job: false, max_parallel: None, ..submission() }.scripts();
        assert_eq!(resubmit.plate, None);
        assert!(resubmit.shards.expect("an array job").contains("#SBATCH --array=2\n"));
        let nothing = Submission { run: vec![], ..submission() }.scripts();
        assert_eq!(nothing.shards, None);
    }

    #[test]
    fn a_submission_that_cannot_be_a_job_is_refused() {
        for (bad, says) in [
            (Submission { shards: 0, run: vec![], ..submission() }, "at least 1"),
            (Submission { run: vec![5], ..submission() }, "shard 5 is not one of 1..=4"),
            (Submission { max_parallel: Some(0), ..submission() }, "--max-parallel"),
            (Submission { sbatch_args: vec!["time=1".into()], ..submission() }, "sbatch option"),
            (Submission { sbatch_args: vec!["--x=1\n#SBATCH --y".into()], ..submission() }, "sbatch option"),
            (Submission { out: "out".into(), ..submission() }, "absolute"),
        ] {
            let e = bad.check().expect_err(says).to_string();
            assert!(e.contains(says), "{e}");
        }
        assert!(submission().check().is_ok());
    }

    #[test]
    fn shell_quoting_keeps_every_argument_whole() {
        assert_eq!(shell_quote("/a/b.toml"), "/a/b.toml");
        assert_eq!(shell_quote("a b"), "'a b'");
        assert_eq!(shell_quote("it's"), r"'it'\''s'");
        assert_eq!(shell_quote("$HOME"), "'$HOME'");
        assert_eq!(shell_quote(""), "''");
    }

    #[test]
    fn job_ids_and_queue_lines_are_parsed() {
        assert_eq!(job_id("1234\n"), Some("1234".into()));
        assert_eq!(job_id("1234;cluster\n"), Some("1234".into()));
        assert_eq!(job_id("sbatch: error\n"), None);
        assert_eq!(job_id(""), None);
        let q = parse_squeue("12_[1-2%1] PENDING\n12_0 RUNNING\n13 PENDING\n");
        assert_eq!(q.len(), 3);
        assert_eq!(q[1], QueuedJob { id: "12_0".into(), state: "RUNNING".into() });
        let a = parse_sacct("12_0|COMPLETED|0:0\n12_0.batch|COMPLETED|0:0\n12_1|CANCELLED by 0|0:15\n13|FAILED|1:0\n");
        assert_eq!(a.len(), 3);
        assert_eq!(a[1], AccountedJob { id: "12_1".into(), state: "CANCELLED by 0".into(), exit_code: "0:15".into() });
        let s =
            Submitted { shards: 3, array: Some("0-2".into()), plate_job: None, array_job: Some("12".into()), finalize_job: "13".into() };
        assert_eq!(s.scancel(), "scancel 12 13");
    }

    /// A fake `sbatch` records its arguments and prints ids: the jobs are
    /// submitted in order with their dependencies, and the record is written.
    #[cfg(unix)]
    #[test]
    fn submit_chains_the_jobs_with_their_dependencies() {
        use std::os::unix::fs::PermissionsExt;
        let dir = tempfile::tempdir().expect("tempdir");
        let calls = dir.path().join("calls.txt");
        let fake = dir.path().join("sbatch");
        let script =
            format!("#!/bin/sh\necho \"$@\" >> '{}'\nn=$(wc -l < '{}')\necho \"$((100 + n));cluster\"\n", calls.display(), calls.display());
        std::fs::write(&fake, script).expect("write");
        std::fs::set_permissions(&fake, std::fs::Permissions::from_mode(0o755)).expect("chmod");
        let out = dir.path().join("out");
        let sub = Submission { out: out.clone(), ..submission() };
        let done = sub.submit(&fake.to_string_lossy()).expect("submit");
        assert_eq!(done.job_ids(), ["101", "102", "103"]);
        let lines: Vec<String> = std::fs::read_to_string(&calls).expect("calls").lines().map(String::from).collect();
        let dir_s = slurm_dir(&out);
        assert_eq!(lines[0], format!("--parsable {}", dir_s.join("plate.sh").display()));
        assert_eq!(
            lines[1],
            format!("--parsable --dependency=afterok:101 --kill-on-invalid-dep=yes {}", dir_s.join("shards.sh").display())
        );
        assert_eq!(lines[2], format!("--parsable --dependency=afterany:102 {}", dir_s.join("finalize.sh").display()));
        assert_eq!(read_submitted(&out).expect("read"), Some(done));
        assert!(dir_s.join("logs").is_dir());
    }
}
