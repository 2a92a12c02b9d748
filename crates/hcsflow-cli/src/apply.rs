//! `hcsflow apply FUNC IN.tif OUT.tif`: one function on one TIFF stack.

use std::path::{Path, PathBuf};
use std::time::Instant;

use anyhow::Context;
use clap::Args;
use hcsflow_core::{Array, ConversionPolicy, DTypeConversion, DTypePolicy, DeviceRequest, MemoryType, OutputDType, StackShape};
use hcsflow_tiff::{Compression, WriteOptions};

use crate::{engine, CliError, CliResult, Exit};

#[derive(Args)]
pub struct ApplyArgs {
    /// Function name (`hcsflow functions` lists them).
    function: String,
    /// Input TIFF (single page = one-plane stack; multi-page = one plane per page).
    input: PathBuf,
    /// Output TIFF (written atomically; one page per output plane).
    output: PathBuf,
    /// Function argument as name=value; repeatable.
    #[arg(long = "arg", value_name = "NAME=VALUE")]
    args: Vec<String>,
    /// auto | cpu | gpu | gpu:N.
    #[arg(long, default_value = "auto")]
    device: String,
    /// Allow a software GPU adapter (lavapipe/llvmpipe), for tests and CI.
    #[arg(long)]
    allow_software_gpu: bool,
    /// Allow copies through host memory between two GPU libraries that cannot share memory.
    #[arg(long)]
    allow_host_round_trip: bool,
    /// Output dtype: input (default: the input's dtype), u8, u16 or f32.
    #[arg(long, default_value = "input")]
    dtype: String,
    /// Map the result's min..max onto the integer output range instead of clipping.
    #[arg(long)]
    stretch: bool,
    /// Output compression: none or deflate.
    #[arg(long, default_value = "none")]
    compression: String,
}

pub fn run(a: ApplyArgs) -> CliResult {
    let usage = |e: anyhow::Error| CliError::new(Exit::Usage, e);
    // Everything that can be checked without pixels is checked first.
    if same_file(&a.input, &a.output) {
        return Err(usage(anyhow::anyhow!(
            "the output {} is the input {} (the same file); the input is never replaced; fix: choose another output path",
            a.output.display(),
            a.input.display()
        )));
    }
    let request: DeviceRequest = a.device.parse().map_err(|e: hcsflow_core::BadDevice| usage(e.into()))?;
    let output_dtype: OutputDType = a.dtype.parse().map_err(|e: hcsflow_core::dtype::UnknownDType| usage(e.into()))?;
    let compression = match a.compression.as_str() {
        "none" => Compression::None,
        "deflate" => Compression::Deflate,
        other => return Err(usage(anyhow::anyhow!("unknown compression '{other}': expected none or deflate"))),
    };
    let dtype_policy =
        DTypePolicy { output: output_dtype, conversion: if a.stretch { DTypeConversion::Stretch } else { DTypeConversion::Clip } };
    let policy = ConversionPolicy { allow_host_round_trip: a.allow_host_round_trip };
    let (registry, conversions) = engine::builtin();
    let function = registry.get(&a.function).map_err(|e| usage(e.into()))?;
    let args = function.parse_args(&a.args).map_err(|e| usage(e.into()))?;
    let allow = engine::software_gpu_allowed(a.allow_software_gpu);
    let (choice, _) = engine::choose_device(request, allow).map_err(|e| CliError::new(Exit::DeviceUnavailable, e))?;
    tracing::info!(device = %choice.device, reason = %choice.reason, "device chosen");
    let plan = registry.plan_call(&a.function, args, MemoryType::Host, choice.device, &conversions, policy).map_err(|e| usage(e.into()))?;
    let back = conversions.plan(plan.implementation.memory_out, MemoryType::Host, policy).map_err(|e| usage(e.into()))?;
    errln!("{} on {} ({}); input {}; output {}", plan.function, choice.device, choice.reason, plan.route_in, back);

    // The function's argument check against the input's shape, from its header (no pixel read yet).
    let info = hcsflow_tiff::read_info(&a.input).with_context(|| format!("reading {}", a.input.display()))?;
    registry.check_call(&plan, &StackShape::new(info.pages, info.height, info.width)).map_err(|e| usage(e.into()))?;
    let started = Instant::now();
    let stack = hcsflow_tiff::read_stack(&a.input).with_context(|| format!("reading {}", a.input.display()))?;
    let input_dtype = stack.dtype();
    let out = registry
        .execute(&plan, Array::from(stack), &conversions)
        .with_context(|| format!("running {} on {}", plan.function, a.input.display()))?;
    let out = conversions.execute(&back, out, hcsflow_core::Device::Cpu).context("copying the result to the host")?;
    let result = out
        .into_host_stack()
        .ok_or_else(|| anyhow::anyhow!("{} did not return a 3D stack", plan.function))?
        .apply_policy(input_dtype, dtype_policy);
    let options = WriteOptions { compression, ..Default::default() };
    hcsflow_tiff::write_stack(&a.output, &result, &options).with_context(|| format!("writing {}", a.output.display()))?;
    let [z, y, x] = result.shape();
    errln!("wrote {} ({z}×{y}×{x} {}) in {:.3} s", a.output.display(), result.dtype(), started.elapsed().as_secs_f64());
    Ok(())
}

/// Whether `output` names the file `input` names: the same path, or another
/// path to it (`./x.tif`, a symlink, a hard link). Only an existing output can
/// be the input; on Unix the two are compared by device and inode.
fn same_file(input: &Path, output: &Path) -> bool {
    let (Ok(i), Ok(o)) = (std::fs::metadata(input), std::fs::metadata(output)) else {
        return false;
    };
    #[cfg(unix)]
    {
        use std::os::unix::fs::MetadataExt;
        i.dev() == o.dev() && i.ino() == o.ino()
    }
    #[cfg(not(unix))]
    {
        let _ = (i, o);
        matches!((input.canonicalize(), output.canonicalize()), (Ok(a), Ok(b)) if a == b)
    }
}
