//! `hcsflow demo [OUT]`: a small synthetic plate and the demo pipeline, end to
//! end, with nothing to download: what to run right after building.

use std::path::PathBuf;

use anyhow::Context;
use clap::Args;
use hcsflow_core::{ConversionPolicy, DeviceRequest};
use hcsflow_pipeline::PipelineSpec;
use hcsflow_synth::SynthConfig;

use crate::run::{self, Setup};
use crate::{CliError, CliResult, Exit};

/// The demo pipeline, also in `examples/demo.toml` (one file, embedded).
pub const DEMO_PIPELINE: &str = include_str!("../../../examples/demo.toml");

#[derive(Args)]
pub struct DemoArgs {
    /// Output folder: the plate goes to OUT/plate, the results to OUT/results.
    #[arg(default_value = "hcsflow-demo")]
    out: PathBuf,
    /// Tile width and height in pixels.
    #[arg(long, default_value_t = 256)]
    size: u32,
    /// Number of wells (A01, A02, … along rows of a 96-well plate).
    #[arg(long, default_value_t = 4)]
    wells: u32,
    /// Number of z planes.
    #[arg(long, default_value_t = 3)]
    z: u32,
    /// auto | cpu | gpu | gpu:N.
    #[arg(long, default_value = "auto")]
    device: String,
    /// Allow a software GPU adapter (lavapipe/llvmpipe), for tests and CI.
    #[arg(long)]
    allow_software_gpu: bool,
    /// Wells processed at the same time.
    #[arg(long)]
    workers: Option<usize>,
    /// Write a JSON report of the run.
    #[arg(long)]
    report: Option<PathBuf>,
    #[command(flatten)]
    pub output: run::OutputArgs,
}

pub fn run(a: DemoArgs) -> CliResult {
    let usage = |e: anyhow::Error| CliError::new(Exit::Usage, e);
    let device: DeviceRequest = a.device.parse().map_err(|e: hcsflow_core::BadDevice| usage(e.into()))?;
    let zarr_format = a.output.zarr_format()?;
    if a.wells == 0 || a.wells > 96 {
        return Err(usage(anyhow::anyhow!("--wells must be between 1 and 96")));
    }
    let plate_dir = a.out.join("plate");
    let results = a.out.join("results");
    let config = SynthConfig {
        wells: (0..a.wells).filter_map(|i| hcsflow_plate::well_name(i / 12 + 1, i % 12 + 1)).collect(),
        size: a.size,
        z_planes: a.z,
        grid_rows: 3,
        grid_cols: 3,
        channels: 2,
        // Re-running the demo replaces its own previous plate (never anything else).
        overwrite: true,
        ..SynthConfig::default()
    };
    let synth = hcsflow_synth::generate(&config, &plate_dir).map_err(|e| {
        let exit = if matches!(e, hcsflow_synth::SynthError::InvalidConfig(..) | hcsflow_synth::SynthError::NotSynthetic { .. }) {
            Exit::Usage
        } else {
            Exit::Failure
        };
        CliError::new(exit, anyhow::Error::new(e).context(format!("generating the demo plate in {}", plate_dir.display())))
    })?;
    errln!(
        "demo plate: {} ({} wells × {} sites × {} channels × {} z, {}², {:.1} MB)",
        plate_dir.display(),
        synth.wells.len(),
        synth.sites,
        config.channels,
        config.z_planes,
        config.size,
        synth.bytes_written as f64 / 1e6
    );
    let spec = PipelineSpec::parse(DEMO_PIPELINE, "examples/demo.toml (built in)").map_err(|e| CliError::new(Exit::Failure, e))?;
    let setup = Setup {
        device,
        allow_software_gpu: a.allow_software_gpu,
        policy: ConversionPolicy::default(),
        workers: a.workers.unwrap_or_else(run::default_workers).max(1),
        max_memory: None,
        resume: false,
        // The demo plate has every image; its own earlier results are the same run.
        overwrite: false,
        missing: hcsflow_pipeline::MissingPolicy::Error,
        report: a.report,
        zarr_format,
    };
    let plate = hcsflow_plate::open_plate(&plate_dir, None).with_context(|| format!("opening {}", plate_dir.display()))?;
    let (registry, conversions) = hcsflow::builtin();
    let plan = run::compile(&plate, &spec, &registry, &conversions, &setup, &results)?;
    err!("{}", run::plan_text(&plan));
    let summary = run::execute(&plan, &registry, &conversions, &setup)?;
    run::finish(&plan, &summary, &setup)?;
    outln!("plate:    {}", plate_dir.display())?;
    outln!("pipeline: examples/demo.toml (built in)")?;
    for step in &plan.steps {
        if step.materialize.contains(&hcsflow_pipeline::Materialize::Tiff) {
            outln!("{:<9} {}", format!("{}:", step.name), step.out_dir.display())?;
        }
    }
    for z in &summary.zarr_plates {
        outln!("OME-Zarr: {}", z.display())?;
    }
    for t in &summary.artifact_tables {
        outln!("table:    {}", t.display())?;
    }
    outln!("summary:  {}", results.join(hcsflow_pipeline::SUMMARY_NAME).display())?;
    outln!("manifest: {}", results.join(hcsflow_pipeline::MANIFEST_NAME).display())?;
    Ok(())
}
