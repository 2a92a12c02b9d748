//! Fault probes of the `hcsflow` binary (reliability probes 5a–5e, D5, D6,
//! D15, D16, D17): SIGKILL at several points then `--resume`, SIGTERM as a
//! graceful stop, closed stdout/stderr pipes, exit codes of usage errors and
//! `apply` refusing to replace its input. Small plates (64², a few wells) so
//! that each test takes seconds on a debug build. Unix only (signals).
#![cfg(unix)]

use std::io::{BufRead, BufReader, Read};
use std::process::{Child, ChildStderr, ExitStatus, Stdio};
use std::sync::mpsc::{channel, Receiver};
use std::time::{Duration, Instant};

use hcsflow_synth::{generate, SynthConfig};

use crate::common;
use common::outputs::{assert_report_covers_every_well, assert_same_outputs, complete_wells, demo_toml, hcsflow_cmd, run_args, s, synth};
use common::{hcsflow, stderr};

const WELLS: [&str; 12] = ["A01", "A02", "A03", "A04", "A05", "A06", "B01", "B02", "B03", "B04", "B05", "B06"];

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
