//! Test support for the part-B functions: deterministic inputs and the Python
//! oracle `tests/oracle/ops_b_oracle.py` (numpy / scipy / scikit-image).
//!
//! A missing oracle is handled by `hcsflow_testkit::oracle`'s policy (see `common::Oracle`).
#![allow(dead_code)]

use hcsflow_core::{DType, Stack};
use ndarray::{Array3, ArrayD};
use serde_json::Value;

pub use hcsflow_testkit::{random_stack, Rng};

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

#[path = "../common/mod.rs"]
mod common;

/// The shared oracle runner of `tests/common`, pointed at `ops_b_oracle.py`,
/// with one input per job.
pub struct Oracle(common::Oracle);

impl Oracle {
    /// `None` when the oracle is missing and may be skipped (see `common::Oracle::new`).
    pub fn new() -> Option<Oracle> {
        common::Oracle::for_script("ops_b_oracle.py").map(Oracle)
    }

    /// Queues `op` on `input` with keyword `args`; returns the job index.
    pub fn add(&mut self, op: &str, input: &Stack, args: Value) -> usize {
        self.0.add(op, &[input], args)
    }

    /// Runs every queued job; each result as float64 with the reference's shape.
    pub fn run(self) -> Vec<ArrayD<f64>> {
        self.0.run()
    }
}

/// Our pixels as f64, row-major.
pub fn values(s: &Stack) -> Vec<f64> {
    s.to_f32().iter().map(|&v| v as f64).collect()
}
