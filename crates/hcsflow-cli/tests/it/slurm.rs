//! `hcsflow slurm submit` on a real single-node Slurm (issue 21): the test
//! starts munged, slurmctld and slurmd with a slurm.conf in a temporary
//! folder (proctrack/linuxproc, task/none, no accounting; the recipe of
//! references-wave2.md §5.3, on free ports), submits a 6-well plate as 3
//! shards plus finalize, and compares the output with one `hcsflow run`.
//! The daemons are stopped by their pids at the end.
//!
//! Needs root (slurmd, munged as the munge user) and the Debian packages
//! `slurmctld slurmd slurm-client munge` (scripts/test installs them). When
//! Slurm cannot start the test fails under `CI=true` and is skipped with a
//! message otherwise.
#![cfg(unix)]

use std::path::{Path, PathBuf};
use std::process::{Command, Output};
use std::time::{Duration, Instant};

use crate::common;
use common::outputs::{assert_report_covers_every_well, assert_same_outputs, demo_toml, plate_and_reference, s, synth};
use common::{hcsflow, stderr};

const WELLS: [&str; 6] = ["A01", "A02", "A03", "B01", "B02", "B03"];

/// A running single-node cluster; stopped (its daemons killed by pid) when dropped.
struct Cluster {
    dir: tempfile::TempDir,
    conf: PathBuf,
    /// Pid files of the daemons this test started (munged only if it was not running).
    pid_files: Vec<PathBuf>,
}

impl Cluster {
    /// Starts the cluster, or says why it cannot.
    fn start() -> Result<Cluster, String> {
        for program in ["slurmctld", "slurmd", "munged", "sbatch", "squeue", "scancel", "sinfo", "runuser"] {
            if which(program).is_none() {
                return Err(format!("{program} not found (apt-get install slurmctld slurmd slurm-client munge)"));
            }
        }
        // SAFETY: getuid has no preconditions.
        if unsafe { libc::getuid() } != 0 {
            return Err("slurmd and munged need root".into());
        }
        let dir = tempfile::tempdir().map_err(|e| e.to_string())?;
        let mut cluster = Cluster { conf: dir.path().join("slurm.conf"), dir, pid_files: Vec::new() };
        cluster.start_munge()?;
        let (ctld_port, d_port) = (free_port()?, free_port()?);
        let d = cluster.dir.path();
        for sub in ["state", "spool"] {
            std::fs::create_dir_all(d.join(sub)).map_err(|e| e.to_string())?;
        }
        let cpus = std::thread::available_parallelism().map(|n| n.get()).unwrap_or(1);
        let conf = format!(
            "ClusterName=hcsflow-test\nSlurmctldHost=localhost(127.0.0.1)\nSlurmctldPort={ctld_port}\nSlurmdPort={d_port}\n\
             SlurmUser=root\nAuthType=auth/munge\nCredType=cred/munge\nMpiDefault=none\nProctrackType=proctrack/linuxproc\n\
             TaskPlugin=task/none\nJobAcctGatherType=jobacct_gather/none\nAccountingStorageType=accounting_storage/none\n\
             SchedulerType=sched/backfill\nSchedulerParameters=batch_sched_delay=0,sched_min_interval=0\n\
             SelectType=select/cons_tres\nSelectTypeParameters=CR_Core\nReturnToService=2\nMaxArraySize=100001\n\
             MinJobAge=300\nKillWait=5\n\
             StateSaveLocation={d}/state\nSlurmdSpoolDir={d}/spool\nSlurmctldPidFile={d}/slurmctld.pid\nSlurmdPidFile={d}/slurmd.pid\n\
             SlurmctldLogFile={d}/slurmctld.log\nSlurmdLogFile={d}/slurmd.log\n\
             NodeName=localhost NodeAddr=127.0.0.1 CPUs={cpus} RealMemory=1000 State=UNKNOWN\n\
             PartitionName=debug Nodes=localhost Default=YES MaxTime=INFINITE State=UP\n",
            d = d.display()
        );
        std::fs::write(&cluster.conf, conf).map_err(|e| e.to_string())?;
        cluster.pid_files.push(d.join("slurmctld.pid"));
        cluster.daemon(Command::new("slurmctld").arg("-f").arg(&cluster.conf))?;
        cluster.pid_files.push(d.join("slurmd.pid"));
        cluster.daemon(Command::new("slurmd").arg("-f").arg(&cluster.conf).args(["-N", "localhost"]))?;
        let deadline = Instant::now() + Duration::from_secs(60);
        loop {
            let o = cluster.command("sinfo").args(["--noheader", "--format=%t"]).output().map_err(|e| e.to_string())?;
            if String::from_utf8_lossy(&o.stdout).trim() == "idle" {
                return Ok(cluster);
            }
            if Instant::now() > deadline {
                return Err(format!("the node is not idle after 60 s: {}\n{}", stderr(&o), cluster.logs()));
            }
            std::thread::sleep(Duration::from_millis(200));
        }
    }

    /// Starts munged unless one runs (it is then left running).
    fn start_munge(&mut self) -> Result<(), String> {
        let pid_file = PathBuf::from("/run/munge/munged.pid");
        if read_pid(&pid_file).is_some_and(alive) {
            return Ok(());
        }
        std::fs::create_dir_all("/run/munge").map_err(|e| e.to_string())?;
        run(Command::new("chown").args(["munge:munge", "/run/munge"]))?;
        run(Command::new("runuser").args(["-u", "munge", "--", "munged"]))?;
        self.pid_files.push(pid_file);
        Ok(())
    }

    fn daemon(&self, cmd: &mut Command) -> Result<(), String> {
        run(cmd.env("SLURM_CONF", &self.conf)).map_err(|e| format!("{e}\n{}", self.logs()))
    }

    /// A Slurm client command (or `hcsflow`) talking to this cluster.
    fn command(&self, program: impl AsRef<std::ffi::OsStr>) -> Command {
        let mut c = Command::new(program);
        c.env("SLURM_CONF", &self.conf);
        c
    }

    fn logs(&self) -> String {
        ["slurmctld.log", "slurmd.log"]
            .iter()
            .map(|n| format!("--- {n}\n{}", std::fs::read_to_string(self.dir.path().join(n)).unwrap_or_default()))
            .collect()
    }

    /// Waits until none of `ids` is queued.
    fn wait_for(&self, ids: &[&str], within: Duration) {
        let deadline = Instant::now() + within;
        loop {
            let o = self.command("squeue").args(["--noheader", "--format=%i %T", &format!("--jobs={}", ids.join(","))]).output().unwrap();
            let text = String::from_utf8_lossy(&o.stdout).into_owned();
            if o.status.success() && text.trim().is_empty() {
                return;
            }
            assert!(Instant::now() < deadline, "jobs {ids:?} still queued after {within:?}:\n{text}\n{}", self.logs());
            std::thread::sleep(Duration::from_millis(250));
        }
    }
}

impl Drop for Cluster {
    /// Stops the daemons by their pids (slurmd, slurmctld, then munged if
    /// this test started it) and waits for each to exit (SIGKILL after 15 s),
    /// so that none outlives its temporary folder.
    fn drop(&mut self) {
        for f in self.pid_files.iter().rev() {
            let Some(pid) = read_pid(f) else { continue };
            // SAFETY: signalling a daemon this test started, by its pid file.
            unsafe { libc::kill(pid, libc::SIGTERM) };
            let deadline = Instant::now() + Duration::from_secs(15);
            while alive(pid) && Instant::now() < deadline {
                std::thread::sleep(Duration::from_millis(50));
            }
            if alive(pid) {
                // SAFETY: as above.
                unsafe { libc::kill(pid, libc::SIGKILL) };
            }
        }
    }
}

fn which(program: &str) -> Option<PathBuf> {
    let path = std::env::var_os("PATH").unwrap_or_default();
    std::env::split_paths(&path).chain(["/usr/sbin".into(), "/sbin".into()]).map(|d| d.join(program)).find(|p| p.is_file())
}

fn read_pid(path: &Path) -> Option<libc::pid_t> {
    std::fs::read_to_string(path).ok()?.trim().parse().ok()
}

/// The process exists and has not exited (a zombie waiting to be reaped has).
fn alive(pid: libc::pid_t) -> bool {
    let zombie = std::fs::read_to_string(format!("/proc/{pid}/stat"))
        .ok()
        .and_then(|stat| stat.rsplit_once(')').map(|(_, rest)| rest.trim_start().starts_with('Z')))
        .unwrap_or(false);
    // SAFETY: signal 0 only checks that the process exists.
    !zombie && unsafe { libc::kill(pid, 0) == 0 }
}

fn free_port() -> Result<u16, String> {
    let l = std::net::TcpListener::bind("127.0.0.1:0").map_err(|e| e.to_string())?;
    l.local_addr().map(|a| a.port()).map_err(|e| e.to_string())
}

fn run(cmd: &mut Command) -> Result<(), String> {
    let o = cmd.output().map_err(|e| format!("{cmd:?}: {e}"))?;
    if o.status.success() {
        Ok(())
    } else {
        Err(format!("{cmd:?}: {}: {}{}", o.status, String::from_utf8_lossy(&o.stdout), stderr(&o)))
    }
}

/// One cluster at a time in this binary: the tests share munged.
static ONE_AT_A_TIME: std::sync::Mutex<()> = std::sync::Mutex::new(());

/// The cluster, or `None` (skipped, with the reason) outside CI; under `CI=true` a failure.
fn cluster() -> Option<Cluster> {
    match Cluster::start() {
        Ok(c) => Some(c),
        Err(why) if std::env::var("CI").is_ok_and(|v| v == "true") => panic!("Slurm could not start (CI=true): {why}"),
        Err(why) => {
            eprintln!("skipped: Slurm could not start: {why}");
            None
        }
    }
}

/// `hcsflow slurm submit` into `out` with 3 shards, `max_parallel` at once; returns its stdout.
fn submit(cluster: &Cluster, plate: &Path, out: &Path, max_parallel: &str) -> String {
    let o: Output = cluster
        .command(env!("CARGO_BIN_EXE_hcsflow"))
        .args(["slurm", "submit", s(plate), &demo_toml(), s(out), "--shards", "3", "--max-parallel", max_parallel])
        .args(["--sbatch-arg=--time=00:10:00", "--", "--device", "cpu", "--workers", "1"])
        .env_remove("HCSFLOW_ALLOW_SOFTWARE_GPU")
        .output()
        .unwrap();
    assert!(o.status.success(), "submit: {}\n{}", stderr(&o), String::from_utf8_lossy(&o.stdout));
    String::from_utf8_lossy(&o.stdout).into_owned()
}

/// The job ids of the `cancel: scancel …` line.
fn job_ids(stdout: &str) -> Vec<String> {
    let line = stdout.lines().find_map(|l| l.strip_prefix("cancel: scancel ")).unwrap_or_else(|| panic!("no cancel line:\n{stdout}"));
    line.split_whitespace().map(String::from).collect()
}

/// The 6-well plate in `dir/plate` and the demo pipeline's single-machine
/// run of it in `dir/reference`, which the cluster's output must equal.

#[test]
fn a_plate_submitted_as_three_shards_gives_one_runs_output() {
    let _one = ONE_AT_A_TIME.lock().unwrap_or_else(|p| p.into_inner());
    let Some(cluster) = cluster() else { return };
    let dir = tempfile::tempdir().unwrap();
    let (plate, reference) = plate_and_reference(dir.path(), &WELLS, "1");

    let out = dir.path().join("out");
    let stdout = submit(&cluster, &plate, &out, "2");
    assert!(stdout.contains("shards: 3 of 3 (1/3, 2/3, 3/3)") && stdout.contains("--array=0-2%2"), "{stdout}");
    let ids = job_ids(&stdout);
    assert_eq!(ids.len(), 2, "array and finalize (the demo has no plate-wide step): {stdout}");
    cluster.wait_for(&ids.iter().map(String::as_str).collect::<Vec<_>>(), Duration::from_secs(600));

    let logs = out.join(".hcsflow-shards/slurm/logs");
    let finalize_log = std::fs::read_to_string(logs.join(format!("finalize_{}.out", ids[1]))).unwrap_or_default();
    assert!(out.join("run_manifest.json").is_file(), "no finalize output; its log:\n{finalize_log}\n{}", cluster.logs());
    for task in 0..3 {
        assert!(logs.join(format!("shard_{}_{task}.out", ids[0])).is_file(), "log of array task {task}");
    }
    assert!(finalize_log.contains("6 of 6 well(s) complete"), "{finalize_log}");
    assert_same_outputs(&out, &reference);
    assert_report_covers_every_well(&out, &WELLS);

    let o = cluster.command(env!("CARGO_BIN_EXE_hcsflow")).args(["slurm", "status", s(&out)]).output().unwrap();
    let text = String::from_utf8_lossy(&o.stdout);
    assert!(o.status.success(), "{}", stderr(&o));
    for line in ["shard 1/3: 2 complete, 0 failed, 0 not started", "shard 3/3: 2 complete", "finalized: yes"] {
        assert!(text.contains(line), "{line}:\n{text}");
    }
}

/// One array task cancelled (`scancel ARRAY_1` before it starts): the
/// finalize runs anyway (afterany) and names shard 2/3; submitting again runs
/// only that shard and the finalize, and the output is one run's.
#[test]
fn a_cancelled_shard_is_reported_and_a_second_submission_runs_only_it() {
    let _one = ONE_AT_A_TIME.lock().unwrap_or_else(|p| p.into_inner());
    let Some(cluster) = cluster() else { return };
    let dir = tempfile::tempdir().unwrap();
    let (plate, reference) = plate_and_reference(dir.path(), &WELLS, "1");

    let out = dir.path().join("out");
    // One task at a time: task 1 is still pending when it is cancelled.
    let ids = job_ids(&submit(&cluster, &plate, &out, "1"));
    let o = cluster.command("scancel").arg(format!("{}_1", ids[0])).output().unwrap();
    assert!(o.status.success(), "scancel: {}", stderr(&o));
    cluster.wait_for(&ids.iter().map(String::as_str).collect::<Vec<_>>(), Duration::from_secs(600));
    let logs = out.join(".hcsflow-shards/slurm/logs");
    let finalize_log = std::fs::read_to_string(logs.join(format!("finalize_{}.out", ids[1]))).unwrap_or_default();
    assert!(finalize_log.contains("shard 2/3 did not run (well(s) A03, B01)"), "{finalize_log}\n{}", cluster.logs());
    assert!(!logs.join(format!("shard_{}_1.out", ids[0])).exists(), "the cancelled task ran");

    let stdout = submit(&cluster, &plate, &out, "1");
    assert!(stdout.contains("shards: 1 of 3 (2/3)") && stdout.contains("--array=1%1"), "{stdout}");
    let again = job_ids(&stdout);
    cluster.wait_for(&again.iter().map(String::as_str).collect::<Vec<_>>(), Duration::from_secs(600));
    let finalize_log = std::fs::read_to_string(logs.join(format!("finalize_{}.out", again[1]))).unwrap_or_default();
    assert!(finalize_log.contains("6 of 6 well(s) complete"), "{finalize_log}\n{}", cluster.logs());
    assert!(!logs.join(format!("shard_{}_0.out", again[0])).exists(), "shard 1/3 ran again");
    assert_same_outputs(&out, &reference);
    assert_report_covers_every_well(&out, &WELLS);
}

/// A corrupt image in one well fails that well only: its shard's task fails,
/// the finalize (afterany) still runs, records the well failed naming the
/// file, names the shard, and keeps every other well complete.
#[test]
fn a_corrupt_image_fails_its_well_only() {
    let _one = ONE_AT_A_TIME.lock().unwrap_or_else(|p| p.into_inner());
    let Some(cluster) = cluster() else { return };
    let dir = tempfile::tempdir().unwrap();
    let plate = dir.path().join("plate");
    synth(&plate, &WELLS);
    let corrupt = hcsflow_testkit::snapshot(&plate)
        .into_keys()
        .find(|p| p.to_string_lossy().contains("_B02_") && p.extension().is_some_and(|e| e == "tif"))
        .expect("an image of B02");
    std::fs::write(&corrupt, b"not a TIFF at all").unwrap();

    let out = dir.path().join("out");
    let ids = job_ids(&submit(&cluster, &plate, &out, "2"));
    cluster.wait_for(&ids.iter().map(String::as_str).collect::<Vec<_>>(), Duration::from_secs(600));
    let logs = out.join(".hcsflow-shards/slurm/logs");
    let finalize_log = std::fs::read_to_string(logs.join(format!("finalize_{}.out", ids[1]))).unwrap_or_default();
    assert!(finalize_log.contains("shard 3/3: 1 of 2 well(s) not complete (B02 failed)"), "{finalize_log}\n{}", cluster.logs());
    let manifest: serde_json::Value = serde_json::from_slice(&std::fs::read(out.join("run_manifest.json")).unwrap()).unwrap();
    for w in WELLS {
        let record = &manifest["wells"][w];
        if w == "B02" {
            assert_eq!(record["status"], "failed", "{record}");
            let file = corrupt.file_name().unwrap().to_string_lossy();
            assert!(record["error"].as_str().is_some_and(|e| e.contains(file.as_ref())), "{record}");
        } else {
            assert_eq!(record["status"], "complete", "{w}: {record}");
        }
    }
    let summary = std::fs::read_to_string(out.join("summary.csv")).unwrap();
    assert!(summary.lines().any(|l| l.starts_with("B03,")) && !summary.lines().any(|l| l.starts_with("B02,")), "{summary}");
}

/// Without a cluster: what cannot be submitted is a usage error (exit 2)
/// before anything is written or queued: a flag after `--` that chooses the
/// jobs' mode, more shards than wells, a bad run flag.
#[test]
fn a_submission_that_cannot_work_exits_2_before_anything_is_queued() {
    let dir = tempfile::tempdir().unwrap();
    let plate = dir.path().join("plate");
    synth(&plate, &WELLS[..2]);
    let out = dir.path().join("out");
    let pipeline = demo_toml();
    let base = ["slurm", "submit", s(&plate), &pipeline, s(&out), "--sbatch", "/nonexistent/sbatch"];
    for (extra, says) in [
        (&["--", "--shard", "1/2"][..], "--shard cannot be given to the jobs"),
        (&["--", "--finalize"][..], "--finalize cannot be given to the jobs"),
        (&["--", "--workers", "x"][..], "the flags after --"),
        (&["--shards", "3"][..], "--shards 3: the plate has 2 well(s)"),
        (&["--shards", "2", "--sbatch-arg", "time=1"][..], "sbatch option \"time=1\""),
    ] {
        let args: Vec<&str> = base.iter().copied().chain(extra.iter().copied()).collect();
        let o = hcsflow(&args);
        assert_eq!(o.status.code(), Some(2), "{extra:?}: {}", stderr(&o));
        assert!(stderr(&o).contains(says), "{extra:?}: {}", stderr(&o));
        assert!(!out.exists(), "{extra:?}: something was written");
    }
}
