//! `hcsflow bench op`: times a registered function on a .npy input, reports the
//! input checksum numpy computes for the same array, and saves a correct result.

use std::process::Command;

use hcsflow_testkit::oracle::Oracle;

/// numpy, or `None` when it is missing and may be skipped (`hcsflow_testkit::oracle`'s policy).
fn numpy() -> Option<Oracle> {
    hcsflow_testkit::oracle::require(&["numpy"], "pip install numpy")
}

#[test]
fn bench_op_reports_checksum_timings_and_a_correct_result() {
    let Some(python) = numpy() else { return };
    let dir = tempfile::tempdir().unwrap();
    let (input, output) = (dir.path().join("in.npy"), dir.path().join("out.npy"));
    let make = r#"
import hashlib, sys, numpy as np
a = np.random.default_rng(5).integers(0, 65536, (6, 33, 47), dtype=np.uint16)
np.save(sys.argv[1], a)
print(hashlib.sha256(a.tobytes()).hexdigest())
"#;
    let sum = python.run(["-c", make, input.to_str().unwrap()]).trim().to_string();

    let o = Command::new(env!("CARGO_BIN_EXE_hcsflow"))
        .args([
            "bench",
            "op",
            "max_projection",
            "--input",
            input.to_str().unwrap(),
            "--repeats",
            "3",
            "--save-output",
            output.to_str().unwrap(),
            "--label",
            "zproj_max",
        ])
        .output()
        .unwrap();
    assert!(o.status.success(), "{}", String::from_utf8_lossy(&o.stderr));
    let v: serde_json::Value = serde_json::from_slice(&o.stdout).unwrap();
    assert_eq!(v["op"], "zproj_max");
    assert_eq!(v["input_sha256"], sum.as_str(), "both sides fingerprint the same bytes");
    assert_eq!(v["input_shape"], serde_json::json!([6, 33, 47]));
    assert_eq!(v["output_shape"], serde_json::json!([1, 33, 47]));
    assert_eq!(v["runs"], 3);
    let (min, med, max) = (v["min_s"].as_f64().unwrap(), v["median_s"].as_f64().unwrap(), v["max_s"].as_f64().unwrap());
    assert!(min > 0.0 && min <= med && med <= max, "{v}");
    assert!(v["peak_rss_mib"].as_f64().unwrap() > 0.0);

    let check =
        "import sys, numpy as np; a = np.load(sys.argv[1]); o = np.load(sys.argv[2]); print(bool((o[0] == a.max(0)).all()), o.dtype)";
    assert_eq!(python.run(["-c", check, input.to_str().unwrap(), output.to_str().unwrap()]).trim(), "True uint16");
}

#[test]
fn bench_op_rejects_bad_usage_before_reading() {
    let o = Command::new(env!("CARGO_BIN_EXE_hcsflow"))
        .args(["bench", "op", "max_projection", "--input", "/nonexistent.npy", "--arg", "radius=3"])
        .output()
        .unwrap();
    assert_eq!(o.status.code(), Some(2));
    assert!(String::from_utf8_lossy(&o.stderr).contains("unknown argument 'radius'"));
    let o = Command::new(env!("CARGO_BIN_EXE_hcsflow"))
        .args(["bench", "op", "max_projection", "--input", "/nonexistent.npy"])
        .output()
        .unwrap();
    assert_eq!(o.status.code(), Some(1));
    assert!(String::from_utf8_lossy(&o.stderr).contains("/nonexistent.npy"));
}

/// Tiles cut from one field of Gaussian spots at known positions: `bench stitch`
/// must report positions in `[y, x]` order that match them (relative to tile 0,
/// the peer benchmark's metric) and the SHA-256 Python's hashlib computes for
/// the tiles' pixels in raster order.
#[test]
fn bench_stitch_reports_checksum_timings_and_true_positions() {
    let Some(python) = numpy() else { return };
    let (cols, th, tw, overlap) = (3u32, 192usize, 160usize, 0.25);
    let (sy, sx) = (th as f64 * (1.0 - overlap), tw as f64 * (1.0 - overlap));
    // Stage error of each tile (dy, dx), px: the positions the stitcher has to find.
    let jitter: [(i64, i64); 6] = [(0, 0), (3, -2), (-2, 4), (2, 3), (-3, -1), (1, -4)];
    let (fh, fw) = (th + sy as usize + 16, tw + 2 * sx as usize + 16);
    let mut field = vec![300.0f32; fh * fw];
    let mut rng = hcsflow_testkit::Rng::new(12345);
    let mut next = || rng.unit();
    for _ in 0..900 {
        let (cy, cx, amp) = (next() * fh as f64, next() * fw as f64, 500.0 + 3000.0 * next());
        for y in (cy as usize).saturating_sub(8)..((cy as usize) + 9).min(fh) {
            for x in (cx as usize).saturating_sub(8)..((cx as usize) + 9).min(fw) {
                let r2 = (y as f64 - cy).powi(2) + (x as f64 - cx).powi(2);
                field[y * fw + x] += (amp * (-r2 / 8.0).exp()) as f32;
            }
        }
    }
    let dir = tempfile::tempdir().unwrap();
    let mut raw = Vec::new();
    let mut truth = Vec::new();
    for (k, &(jy, jx)) in jitter.iter().enumerate() {
        let (r, c) = (k / cols as usize, k % cols as usize);
        let y0 = (8 + (r as f64 * sy) as i64 + jy) as usize;
        let x0 = (8 + (c as f64 * sx) as i64 + jx) as usize;
        truth.push((y0 as f64, x0 as f64));
        let tile = ndarray::Array3::from_shape_fn((1, th, tw), |(_, y, x)| field[(y0 + y) * fw + x0 + x].round() as u16);
        raw.extend(tile.iter().flat_map(|v| v.to_le_bytes()));
        let opts = hcsflow_tiff::WriteOptions::default();
        hcsflow_tiff::write_stack(&dir.path().join(format!("img_{k:03}.tif")), &hcsflow_tiff::Stack::from(tile), &opts).unwrap();
    }
    let raw_path = dir.path().join("tiles.raw");
    std::fs::write(&raw_path, &raw).unwrap();
    let sum = python.run([
        "-c",
        "import hashlib, sys; print(hashlib.sha256(open(sys.argv[1], 'rb').read()).hexdigest())",
        raw_path.to_str().unwrap(),
    ]);
    let sum = sum.trim().to_string();

    let o = Command::new(env!("CARGO_BIN_EXE_hcsflow"))
        .args([
            "bench",
            "stitch",
            dir.path().to_str().unwrap(),
            "--rows",
            "2",
            "--cols",
            "3",
            "--overlap",
            "0.25",
            "--repeats",
            "2",
            "--label",
            "grid",
        ])
        .output()
        .unwrap();
    assert!(o.status.success(), "{}", String::from_utf8_lossy(&o.stderr));
    let v: serde_json::Value = serde_json::from_slice(&o.stdout).unwrap();
    assert_eq!(v["op"], "grid");
    assert_eq!(v["input_sha256"], sum.as_str(), "both sides fingerprint the same bytes");
    assert_eq!(v["input_shape"], serde_json::json!([6, th, tw]));
    assert_eq!(v["edges"], 7, "2×3 grid: 4 horizontal + 3 vertical neighbours");
    for key in ["positions", "positions_in_memory", "assemble", "assemble_in_memory"] {
        let t = &v[key];
        assert_eq!(t["runs"], 2, "{key}");
        let (min, med, max) = (t["min_s"].as_f64().unwrap(), t["median_s"].as_f64().unwrap(), t["max_s"].as_f64().unwrap());
        assert!(min > 0.0 && min <= med && med <= max, "{key}: {t}");
    }
    let pos: Vec<(f64, f64)> =
        v["positions_yx"].as_array().unwrap().iter().map(|p| (p[0].as_f64().unwrap(), p[1].as_f64().unwrap())).collect();
    assert_eq!(pos.len(), 6);
    for k in 0..6 {
        let dy = (pos[k].0 - pos[0].0) - (truth[k].0 - truth[0].0);
        let dx = (pos[k].1 - pos[0].1) - (truth[k].1 - truth[0].1);
        assert!(dy.abs() < 0.5 && dx.abs() < 0.5, "tile {k}: error ({dy:.3}, {dx:.3}) px; positions {pos:?}, truth {truth:?}");
    }
    // The mosaic spans the true extent (within a pixel).
    let extent = |i: usize, size: usize| {
        let lo = truth.iter().map(|t| if i == 0 { t.0 } else { t.1 }).fold(f64::INFINITY, f64::min);
        let hi = truth.iter().map(|t| if i == 0 { t.0 } else { t.1 }).fold(0.0, f64::max);
        hi - lo + size as f64
    };
    let m = v["mosaic_shape"].as_array().unwrap();
    assert!((m[0].as_f64().unwrap() - extent(0, th)).abs() <= 1.0, "mosaic {m:?}");
    assert!((m[1].as_f64().unwrap() - extent(1, tw)).abs() <= 1.0, "mosaic {m:?}");
}

#[test]
fn bench_stitch_rejects_bad_usage_before_reading() {
    let o = Command::new(env!("CARGO_BIN_EXE_hcsflow"))
        .args(["bench", "stitch", "/nonexistent", "--rows", "2", "--cols", "2", "--overlap", "0.1", "--blend", "soft"])
        .output()
        .unwrap();
    assert_eq!(o.status.code(), Some(2), "{}", String::from_utf8_lossy(&o.stderr));
    let o = Command::new(env!("CARGO_BIN_EXE_hcsflow"))
        .args(["bench", "stitch", "/nonexistent", "--rows", "2", "--cols", "2", "--overlap", "1.5"])
        .output()
        .unwrap();
    assert_eq!(o.status.code(), Some(2));
    let o = Command::new(env!("CARGO_BIN_EXE_hcsflow"))
        .args(["bench", "stitch", "/nonexistent", "--rows", "2", "--cols", "2", "--overlap", "0.1"])
        .output()
        .unwrap();
    assert_eq!(o.status.code(), Some(1));
    assert!(String::from_utf8_lossy(&o.stderr).contains("/nonexistent/img_000.tif"));
}
