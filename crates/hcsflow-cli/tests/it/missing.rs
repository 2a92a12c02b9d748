//! `hcsflow run --missing`: the probe's reproduction of D1 (a synthetic plate
//! with one plane deleted, a min projection over z). By default the run is
//! refused (exit 2) before anything is written; `skip-well` runs the other
//! wells and records that one failed; `fill` uses zeros and says so
//! everywhere; `--dry-run` prints the policy.

use std::path::Path;

use hcsflow_synth::{generate, SynthConfig};
use serde_json::Value;

use crate::common;
use common::{hcsflow, stderr};

const MIN_Z: &str = "name = \"min_z\"\n[[steps]]\nname = \"min_z\"\nfunc = \"min_projection\"\nvariable_components = [\"z_index\"]\nmaterialize = [\"tiff\"]\n";

/// `hcsflow synth T/mp --wells A01,A02 --grid 1x1 --channels 1 --z 3 --size 64 --missing-planes 1 --seed 3`, and the pipeline.
fn setup(dir: &Path) -> (String, String) {
    let root = dir.join("mp");
    let cfg = SynthConfig {
        size: 64,
        z_planes: 3,
        grid_rows: 1,
        grid_cols: 1,
        channels: 1,
        seed: 3,
        missing_planes: 1,
        wells: vec!["A01".into(), "A02".into()],
        ..SynthConfig::default()
    };
    generate(&cfg, &root).expect("generate");
    let pipeline = dir.join("min_z.toml");
    std::fs::write(&pipeline, MIN_Z).expect("write");
    (root.to_string_lossy().into_owned(), pipeline.to_string_lossy().into_owned())
}

fn json(path: &Path) -> Value {
    serde_json::from_slice(&std::fs::read(path).unwrap_or_else(|e| panic!("{}: {e}", path.display()))).expect("json")
}

/// The well with the missing plane and that plane's z, from the refusal.
fn gap(err: &str) -> (String, String) {
    let line = err.lines().find(|l| l.trim_start().starts_with("well ")).unwrap_or_else(|| panic!("no missing image listed: {err}"));
    let mut words = line.split_whitespace();
    let well = words.nth(1).expect("well").to_string();
    let z = line.split(", ").find(|p| p.starts_with("z ")).expect("z").to_string();
    (well, z)
}

#[test]
fn a_missing_image_is_refused_by_default_and_nothing_is_written() {
    let dir = tempfile::tempdir().expect("tempdir");
    let (plate, pipeline) = setup(dir.path());
    let out = dir.path().join("mp_out");
    let report = dir.path().join("mp_report.json");
    let o = hcsflow(&["run", &plate, &pipeline, out.to_str().unwrap(), "--report", report.to_str().unwrap()]);
    let err = stderr(&o);
    assert_eq!(o.status.code(), Some(2), "{err}");
    for part in ["1 image(s) the plate declares are missing", "no image file found", "--missing skip-well", "--missing fill"] {
        assert!(err.contains(part), "'{part}' not in: {err}");
    }
    gap(&err);
    assert!(!out.exists() && !report.exists(), "a refused run writes nothing");
}

#[test]
fn skip_well_runs_the_other_well_and_records_the_reason() {
    let dir = tempfile::tempdir().expect("tempdir");
    let (plate, pipeline) = setup(dir.path());
    let (well, z) = gap(&stderr(&hcsflow(&["run", &plate, &pipeline, dir.path().join("x").to_str().unwrap()])));
    let out = dir.path().join("mp_out");
    let dry = hcsflow(&["run", &plate, &pipeline, out.to_str().unwrap(), "--missing", "skip-well", "--dry-run"]);
    let text = String::from_utf8_lossy(&dry.stdout);
    assert_eq!(dry.status.code(), Some(0), "{}", stderr(&dry));
    assert!(text.contains(&format!("missing images: 1 in 1 well(s) (--missing skip-well): well(s) {well} will not be run")), "{text}");
    let report = dir.path().join("report.json");
    let o = hcsflow(&["run", &plate, &pipeline, out.to_str().unwrap(), "--missing", "skip-well", "--report", report.to_str().unwrap()]);
    let err = stderr(&o);
    assert_eq!(o.status.code(), Some(1), "{err}");
    assert!(err.contains("1 of 2 well(s) complete") && err.contains("1 failed"), "{err}");
    let m = json(&out.join("run_manifest.json"));
    let record = &m["wells"][well.as_str()];
    assert_eq!(record["status"], "failed", "{m}");
    let reason = record["error"].as_str().expect("reason");
    assert!(reason.contains("1 missing image(s) (--missing skip-well)") && reason.contains(&z), "{reason}");
    let other = if well == "A01" { "A02" } else { "A01" };
    assert_eq!(m["wells"][other]["status"], "complete", "{m}");
    assert_eq!(json(&report)["missing_policy"], "skip-well");
}

#[test]
fn fill_lists_the_plane_in_the_manifest_the_report_and_the_summary() {
    let dir = tempfile::tempdir().expect("tempdir");
    let (plate, pipeline) = setup(dir.path());
    let (well, z) = gap(&stderr(&hcsflow(&["run", &plate, &pipeline, dir.path().join("x").to_str().unwrap()])));
    let out = dir.path().join("mp_out");
    let dry = hcsflow(&["run", &plate, &pipeline, out.to_str().unwrap(), "--missing", "fill", "--dry-run"]);
    let text = String::from_utf8_lossy(&dry.stdout);
    assert!(text.contains("missing images: 1 in 1 well(s) (--missing fill): each becomes a plane of zeros"), "{text}");
    let report = dir.path().join("mp_report.json");
    let o = hcsflow(&["run", &plate, &pipeline, out.to_str().unwrap(), "--missing", "fill", "--report", report.to_str().unwrap()]);
    let err = stderr(&o);
    assert_eq!(o.status.code(), Some(0), "{err}");
    assert!(err.contains("missing images: 1 filled with zeros in 1 well(s) (--missing fill)"), "{err}");
    assert!(
        err.contains(&format!(
            "note: well {well}, step 'min_z': missing image filled with zeros (--missing fill): well {well} site 1, channel 1, {z}"
        )),
        "{err}"
    );
    let m = json(&out.join("run_manifest.json"));
    let filled = m["wells"][well.as_str()]["filled"].as_array().expect("the manifest lists the filled plane");
    assert_eq!(filled.len(), 1, "{m}");
    assert_eq!(filled[0]["reason"], "no image file found");
    let r = json(&report);
    assert_eq!(r["missing_policy"], "fill");
    assert_eq!(r["filled"].as_array().map(Vec::len), Some(1), "{r}");
    assert_eq!(r["filled"][0]["well"], well.as_str());
}
