//! Shared test support: deterministic inputs and the Python oracles
//! (numpy / scipy / scikit-image run by `tests/oracle/ops_oracle.py`, and by
//! `tests/oracle/tophat_focus_count_oracle.py` for top-hat, focus stacking,
//! thresholds, labelling and blob detection).
//!
//! The oracle needs `python3` with numpy, scipy and scikit-image
//! (`pip install -r .ci/requirements-oracles.txt`); a missing one is handled
//! by `hcsflow_testkit::oracle`'s policy (a failure naming the pip command,
//! always under `CI=true`; a visible skip with `HCSFLOW_SKIP_ORACLES=1` outside CI).
#![allow(dead_code)]

use std::path::{Path, PathBuf};

use hcsflow_core::{Conversions, DType, Device, Registry, Stack};
use ndarray::{Array3, ArrayD, IxDyn};
use serde_json::{json, Value};

pub use hcsflow_testkit::{random_stack, Rng};

/// A smooth image with blobs and noise, more like microscopy than white noise
/// (heavy low tail, bright spots): values in roughly [100, 0.9 × dtype max].
pub fn cells_stack(dtype: DType, shape: [usize; 3], seed: u64) -> Stack {
    let noise = random_stack(DType::F32, shape, seed ^ 0xABCD);
    let Stack::F32(noise) = noise else { unreachable!() };
    let top = match dtype {
        DType::U8 => 230.0,
        DType::U16 => 60000.0,
        DType::F32 => 60000.0,
    };
    let [_, h, w] = shape;
    let f = Array3::from_shape_fn(shape, |(z, y, x)| {
        let (fy, fx) = (y as f32 / h.max(1) as f32, x as f32 / w.max(1) as f32);
        let blobs = ((fy * 19.0 + z as f32).sin() * (fx * 23.0 + seed as f32).cos()).max(0.0).powi(3);
        (top * 0.05 + top * 0.85 * blobs + noise[[z, y, x]] * top * 2e-5).clamp(0.0, top)
    });
    Stack::from_f32_array(f, dtype)
}

/// Gaussian "nuclei" of sigma 1.5–4 on a background with noise, scaled to `top`.
/// Returns the stack and the true centres (y, x) (same on every plane).
pub fn blobs_stack(dtype: DType, shape: [usize; 3], n_blobs: usize, top: f32, noise: f32, seed: u64) -> (Stack, Vec<(f64, f64)>) {
    let mut r = Rng::new(seed);
    let [nz, h, w] = shape;
    let blobs: Vec<(f64, f64, f64, f64)> =
        (0..n_blobs).map(|_| (r.unit() * h as f64, r.unit() * w as f64, 1.5 + 2.5 * r.unit(), 0.5 + 0.5 * r.unit())).collect();
    let mut data = vec![0f32; nz * h * w];
    for z in 0..nz {
        for y in 0..h {
            for x in 0..w {
                let mut v = 0.05f64;
                for &(by, bx, s, a) in &blobs {
                    let d2 = (y as f64 - by).powi(2) + (x as f64 - bx).powi(2);
                    if d2 < 25.0 * s * s {
                        v += a * (-d2 / (2.0 * s * s)).exp();
                    }
                }
                v += noise as f64 * (r.unit() - 0.5);
                data[(z * h + y) * w + x] = (v.clamp(0.0, 1.0) * top as f64) as f32;
            }
        }
    }
    let s = Stack::from_f32_array(Array3::from_shape_vec(shape, data).unwrap(), dtype);
    (s, blobs.iter().map(|b| (b.0, b.1)).collect())
}

fn script(file: &str) -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/oracle").join(file)
}

const PIP: &str = "pip install -r .ci/requirements-oracles.txt  (numpy scipy scikit-image)";

/// A batch of reference computations run in one Python process.
pub struct Oracle {
    python: hcsflow_testkit::oracle::Oracle,
    script: PathBuf,
    dir: tempfile::TempDir,
    jobs: Vec<Value>,
}

impl Oracle {
    /// The oracle of `tests/oracle/ops_oracle.py`; `None` when it is missing
    /// and may be skipped (see `hcsflow_testkit::oracle::require`).
    pub fn new() -> Option<Oracle> {
        Oracle::for_script("ops_oracle.py")
    }

    /// The oracle of `tests/oracle/tophat_focus_count_oracle.py` (top-hat,
    /// focus stacking, thresholds, labelling, blob detection).
    pub fn tophat_focus_count() -> Option<Oracle> {
        Oracle::for_script("tophat_focus_count_oracle.py")
    }

    /// Like [`Oracle::new`], running `tests/oracle/<file>` instead.
    pub fn for_script(file: &str) -> Option<Oracle> {
        let python = hcsflow_testkit::oracle::require(&["numpy", "scipy", "skimage"], PIP)?;
        Some(Oracle { python, script: script(file), dir: tempfile::tempdir().expect("tempdir"), jobs: Vec::new() })
    }

    /// Queues `op` on `inputs` with keyword `args`; returns the job index.
    pub fn add(&mut self, op: &str, inputs: &[&Stack], args: Value) -> usize {
        let i = self.jobs.len();
        let inputs: Vec<Value> = inputs
            .iter()
            .enumerate()
            .map(|(k, s)| {
                let path = self.dir.path().join(format!("in-{i}-{k}.raw"));
                std::fs::write(&path, s.as_bytes()).expect("write oracle input");
                json!({"path": path, "dtype": s.dtype().name(), "shape": s.shape()})
            })
            .collect();
        let output = self.dir.path().join(format!("out-{i}.f64"));
        self.jobs.push(json!({"op": op, "inputs": inputs, "args": args, "output": output}));
        i
    }

    /// Runs every queued job; each result as float64 with the reference's shape.
    pub fn run(self) -> Vec<ArrayD<f64>> {
        let list = self.dir.path().join("jobs.json");
        std::fs::write(&list, serde_json::to_vec(&self.jobs).unwrap()).expect("job list");
        let stdout = self.python.run([self.script.as_os_str(), list.as_os_str()]);
        let shapes: Vec<Vec<usize>> = serde_json::from_str(&stdout).expect("oracle prints a JSON list of output shapes");
        self.jobs
            .iter()
            .zip(shapes)
            .map(|(job, shape)| {
                let path = job["output"].as_str().unwrap();
                let bytes = std::fs::read(path).expect("oracle output");
                let v: Vec<f64> = bytes.chunks_exact(8).map(|c| f64::from_le_bytes(c.try_into().unwrap())).collect();
                ArrayD::from_shape_vec(IxDyn(&shape), v).expect("output shape")
            })
            .collect()
    }
}

/// Our result as f64 values (row-major) with its shape.
pub fn values(s: &Stack) -> Vec<f64> {
    s.to_f32().iter().map(|&v| v as f64).collect()
}

/// Asserts |ours - ref| <= atol + rtol·|ref| everywhere (same number of values;
/// the reference may lack the leading axis of length 1). NaN must match NaN.
pub fn assert_close(ours: &Stack, reference: &ArrayD<f64>, atol: f64, rtol: f64, what: &str) {
    let ours_v = values(ours);
    assert_eq!(ours_v.len(), reference.len(), "{what}: {} values vs reference {:?}", ours_v.len(), reference.shape());
    let mut worst = (0.0f64, 0usize);
    for (i, (&a, &b)) in ours_v.iter().zip(reference.iter()).enumerate() {
        if a.is_nan() && b.is_nan() {
            continue;
        }
        let excess = (a - b).abs() - (atol + rtol * b.abs());
        if (excess > 0.0 || excess.is_nan()) && (excess > worst.0 || worst.0 == 0.0) {
            worst = (excess.max(f64::MIN_POSITIVE), i);
        }
    }
    if worst.0 > 0.0 {
        let i = worst.1;
        let [_, h, w] = ours.shape();
        let _ = h;
        panic!(
            "{what}: value {i} (y={}, x={} of plane {}) is {} but the reference says {} (atol {atol}, rtol {rtol})",
            (i / w.max(1)) % ours.shape()[1].max(1),
            i % w.max(1),
            i / (w * ours.shape()[1]).max(1),
            ours_v[i],
            reference.iter().nth(i).unwrap()
        );
    }
}

/// Exact equality of every value.
pub fn assert_exact(ours: &Stack, reference: &ArrayD<f64>, what: &str) {
    assert_close(ours, reference, 0.0, 0.0, what);
}

/// Runs registered function `name` with text arguments through the registry
/// on the host, as a pipeline step would.
pub fn run_registered(name: &str, args: &[&str], s: &Stack) -> Stack {
    let mut r = Registry::new();
    hcsflow_ops::register(&mut r);
    hcsflow_testkit::call(&r, &Conversions::default(), name, args, s, Device::Cpu).unwrap()
}
