//! Writes the small test plate in both NGFF versions and reads it back with
//! zarrs: exact level-0 pixels, pyramid levels equal to an independent block
//! mean, array shapes/chunks/codecs, and the NGFF metadata documents.

use crate::common;

use common::*;
use hcsflow_core::{DType, Stack};
use hcsflow_zarr::{FieldExtent, FieldShape, NgffVersion, PlateSpec, PlateWriter, ZarrCompression};
use serde_json::json;

fn write_plate(root: &std::path::Path, spec: &PlateSpec) {
    let writer = PlateWriter::create(root, spec.clone()).expect("create");
    for well in &spec.wells {
        for field in 0..spec.fields_per_well {
            writer.write_field(well, field, &field_data(spec, seed(well, field))).expect("write_field");
        }
    }
    let out = writer.finish().expect("finish");
    assert_eq!(out, root);
}

/// Level-0 planes equal what was written; level k equals the rounded block mean.
fn check_pixels(root: &std::path::Path, spec: &PlateSpec, well_path: &str, well: &str, field: usize) {
    let s = spec.shape;
    for k in 0..spec.pyramid_levels {
        let array = open_array(root, &format!("/{well_path}/{field}/{k}"));
        let (ly, lx) = spec.level_yx(k);
        assert_eq!(array.shape(), &[s.t as u64, s.c as u64, s.z as u64, ly as u64, lx as u64]);
        for t in 0..s.t {
            for c in 0..s.c {
                let written = stack(spec, seed(well, field), t, c);
                for z in 0..s.z {
                    let plane = written.plane(z);
                    let plane_f64: Vec<f64> = plane.to_f32().iter().map(|&v| v as f64).collect();
                    let (expected, eh, ew) = reference_level(&plane_f64, s.y, s.x, k);
                    assert_eq!((eh, ew), (ly, lx));
                    let idx = [t as u64, c as u64, z as u64, 0, 0];
                    match spec.dtype {
                        DType::U16 => {
                            let got: Vec<u16> = array.retrieve_chunk(&idx).expect("chunk");
                            if k == 0 {
                                assert_eq!(Stack::from(ndarray::Array3::from_shape_vec((1, s.y, s.x), got).unwrap()), plane);
                            } else {
                                let exp: Vec<u16> = expected.iter().map(|v| v.round_ties_even() as u16).collect();
                                assert_eq!(got, exp, "{well_path}/{field}/{k} t{t} c{c} z{z}");
                            }
                        }
                        DType::F32 => {
                            let got: Vec<f32> = array.retrieve_chunk(&idx).expect("chunk");
                            for (g, e) in got.iter().zip(&expected) {
                                assert!((*g as f64 - e).abs() <= e.abs() * 1e-6, "{g} vs {e}");
                            }
                        }
                        DType::U8 => {
                            let got: Vec<u8> = array.retrieve_chunk(&idx).expect("chunk");
                            let exp: Vec<u8> = expected.iter().map(|v| v.round_ties_even() as u8).collect();
                            assert_eq!(got, exp);
                        }
                    }
                }
            }
        }
    }
}

fn check_metadata(root: &std::path::Path, spec: &PlateSpec, version: NgffVersion) {
    let v04 = version == NgffVersion::V04;
    let plate_attrs = ngff_attrs(root, "", version);
    let plate = &plate_attrs["plate"];
    assert_eq!(plate["name"], "test-plate");
    assert_eq!(plate["rows"], json!([{"name": "A"}, {"name": "B"}]));
    assert_eq!(plate["columns"], json!([{"name": "1"}, {"name": "2"}, {"name": "3"}]));
    assert_eq!(
        plate["wells"],
        json!([
            {"path": "A/1", "rowIndex": 0, "columnIndex": 0},
            {"path": "B/2", "rowIndex": 1, "columnIndex": 1}
        ])
    );
    assert_eq!(plate["field_count"], 2);
    assert_eq!(plate.get("version").is_some(), v04, "plate.version only in 0.4");
    if v04 {
        assert_eq!(plate["version"], "0.4");
    }
    // The spec is stored for resume.
    let raw_root = if v04 { read_json(&root.join(".zattrs")) } else { read_json(&root.join("zarr.json"))["attributes"].clone() };
    assert_eq!(raw_root["hcsflow"]["format"], 1);

    for well in ["A/1", "B/2"] {
        let w = ngff_attrs(root, well, version);
        assert_eq!(w["well"]["images"], json!([{"path": "0"}, {"path": "1"}]));
        // Row groups exist too.
        let row = &well[..1];
        let row_group = if v04 { root.join(row).join(".zgroup") } else { root.join(row).join("zarr.json") };
        assert!(row_group.exists(), "{}", row_group.display());
        for field in ["0", "1"] {
            let img = ngff_attrs(root, &format!("{well}/{field}"), version);
            let ms = &img["multiscales"][0];
            assert_eq!(ms.get("version").is_some(), v04);
            assert_eq!(
                ms["axes"],
                json!([
                    {"name": "t", "type": "time"},
                    {"name": "c", "type": "channel"},
                    {"name": "z", "type": "space", "unit": "micrometer"},
                    {"name": "y", "type": "space", "unit": "micrometer"},
                    {"name": "x", "type": "space", "unit": "micrometer"}
                ])
            );
            assert_eq!(ms["datasets"].as_array().map(Vec::len), Some(2));
            assert_eq!(ms["datasets"][0]["path"], "0");
            assert_eq!(ms["datasets"][0]["coordinateTransformations"], json!([{"type": "scale", "scale": [1.0, 1.0, 2.0, 0.65, 0.5]}]));
            assert_eq!(ms["datasets"][1]["coordinateTransformations"], json!([{"type": "scale", "scale": [1.0, 1.0, 2.0, 1.3, 1.0]}]));
            let labels: Vec<_> = img["omero"]["channels"].as_array().unwrap().iter().map(|c| c["label"].clone()).collect();
            assert_eq!(labels, vec![json!("DAPI"), json!("GFP")]);
            assert_eq!(img["omero"]["channels"][0]["window"], json!({"min": 0.0, "max": 65535.0, "start": 0.0, "end": 65535.0}));
        }
    }

    // Array metadata: one chunk per plane, zstd, dimension names (v3) / "/" separator (v2).
    let dir = root.join("A/1/0/1");
    if v04 {
        let z = read_json(&dir.join(".zarray"));
        assert_eq!(z["shape"], json!([1, 2, 3, 32, 24]));
        assert_eq!(z["chunks"], json!([1, 1, 1, 32, 24]));
        assert_eq!(z["dtype"], "<u2");
        assert_eq!(z["dimension_separator"], "/");
        assert_eq!(z["compressor"]["id"], "zstd");
        assert!(root.join("A/1/0/0/0/1/2/0/0").exists(), "v2 chunk key with / separator");
    } else {
        let z = read_json(&dir.join("zarr.json"));
        assert_eq!(z["node_type"], "array");
        assert_eq!(z["shape"], json!([1, 2, 3, 32, 24]));
        assert_eq!(z["chunk_grid"]["configuration"]["chunk_shape"], json!([1, 1, 1, 32, 24]));
        assert_eq!(z["data_type"], "uint16");
        assert_eq!(z["dimension_names"], json!(["t", "c", "z", "y", "x"]));
        let codecs: Vec<_> = z["codecs"].as_array().unwrap().iter().map(|c| c["name"].clone()).collect();
        assert_eq!(codecs, vec![json!("bytes"), json!("zstd")]);
        assert!(root.join("A/1/0/0/c/0/1/2/0/0").exists(), "v3 default chunk key");
    }
    let _ = spec;
}

#[test]
fn small_plate_round_trips_in_both_versions() {
    for version in [NgffVersion::V05, NgffVersion::V04] {
        let dir = tempfile::tempdir().unwrap();
        let root = dir.path().join("plate.zarr");
        let spec = small_spec(version);
        write_plate(&root, &spec);
        for (well, path) in [("A01", "A/1"), ("B02", "B/2")] {
            for field in 0..2 {
                check_pixels(&root, &spec, path, well, field);
            }
        }
        check_metadata(&root, &spec, version);
        // No temporary files left behind.
        let leftovers: Vec<_> =
            walk(&root).into_iter().filter(|p| p.file_name().is_some_and(|n| hcsflow_io::is_temp_name(&n.to_string_lossy()))).collect();
        assert!(leftovers.is_empty(), "{leftovers:?}");
    }
}

fn walk(dir: &std::path::Path) -> Vec<std::path::PathBuf> {
    let mut out = Vec::new();
    for e in std::fs::read_dir(dir).unwrap() {
        let p = e.unwrap().path();
        if p.is_dir() {
            out.extend(walk(&p));
        } else {
            out.push(p);
        }
    }
    out
}

/// Odd sizes (partial edge blocks), 3 levels, u8 and f32, no compression.
#[test]
fn odd_sizes_other_dtypes_uncompressed() {
    for (version, dtype) in [(NgffVersion::V05, DType::U8), (NgffVersion::V04, DType::F32), (NgffVersion::V05, DType::F32)] {
        let dir = tempfile::tempdir().unwrap();
        let root = dir.path().join("odd.zarr");
        let spec = PlateSpec {
            name: "odd".into(),
            rows: vec!["A".into()],
            columns: vec!["1".into(), "12".into()],
            wells: vec!["a12".into()],
            fields_per_well: 1,
            channel_names: vec!["only".into()],
            pixel_size_um: None,
            z_step_um: None,
            dtype,
            shape: FieldShape { t: 2, c: 1, z: 1, y: 33, x: 17 },
            pyramid_levels: 3,
            version,
            compression: ZarrCompression::None,
            extent: FieldExtent::Fixed,
            field_positions_um: Vec::new(),
        };
        write_plate(&root, &spec);
        check_pixels(&root, &spec, "A/12", "a12", 0);
        let img = ngff_attrs(&root, "A/12/0", version);
        let ms = &img["multiscales"][0];
        assert_eq!(ms["axes"][3], json!({"name": "y", "type": "space"}), "no unit when the pixel size is unknown");
        assert_eq!(ms["datasets"][2]["coordinateTransformations"][0]["scale"], json!([1.0, 1.0, 1.0, 4.0, 4.0]));
        let a = open_array(&root, "/A/12/0/2");
        assert_eq!(a.shape(), &[2, 1, 1, 9, 5]);
    }
}
