//! The demo pipeline's OME-Zarr output, read by independent readers.
//!
//! `examples/demo.toml` runs on a small synthetic plate (3 wells × 2×2 fields
//! × 2 channels × 3 z, 50² so that pyramid levels have odd edges) with every
//! step materialised as TIFF and OME-Zarr, the mosaic steps included (one
//! field per well holding the mosaic, padded to the plate's largest). For every step,
//! `tests/oracle/pipeline_zarr_oracle.py` reads the plate with zarr-python
//! and ome-zarr-py and validates it with ome-zarr-models, and checks shape,
//! dtype, axes (names, types, units), scale (the synthetic plate's pixel
//! size), channel names, plate rows/columns/wells, and that every pixel of
//! every pyramid level equals the step's TIFF output (read with tifffile).
//! Both NGFF 0.5 (Zarr v3) and 0.4 (Zarr v2).
//!
//! The `count` step's output is a label image (count_cells): the pipeline
//! writes it as OME-NGFF labels named `count` under the fields of the nearest
//! earlier image plate (the mosaic's), and the oracle checks with ome-zarr-py
//! (napari's reader) that every field lists them, with the TIFFs' values.
//!
//! Needs python3 with the packages of `.ci/requirements-oracles.txt`; a missing
//! one follows `hcsflow_testkit::oracle`'s policy (a failure with the pip
//! command, always under `CI=true`; outside CI `HCSFLOW_SKIP_ORACLES=1` skips).

use std::path::{Path, PathBuf};
use std::process::Command;

use hcsflow::builtin;
use hcsflow_core::{ConversionPolicy, Device};
use hcsflow_pipeline::{compile, execute, CompileConfig, Materialize, NgffVersion, PipelineSpec, RunOptions};
use hcsflow_synth::{generate, SynthConfig};
use serde_json::json;

const PIP: &str = "pip install -r .ci/requirements-oracles.txt  (zarr>=3 ome-zarr ome-zarr-models tifffile numpy)";

/// `true` if the oracle can run (see `hcsflow_testkit::oracle::require`).
fn oracle_available() -> bool {
    let modules = ["zarr", "ome_zarr", "ome_zarr_models", "tifffile", "numpy"];
    hcsflow_testkit::oracle::require_where(&modules, "int(zarr.__version__.split('.')[0]) >= 3", PIP).is_some()
}

fn repo() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("../..")
}

const WELLS: [&str; 3] = ["A01", "A02", "B01"];
const CHANNELS: [&str; 2] = ["Hoechst", "Phalloidin"];
const SIZE: usize = 50;
const PIXEL_UM: f64 = 0.65;

/// Demo steps whose planes are whole-well mosaics, not fields.
const MOSAIC_STEPS: [&str; 2] = ["mosaic", "count"];

/// Demo steps whose output is a label image, and the image step whose plate holds it.
const LABEL_STEPS: [(&str, &str); 1] = [("count", "mosaic")];

/// Per demo step: channel names, z planes and fields per well of its output,
/// as the pipeline defines them (composite collapses the channels; max-Z
/// collapses z; assemble collapses the sites into one mosaic; count keeps the
/// channel-1 mosaic's labels only).
fn expected_layout(step: &str) -> (Vec<&'static str>, usize, usize) {
    match step {
        "normalise" => (CHANNELS.to_vec(), 3, 4),
        "composite" => (vec!["composite"], 3, 4),
        "max_z" | "positions" => (vec!["composite"], 1, 4),
        "channels_normalise" => (CHANNELS.to_vec(), 3, 4),
        "channels_max_z" => (CHANNELS.to_vec(), 1, 4),
        "mosaic" => (CHANNELS.to_vec(), 1, 1),
        "count" => (vec![CHANNELS[0]], 1, 1),
        other => panic!("examples/demo.toml has a new step '{other}': add its expected layout here"),
    }
}

fn run_demo_and_check(version: NgffVersion) {
    let dir = tempfile::tempdir().unwrap();
    let plate_dir = dir.path().join("plate");
    let cfg = SynthConfig {
        wells: WELLS.iter().map(|w| w.to_string()).collect(),
        grid_rows: 2,
        grid_cols: 2,
        channels: 2,
        channel_names: CHANNELS.iter().map(|c| c.to_string()).collect(),
        z_planes: 3,
        size: SIZE as u32,
        pixel_size_um: PIXEL_UM,
        // Stage positions are the jittered truth, so the wells' mosaics differ
        // in size and the mosaic plates need padding.
        stage_reports_truth: true,
        ..SynthConfig::default()
    };
    generate(&cfg, &plate_dir).expect("generate the plate");
    let plate = hcsflow_plate::open_plate(&plate_dir, None).expect("open the plate");

    let mut spec = PipelineSpec::read(&repo().join("examples/demo.toml")).expect("examples/demo.toml");
    for step in spec.steps.iter_mut() {
        step.materialize = vec![Materialize::Tiff, Materialize::Zarr];
    }
    let out = dir.path().join("out");
    let (registry, conversions) = builtin();
    let config = CompileConfig {
        device: Device::Cpu,
        device_reason: "test".into(),
        policy: ConversionPolicy::default(),
        out: out.clone(),
        missing: Default::default(),
        require_gpu: false,
    };
    let plan = compile(&plate, &spec, &registry, &conversions, &config).expect("compile the demo pipeline");
    let options = RunOptions { workers: 2, zarr_format: version, ..RunOptions::default() };
    let summary = execute(&plan, &registry, &conversions, &options, &|_| {}).expect("execute");
    assert!(summary.failed.is_empty(), "{:?}", summary.failed);
    assert_eq!(summary.zarr_plates.len(), plan.steps.len() - LABEL_STEPS.len(), "one OME-Zarr plate per image step");

    for step in &plan.steps {
        let (channels, z, fields) = expected_layout(&step.name);
        let mosaic = MOSAIC_STEPS.contains(&step.name.as_str());
        if mosaic {
            // The mosaics are larger than a field in every well (a 2×2 grid, 10 % overlap),
            // and not all of one size (so the zarr fields need padding).
            let mut sizes = std::collections::BTreeSet::new();
            for well in WELLS {
                let tiffs: Vec<_> =
                    walk(&out.join(&step.name)).into_iter().filter(|p| p.to_string_lossy().contains(&format!("_{well}_"))).collect();
                assert!(!tiffs.is_empty(), "{} TIFFs of {well}", step.name);
                for t in tiffs {
                    let info = hcsflow_tiff::read_info(&t).unwrap();
                    assert!(info.height > SIZE && info.width > SIZE, "{}: {}×{}", t.display(), info.height, info.width);
                    sizes.insert((info.height, info.width));
                }
            }
            assert!(sizes.len() > 1, "{}: every well's mosaic is {sizes:?}", step.name);
        }
        // y, x null for mosaics: the oracle takes the largest TIFF plane.
        let (y, x) = if mosaic { (json!(null), json!(null)) } else { (json!(SIZE), json!(SIZE)) };
        let label_into = LABEL_STEPS.iter().find(|(l, _)| *l == step.name).map(|(_, image)| *image);
        let root = out.join(format!("{}_{}.ome.zarr", cfg.plate_name, label_into.unwrap_or(&step.name)));
        assert!(summary.zarr_plates.contains(&root), "{} not in {:?}", root.display(), summary.zarr_plates);
        if label_into.is_some() {
            let own = out.join(format!("{}_{}.ome.zarr", cfg.plate_name, step.name));
            assert!(!own.exists(), "the label step '{}' writes no plate of its own ({})", step.name, own.display());
        }
        let expected = json!({
            "version": version.as_str(),
            "plate_name": cfg.plate_name,
            "rows": ["A", "B"],
            "columns": ["1", "2"],
            "wells": WELLS,
            "fields": fields,
            "channel_names": channels,
            "shape": [1, channels.len(), z, y, x],
            "field_size": [SIZE, SIZE],
            "dtype": "uint16",
            "levels": 3,
            "pixel_size_um": PIXEL_UM,
        });
        let spec_path = dir.path().join(format!("{}.json", step.name));
        std::fs::write(&spec_path, serde_json::to_vec_pretty(&expected).unwrap()).unwrap();
        let mut command = Command::new("python3");
        command.arg(Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/oracle/pipeline_zarr_oracle.py"));
        if label_into.is_some() {
            command.args(["--labels", &step.name]);
        }
        let o = command
            .arg(&root)
            .arg(out.join(&step.name))
            .arg(&spec_path)
            .arg(dir.path().join(format!("work-{}", step.name)))
            .output()
            .expect("run python3");
        let stdout = String::from_utf8_lossy(&o.stdout);
        println!("step '{}' (NGFF {version}):\n{stdout}", step.name);
        assert!(
            o.status.success() && stdout.contains("PIPELINE ORACLE OK"),
            "oracle failed for step '{}' (NGFF {version}):\n{stdout}\n{}",
            step.name,
            String::from_utf8_lossy(&o.stderr)
        );
    }
}

/// Every `.tif` file under `dir`, recursively.
fn walk(dir: &Path) -> Vec<PathBuf> {
    let mut out = Vec::new();
    let mut stack = vec![dir.to_path_buf()];
    while let Some(d) = stack.pop() {
        for e in std::fs::read_dir(&d).unwrap() {
            let p = e.unwrap().path();
            if p.is_dir() {
                stack.push(p);
            } else if p.extension().is_some_and(|e| e == "tif") {
                out.push(p);
            }
        }
    }
    out
}

#[test]
fn demo_pipeline_zarr_v05_reads_back_equal_to_its_tiffs() {
    if oracle_available() {
        run_demo_and_check(NgffVersion::V05);
    }
}

#[test]
fn demo_pipeline_zarr_v04_reads_back_equal_to_its_tiffs() {
    if oracle_available() {
        run_demo_and_check(NgffVersion::V04);
    }
}
