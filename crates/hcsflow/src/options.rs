//! The options of a pipeline run, with their defaults.

use hcsflow_pipeline::{MissingPolicy, NgffVersion, Shard};
use hcsflow_plate::Format;

use crate::device::DeviceOptions;
use crate::error::OptionsError;

/// Everything about a pipeline run besides the plate, the pipeline and the
/// output folder: how the plate is read, where functions run, and how the
/// wells are scheduled and written. [`Default`] gives what the CLI does
/// without flags (except `workers`, which is [`default_workers`]).
///
/// (The engine's own `hcsflow_pipeline::{CompileConfig, RunOptions}` are the
/// compile and execute halves of this, built by [`crate::Engine`].)
#[derive(Debug, Clone, PartialEq)]
pub struct RunOptions {
    /// Device choice and conversion policy (default `auto`).
    pub device: DeviceOptions,
    /// The plate's format; `None` (default) detects it.
    pub format: Option<Format>,
    /// What to do with images the plate declares but does not have (default:
    /// refuse the run, listing them).
    pub missing: MissingPolicy,
    /// Wells processed at the same time (≥ 1; default [`default_workers`]).
    pub workers: usize,
    /// Memory budget in bytes for the wells in flight (estimated from stack
    /// sizes); `None` (default): no budget.
    pub max_memory: Option<u64>,
    /// Skip wells the output folder's manifest records complete by a previous
    /// run of the same pipeline.
    pub resume: bool,
    /// The output folder holds another run's outputs: remove them first (only
    /// the files its manifest lists). Not with `resume`.
    pub overwrite: bool,
    /// NGFF version of OME-Zarr outputs (default 0.5).
    pub zarr_format: NgffVersion,
    /// Run only this shard of the plate's wells, side by side with the other
    /// shards, into the same output folder; [`crate::Engine::finalize`]
    /// merges them (default: `None`, the whole plate).
    pub shard: Option<Shard>,
    /// Refuse, at compile time, a plan in which any call would run on the
    /// host (`--require-gpu`): the error names each step and function
    /// ([`hcsflow_pipeline::PipelineError::HostCalls`], a usage error).
    pub require_gpu: bool,
    /// Device-memory budget in bytes of one GPU call on one stack (input,
    /// output and scratch): a stack over it runs in chunks of planes where
    /// its functions allow it (per-plane functions; max and min projections
    /// combine), else its well fails with the sizes (`--gpu-memory`).
    /// `None` (default): the adapter's largest buffer binding
    /// ([`crate::default_gpu_memory`]), which only chooses chunks: a call
    /// over it that cannot split runs whole, failing only if the device runs
    /// out of memory.
    pub gpu_memory: Option<u64>,
}

impl Default for RunOptions {
    fn default() -> Self {
        RunOptions {
            device: DeviceOptions::default(),
            format: None,
            missing: MissingPolicy::default(),
            workers: default_workers(),
            max_memory: None,
            resume: false,
            overwrite: false,
            zarr_format: NgffVersion::default(),
            shard: None,
            require_gpu: false,
            gpu_memory: None,
        }
    }
}

impl RunOptions {
    /// Checks what can be checked before anything is opened (at least one
    /// worker).
    pub fn check(&self) -> Result<(), OptionsError> {
        if self.workers == 0 {
            return Err(OptionsError::NoWorkers);
        }
        Ok(())
    }
}

/// Wells processed at the same time when not asked: 2, or 1 on a single core
/// (a well's functions are themselves parallel).
pub fn default_workers() -> usize {
    std::thread::available_parallelism().map(|n| n.get().clamp(1, 2)).unwrap_or(1)
}

/// Parses a size in bytes: `4G`, `512M`, `100k`, `1.5GiB`, `1000` (binary
/// multiples; the suffix's case and a trailing `B`/`iB` do not matter).
///
/// ```
/// assert_eq!(hcsflow::parse_size("4G"), Ok(4 << 30));
/// assert_eq!(hcsflow::parse_size("512mib"), Ok(512 << 20));
/// assert!(hcsflow::parse_size("4Q").is_err());
/// ```
pub fn parse_size(text: &str) -> Result<u64, String> {
    let t = text.trim();
    let (num, mult) = match t.char_indices().find(|(_, c)| c.is_ascii_alphabetic()) {
        Some((i, _)) => {
            let unit = t[i..].to_ascii_lowercase();
            let m: u64 = match unit.trim_end_matches("ib").trim_end_matches('b') {
                "" => 1,
                "k" => 1 << 10,
                "m" => 1 << 20,
                "g" => 1 << 30,
                "t" => 1 << 40,
                _ => return Err(format!("bad size '{text}': expected a number with an optional K, M, G or T suffix")),
            };
            (&t[..i], m)
        }
        None => (t, 1),
    };
    let n: f64 = num.trim().parse().map_err(|_| format!("bad size '{text}': expected e.g. 4G or 512M"))?;
    if !(n.is_finite() && n > 0.0) {
        return Err(format!("bad size '{text}': must be positive"));
    }
    Ok((n * mult as f64) as u64)
}
