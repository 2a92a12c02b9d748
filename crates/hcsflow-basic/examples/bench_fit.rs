//! Times `fit` on N synthetic tiles of 1024² u16 (default 100, `BASIC_N_FIELDS`;
//! small cells over a floor, vignetted, plus an offset) and the correction of
//! the same tiles, with peak RSS. `BASIC_WRITE_NPY=path` also writes the tiles
//! as `.npy` for the peer benchmark (`scripts/bench-basicpy.py`).
//!
//! `cargo run --release -p hcsflow-basic --example bench_fit [-- --darkfield]`

use std::time::Instant;

use hcsflow_basic::{correct, fit, BasicParams};
use hcsflow_core::Stack;
use ndarray::Array3;

fn peak_rss_mib() -> f64 {
    let status = std::fs::read_to_string("/proc/self/status").unwrap_or_default();
    let kib =
        status.lines().find_map(|l| l.strip_prefix("VmHWM:")).and_then(|v| v.trim().trim_end_matches("kB").trim().parse::<f64>().ok());
    kib.unwrap_or(0.0) / 1024.0
}

fn synthetic(n: usize, side: usize) -> Stack {
    let mut state = 0x9E37_79B9_7F4A_7C15u64;
    let mut next = move || {
        state ^= state << 13;
        state ^= state >> 7;
        state ^= state << 17;
        (state >> 11) as f64 / (1u64 << 53) as f64
    };
    let mut out = Array3::<u16>::zeros((n, side, side));
    for i in 0..n {
        let cells: Vec<(f64, f64)> = (0..400).map(|_| (next() * side as f64, next() * side as f64)).collect();
        let mut plane = out.index_axis_mut(ndarray::Axis(0), i);
        for &(cy, cx) in &cells {
            let (y0, y1) = ((cy - 12.0).max(0.0) as usize, ((cy + 12.0) as usize).min(side));
            let (x0, x1) = ((cx - 12.0).max(0.0) as usize, ((cx + 12.0) as usize).min(side));
            for y in y0..y1 {
                for x in x0..x1 {
                    let d2 = (y as f64 - cy).powi(2) + (x as f64 - cx).powi(2);
                    plane[[y, x]] = plane[[y, x]].saturating_add((800.0 * (-d2 / 32.0).exp()) as u16);
                }
            }
        }
        for ((y, x), v) in plane.indexed_iter_mut() {
            let (dy, dx) = (y as f64 / side as f64 - 0.5, x as f64 / side as f64 - 0.5);
            *v = ((f64::from(*v) + 300.0) * (1.0 - 0.8 * (dy * dy + dx * dx)) + 100.0) as u16;
        }
    }
    Stack::from(out)
}

fn main() -> Result<(), Box<dyn std::error::Error>> {
    let n: usize = std::env::var("BASIC_N_FIELDS").ok().and_then(|v| v.parse().ok()).unwrap_or(100);
    let darkfield = std::env::args().any(|a| a == "--darkfield");
    let tiles = synthetic(n, 1024);
    if let Some(path) = std::env::var_os("BASIC_WRITE_NPY") {
        // The same tiles for the peer (BaSiCPy) in the same run.
        hcsflow_bench::write_npy(std::path::Path::new(&path), &tiles)?;
    }
    let before = peak_rss_mib();
    let params = BasicParams { get_darkfield: darkfield, ..Default::default() };
    let mut times = Vec::new();
    let mut result = None;
    for _ in 0..3 {
        let t = Instant::now();
        result = Some(fit(&tiles, &params)?);
        times.push(t.elapsed().as_secs_f64());
    }
    let fitted = result.ok_or("no fit")?;
    times.sort_by(f64::total_cmp);
    let w = &fitted.working;
    println!(
        "fit{} {n}x1024²: median {:.3} s (runs {:?}); {} rounds, {} ADMM iterations; peak RSS {:.0} MiB (inputs {:.0} MiB)",
        if darkfield { "_dark" } else { "" },
        times[1],
        times.iter().map(|t| format!("{t:.3}")).collect::<Vec<_>>(),
        w.reweight_iterations,
        w.admm_iterations,
        peak_rss_mib(),
        before
    );
    let mut times = Vec::new();
    for _ in 0..3 {
        let t = Instant::now();
        let out = correct(&tiles, &fitted.profiles, 0.0, None)?;
        times.push(t.elapsed().as_secs_f64());
        drop(out);
    }
    times.sort_by(f64::total_cmp);
    println!("correct {n}x1024² u16 -> f32: median {:.3} s; peak RSS {:.0} MiB", times[1], peak_rss_mib());
    Ok(())
}
