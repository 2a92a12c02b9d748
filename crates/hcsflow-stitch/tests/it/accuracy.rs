//! Position accuracy against hcsflow-synth ground truth at small sizes.

use crate::common;

use common::{errors, load, Case};
use hcsflow_stitch::{tile_positions, PositionParams};

fn check(case: &Case) -> (f64, f64) {
    let dir = tempfile::tempdir().unwrap();
    let d = load(case, &dir.path().join("plate"));
    let res = tile_positions(&d.tiles, &d.layout, &PositionParams::default()).unwrap();
    let (max, mean) = errors(&res.positions, &d.truth);
    let (smax, _) = errors(&d.layout.tiles.iter().map(|t| (t.stage_x_px, t.stage_y_px)).collect::<Vec<_>>(), &d.truth);
    eprintln!(
        "{}: max {max:.3} mean {mean:.3} px (stage {smax:.2}); threshold {:.3}, nulls {:?}, {}",
        case.name,
        res.score_threshold,
        res.null_scores,
        res.message.clone().unwrap_or_default()
    );
    for e in &res.edges {
        if !e.accepted() {
            eprintln!("  edge {}-{} {} score {:.3}", e.a, e.b, e.status, e.score);
        }
    }
    assert!(!res.fell_back_to_stage, "{}: fell back", case.name);
    assert!(max <= 0.5, "{}: max error {max:.3} px", case.name);
    (max, mean)
}

#[test]
fn grid_3x3_256() {
    for (ov, jit, seed) in [(0.1, 0.02, 1), (0.2, 0.02, 2), (0.15, 0.01, 3)] {
        check(&Case { density: 1000.0, ..Case::new(3, 3, 256, ov, jit, seed) });
    }
}

#[test]
fn grid_5x5_128_fractional_steps() {
    // 128 * (1 - 0.13) = 111.36 px: fractional nominal step.
    for (ov, jit, seed) in [(0.13, 0.02, 4), (0.2, 0.015, 5)] {
        check(&Case { density: 3000.0, ..Case::new(5, 5, 128, ov, jit, seed) });
    }
}
