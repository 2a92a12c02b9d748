//! zarr-python and ome-zarr-py as independent readers of our plates: every
//! field must load with the right shape, axes, scale, channel names and
//! pixels, in both NGFF versions, also for a partially written plate; and
//! ome-zarr-models (pydantic models of the NGFF specs) must accept the whole
//! plate hierarchy as a valid HCS plate.
//!
//! Needs `python3` with `pip install zarr ome-zarr ome-zarr-models`; without them this test
//! fails with that command (`hcsflow_testkit::oracle`'s policy: never skipped
//! under `CI=true`, skipped outside CI with `HCSFLOW_SKIP_ORACLES=1`).
//! Run with `--nocapture` to see the oracle's report.

mod common;

use std::path::{Path, PathBuf};

use common::*;
use hcsflow_core::DType;
use hcsflow_testkit::oracle::{self, Oracle};
use hcsflow_zarr::{NgffVersion, PlateSpec, PlateWriter};
use serde_json::json;

const PIP: &str = "pip install zarr ome-zarr ome-zarr-models";

fn script() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/oracle/ome_zarr_oracle.py")
}

/// zarr-python (>= 3), ome-zarr-py and ome-zarr-models, or `None` when
/// missing and skipping is allowed.
fn zarr_python() -> Option<Oracle> {
    oracle::require_where(&["zarr", "ome_zarr", "ome_zarr_models", "numpy"], "int(zarr.__version__.split('.')[0]) >= 3", PIP)
}

/// A well the plate must list: (name, path, fields listed, fields never
/// written, which must read as all zero).
type Present<'a> = (&'a str, &'a str, Vec<usize>, Vec<usize>);

/// Writes `expected.json` and the expected pixels of every present
/// (well, field, level) for the oracle.
fn write_expected(dir: &Path, spec: &PlateSpec, present: &[Present]) {
    std::fs::create_dir_all(dir).unwrap();
    let s = spec.shape;
    let unit = |known: bool| {
        if known {
            json!("micrometer")
        } else {
            json!(null)
        }
    };
    let (py, px) = spec.pixel_size_um.unwrap_or((1.0, 1.0));
    let pz = spec.z_step_um.unwrap_or(1.0);
    let levels: Vec<_> = (0..spec.pyramid_levels)
        .map(|k| {
            let (ly, lx) = spec.level_yx(k);
            let f = (1u64 << k) as f64;
            json!({"shape": [s.t, s.c, s.z, ly, lx], "scale": [1.0, 1.0, pz, py * f, px * f]})
        })
        .collect();
    let doc = json!({
        "version": spec.version.as_str(),
        "dtype": match spec.dtype { DType::U8 => "uint8", DType::U16 => "uint16", DType::F32 => "float32" },
        "rows": spec.rows,
        "columns": spec.columns,
        "channel_names": spec.channel_names,
        "field_count": present.iter().map(|p| p.2.len()).max().unwrap_or(0),
        "axes": [
            ["t", "time", null],
            ["c", "channel", null],
            ["z", "space", unit(spec.z_step_um.is_some())],
            ["y", "space", unit(spec.pixel_size_um.is_some())],
            ["x", "space", unit(spec.pixel_size_um.is_some())],
        ],
        "levels": levels,
        "wells": present.iter().map(|(_, path, fields, _)| json!({"path": path, "fields": fields})).collect::<Vec<_>>(),
    });
    std::fs::write(dir.join("expected.json"), serde_json::to_vec_pretty(&doc).unwrap()).unwrap();
    assert_eq!(spec.dtype, DType::U16, "expected pixels are written for u16 plates");
    for (well, path, fields, empty) in present {
        let (row, col) = path.split_once('/').unwrap();
        for &field in fields {
            for k in 0..spec.pyramid_levels {
                let mut bytes = Vec::new();
                for t in 0..s.t {
                    for c in 0..s.c {
                        let st = stack(spec, seed(well, field), t, c);
                        for z in 0..s.z {
                            let plane: Vec<f64> = st.plane(z).to_f32().iter().map(|&v| v as f64).collect();
                            let (lvl, _, _) = reference_level(&plane, s.y, s.x, k);
                            for v in lvl {
                                let v = if empty.contains(&field) { 0 } else { v.round_ties_even() as u16 };
                                bytes.extend_from_slice(&v.to_le_bytes());
                            }
                        }
                    }
                }
                std::fs::write(dir.join(format!("{row}_{col}_{field}_{k}.bin")), bytes).unwrap();
            }
        }
    }
}

fn run_oracle(python: &Oracle, root: &Path, expected: &Path) -> String {
    let stdout = python.run([script().as_os_str(), root.as_os_str(), expected.as_os_str()]);
    println!("{stdout}");
    stdout
}

#[test]
fn zarr_python_and_ome_zarr_read_every_field() {
    let Some(python) = zarr_python() else { return };
    for version in [NgffVersion::V05, NgffVersion::V04] {
        let dir = tempfile::tempdir().unwrap();
        let root = dir.path().join("plate.zarr");
        let spec = small_spec(version);
        let writer = PlateWriter::create(&root, spec.clone()).unwrap();
        for well in &spec.wells {
            for field in 0..spec.fields_per_well {
                writer.write_field(well, field, &field_data(&spec, seed(well, field))).unwrap();
            }
        }
        writer.finish().unwrap();
        let present = [("A01", "A/1", vec![0, 1], vec![]), ("B02", "B/2", vec![0, 1], vec![])];
        write_expected(&dir.path().join("expected"), &spec, &present);
        let report = run_oracle(&python, &root, &dir.path().join("expected"));
        assert!(report.contains("ORACLE OK"), "{report}");
    }
}

/// A plate where one well has only field 1 and another well was never
/// written: the unwritten well is absent, the unwritten field is empty, and
/// ome-zarr-py's stitched plate view loads without errors.
#[test]
fn oracle_reads_a_partial_plate() {
    let Some(python) = zarr_python() else { return };
    for version in [NgffVersion::V05, NgffVersion::V04] {
        let dir = tempfile::tempdir().unwrap();
        let root = dir.path().join("partial.zarr");
        let mut spec = small_spec(version);
        spec.wells.push("A03".into());
        let writer = PlateWriter::create(&root, spec.clone()).unwrap();
        for field in 0..2 {
            writer.write_field("A01", field, &field_data(&spec, seed("A01", field))).unwrap();
        }
        writer.write_field("B02", 1, &field_data(&spec, seed("B02", 1))).unwrap();
        writer.finish().unwrap();
        // B02 field 0 was never written: listed, empty. A03: absent.
        let present = [("A01", "A/1", vec![0, 1], vec![]), ("B02", "B/2", vec![0, 1], vec![0])];
        write_expected(&dir.path().join("expected"), &spec, &present);
        let report = run_oracle(&python, &root, &dir.path().join("expected"));
        assert!(report.contains("ORACLE OK: NGFF"), "{report}");
    }
}
