//! `hcsflow demo [OUT]`: a small synthetic plate and the demo pipeline, end to
//! end, with nothing to download: what to run right after building. The same
//! path as `run` (`hcsflow::Engine`), on a plate synthesized first.

use std::path::PathBuf;

use clap::Args;
use hcsflow::pipeline::{Materialize, MANIFEST_NAME, SUMMARY_NAME};
use hcsflow::{Engine, RunOptions};
use hcsflow_synth::SynthConfig;

use crate::flags::{DeviceArgs, OutputArgs};
use crate::run;
use crate::{CliError, CliResult, Exit};

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
    #[command(flatten)]
    device: DeviceArgs,
    /// Wells processed at the same time.
    #[arg(long)]
    workers: Option<usize>,
    /// Write a JSON report of the run.
    #[arg(long)]
    report: Option<PathBuf>,
    #[command(flatten)]
    pub output: OutputArgs,
}

pub fn run(a: DemoArgs) -> CliResult {
    let usage = |e: anyhow::Error| CliError::new(Exit::Usage, e);
    let device = a.device.options()?;
    let zarr_format = a.output.zarr_format()?;
    if a.wells == 0 || a.wells > 96 {
        return Err(usage(anyhow::anyhow!("--wells must be between 1 and 96")));
    }
    let plate_dir = a.out.join("plate");
    let results = a.out.join("results");
    let config = SynthConfig {
        wells: (0..a.wells).filter_map(|i| hcsflow::plate::well_name(i / 12 + 1, i % 12 + 1)).collect(),
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
    // The built-in pipeline is tested: an error here is this build's, not the user's.
    let spec = hcsflow::demo_pipeline().map_err(|e| CliError::new(Exit::Failure, e))?;
    let options = RunOptions {
        device,
        workers: a.workers.unwrap_or_else(hcsflow::default_workers).max(1),
        zarr_format,
        // Every image is there (`missing` error), no earlier run of another
        // pipeline in OUT/results (its own earlier results are the same run:
        // no `overwrite`), no `resume`, no memory budget: the defaults.
        ..RunOptions::default()
    };
    let engine = Engine::builtin();
    let plan = engine.plan_spec(&plate_dir, &spec, &results, &options)?;
    err!("{}", hcsflow::plan_text(&plan));
    let summary = run::execute(&engine, &plan, &options)?;
    run::finish(&plan, &summary, a.report.as_deref())?;
    outln!("plate:    {}", plate_dir.display())?;
    outln!("pipeline: {}", hcsflow::DEMO_PIPELINE_ORIGIN)?;
    for step in &plan.steps {
        if step.materialize.contains(&Materialize::Tiff) {
            outln!("{:<9} {}", format!("{}:", step.name), step.out_dir.display())?;
        }
    }
    for z in &summary.zarr_plates {
        outln!("OME-Zarr: {}", z.display())?;
    }
    for t in &summary.artifact_tables {
        outln!("table:    {}", t.display())?;
    }
    outln!("summary:  {}", results.join(SUMMARY_NAME).display())?;
    outln!("manifest: {}", results.join(MANIFEST_NAME).display())?;
    Ok(())
}
