//! `hcsflow synth OUT`: a synthetic plate with ground truth.

use std::path::PathBuf;

use anyhow::Context;
use clap::Args;
use hcsflow_plate::Format;
use hcsflow_synth::{GuidStyle, IxLayout, SynthConfig};

use crate::{CliError, CliResult, Exit};

#[derive(Args)]
pub struct SynthArgs {
    /// Output folder (created; must be empty unless --overwrite on a previous synthetic plate).
    out: PathBuf,
    /// imagexpress | opera-phenix.
    #[arg(long, default_value = "imagexpress")]
    format: String,
    /// Wells to acquire, comma-separated (A01,B02). Default: A01,B02, or every well with --plate.
    #[arg(long, value_delimiter = ',')]
    wells: Vec<String>,
    /// Plate size: 96, 384 or 1536. Without --wells, every well of the plate is acquired.
    #[arg(long)]
    plate: Option<u32>,
    /// Site grid as ROWSxCOLS.
    #[arg(long, default_value = "3x3")]
    grid: String,
    /// Tile overlap as a fraction of the tile size.
    #[arg(long, default_value_t = 0.1)]
    overlap: f64,
    /// Maximum stage jitter per tile in pixels (fractional allowed).
    #[arg(long, default_value_t = 2.0)]
    jitter_px: f64,
    #[arg(long, default_value_t = 2)]
    channels: u32,
    /// Number of z planes.
    #[arg(long, default_value_t = 1)]
    z: u32,
    #[arg(long, default_value_t = 1)]
    timepoints: u32,
    /// Tile width and height in pixels.
    #[arg(long, default_value_t = 256)]
    size: u32,
    #[arg(long, default_value_t = 0)]
    seed: u64,
    /// Plate (measurement) name; ImageXpress file prefix.
    #[arg(long)]
    plate_name: Option<String>,
    /// Pixel size in µm.
    #[arg(long)]
    pixel_size: Option<f64>,
    /// Leave out this many planes (reported as missing by `inspect`).
    #[arg(long, default_value_t = 0)]
    missing_planes: u32,
    /// Raster cells (1-based) of the grid that are not acquired, comma-separated.
    #[arg(long, value_delimiter = ',')]
    skip_sites: Vec<u32>,
    /// ImageXpress: also write `_thumb` thumbnails.
    #[arg(long)]
    thumbnails: bool,
    /// ImageXpress GUID suffix: none | bare | bracketed.
    #[arg(long, default_value = "none")]
    guid: String,
    /// ImageXpress: `.TIF` file extension.
    #[arg(long)]
    upper_case_tif: bool,
    /// ImageXpress: images directly in the plate folder (one time point, one plane).
    #[arg(long)]
    flat: bool,
    /// ImageXpress z-stacks: also write the projected plane beside ZStep folders.
    #[arg(long)]
    z_projection: bool,
    /// Opera Phenix index file name: Index.idx.xml | Index.ref.xml | Index.xml.
    #[arg(long)]
    index_name: Option<String>,
    /// Opera Phenix: HarmonyV6 namespace.
    #[arg(long)]
    harmony_v6: bool,
    /// Also write noise-free truth images per well and channel.
    #[arg(long)]
    truth_images: bool,
    /// Replace OUT if it is a previous synthetic plate.
    #[arg(long)]
    overwrite: bool,
    /// Start from a full JSON SynthConfig (every option); flags given explicitly still apply on top.
    #[arg(long)]
    config: Option<PathBuf>,
}

fn usage(e: impl Into<anyhow::Error>) -> CliError {
    CliError::new(Exit::Usage, e)
}

pub fn config_from(a: &SynthArgs) -> Result<SynthConfig, CliError> {
    let mut c = match &a.config {
        Some(p) => {
            let text = std::fs::read_to_string(p).with_context(|| format!("reading {}", p.display())).map_err(usage)?;
            serde_json::from_str(&text).with_context(|| format!("parsing {}", p.display())).map_err(usage)?
        }
        None => SynthConfig::default(),
    };
    c.format = a.format.parse::<Format>().map_err(usage)?;
    if let Some(n) = a.plate {
        c.plate_size = n;
        c.wells.clear();
    }
    if !a.wells.is_empty() {
        c.wells = a.wells.iter().map(|w| w.trim().to_string()).collect();
    }
    let (r, k) = a
        .grid
        .split_once(['x', 'X'])
        .and_then(|(r, k)| Some((r.trim().parse().ok()?, k.trim().parse().ok()?)))
        .ok_or_else(|| usage(anyhow::anyhow!("bad --grid '{}': expected ROWSxCOLS, e.g. 3x3", a.grid)))?;
    (c.grid_rows, c.grid_cols) = (r, k);
    c.overlap = a.overlap;
    c.jitter_px = a.jitter_px;
    c.channels = a.channels;
    c.z_planes = a.z;
    c.timepoints = a.timepoints;
    c.size = a.size;
    c.seed = a.seed;
    if let Some(n) = &a.plate_name {
        c.plate_name = n.clone();
    }
    if let Some(p) = a.pixel_size {
        c.pixel_size_um = p;
    }
    c.missing_planes = a.missing_planes;
    if !a.skip_sites.is_empty() {
        c.skip_sites = a.skip_sites.clone();
    }
    c.thumbnails |= a.thumbnails;
    c.guid_style = match a.guid.as_str() {
        "none" => GuidStyle::None,
        "bare" => GuidStyle::Bare,
        "bracketed" => GuidStyle::Bracketed,
        other => return Err(usage(anyhow::anyhow!("bad --guid '{other}': expected none, bare or bracketed"))),
    };
    c.upper_case_tif |= a.upper_case_tif;
    if a.flat {
        c.ix_layout = IxLayout::Flat;
    }
    c.z_projection |= a.z_projection;
    if let Some(n) = &a.index_name {
        c.phenix_index_name = n.clone();
    }
    c.harmony_v6 |= a.harmony_v6;
    c.truth_images |= a.truth_images;
    c.overwrite |= a.overwrite;
    Ok(c)
}

pub fn run(a: SynthArgs) -> CliResult {
    let config = config_from(&a)?;
    let summary = hcsflow_synth::generate(&config, &a.out).map_err(|e| {
        // Configuration problems and an OUT that may not be written (not empty,
        // not a previous synthetic plate even with --overwrite, not a folder)
        // are usage errors; I/O failures are run-time failures.
        use hcsflow_synth::SynthError as E;
        let exit = if matches!(e, E::InvalidConfig(..) | E::NotEmpty { .. } | E::NotSynthetic { .. } | E::NotADirectory { .. }) {
            Exit::Usage
        } else {
            Exit::Failure
        };
        CliError::new(exit, anyhow::Error::new(e).context(format!("generating {}", a.out.display())))
    })?;
    outln!(
        "wrote {} plate to {}: {} wells × {} sites, {} images ({:.1} MB) in {:.2} s; {} nuclei; {} planes left out",
        summary.format,
        summary.out.display(),
        summary.wells.len(),
        summary.sites,
        summary.images_written,
        summary.bytes_written as f64 / 1e6,
        summary.seconds,
        summary.nuclei,
        summary.missing.len()
    )?;
    outln!("ground truth: {}", summary.out.join("ground_truth").display())?;
    Ok(())
}
