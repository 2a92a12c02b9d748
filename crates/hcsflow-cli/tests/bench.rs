//! `hcsflow bench op`: times a registered function on a .npy input, reports the
//! input checksum numpy computes for the same array, and saves a correct result.

use std::process::Command;

fn numpy_available() -> bool {
    if Command::new("python3").args(["-c", "import numpy"]).status().map(|s| s.success()).unwrap_or(false) {
        return true;
    }
    if std::env::var("HCSFLOW_SKIP_ORACLES").as_deref() == Ok("1") {
        println!("SKIPPED: numpy oracle not available (HCSFLOW_SKIP_ORACLES=1)");
        return false;
    }
    panic!("the numpy oracle is missing: pip install numpy (or set HCSFLOW_SKIP_ORACLES=1)");
}

#[test]
fn bench_op_reports_checksum_timings_and_a_correct_result() {
    if !numpy_available() {
        return;
    }
    let dir = tempfile::tempdir().unwrap();
    let (input, output) = (dir.path().join("in.npy"), dir.path().join("out.npy"));
    let make = r#"
import hashlib, sys, numpy as np
a = np.random.default_rng(5).integers(0, 65536, (6, 33, 47), dtype=np.uint16)
np.save(sys.argv[1], a)
print(hashlib.sha256(a.tobytes()).hexdigest())
"#;
    let o = Command::new("python3").args(["-c", make, input.to_str().unwrap()]).output().unwrap();
    assert!(o.status.success(), "{}", String::from_utf8_lossy(&o.stderr));
    let sum = String::from_utf8(o.stdout).unwrap().trim().to_string();

    let o = Command::new(env!("CARGO_BIN_EXE_hcsflow"))
        .args(["bench", "op", "max_projection", "--input", input.to_str().unwrap(), "--repeats", "3", "--save-output", output.to_str().unwrap(), "--label", "zproj_max"])
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

    let check = "import sys, numpy as np; a = np.load(sys.argv[1]); o = np.load(sys.argv[2]); print(bool((o[0] == a.max(0)).all()), o.dtype)";
    let o = Command::new("python3").args(["-c", check, input.to_str().unwrap(), output.to_str().unwrap()]).output().unwrap();
    assert_eq!(String::from_utf8_lossy(&o.stdout).trim(), "True uint16");
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
