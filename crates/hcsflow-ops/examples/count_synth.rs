//! Counting recall and precision on a synthetic plate's ground truth.
//!
//! `cargo run --release -p hcsflow-ops --example count_synth [-- SIZE]`
//!
//! Generates an ImageXpress plate with `hcsflow-synth` (2 wells × 3×3 sites, one
//! channel, one plane, tiles SIZE² (default 512), default nuclei), counts every
//! tile with `count_cells` (blob_log, and Otsu threshold + label + area ≥ 30), maps
//! detections into the well frame with the true tile positions
//! (`ground_truth/tile_positions.csv`) and matches them one-to-one, greedily by
//! distance, to the true nuclei centres (`ground_truth/nuclei.csv`) within
//! 4 px. Nuclei whose centre is within 4 px of a tile edge are left out of both
//! sides (they are cut by the tile).

use std::collections::HashMap;
use std::path::Path;

use hcsflow_ops::count::{count_cells, BlobLogParams, CountMethod};
use hcsflow_ops::label::Connectivity;
use hcsflow_ops::threshold::ThresholdMethod;
use hcsflow_synth::{generate, SynthConfig};

const MATCH_PX: f64 = 4.0;

fn read_csv(path: &Path) -> Vec<HashMap<String, String>> {
    let text = std::fs::read_to_string(path).expect("ground-truth CSV");
    let mut lines = text.lines();
    let header: Vec<String> = lines.next().unwrap_or("").split(',').map(String::from).collect();
    lines.map(|l| header.iter().cloned().zip(l.split(',').map(String::from)).collect()).collect()
}

fn num(row: &HashMap<String, String>, key: &str) -> f64 {
    row.get(key).and_then(|v| v.parse().ok()).expect("numeric CSV field")
}

fn main() {
    let size: u32 = std::env::args().nth(1).and_then(|v| v.parse().ok()).unwrap_or(512);
    let dir = tempfile::tempdir().expect("tempdir");
    let plate = dir.path().join("plate");
    let cfg = SynthConfig { channels: 1, z_planes: 1, size, ..SynthConfig::default() };
    generate(&cfg, &plate).expect("generate");
    let opened = hcsflow_plate::open_plate(&plate, None).expect("open plate");
    let tiles: HashMap<(String, u32), (f64, f64)> = read_csv(&plate.join("ground_truth/tile_positions.csv"))
        .iter()
        .map(|r| ((r["well"].clone(), num(r, "site") as u32), (num(r, "x_px"), num(r, "y_px"))))
        .collect();
    let nuclei = read_csv(&plate.join("ground_truth/nuclei.csv"));
    let methods = [
        ("blob_log (normalised)", CountMethod::BlobLog { params: BlobLogParams::default(), normalize: true }),
        (
            "otsu + label + area>=30",
            CountMethod::Threshold { method: ThresholdMethod::Otsu, connectivity: Connectivity::Eight, min_area: 30, max_area: 100_000 },
        ),
    ];
    for (name, method) in &methods {
        let (mut tp, mut n_true, mut n_found) = (0usize, 0usize, 0usize);
        for img in opened.images.iter().filter(|i| i.channel == 1) {
            let stack = hcsflow_tiff::read_stack(&img.path).expect("read tile");
            let [_, h, w] = stack.shape();
            let (tx, ty) = tiles[&(img.well.clone(), img.site)];
            let inside = |x: f64, y: f64| x >= MATCH_PX && y >= MATCH_PX && x < w as f64 - MATCH_PX && y < h as f64 - MATCH_PX;
            let truth: Vec<(f64, f64)> = nuclei
                .iter()
                .filter(|r| r["well"] == img.well)
                .map(|r| (num(r, "x_px") - tx, num(r, "y_px") - ty))
                .filter(|&(x, y)| inside(x, y))
                .collect();
            let res = count_cells(&stack, method).expect("count");
            let found: Vec<(f64, f64)> = res.objects.rows.iter().map(|r| (r.x, r.y)).filter(|&(x, y)| inside(x, y)).collect();
            // Greedy one-to-one matching by increasing distance.
            let mut pairs: Vec<(f64, usize, usize)> = Vec::new();
            for (i, t) in truth.iter().enumerate() {
                for (j, f) in found.iter().enumerate() {
                    let d = (t.0 - f.0).hypot(t.1 - f.1);
                    if d <= MATCH_PX {
                        pairs.push((d, i, j));
                    }
                }
            }
            pairs.sort_by(|a, b| a.0.total_cmp(&b.0));
            let (mut used_t, mut used_f) = (vec![false; truth.len()], vec![false; found.len()]);
            for (_, i, j) in pairs {
                if !used_t[i] && !used_f[j] {
                    used_t[i] = true;
                    used_f[j] = true;
                    tp += 1;
                }
            }
            n_true += truth.len();
            n_found += found.len();
        }
        println!(
            "{name:<26} tiles {size}²: true {n_true}, detected {n_found}, matched {tp}: recall {:.3}, precision {:.3}",
            tp as f64 / n_true.max(1) as f64,
            tp as f64 / n_found.max(1) as f64
        );
    }
}
