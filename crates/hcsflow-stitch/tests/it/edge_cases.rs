//! Blank tiles, strips, missing tiles, total failure, and assembly.

use crate::common;

use common::{errors, load, Case};
use hcsflow_core::Stack;
use hcsflow_stitch::{assemble, tile_positions, Blend, PositionParams, TileLayout};
use ndarray::Array3;

fn case(rows: u32, cols: u32, seed: u64) -> Case {
    Case { density: 1000.0, ..Case::new(rows, cols, 256, 0.12, 0.02, seed) }
}

#[test]
fn blank_tile_gets_stage_position_and_is_reported() {
    let dir = tempfile::tempdir().unwrap();
    let mut d = load(&case(3, 3, 11), &dir.path().join("p"));
    let blank = 4;
    if let Stack::U16(a) = &mut d.tiles {
        a.plane_mut(blank).fill(220);
    }
    let res = tile_positions(&d.tiles, &d.layout, &PositionParams::default()).unwrap();
    assert_eq!(res.stage_only, vec![blank], "{}", res.to_csv());
    assert!(!res.fell_back_to_stage);
    assert!(res.message.as_deref().unwrap_or("").contains("stage position"));
    // Every edge of the blank tile is rejected for its score.
    for e in res.edges.iter().filter(|e| e.a == blank || e.b == blank) {
        assert!(!e.accepted(), "{e:?}");
    }
    // The others are registered; the blank one is within the stage error.
    let others: Vec<usize> = (0..9).filter(|&k| k != blank).collect();
    let pick = |v: &[(f64, f64)]| others.iter().map(|&k| v[k]).collect::<Vec<_>>();
    let (max, _) = errors(&pick(&res.positions), &pick(&d.truth));
    assert!(max <= 0.5, "max error {max}");
    let (all, _) = errors(&res.positions, &d.truth);
    assert!(all <= 2.0 * 0.02 * 256.0 * 1.5, "blank tile far off: {all}");
}

#[test]
fn one_row_and_one_column() {
    for (r, c) in [(1, 5), (5, 1)] {
        let dir = tempfile::tempdir().unwrap();
        let d = load(&case(r, c, 12), &dir.path().join("p"));
        let res = tile_positions(&d.tiles, &d.layout, &PositionParams::default()).unwrap();
        assert_eq!(res.edges.len(), 4);
        let (max, _) = errors(&res.positions, &d.truth);
        assert!(max <= 0.5, "{r}x{c}: max error {max}\n{}", res.to_csv());
        assert!(res.stage_only.is_empty());
    }
}

#[test]
fn missing_tiles() {
    // Centre of a 3x3 missing, and a corner of a 4x4 missing.
    for (n, skip) in [(3, 5), (4, 1)] {
        let dir = tempfile::tempdir().unwrap();
        let mut c = case(n, n, 13);
        c.skip_sites = vec![skip];
        let d = load(&c, &dir.path().join("p"));
        assert_eq!(d.tiles.depth() as u32, n * n - 1);
        let res = tile_positions(&d.tiles, &d.layout, &PositionParams::default()).unwrap();
        let (max, _) = errors(&res.positions, &d.truth);
        assert!(max <= 0.5, "max error {max}\n{}", res.to_csv());
        assert!(res.stage_only.is_empty());
    }
}

#[test]
fn phenix_fields_by_stage_position() {
    let dir = tempfile::tempdir().unwrap();
    let mut c = case(3, 3, 14);
    c.format = hcsflow_plate::Format::OperaPhenix;
    let d = load(&c, &dir.path().join("p"));
    let res = tile_positions(&d.tiles, &d.layout, &PositionParams::default()).unwrap();
    let (max, _) = errors(&res.positions, &d.truth);
    assert!(max <= 0.5, "max error {max}\n{}", res.to_csv());
}

#[test]
fn all_blank_falls_back_to_stage_and_says_so() {
    let tiles = Stack::from(Array3::<u16>::from_elem((4, 64, 64), 300));
    let layout = TileLayout::grid(2, 2, 64, 64, 0.1);
    let res = tile_positions(&tiles, &layout, &PositionParams::default()).unwrap();
    assert!(res.fell_back_to_stage);
    assert!(res.message.as_deref().unwrap_or("").contains("alignment impossible"));
    let stage: Vec<(f64, f64)> = layout.tiles.iter().map(|t| (t.stage_x_px, t.stage_y_px)).collect();
    assert_eq!(res.positions, stage);
    assert!(res.to_csv().lines().count() == 5);
}

#[test]
fn errors_not_panics_on_bad_input() {
    let tiles = Stack::from(Array3::<u16>::zeros((3, 16, 16)));
    let layout = TileLayout::grid(2, 2, 16, 16, 0.1);
    assert!(tile_positions(&tiles, &layout, &PositionParams::default()).is_err());
    assert!(tile_positions(&Stack::from(Array3::<u16>::zeros((0, 16, 16))), &TileLayout::default(), &PositionParams::default()).is_err());
    assert!(assemble(&tiles, &[(0.0, 0.0)], Blend::Linear).is_err());
    assert!(assemble(&tiles, &[(0.0, 0.0), (f64::NAN, 1.0), (2.0, 2.0)], Blend::Linear).is_err());
    let bad = PositionParams { max_residual_px: -1.0, ..PositionParams::default() };
    assert!(tile_positions(&Stack::from(Array3::<u16>::zeros((4, 16, 16))), &layout, &bad).is_err());
}

/// A smooth field and tiles cut from it at integer positions.
fn field_tiles(pos: &[(usize, usize)], t: usize) -> (Array3<f32>, Stack) {
    let (fh, fw) = (300, 300);
    let f = Array3::from_shape_fn((1, fh, fw), |(_, y, x)| 100.0 + 0.5 * x as f32 + 0.25 * y as f32);
    let mut a = Array3::<f32>::zeros((pos.len(), t, t));
    for (k, &(x, y)) in pos.iter().enumerate() {
        for r in 0..t {
            for c in 0..t {
                a[[k, r, c]] = f[[0, y + r, x + c]];
            }
        }
    }
    (f, Stack::from(a))
}

#[test]
fn assemble_integer_positions_reproduces_the_field() {
    let pos = [(0usize, 0usize), (90, 3), (2, 95), (93, 91)];
    let (f, tiles) = field_tiles(&pos, 100);
    let fpos: Vec<(f64, f64)> = pos.iter().map(|&(x, y)| (x as f64, y as f64)).collect();
    for blend in [Blend::Linear, Blend::None, Blend::Max] {
        let m = assemble(&tiles, &fpos, blend).unwrap();
        assert_eq!(m.shape(), [1, 195, 193]);
        let Stack::F32(m) = m else { panic!("dtype") };
        // Every covered pixel equals the field (tiles agree where they overlap).
        for y in 0..195 {
            for x in 0..193 {
                let covered = pos.iter().any(|&(px, py)| x >= px && x < px + 100 && y >= py && y < py + 100);
                if covered {
                    assert!((m[[0, y, x]] - f[[0, y, x]]).abs() < 1e-3, "{blend:?} at {y},{x}");
                } else {
                    assert_eq!(m[[0, y, x]], 0.0);
                }
            }
        }
    }
}

#[test]
fn assemble_subpixel_and_dtype() {
    // Linear field: bilinear shift by (0.5, 0.25) is exact inside the tile.
    let (f, tiles) = field_tiles(&[(10, 10)], 50);
    let m = assemble(&tiles, &[(3.5, 7.25)], Blend::Linear).unwrap();
    let Stack::F32(m) = m else { panic!("dtype") };
    assert_eq!(m.dim(), (1, 50, 50));
    // Canvas (r, c) is at position (3 + c, 7 + r): tile coordinate (c - 0.5, r - 0.25).
    for r in 1..50 {
        for c in 1..50 {
            let expect = f[[0, 10 + r, 10 + c]] - 0.5 * 0.5 - 0.25 * 0.25;
            assert!((m[[0, r, c]] - expect).abs() < 1e-3);
        }
    }
    let u = Stack::from(Array3::<u16>::from_elem((2, 8, 8), 1000));
    let m = assemble(&u, &[(0.0, 0.0), (6.0, 0.0)], Blend::Linear).unwrap();
    assert!(matches!(&m, Stack::U16(a) if a.dim() == (1, 8, 14) && a.pixels().iter().all(|&v| v == 1000)));
}

/// `prepare_window` once filled the windows of a stack not in standard layout
/// with zeros, so every edge scored 0 and each tile fell back to its stage
/// position. A stack is now always in standard layout, whatever it is built from.
#[test]
fn tiles_not_in_standard_layout_give_the_same_positions() {
    let dir = tempfile::tempdir().unwrap();
    let d = load(&case(2, 2, 21), &dir.path().join("p"));
    let Stack::U16(a) = &d.tiles else { panic!("u16 tiles") };
    // The same pixels with Y and X swapped in memory: not standard layout.
    let swapped = a.clone().into_array().permuted_axes([0, 2, 1]).as_standard_layout().into_owned().permuted_axes([0, 2, 1]);
    assert!(!swapped.is_standard_layout());
    let tiles = Stack::from(swapped);
    let want = tile_positions(&d.tiles, &d.layout, &PositionParams::default()).unwrap();
    assert!(want.stage_only.is_empty(), "{}", want.to_csv());
    let got = tile_positions(&tiles, &d.layout, &PositionParams::default()).unwrap();
    assert_eq!(got.positions, want.positions, "{}", got.to_csv());
    assert_eq!(got.stage_only, want.stage_only);
}
