//! `FieldExtent::Grow`: fields whose planes are not the plate's field size
//! (whole-well mosaics), each well a different size.
//!
//! Written planes are read back with zarrs and compared with an independent
//! reference: the plane itself on level 0, the block means of
//! `reference_level` on the other levels, each padded with 0 to the largest
//! well's extent, which every field of the plate gets at `finish`.

use crate::common;

use common::*;
use hcsflow_core::Stack;
use hcsflow_zarr::{FieldExtent, FieldShape, NgffVersion, PlateSpec, PlateWriter, ZarrError};
use ndarray::Array3;

/// A `h × w` u16 plane with pseudo-random pixels.
fn plane(seed: u64, c: usize, h: usize, w: usize) -> Array3<u16> {
    Array3::from_shape_vec((1, h, w), values(seed, 0, c, h * w).iter().map(|&v| v as u16).collect()).expect("h·w values")
}

fn grow_spec(version: NgffVersion) -> PlateSpec {
    PlateSpec {
        fields_per_well: 1,
        shape: FieldShape { t: 1, c: 2, z: 1, y: 16, x: 12 },
        pyramid_levels: 3,
        extent: FieldExtent::Grow,
        ..small_spec(version)
    }
}

/// Level `k` of `plane` padded with 0 to `(ly, lx)`, as the reference says.
fn expected_level(p: &Array3<u16>, k: usize, (ly, lx): (usize, usize)) -> Vec<u16> {
    let (h, w) = (p.shape()[1], p.shape()[2]);
    let f: Vec<f64> = p.iter().map(|v| f64::from(*v)).collect();
    let (lev, lh, lw) = reference_level(&f, h, w, k);
    let mut out = vec![0u16; ly * lx];
    for i in 0..lh {
        for j in 0..lw {
            out[i * lx + j] = lev[i * lw + j].round_ties_even() as u16;
        }
    }
    out
}

#[test]
fn wells_of_different_sizes_share_the_largest_extent_padded_with_zeros() {
    for version in [NgffVersion::V05, NgffVersion::V04] {
        let dir = tempfile::tempdir().unwrap();
        let root = dir.path().join("grow.zarr");
        let spec = grow_spec(version);
        let writer = PlateWriter::create(&root, spec.clone()).unwrap();
        // A01 is taller, B02 wider; neither is a multiple of the 16 × 12 chunk.
        let sizes = [("A01", (37, 20)), ("B02", (30, 41))];
        let mut planes = Vec::new();
        for (well, (h, w)) in sizes {
            for c in 0..2 {
                let p = plane(seed(well, 0), c, h, w);
                writer.write_plane(well, 0, 0, c, 0, &Stack::from(p.clone())).unwrap();
                planes.push((well, c, p));
            }
        }
        // Rewriting a plane with a smaller one leaves nothing of the old one.
        let small = plane(99, 1, 5, 7);
        writer.write_plane("A01", 0, 0, 1, 0, &Stack::from(small.clone())).unwrap();
        planes[1].2 = small;
        writer.finish().unwrap();

        let extent: (usize, usize) = (37, 41);
        for (well, c, p) in &planes {
            let path = if *well == "A01" { "/A/1/0" } else { "/B/2/0" };
            for k in 0..3 {
                let arr = open_array(&root, &format!("{path}/{k}"));
                let (ly, lx) = (extent.0.div_ceil(1 << k), extent.1.div_ceil(1 << k));
                assert_eq!(arr.shape(), &[1, 2, 1, ly as u64, lx as u64], "{version} {well} level {k}");
                let chunk = arr.chunk_grid_shape();
                assert_eq!(&chunk[3..], &[ly.div_ceil(16usize.div_ceil(1 << k)) as u64, lx.div_ceil(12usize.div_ceil(1 << k)) as u64]);
                let subset =
                    zarrs::array::ArraySubset::new_with_ranges(&[0..1, *c as u64..*c as u64 + 1, 0..1, 0..ly as u64, 0..lx as u64]);
                let got: Vec<u16> = arr.retrieve_array_subset(&subset).unwrap();
                assert_eq!(got, expected_level(p, k, (ly, lx)), "{version} {well} c{c} level {k}");
            }
        }
        let plate = ngff_attrs(&root, "", version);
        assert_eq!(plate["plate"]["wells"].as_array().unwrap().len(), 2);
        assert_eq!(plate["plate"]["field_count"], 1);
    }
}

#[test]
fn a_resumed_plate_keeps_the_extent_on_disk_and_a_fixed_plate_refuses_other_sizes() {
    let dir = tempfile::tempdir().unwrap();
    let root = dir.path().join("grow.zarr");
    let spec = grow_spec(NgffVersion::V05);
    let big = plane(1, 0, 40, 30);
    let writer = PlateWriter::create(&root, spec.clone()).unwrap();
    writer.write_plane("A01", 0, 0, 0, 0, &Stack::from(big.clone())).unwrap();
    drop(writer);
    // Another run writes the other channel, smaller: the field keeps its extent
    // and the first run's channel its pixels.
    let writer = PlateWriter::create_or_resume(&root, spec).unwrap();
    let small = plane(2, 1, 20, 10);
    writer.write_plane("A01", 0, 0, 1, 0, &Stack::from(small.clone())).unwrap();
    writer.finish().unwrap();
    let arr = open_array(&root, "/A/1/0/0");
    assert_eq!(arr.shape(), &[1, 2, 1, 40, 30]);
    for (c, p) in [(0u64, &big), (1, &small)] {
        let subset = zarrs::array::ArraySubset::new_with_ranges(&[0..1, c..c + 1, 0..1, 0..40, 0..30]);
        let got: Vec<u16> = arr.retrieve_array_subset(&subset).unwrap();
        assert_eq!(got, expected_level(p, 0, (40, 30)), "channel {c}");
    }

    let fixed_root = dir.path().join("fixed.zarr");
    let fixed = PlateSpec { extent: FieldExtent::Fixed, ..grow_spec(NgffVersion::V05) };
    let writer = PlateWriter::create(&fixed_root, fixed).unwrap();
    match writer.write_plane("A01", 0, 0, 0, 0, &Stack::from(big)) {
        Err(ZarrError::PlaneShape { expected, got, .. }) => assert_eq!((expected, got), ([1, 16, 12], [1, 40, 30])),
        other => panic!("expected PlaneShape, got {other:?}"),
    }
}
