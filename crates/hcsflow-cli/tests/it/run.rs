//! `hcsflow run` and `hcsflow demo` end to end: dry run, exit codes, a failing
//! well, resume after a killed run, report, and the input plate left untouched.

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

use hcsflow_synth::{generate, SynthConfig};
use hcsflow_testkit::snapshot;

use crate::common;
use common::{hcsflow, stderr};

fn synth(root: &Path, wells: &[&str], size: u32) {
    let cfg = SynthConfig { size, z_planes: 3, wells: wells.iter().map(|w| w.to_string()).collect(), ..SynthConfig::default() };
    generate(&cfg, root).expect("generate");
}

/// Relative path → bytes of every output image under `out/<step>`.
fn images(out: &Path, step: &str) -> BTreeMap<PathBuf, Vec<u8>> {
    snapshot(&out.join(step))
        .into_keys()
        .filter(|p| p.is_file() && !p.file_name().unwrap().to_string_lossy().starts_with('.'))
        .filter(|p| p.extension().is_some_and(|e| e == "tif" || e == "tiff"))
        .map(|p| (p.strip_prefix(out).unwrap().to_path_buf(), std::fs::read(&p).unwrap()))
        .collect()
}

fn pipeline_file(dir: &Path, name: &str, text: &str) -> String {
    let p = dir.join(name);
    std::fs::write(&p, text).unwrap();
    p.to_string_lossy().into_owned()
}

const MAX_Z: &str =
    "name = \"t\"\n[[steps]]\nname = \"max_z\"\nfunc = \"max_projection\"\nvariable_components = [\"z_index\"]\nmaterialize = [\"tiff\"]\n";

#[test]
fn dry_run_prints_chain_routes_device_and_stacks_and_writes_nothing() {
    let dir = tempfile::tempdir().unwrap();
    let plate = dir.path().join("plate");
    synth(&plate, &["A01", "B02"], 64);
    let p = pipeline_file(dir.path(), "p.toml", MAX_Z);
    let out = dir.path().join("out");
    let o = hcsflow(&["run", plate.to_str().unwrap(), &p, out.to_str().unwrap(), "--dry-run", "--device", "cpu"]);
    assert!(o.status.success(), "{}", stderr(&o));
    let text = String::from_utf8_lossy(&o.stdout);
    assert!(text.contains("step 1 'max_z'"), "{text}");
    assert!(text.contains("chain: max_projection (volumetric_to_slice, host → host on cpu)"), "{text}");
    assert!(text.contains("route into max_projection: host → host (identity, none)"), "{text}");
    assert!(text.contains("device: cpu (requested: --device cpu)"), "{text}");
    assert!(text.contains("A01 18×[3], B02 18×[3]"), "{text}");
    assert!(!out.exists(), "a dry run writes nothing");
}

/// The plan states a well's estimated peak; a `--max-memory` below it is
/// warned about (the well runs alone and may go over), one above it is not.
#[test]
fn a_budget_below_one_well_is_warned_about_with_the_sizes() {
    let dir = tempfile::tempdir().unwrap();
    let plate = dir.path().join("plate");
    synth(&plate, &["A01", "B02"], 64);
    let p = pipeline_file(dir.path(), "p.toml", MAX_Z);
    let out = dir.path().join("out");
    let dry = |budget: &str| {
        let o =
            hcsflow(&["run", plate.to_str().unwrap(), &p, out.to_str().unwrap(), "--dry-run", "--device", "cpu", "--max-memory", budget]);
        assert!(o.status.success(), "{}", stderr(&o));
        (String::from_utf8_lossy(&o.stdout).into_owned(), stderr(&o))
    };
    let (plan, quiet) = dry("10G");
    let line = plan.lines().find(|l| l.starts_with("memory: a well needs about ")).expect("a memory line");
    let need = line.trim_start_matches("memory: a well needs about ").split(" at its peak").next().unwrap().to_string();
    assert!(need.ends_with("KiB") || need.ends_with("MiB"), "{line}");
    assert!(!quiet.contains("warning"), "{quiet}");
    let (_, warned) = dry("1K");
    assert!(
        warned.contains("warning: 2 of 2 well(s) are estimated to need more than --max-memory 1.0 KiB at their peak")
            && warned.contains(&format!("needs {need}"))
            && warned.contains(&format!("a budget of at least {need} holds one well")),
        "{warned}"
    );
    assert!(!out.exists(), "a dry run writes nothing");
}

#[test]
fn compile_errors_exit_2_with_the_step_name_before_reading_pixels() {
    let dir = tempfile::tempdir().unwrap();
    let plate = dir.path().join("plate");
    synth(&plate, &["A01"], 64);
    let p = pipeline_file(dir.path(), "p.toml", "[[steps]]\nname = \"project\"\nfunc = \"max_projektion\"\n");
    let out = dir.path().join("out");
    let o = hcsflow(&["run", plate.to_str().unwrap(), &p, out.to_str().unwrap(), "--device", "cpu"]);
    assert_eq!(o.status.code(), Some(2), "{}", stderr(&o));
    let e = stderr(&o);
    assert!(e.contains("step 'project'") && e.contains("did you mean 'max_projection'"), "{e}");
    assert!(!out.exists());
    // A bad TOML file is a usage error too.
    let p = pipeline_file(dir.path(), "bad.toml", "[[steps]\n");
    let o = hcsflow(&["run", plate.to_str().unwrap(), &p, out.to_str().unwrap()]);
    assert_eq!(o.status.code(), Some(2), "{}", stderr(&o));
    // Output inside the plate: refused.
    let p = pipeline_file(dir.path(), "ok.toml", MAX_Z);
    let o = hcsflow(&["run", plate.to_str().unwrap(), &p, plate.join("out").to_str().unwrap(), "--device", "cpu"]);
    assert_eq!(o.status.code(), Some(2), "{}", stderr(&o));
    assert!(stderr(&o).contains("inside the input plate"));
}

#[test]
fn gpu_without_a_usable_gpu_exits_3() {
    let dir = tempfile::tempdir().unwrap();
    let plate = dir.path().join("plate");
    synth(&plate, &["A01"], 64);
    let p = pipeline_file(dir.path(), "p.toml", MAX_Z);
    let usable = hcsflow_gpu::discover_adapters().iter().any(|a| !a.is_software());
    if usable {
        eprintln!("skipped: this machine has a hardware GPU");
        return;
    }
    let o = hcsflow(&["run", plate.to_str().unwrap(), &p, dir.path().join("out").to_str().unwrap(), "--device", "gpu"]);
    assert_eq!(o.status.code(), Some(3), "{}", stderr(&o));
    assert!(stderr(&o).contains("--device gpu"), "{}", stderr(&o));
}

#[test]
fn a_corrupt_tiff_fails_its_well_only_exit_1_and_resume_finishes() {
    let dir = tempfile::tempdir().unwrap();
    let plate = dir.path().join("plate");
    synth(&plate, &["A01", "A02", "B01"], 64);
    let bad = plate.join("TimePoint_1/ZStep_1/Synth_Plate_1_B01_s2_w2.tif");
    let good = std::fs::read(&bad).unwrap();
    std::fs::write(&bad, b"not a tiff at all").unwrap();
    let before = snapshot(&plate);
    let p = pipeline_file(dir.path(), "p.toml", MAX_Z);
    let out = dir.path().join("out");
    let report = dir.path().join("report.json");
    let o = hcsflow(&["run", plate.to_str().unwrap(), &p, out.to_str().unwrap(), "--device", "cpu", "--report", report.to_str().unwrap()]);
    assert_eq!(o.status.code(), Some(1), "{}", stderr(&o));
    let e = stderr(&o);
    assert!(e.contains("1 well(s) failed") && e.contains("B01:") && e.contains("Synth_Plate_1_B01_s2_w2.tif"), "{e}");
    assert_eq!(snapshot(&plate), before, "the input plate changed");
    assert_eq!(images(&out, "max_z").len(), 36, "A01 and A02 are complete");
    let r: serde_json::Value = serde_json::from_slice(&std::fs::read(&report).unwrap()).unwrap();
    assert_eq!(r["failures"][0]["well"], "B01");
    assert_eq!(r["device"], "cpu");
    assert!(r["peak_rss_bytes"].as_u64().unwrap() > 0);
    assert!(r["steps"][0]["chains"][0]["routes"][0]["kind"] == "identity");
    assert!(r["wells"].as_array().unwrap().iter().any(|w| w["status"] == "complete" && w["steps"][0]["compute"].is_number()));

    std::fs::write(&bad, good).unwrap();
    let o = hcsflow(&["run", plate.to_str().unwrap(), &p, out.to_str().unwrap(), "--device", "cpu", "--resume"]);
    assert!(o.status.success(), "{}", stderr(&o));
    assert!(stderr(&o).contains("A01: complete in a previous run, skipped"), "{}", stderr(&o));
    assert_eq!(images(&out, "max_z").len(), 54);
}

#[test]
fn a_plate_image_with_two_pages_fails_its_well_naming_the_file() {
    // The z planes of a field are read as one stack; a file with more than one
    // page must still be named, not taken as two planes.
    let dir = tempfile::tempdir().unwrap();
    let plate = dir.path().join("plate");
    synth(&plate, &["A01", "B01"], 64);
    let bad = plate.join("TimePoint_1/ZStep_2/Synth_Plate_1_B01_s1_w1.tif");
    let one = hcsflow_tiff::read_stack(&bad).unwrap();
    let two = hcsflow_core::Stack::concat(&[one.clone(), one]).unwrap();
    hcsflow_tiff::write_stack(&bad, &two, &Default::default()).unwrap();
    let p = pipeline_file(dir.path(), "p.toml", MAX_Z);
    let out = dir.path().join("out");
    let o = hcsflow(&["run", plate.to_str().unwrap(), &p, out.to_str().unwrap(), "--device", "cpu"]);
    assert_eq!(o.status.code(), Some(1), "{}", stderr(&o));
    let e = stderr(&o);
    assert!(e.contains("B01:") && e.contains("Synth_Plate_1_B01_s1_w1.tif: 2 pages; plate images have one plane each"), "{e}");
    assert_eq!(images(&out, "max_z").len(), 18, "A01 is complete");
}

#[test]
fn resume_after_a_killed_run_equals_an_uninterrupted_run() {
    let dir = tempfile::tempdir().unwrap();
    let plate = dir.path().join("plate");
    let wells = ["A01", "A02", "A03", "A04", "A05", "A06", "B01", "B02"];
    synth(&plate, &wells, 128);
    let before = snapshot(&plate);
    let p = pipeline_file(dir.path(), "p.toml", MAX_Z);
    let reference = dir.path().join("reference");
    let o = hcsflow(&["run", plate.to_str().unwrap(), &p, reference.to_str().unwrap(), "--device", "cpu", "--workers", "1"]);
    assert!(o.status.success(), "{}", stderr(&o));

    // Kill the run once the manifest records at least one complete well.
    let out = dir.path().join("out");
    let mut child = Command::new(env!("CARGO_BIN_EXE_hcsflow"))
        .args(["run", plate.to_str().unwrap(), &p, out.to_str().unwrap(), "--device", "cpu", "--workers", "1"])
        .stderr(Stdio::null())
        .spawn()
        .unwrap();
    let manifest = out.join("run_manifest.json");
    let start = Instant::now();
    let mut killed_early = false;
    while start.elapsed() < Duration::from_secs(60) {
        if let Ok(text) = std::fs::read_to_string(&manifest) {
            if text.contains("\"complete\"") {
                killed_early = child.try_wait().unwrap().is_none();
                let _ = child.kill();
                break;
            }
        }
        if child.try_wait().unwrap().is_some() {
            break;
        }
        std::thread::sleep(Duration::from_millis(2));
    }
    let _ = child.wait();
    let m: serde_json::Value = serde_json::from_slice(&std::fs::read(&manifest).unwrap()).unwrap();
    let done = m["wells"].as_object().unwrap().len();
    eprintln!("killed early: {killed_early}; wells recorded before the kill: {done}");

    let o = hcsflow(&["run", plate.to_str().unwrap(), &p, out.to_str().unwrap(), "--device", "cpu", "--resume"]);
    assert!(o.status.success(), "{}", stderr(&o));
    assert!(images(&out, "max_z") == images(&reference, "max_z"), "resumed output differs");
    assert_eq!(images(&out, "max_z").len(), wells.len() * 18);
    assert_eq!(std::fs::read(out.join("summary.csv")).unwrap(), std::fs::read(reference.join("summary.csv")).unwrap());
    assert_eq!(snapshot(&plate), before, "the input plate changed");
}

#[test]
fn demo_runs_end_to_end() {
    let dir = tempfile::tempdir().unwrap();
    let out = dir.path().join("demo");
    let o = hcsflow(&["demo", out.to_str().unwrap(), "--size", "64", "--wells", "2", "--device", "cpu"]);
    assert!(o.status.success(), "{}", stderr(&o));
    let text = String::from_utf8_lossy(&o.stdout);
    assert!(text.contains("max_z:"), "{text}");
    assert_eq!(images(&out.join("results"), "max_z").len(), 2 * 9, "one composite per site");
    assert!(out.join("results/summary.csv").exists());
    assert!(out.join("results/Synth_Plate_1.ome.zarr/zarr.json").exists(), "{text}");
    assert!(text.contains("OME-Zarr:"), "{text}");
    assert_eq!(images(&out.join("results"), "channels_max_z").len(), 2 * 18);
    // Positions on the composites → one mosaic per channel → nuclei counted on DAPI.
    assert_eq!(images(&out.join("results"), "mosaic").len(), 2 * 2);
    assert_eq!(images(&out.join("results"), "count").len(), 2, "DAPI label images only");
    let lines = |p: &str| std::fs::read_to_string(out.join("results").join(p)).unwrap().lines().count();
    assert_eq!(lines("positions/positions.csv"), 1 + 2 * 9);
    assert_eq!(lines("count/counts.csv"), 1 + 2);
    assert!(text.contains("table:") && text.contains("counts.csv"), "{text}");
    // Running it again replaces its own plate and results.
    let o = hcsflow(&["demo", out.to_str().unwrap(), "--size", "64", "--wells", "2", "--device", "cpu"]);
    assert!(o.status.success(), "{}", stderr(&o));
}

/// The OME-Zarr plate at `root` is NGFF 0.4 on Zarr v2, with no Zarr v3 metadata.
fn assert_ngff_0_4_on_zarr_v2(root: &Path) {
    let zgroup: serde_json::Value = serde_json::from_slice(&std::fs::read(root.join(".zgroup")).unwrap()).unwrap();
    assert_eq!(zgroup["zarr_format"], 2);
    let attrs: serde_json::Value = serde_json::from_slice(&std::fs::read(root.join(".zattrs")).unwrap()).unwrap();
    assert_eq!(attrs["plate"]["version"], "0.4", "{attrs}");
    assert!(!root.join("zarr.json").exists(), "no Zarr v3 metadata in a v2 plate");
}

#[test]
fn demo_takes_zarr_format_and_trace_like_run() {
    let dir = tempfile::tempdir().unwrap();
    let out = dir.path().join("demo");
    let trace = dir.path().join("trace.json");
    let o = hcsflow(
        &["demo", out.to_str().unwrap(), "--size", "48", "--wells", "1", "--z", "2", "--device", "cpu"]
            .into_iter()
            .chain(["--zarr-format", "0.4", "--trace", trace.to_str().unwrap()])
            .collect::<Vec<_>>(),
    );
    assert!(o.status.success(), "{}", stderr(&o));
    // --zarr-format 0.4: the demo's OME-Zarr plate is NGFF 0.4 on Zarr v2.
    let root = out.join("results/Synth_Plate_1.ome.zarr");
    assert_ngff_0_4_on_zarr_v2(&root);
    // --trace: a Chrome trace with a span per well and one per demo step of that well.
    let events: Vec<serde_json::Value> = serde_json::from_slice(&std::fs::read(&trace).unwrap()).expect("the trace is a JSON array");
    let begun = |name: &str| events.iter().filter(|e| e["ph"] == "B" && e["name"] == name).collect::<Vec<_>>();
    let wells: Vec<&str> = begun("well").iter().map(|e| e["args"]["well"].as_str().unwrap()).collect();
    assert_eq!(wells, ["A01"]);
    let steps: std::collections::BTreeSet<&str> = begun("step").iter().map(|e| e["args"]["step"].as_str().unwrap()).collect();
    let demo: std::collections::BTreeSet<&str> =
        ["normalise", "composite", "max_z", "positions", "channels_normalise", "channels_max_z", "mosaic", "count"].into();
    assert_eq!(steps, demo);
    // The same validation as run: an unknown version is a usage error before anything is written.
    let bad = dir.path().join("bad");
    let o = hcsflow(&["demo", bad.to_str().unwrap(), "--zarr-format", "0.3"]);
    assert_eq!(o.status.code(), Some(2), "{}", stderr(&o));
    assert!(stderr(&o).contains("'0.3'") && stderr(&o).contains("0.4"), "{}", stderr(&o));
    assert!(!bad.exists());
}

#[test]
fn zarr_format_0_4_writes_ngff_0_4_on_zarr_v2_and_a_bad_version_exits_2() {
    let dir = tempfile::tempdir().unwrap();
    let plate = dir.path().join("plate");
    synth(&plate, &["A01"], 64);
    let p = pipeline_file(dir.path(), "p.toml", &MAX_Z.replace("[\"tiff\"]", "[\"zarr\"]"));
    let out = dir.path().join("out");
    let o = hcsflow(&["run", plate.to_str().unwrap(), &p, out.to_str().unwrap(), "--device", "cpu", "--zarr-format", "0.4"]);
    assert!(o.status.success(), "{}", stderr(&o));
    let root = out.join("Synth_Plate_1.ome.zarr");
    assert_ngff_0_4_on_zarr_v2(&root);
    // The default is NGFF 0.5 on Zarr v3.
    let v3 = dir.path().join("v3");
    let o = hcsflow(&["run", plate.to_str().unwrap(), &p, v3.to_str().unwrap(), "--device", "cpu"]);
    assert!(o.status.success(), "{}", stderr(&o));
    let z: serde_json::Value = serde_json::from_slice(&std::fs::read(v3.join("Synth_Plate_1.ome.zarr/zarr.json")).unwrap()).unwrap();
    assert_eq!((z["zarr_format"].as_u64(), z["attributes"]["ome"]["version"].as_str()), (Some(3), Some("0.5")), "{z}");
    // An unknown version is a usage error, before anything is written.
    let bad = dir.path().join("bad");
    let o = hcsflow(&["run", plate.to_str().unwrap(), &p, bad.to_str().unwrap(), "--zarr-format", "0.3"]);
    assert_eq!(o.status.code(), Some(2), "{}", stderr(&o));
    assert!(stderr(&o).contains("'0.3'") && stderr(&o).contains("0.4"), "{}", stderr(&o));
    assert!(!bad.exists());
}
