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

use crate::common;

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

fn labels_script() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/oracle/ngff_labels_oracle.py")
}

/// A `h × w` label plane: 8×8 blocks numbered differently per (field, label, z), a background stripe of 0.
fn label_plane(h: usize, w: usize, salt: usize) -> Vec<u16> {
    (0..h * w)
        .map(|i| {
            let (y, x) = (i / w, i % w);
            if x % 11 == 0 {
                0
            } else {
                (((y / 8) * 7 + x / 8 + salt * 13) % 400 + 1) as u16
            }
        })
        .collect()
}

/// napari's OME-Zarr reader (ome-zarr-py) lists the label images written
/// under each field, with our values on every level (level k: every 2^k-th
/// pixel), the image's transforms and an integer dtype; zarr-python reads the
/// `labels` lists and ome-zarr-models accepts each field image with its labels.
/// NGFF 0.5 with a fixed extent, and 0.4 with grown fields (a label written at
/// a field's smaller size is padded with 0 to the field's final extent).
#[test]
fn ome_zarr_reads_the_labels_of_every_field() {
    let Some(python) = zarr_python() else { return };
    for (version, grow) in [(NgffVersion::V05, false), (NgffVersion::V04, true)] {
        let dir = tempfile::tempdir().unwrap();
        let root = dir.path().join("labels.zarr");
        let mut spec = small_spec(version);
        if grow {
            spec.extent = hcsflow_zarr::FieldExtent::Grow;
        }
        let s = spec.shape;
        let writer = PlateWriter::create(&root, spec.clone()).unwrap();
        // (well, path, field, labels, plane size); with grow, A01 field 0 is larger than the chunk size.
        let (big, small) = if grow { ((70, 50), (40, 30)) } else { ((s.y, s.x), (s.y, s.x)) };
        let fields = [
            ("A01", "A/1/0", 0, vec!["cells", "nuclei"], big),
            ("A01", "A/1/1", 1, vec!["nuclei"], small),
            ("B02", "B/2/0", 0, vec!["nuclei"], small),
            ("B02", "B/2/1", 1, vec!["nuclei"], small),
        ];
        let extent = fields.iter().fold((0, 0), |a, f| (a.0.max(f.4 .0), a.1.max(f.4 .1)));
        let expected = dir.path().join("expected");
        std::fs::create_dir_all(&expected).unwrap();
        let mut listed = serde_json::Map::new();
        for (i, (well, path, field, names, (h, w))) in fields.iter().enumerate() {
            let data: Vec<hcsflow_core::Stack> = (0..s.c)
                .map(|c| {
                    let v = values(seed(well, *field), 0, c, s.z * h * w).iter().map(|&v| v as u16).collect();
                    hcsflow_core::Stack::from(ndarray::Array3::from_shape_vec((s.z, *h, *w), v).unwrap())
                })
                .collect();
            writer.write_field(well, *field, &data).unwrap();
            for (j, name) in names.iter().enumerate() {
                let mut level0 = Vec::new();
                for z in 0..s.z {
                    let plane = label_plane(*h, *w, i * 10 + j * 3 + z);
                    let stack = hcsflow_core::Stack::from(ndarray::Array3::from_shape_vec((1, *h, *w), plane.clone()).unwrap());
                    writer.write_label_plane(well, *field, name, 0, z, &stack).unwrap();
                    // The expected level 0 at the field's final extent (padded with 0).
                    for y in 0..extent.0 {
                        for x in 0..extent.1 {
                            let v = if y < *h && x < *w { plane[y * w + x] } else { 0 };
                            level0.extend_from_slice(&v.to_le_bytes());
                        }
                    }
                }
                std::fs::write(expected.join(format!("{}_{name}.bin", path.replace('/', "_"))), level0).unwrap();
            }
            listed.insert(path.to_string(), json!(names));
        }
        writer.finish().unwrap();
        let doc = json!({
            "version": version.as_str(),
            "levels": spec.pyramid_levels,
            "shape": [s.t, 1, s.z, extent.0, extent.1],
            "fields": listed,
        });
        std::fs::write(expected.join("labels.json"), serde_json::to_vec_pretty(&doc).unwrap()).unwrap();
        let report = python.run([labels_script().as_os_str(), root.as_os_str(), expected.as_os_str()]);
        println!("{report}");
        assert!(report.contains("ORACLE OK: NGFF"), "{report}");
    }
}

/// Label planes the writer refuses, each error naming the label and the problem.
#[test]
fn label_planes_that_cannot_be_labels_are_refused() {
    let dir = tempfile::tempdir().unwrap();
    let spec = small_spec(NgffVersion::V05);
    let s = spec.shape;
    let writer = PlateWriter::create(&dir.path().join("p.zarr"), spec).unwrap();
    let u16_plane = |h, w| hcsflow_core::Stack::from(ndarray::Array3::<u16>::zeros((1, h, w)));
    let f32_plane = hcsflow_core::Stack::from(ndarray::Array3::<f32>::zeros((1, s.y, s.x)));
    let cases = [
        (writer.write_label_plane("A01", 0, "nuclei", 0, 0, &f32_plane), "labels must be integers"),
        (writer.write_label_plane("A01", 0, "nuclei", 0, 0, &u16_plane(s.y + 1, s.x)), "plane shape [1, 65, 48]"),
        (writer.write_label_plane("A01", 0, "../x", 0, 0, &u16_plane(s.y, s.x)), "a label name must be"),
        (writer.write_label_plane("A01", 0, "nuclei", 0, s.z, &u16_plane(s.y, s.x)), "z = 3 out of range"),
        (writer.write_label_plane("C09", 0, "nuclei", 0, 0, &u16_plane(s.y, s.x)), "unknown well 'C09'"),
    ];
    for (result, needle) in cases {
        let text = result.expect_err(needle).to_string();
        assert!(text.contains(needle), "{text} lacks {needle}");
    }
    assert!(!dir.path().join("p.zarr/A/1/0/labels").exists(), "nothing was written");
}
