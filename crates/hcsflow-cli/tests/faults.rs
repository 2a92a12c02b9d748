//! Fault probes of the `hcsflow` binary (reliability probes 5a–5e, D5, D6,
//! D15, D16, D17): SIGKILL at several points then `--resume`, SIGTERM as a
//! graceful stop, closed stdout/stderr pipes, exit codes of usage errors and
//! `apply` refusing to replace its input. Small plates (64², a few wells) so
//! that each test takes seconds on a debug build. Unix only (signals).
#![cfg(unix)]

use std::collections::BTreeMap;
use std::io::{BufRead, BufReader, Read};
use std::path::{Path, PathBuf};
use std::process::{Child, ChildStderr, Command, ExitStatus, Stdio};
use std::sync::mpsc::{channel, Receiver};
use std::time::{Duration, Instant};

use hcsflow_synth::{generate, SynthConfig};
use hcsflow_testkit::snapshot;
use serde_json::Value;

mod common;
use common::{hcsflow, stderr};

const WELLS: [&str; 12] = ["A01", "A02", "A03", "A04", "A05", "A06", "B01", "B02", "B03", "B04", "B05", "B06"];

/// A synthetic ImageXpress plate: 3×3 sites, 2 channels, 2 z planes, 64² tiles.
fn synth(root: &Path, wells: &[&str]) {
    let cfg = SynthConfig { size: 64, z_planes: 2, wells: wells.iter().map(|w| w.to_string()).collect(), ..SynthConfig::default() };
    generate(&cfg, root).expect("generate");
}

/// The repository's demo pipeline: TIFF, OME-Zarr and CSV artifacts.
fn demo_toml() -> String {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("../../examples/demo.toml").to_string_lossy().into_owned()
}

fn hcsflow_cmd(args: &[&str]) -> Command {
    let mut c = Command::new(env!("CARGO_BIN_EXE_hcsflow"));
    c.args(args).env_remove("HCSFLOW_ALLOW_SOFTWARE_GPU").env_remove("RUST_LOG");
    c
}

fn s(p: &Path) -> &str {
    p.to_str().unwrap()
}

/// `run PLATE demo.toml OUT --device cpu` plus `extra`.
fn run_args<'a>(plate: &'a Path, pipeline: &'a str, out: &'a Path, extra: &[&'a str]) -> Vec<&'a str> {
    let mut v = vec!["run", s(plate), pipeline, s(out), "--device", "cpu"];
    v.extend_from_slice(extra);
    v
}

/// Wells recorded complete in `OUT/run_manifest.json` (0 if absent or mid-rename).
fn complete_wells(out: &Path) -> usize {
    std::fs::read(out.join("run_manifest.json"))
        .ok()
        .and_then(|b| serde_json::from_slice::<Value>(&b).ok())
        .and_then(|m| m["wells"].as_object().map(|w| w.values().filter(|r| r["status"] == "complete").count()))
        .unwrap_or(0)
}

/// Keys that legitimately differ between two runs with the same outputs.
const TIMING_KEYS: [&str; 1] = ["seconds"];

fn without_timings(v: &mut Value) {
    match v {
        Value::Object(m) => {
            m.retain(|k, _| !TIMING_KEYS.contains(&k.as_str()));
            m.values_mut().for_each(without_timings);
        }
        Value::Array(a) => a.iter_mut().for_each(without_timings),
        _ => {}
    }
}

/// Files that describe a run rather than its results, so they differ between
/// any two runs: the lock (its last holder's pid and start time) and the run
/// report with its HTML page (the output path, peak RSS, throughput, which
/// wells this run skipped). [`assert_report_covers_every_well`] checks the
/// report instead. Everything else must match, hidden temporaries included:
/// a resumed run leaves none (D7).
fn describes_the_run(p: &Path) -> bool {
    use hcsflow_pipeline::{LOCK_NAME, REPORT_HTML_NAME, RUN_REPORT_NAME};
    p.file_name().is_some_and(|n| n == LOCK_NAME || n == RUN_REPORT_NAME || n == REPORT_HTML_NAME)
}

/// The run report of the run that finished `out` lists every well of the
/// plate once, each complete or skipped (as already complete), and no failure.
fn assert_report_covers_every_well(out: &Path, wells: &[&str]) {
    let report: Value = serde_json::from_slice(&std::fs::read(out.join(hcsflow_pipeline::RUN_REPORT_NAME)).unwrap()).unwrap();
    let mut listed: Vec<(&str, &str)> =
        report["wells"].as_array().unwrap().iter().map(|w| (w["well"].as_str().unwrap(), w["status"].as_str().unwrap())).collect();
    listed.sort();
    let names: Vec<&str> = listed.iter().map(|(w, _)| *w).collect();
    assert_eq!(names, wells, "the report's wells");
    assert!(listed.iter().all(|(_, s)| *s == "complete" || *s == "skipped (resumed)"), "{listed:?}");
    assert_eq!(report["failures"].as_array().map(Vec::len), Some(0), "{}", report["failures"]);
    assert!(std::fs::metadata(out.join(hcsflow_pipeline::REPORT_HTML_NAME)).unwrap().len() > 0, "report.html");
}

/// Relative path → comparable content of every file under `root`: bytes, or
/// for JSON the value without timing fields. Folders map to `None`.
fn tree(root: &Path) -> BTreeMap<PathBuf, Option<Vec<u8>>> {
    snapshot(root)
        .into_iter()
        .filter(|(p, _)| !describes_the_run(p))
        .map(|(p, e)| {
            let rel = p.strip_prefix(root).unwrap().to_path_buf();
            if e.is_dir {
                return (rel, None);
            }
            let bytes = std::fs::read(&p).unwrap();
            let is_json = p.extension().is_some_and(|x| x == "json")
                || p.file_name().is_some_and(|n| n == ".zattrs" || n == ".zarray" || n == ".zgroup");
            let bytes = match serde_json::from_slice::<Value>(&bytes) {
                Ok(mut v) if is_json => {
                    without_timings(&mut v);
                    serde_json::to_vec(&v).unwrap()
                }
                _ => bytes,
            };
            (rel, Some(bytes))
        })
        .collect()
}

/// Asserts that two output folders hold the same files with the same content
/// (TIFF, CSV, Zarr chunks byte for byte; JSON without timing fields).
fn assert_same_outputs(got: &Path, want: &Path) {
    let (g, w) = (tree(got), tree(want));
    let only = |a: &BTreeMap<PathBuf, _>, b: &BTreeMap<PathBuf, _>| a.keys().filter(|k| !b.contains_key(*k)).cloned().collect::<Vec<_>>();
    assert!(only(&g, &w).is_empty() && only(&w, &g).is_empty(), "extra: {:?}\nmissing: {:?}", only(&g, &w), only(&w, &g));
    let differ: Vec<&PathBuf> = g.iter().filter(|(k, v)| w[*k] != **v).map(|(k, _)| k).collect();
    assert!(differ.is_empty(), "{} file(s) differ from the uninterrupted run: {differ:?}", differ.len());
    let count = |ext: &str| g.keys().filter(|p| p.extension().is_some_and(|e| e == ext)).count();
    assert!(count("tif") > 0 && count("csv") > 0, "nothing to compare under {}", got.display());
}

/// Lines of a child's stderr, read on a thread.
fn lines(stderr: ChildStderr) -> Receiver<String> {
    let (tx, rx) = channel();
    std::thread::spawn(move || {
        for line in BufReader::new(stderr).lines() {
            let Ok(line) = line else { break };
            if tx.send(line).is_err() {
                break;
            }
        }
    });
    rx
}

/// Reads lines until one satisfies `pred`; panics after 60 s. Returns every line read.
fn wait_for_line(rx: &Receiver<String>, pred: impl Fn(&str) -> bool) -> Vec<String> {
    let deadline = Instant::now() + Duration::from_secs(60);
    let mut seen = Vec::new();
    loop {
        let left = deadline.saturating_duration_since(Instant::now());
        match rx.recv_timeout(left) {
            Ok(l) => {
                let hit = pred(&l);
                seen.push(l);
                if hit {
                    return seen;
                }
            }
            Err(e) => panic!("no such line ({e}); read so far:\n{}", seen.join("\n")),
        }
    }
}

fn kill(child: &Child, signal: libc::c_int) {
    // SAFETY: sending a signal to our own child.
    assert_eq!(unsafe { libc::kill(child.id() as libc::pid_t, signal) }, 0);
}

fn wait(child: &mut Child) -> ExitStatus {
    child.wait().unwrap()
}

// ---------------------------------------------------------------- SIGKILL

/// Probe 5a: SIGKILL after 1, 3 and 5 wells and during the plate-level writes
/// at the end, then `--resume`: the outputs equal an uninterrupted run's.
#[test]
fn sigkill_at_several_points_then_resume_equals_an_uninterrupted_run() {
    let dir = tempfile::tempdir().unwrap();
    let plate = dir.path().join("plate");
    let wells = &WELLS[..8];
    synth(&plate, wells);
    let pipeline = demo_toml();
    let reference = dir.path().join("reference");
    let o = hcsflow(&run_args(&plate, &pipeline, &reference, &["--workers", "2"]));
    assert!(o.status.success(), "{}", stderr(&o));

    for kill_after in [1, 3, 5, wells.len()] {
        let out = dir.path().join(format!("killed_after_{kill_after}"));
        let mut child = hcsflow_cmd(&run_args(&plate, &pipeline, &out, &["--workers", "2"])).stderr(Stdio::null()).spawn().unwrap();
        let start = Instant::now();
        let mut killed = false;
        while start.elapsed() < Duration::from_secs(60) {
            if child.try_wait().unwrap().is_some() {
                break;
            }
            if complete_wells(&out) >= kill_after {
                killed = child.kill().is_ok();
                break;
            }
            std::thread::sleep(Duration::from_millis(1));
        }
        let status = wait(&mut child);
        eprintln!("kill after {kill_after} well(s): killed {killed} ({status}), {} recorded complete", complete_wells(&out));
        let o = hcsflow(&run_args(&plate, &pipeline, &out, &["--workers", "2", "--resume"]));
        assert!(o.status.success(), "resume after a kill at {kill_after}: {}", stderr(&o));
        assert_same_outputs(&out, &reference);
        assert_report_covers_every_well(&out, wells);
    }
}

// ---------------------------------------------------------------- two runs

/// D12 / probe 7: a second run into an OUT that a run is writing, with another
/// pipeline, is refused at once (exit 2, naming the first run's pid) and
/// writes nothing; the first run finishes with exactly the outputs of a run
/// that had the folder to itself.
#[test]
fn a_second_run_into_the_same_folder_is_refused_and_the_first_is_unharmed() {
    let dir = tempfile::tempdir().unwrap();
    let plate = dir.path().join("plate");
    synth(&plate, &WELLS[..6]);
    let pipeline = demo_toml();
    let reference = dir.path().join("reference");
    let o = hcsflow(&run_args(&plate, &pipeline, &reference, &["--workers", "1"]));
    assert!(o.status.success(), "{}", stderr(&o));
    let max_z = dir.path().join("max_z.toml");
    std::fs::write(
        &max_z,
        "name = \"other\"\n[[steps]]\nname = \"other_max\"\nfunc = \"max_projection\"\nvariable_components = [\"z_index\"]\nmaterialize = [\"tiff\"]\n",
    )
    .unwrap();

    let out = dir.path().join("out");
    let mut first = hcsflow_cmd(&run_args(&plate, &pipeline, &out, &["--workers", "1"])).stderr(Stdio::piped()).spawn().unwrap();
    let rx = lines(first.stderr.take().unwrap());
    wait_for_line(&rx, |l| l.starts_with("[1/6] ") && l.contains("done in"));
    let second = hcsflow(&run_args(&plate, s(&max_z), &out, &[]));
    let err = stderr(&second);
    assert_eq!(second.status.code(), Some(2), "{err}");
    assert!(err.contains(&format!("is in use by hcsflow run pid {}", first.id())), "{err}");
    let status = wait(&mut first);
    let rest: Vec<String> = rx.iter().collect();
    assert!(status.success(), "the first run: {status}\n{}", rest.join("\n"));
    assert!(!out.join("other_max").exists(), "the refused run wrote its step folder");
    assert_same_outputs(&out, &reference);
    assert_report_covers_every_well(&out, &WELLS[..6]);
}

// ---------------------------------------------------------------- SIGTERM

/// D6 / probe 5d: SIGTERM stops like a first Ctrl-C: the well in flight is
/// finished, no other starts, the manifest records exactly the finished
/// wells, exit 130 with "interrupted (SIGTERM): N well(s) not started", and
/// `--resume` completes to the outputs of an uninterrupted run.
#[test]
fn sigterm_finishes_the_well_in_flight_and_resume_completes_the_run() {
    let dir = tempfile::tempdir().unwrap();
    let plate = dir.path().join("plate");
    synth(&plate, &WELLS);
    let pipeline = demo_toml();
    let reference = dir.path().join("reference");
    let o = hcsflow(&run_args(&plate, &pipeline, &reference, &["--workers", "1"]));
    assert!(o.status.success(), "{}", stderr(&o));

    let out = dir.path().join("out");
    let mut child = hcsflow_cmd(&run_args(&plate, &pipeline, &out, &["--workers", "1"])).stderr(Stdio::piped()).spawn().unwrap();
    let rx = lines(child.stderr.take().unwrap());
    let mut seen = wait_for_line(&rx, |l| l.starts_with("[1/12] ") && l.contains("done in"));
    kill(&child, libc::SIGTERM);
    let status = wait(&mut child);
    seen.extend(rx.iter());
    let text = seen.join("\n");
    assert_eq!(status.code(), Some(130), "{text}");
    assert!(text.contains("interrupted (SIGTERM): finishing the wells in flight, starting no more"), "{text}");
    let finished = seen.iter().filter(|l| l.contains(": done in ")).count();
    assert!((1..12).contains(&finished), "{text}");
    let not_started = 12 - finished;
    assert!(text.contains(&format!("error: interrupted (SIGTERM): {not_started} well(s) not started; re-run with --resume")), "{text}");
    assert_eq!(complete_wells(&out), finished, "the manifest records the finished wells, no more, no fewer");
    assert!(out.join("summary.csv").exists(), "{text}");

    let o = hcsflow(&run_args(&plate, &pipeline, &out, &["--workers", "1", "--resume"]));
    assert!(o.status.success(), "{}", stderr(&o));
    assert!(stderr(&o).contains(&format!("{finished} skipped as already complete")), "{}", stderr(&o));
    assert_same_outputs(&out, &reference);
    assert_report_covers_every_well(&out, &WELLS);
}

/// D6: a second signal during the graceful stop ends the process at once
/// with 128 + its number. The child is stopped while two different signals
/// are queued (the same signal twice would merge into one), then continued:
/// whichever handler runs second exits at once, so the code is 143 (SIGTERM)
/// or 129 (SIGHUP), never the graceful 130, and no summary line is printed.
#[test]
fn a_second_signal_stops_at_once() {
    let dir = tempfile::tempdir().unwrap();
    let plate = dir.path().join("plate");
    synth(&plate, &WELLS[..6]);
    let pipeline = demo_toml();
    let out = dir.path().join("out");
    let mut child = hcsflow_cmd(&run_args(&plate, &pipeline, &out, &["--workers", "1"])).stderr(Stdio::piped()).spawn().unwrap();
    let rx = lines(child.stderr.take().unwrap());
    // The handlers are installed before this line is printed.
    let mut seen = wait_for_line(&rx, |l| l.starts_with("running "));
    kill(&child, libc::SIGSTOP);
    kill(&child, libc::SIGTERM);
    kill(&child, libc::SIGHUP);
    kill(&child, libc::SIGCONT);
    let status = wait(&mut child);
    seen.extend(rx.iter());
    let text = seen.join("\n");
    assert!(matches!(status.code(), Some(143) | Some(129)), "{status}: {text}");
    assert!(!text.contains("not started"), "{text}");
}

/// A signal the run inherited as ignored stays ignored: under `nohup`
/// (SIGHUP ignored) a hang-up does not stop the run, which completes (exit 0).
#[test]
fn under_nohup_a_hang_up_does_not_stop_the_run() {
    use std::os::unix::process::CommandExt;
    let dir = tempfile::tempdir().unwrap();
    let plate = dir.path().join("plate");
    synth(&plate, &WELLS);
    let out = dir.path().join("out");
    let mut cmd = hcsflow_cmd(&run_args(&plate, &demo_toml(), &out, &["--workers", "1"]));
    // SAFETY: signal() is async-signal-safe; this is what nohup does before exec.
    unsafe {
        cmd.pre_exec(|| {
            libc::signal(libc::SIGHUP, libc::SIG_IGN);
            Ok(())
        });
    }
    let mut child = cmd.stderr(Stdio::piped()).spawn().unwrap();
    let rx = lines(child.stderr.take().unwrap());
    let mut seen = wait_for_line(&rx, |l| l.starts_with("[1/12] "));
    kill(&child, libc::SIGHUP);
    let status = wait(&mut child);
    seen.extend(rx.iter());
    let text = seen.join("\n");
    assert_eq!(status.code(), Some(0), "{text}");
    assert!(!text.contains("interrupted"), "{text}");
    assert_eq!(complete_wells(&out), 12);
}

// ---------------------------------------------------------------- closed pipes

/// D5 / probe 5e: the reader of stderr goes away after the first line (as
/// with `2>&1 | head -1`): the run still finishes every well, writes
/// summary.csv and the manifest, and exits 0 (the old code panicked: 101).
#[test]
fn a_closed_stderr_does_not_stop_the_run() {
    let dir = tempfile::tempdir().unwrap();
    let plate = dir.path().join("plate");
    synth(&plate, &WELLS);
    let out = dir.path().join("out");
    let mut child = hcsflow_cmd(&run_args(&plate, &demo_toml(), &out, &[])).stdout(Stdio::null()).stderr(Stdio::piped()).spawn().unwrap();
    let mut reader = BufReader::new(child.stderr.take().unwrap());
    let mut first = String::new();
    reader.read_line(&mut first).unwrap();
    assert!(first.starts_with("running "), "{first}");
    drop(reader);
    let status = wait(&mut child);
    assert_eq!(status.code(), Some(0), "{status}");
    assert_eq!(complete_wells(&out), 12);
    let summary = std::fs::read_to_string(out.join("summary.csv")).unwrap();
    for w in WELLS {
        assert!(summary.lines().any(|l| l.starts_with(&format!("{w},"))), "{w} missing from summary.csv");
    }
}

/// D15: a closed stdout ends a command quietly with exit 0 (as ripgrep does),
/// no panic and no "failed printing" message. The `--dry-run` plan of a
/// 1536-well plate (150 KB, more than a pipe holds) is closed after a few
/// bytes; the others are closed before they print.
#[test]
fn a_closed_stdout_ends_a_command_quietly_with_exit_0() {
    let dir = tempfile::tempdir().unwrap();
    let plate = dir.path().join("plate");
    let cfg =
        SynthConfig { plate_size: 1536, wells: Vec::new(), grid_rows: 1, grid_cols: 1, channels: 1, size: 16, ..SynthConfig::default() };
    generate(&cfg, &plate).expect("generate");
    let out = dir.path().join("out");
    let synth_out = dir.path().join("synth");
    let pipeline = demo_toml();
    let dry = run_args(&plate, &pipeline, &out, &["--dry-run"]);
    let cases: [(&[&str], usize); 5] = [
        (&dry, 16),
        (&["functions", "--json"], 0),
        (&["functions"], 0),
        (&["doctor", "--json"], 0),
        (&["synth", s(&synth_out), "--wells", "A01", "--grid", "1x1", "--size", "32"], 0),
    ];
    for (args, read) in cases {
        let mut child = hcsflow_cmd(args).stdout(Stdio::piped()).stderr(Stdio::piped()).spawn().unwrap();
        let mut stdout = child.stdout.take().unwrap();
        let mut head = vec![0u8; read];
        stdout.read_exact(&mut head).unwrap();
        drop(stdout);
        let mut err = String::new();
        child.stderr.take().unwrap().read_to_string(&mut err).unwrap();
        let status = wait(&mut child);
        assert_eq!(status.code(), Some(0), "{args:?}: {status}: {err}");
        assert!(!err.contains("panicked") && !err.contains("failed printing") && !err.contains("error"), "{args:?}: {err}");
    }
    assert!(synth_out.join("ground_truth").is_dir(), "synth did its work before printing");
}

// ---------------------------------------------------------------- exit codes

/// D17: problems with the pipeline file or OUT are usage errors (exit 2)
/// found before any pixel is read, each naming the path; nothing is written.
#[test]
fn a_bad_pipeline_file_or_an_output_that_is_a_file_exits_2() {
    let dir = tempfile::tempdir().unwrap();
    let plate = dir.path().join("plate");
    synth(&plate, &WELLS[..1]);
    let pipeline = demo_toml();
    let out = dir.path().join("out");
    let missing = dir.path().join("missing.toml");
    let folder = dir.path().join("folder.toml");
    std::fs::create_dir(&folder).unwrap();
    let latin1 = dir.path().join("latin1.toml");
    std::fs::write(&latin1, b"name = \"caf\xe9\"\n").unwrap();
    for p in [&missing, &folder, &latin1] {
        let o = hcsflow(&run_args(&plate, s(p), &out, &[]));
        assert_eq!(o.status.code(), Some(2), "{}: {}", p.display(), stderr(&o));
        assert!(stderr(&o).contains(s(p)), "{}", stderr(&o));
        assert!(!out.exists(), "nothing is written");
    }

    let file = dir.path().join("file");
    std::fs::write(&file, b"keep").unwrap();
    for (target, extra) in [(&file, None), (&file.join("sub"), None), (&file, Some("--dry-run"))] {
        let o = hcsflow(&run_args(&plate, &pipeline, target, extra.as_slice()));
        let e = stderr(&o);
        assert_eq!(o.status.code(), Some(2), "{}: {e}", target.display());
        assert!(e.contains(&format!("output folder {}", target.display())) && e.contains("is not a folder"), "{e}");
        assert!(!e.contains("os error 17"), "{e}");
        assert_eq!(std::fs::read(&file).unwrap(), b"keep");
    }
}

/// D17: `synth --overwrite` over a folder that is not a synthetic plate is a
/// usage error (exit 2) like without `--overwrite`, and the folder is untouched.
#[test]
fn synth_overwrite_over_a_user_folder_exits_2() {
    let dir = tempfile::tempdir().unwrap();
    let user = dir.path().join("user");
    std::fs::create_dir(&user).unwrap();
    std::fs::write(user.join("notes.txt"), b"mine").unwrap();
    for extra in [None, Some("--overwrite")] {
        let mut args = vec!["synth", s(&user), "--wells", "A01", "--grid", "1x1", "--size", "32"];
        args.extend(extra);
        let o = hcsflow(&args);
        assert_eq!(o.status.code(), Some(2), "{extra:?}: {}", stderr(&o));
        assert!(stderr(&o).contains(s(&user)), "{}", stderr(&o));
    }
    assert_eq!(std::fs::read_dir(&user).unwrap().count(), 1);
    assert_eq!(std::fs::read(user.join("notes.txt")).unwrap(), b"mine");
}

// ---------------------------------------------------------------- apply

/// D16: `apply F IN OUT` where OUT is IN (same path, another spelling, a
/// symlink, a hard link) is refused with exit 2 before reading, naming both
/// paths; the input is untouched. A different existing file is replaced.
#[test]
fn apply_refuses_to_write_over_its_input() {
    let dir = tempfile::tempdir().unwrap();
    let input = dir.path().join("in.tif");
    let stack = hcsflow_testkit::random_stack(hcsflow_core::DType::U16, [3, 16, 16], 7);
    hcsflow_tiff::write_stack(&input, &stack, &Default::default()).unwrap();
    let bytes = std::fs::read(&input).unwrap();
    let sub = dir.path().join("sub");
    std::fs::create_dir(&sub).unwrap();
    let dotted = sub.join("..").join("in.tif");
    let link = dir.path().join("link.tif");
    std::os::unix::fs::symlink(&input, &link).unwrap();
    let hard = dir.path().join("hard.tif");
    std::fs::hard_link(&input, &hard).unwrap();
    for output in [&input, &dotted, &link, &hard] {
        let o = hcsflow(&["apply", "max_projection", s(&input), s(output), "--device", "cpu"]);
        let e = stderr(&o);
        assert_eq!(o.status.code(), Some(2), "{}: {e}", output.display());
        assert!(e.contains(&format!("the output {} is the input {}", output.display(), input.display())), "{e}");
        assert_eq!(std::fs::read(&input).unwrap(), bytes, "the input was replaced through {}", output.display());
    }
    // Also with the link as the input and the real file as the output.
    let o = hcsflow(&["apply", "max_projection", s(&link), s(&input), "--device", "cpu"]);
    assert_eq!(o.status.code(), Some(2), "{}", stderr(&o));
    // A different file is still written over, as before.
    let other = dir.path().join("other.tif");
    std::fs::write(&other, b"old").unwrap();
    let o = hcsflow(&["apply", "max_projection", s(&input), s(&other), "--device", "cpu"]);
    assert!(o.status.success(), "{}", stderr(&o));
    assert_eq!(hcsflow_tiff::read_stack(&other).unwrap().shape(), [1, 16, 16]);
}
