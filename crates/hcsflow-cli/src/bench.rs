//! `hcsflow bench`: time registered functions on the same `.npy` inputs the
//! peer benchmarks use, one operation per process so peak RSS belongs to it.

use std::path::PathBuf;

use anyhow::Context;
use clap::{Args, Subcommand};
use hcsflow_core::{Array, ConversionPolicy, DTypeConversion, DTypePolicy, DeviceRequest, MemoryType, OutputDType};
use serde::Serialize;

use crate::{engine, CliError, CliResult, Exit};

#[derive(Args)]
pub struct BenchArgs {
    #[command(subcommand)]
    command: BenchCommand,
}

#[derive(Subcommand)]
enum BenchCommand {
    /// Time one function on one .npy input (2D or 3D u8/u16/f32) and print one JSON line.
    Op(OpArgs),
}

#[derive(Args)]
struct OpArgs {
    /// Function name (`hcsflow functions`).
    function: String,
    /// Input .npy (a 2D image is a one-plane stack).
    #[arg(long)]
    input: PathBuf,
    /// Function argument as name=value; repeatable.
    #[arg(long = "arg", value_name = "NAME=VALUE")]
    args: Vec<String>,
    #[arg(long, default_value = "cpu")]
    device: String,
    #[arg(long)]
    allow_software_gpu: bool,
    /// Output dtype (input | u8 | u16 | f32); the cast is part of the timed work.
    #[arg(long, default_value = "input")]
    dtype: String,
    #[arg(long, default_value_t = 5)]
    repeats: usize,
    #[arg(long, default_value_t = 1)]
    warmup: usize,
    /// Save the last result as .npy (for accuracy against the peer's output).
    #[arg(long)]
    save_output: Option<PathBuf>,
    /// Label for the JSON line (defaults to the function name).
    #[arg(long)]
    label: Option<String>,
}

#[derive(Serialize)]
struct OpReport {
    op: String,
    function: String,
    args: Vec<String>,
    device: String,
    input: PathBuf,
    input_sha256: String,
    input_shape: [usize; 3],
    input_dtype: hcsflow_core::DType,
    output_shape: [usize; 3],
    output_dtype: hcsflow_core::DType,
    #[serde(flatten)]
    timing: hcsflow_bench::Measurement,
}

pub fn run(a: BenchArgs) -> CliResult {
    match a.command {
        BenchCommand::Op(o) => run_op(o),
    }
}

fn run_op(a: OpArgs) -> CliResult {
    let usage = |e: anyhow::Error| CliError::new(Exit::Usage, e);
    let request: DeviceRequest = a.device.parse().map_err(|e: hcsflow_core::BadDevice| usage(e.into()))?;
    let output: OutputDType = a.dtype.parse().map_err(|e: hcsflow_core::dtype::UnknownDType| usage(e.into()))?;
    let policy = DTypePolicy { output, conversion: DTypeConversion::Clip };
    let (registry, conversions) = engine::builtin();
    let function = registry.get(&a.function).map_err(|e| usage(e.into()))?;
    let args = function.parse_args(&a.args).map_err(|e| usage(e.into()))?;
    let (choice, _) = engine::choose_device(request, engine::software_gpu_allowed(a.allow_software_gpu))
        .map_err(|e| CliError::new(Exit::DeviceUnavailable, e))?;
    let cp = ConversionPolicy::default();
    let plan = registry
        .plan_call(&a.function, args, MemoryType::Host, choice.device, &conversions, cp)
        .map_err(|e| usage(e.into()))?;
    let back = conversions.plan(plan.implementation.memory_out, MemoryType::Host, cp).map_err(|e| usage(e.into()))?;

    let stack = hcsflow_bench::read_npy(&a.input).with_context(|| format!("reading {}", a.input.display()))?;
    let input_sha256 = hcsflow_bench::checksum(stack.as_bytes());
    let (input_shape, input_dtype) = (stack.shape(), stack.dtype());
    // Timed: upload (if any), the function, download, the dtype policy — what a step pays.
    // The copy of the input each run consumes is made outside the timed region.
    let setup = || Array::from(stack.clone());
    let (timing, result) = hcsflow_bench::measure_with_setup(a.warmup, a.repeats, setup, |input| -> anyhow::Result<hcsflow_core::Stack> {
        let out = registry.execute(&plan, input, &conversions)?;
        let out = conversions.execute(&back, out, hcsflow_core::Device::Cpu)?;
        let s = out.into_host_stack().ok_or_else(|| anyhow::anyhow!("{} did not return a 3D stack", plan.function))?;
        Ok(s.apply_policy(input_dtype, policy))
    })
    .with_context(|| format!("running {} on {}", a.function, a.input.display()))?;
    let result = result.ok_or_else(|| usage(anyhow::anyhow!("--repeats must be at least 1")))?;
    if let Some(p) = &a.save_output {
        hcsflow_bench::write_npy(p, &result).with_context(|| format!("writing {}", p.display()))?;
    }
    let report = OpReport {
        op: a.label.unwrap_or_else(|| a.function.clone()),
        function: a.function,
        args: a.args,
        device: choice.device.to_string(),
        input: a.input,
        input_sha256,
        input_shape,
        input_dtype,
        output_shape: result.shape(),
        output_dtype: result.dtype(),
        timing,
    };
    println!("{}", serde_json::to_string(&report).context("serialising the report")?);
    Ok(())
}
