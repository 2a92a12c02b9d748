//! Test support shared by the hcsflow crates (a dev-dependency only).
//!
//! - [`Rng`]: the one test PRNG (xorshift64; a seed's sequence never changes),
//!   [`random_stack`]: deterministic pseudo-random stacks over a dtype's range,
//!   and [`random_values`]: the same generator's raw values, mapped by the caller.
//! - [`call`]: one registered function with text arguments on a stack, the
//!   result back on the host ([`Registry::call`]).
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

use hcsflow_core::{CallError, ConversionPolicy, Conversions, DType, Device, PlanError, Registry, Stack};
use ndarray::Array3;

/// The tests' pseudo-random generator: xorshift64 (Marsaglia, "Xorshift
/// RNGs", 2003; shifts 13, 7, 17), its state spread from the seed
/// (`seed × 0x9E37_79B9_7F4A_7C15`, low bit set so it is never zero).
///
/// The sequence of a seed is fixed: tests and fuzz corpora quote seeds, so
/// never change the algorithm. Only for tests: not cryptographic, and
/// [`Rng::below`] has a modulo bias a test cannot notice.
#[derive(Debug, Clone)]
pub struct Rng(u64);

impl Rng {
    /// The generator of `seed` (any value, 0 included).
    pub fn new(seed: u64) -> Rng {
        Rng(seed.wrapping_mul(0x9E37_79B9_7F4A_7C15) | 1)
    }

    /// The generator whose state is `state` as given (not spread; 0 becomes
    /// 1): for tests whose quoted seeds were raw xorshift64 states (the plate
    /// fuzz), so they keep their sequence.
    pub fn from_state(state: u64) -> Rng {
        Rng(state.max(1))
    }

    /// The next 64 bits.
    pub fn next_u64(&mut self) -> u64 {
        self.0 ^= self.0 << 13;
        self.0 ^= self.0 >> 7;
        self.0 ^= self.0 << 17;
        self.0
    }

    /// Uniform in `[0, 1)` (the top 53 bits of [`Rng::next_u64`]).
    pub fn unit(&mut self) -> f64 {
        (self.next_u64() >> 11) as f64 / (1u64 << 53) as f64
    }

    /// In `0..n` (an index or a count); 0 when `n` is 0.
    pub fn below(&mut self, n: usize) -> usize {
        (self.next_u64() % n.max(1) as u64) as usize
    }

    /// `n` bytes, the low byte of successive outputs.
    pub fn bytes(&mut self, n: usize) -> Vec<u8> {
        (0..n).map(|_| self.next_u64() as u8).collect()
    }

    /// One of `items` (which must not be empty).
    pub fn pick<'a, T>(&mut self, items: &'a [T]) -> &'a T {
        &items[self.below(items.len())]
    }
}

/// Deterministic pseudo-random stack ([`Rng`] seeded by `seed`), values
/// spread over the dtype's range: all of u8 and u16, and f32 in [-1000, 1000]
/// in steps of 1e-3.
pub fn random_stack(dtype: DType, shape: [usize; 3], seed: u64) -> Stack {
    let n = shape.iter().product();
    let f: Vec<f32> = random_values(n, seed, |v| match dtype {
        DType::U8 => (v % 256) as f32,
        DType::U16 => (v % 65536) as f32,
        DType::F32 => (v % 2_000_001) as f32 / 1000.0 - 1000.0,
    });
    match Array3::from_shape_vec(shape, f) {
        Ok(a) => Stack::from_f32_array(a, dtype),
        Err(_) => unreachable!("shape.product() values"),
    }
}

/// `n` deterministic values: `f` of each successive [`Rng::next_u64`] of the
/// generator of `seed` (the one [`random_stack`] uses), for tests that need
/// raw values in a range of their own.
pub fn random_values<T>(n: usize, seed: u64, f: impl FnMut(u64) -> T) -> Vec<T> {
    let mut rng = Rng::new(seed);
    (0..n).map(|_| rng.next_u64()).map(f).collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The first outputs of seed 1, computed from the definition outside
    /// Rust: a change of algorithm (which would silently change every seeded
    /// test and fuzz corpus) fails here.
    #[test]
    fn the_sequence_of_a_seed_is_fixed() {
        let expected = [0xdc1b_77ae_0bf3_4dad, 0x64f0_eeb9_026e_6076, 0x7b07_ce91_e590_6136];
        let mut rng = Rng::new(1);
        assert_eq!([rng.next_u64(), rng.next_u64(), rng.next_u64()], expected);
        assert_eq!(random_values(3, 1, |v| v), expected);
        let mut rng = Rng::new(7);
        assert!((0..1000).map(|_| rng.unit()).all(|u| (0.0..1.0).contains(&u)));
        assert!((0..1000).all(|_| rng.below(10) < 10) && rng.below(0) == 0);
        let spread = 0x9E37_79B9_7F4A_7C15u64 | 1;
        assert_eq!(Rng::from_state(spread).next_u64(), expected[0]);
    }
}

/// Runs registered function `name` with text arguments (`key=value`, as a
/// pipeline step gives them) on a copy of `stack` on `device`, and returns the
/// result in host memory: [`Registry::call`] with the default conversion
/// policy. Unknown functions and bad arguments are [`CallError::Plan`].
// The error is core's, as large as its ArgError (120 bytes): tests want it unboxed to match on.
#[allow(clippy::result_large_err)]
pub fn call(
    registry: &Registry,
    conversions: &Conversions,
    name: &str,
    args: &[&str],
    stack: &Stack,
    device: Device,
) -> Result<Stack, CallError> {
    let texts: Vec<String> = args.iter().map(|a| a.to_string()).collect();
    let args = registry.get(name)?.parse_args(&texts).map_err(PlanError::from)?;
    registry.call(name, args, stack.clone(), device, conversions, ConversionPolicy::default())
}

/// Whether this process runs in CI (`CI` is `true` or `1`, as CI services
/// set it): where tests never skip for a missing tool.
pub fn in_ci() -> bool {
    std::env::var("CI").is_ok_and(|v| v == "true" || v == "1")
}

/// The GPU tests' policy, given whether an adapter was found: `true` when
/// one was (run the test); without one, `false` (the caller returns, the
/// skip said on stderr) if `HCSFLOW_SKIP_GPU_TESTS=1` outside CI, and
/// otherwise a panic naming what to install: under `CI=true` nothing skips.
pub fn gpu_test_may_run(adapter_found: bool) -> bool {
    if adapter_found {
        return true;
    }
    if !in_ci() && std::env::var("HCSFLOW_SKIP_GPU_TESTS").as_deref() == Ok("1") {
        eprintln!("SKIPPED: no GPU adapter and HCSFLOW_SKIP_GPU_TESTS=1");
        return false;
    }
    panic!("no GPU adapter found: install mesa-vulkan-drivers libvulkan1 (or, outside CI, set HCSFLOW_SKIP_GPU_TESTS=1)");
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

/// Every file below `root` with its bytes and modification time: two equal
/// results mean no file was added, removed, rewritten or touched (a
/// stronger [`snapshot`], for inputs that must stay byte-identical).
///
/// # Panics
/// If the tree cannot be read: this is for tests.
pub fn contents(root: &Path) -> BTreeMap<PathBuf, (Vec<u8>, SystemTime)> {
    snapshot(root)
        .into_iter()
        .filter(|(_, e)| !e.is_dir)
        .map(|(p, e)| {
            let bytes = std::fs::read(&p).unwrap_or_else(|err| panic!("{}: {err}", p.display()));
            (p, (bytes, e.modified))
        })
        .collect()
}
