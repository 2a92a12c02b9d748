//! Helpers shared by the integration tests: the test plate spec, deterministic
//! pixel data, and reading back with zarrs. Not every test uses every helper.
#![allow(dead_code)]

use std::path::Path;
use std::sync::Arc;

use hcsflow_core::{DType, Stack};
use hcsflow_zarr::{FieldExtent, FieldShape, NgffVersion, PlateSpec, ZarrCompression};
use ndarray::Array3;
use zarrs::array::Array;
use zarrs::filesystem::FilesystemStore;

/// 2 wells (A01, B02) × 2 fields × t1 × c2 × z3 × 64×48 u16, 2 pyramid levels.
pub fn small_spec(version: NgffVersion) -> PlateSpec {
    PlateSpec {
        name: "test-plate".into(),
        rows: vec!["A".into(), "B".into()],
        columns: vec!["1".into(), "2".into(), "3".into()],
        wells: vec!["A01".into(), "B02".into()],
        fields_per_well: 2,
        channel_names: vec!["DAPI".into(), "GFP".into()],
        pixel_size_um: Some((0.65, 0.5)),
        z_step_um: Some(2.0),
        dtype: DType::U16,
        shape: FieldShape { t: 1, c: 2, z: 3, y: 64, x: 48 },
        pyramid_levels: 2,
        version,
        compression: ZarrCompression::Zstd(3),
        extent: FieldExtent::Fixed,
        field_positions_um: Vec::new(),
    }
}

/// `n` pseudo-random raw values for timepoint `t`, channel `c` of the field
/// of `seed`: the test generator (`hcsflow_testkit::Rng`), one stream per (seed, t, c).
pub fn values(seed: u64, t: usize, c: usize, n: usize) -> Vec<u64> {
    hcsflow_testkit::random_values(n, seed ^ ((t as u64) << 48) ^ ((c as u64) << 56), |v| v)
}

/// Seed of a (well, field) so every field holds different pixels.
pub fn seed(well: &str, field: usize) -> u64 {
    well.bytes().fold(field as u64 + 1, |a, b| a.wrapping_mul(131).wrapping_add(b as u64))
}

/// The `[Z, Y, X]` stack of channel `c`, timepoint `t` of a field.
pub fn stack(spec: &PlateSpec, seed: u64, t: usize, c: usize) -> Stack {
    let s = spec.shape;
    let (shape, v) = ((s.z, s.y, s.x), values(seed, t, c, s.z * s.y * s.x));
    let stack = match spec.dtype {
        DType::U8 => Array3::from_shape_vec(shape, v.iter().map(|&v| v as u8).collect()).map(Stack::from),
        DType::U16 => Array3::from_shape_vec(shape, v.iter().map(|&v| v as u16).collect()).map(Stack::from),
        DType::F32 => Array3::from_shape_vec(shape, v.iter().map(|&v| (v % 100_000) as f32 / 7.0).collect()).map(Stack::from),
    };
    stack.expect("z·y·x values")
}

/// All stacks of a field, indexed `[t][c]` as `write_field` wants them.
pub fn field_data(spec: &PlateSpec, seed: u64) -> Vec<Stack> {
    let s = spec.shape;
    (0..s.t * s.c).map(|i| stack(spec, seed, i / s.c, i % s.c)).collect()
}

/// Independent reference for level `k`: the mean of the level-0 pixels of each
/// `2^k` block (fewer at the edges), as f64.
pub fn reference_level(plane: &[f64], h: usize, w: usize, k: usize) -> (Vec<f64>, usize, usize) {
    let b = 1usize << k;
    let (lh, lw) = (h.div_ceil(b), w.div_ceil(b));
    let mut out = Vec::with_capacity(lh * lw);
    for i in 0..lh {
        for j in 0..lw {
            let mut sum = 0.0;
            let mut n = 0.0;
            for y in i * b..((i + 1) * b).min(h) {
                for x in j * b..((j + 1) * b).min(w) {
                    sum += plane[y * w + x];
                    n += 1.0;
                }
            }
            out.push(sum / n);
        }
    }
    (out, lh, lw)
}

pub fn open_array(root: &Path, path: &str) -> Array<FilesystemStore> {
    let store = Arc::new(FilesystemStore::new(root).expect("store"));
    Array::open(store, path).unwrap_or_else(|e| panic!("open {path}: {e}"))
}

pub fn read_json(path: &Path) -> serde_json::Value {
    let text = std::fs::read(path).unwrap_or_else(|e| panic!("{}: {e}", path.display()));
    serde_json::from_slice(&text).unwrap_or_else(|e| panic!("{}: {e}", path.display()))
}

/// The NGFF attributes of a group: `attributes.ome` (v3) or `.zattrs` (v2).
pub fn ngff_attrs(root: &Path, group: &str, version: NgffVersion) -> serde_json::Value {
    let dir = root.join(group);
    match version {
        NgffVersion::V05 => {
            let doc = read_json(&dir.join("zarr.json"));
            assert_eq!(doc["zarr_format"], 3);
            assert_eq!(doc["node_type"], "group");
            let ome = doc["attributes"]["ome"].clone();
            assert_eq!(ome["version"], "0.5", "{}", dir.display());
            ome
        }
        NgffVersion::V04 => {
            assert_eq!(read_json(&dir.join(".zgroup"))["zarr_format"], 2);
            read_json(&dir.join(".zattrs"))
        }
    }
}
