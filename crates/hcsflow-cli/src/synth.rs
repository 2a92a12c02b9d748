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
    /// imagexpress | opera-phenix [default: imagexpress].
    #[arg(long)]
    format: Option<String>,
    /// Wells to acquire, comma-separated (A01,B02). Default: A01,B02, or every well with --plate.
    #[arg(long, value_delimiter = ',')]
    wells: Vec<String>,
    /// Plate size: 96, 384 or 1536. Without --wells, every well of the plate is acquired.
    #[arg(long)]
    plate: Option<u32>,
    /// Site grid as ROWSxCOLS [default: 3x3].
    #[arg(long)]
    grid: Option<String>,
    /// Tile overlap as a fraction of the tile size [default: 0.1].
    #[arg(long)]
    overlap: Option<f64>,
    /// Maximum stage jitter per tile in pixels, fractional allowed [default: 2].
    #[arg(long)]
    jitter_px: Option<f64>,
    /// Number of channels [default: 2].
    #[arg(long)]
    channels: Option<u32>,
    /// Number of z planes [default: 1].
    #[arg(long)]
    z: Option<u32>,
    /// Number of time points [default: 1].
    #[arg(long)]
    timepoints: Option<u32>,
    /// Tile width and height in pixels [default: 256].
    #[arg(long)]
    size: Option<u32>,
    /// Seed of every random choice [default: 0].
    #[arg(long)]
    seed: Option<u64>,
    /// Plate (measurement) name; ImageXpress file prefix.
    #[arg(long)]
    plate_name: Option<String>,
    /// Pixel size in µm.
    #[arg(long)]
    pixel_size: Option<f64>,
    /// Leave out this many planes (reported as missing by `inspect`) [default: 0].
    #[arg(long)]
    missing_planes: Option<u32>,
    /// Raster cells (1-based) of the grid that are not acquired, comma-separated.
    #[arg(long, value_delimiter = ',')]
    skip_sites: Vec<u32>,
    /// ImageXpress: also write `_thumb` thumbnails.
    #[arg(long)]
    thumbnails: bool,
    /// ImageXpress GUID suffix: none | bare | bracketed [default: none].
    #[arg(long)]
    guid: Option<String>,
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
    /// Start from a JSON SynthConfig (its fields as `hcsflow-synth` names them; absent ones take
    /// their defaults); flags given explicitly apply on top, the others leave its values alone.
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
    if let Some(f) = &a.format {
        c.format = f.parse::<Format>().map_err(usage)?;
    }
    if let Some(n) = a.plate {
        c.plate_size = n;
        c.wells.clear();
    }
    if !a.wells.is_empty() {
        c.wells = a.wells.iter().map(|w| w.trim().to_string()).collect();
    }
    if let Some(grid) = &a.grid {
        (c.grid_rows, c.grid_cols) = grid
            .split_once(['x', 'X'])
            .and_then(|(r, k)| Some((r.trim().parse().ok()?, k.trim().parse().ok()?)))
            .ok_or_else(|| usage(anyhow::anyhow!("bad --grid '{grid}': expected ROWSxCOLS, e.g. 3x3")))?;
    }
    c.overlap = a.overlap.unwrap_or(c.overlap);
    c.jitter_px = a.jitter_px.unwrap_or(c.jitter_px);
    c.channels = a.channels.unwrap_or(c.channels);
    c.z_planes = a.z.unwrap_or(c.z_planes);
    c.timepoints = a.timepoints.unwrap_or(c.timepoints);
    c.size = a.size.unwrap_or(c.size);
    c.seed = a.seed.unwrap_or(c.seed);
    if let Some(n) = &a.plate_name {
        c.plate_name = n.clone();
    }
    if let Some(p) = a.pixel_size {
        c.pixel_size_um = p;
    }
    c.missing_planes = a.missing_planes.unwrap_or(c.missing_planes);
    if !a.skip_sites.is_empty() {
        c.skip_sites = a.skip_sites.clone();
    }
    c.thumbnails |= a.thumbnails;
    if let Some(guid) = &a.guid {
        c.guid_style = match guid.as_str() {
            "none" => GuidStyle::None,
            "bare" => GuidStyle::Bare,
            "bracketed" => GuidStyle::Bracketed,
            other => return Err(usage(anyhow::anyhow!("bad --guid '{other}': expected none, bare or bracketed"))),
        };
    }
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

#[cfg(test)]
mod tests {
    use clap::Parser;
    use hcsflow_synth::SynthConfig;

    use super::*;

    #[derive(Parser)]
    struct Cli {
        #[command(flatten)]
        synth: SynthArgs,
    }

    fn config(args: &[&str]) -> SynthConfig {
        let cli = Cli::try_parse_from(std::iter::once("synth").chain(args.iter().copied())).map_err(|e| e.to_string()).unwrap();
        config_from(&cli.synth).map_err(|e| format!("{e:?}")).unwrap()
    }

    #[test]
    fn without_flags_or_config_the_plate_is_the_synth_default() {
        assert_eq!(config(&["out"]), SynthConfig::default());
    }

    #[test]
    fn a_config_keeps_its_values_where_no_flag_is_given() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("synth.json");
        let mut from_file = SynthConfig {
            format: Format::OperaPhenix,
            grid_rows: 2,
            grid_cols: 5,
            overlap: 0.2,
            jitter_px: 0.5,
            channels: 1,
            z_planes: 3,
            timepoints: 2,
            size: 64,
            seed: 7,
            missing_planes: 1,
            guid_style: GuidStyle::Bare,
            read_noise: 40.0,
            ..SynthConfig::default()
        };
        std::fs::write(&path, serde_json::to_string(&from_file).unwrap()).unwrap();
        let file = path.to_str().unwrap();
        assert_eq!(config(&["out", "--config", file]), from_file);
        // Flags given explicitly win, the file's other values stay.
        let flagged = config(&["out", "--config", file, "--channels", "3", "--grid", "4x4", "--seed", "0", "--format", "imagexpress"]);
        (from_file.channels, from_file.grid_rows, from_file.grid_cols, from_file.seed, from_file.format) =
            (3, 4, 4, 0, Format::ImageXpress);
        assert_eq!(flagged, from_file);
    }
}
