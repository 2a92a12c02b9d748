//! The output folder: one run at a time (`OUT/.hcsflow.lock`), another run's
//! outputs refused or, with `overwrite`, removed (only what its manifest
//! lists), and hcsflow's stale temporaries removed (never a user's file,
//! never anything in the plate).

use crate::common;

use std::collections::BTreeMap;
use std::fs::{File, OpenOptions, TryLockError};
use std::path::{Path, PathBuf};
use std::sync::Mutex;

use hcsflow::builtin;
use hcsflow_pipeline::{execute, Manifest, PipelineError, Plan, Progress, RunOptions, RunSummary, LOCK_NAME};
use hcsflow_synth::SynthConfig;
use hcsflow_testkit::snapshot;

const MAX_Z: &str = "name = \"max_z\"\n[[steps]]\nname = \"max_z\"\nfunc = \"max_projection\"\nvariable_components = [\"z_index\"]\nmaterialize = [\"tiff\", \"zarr\"]\n";
use common::MIN_Z;

/// Wells A01, A02 (2×2 sites, 1 channel, 2 z, 64²) in `dir/name`.
fn plate(dir: &Path, name: &str) -> PathBuf {
    let root = dir.join(name);
    let cfg = SynthConfig {
        size: 64,
        z_planes: 2,
        grid_rows: 2,
        grid_cols: 2,
        channels: 1,
        wells: vec!["A01".into(), "A02".into()],
        ..SynthConfig::default()
    };
    common::synth_plate(&root, &cfg)
}

fn plan(root: &Path, toml: &str, out: &Path) -> Plan {
    common::compile_text(&common::open(root), toml, out).expect("compile")
}

fn run_with(plan: &Plan, options: &RunOptions) -> Result<RunSummary, PipelineError> {
    common::run_with(&builtin(), plan, options)
}

/// Every file under `root` with its bytes, but the lock file (hcsflow's own
/// bookkeeping: a refused run that took the lock records itself there).
fn contents(root: &Path) -> BTreeMap<PathBuf, Vec<u8>> {
    snapshot(root)
        .into_keys()
        .filter(|p| p.is_file() && !p.ends_with(LOCK_NAME))
        .map(|p| (p.clone(), std::fs::read(&p).expect("read")))
        .collect()
}

fn lock_file(out: &Path) -> File {
    OpenOptions::new().read(true).write(true).create(true).truncate(false).open(out.join(LOCK_NAME)).expect("open the lock file")
}

#[test]
fn a_run_into_a_folder_another_run_holds_is_refused_and_writes_nothing() {
    let dir = tempfile::tempdir().expect("tempdir");
    let root = plate(dir.path(), "plate");
    let out = dir.path().join("out");
    std::fs::create_dir(&out).expect("mkdir");
    // Another run holds the lock (an OS lock on another open file, as another process has).
    let held = lock_file(&out);
    held.try_lock().expect("lock");
    let holder =
        r#"{"pid":1234,"host":"labhost","started":"2026-11-24T01:02:03Z","command":"hcsflow run p demo.toml out","pipeline":"demo"}"#;
    std::fs::write(out.join(LOCK_NAME), holder).expect("write holder");
    let before = contents(&out);
    let e = run_with(&plan(&root, MAX_Z, &out), &RunOptions::default()).expect_err("the folder is in use");
    assert!(e.is_usage(), "exit 2: {e}");
    let text = e.to_string();
    for part in [
        "is in use by hcsflow run pid 1234 on host labhost since 2026-11-24T01:02:03Z (pipeline 'demo': hcsflow run p demo.toml out)",
        "wait for that run to finish, or choose another output folder",
    ] {
        assert!(text.contains(part), "'{part}' not in: {text}");
    }
    assert!(contents(&out) == before, "a refused run writes nothing");
    assert_eq!(std::fs::read_to_string(out.join(LOCK_NAME)).expect("read"), holder, "not even the lock file");
    // Released: now it runs.
    drop(held);
    let s = run_with(&plan(&root, MAX_Z, &out), &RunOptions::default()).expect("run");
    assert_eq!(s.completed.len(), 2);
}

#[test]
fn the_lock_is_held_for_the_whole_run_and_names_it() {
    let dir = tempfile::tempdir().expect("tempdir");
    let root = plate(dir.path(), "plate");
    let out = dir.path().join("out");
    let p = plan(&root, MAX_Z, &out);
    let seen: Mutex<Vec<(bool, String)>> = Mutex::new(Vec::new());
    let (r, c) = builtin();
    execute(&p, &r, &c, &RunOptions::default(), &|e| {
        if let Progress::Started { .. } = e {
            let free = match lock_file(&out).try_lock() {
                Ok(()) => true,
                Err(TryLockError::WouldBlock) => false,
                Err(TryLockError::Error(e)) => panic!("{e}"),
            };
            let text = std::fs::read_to_string(out.join(LOCK_NAME)).expect("read the lock file");
            seen.lock().expect("lock").push((free, text));
        }
    })
    .expect("run");
    let seen = seen.into_inner().expect("seen");
    assert_eq!(seen.len(), 2);
    for (free, text) in seen {
        assert!(!free, "the lock must be held while wells run");
        let holder: serde_json::Value = serde_json::from_str(&text).expect("the lock file is JSON");
        assert_eq!(holder["pid"], std::process::id());
        assert_eq!(holder["pipeline"], "max_z");
        assert!(holder["host"].as_str().is_some_and(|h| !h.is_empty()), "{holder}");
        assert!(holder["started"].as_str().is_some_and(|t| t.len() == 20 && t.ends_with('Z')), "{holder}");
        assert!(holder["command"].as_str().is_some_and(|c| !c.is_empty()), "{holder}");
    }
    lock_file(&out).try_lock().expect("released when the run ends");
}

#[test]
fn another_runs_outputs_are_refused_and_with_overwrite_only_they_are_removed() {
    let dir = tempfile::tempdir().expect("tempdir");
    let root = plate(dir.path(), "plate");
    let out = dir.path().join("out");
    let first = run_with(&plan(&root, MAX_Z, &out), &RunOptions::default()).expect("first run");
    assert_eq!(first.zarr_plates.len(), 1);
    let zarr = first.zarr_plates[0].clone();
    assert!(out.join("max_z/TimePoint_1").is_dir() && zarr.is_dir());
    // Files the manifest does not list: the user's.
    std::fs::write(out.join("notes.txt"), "mine").expect("write");
    std::fs::write(out.join("max_z/notes.txt"), "mine too").expect("write");

    let before = contents(&out);
    let min_z = plan(&root, MIN_Z, &out);
    let e = run_with(&min_z, &RunOptions::default()).expect_err("another pipeline's outputs");
    assert!(e.is_usage(), "exit 2: {e}");
    let text = e.to_string();
    for part in [
        "holds the outputs of a run of a different pipeline ('max_z'",
        "this one is 'min_z'",
        "--overwrite",
        "only the files its run_manifest.json lists",
    ] {
        assert!(text.contains(part), "'{part}' not in: {text}");
    }
    assert!(contents(&out) == before, "a refused run writes nothing");
    // --resume with another pipeline is refused the same way.
    let e = run_with(&min_z, &RunOptions { resume: true, ..RunOptions::default() }).expect_err("resume of another run");
    assert!(e.is_usage() && e.to_string().contains("--resume can only finish the same run"), "{e}");
    // --resume and --overwrite contradict each other.
    let e = run_with(&min_z, &RunOptions { resume: true, overwrite: true, ..RunOptions::default() }).expect_err("contradiction");
    assert!(e.is_usage() && e.to_string().contains("cannot go together"), "{e}");
    assert!(contents(&out) == before, "a refused run writes nothing");

    let s = run_with(&min_z, &RunOptions { overwrite: true, ..RunOptions::default() }).expect("overwrite");
    assert_eq!(s.completed.len(), 2);
    assert!(!zarr.exists(), "the old run's OME-Zarr plate is removed");
    assert!(!out.join("max_z/TimePoint_1").exists(), "the old run's images are removed");
    assert_eq!(std::fs::read_to_string(out.join("notes.txt")).expect("kept"), "mine");
    assert_eq!(std::fs::read_to_string(out.join("max_z/notes.txt")).expect("kept"), "mine too");
    let manifest = Manifest::read(&out).expect("read").expect("manifest");
    assert_eq!(manifest.pipeline, "min_z");
    assert!(out.join("min_z/TimePoint_1").is_dir());
    let summary = std::fs::read_to_string(out.join("summary.csv")).expect("summary");
    assert!(!summary.contains("max_z") && summary.contains("min_z"), "{summary}");
}

#[test]
fn the_same_pipeline_on_another_plate_is_refused() {
    let dir = tempfile::tempdir().expect("tempdir");
    let (a, b) = (plate(dir.path(), "plate_a"), plate(dir.path(), "plate_b"));
    let out = dir.path().join("out");
    run_with(&plan(&a, MIN_Z, &out), &RunOptions::default()).expect("first run");
    let e = run_with(&plan(&b, MIN_Z, &out), &RunOptions::default()).expect_err("another plate");
    assert!(e.is_usage() && e.to_string().contains("a different plate"), "{e}");
    // The same run again (no --resume) redoes every well, as before.
    let s = run_with(&plan(&a, MIN_Z, &out), &RunOptions::default()).expect("same run");
    assert_eq!(s.completed.len(), 2);
}

#[test]
fn stale_temporaries_are_removed_and_nothing_else() {
    let dir = tempfile::tempdir().expect("tempdir");
    let root = plate(dir.path(), "plate");
    let out = dir.path().join("out");
    let p = plan(&root, MAX_Z, &out);
    let first = run_with(&p, &RunOptions::default()).expect("first run");
    let zarr = first.zarr_plates[0].clone();
    let stale: Vec<PathBuf> = vec![
        out.join(".run_manifest.json.4242.tmp"),
        out.join(".summary.csv.4242.tmp"),
        out.join("max_z/TimePoint_1/.Synth_Plate_1_A01_s1_w1.tif.4242-7.tmp"),
        out.join("max_z/TimePoint_1/.Synth_Plate_1_A02_s3_w1.tif.17-0.tmp"),
        zarr.join("A/1/.zarr.json.tmp-4242-3"),
        // This version's one scheme (hcsflow_io::temp_name).
        out.join(".artifacts.csv.hcsflow-4242-9.tmp"),
        zarr.join("A/1/.zarr.json.hcsflow-4242-10.tmp"),
    ];
    let kept: Vec<PathBuf> = vec![
        out.join(".notes.tmp"),
        out.join("max_z/.notes.tmp"),
        out.join("max_z/TimePoint_1/.draft.tmp-old"),
        out.join(".a.1-2-3.tmp"),
        out.join("notes.4242.tmp"),
        // Inside the input plate: never touched, whatever the name.
        root.join(".x.tif.4242-1.tmp"),
    ];
    for f in stale.iter().chain(&kept) {
        std::fs::write(f, "x").unwrap_or_else(|e| panic!("{}: {e}", f.display()));
    }
    let s = run_with(&p, &RunOptions { resume: true, ..RunOptions::default() }).expect("resume");
    assert_eq!(s.skipped.len(), 2);
    for f in &stale {
        assert!(!f.exists(), "stale temporary left: {}", f.display());
    }
    for f in &kept {
        assert!(f.exists(), "not ours, yet removed: {}", f.display());
    }
}

#[test]
fn the_plate_inside_the_output_folder_is_not_swept() {
    let dir = tempfile::tempdir().expect("tempdir");
    let root = plate(dir.path(), "plate");
    let plate_temp = root.join("TimePoint_1/.Synth_Plate_1_A01_s1_w1.tif.4242-7.tmp");
    std::fs::write(&plate_temp, "x").expect("write");
    // OUT is the plate's parent (allowed): the plate is a folder of OUT, never swept.
    let out = dir.path().to_path_buf();
    let p = plan(&root, MIN_Z, &out);
    std::fs::write(out.join(".summary.csv.4242.tmp"), "x").expect("write");
    run_with(&p, &RunOptions::default()).expect("run");
    assert!(plate_temp.exists(), "a file in the plate was removed");
    assert!(!out.join(".summary.csv.4242.tmp").exists());
}
