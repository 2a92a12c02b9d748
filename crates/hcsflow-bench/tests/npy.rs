//! .npy round trips, numpy as the oracle for reading and checksums.

use hcsflow_bench::{checksum, read_npy, write_npy};
use hcsflow_core::{DType, Stack};
use hcsflow_testkit::oracle::Oracle;
use ndarray::Array3;

/// numpy, or `None` when it is missing and may be skipped (`hcsflow_testkit::oracle`'s policy).
fn numpy() -> Option<Oracle> {
    hcsflow_testkit::oracle::require(&["numpy"], "pip install numpy")
}

#[test]
fn numpy_writes_we_read_and_checksums_agree() {
    let Some(python) = numpy() else { return };
    let dir = tempfile::tempdir().unwrap();
    let script = r#"
import hashlib, sys, numpy as np
d = sys.argv[1]
rng = np.random.default_rng(3)
arrs = {
  'u16_3d': rng.integers(0, 65536, (3, 5, 7), dtype=np.uint16),
  'u8_2d': rng.integers(0, 256, (4, 9), dtype=np.uint8),
  'f32_3d': rng.standard_normal((2, 3, 4)).astype(np.float32),
  'f64_2d': np.linspace(-1, 1, 12).reshape(3, 4),
}
for k, a in arrs.items():
    np.save(f"{d}/{k}.npy", a)
    print(k, hashlib.sha256(np.ascontiguousarray(a).tobytes()).hexdigest(), ' '.join(repr(float(v)) for v in a.ravel()))
"#;
    let out = python.run(["-c", script, dir.path().to_str().unwrap()]);
    for line in out.lines() {
        let mut parts = line.split(' ');
        let (name, sum) = (parts.next().unwrap(), parts.next().unwrap());
        let values: Vec<f64> = parts.map(|v| v.parse().unwrap()).collect();
        let s = read_npy(&dir.path().join(format!("{name}.npy"))).unwrap();
        let got: Vec<f64> = s.to_f32().iter().map(|&v| v as f64).collect();
        if name == "f64_2d" {
            // f64 is narrowed to f32 on read.
            assert!(got.iter().zip(&values).all(|(a, b)| (a - b).abs() < 1e-6), "{name}");
        } else {
            assert_eq!(got, values.iter().map(|&v| v as f32 as f64).collect::<Vec<_>>(), "{name}");
            assert_eq!(checksum(s.as_bytes()), sum, "{name}: checksum of the same bytes");
        }
    }
}

#[test]
fn we_write_numpy_reads() {
    let Some(python) = numpy() else { return };
    let dir = tempfile::tempdir().unwrap();
    let s = Stack::from(Array3::from_shape_fn((2, 3, 5), |(z, y, x)| (z * 1000 + y * 10 + x) as u16));
    let p = dir.path().join("ours.npy");
    write_npy(&p, &s).unwrap();
    let out = python.run([
        "-c",
        "import sys, numpy as np; a = np.load(sys.argv[1]); print(a.dtype, a.shape, int(a[1, 2, 4]), int(a.sum()))",
        p.to_str().unwrap(),
    ]);
    let total: u64 = s.to_f32().iter().map(|&v| v as u64).sum();
    assert_eq!(out.trim(), format!("uint16 (2, 3, 5) 1024 {total}"));
    assert_eq!(read_npy(&p).unwrap(), s);
    for dtype in DType::ALL {
        let z = Stack::zeros(dtype, [1, 2, 2]);
        write_npy(&p, &z).unwrap();
        assert_eq!(read_npy(&p).unwrap(), z);
    }
}

#[test]
fn malformed_files_name_the_file() {
    let dir = tempfile::tempdir().unwrap();
    let p = dir.path().join("bad.npy");
    std::fs::write(&p, b"not numpy at all").unwrap();
    let e = read_npy(&p).unwrap_err().to_string();
    assert!(e.contains("bad.npy") && e.contains("magic"), "{e}");
    let s = Stack::zeros(DType::U16, [2, 4, 4]);
    write_npy(&p, &s).unwrap();
    let bytes = std::fs::read(&p).unwrap();
    std::fs::write(&p, &bytes[..bytes.len() - 3]).unwrap();
    let e = read_npy(&p).unwrap_err().to_string();
    assert!(e.contains("data holds"), "{e}");
    assert!(read_npy(&dir.path().join("missing.npy")).unwrap_err().to_string().contains("missing.npy"));
}

#[test]
fn measure_reports_runs_and_propagates_errors() {
    let mut calls = 0;
    let (m, last) = hcsflow_bench::measure(2, 3, || {
        calls += 1;
        Ok::<_, String>(calls)
    })
    .unwrap();
    assert_eq!((m.runs, last, calls), (3, Some(5), 5));
    assert!(m.min_s <= m.median_s && m.median_s <= m.max_s);
    assert!(m.peak_rss_mib > 0.0);
    let err = hcsflow_bench::measure(0, 3, || Err::<(), _>("boom")).unwrap_err();
    assert_eq!(err, "boom");
}
