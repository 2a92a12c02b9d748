//! Running `hcsflow run` on small synthetic plates and comparing output
//! folders: what the fault and shard tests share.

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::process::Command;

use hcsflow_synth::{generate, SynthConfig};
use hcsflow_testkit::snapshot;
use serde_json::Value;

/// A synthetic ImageXpress plate: 3×3 sites, 2 channels, 2 z planes, 64² tiles.
pub fn synth(root: &Path, wells: &[&str]) {
    let cfg = SynthConfig { size: 64, z_planes: 2, wells: wells.iter().map(|w| w.to_string()).collect(), ..SynthConfig::default() };
    generate(&cfg, root).expect("generate");
}

/// A synthetic plate of `wells` in `dir/plate` ([`synth`]) and, in
/// `dir/reference`, the demo pipeline's output of one uninterrupted run of it
/// with `workers` workers: what sharded, resumed and cluster runs are compared with.
pub fn plate_and_reference(dir: &Path, wells: &[&str], workers: &str) -> (PathBuf, PathBuf) {
    let (plate, reference) = (dir.join("plate"), dir.join("reference"));
    synth(&plate, wells);
    let o = hcsflow_cmd(&run_args(&plate, &demo_toml(), &reference, &["--workers", workers])).output().expect("run hcsflow");
    assert!(o.status.success(), "the reference run: {}", String::from_utf8_lossy(&o.stderr));
    (plate, reference)
}

/// The repository's demo pipeline: TIFF, OME-Zarr and CSV artifacts.
pub fn demo_toml() -> String {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("../../examples/demo.toml").to_string_lossy().into_owned()
}

/// The `hcsflow` binary of this build, without the software-GPU allowance
/// and `RUST_LOG` of the environment.
pub fn hcsflow_cmd(args: &[&str]) -> Command {
    let mut c = Command::new(env!("CARGO_BIN_EXE_hcsflow"));
    c.args(args).env_remove("HCSFLOW_ALLOW_SOFTWARE_GPU").env_remove("RUST_LOG");
    c
}

pub fn s(p: &Path) -> &str {
    p.to_str().unwrap()
}

/// `run PLATE PIPELINE OUT --device cpu` plus `extra`.
pub fn run_args<'a>(plate: &'a Path, pipeline: &'a str, out: &'a Path, extra: &[&'a str]) -> Vec<&'a str> {
    let mut v = vec!["run", s(plate), pipeline, s(out), "--device", "cpu"];
    v.extend_from_slice(extra);
    v
}

/// Wells recorded complete in `OUT/run_manifest.json` (0 if absent or mid-rename).
pub fn complete_wells(out: &Path) -> usize {
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
/// any two runs: the lock (its last holder's pid and start time), the run
/// report with its HTML page (the output path, peak RSS, throughput, which
/// wells this run skipped) and the shards' own folder (their manifests,
/// locks and timings; a run in one process has none).
/// [`assert_report_covers_every_well`] checks the report instead. Everything
/// else must match, hidden temporaries included: a resumed run leaves none (D7).
pub fn describes_the_run(p: &Path) -> bool {
    use hcsflow_pipeline::{LOCK_NAME, REPORT_HTML_NAME, RUN_REPORT_NAME, SHARDS_DIR};
    p.file_name().is_some_and(|n| n == LOCK_NAME || n == RUN_REPORT_NAME || n == REPORT_HTML_NAME)
        || p.components().any(|c| c.as_os_str() == SHARDS_DIR)
}

/// The run report of the run that finished `out` lists every well of the
/// plate once, each complete or skipped (as already complete), and no failure.
pub fn assert_report_covers_every_well(out: &Path, wells: &[&str]) {
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
pub fn tree(root: &Path) -> BTreeMap<PathBuf, Option<Vec<u8>>> {
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
pub fn assert_same_outputs(got: &Path, want: &Path) {
    let (g, w) = (tree(got), tree(want));
    let only = |a: &BTreeMap<PathBuf, _>, b: &BTreeMap<PathBuf, _>| a.keys().filter(|k| !b.contains_key(*k)).cloned().collect::<Vec<_>>();
    assert!(only(&g, &w).is_empty() && only(&w, &g).is_empty(), "extra: {:?}\nmissing: {:?}", only(&g, &w), only(&w, &g));
    let differ: Vec<&PathBuf> = g.iter().filter(|(k, v)| w[*k] != **v).map(|(k, _)| k).collect();
    assert!(differ.is_empty(), "{} file(s) differ from the uninterrupted run: {differ:?}", differ.len());
    let count = |ext: &str| g.keys().filter(|p| p.extension().is_some_and(|e| e == ext)).count();
    assert!(count("tif") > 0 && count("csv") > 0, "nothing to compare under {}", got.display());
}
