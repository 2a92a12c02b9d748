//! `hcsflow bench`: time registered functions on the same `.npy` inputs the
//! peer benchmarks use, and the stitching library on the same TIFF tile grids
//! ASHLAR reads, one operation per process so peak RSS belongs to it.

use std::path::PathBuf;

use anyhow::Context;
use clap::{Args, Subcommand};
use hcsflow::core::dtype::UnknownDType;
use hcsflow::core::{BadDevice, DTypeConversion, DTypePolicy, DeviceRequest, OutputDType};
use hcsflow::{DeviceOptions, Engine};
use serde::Serialize;

use crate::{CliError, CliResult, Exit};

#[derive(Args)]
pub struct BenchArgs {
    #[command(subcommand)]
    command: BenchCommand,
}

#[derive(Subcommand)]
enum BenchCommand {
    /// Time one function on one .npy input (2D or 3D u8/u16/f32) and print one JSON line.
    Op(OpArgs),
    /// Time tile positions and assembly on a grid of TIFF tiles (raster order) and print one JSON line
    /// with the timings, the input SHA-256 and the positions (for the accuracy column).
    Stitch(StitchArgs),
}

#[derive(Args)]
struct StitchArgs {
    /// Folder of the tiles.
    dir: PathBuf,
    /// Tile file names; `{}` is the 0-based raster index, zero-padded to 3 digits.
    #[arg(long, default_value = "img_{}.tif")]
    pattern: String,
    #[arg(long)]
    rows: u32,
    #[arg(long)]
    cols: u32,
    /// Nominal overlap (fraction of a tile): the expected grid is `size × (1 − overlap)` per step,
    /// the same information a peer stitcher gets.
    #[arg(long)]
    overlap: f64,
    /// Blending of the assembly: linear | none | max.
    #[arg(long, default_value = "linear")]
    blend: String,
    #[arg(long, default_value_t = 5)]
    repeats: usize,
    #[arg(long, default_value_t = 1)]
    warmup: usize,
    /// Label for the JSON line.
    #[arg(long)]
    label: Option<String>,
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
    input_dtype: hcsflow::core::DType,
    output_shape: [usize; 3],
    output_dtype: hcsflow::core::DType,
    #[serde(flatten)]
    timing: hcsflow_bench::Measurement,
}

pub fn run(a: BenchArgs) -> CliResult {
    match a.command {
        BenchCommand::Op(o) => run_op(o),
        BenchCommand::Stitch(s) => run_stitch(s),
    }
}

fn run_op(a: OpArgs) -> CliResult {
    let usage = |e: anyhow::Error| CliError::new(Exit::Usage, e);
    let request: DeviceRequest = a.device.parse().map_err(|e: BadDevice| usage(e.into()))?;
    let output: OutputDType = a.dtype.parse().map_err(|e: UnknownDType| usage(e.into()))?;
    let policy = DTypePolicy { output, conversion: DTypeConversion::Clip };
    let engine = Engine::builtin();
    let device = DeviceOptions { request, allow_software_gpu: a.allow_software_gpu, allow_host_round_trip: false };
    let call = engine.plan_call(&a.function, &a.args, &device)?;

    let stack = hcsflow_bench::read_npy(&a.input).with_context(|| format!("reading {}", a.input.display()))?;
    let input_sha256 = hcsflow_bench::checksum(stack.as_bytes());
    let (input_shape, input_dtype) = (stack.shape(), stack.dtype());
    // Timed: upload (if any), the function, download, the dtype policy — what a step pays.
    // The copy of the input each run consumes is made outside the timed region.
    let setup = || stack.clone();
    let (timing, result) = hcsflow_bench::measure_with_setup(a.warmup, a.repeats, setup, |input| -> anyhow::Result<hcsflow::core::Stack> {
        Ok(engine.run_call(&call, input, policy)?)
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
        device: call.device.device.to_string(),
        input: a.input,
        input_sha256,
        input_shape,
        input_dtype,
        output_shape: result.shape(),
        output_dtype: result.dtype(),
        timing,
    };
    outln!("{}", serde_json::to_string(&report).context("serialising the report")?)?;
    Ok(())
}

#[derive(Serialize)]
struct StitchReport {
    op: String,
    dir: PathBuf,
    rows: u32,
    cols: u32,
    overlap: f64,
    /// SHA-256 of the tiles' pixels in raster order (C order, little-endian), as
    /// `hashlib.sha256(np.stack(tiles).tobytes())` computes it.
    input_sha256: String,
    input_shape: [usize; 3],
    input_dtype: hcsflow::core::DType,
    /// Reading the tiles plus `tile_positions`: what a peer's alignment timing covers.
    positions: hcsflow_bench::Measurement,
    /// `tile_positions` alone, tiles already in memory.
    positions_in_memory: hcsflow_bench::Measurement,
    /// Reading the tiles plus `assemble`.
    assemble: hcsflow_bench::Measurement,
    /// `assemble` alone.
    assemble_in_memory: hcsflow_bench::Measurement,
    blend: &'static str,
    mosaic_shape: [usize; 2],
    /// Top-left corner of every tile, `[y, x]` px (the peers' order), relative to the nominal grid's origin.
    positions_yx: Vec<[f64; 2]>,
    edges: usize,
    edges_accepted: usize,
    fell_back_to_stage: bool,
    message: Option<String>,
    threads: usize,
}

fn tile_path(dir: &std::path::Path, pattern: &str, k: u32) -> PathBuf {
    dir.join(pattern.replace("{}", &format!("{k:03}")))
}

/// Reads the `rows × cols` tiles into one stack, plane = raster index.
fn read_tiles(a: &StitchArgs) -> anyhow::Result<hcsflow::core::Stack> {
    let paths: Vec<PathBuf> = (0..a.rows * a.cols).map(|k| tile_path(&a.dir, &a.pattern, k)).collect();
    hcsflow::tiff::read_stacks(&paths).with_context(|| format!("reading the tiles in {}", a.dir.display()))
}

fn run_stitch(a: StitchArgs) -> CliResult {
    let usage = |e: anyhow::Error| CliError::new(Exit::Usage, e);
    if a.rows == 0 || a.cols == 0 || !(0.0..1.0).contains(&a.overlap) {
        return Err(usage(anyhow::anyhow!("--rows and --cols must be at least 1 and --overlap in [0, 1)")));
    }
    if a.repeats == 0 {
        return Err(usage(anyhow::anyhow!("--repeats must be at least 1")));
    }
    let blend: hcsflow::stitch::Blend = a.blend.parse().map_err(|e: hcsflow::stitch::StitchError| usage(e.into()))?;
    let tiles = read_tiles(&a)?;
    let [_, h, w] = tiles.shape();
    let layout = hcsflow::stitch::TileLayout::grid(a.rows, a.cols, w, h, a.overlap);
    let params = hcsflow::stitch::PositionParams::default();
    let positions_of = |t: &hcsflow::core::Stack| hcsflow::stitch::tile_positions(t, &layout, &params).context("tile_positions");

    let (positions, _) = hcsflow_bench::measure(a.warmup, a.repeats, || read_tiles(&a).and_then(|t| positions_of(&t)))?;
    let (positions_in_memory, result) = hcsflow_bench::measure(a.warmup, a.repeats, || positions_of(&tiles))?;
    let result = result.ok_or_else(|| anyhow::anyhow!("no positions computed"))?;
    let assemble_of = |t: &hcsflow::core::Stack| hcsflow::stitch::assemble(t, &result.positions, blend).context("assemble");
    let (assemble, _) = hcsflow_bench::measure(a.warmup, a.repeats, || read_tiles(&a).and_then(|t| assemble_of(&t)))?;
    let (assemble_in_memory, mosaic) = hcsflow_bench::measure(a.warmup, a.repeats, || assemble_of(&tiles))?;
    let [_, mh, mw] = mosaic.ok_or_else(|| anyhow::anyhow!("no mosaic assembled"))?.shape();

    let report = StitchReport {
        op: a.label.clone().unwrap_or_else(|| format!("stitch_{}x{}_{w}", a.rows, a.cols)),
        dir: a.dir.clone(),
        rows: a.rows,
        cols: a.cols,
        overlap: a.overlap,
        input_sha256: hcsflow_bench::checksum(tiles.as_bytes()),
        input_shape: tiles.shape(),
        input_dtype: tiles.dtype(),
        positions,
        positions_in_memory,
        assemble,
        assemble_in_memory,
        blend: blend.name(),
        mosaic_shape: [mh, mw],
        positions_yx: result.positions.iter().map(|&(x, y)| [y, x]).collect(),
        edges: result.edges.len(),
        edges_accepted: result.edges.iter().filter(|e| e.accepted()).count(),
        fell_back_to_stage: result.fell_back_to_stage,
        message: result.message,
        threads: std::thread::available_parallelism().map_or(1, |n| n.get()),
    };
    outln!("{}", serde_json::to_string(&report).context("serialising the report")?)?;
    Ok(())
}
