//! `hcsflow apply FUNC IN.tif OUT.tif`: one function on one TIFF stack.

use std::path::{Path, PathBuf};
use std::time::Instant;

use anyhow::Context;
use clap::Args;
use hcsflow::core::dtype::UnknownDType;
use hcsflow::core::{DTypeConversion, DTypePolicy, OutputDType, StackShape};
use hcsflow::tiff::{Compression, WriteOptions};
use hcsflow::Engine;

use crate::flags::DeviceArgs;
use crate::{CliError, CliResult, Exit};

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
    #[command(flatten)]
    device: DeviceArgs,
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
    let device = a.device.options()?;
    let output_dtype: OutputDType = a.dtype.parse().map_err(|e: UnknownDType| usage(e.into()))?;
    let compression = match a.compression.as_str() {
        "none" => Compression::None,
        "deflate" => Compression::Deflate,
        other => return Err(usage(anyhow::anyhow!("unknown compression '{other}': expected none or deflate"))),
    };
    let dtype_policy =
        DTypePolicy { output: output_dtype, conversion: if a.stretch { DTypeConversion::Stretch } else { DTypeConversion::Clip } };
    let engine = Engine::builtin();
    let call = engine.plan_call(&a.function, &a.args, &device)?;
    let (plan, choice) = (&call.call, &call.device);
    tracing::info!(device = %choice.device, reason = %choice.reason, "device chosen");
    errln!("{} on {} ({}); input {}; output {}", plan.function, choice.device, choice.reason, plan.route_in, call.back);

    // The function's argument check against the input's shape, from its header (no pixel read yet).
    let info = hcsflow::tiff::read_info(&a.input).with_context(|| format!("reading {}", a.input.display()))?;
    engine.check_call(&call, &StackShape::new(info.pages, info.height, info.width))?;
    let started = Instant::now();
    let stack = hcsflow::tiff::read_stack(&a.input).with_context(|| format!("reading {}", a.input.display()))?;
    let result = engine.run_call(&call, stack, dtype_policy).map_err(|e| match e {
        // The function's own failure names the call; the engine's other
        // errors (the copy back to the host) speak for themselves.
        e @ hcsflow::Error::Function(_) => {
            CliError::from(anyhow::Error::new(e).context(format!("running {} on {}", plan.function, a.input.display())))
        }
        e => CliError::from(e),
    })?;
    let options = WriteOptions { compression, ..Default::default() };
    hcsflow::tiff::write_stack(&a.output, &result, &options).with_context(|| format!("writing {}", a.output.display()))?;
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
