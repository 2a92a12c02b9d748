//! The measuring side of hcsflow's benchmarks.
//!
//! Claims of speed must be measured on the same inputs, in the same session,
//! as the tools users would pick instead. The peer scripts
//! (`../shared/bench/*.py`) cache their inputs as `.npy` files; [`npy`] reads
//! those exact bytes, [`checksum`] fingerprints them so both sides can prove
//! they saw identical data, and [`measure()`] times a closure the way the peers
//! do (warm-up, median/min/max wall time, process CPU time, peak RSS).

pub mod measure;
pub mod npy;

pub use measure::{checksum, measure, measure_with_setup, peak_rss_mib, Measurement};
pub use npy::{read_npy, write_npy, NpyError};
