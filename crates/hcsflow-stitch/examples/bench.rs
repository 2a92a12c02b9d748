//! Timing of `tile_positions` and `assemble` on a grid of TIFF tiles, e.g.
//! the tiles the ASHLAR peer benchmark writes, for a side-by-side run:
//!
//! `cargo run --release -p hcsflow-stitch --example bench -- DIR ROWS COLS OVERLAP [TRUTH_CSV]`
//!
//! `DIR` holds `img_000.tif`, `img_001.tif`, … in raster order; the layout is
//! the nominal grid of `OVERLAP` (fraction, integer step as the benchmark
//! rounds it); `TRUTH_CSV` (optional) has one `y,x` line per tile (true
//! positions) to report the error the way the peer benchmark does
//! (|(pos − pos₀) − (true − true₀)| per axis) and after removing the mean offset.
//! Prints median wall and CPU seconds of 5 runs (after one warm-up).

use std::path::PathBuf;
use std::time::Instant;

use hcsflow_core::Stack;
use hcsflow_stitch::{assemble, tile_positions, Blend, PositionParams, TileLayout};

/// User + system CPU seconds of this process (Linux `/proc/self/stat`).
fn cpu_seconds() -> f64 {
    let Ok(stat) = std::fs::read_to_string("/proc/self/stat") else { return f64::NAN };
    let Some(rest) = stat.rsplit(')').next() else { return f64::NAN };
    let f: Vec<&str> = rest.split_whitespace().collect();
    let tick = 100.0; // USER_HZ on Linux
    let u: f64 = f.get(11).and_then(|v| v.parse().ok()).unwrap_or(f64::NAN);
    let s: f64 = f.get(12).and_then(|v| v.parse().ok()).unwrap_or(f64::NAN);
    (u + s) / tick
}

fn median(mut v: Vec<f64>) -> f64 {
    v.sort_by(f64::total_cmp);
    v[v.len() / 2]
}

fn time<T>(mut f: impl FnMut() -> T) -> (f64, f64, T) {
    let mut out = f();
    let (mut wall, mut cpu) = (Vec::new(), Vec::new());
    for _ in 0..5 {
        let (t, c) = (Instant::now(), cpu_seconds());
        out = f();
        wall.push(t.elapsed().as_secs_f64());
        cpu.push(cpu_seconds() - c);
    }
    (median(wall), median(cpu), out)
}

fn main() -> Result<(), Box<dyn std::error::Error>> {
    let a: Vec<String> = std::env::args().collect();
    if a.len() < 5 {
        return Err("usage: bench DIR ROWS COLS OVERLAP [TRUTH_CSV]".into());
    }
    let dir = PathBuf::from(&a[1]);
    let (rows, cols): (u32, u32) = (a[2].parse()?, a[3].parse()?);
    let overlap: f64 = a[4].parse()?;
    let mut planes = Vec::new();
    for k in 0..rows * cols {
        planes.push(hcsflow_tiff::read_stack(&dir.join(format!("img_{k:03}.tif")))?);
    }
    let tiles = Stack::concat(&planes).ok_or("tiles differ in size or dtype")?;
    let [n, h, w] = tiles.shape();
    // The peer benchmark's nominal grid: integer steps round(size * (1 - overlap)).
    let (sx, sy) = ((w as f64 * (1.0 - overlap)).round(), (h as f64 * (1.0 - overlap)).round());
    let mut layout = TileLayout::grid(rows, cols, w, h, overlap);
    for t in &mut layout.tiles {
        t.stage_x_px = f64::from(t.col) * sx;
        t.stage_y_px = f64::from(t.row) * sy;
    }
    // Overrides for experiments: NULL_PAIRS, REFINE_ITERATIONS, REFINE_SAMPLES, MAX_SHIFT_PX.
    let env = |k: &str| std::env::var(k).ok().and_then(|v| v.parse::<f64>().ok());
    let d = PositionParams::default();
    let params = PositionParams {
        null_pairs: env("NULL_PAIRS").map_or(d.null_pairs, |v| v as usize),
        refine_iterations: env("REFINE_ITERATIONS").map_or(d.refine_iterations, |v| v as usize),
        refine_samples: env("REFINE_SAMPLES").map_or(d.refine_samples, |v| v as usize),
        max_shift_px: env("MAX_SHIFT_PX").or(d.max_shift_px),
        ..d
    };
    let (wall, cpu, res) = time(|| tile_positions(&tiles, &layout, &params));
    let res = res?;
    let acc = res.edges.iter().filter(|e| e.accepted()).count();
    println!(
        "tile_positions {rows}x{cols}x{w}: median {wall:.3} s wall, {cpu:.3} s CPU; {acc}/{} edges accepted, threads {}",
        res.edges.len(),
        rayon::current_num_threads()
    );
    if let Some(m) = &res.message {
        println!("  note: {m}");
    }
    if let Some(path) = a.get(5) {
        let text = std::fs::read_to_string(path)?;
        let truth: Vec<(f64, f64)> = text
            .lines()
            .filter_map(|l| {
                let mut it = l.split(',').map(|v| v.trim().parse::<f64>());
                match (it.next(), it.next()) {
                    (Some(Ok(y)), Some(Ok(x))) => Some((x, y)),
                    _ => None,
                }
            })
            .collect();
        if truth.len() == n {
            let p = &res.positions;
            let rel = (0..n)
                .flat_map(|k| {
                    [((p[k].0 - p[0].0) - (truth[k].0 - truth[0].0)).abs(), ((p[k].1 - p[0].1) - (truth[k].1 - truth[0].1)).abs()]
                })
                .fold(0.0, f64::max);
            let mx = (0..n).map(|k| p[k].0 - truth[k].0).sum::<f64>() / n as f64;
            let my = (0..n).map(|k| p[k].1 - truth[k].1).sum::<f64>() / n as f64;
            let e: Vec<f64> = (0..n).map(|k| ((p[k].0 - truth[k].0 - mx).powi(2) + (p[k].1 - truth[k].1 - my).powi(2)).sqrt()).collect();
            println!(
                "  error vs truth: max per-axis relative to tile 0 {rel:.3} px (the peer benchmark's metric); mean-offset-removed max {:.3} / mean {:.3} px",
                e.iter().copied().fold(0.0, f64::max),
                e.iter().sum::<f64>() / n as f64
            );
        }
    }
    let (wall, cpu, m) = time(|| assemble(&tiles, &res.positions, Blend::Linear));
    let [_, mh, mw] = m?.shape();
    println!("assemble linear {mh}x{mw} ({:.1} MPix): median {wall:.3} s wall, {cpu:.3} s CPU", (mh * mw) as f64 / 1e6);
    Ok(())
}
