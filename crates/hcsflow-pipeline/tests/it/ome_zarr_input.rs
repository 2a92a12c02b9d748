//! OME-Zarr HCS plates as inputs: hcsflow's own (a run's OME-Zarr output,
//! NGFF 0.5 and 0.4) and ome-zarr-py's (NGFF 0.4 with Blosc chunks, 0.5 with
//! zstd; `tests/oracle/ome_zarr_input_oracle.py` writes them and checks the
//! outputs with zarr-python and tifffile). Each opens with its wells, fields,
//! channels and names, z, time points, pixel size and stage positions; a
//! pipeline runs on it; the plate's files are never touched.

use crate::common;

use std::path::Path;

use hcsflow::builtin;
use hcsflow_core::{DType, Stack};
use hcsflow_pipeline::{NgffVersion, RunOptions, RunSummary};
use hcsflow_plate::{open_plate, read_image, Format, PlaneAt, Plate};
use hcsflow_synth::SynthConfig;
use serde_json::Value;

/// Max over z, to TIFF and OME-Zarr.
const MAX_Z_BOTH: &str = "name = \"first\"\n[[steps]]\nname = \"max_z\"\nfunc = \"max_projection\"\nvariable_components = [\"z_index\"]\nmaterialize = [\"tiff\", \"zarr\"]\n";
/// Max over z, to OME-Zarr only.
const MAX_Z_ZARR: &str = "name = \"zonly\"\n[[steps]]\nname = \"max_z\"\nfunc = \"max_projection\"\nvariable_components = [\"z_index\"]\nmaterialize = [\"zarr\"]\n";
/// Min over channels, to TIFF.
const MIN_C: &str = "name = \"second\"\n[[steps]]\nname = \"min_c\"\nfunc = \"min_projection\"\nvariable_components = [\"channel\"]\ngroup_by = \"none\"\nmaterialize = [\"tiff\"]\n";

fn run(plate: &Plate, toml: &str, out: &Path, version: NgffVersion) -> RunSummary {
    let plan = common::compile_text(plate, toml, out).expect("compile");
    let options = RunOptions { zarr_format: version, ..RunOptions::default() };
    let summary = common::run_with(&builtin(), &plan, &options).expect("run");
    assert_eq!(summary.completed.len(), plate.wells().len(), "{:?}", summary.failed);
    summary
}

/// The pixels of a plate image, read as the pipeline reads it.
fn pixels(plate: &Plate, well: &str, site: u32, channel: u32, z: u32) -> Stack {
    let image = plate.image(well, site, channel, z, 1).unwrap_or_else(|| panic!("{well} s{site} w{channel} z{z}"));
    let m = &plate.metadata;
    let expected = (m.image_height.unwrap() as usize, m.image_width.unwrap() as usize, m.dtype.unwrap());
    read_image(&image.path, image.at.as_ref(), expected).unwrap_or_else(|e| panic!("{e}"))
}

fn u16s(s: Stack) -> Vec<u16> {
    match s {
        Stack::U16(a) => a.pixels().to_vec(),
        other => panic!("{} pixels, expected u16", other.dtype()),
    }
}

#[test]
fn our_ome_zarr_output_opens_as_the_plate_the_run_wrote_and_a_second_pipeline_runs_on_it() {
    for version in [NgffVersion::V05, NgffVersion::V04] {
        let dir = tempfile::tempdir().expect("tempdir");
        let cfg = SynthConfig {
            size: 32,
            z_planes: 3,
            grid_rows: 2,
            grid_cols: 2,
            channels: 2,
            wells: vec!["A01".into(), "B02".into()],
            ..SynthConfig::default()
        };
        let source = common::open(&common::synth_plate(&dir.path().join("plate"), &cfg));
        let out1 = dir.path().join("out1");
        let summary = run(&source, MAX_Z_BOTH, &out1, version);
        let [root] = &summary.zarr_plates[..] else { panic!("one OME-Zarr plate: {:?}", summary.zarr_plates) };

        let before = hcsflow_testkit::contents(root);
        let zarr = open_plate(root, None).unwrap_or_else(|e| panic!("{}: {e}", root.display()));
        let tiffs = open_plate(&out1.join("max_z"), None).expect("the TIFF output");
        assert_eq!(zarr.format, Format::OmeZarr);
        assert_eq!(zarr.wells(), source.wells(), "{version}");
        let (m, s) = (&zarr.metadata, &source.metadata);
        assert_eq!((m.sites, m.channels, m.z_planes, m.timepoints), (4, 2, 1, 1), "{version}");
        assert_eq!(m.channel_names, s.channel_names);
        assert_eq!(m.pixel_size_um, s.pixel_size_um);
        assert_eq!((m.image_width, m.image_height, m.dtype), (Some(32), Some(32), Some(DType::U16)));
        // The plate lists only rows A, B and columns 1, 2: the smallest plate holding them.
        assert_eq!((m.plate_rows, m.plate_columns), (2, 3));
        // The sites' stage positions travel as the fields' NGFF translations: same positions, same grid.
        assert_eq!(m.stage_positions, s.stage_positions, "{version}");
        assert_eq!((m.grid_rows, m.grid_cols, &m.site_cells), (s.grid_rows, s.grid_cols, &s.site_cells), "{:?}", zarr.warnings);
        assert!(zarr.warnings.is_empty(), "{:?}", zarr.warnings);
        assert!(zarr.missing.is_empty(), "{:?}", zarr.missing);
        assert_eq!(zarr.images.len(), 2 * 4 * 2);
        assert!(zarr.images.iter().all(|i| matches!(i.at, Some(PlaneAt::Zarr { .. }))));
        // Every plane equals the same plane of the run's TIFF output.
        for i in &zarr.images {
            assert_eq!(
                pixels(&zarr, &i.well, i.site, i.channel, 1),
                pixels(&tiffs, &i.well, i.site, i.channel, 1),
                "{version} {} s{} w{}",
                i.well,
                i.site,
                i.channel
            );
        }

        // A second pipeline on the OME-Zarr plate: min over channels.
        let out2 = dir.path().join("out2");
        run(&zarr, MIN_C, &out2, version);
        let second = open_plate(&out2, None).expect("the second run's output");
        assert_eq!(second.wells(), source.wells());
        assert_eq!(second.images.len(), 2 * 4);
        for i in &second.images {
            let min: Vec<u16> = {
                let (a, b) = (u16s(pixels(&zarr, &i.well, i.site, 1, 1)), u16s(pixels(&zarr, &i.well, i.site, 2, 1)));
                a.iter().zip(&b).map(|(x, y)| *x.min(y)).collect()
            };
            assert_eq!(u16s(pixels(&second, &i.well, i.site, 1, 1)), min, "{} s{}", i.well, i.site);
            // Named as the plane of a container it came from: well, site, channel, z, t.
            let name = i.path.file_name().unwrap().to_string_lossy().into_owned();
            assert_eq!(name, format!("{}_s{}_w1_z1_t1.tif", i.well, i.site));
        }
        assert!(hcsflow_testkit::contents(root) == before, "{version}: the OME-Zarr input was modified");
    }
}

#[test]
fn a_run_folder_holding_only_an_ome_zarr_plate_opens_as_that_plate() {
    let dir = tempfile::tempdir().expect("tempdir");
    let cfg = SynthConfig { size: 16, z_planes: 2, wells: vec!["C03".into()], ..SynthConfig::default() };
    let source = common::open(&common::synth_plate(&dir.path().join("plate"), &cfg));
    let out = dir.path().join("out");
    let summary = run(&source, MAX_Z_ZARR, &out, NgffVersion::V05);
    let from_out = open_plate(&out, None).expect("OUT holding one OME-Zarr plate");
    assert_eq!(from_out.format, Format::OmeZarr);
    assert_eq!(from_out.root, summary.zarr_plates[0]);
    assert_eq!(from_out.wells(), ["C03"]);
    assert_eq!(hcsflow_plate::detect(&out).expect("detect"), Format::OmeZarr);
}

#[test]
fn a_broken_field_is_a_warning_and_its_planes_are_missing() {
    let dir = tempfile::tempdir().expect("tempdir");
    let cfg = SynthConfig { size: 16, grid_rows: 1, grid_cols: 2, channels: 2, wells: vec!["A01".into()], ..SynthConfig::default() };
    let source = common::open(&common::synth_plate(&dir.path().join("plate"), &cfg));
    let summary = run(&source, MAX_Z_ZARR, &dir.path().join("out"), NgffVersion::V05);
    let root = &summary.zarr_plates[0];
    // Field 1 of A01 loses its level-0 array metadata.
    std::fs::remove_file(root.join("A/1/1/0/zarr.json")).expect("remove");
    let plate = open_plate(root, None).expect("open");
    assert_eq!(plate.images.iter().map(|i| i.site).collect::<Vec<_>>(), [1, 1]);
    assert_eq!(plate.metadata.sites, 2);
    let missing: Vec<(u32, u32)> = plate.missing.iter().map(|m| (m.site, m.channel)).collect();
    assert_eq!(missing, [(2, 1), (2, 2)]);
    assert!(plate.missing[0].reason.contains("A/1/1"), "{}", plate.missing[0].reason);
    assert!(plate.warnings.iter().any(|w| w.contains("field A/1/1 left out")), "{:?}", plate.warnings);
    // A plate without a `plate` attribute is not found; corrupt metadata is an error naming the file.
    std::fs::write(root.join("zarr.json"), b"{ not json").expect("write");
    let e = open_plate(root, Some(Format::OmeZarr)).expect_err("corrupt zarr.json");
    assert!(e.to_string().contains("zarr.json"), "{e}");
}

#[test]
fn ome_zarr_py_plates_open_and_a_pipeline_runs_on_them() {
    let modules = ["zarr", "ome_zarr", "numcodecs", "tifffile", "numpy"];
    let pip = "pip install -r .ci/requirements-oracles.txt  (zarr>=3 ome-zarr numcodecs tifffile numpy)";
    let Some(python) = hcsflow_testkit::oracle::require_where(&modules, "int(zarr.__version__.split('.')[0]) >= 3", pip) else {
        return;
    };
    let script = Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/oracle/ome_zarr_input_oracle.py");
    let dir = tempfile::tempdir().expect("tempdir");
    println!("{}", python.run([script.as_os_str(), "write".as_ref(), dir.path().as_os_str()]));
    let expected: Value = serde_json::from_slice(&std::fs::read(dir.path().join("expected.json")).expect("expected.json")).expect("json");
    for (name, want) in expected.as_object().expect("object") {
        let root = dir.path().join(name);
        let before = hcsflow_testkit::contents(&root);
        let plate = open_plate(&root, None).unwrap_or_else(|e| panic!("{name}: {e}"));
        let m = &plate.metadata;
        assert_eq!(plate.format, Format::OmeZarr, "{name}");
        assert_eq!(serde_json::to_value(plate.wells()).unwrap(), want["wells"], "{name}");
        let counts = [m.sites, m.channels, m.z_planes, m.timepoints].map(u64::from);
        let wanted = ["sites", "channels", "z", "t"].map(|k| want[k].as_u64().expect(k));
        assert_eq!(counts, wanted, "{name}");
        let names: Vec<&str> = m.channel_names.values().map(String::as_str).collect();
        assert_eq!(serde_json::to_value(&names).unwrap(), want["names"], "{name}");
        assert_eq!([m.image_height, m.image_width].map(|v| u64::from(v.unwrap())), [0, 1].map(|i| want["size"][i].as_u64().unwrap()));
        assert_eq!(m.dtype.map(|d| d.to_string()).as_deref(), want["dtype"].as_str(), "{name}");
        assert_eq!(m.pixel_size_um, want["pixel_size_um"].as_f64(), "{name}");
        let xs: Vec<f64> = m.stage_positions.iter().filter(|p| p.well == plate.wells()[0]).map(|p| p.x_um).collect();
        let ys: Vec<f64> = m.stage_positions.iter().filter(|p| p.well == plate.wells()[0]).map(|p| p.y_um).collect();
        assert_eq!(serde_json::to_value(&xs).unwrap(), want["stage_x"], "{name}");
        assert_eq!(serde_json::to_value(&ys).unwrap(), want["stage_y"], "{name}");
        if !xs.is_empty() {
            // Two fields one field width apart in x: one row of two.
            assert_eq!((m.grid_rows, m.grid_cols), (1, 2), "{name}: {:?}", plate.warnings);
        }
        assert!(plate.missing.is_empty(), "{name}: {:?}", plate.missing);

        let out = dir.path().join(format!("out-{name}"));
        let toml = "name = \"max\"\n[[steps]]\nname = \"max_z\"\nfunc = \"max_projection\"\nvariable_components = [\"z_index\"]\nmaterialize = [\"tiff\"]\n";
        run(&plate, toml, &out, NgffVersion::V05);
        let report = python.run([script.as_os_str(), "check".as_ref(), root.as_os_str(), out.join("max_z").as_os_str()]);
        println!("{name}: {report}");
        assert!(report.contains("ZARR INPUT ORACLE OK"), "{name}: {report}");
        assert!(hcsflow_testkit::contents(&root) == before, "{name}: the input plate was modified");
    }
}
