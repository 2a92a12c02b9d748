//! Error paths: each names what is wrong (well, field, indices, shapes,
//! dtypes, paths) and nothing is written for a rejected call.

use crate::common;

use common::*;
use hcsflow_core::{DType, Stack};
use hcsflow_zarr::{NgffVersion, PlateSpec, PlateWriter, ZarrCompression, ZarrError};

fn writer() -> (tempfile::TempDir, PlateWriter) {
    let dir = tempfile::tempdir().unwrap();
    let w = PlateWriter::create(&dir.path().join("p.zarr"), small_spec(NgffVersion::V05)).unwrap();
    (dir, w)
}

#[test]
fn wrong_plane_shape_names_everything() {
    let (_d, w) = writer();
    let e = w.write_plane("A01", 1, 0, 1, 2, &Stack::zeros(DType::U16, [1, 48, 64])).unwrap_err();
    assert!(matches!(e, ZarrError::PlaneShape { expected: [1, 64, 48], got: [1, 48, 64], .. }), "{e:?}");
    let msg = e.to_string();
    for part in ["A01", "field 1", "t=0", "c=1", "z=2", "[1, 48, 64]", "[1, 64, 48]"] {
        assert!(msg.contains(part), "'{part}' missing in: {msg}");
    }
    // A whole stack is not a plane either.
    let e = w.write_plane("A01", 0, 0, 0, 0, &Stack::zeros(DType::U16, [3, 64, 48])).unwrap_err();
    assert!(matches!(e, ZarrError::PlaneShape { .. }), "{e:?}");
    assert!(!w.root().join("A").exists(), "nothing written for rejected planes");
}

#[test]
fn wrong_dtype() {
    let (_d, w) = writer();
    let e = w.write_plane("B02", 0, 0, 0, 1, &Stack::zeros(DType::F32, [1, 64, 48])).unwrap_err();
    let msg = e.to_string();
    assert!(matches!(e, ZarrError::PlaneDType { expected: DType::U16, got: DType::F32, .. }));
    assert!(msg.contains("B02") && msg.contains("f32") && msg.contains("u16"), "{msg}");
}

#[test]
fn unknown_well_and_out_of_range_indices() {
    let (_d, w) = writer();
    let plane = Stack::zeros(DType::U16, [1, 64, 48]);
    // In the grid but not a plate well, outside the grid, and not a well name.
    for well in ["A02", "C01", "Z99", "", "01A", "A-1"] {
        let e = w.write_plane(well, 0, 0, 0, 0, &plane).unwrap_err();
        assert!(matches!(e, ZarrError::UnknownWell { .. }), "{well}: {e:?}");
        assert!(e.to_string().contains("A01, B02"), "{e}");
    }
    // Accepted spellings of the same well.
    for well in ["A01", "a1", "A001"] {
        w.write_plane(well, 0, 0, 0, 0, &plane).unwrap();
    }
    let e = w.write_plane("A01", 2, 0, 0, 0, &plane).unwrap_err();
    assert!(matches!(e, ZarrError::FieldOutOfRange { field: 2, fields_per_well: 2, .. }), "{e:?}");
    for (t, c, z, axis, index, size) in [(1, 0, 0, 't', 1, 1), (0, 2, 0, 'c', 2, 2), (0, 0, 3, 'z', 3, 3)] {
        let e = w.write_plane("A01", 0, t, c, z, &plane).unwrap_err();
        match e {
            ZarrError::IndexOutOfRange { axis: a, index: i, size: s, .. } => assert_eq!((a, i, s), (axis, index, size)),
            other => panic!("{other:?}"),
        }
    }
}

#[test]
fn write_field_checks_before_writing() {
    let (_d, w) = writer();
    let spec = w.spec().clone();
    let mut data = field_data(&spec, 1);
    data.pop();
    let e = w.write_field("A01", 0, &data).unwrap_err();
    assert!(matches!(e, ZarrError::FieldStackCount { expected: 2, got: 1, .. }), "{e:?}");
    data.push(Stack::zeros(DType::U16, [2, 64, 48]));
    let e = w.write_field("A01", 0, &data).unwrap_err();
    assert!(matches!(e, ZarrError::StackShape { t: 0, c: 1, expected: [3, 64, 48], got: [2, 64, 48], .. }), "{e:?}");
    assert!(!w.root().join("A").exists(), "a rejected field writes nothing");
}

#[test]
fn existing_non_empty_root_is_refused() {
    let dir = tempfile::tempdir().unwrap();
    std::fs::write(dir.path().join("notes.txt"), "keep me").unwrap();
    let e = PlateWriter::create(dir.path(), small_spec(NgffVersion::V05)).unwrap_err();
    assert!(matches!(e, ZarrError::RootNotEmpty { .. }), "{e:?}");
    assert!(e.to_string().contains(&dir.path().display().to_string()), "{e}");
    assert_eq!(std::fs::read_to_string(dir.path().join("notes.txt")).unwrap(), "keep me");
    // Not an hcsflow plate, so it cannot be resumed either.
    let e = PlateWriter::open_existing(dir.path()).unwrap_err();
    assert!(matches!(e, ZarrError::NotAPlate { .. }), "{e:?}");
    // An existing empty directory is fine.
    let empty = dir.path().join("empty");
    std::fs::create_dir(&empty).unwrap();
    PlateWriter::create(&empty, small_spec(NgffVersion::V04)).unwrap();
}

#[test]
fn foreign_zarr_group_is_not_resumed() {
    let dir = tempfile::tempdir().unwrap();
    std::fs::write(dir.path().join("zarr.json"), r#"{"zarr_format":3,"node_type":"group","attributes":{}}"#).unwrap();
    let e = PlateWriter::open_existing(dir.path()).unwrap_err();
    assert!(e.to_string().contains("hcsflow"), "{e}");
    std::fs::write(dir.path().join("zarr.json"), "{not json").unwrap();
    let e = PlateWriter::open_existing(dir.path()).unwrap_err();
    assert!(matches!(e, ZarrError::Json { .. }) && e.to_string().contains("zarr.json"), "{e:?}");
}

#[test]
fn invalid_specs() {
    let base = small_spec(NgffVersion::V05);
    type Edit = Box<dyn Fn(&mut PlateSpec)>;
    let cases: Vec<(&str, Edit)> = vec![
        ("channel names", Box::new(|s| s.channel_names.pop().map(drop).unwrap_or(()))),
        ("not in the plate grid", Box::new(|s| s.wells.push("C01".into()))),
        ("listed twice", Box::new(|s| s.wells.push("a1".into()))),
        ("zero padding", Box::new(|s| s.columns[0] = "01".into())),
        ("must be letters", Box::new(|s| s.rows[0] = "1".into())),
        ("≥ 1", Box::new(|s| s.shape.z = 0)),
        ("fields_per_well", Box::new(|s| s.fields_per_well = 0)),
        ("pyramid_levels", Box::new(|s| s.pyramid_levels = 0)),
        ("pixel_size_um", Box::new(|s| s.pixel_size_um = Some((0.0, 1.0)))),
        ("z_step_um", Box::new(|s| s.z_step_um = Some(f64::NAN))),
        ("zstd level", Box::new(|s| s.compression = ZarrCompression::Zstd(40))),
        ("no wells", Box::new(|s| s.wells.clear())),
    ];
    for (needle, edit) in cases {
        let mut spec = base.clone();
        edit(&mut spec);
        let dir = tempfile::tempdir().unwrap();
        let root = dir.path().join("p.zarr");
        let e = PlateWriter::create(&root, spec).unwrap_err();
        assert!(matches!(e, ZarrError::InvalidSpec(_)) && e.to_string().contains(needle), "{needle}: {e}");
        assert!(!root.exists(), "nothing created for an invalid spec");
    }
}
