//! Timings of the top-hat, focus, threshold, label and count functions at the sizes of shared/docs/performance.md.
//!
//! `cargo run --release -p hcsflow-ops --example bench_tophat_focus_count [-- --repeats N] [--only NAME,..]`
//!
//! Inputs: the peer benchmark's cached arrays when present
//! (`$PEERBENCH_DATA/cells_2048x2048_s0.npy`, `zstack_30x2048x2048_s0.npy`, written by
//! `shared/bench/bench_skimage.py`), so both sides time the same pixels; otherwise a
//! synthetic field of Gaussian nuclei. Prints one line per function: median and min
//! seconds, and the blob count for blob_log (compare with the peer's `blobs=` note).

use std::path::PathBuf;
use std::time::Instant;

use hcsflow_core::Stack;
use hcsflow_ops::count::{blob_log, count_cells, BlobLogParams, CountMethod};
use hcsflow_ops::focus::{focus_stack, FocusMethod};
use hcsflow_ops::label::{label_plane, Connectivity};
use hcsflow_ops::threshold::{threshold_otsu, ThresholdMethod};
use hcsflow_ops::tophat::{tophat, white_tophat};
use ndarray::Array3;

fn data_dir() -> PathBuf {
    std::env::var_os("PEERBENCH_DATA").map(PathBuf::from).unwrap_or_else(|| std::env::temp_dir().join("peerbench-data"))
}

/// Minimal .npy reader for C-order little-endian uint16 arrays.
fn read_npy_u16(path: &PathBuf) -> Option<(Vec<usize>, Vec<u16>)> {
    let bytes = std::fs::read(path).ok()?;
    if bytes.get(..6)? != b"\x93NUMPY" {
        return None;
    }
    let (hlen, start) = if bytes[6] == 1 {
        (u16::from_le_bytes([bytes[8], bytes[9]]) as usize, 10)
    } else {
        (u32::from_le_bytes([bytes[8], bytes[9], bytes[10], bytes[11]]) as usize, 12)
    };
    let header = std::str::from_utf8(bytes.get(start..start + hlen)?).ok()?;
    if !header.contains("'<u2'") || header.contains("'fortran_order': True") {
        return None;
    }
    let shape_txt = header.split("'shape': (").nth(1)?.split(')').next()?;
    let shape: Vec<usize> = shape_txt.split(',').filter_map(|t| t.trim().parse().ok()).collect();
    let data = bytemuck_free_u16(&bytes[start + hlen..]);
    (data.len() == shape.iter().product::<usize>()).then_some((shape, data))
}

fn bytemuck_free_u16(b: &[u8]) -> Vec<u16> {
    b.chunks_exact(2).map(|c| u16::from_le_bytes([c[0], c[1]])).collect()
}

/// Synthetic stand-in: Gaussian nuclei (σ 2.5–6) on a background of 300, defocus per plane.
fn synthetic(nz: usize, n: usize, seed: u64) -> Array3<u16> {
    let mut s = seed | 1;
    let mut rnd = move || {
        s ^= s << 13;
        s ^= s >> 7;
        s ^= s << 17;
        (s >> 11) as f32 / (1u64 << 53) as f32
    };
    let cells: Vec<(f32, f32, f32, f32)> =
        (0..n * n / 1400).map(|_| (rnd() * n as f32, rnd() * n as f32, 2.5 + 3.5 * rnd(), 800.0 + 7200.0 * rnd())).collect();
    let mut clean = vec![0f32; n * n];
    for &(cy, cx, sg, a) in &cells {
        let r = (3.0 * sg) as i64 + 1;
        for y in (cy as i64 - r).max(0)..(cy as i64 + r + 1).min(n as i64) {
            for x in (cx as i64 - r).max(0)..(cx as i64 + r + 1).min(n as i64) {
                let d2 = (y as f32 - cy).powi(2) + (x as f32 - cx).powi(2);
                clean[y as usize * n + x as usize] += a * (-d2 / (2.0 * sg * sg)).exp();
            }
        }
    }
    Array3::from_shape_fn((nz, n, n), |(z, y, x)| {
        let f = 1.0 / (1.0 + (z as f32 - nz as f32 / 2.0).abs() * 0.3);
        (clean[y * n + x] * f + 300.0 + 20.0 * rnd()) as u16
    })
}

/// CPU time of this process (all threads), seconds, from /proc/self/stat (0 if unavailable).
fn cpu_seconds() -> f64 {
    let Ok(stat) = std::fs::read_to_string("/proc/self/stat") else { return 0.0 };
    let Some(rest) = stat.rsplit(')').next() else { return 0.0 };
    let f: Vec<&str> = rest.split_whitespace().collect();
    let ticks = |i: usize| f.get(i).and_then(|v| v.parse::<f64>().ok()).unwrap_or(0.0);
    (ticks(11) + ticks(12)) / 100.0 // utime, stime (fields 14, 15), clock ticks of 10 ms
}

/// Median wall and CPU seconds; on a loaded machine compare CPU time (the peer's
/// `cpu_median_s` is the same measure).
fn time<R>(name: &str, repeats: usize, mut f: impl FnMut() -> R, note: impl Fn(&R) -> String) {
    if ONLY.get().is_some_and(|only| !only.split(',').any(|o| name.contains(o))) {
        return;
    }
    let r = f(); // warm-up
    let mut t: Vec<(f64, f64)> = (0..repeats)
        .map(|_| {
            let (s, c) = (Instant::now(), cpu_seconds());
            std::hint::black_box(f());
            (s.elapsed().as_secs_f64(), cpu_seconds() - c)
        })
        .collect();
    t.sort_by(|a, b| a.0.total_cmp(&b.0));
    let mut cpu: Vec<f64> = t.iter().map(|v| v.1).collect();
    cpu.sort_by(f64::total_cmp);
    let load = std::fs::read_to_string("/proc/loadavg").unwrap_or_default();
    let load = load.split_whitespace().next().unwrap_or("?").to_string();
    println!(
        "{name:<40} median {:>8.4} s   min {:>8.4} s   cpu {:>8.4} s   load {load:>5}   {}",
        t[t.len() / 2].0,
        t[0].0,
        cpu[cpu.len() / 2],
        note(&r)
    );
}

/// `--only a,b`: time only the functions whose name contains one of these.
static ONLY: std::sync::OnceLock<String> = std::sync::OnceLock::new();

fn main() {
    if let Some(only) = std::env::args().skip_while(|a| a != "--only").nth(1) {
        let _ = ONLY.set(only);
    }
    let repeats = std::env::args().skip_while(|a| a != "--repeats").nth(1).and_then(|v| v.parse().ok()).unwrap_or(5);
    let dir = data_dir();
    let img = match read_npy_u16(&dir.join("cells_2048x2048_s0.npy")) {
        Some((s, d)) if s.len() == 2 => {
            println!("image: {} (peer data)", dir.join("cells_2048x2048_s0.npy").display());
            Array3::from_shape_vec((1, s[0], s[1]), d).expect("shape")
        }
        _ => {
            println!("image: synthetic 2048² (peer data not found in {})", dir.display());
            synthetic(1, 2048, 7)
        }
    };
    let zs = match read_npy_u16(&dir.join("zstack_30x2048x2048_s0.npy")) {
        Some((s, d)) if s.len() == 3 => {
            println!("z-stack: peer data");
            Array3::from_shape_vec((s[0], s[1], s[2]), d).expect("shape")
        }
        _ => {
            println!("z-stack: synthetic 30×2048²");
            synthetic(30, 2048, 8)
        }
    };
    println!("threads: {}", rayon::current_num_threads());
    let img = Stack::from(img);
    let zs = Stack::from(zs);
    time("white_tophat exact disk r15 2048²", repeats.min(3), || white_tophat(&img, 15).expect("tophat"), |_| String::new());
    time("white_tophat exact disk r50 2048²", repeats.min(3), || white_tophat(&img, 50).expect("tophat"), |_| String::new());
    time("tophat r50 ds4 (OpenHCS) 2048²", repeats, || tophat(&img, 50, 4).expect("tophat"), |_| String::new());
    time("focus_stack log σ1 30×2048²", repeats.min(3), || focus_stack(&zs, 1.0, FocusMethod::Log).expect("focus"), |_| String::new());
    time(
        "focus_stack weighted σ1 30×2048²",
        repeats.min(3),
        || focus_stack(&zs, 1.0, FocusMethod::Weighted).expect("focus"),
        |_| String::new(),
    );
    // blob_log on the min-max normalised f32 image, as the peer benchmark does.
    let Stack::U16(a) = &img else { unreachable!() };
    let (lo, hi) = a.pixels().iter().fold((u16::MAX, 0u16), |(l, h), &v| (l.min(v), h.max(v)));
    let norm: Vec<f32> = a.pixels().iter().map(|&v| (v as f32 - lo as f32) / (hi as f32 - lo as f32)).collect();
    let (h, w) = (a.dim().1, a.dim().2);
    time(
        "blob_log 10 scales 2048²",
        repeats.min(3),
        || blob_log(&norm, h, w, &BlobLogParams::default()).expect("blob_log"),
        |b| format!("blobs={}", b.len()),
    );
    // `--dump-blobs PATH`: write the detections (y,x,sigma) to compare with skimage's.
    if let Some(path) = std::env::args().skip_while(|a| a != "--dump-blobs").nth(1) {
        let blobs = blob_log(&norm, h, w, &BlobLogParams::default()).expect("blob_log");
        let text: String = blobs.iter().map(|b| format!("{},{},{}\n", b.y, b.x, b.sigma)).collect();
        std::fs::write(&path, text).expect("write blobs");
    }
    let plane: Vec<u16> = a.pixels().to_vec();
    time("threshold_otsu 2048²", repeats, || threshold_otsu(&plane).expect("otsu"), |t| format!("t={t}"));
    let t = threshold_otsu(&plane).expect("otsu");
    let mask: Vec<u16> = plane.iter().map(|&v| u16::from(v as f64 > t)).collect();
    time("label 8-conn 2048²", repeats, || label_plane(&mask, h, w, Connectivity::Eight), |l| format!("objects={}", l.count));
    let m = CountMethod::Threshold { method: ThresholdMethod::Otsu, connectivity: Connectivity::Eight, min_area: 10, max_area: 100_000 };
    time(
        "count_cells threshold+label+area 2048²",
        repeats,
        || count_cells(&img, &m).expect("count"),
        |c| format!("count={}", c.counts.rows[0].count),
    );
}
