//! Position accuracy and timings on full-size synthetic plates.
//!
//! `cargo run --release -p hcsflow-stitch --example accuracy [-- --quick]`
//!
//! For each case, hcsflow-synth writes one well (ImageXpress layout, one
//! channel), the tiles are read back with hcsflow-plate/hcsflow-tiff, the layout
//! comes from the plate's stage positions (nominal grid; the jitter is what
//! registration must find), and the positions are compared with
//! `ground_truth` after removing the mean offset. Prints a Markdown table:
//! max / mean Euclidean error, the stage error for reference, the median of 3
//! timed runs of `tile_positions`, and of `assemble` (linear blending).

#[path = "../tests/common/mod.rs"]
mod common;

use std::time::Instant;

use common::{errors, load, Case};
use hcsflow_stitch::{assemble, tile_positions, Blend, PositionParams};

fn median(mut v: Vec<f64>) -> f64 {
    v.sort_by(f64::total_cmp);
    v[v.len() / 2]
}

fn main() {
    let quick = std::env::args().any(|a| a == "--quick");
    let mut cases = Vec::new();
    // (rows, cols, size): the two sizes.
    let sizes: &[(u32, u32, u32)] = if quick { &[(3, 3, 512), (5, 5, 256)] } else { &[(3, 3, 2048), (10, 10, 1024)] };
    for &(r, c, s) in sizes {
        // 0.07 gives a fractional nominal step (2048·0.93 = 1904.64, 1024·0.93 = 952.32).
        for (ov, jit, seed) in
            [(0.05, 0.02, 1), (0.07, 0.02, 2), (0.10, 0.01, 3), (0.10, 0.02, 4), (0.15, 0.02, 5), (0.20, 0.02, 6), (0.07, 0.015, 7)]
        {
            cases.push(Case::new(r, c, s, ov, jit, seed));
        }
    }
    let root = std::env::temp_dir().join(format!("hcsflow-stitch-accuracy-{}", std::process::id()));
    println!("| case | tiles | edges accepted | max err px | mean err px | stage max err px | positions s | assemble s (MPix) |");
    println!("|---|---|---|---|---|---|---|---|");
    let mut worst: f64 = 0.0;
    for case in &cases {
        let dir = root.join("plate");
        let d = load(case, &dir);
        let params = PositionParams::default();
        let mut times = Vec::new();
        let mut res = None;
        for _ in 0..3 {
            let t = Instant::now();
            let r = tile_positions(&d.tiles, &d.layout, &params).expect("tile_positions");
            times.push(t.elapsed().as_secs_f64());
            res = Some(r);
        }
        let res = res.expect("ran");
        let (max, mean) = errors(&res.positions, &d.truth);
        let stage: Vec<(f64, f64)> = d.layout.tiles.iter().map(|t| (t.stage_x_px, t.stage_y_px)).collect();
        let (smax, _) = errors(&stage, &d.truth);
        let mut at = Vec::new();
        let mut mpix = 0.0;
        for _ in 0..3 {
            let t = Instant::now();
            let m = assemble(&d.tiles, &res.positions, Blend::Linear).expect("assemble");
            at.push(t.elapsed().as_secs_f64());
            let [_, h, w] = m.shape();
            mpix = (h * w) as f64 / 1e6;
        }
        let acc = res.edges.iter().filter(|e| e.accepted()).count();
        println!(
            "| {} | {} | {}/{} | {:.3} | {:.3} | {:.2} | {:.3} | {:.3} ({:.1}) |",
            case.name,
            d.tiles.depth(),
            acc,
            res.edges.len(),
            max,
            mean,
            smax,
            median(times),
            median(at),
            mpix
        );
        if let Some(m) = &res.message {
            println!("|   note: {m} |||||||");
        }
        worst = worst.max(max);
        let _ = std::fs::remove_dir_all(&dir);
    }
    let _ = std::fs::remove_dir_all(&root);
    println!("\nworst max error: {worst:.3} px (target <= 0.5)");
}
