//! Images the plate declares but does not have (`--missing`): refused by
//! default before anything is read or written; `skip-well` runs the other
//! wells and records the well failed, naming the image (and `--resume` runs
//! it once the file is back); `fill` uses zeros and reports every filled plane.

use crate::common;

use std::path::{Path, PathBuf};

use hcsflow::builtin;
use hcsflow_core::Stack;
use hcsflow_pipeline::{Manifest, MissingPolicy, PipelineError, Plan, RunOptions, RunSummary};
use hcsflow_synth::SynthConfig;

use common::MIN_Z;

/// Wells A01, A02, A03 (1 site, 1 channel, 3 z, 64²); `missing` planes deleted.
fn plate(dir: &Path, name: &str, missing: u32) -> PathBuf {
    let root = dir.join(name);
    let cfg = SynthConfig {
        size: 64,
        z_planes: 3,
        grid_rows: 1,
        grid_cols: 1,
        channels: 1,
        seed: 3,
        missing_planes: missing,
        wells: ["A01", "A02", "A03"].iter().map(|w| w.to_string()).collect(),
        ..SynthConfig::default()
    };
    common::synth_plate(&root, &cfg)
}

fn plan(root: &Path, out: &Path, missing: MissingPolicy) -> Result<Plan, PipelineError> {
    common::compile_with(&builtin(), &common::open(root), MIN_Z, &common::cpu_config(out, missing))
}

fn run(plan: &Plan, resume: bool) -> RunSummary {
    let options = RunOptions { workers: 2, resume, ..RunOptions::default() };
    common::run_with(&builtin(), plan, &options).expect("execute")
}

/// Files under `root`, relative, sorted.
fn files(root: &Path) -> Vec<PathBuf> {
    let mut out = Vec::new();
    let mut stack = vec![root.to_path_buf()];
    while let Some(d) = stack.pop() {
        for e in std::fs::read_dir(&d).expect("read_dir").flatten() {
            if e.file_type().expect("type").is_dir() {
                stack.push(e.path());
            } else {
                out.push(e.path().strip_prefix(root).expect("prefix").to_path_buf());
            }
        }
    }
    out.sort();
    out
}

#[test]
fn a_missing_image_is_refused_by_default_before_anything_is_written() {
    let dir = tempfile::tempdir().expect("tempdir");
    let root = plate(dir.path(), "plate", 1);
    let out = dir.path().join("out");
    let e = plan(&root, &out, MissingPolicy::default()).expect_err("a missing image must refuse the run");
    assert!(e.is_usage(), "a usage error (exit 2): {e}");
    let text = e.to_string();
    for part in [
        "1 image(s) the plate declares are missing, in 1 well(s)",
        "site 1, channel 1, z ",
        "no image file found",
        "--missing skip-well",
        "--missing fill",
    ] {
        assert!(text.contains(part), "'{part}' not in: {text}");
    }
    assert!(!out.exists(), "nothing may be written");
}

#[test]
fn skip_well_runs_the_other_wells_and_resume_runs_it_once_the_file_is_back() {
    let dir = tempfile::tempdir().expect("tempdir");
    let root = plate(dir.path(), "plate", 1);
    let out = dir.path().join("out");
    let p = plan(&root, &out, MissingPolicy::SkipWell).expect("compile");
    assert_eq!(p.missing.len(), 1);
    let gap = p.missing[0].clone();
    let summary = run(&p, false);
    assert_eq!(summary.failed.len(), 1, "{:?}", summary.failed);
    let failure = &summary.failed[0];
    assert_eq!(failure.well, gap.well);
    let z = format!("z {}", gap.key[2]);
    assert!(failure.error.contains("1 missing image(s) (--missing skip-well)") && failure.error.contains(&z), "{}", failure.error);
    assert_eq!(summary.completed.len(), 2, "the other wells run: {:?}", summary.completed);
    let manifest = Manifest::read(&out).expect("read").expect("manifest");
    let record = &manifest.wells[&gap.well];
    assert_eq!(record.status, hcsflow_pipeline::WellStatus::Failed);
    assert!(record.error.as_deref().is_some_and(|e| e.contains(&z)), "{record:?}");
    assert!(record.outputs.is_empty());
    assert!(summary.report.failures.iter().any(|f| f.well == gap.well && f.error.contains("missing image")));

    // The file comes back (from the same plate without the gap): --resume runs that well only.
    let full = plate(dir.path(), "full", 0);
    let have = files(&root);
    let restored: Vec<PathBuf> = files(&full).into_iter().filter(|f| !have.contains(f)).collect();
    assert_eq!(restored.len(), 1, "{restored:?}");
    std::fs::copy(full.join(&restored[0]), root.join(&restored[0])).expect("restore");
    let p = plan(&root, &out, MissingPolicy::default()).expect("no image is missing now");
    let summary = run(&p, true);
    assert_eq!(summary.completed, vec![gap.well.clone()]);
    assert_eq!(summary.skipped.len(), 2);
    assert!(summary.failed.is_empty());
}

#[test]
fn fill_reports_every_filled_plane() {
    let dir = tempfile::tempdir().expect("tempdir");
    let root = plate(dir.path(), "plate", 1);
    let out = dir.path().join("out");
    let p = plan(&root, &out, MissingPolicy::Fill).expect("compile");
    let gap = p.missing[0].clone();
    let summary = run(&p, false);
    assert!(summary.failed.is_empty(), "{:?}", summary.failed);
    assert_eq!(summary.completed.len(), 3);
    assert_eq!(summary.filled, vec![gap.clone()]);
    // Manifest, per well.
    let manifest = Manifest::read(&out).expect("read").expect("manifest");
    assert_eq!(manifest.wells[&gap.well].filled, vec![gap.clone()]);
    assert!(manifest.wells.iter().filter(|(w, _)| **w != gap.well).all(|(_, r)| r.filled.is_empty()));
    // Report: policy, the list, the well's notes.
    let report = serde_json::to_value(&summary.report).expect("json");
    assert_eq!(report["missing_policy"], "fill");
    assert_eq!(report["filled"].as_array().map(Vec::len), Some(1));
    assert_eq!(report["filled"][0]["well"], gap.well.as_str());
    let well = report["wells"].as_array().expect("wells").iter().find(|w| w["well"] == gap.well.as_str()).expect("the well").clone();
    let notes = well["notes"].to_string();
    assert!(notes.contains("missing image filled with zeros (--missing fill)") && notes.contains(&format!("z {}", gap.key[2])), "{notes}");
    // What fill means: the min projection of that well is zeros (as before, but now said).
    let tif = manifest.wells[&gap.well].outputs[0].path.clone();
    match hcsflow_tiff::read_stack(&out.join(tif)).expect("read") {
        Stack::U16(a) => assert!(a.pixels().iter().all(|&v| v == 0)),
        other => panic!("u16 expected, got {}", other.dtype()),
    }
}

#[test]
fn policy_names_round_trip() {
    for p in [MissingPolicy::Error, MissingPolicy::SkipWell, MissingPolicy::Fill] {
        assert_eq!(p.name().parse::<MissingPolicy>(), Ok(p));
    }
    let e = "zeros".parse::<MissingPolicy>().unwrap_err();
    assert!(e.contains("'zeros'") && e.contains("error, skip-well or fill"), "{e}");
}
