//! `hcsflow demo [OUT]`: a small synthetic plate and the demo pipeline, end to
//! end, with nothing to download: what to run right after building. The same
//! path as `run` (`hcsflow::Engine`), on a plate synthesized first.
//! `--pipeline mega-flex` runs `examples/mega_flex.toml` instead, on a plate
//! with z-stacks, shading and clean truth images, and writes the per-step
//! quality table against that truth (`hcsflow::mega_flex`).

use std::path::PathBuf;

use clap::{Args, ValueEnum};
use hcsflow::mega_flex;
use hcsflow::pipeline::{Materialize, MANIFEST_NAME, REPORT_HTML_NAME, RUN_REPORT_NAME, SUMMARY_NAME};
use hcsflow::{Engine, RunOptions};
use hcsflow_synth::SynthConfig;

use crate::flags::{DeviceArgs, OutputArgs};
use crate::run;
use crate::{CliError, CliResult, Exit};

/// The built-in pipelines `hcsflow demo` runs.
#[derive(Clone, Copy, PartialEq, Eq, ValueEnum)]
pub enum DemoPipeline {
    /// examples/demo.toml: normalise, composite, positions, assemble, count.
    Demo,
    /// examples/mega_flex.toml: BaSiC, N2V2, 3D deconvolution, max-Z,
    /// enhancement, composite, positions, assembly, nuclei; with a quality
    /// table against the synthetic plate's truth.
    MegaFlex,
}

#[derive(Args)]
pub struct DemoArgs {
    /// Output folder: the plate goes to OUT/plate, the results to OUT/results.
    #[arg(default_value = "hcsflow-demo")]
    out: PathBuf,
    /// Tile width and height in pixels.
    #[arg(long, default_value_t = 256)]
    size: u32,
    /// Number of wells (A01, A02, … along rows of a 96-well plate; default:
    /// 4, and 1 for mega-flex, which trains an N2V model per well and channel).
    #[arg(long)]
    wells: Option<u32>,
    /// Number of z planes (default: 3; 5 for mega-flex, whose PSF spans 5 planes).
    #[arg(long)]
    z: Option<u32>,
    /// The pipeline to run.
    #[arg(long, value_enum, default_value = "demo")]
    pipeline: DemoPipeline,
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
    let well_count = a.wells.unwrap_or(if a.pipeline == DemoPipeline::MegaFlex { 1 } else { 4 });
    if well_count == 0 || well_count > 96 {
        return Err(usage(anyhow::anyhow!("--wells must be between 1 and 96")));
    }
    let plate_dir = a.out.join("plate");
    let results = a.out.join("results");
    let wells: Vec<String> = (0..well_count).filter_map(|i| hcsflow::plate::well_name(i / 12 + 1, i % 12 + 1)).collect();
    let mut config = match a.pipeline {
        DemoPipeline::Demo => SynthConfig {
            wells,
            size: a.size,
            z_planes: a.z.unwrap_or(3),
            grid_rows: 3,
            grid_cols: 3,
            channels: 2,
            ..SynthConfig::default()
        },
        DemoPipeline::MegaFlex => mega_flex::mega_flex_synth_config(wells, a.size, a.z.unwrap_or(5)),
    };
    // Re-running the demo replaces its own previous plate (never anything else).
    config.overwrite = true;
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
    let (spec, origin) = match a.pipeline {
        DemoPipeline::Demo => (hcsflow::demo_pipeline(), hcsflow::DEMO_PIPELINE_ORIGIN),
        DemoPipeline::MegaFlex => (mega_flex::mega_flex_pipeline(), mega_flex::MEGA_FLEX_PIPELINE_ORIGIN),
    };
    let spec = spec.map_err(|e| CliError::new(Exit::Failure, e))?;
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
    let quality = match a.pipeline {
        DemoPipeline::Demo => Vec::new(),
        DemoPipeline::MegaFlex => {
            let failed = |e: mega_flex::QualityError| {
                CliError::new(Exit::Failure, anyhow::Error::new(e).context("the quality table against the truth"))
            };
            let rows = mega_flex::quality_against_truth(&plate_dir, &results).map_err(failed)?;
            err!(
                "quality against the plate's truth (input: the step's input; output: the step's result):\n{}",
                mega_flex::quality_text(&rows)
            );
            let written = mega_flex::write_quality(&results, &rows).map_err(failed)?;
            // The run wrote its QC report before the table existed: again, with it.
            hcsflow::report::write_report(&results)
                .map_err(|e| CliError::new(Exit::Failure, anyhow::Error::new(e).context("the QC report with the quality table")))?;
            written
        }
    };
    outln!("plate:    {}", plate_dir.display())?;
    outln!("pipeline: {origin}")?;
    for step in &plan.steps {
        if step.materialize.contains(&Materialize::Tiff) {
            outln!("{:<9} {}", format!("{}:", step.name), step.out_dir.display())?;
        }
    }
    // Both built-in pipelines assemble one mosaic per well and channel in their step "mosaic".
    if let Ok(Some(manifest)) = hcsflow::pipeline::Manifest::read(&results) {
        for (well, record) in &manifest.wells {
            for o in record.outputs.iter().filter(|o| o.step == "mosaic") {
                outln!("mosaic:   {well} channel {}: {}", o.key[1], results.join(&o.path).display())?;
            }
        }
    }
    for z in &summary.zarr_plates {
        outln!("OME-Zarr: {}", z.display())?;
    }
    for t in &summary.artifact_tables {
        outln!("table:    {}", t.display())?;
    }
    for q in &quality {
        outln!("quality:  {}", q.display())?;
    }
    outln!("summary:  {}", results.join(SUMMARY_NAME).display())?;
    outln!("report:   {}", results.join(REPORT_HTML_NAME).display())?;
    outln!("run report: {}", results.join(RUN_REPORT_NAME).display())?;
    outln!("manifest: {}", results.join(MANIFEST_NAME).display())?;
    Ok(())
}
