//! Registration of a real tile set given as a Fiji TileConfiguration file.
//!
//! `cargo run --release -p hcsflow-stitch --example wsi_brain -- [DIR] [OUT] [MAX_SHIFT_PX]`
//!
//! Defaults: `DIR` = `../shared/data/basicpy/WSI_brain` (63 tiles of 512² u16,
//! nominal 9-column grid with a 460 px step), `OUT` =
//! `DIR`-independent `TileConfiguration.registered.txt` in the working folder.
//! Reports, over every neighbour pair the layout predicts, the mean Pearson
//! correlation (normalised cross-correlation) of the overlapping pixels at the
//! nominal positions and at the registered ones (bilinear sampling), raw and
//! after the band-pass the registration uses (raw intensities are dominated by
//! the shading these BaSiC demo tiles carry), and writes the registered
//! positions in the same TileConfiguration format.

use std::fmt::Write as _;
use std::path::PathBuf;
use std::time::Instant;

use hcsflow_core::Stack;
use hcsflow_stitch::{tile_positions, PositionParams, TileInfo, TileLayout};
use ndarray::{Array3, Axis};

/// Pearson r of tile `a` and tile `b` over their overlap when `b` sits at
/// `d = pos_b − pos_a` (bilinear sampling of `b`).
fn overlap_ncc(t: &Array3<f32>, a: usize, b: usize, d: (f64, f64)) -> Option<f64> {
    let (_, h, w) = t.dim();
    let ta = t.index_axis(Axis(0), a);
    let tb = t.index_axis(Axis(0), b);
    let (ix, iy) = (d.0.floor() as i64, d.1.floor() as i64);
    let (fx, fy) = (d.0 - ix as f64, d.1 - iy as f64);
    let mut s = [0f64; 5];
    let mut n = 0f64;
    for y in 0..h as i64 {
        let by = y - iy - 1; // b row below the sample point: (y - dy) in [by, by + 1]
        if by < 0 || by + 1 >= h as i64 {
            continue;
        }
        for x in 0..w as i64 {
            let bx = x - ix - 1;
            if bx < 0 || bx + 1 >= w as i64 {
                continue;
            }
            // Sample b at (x - dx, y - dy) = (bx + 1 - fx, by + 1 - fy).
            let (u, v) = (1.0 - fx, 1.0 - fy);
            let (bx, by) = (bx as usize, by as usize);
            let vb = (1.0 - u) * (1.0 - v) * f64::from(tb[[by, bx]])
                + u * (1.0 - v) * f64::from(tb[[by, bx + 1]])
                + (1.0 - u) * v * f64::from(tb[[by + 1, bx]])
                + u * v * f64::from(tb[[by + 1, bx + 1]]);
            let va = f64::from(ta[[y as usize, x as usize]]);
            s[0] += va;
            s[1] += vb;
            s[2] += va * va;
            s[3] += vb * vb;
            s[4] += va * vb;
            n += 1.0;
        }
    }
    if n < 100.0 {
        return None;
    }
    let cov = s[4] - s[0] * s[1] / n;
    let den = ((s[2] - s[0] * s[0] / n) * (s[3] - s[1] * s[1] / n)).sqrt();
    (den > 0.0).then(|| cov / den)
}

/// `img` minus its local mean over a (2r+1)² box, after a 3×3 mean (the band-pass of the registration).
fn bandpass(t: &Array3<f32>, r: usize) -> Array3<f32> {
    let (n, h, w) = t.dim();
    let boxm = |src: &Array3<f32>, k: usize, r: usize| -> Array3<f32> {
        Array3::from_shape_fn((1, h, w), |(_, y, x)| {
            let (y0, y1, x0, x1) = (y.saturating_sub(r), (y + r + 1).min(h), x.saturating_sub(r), (x + r + 1).min(w));
            let mut s = 0f32;
            for yy in y0..y1 {
                for xx in x0..x1 {
                    s += src[[k, yy, xx]];
                }
            }
            s / ((y1 - y0) * (x1 - x0)) as f32
        })
    };
    let mut out = Array3::<f32>::zeros((n, h, w));
    for k in 0..n {
        let fine = boxm(t, k, 1);
        let coarse = boxm(t, k, r);
        let mut o = out.index_axis_mut(Axis(0), k);
        o.assign(&(&fine.index_axis(Axis(0), 0) - &coarse.index_axis(Axis(0), 0)));
    }
    out
}

fn main() -> Result<(), Box<dyn std::error::Error>> {
    let args: Vec<String> = std::env::args().collect();
    let dir = PathBuf::from(args.get(1).map(String::as_str).unwrap_or("../shared/data/basicpy/WSI_brain"));
    let out = PathBuf::from(args.get(2).map(String::as_str).unwrap_or("TileConfiguration.registered.txt"));
    let text = std::fs::read_to_string(dir.join("TileConfiguration.txt"))?;
    let mut names = Vec::new();
    let mut nominal = Vec::new();
    for line in text.lines() {
        let parts: Vec<&str> = line.split(';').map(str::trim).collect();
        if parts.len() != 3 || !parts[2].starts_with('(') {
            continue;
        }
        let xy: Vec<f64> = parts[2].trim_matches(|c| c == '(' || c == ')').split(',').filter_map(|v| v.trim().parse().ok()).collect();
        if xy.len() == 2 {
            names.push(parts[0].to_string());
            nominal.push((xy[0], xy[1]));
        }
    }
    let mut planes = Vec::new();
    for n in &names {
        planes.push(hcsflow_tiff::read_stack(&dir.join(n))?);
    }
    let tiles = Stack::concat(&planes).ok_or("tiles differ in size or dtype")?;
    let [n, h, w] = tiles.shape();
    let step = nominal.iter().map(|p| p.0).filter(|&x| x > 0.0).fold(f64::INFINITY, f64::min);
    let layout = TileLayout {
        tiles: nominal
            .iter()
            .map(|&(x, y)| TileInfo { row: (y / step).round() as u32, col: (x / step).round() as u32, stage_x_px: x, stage_y_px: y })
            .collect(),
    };
    let mut params = PositionParams::default();
    if let Some(m) = args.get(3) {
        params.max_shift_px = Some(m.parse()?);
    }
    let t = Instant::now();
    let res = tile_positions(&tiles, &layout, &params)?;
    let secs = t.elapsed().as_secs_f64();
    let acc = res.edges.iter().filter(|e| e.accepted()).count();
    println!(
        "{n} tiles of {h}x{w}, {} neighbour pairs, {acc} accepted (score threshold {:.3}), {secs:.3} s",
        res.edges.len(),
        res.score_threshold
    );
    if let Some(m) = &res.message {
        println!("note: {m}");
    }
    let mut reasons: Vec<(String, usize)> = Vec::new();
    for e in res.edges.iter().filter(|e| !e.accepted()) {
        let s = e.status.to_string();
        match reasons.iter_mut().find(|(k, _)| *k == s) {
            Some((_, c)) => *c += 1,
            None => reasons.push((s, 1)),
        }
    }
    println!("rejected: {reasons:?}");
    let raw = tiles.to_f32();
    let bp = bandpass(&raw, params.highpass_radius);
    for (label, data) in [("raw", &raw), ("band-passed", &bp)] {
        let (mut before, mut after, mut count) = (0.0, 0.0, 0);
        for e in &res.edges {
            let dn = (nominal[e.b].0 - nominal[e.a].0, nominal[e.b].1 - nominal[e.a].1);
            let p = &res.positions;
            let dr = (p[e.b].0 - p[e.a].0, p[e.b].1 - p[e.a].1);
            if let (Some(x), Some(y)) = (overlap_ncc(data, e.a, e.b, dn), overlap_ncc(data, e.a, e.b, dr)) {
                before += x;
                after += y;
                count += 1;
            }
        }
        println!(
            "mean NCC of the {count} overlaps ({label}): nominal {:.4} -> registered {:.4}",
            before / f64::from(count.max(1)),
            after / f64::from(count.max(1))
        );
    }
    let dev = res.positions.iter().zip(&nominal).map(|(p, q)| ((p.0 - q.0).powi(2) + (p.1 - q.1).powi(2)).sqrt()).fold(0.0, f64::max);
    println!("largest correction of a tile relative to the nominal grid: {dev:.2} px");
    let (mx, my) = res.positions.iter().fold((f64::INFINITY, f64::INFINITY), |a, p| (a.0.min(p.0), a.1.min(p.1)));
    let mut s =
        String::from("# Registered by hcsflow-stitch (tile_positions, default parameters)\ndim = 2\n\n# Define the image coordinates\n");
    for (name, p) in names.iter().zip(&res.positions) {
        let _ = writeln!(s, "{name}; ; ({:.3}, {:.3})", p.0 - mx, p.1 - my);
    }
    std::fs::write(&out, s)?;
    println!("wrote {}", out.display());
    std::fs::write(out.with_extension("edges.csv"), res.to_csv())?;
    Ok(())
}
