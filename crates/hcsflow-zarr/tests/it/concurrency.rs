//! write_plane from many threads, partial plates, finish after a partial run,
//! resume with open_existing / create_or_resume.

use crate::common;

use std::sync::Arc;

use common::*;
use hcsflow_core::Stack;
use hcsflow_zarr::{NgffVersion, PlateWriter, ZarrError};
use serde_json::json;

/// Every plane of every field, written one plane at a time from 4 threads in
/// an interleaved order, reads back exactly.
#[test]
fn concurrent_write_plane_from_threads() {
    for version in [NgffVersion::V05, NgffVersion::V04] {
        let dir = tempfile::tempdir().unwrap();
        let root = dir.path().join("plate.zarr");
        let spec = small_spec(version);
        let writer = Arc::new(PlateWriter::create(&root, spec.clone()).unwrap());
        let s = spec.shape;
        // (well, field, t, c, z) of every plane.
        let mut jobs = Vec::new();
        for well in &spec.wells {
            for field in 0..spec.fields_per_well {
                for t in 0..s.t {
                    for c in 0..s.c {
                        for z in 0..s.z {
                            jobs.push((well.clone(), field, t, c, z));
                        }
                    }
                }
            }
        }
        let jobs = Arc::new(jobs);
        let threads: Vec<_> = (0..4)
            .map(|k| {
                let (writer, jobs, spec) = (writer.clone(), jobs.clone(), spec.clone());
                std::thread::spawn(move || {
                    for (well, field, t, c, z) in jobs.iter().skip(k).step_by(4) {
                        let plane = stack(&spec, seed(well, *field), *t, *c).plane(*z);
                        writer.write_plane(well, *field, *t, *c, *z, &plane).unwrap();
                    }
                })
            })
            .collect();
        for t in threads {
            t.join().unwrap();
        }
        let writer = Arc::try_unwrap(writer).unwrap();
        writer.finish().unwrap();
        for (well, path) in [("A01", "A/1"), ("B02", "B/2")] {
            for field in 0..2 {
                let a = open_array(&root, &format!("/{path}/{field}/0"));
                for c in 0..s.c {
                    let want = stack(&spec, seed(well, field), 0, c);
                    for z in 0..s.z {
                        let got: Vec<u16> = a.retrieve_chunk(&[0, c as u64, z as u64, 0, 0]).unwrap();
                        let Stack::U16(p) = want.plane(z) else { panic!() };
                        assert_eq!(got, p.into_array().into_raw_vec_and_offset().0, "{path}/{field} c{c} z{z}");
                    }
                }
            }
        }
    }
}

/// Only some planes of one field: finish lists just that field and well;
/// the planes not written read as 0 (fill value).
#[test]
fn partial_plate_then_finish() {
    for version in [NgffVersion::V05, NgffVersion::V04] {
        let dir = tempfile::tempdir().unwrap();
        let root = dir.path().join("plate.zarr");
        let spec = small_spec(version);
        let writer = PlateWriter::create(&root, spec.clone()).unwrap();
        let plane = stack(&spec, 7, 0, 1).plane(2);
        writer.write_plane("B02", 1, 0, 1, 2, &plane).unwrap();
        // Mid-run metadata: the plate is readable with what exists so far.
        writer.update_metadata().unwrap();
        let plate = ngff_attrs(&root, "", version);
        assert_eq!(plate["plate"]["wells"], json!([{"path": "B/2", "rowIndex": 1, "columnIndex": 1}]));
        writer.finish().unwrap();

        let plate = ngff_attrs(&root, "", version);
        assert_eq!(plate["plate"]["wells"], json!([{"path": "B/2", "rowIndex": 1, "columnIndex": 1}]));
        assert_eq!(plate["plate"]["field_count"], 2);
        // Field 0 was never written: present, empty.
        assert_eq!(ngff_attrs(&root, "B/2", version)["well"]["images"], json!([{"path": "0"}, {"path": "1"}]));
        let empty: Vec<u16> = open_array(&root, "/B/2/0/0").retrieve_chunk(&[0, 1, 2, 0, 0]).unwrap();
        assert!(empty.iter().all(|&v| v == 0));
        assert!(!root.join("A").exists(), "nothing written for well A01");

        let a = open_array(&root, "/B/2/1/0");
        let got: Vec<u16> = a.retrieve_chunk(&[0, 1, 2, 0, 0]).unwrap();
        let Stack::U16(p) = plane else { panic!() };
        assert_eq!(got, p.into_array().into_raw_vec_and_offset().0);
        let missing: Vec<u16> = a.retrieve_chunk(&[0, 0, 0, 0, 0]).unwrap();
        assert!(missing.iter().all(|&v| v == 0));
        let lvl1 = open_array(&root, "/B/2/1/1");
        let missing1: Vec<u16> = lvl1.retrieve_chunk(&[0, 1, 1, 0, 0]).unwrap();
        assert_eq!(missing1.len(), 32 * 24);
        assert!(missing1.iter().all(|&v| v == 0));
    }
}

/// A run that stops half-way (writer dropped without finish), then a resumed
/// run that writes the rest: the result equals an uninterrupted run.
#[test]
fn resume_after_interrupted_run() {
    for version in [NgffVersion::V05, NgffVersion::V04] {
        let dir = tempfile::tempdir().unwrap();
        let root = dir.path().join("plate.zarr");
        let spec = small_spec(version);
        {
            let writer = PlateWriter::create(&root, spec.clone()).unwrap();
            writer.write_field("A01", 0, &field_data(&spec, seed("A01", 0))).unwrap();
            // Dropped: no finish, as after a kill.
        }
        // create refuses, and says to resume.
        match PlateWriter::create(&root, spec.clone()) {
            Err(e @ ZarrError::RootNotEmpty { .. }) => {
                assert!(e.to_string().contains("open_existing"), "{e}")
            }
            other => panic!("expected RootNotEmpty, got {other:?}"),
        }
        // What a kill during a chunk write leaves: a temporary file beside the chunks.
        let stale = if version == NgffVersion::V05 { "A/1/0/0/c/0/0/0/0/.0.tmp-4242-7" } else { "A/1/0/0/0/0/0/0/.0.tmp-4242-7" };
        std::fs::write(root.join(stale), b"half a chunk").unwrap();
        let writer = PlateWriter::open_existing(&root).unwrap();
        assert_eq!(writer.spec(), &spec);
        for well in &spec.wells {
            for field in 0..spec.fields_per_well {
                if (well.as_str(), field) != ("A01", 0) {
                    writer.write_field(well, field, &field_data(&spec, seed(well, field))).unwrap();
                }
            }
        }
        writer.finish().unwrap();

        let reference = dir.path().join("reference.zarr");
        let w = PlateWriter::create(&reference, spec.clone()).unwrap();
        for well in &spec.wells {
            for field in 0..spec.fields_per_well {
                w.write_field(well, field, &field_data(&spec, seed(well, field))).unwrap();
            }
        }
        w.finish().unwrap();
        assert!(!root.join(stale).exists(), "finish removes stale temporary files");
        assert_eq!(tree(&root), tree(&reference));

        // create_or_resume: same spec resumes, another spec is refused.
        assert!(PlateWriter::create_or_resume(&root, spec.clone()).is_ok());
        let mut other = spec.clone();
        other.channel_names[1] = "RFP".into();
        let e = PlateWriter::create_or_resume(&root, other).unwrap_err();
        assert!(matches!(e, ZarrError::SpecMismatch { .. }), "{e:?}");
        assert!(e.to_string().contains(r#"channel_names: stored ["DAPI","GFP"], requested ["DAPI","RFP"]"#), "{e}");
        // Finishing twice is harmless.
        PlateWriter::open_existing(&root).unwrap().finish().unwrap();
        assert_eq!(tree(&root), tree(&reference));
    }
}

/// Every file under `root` with its bytes, relative paths sorted.
fn tree(root: &std::path::Path) -> Vec<(String, Vec<u8>)> {
    fn walk(base: &std::path::Path, dir: &std::path::Path, out: &mut Vec<(String, Vec<u8>)>) {
        for e in std::fs::read_dir(dir).unwrap() {
            let p = e.unwrap().path();
            if p.is_dir() {
                walk(base, &p, out);
            } else {
                let rel = p.strip_prefix(base).unwrap().to_string_lossy().into_owned();
                out.push((rel, std::fs::read(&p).unwrap()));
            }
        }
    }
    let mut out = Vec::new();
    walk(root, root, &mut out);
    out.sort();
    // The plate name differs only through the root name, which is not stored.
    out
}
