//! Test support shared by the hcsflow crates (a dev-dependency only).
//!
//! - [`random_stack`]: deterministic pseudo-random stacks over a dtype's range,
//!   and [`random_values`]: the same generator's raw values, mapped by the caller.
//! - [`snapshot`]: every file and folder under a root with its size and
//!   modification time, to assert that an input plate was left untouched.
//! - [`oracle`]: Python programs (numpy, scipy, scikit-image, tifffile, zarr)
//!   as independent references, with the one policy for a missing one: a
//!   test failure naming the package and the pip command, never a skip under
//!   `CI=true`; outside CI `HCSFLOW_SKIP_ORACLES=1` skips with a visible
//!   `SKIPPED:` line.

pub mod oracle;

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::time::SystemTime;

use hcsflow_core::{DType, Stack};
use ndarray::Array3;

/// Deterministic pseudo-random stack (xorshift64 seeded by `seed`), values
/// spread over the dtype's range: all of u8 and u16, and f32 in [-1000, 1000]
/// in steps of 1e-3.
pub fn random_stack(dtype: DType, shape: [usize; 3], seed: u64) -> Stack {
    let mut next = xorshift(seed);
    let n = shape.iter().product();
    let f: Vec<f32> = (0..n)
        .map(|_| match dtype {
            DType::U8 => (next() % 256) as f32,
            DType::U16 => (next() % 65536) as f32,
            DType::F32 => (next() % 2_000_001) as f32 / 1000.0 - 1000.0,
        })
        .collect();
    match Array3::from_shape_vec(shape, f) {
        Ok(a) => Stack::from_f32_array(a, dtype),
        Err(_) => unreachable!("shape.product() values"),
    }
}

/// `n` deterministic values: `f` of each successive output of the
/// generator [`random_stack`] uses (xorshift64 seeded by `seed`), for tests
/// that need raw values in a range of their own.
pub fn random_values<T>(n: usize, seed: u64, mut f: impl FnMut(u64) -> T) -> Vec<T> {
    let mut next = xorshift(seed);
    (0..n).map(|_| f(next())).collect()
}

/// xorshift64, its state spread from `seed` (never zero).
fn xorshift(seed: u64) -> impl FnMut() -> u64 {
    let mut s = seed.wrapping_mul(0x9E37_79B9_7F4A_7C15) | 1;
    move || {
        s ^= s << 13;
        s ^= s >> 7;
        s ^= s << 17;
        s
    }
}

/// Whether this process runs in CI (`CI` is `true` or `1`, as CI services
/// set it): where tests never skip for a missing tool.
pub fn in_ci() -> bool {
    std::env::var("CI").is_ok_and(|v| v == "true" || v == "1")
}

/// What [`snapshot`] records of one entry.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Entry {
    pub len: u64,
    pub modified: SystemTime,
    pub is_dir: bool,
}

/// Every file and folder below `root` (not `root` itself), by path. Two equal
/// snapshots mean nothing was added, removed, resized or rewritten.
///
/// # Panics
/// If the tree cannot be read: this is for tests.
pub fn snapshot(root: &Path) -> BTreeMap<PathBuf, Entry> {
    let mut out = BTreeMap::new();
    let mut folders = vec![root.to_path_buf()];
    while let Some(d) = folders.pop() {
        let entries = std::fs::read_dir(&d).unwrap_or_else(|e| panic!("{}: {e}", d.display()));
        for e in entries {
            let e = e.unwrap_or_else(|e| panic!("{}: {e}", d.display()));
            let m = e.metadata().unwrap_or_else(|err| panic!("{}: {err}", e.path().display()));
            if m.is_dir() {
                folders.push(e.path());
            }
            let modified = m.modified().unwrap_or_else(|err| panic!("{}: {err}", e.path().display()));
            out.insert(e.path(), Entry { len: m.len(), modified, is_dir: m.is_dir() });
        }
    }
    out
}
