//! The output folder through the CLI: a folder another run holds is refused
//! (exit 2) and left alone; another pipeline's outputs are refused, and
//! removed with `--overwrite`; stale temporaries go at the next run; a full
//! disk stops the run with every well in the manifest (or, when even the
//! manifest cannot be written, in the summary), exit 1, no temporary left.
//!
//! The disk-full cases run twice: on a real small tmpfs (inside `unshare
//! --mount`; skipped with a printed reason where mounting is impossible) and
//! through the pipeline's test-only fault injection
//! (`HCSFLOW_TEST_DISK_FULL_AFTER`), which always runs.

use std::fs::OpenOptions;
use std::path::{Path, PathBuf};
use std::process::{Command, Output};

use hcsflow_synth::{generate, SynthConfig};
use serde_json::Value;

use crate::common;
use common::{hcsflow, stderr};

const MIN_Z: &str = "name = \"min_z\"\n[[steps]]\nname = \"min_z\"\nfunc = \"min_projection\"\nvariable_components = [\"z_index\"]\nmaterialize = [\"tiff\"]\n";
const MAX_Z: &str = "name = \"max_z\"\n[[steps]]\nname = \"max_z\"\nfunc = \"max_projection\"\nvariable_components = [\"z_index\"]\nmaterialize = [\"tiff\"]\n";
const WELLS: [&str; 4] = ["A01", "A02", "A03", "A04"];

/// Four wells, one site, one channel, 3 z, `size`²; one output TIFF per well.
fn plate(dir: &Path, size: u32) -> String {
    let root = dir.join("plate");
    let cfg = SynthConfig {
        size,
        z_planes: 3,
        grid_rows: 1,
        grid_cols: 1,
        channels: 1,
        wells: WELLS.iter().map(|w| w.to_string()).collect(),
        ..SynthConfig::default()
    };
    generate(&cfg, &root).expect("generate");
    root.to_string_lossy().into_owned()
}

fn pipeline(dir: &Path, name: &str, text: &str) -> String {
    let p = dir.join(name);
    std::fs::write(&p, text).expect("write");
    p.to_string_lossy().into_owned()
}

fn manifest(out: &Path) -> Value {
    serde_json::from_slice(&std::fs::read(out.join("run_manifest.json")).expect("read the manifest")).expect("json")
}

/// Hidden temporaries (`.…tmp…`) under `root`.
fn temps(root: &Path) -> Vec<PathBuf> {
    hcsflow_testkit::snapshot(root)
        .into_keys()
        .filter(|p| {
            p.is_file() && p.file_name().is_some_and(|n| n.to_string_lossy().starts_with('.') && n.to_string_lossy().contains("tmp"))
        })
        .collect()
}

#[test]
fn a_folder_another_run_holds_is_refused_with_its_holder() {
    let dir = tempfile::tempdir().expect("tempdir");
    let plate = plate(dir.path(), 64);
    let min_z = pipeline(dir.path(), "min_z.toml", MIN_Z);
    let out = dir.path().join("out");
    std::fs::create_dir(&out).expect("mkdir");
    // This test process holds the lock, as a running hcsflow would.
    let lock = OpenOptions::new().read(true).write(true).create(true).truncate(false).open(out.join(".hcsflow.lock")).expect("open");
    lock.try_lock().expect("lock");
    let holder = format!(
        r#"{{"pid":{},"host":"labhost","started":"2026-11-24T01:02:03Z","command":"hcsflow run plate demo.toml out","pipeline":"demo"}}"#,
        std::process::id()
    );
    std::fs::write(out.join(".hcsflow.lock"), &holder).expect("write");
    let o = hcsflow(&["run", &plate, &min_z, out.to_str().unwrap()]);
    let err = stderr(&o);
    assert_eq!(o.status.code(), Some(2), "{err}");
    let expected = format!("is in use by hcsflow run pid {} on host labhost since 2026-11-24T01:02:03Z", std::process::id());
    assert!(err.contains(&expected) && err.contains("wait for that run to finish, or choose another output folder"), "{err}");
    let names: Vec<String> =
        std::fs::read_dir(&out).expect("read_dir").map(|e| e.expect("entry").file_name().to_string_lossy().into_owned()).collect();
    assert_eq!(names, [".hcsflow.lock"], "the refused run wrote something");
    assert_eq!(std::fs::read_to_string(out.join(".hcsflow.lock")).expect("read"), holder);
    drop(lock);
    let o = hcsflow(&["run", &plate, &min_z, out.to_str().unwrap()]);
    assert_eq!(o.status.code(), Some(0), "released: {}", stderr(&o));
}

#[test]
fn another_pipelines_outputs_are_refused_then_replaced_with_overwrite() {
    let dir = tempfile::tempdir().expect("tempdir");
    let plate = plate(dir.path(), 64);
    let (min_z, max_z) = (pipeline(dir.path(), "min_z.toml", MIN_Z), pipeline(dir.path(), "max_z.toml", MAX_Z));
    let out = dir.path().join("out");
    let o = hcsflow(&["run", &plate, &max_z, out.to_str().unwrap()]);
    assert_eq!(o.status.code(), Some(0), "{}", stderr(&o));
    let o = hcsflow(&["run", &plate, &min_z, out.to_str().unwrap()]);
    let err = stderr(&o);
    assert_eq!(o.status.code(), Some(2), "{err}");
    assert!(err.contains("holds the outputs of a run of a different pipeline ('max_z'") && err.contains("--overwrite"), "{err}");
    assert!(!out.join("min_z").exists());
    let o = hcsflow(&["run", &plate, &min_z, out.to_str().unwrap(), "--resume", "--overwrite"]);
    assert_eq!(o.status.code(), Some(2), "the two flags contradict: {}", stderr(&o));
    let o = hcsflow(&["run", &plate, &min_z, out.to_str().unwrap(), "--overwrite"]);
    assert_eq!(o.status.code(), Some(0), "{}", stderr(&o));
    assert!(!out.join("max_z").exists(), "the old run's outputs are removed (its folder was left empty)");
    assert_eq!(manifest(&out)["pipeline"], "min_z");
}

#[test]
fn stale_temporaries_are_removed_by_the_next_run_and_user_files_kept() {
    let dir = tempfile::tempdir().expect("tempdir");
    let plate = plate(dir.path(), 64);
    let min_z = pipeline(dir.path(), "min_z.toml", MIN_Z);
    let out = dir.path().join("out");
    let o = hcsflow(&["run", &plate, &min_z, out.to_str().unwrap()]);
    assert_eq!(o.status.code(), Some(0), "{}", stderr(&o));
    // What killed runs leave: the pipeline's `.NAME.PID.tmp`, the TIFF writer's `.NAME.PID-N.tmp`.
    let stale = [
        out.join(".run_manifest.json.31337.tmp"),
        out.join(".summary.csv.31337.tmp"),
        out.join("min_z/TimePoint_1/.Synth_Plate_1_A01.tif.31337-4.tmp"),
    ];
    let kept = [out.join(".notes.tmp"), out.join("min_z/.notes.tmp"), out.join("min_z/TimePoint_1/.backup.tmp-old")];
    for f in stale.iter().chain(&kept) {
        std::fs::write(f, "x").expect("plant");
    }
    let o = hcsflow(&["run", &plate, &min_z, out.to_str().unwrap(), "--resume"]);
    assert_eq!(o.status.code(), Some(0), "{}", stderr(&o));
    for f in &stale {
        assert!(!f.exists(), "stale temporary left: {}", f.display());
    }
    for f in &kept {
        assert!(f.exists(), "a user's file was removed: {}", f.display());
    }
}

/// Checks a run stopped by a full disk: exit 1, the summary printed, every
/// well in the manifest (complete, failed with ENOSPC, or not started because
/// of it), at least one complete, no temporary left.
fn assert_stopped_by_full_disk(code: Option<i32>, err: &str, manifest: &Value, temps: &[PathBuf]) {
    assert_eq!(code, Some(1), "{err}");
    assert!(err.contains("well(s) complete (0 skipped as already complete)"), "no summary line: {err}");
    assert!(err.contains("not started because the output file system takes no more data"), "{err}");
    let wells = manifest["wells"].as_object().expect("wells");
    assert_eq!(wells.len(), WELLS.len(), "every well is in the manifest: {manifest}");
    let mut statuses = Vec::new();
    for (well, r) in wells {
        let status = r["status"].as_str().expect("status");
        let error = r["error"].as_str().unwrap_or("");
        match status {
            "complete" => {}
            "failed" => assert!(error.contains("No space left on device (os error 28)"), "{well}: {error}"),
            "not started" => assert!(error.starts_with("not started: the output file system takes no more data"), "{well}: {error}"),
            other => panic!("{well}: status {other}"),
        }
        statuses.push(status);
    }
    assert!(statuses.contains(&"complete") && statuses.contains(&"failed") && statuses.contains(&"not started"), "{statuses:?}");
    assert!(temps.is_empty(), "temporaries left: {temps:?}");
}

/// `hcsflow run` of the min-z pipeline on a 64² plate in `dir` into `out`, one
/// worker, with the hidden test hook that fails writes once `bytes` are written.
fn min_z_with_disk_budget(dir: &Path, out: &Path, bytes: u64) -> Output {
    let plate = plate(dir, 64);
    let min_z = pipeline(dir, "min_z.toml", MIN_Z);
    Command::new(env!("CARGO_BIN_EXE_hcsflow"))
        .args(["run", &plate, &min_z, out.to_str().unwrap(), "--workers", "1"])
        .env("HCSFLOW_TEST_DISK_FULL_AFTER", bytes.to_string())
        .output()
        .expect("run hcsflow")
}

#[test]
fn a_full_disk_stops_the_run_and_the_manifest_holds_every_well_injected() {
    let dir = tempfile::tempdir().expect("tempdir");
    let out = dir.path().join("out");
    // Room for two wells' 8 KiB planes and the manifests, not a third plane.
    let o = min_z_with_disk_budget(dir.path(), &out, 2 * 8192 + 6000);
    assert_stopped_by_full_disk(o.status.code(), &stderr(&o), &manifest(&out), &temps(&out));
}

#[test]
fn when_even_the_manifest_cannot_be_written_the_summary_says_what_it_misses_injected() {
    let dir = tempfile::tempdir().expect("tempdir");
    let out = dir.path().join("out");
    // Room for the first manifests and one plane, not for the manifest after
    // the second well (measured: 700–1100 bytes over the plane work).
    let o = min_z_with_disk_budget(dir.path(), &out, 8192 + 900);
    let err = stderr(&o);
    assert_eq!(o.status.code(), Some(1), "{err}");
    assert!(err.contains("1 of 4 well(s) complete (0 skipped as already complete), 1 failed, 2 not started"), "{err}");
    assert!(
        err.contains("the run manifest could not be written: ")
            && err.contains("No space left on device (os error 28); the file on disk misses the outcome of well(s) A02 (failed), A03 (not started), A04 (not started)"),
        "{err}"
    );
    // The file on disk is the last one written: truthful, if incomplete.
    let m = manifest(&out);
    assert_eq!(m["wells"]["A01"]["status"], "complete", "{m}");
    assert!(m["wells"].get("A02").is_none(), "{m}");
    assert!(temps(&out).is_empty(), "{:?}", temps(&out));
}

/// How to mount a file system here: `unshare --mount` as root, `unshare -rm`
/// (a user namespace) otherwise; `None` with the reason if neither works.
fn mount_namespace(probe: &Path) -> Result<Vec<&'static str>, String> {
    let mut reasons = Vec::new();
    for prefix in [vec!["--mount"], vec!["-rm"]] {
        let script = format!("mount -t tmpfs -o size=64k tmpfs '{}'", probe.display());
        match Command::new("unshare").args(&prefix).args(["sh", "-c", &script]).output() {
            Ok(o) if o.status.success() => return Ok(prefix),
            Ok(o) => reasons.push(format!("unshare {}: {}", prefix.join(" "), String::from_utf8_lossy(&o.stderr).trim())),
            Err(e) => reasons.push(format!("unshare: {e}")),
        }
    }
    Err(reasons.join("; "))
}

fn section<'a>(text: &'a str, name: &str) -> &'a str {
    let start = text.find(&format!("<<{name}>>\n")).map(|i| i + name.len() + 5).unwrap_or(text.len());
    let end = text[start..].find("<<").map(|i| start + i).unwrap_or(text.len());
    &text[start..end]
}

#[test]
fn a_full_disk_stops_the_run_and_the_manifest_holds_every_well_tmpfs() {
    let dir = tempfile::tempdir().expect("tempdir");
    let small = dir.path().join("small");
    std::fs::create_dir(&small).expect("mkdir");
    let prefix = match mount_namespace(&small) {
        Ok(p) => p,
        Err(reason) => {
            println!("SKIPPED: cannot mount a small tmpfs here ({reason}); the injected disk-full tests still run");
            return;
        }
    };
    // 128 KiB per output plane on a 400 KiB file system: two wells fit, the third does not.
    let plate = plate(dir.path(), 256);
    let min_z = pipeline(dir.path(), "min_z.toml", MIN_Z);
    let out = small.join("out");
    let script = format!(
        "mount -t tmpfs -o size=400k tmpfs '{small}' || exit 99\n\
         '{bin}' run '{plate}' '{min_z}' '{out}' --workers 1 2>\"$0\"; rc=$?; echo '<<exit>>'; echo $rc\n\
         echo '<<temps>>'; find '{out}' -name '.*tmp*'\n\
         echo '<<manifest>>'; cat '{out}/run_manifest.json'",
        small = small.display(),
        bin = env!("CARGO_BIN_EXE_hcsflow"),
        out = out.display(),
    );
    let log = dir.path().join("stderr.txt");
    let o: Output = Command::new("unshare").args(&prefix).args(["sh", "-c", &script, log.to_str().unwrap()]).output().expect("unshare");
    let text = String::from_utf8_lossy(&o.stdout).into_owned();
    let err = std::fs::read_to_string(&log).unwrap_or_default();
    assert!(o.status.success(), "{text}\n{}\n{err}", String::from_utf8_lossy(&o.stderr));
    let code: Option<i32> = section(&text, "exit").trim().parse().ok();
    let temps: Vec<PathBuf> = section(&text, "temps").lines().filter(|l| !l.is_empty()).map(PathBuf::from).collect();
    let m: Value = serde_json::from_str(section(&text, "manifest")).unwrap_or_else(|e| panic!("{e}: {text}\n{err}"));
    assert_stopped_by_full_disk(code, &err, &m, &temps);
}
