//! Sharded runs (issue 21): `hcsflow run … --shard I/N` in sequence and side
//! by side, `--plate-steps-only` before them, then `--finalize`, give the
//! output of one `hcsflow run` of the plate, file for file (TIFFs, CSVs,
//! OME-Zarr chunks byte for byte; JSON without timings). A finished shard
//! re-run changes nothing; a finalize with a shard missing fails naming it.
#![cfg(unix)]

use std::path::Path;
use std::process::{Output, Stdio};

use hcsflow_testkit::snapshot;

use crate::common;
use common::outputs::{
    assert_report_covers_every_well, assert_same_outputs, demo_toml, describes_the_run, hcsflow_cmd, plate_and_reference, run_args, s,
    synth,
};
use common::{hcsflow, stderr};

const WELLS: [&str; 8] = ["A01", "A02", "A03", "A04", "B01", "B02", "B03", "B04"];

/// BaSiC fitted across the plate (a plate-wide step), applied per well,
/// written as TIFF and OME-Zarr.
const BASIC_TOML: &str = r#"
name = "basic_shards"
[[steps]]
name = "flatfield"
func = { name = "basic_fit", args = { working_size = 32, camera_offset = 100 } }
scope = "plate"
variable_components = ["site", "z_index"]
sample = 40
seed = 0
[[steps]]
name = "corrected"
func = { name = "basic_correct", args = { camera_offset = 100 } }
variable_components = ["site"]
artifacts_from = { basic_profiles = "flatfield" }
materialize = ["tiff"]
[[steps]]
name = "max_z"
func = "max_projection"
variable_components = ["z_index"]
materialize = ["tiff", "zarr"]
"#;

fn ok(o: &Output, what: &str) {
    assert!(o.status.success(), "{what}: {}\n{}", o.status, stderr(o));
}

/// Runs `hcsflow run … --shard I/3` for every I at once and waits for all.
fn shards_side_by_side(plate: &Path, pipeline: &str, out: &Path) {
    let children: Vec<_> = (1..=3)
        .map(|i| {
            let shard = format!("{i}/3");
            let args = run_args(plate, pipeline, out, &["--workers", "1", "--shard", &shard]);
            hcsflow_cmd(&args).stdout(Stdio::null()).stderr(Stdio::piped()).spawn().unwrap()
        })
        .collect();
    for (i, child) in children.into_iter().enumerate() {
        let o = child.wait_with_output().unwrap();
        ok(&o, &format!("shard {}/3", i + 1));
    }
}

fn finalize(plate: &Path, pipeline: &str, out: &Path) -> Output {
    hcsflow(&run_args(plate, pipeline, out, &["--finalize"]))
}

/// The files of OUT a shard re-run must not touch, with sizes and mtimes.
fn results(out: &Path) -> Vec<(std::path::PathBuf, hcsflow_testkit::Entry)> {
    snapshot(out).into_iter().filter(|(p, _)| !describes_the_run(p)).collect()
}

#[test]
fn shards_in_sequence_and_side_by_side_then_finalize_give_one_runs_output() {
    let dir = tempfile::tempdir().unwrap();
    let (plate, reference) = plate_and_reference(dir.path(), &WELLS, "2");
    let pipeline = demo_toml();

    // In sequence; each shard writes its wells only and no plate-level output.
    let seq = dir.path().join("sequence");
    for (i, wells) in [(1, &WELLS[0..3]), (2, &WELLS[3..6]), (3, &WELLS[6..8])] {
        let shard = format!("{i}/3");
        let o = hcsflow(&run_args(&plate, &pipeline, &seq, &["--shard", &shard]));
        ok(&o, &shard);
        assert!(stderr(&o).contains(&format!("shard {shard}: {} well(s): {}", wells.len(), wells.join(", "))), "{}", stderr(&o));
        assert!(stderr(&o).contains(&format!("(shard {shard}: its wells only; `hcsflow run … --finalize` writes")), "{}", stderr(&o));
        let manifest: serde_json::Value =
            serde_json::from_slice(&std::fs::read(seq.join(format!(".hcsflow-shards/shard-{i}-of-3.json"))).unwrap()).unwrap();
        let recorded: Vec<&str> = manifest["wells"].as_object().unwrap().keys().map(String::as_str).collect();
        assert_eq!(recorded, wells, "shard {shard}'s manifest");
        assert!(!seq.join("run_manifest.json").exists() && !seq.join("summary.csv").exists(), "a shard wrote plate-level outputs");
    }
    let o = finalize(&plate, &pipeline, &seq);
    ok(&o, "finalize");
    assert!(stderr(&o).contains("8 of 8 well(s) complete"), "{}", stderr(&o));
    assert_same_outputs(&seq, &reference);
    assert_report_covers_every_well(&seq, &WELLS);

    // A finished shard re-run is a no-op: nothing of the results is rewritten.
    let before = results(&seq);
    let o = hcsflow(&run_args(&plate, &pipeline, &seq, &["--shard", "2/3"]));
    ok(&o, "shard 2/3 again");
    assert!(stderr(&o).contains("3 of 3 well(s) complete (3 skipped as already complete)"), "{}", stderr(&o));
    assert_eq!(results(&seq), before, "a finished shard re-run rewrote results");

    // Side by side into one folder.
    let side = dir.path().join("side_by_side");
    shards_side_by_side(&plate, &pipeline, &side);
    ok(&finalize(&plate, &pipeline, &side), "finalize");
    assert_same_outputs(&side, &reference);
    assert_report_covers_every_well(&side, &WELLS);
}

#[test]
fn a_finalize_with_a_shard_missing_fails_naming_it_and_the_shard_completes_the_run() {
    let dir = tempfile::tempdir().unwrap();
    let (plate, reference) = plate_and_reference(dir.path(), &WELLS, "2");
    let pipeline = demo_toml();

    let out = dir.path().join("out");
    for shard in ["1/3", "3/3"] {
        ok(&hcsflow(&run_args(&plate, &pipeline, &out, &["--shard", shard])), shard);
    }
    let o = finalize(&plate, &pipeline, &out);
    let e = stderr(&o);
    assert_eq!(o.status.code(), Some(1), "{e}");
    assert!(e.contains("1 shard(s) incomplete") && e.contains("shard 2/3 did not run (well(s) A04, B01, B02)"), "{e}");
    let manifest: serde_json::Value = serde_json::from_slice(&std::fs::read(out.join("run_manifest.json")).unwrap()).unwrap();
    assert_eq!(manifest["wells"]["B01"]["status"], "not started", "{manifest}");
    assert_eq!(manifest["wells"]["B03"]["status"], "complete", "{manifest}");

    // While a shard holds the folder, a finalize is refused, naming it.
    let mut running =
        hcsflow_cmd(&run_args(&plate, &pipeline, &out, &["--shard", "2/3", "--workers", "1"])).stderr(Stdio::null()).spawn().unwrap();
    let shard_lock = out.join(".hcsflow-shards/shard-2-of-3.lock");
    let held = loop {
        let locked = std::fs::File::open(&shard_lock).is_ok_and(|f| matches!(f.try_lock_shared(), Err(std::fs::TryLockError::WouldBlock)));
        if locked {
            break true;
        }
        if running.try_wait().unwrap().is_some() {
            break false;
        }
        std::thread::sleep(std::time::Duration::from_millis(2));
    };
    if held {
        let o = finalize(&plate, &pipeline, &out);
        let e = stderr(&o);
        assert_eq!(o.status.code(), Some(2), "{e}");
        assert!(e.contains("is in use by shard 2/3 (hcsflow run pid"), "{e}");
    } else {
        eprintln!("shard 2/3 ended before its lock was seen");
    }
    assert!(running.wait().unwrap().success());

    ok(&finalize(&plate, &pipeline, &out), "finalize after shard 2/3 ran");
    assert_same_outputs(&out, &reference);
    assert_report_covers_every_well(&out, &WELLS);
}

#[test]
fn plate_wide_steps_run_once_before_the_shards() {
    let dir = tempfile::tempdir().unwrap();
    let plate = dir.path().join("plate");
    synth(&plate, &WELLS[..6]);
    let pipeline = dir.path().join("basic.toml");
    std::fs::write(&pipeline, BASIC_TOML).unwrap();
    let pipeline = s(&pipeline);
    let reference = dir.path().join("reference");
    ok(&hcsflow(&run_args(&plate, pipeline, &reference, &["--workers", "2"])), "one run");

    // The plate job first (as `hcsflow slurm submit` does), then the shards re-read its results.
    let out = dir.path().join("planned");
    let o = hcsflow(&run_args(&plate, pipeline, &out, &["--plate-steps-only"]));
    ok(&o, "--plate-steps-only");
    assert!(!out.join("corrected").exists(), "the plate job ran wells");
    let fit: Vec<_> = snapshot(&out.join("flatfield")).into_iter().collect();
    assert!(fit.iter().any(|(p, _)| p.extension().is_some_and(|e| e == "tif")), "{fit:?}");
    shards_side_by_side(&plate, pipeline, &out);
    assert_eq!(snapshot(&out.join("flatfield")).into_iter().collect::<Vec<_>>(), fit, "a shard ran the plate-wide step again");
    ok(&finalize(&plate, pipeline, &out), "finalize");
    assert_same_outputs(&out, &reference);

    // Without the plate job: the first shard to get there runs it, the others wait and re-read it.
    let out = dir.path().join("unplanned");
    shards_side_by_side(&plate, pipeline, &out);
    ok(&finalize(&plate, pipeline, &out), "finalize");
    assert_same_outputs(&out, &reference);
}

#[test]
fn bad_shards_are_usage_errors() {
    let dir = tempfile::tempdir().unwrap();
    let (plate, out) = (dir.path().join("plate"), dir.path().join("out"));
    let pipeline = demo_toml();
    for (bad, says) in [
        ("0/3", "bad shard '0/3': I must be between 1 and N = 3"),
        ("4/3", "bad shard '4/3': I must be between 1 and N = 3"),
        ("3/0", "bad shard '3/0': the number of shards N must be at least 1"),
        ("x", "bad shard 'x': expected I/N, e.g. 2/8 (shard 2 of 8)"),
    ] {
        let o = hcsflow(&run_args(&plate, &pipeline, &out, &["--shard", bad]));
        assert_eq!(o.status.code(), Some(2), "{bad}: {}", stderr(&o));
        assert!(stderr(&o).contains(says), "{bad}: {}", stderr(&o));
        assert!(!out.exists(), "{bad}: something was written");
    }
    let o = hcsflow(&run_args(&plate, &pipeline, &out, &["--shard", "1/2", "--finalize"]));
    assert_eq!(o.status.code(), Some(2), "{}", stderr(&o));
}
