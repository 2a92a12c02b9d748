//! Synthetic ImageXpress and Opera Phenix plates with ground truth.
//!
//! No real plate can be downloaded in our environment, so this generator is
//! how every reader and every later step is tested. [`generate`] draws, per
//! well, a ground-truth frame of nuclei (Gaussian blobs of known centre, size
//! and per-channel brightness), cuts it into a grid of tiles with overlap and
//! per-tile stage jitter (fractional), multiplies by a known flat-field, adds a
//! dark offset, Poisson and read noise and a blur (the optics' in-focus blur,
//! `focus_blur_px`, and a defocus that grows with |z − z_focus|), and writes
//! the vendor layout and metadata as `shared/docs/formats.md` §4 describes,
//! plus `ground_truth/`:
//!
//! - `tile_positions.csv`: per (well, site) the true top-left position in the
//!   well frame (pixels), the nominal one, and the stage positions in µm the
//!   metadata reports and the true ones (image-oriented, as `hcsflow-plate` reports them);
//! - `flatfield.tif`: the f32 flat-field every tile was multiplied by;
//! - `nuclei.csv`: every nucleus: well, centre (px in the well frame and µm in
//!   the stage frame), radius, per-channel sigma and amplitude;
//! - `focus.json`: focus plane, z step, in-focus blur, defocus per plane;
//! - `missing.csv`: the planes left out on purpose;
//! - with `truth_images`, `truth_<well>_ch<c>.tif`: the noise-free, in-focus,
//!   un-vignetted signal of the whole well frame (f32), which tile (x_px, y_px)
//!   windows cut from — the reference for stitching and correction tests;
//!   and, with an in-focus blur (`focus_blur_px` > 0), `clean_<well>_ch<c>.tif`:
//!   the same signal blurred as the in-focus plane is — the noise-free image a
//!   denoiser can at best return (without the blur that is the truth image);
//! - `synth_config.json`: the configuration (re-running it gives the same bytes).
//!
//! Pixel model (u16): `dark_offset + Poisson(flatfield · signal) + N(0, read_noise²)`,
//! rounded and clipped; `signal = background + Σ blobs`.
//!
//! ```
//! use hcsflow_synth::{generate, SynthConfig};
//! use hcsflow_plate::{open_plate, Format};
//!
//! let dir = tempfile::tempdir()?;
//! let cfg = SynthConfig { format: Format::OperaPhenix, size: 64, z_planes: 3, ..SynthConfig::default() };
//! let summary = generate(&cfg, &dir.path().join("plate"))?;
//! let plate = open_plate(&dir.path().join("plate"), None)?;
//! assert_eq!(plate.images.len(), summary.images_written); // 2 wells x 9 sites x 2 channels x 3 z
//! println!("{}", hcsflow_plate::summary_text(&plate));
//! # Ok::<(), Box<dyn std::error::Error>>(())
//! ```

use std::collections::BTreeSet;
use std::path::{Path, PathBuf};
use std::time::Instant;

use hcsflow_core::DType;
use hcsflow_plate::well::{parse_well, plate_dimensions, well_name};
use hcsflow_plate::Format;
use hcsflow_tiff::TiffError;
use serde::{Deserialize, Serialize};

mod config;
mod layout;
pub mod render;
pub mod rng;
mod write;

pub use config::{GuidStyle, IxLayout, SynthConfig};
use layout::{Layout, Planes, Truth};
use write::PlateWriter;

/// Why a plate could not be generated. Errors about files name the file.
#[derive(Debug, thiserror::Error)]
pub enum SynthError {
    #[error("invalid synth configuration: {0}")]
    InvalidConfig(String),
    #[error("{path}: folder exists and is not empty; set overwrite to replace a previous synthetic plate")]
    NotEmpty { path: PathBuf },
    #[error("{path}: exists and is not a folder")]
    NotADirectory { path: PathBuf },
    #[error("{path}: refusing to overwrite: not a synthetic plate (no ground_truth/synth_config.json)")]
    NotSynthetic { path: PathBuf },
    #[error("{path}: {source}")]
    Io { path: PathBuf, source: std::io::Error },
    #[error(transparent)]
    Tiff(#[from] TiffError),
    /// A rendered plane whose pixel count is not its height × width: a bug in
    /// the generator, reported instead of writing a wrong image.
    #[error("internal error: the {what} has {got} pixels, not {height} x {width}")]
    PlaneSize { what: &'static str, height: usize, width: usize, got: usize },
}

pub(crate) fn io(path: &Path) -> impl FnOnce(std::io::Error) -> SynthError + '_ {
    move |source| SynthError::Io { path: path.to_path_buf(), source }
}

/// A plane left out on purpose.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct MissingPlane {
    pub well: String,
    pub site: u32,
    pub channel: u32,
    pub z_index: u32,
    pub timepoint: u32,
    /// "no-file" or (Phenix) "empty-url".
    pub kind: String,
}

/// True placement of one tile.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct TileTruth {
    pub well: String,
    /// Site number as the plate readers expose it (reading order over acquired cells).
    pub site: u32,
    /// Phenix FieldID (centre-first snake); equals `site` for ImageXpress.
    pub field_id: u32,
    pub grid_row: u32,
    pub grid_col: u32,
    /// True top-left corner in the well frame, pixels.
    pub x_px: f64,
    pub y_px: f64,
    pub nominal_x_px: f64,
    pub nominal_y_px: f64,
    /// Stage position of the tile centre the metadata reports, µm, image-oriented.
    pub stage_x_um: f64,
    pub stage_y_um: f64,
    /// Stage position of the true tile centre, µm, image-oriented.
    pub true_stage_x_um: f64,
    pub true_stage_y_um: f64,
}

/// What [`generate`] wrote.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct SynthSummary {
    pub out: PathBuf,
    pub format: Format,
    pub wells: Vec<String>,
    pub sites: u32,
    pub images_written: usize,
    pub thumbnails_written: usize,
    pub projections_written: usize,
    pub missing: Vec<MissingPlane>,
    pub tiles: Vec<TileTruth>,
    pub nuclei: usize,
    pub bytes_written: u64,
    pub seconds: f64,
}

/// Centre-first snake FieldIDs over a rows × cols grid (row-major input mask):
/// the centre cell is field 1, the rest follow a snake (even rows left→right,
/// odd rows right→left) numbered 2.. — `2 3 4 / 6 1 5 / 7 8 9` for 3×3.
pub fn snake_field_ids(rows: u32, cols: u32, present: &[bool]) -> Vec<Option<u32>> {
    let centre = ((rows - 1) / 2 * cols + (cols - 1) / 2) as usize;
    let mut ids = vec![None; (rows * cols) as usize];
    let mut next = 1;
    if present.get(centre).copied().unwrap_or(false) {
        ids[centre] = Some(1);
        next = 2;
    }
    for r in 0..rows {
        let order: Vec<u32> = if r % 2 == 0 { (0..cols).collect() } else { (0..cols).rev().collect() };
        for c in order {
            let i = (r * cols + c) as usize;
            if i != centre && present[i] {
                ids[i] = Some(next);
                next += 1;
            }
        }
    }
    ids
}

/// A well: name, 1-based row and column.
pub(crate) type WellRc = (String, u32, u32);

/// Checks the configuration; returns the plate rows, columns and the wells.
fn validate(cfg: &SynthConfig) -> Result<(u32, u32, Vec<WellRc>), SynthError> {
    let bad = |m: String| Err(SynthError::InvalidConfig(m));
    if !matches!(cfg.format, Format::ImageXpress | Format::OperaPhenix) {
        return bad(format!("format {}: synthetic plates are written as imagexpress or opera-phenix", cfg.format));
    }
    let Some((prow, pcol)) = plate_dimensions(cfg.plate_size).filter(|_| matches!(cfg.plate_size, 96 | 384 | 1536)) else {
        return bad(format!("plate_size must be 96, 384 or 1536, not {}", cfg.plate_size));
    };
    let mut wells = Vec::new();
    if cfg.wells.is_empty() {
        for r in 1..=prow {
            for c in 1..=pcol {
                wells.push((well_name(r, c).unwrap_or_default(), r, c));
            }
        }
    } else {
        let mut seen = BTreeSet::new();
        for w in &cfg.wells {
            let Some((r, c)) = parse_well(w) else { return bad(format!("'{w}' is not a well name (A01 .. AF48)")) };
            if r > prow || c > pcol {
                return bad(format!("well {w} is not on a {}-well plate ({prow} rows x {pcol} columns)", cfg.plate_size));
            }
            if seen.insert((r, c)) {
                wells.push((w.clone(), r, c));
            }
        }
        wells.sort_by_key(|w| (w.1, w.2));
    }
    for (name, v) in [("focus_blur_px", cfg.focus_blur_px), ("defocus_px_per_plane", cfg.defocus_px_per_plane)] {
        if !(v.is_finite() && v >= 0.0) {
            return bad(format!("{name} must be a finite number >= 0, not {v}"));
        }
    }
    if cfg.grid_rows == 0 || cfg.grid_cols == 0 || cfg.grid_rows * cfg.grid_cols > 999 {
        return bad("grid must be at least 1x1 and at most 999 sites".into());
    }
    let cells = cfg.grid_rows * cfg.grid_cols;
    if cfg.skip_sites.iter().any(|&s| s == 0 || s > cells) {
        return bad(format!("skip_sites must be 1..={cells}"));
    }
    if cfg.skip_sites.iter().collect::<BTreeSet<_>>().len() as u32 >= cells {
        return bad("skip_sites leaves no site".into());
    }
    if !(0.0..0.9).contains(&cfg.overlap) {
        return bad(format!("overlap must be in [0, 0.9), not {}", cfg.overlap));
    }
    if !(cfg.jitter_px >= 0.0 && cfg.jitter_px < f64::from(cfg.size) / 4.0) {
        return bad("jitter_px must be >= 0 and below a quarter of the tile size".into());
    }
    if cfg.channels == 0 || cfg.channels > 9 {
        return bad("channels must be 1..=9 (ImageXpress wave numbers are one digit)".into());
    }
    if cfg.z_planes == 0 || cfg.timepoints == 0 {
        return bad("z_planes and timepoints must be at least 1".into());
    }
    if cfg.size < 16 || cfg.size > 8192 {
        return bad("size must be 16..=8192".into());
    }
    if !(cfg.pixel_size_um > 0.0 && cfg.pixel_size_um.is_finite()) {
        return bad("pixel_size_um must be positive".into());
    }
    if cfg.dtype != DType::U16 {
        return bad(format!("dtype {} is not supported: instruments write u16", cfg.dtype));
    }
    if !matches!(cfg.format, Format::ImageXpress | Format::OperaPhenix) {
        return bad(format!("synthetic plates are written as imagexpress or opera-phenix, not {}", cfg.format));
    }
    if cfg.ix_layout == IxLayout::Flat && (cfg.timepoints > 1 || cfg.z_planes > 1) && cfg.format == Format::ImageXpress {
        return bad("the flat ImageXpress layout holds one time point and one z plane only".into());
    }
    if !hcsflow_plate::phenix::INDEX_NAMES.contains(&cfg.phenix_index_name.as_str()) {
        return bad(format!("phenix_index_name must be one of {:?}", hcsflow_plate::phenix::INDEX_NAMES));
    }
    if cfg.plate_name.is_empty() || cfg.plate_name.contains(['/', '\\']) {
        return bad("plate_name must be a non-empty file name".into());
    }
    if cfg.nucleus_radius_px.0 <= 0.0 || cfg.nucleus_radius_px.1 < cfg.nucleus_radius_px.0 {
        return bad("nucleus_radius_px must be (min, max) with 0 < min <= max".into());
    }
    if !(0.0..=2.0).contains(&cfg.nucleus_min_separation) {
        return bad("nucleus_min_separation must be within 0..=2 (a fraction of the two radii's sum)".into());
    }
    Ok((prow, pcol, wells))
}

fn prepare_out(cfg: &SynthConfig, out: &Path) -> Result<(), SynthError> {
    if out.exists() {
        if !out.is_dir() {
            return Err(SynthError::NotADirectory { path: out.to_path_buf() });
        }
        let non_empty = std::fs::read_dir(out).map_err(io(out))?.next().is_some();
        if non_empty {
            if !cfg.overwrite {
                return Err(SynthError::NotEmpty { path: out.to_path_buf() });
            }
            if !out.join("ground_truth").join("synth_config.json").is_file() {
                return Err(SynthError::NotSynthetic { path: out.to_path_buf() });
            }
            std::fs::remove_dir_all(out).map_err(io(out))?;
        }
    }
    std::fs::create_dir_all(out).map_err(io(out))
}

pub(crate) fn write_file(path: &Path, bytes: &[u8]) -> Result<(), SynthError> {
    std::fs::write(path, bytes).map_err(io(path))
}

/// Generates the plate described by `config` into the folder `out` (created if
/// needed). Refuses a non-empty folder unless `config.overwrite` is set and the
/// folder is a previous synthetic plate.
pub fn generate(config: &SynthConfig, out: &Path) -> Result<SynthSummary, SynthError> {
    let start = Instant::now();
    let (plate_rows, plate_cols, wells) = validate(config)?;
    prepare_out(config, out)?;
    let layout = Layout::new(config, out, plate_rows, plate_cols, wells);
    let truth = Truth::draw(&layout);
    let planes = Planes::choose(&layout)?;
    let writer = PlateWriter {
        layout: &layout,
        truth: &truth,
        planes: &planes,
        channel_names: (1..=config.channels).map(|c| config.channel_name(c)).collect(),
    };
    writer.create_folders()?;
    let written = writer.write_images()?;
    let projections_written = writer.write_projections()?;
    writer.write_descriptor()?;
    let nuclei = writer.write_ground_truth()?;
    Ok(SynthSummary {
        out: out.to_path_buf(),
        format: config.format,
        wells: layout.wells.iter().map(|w| w.0.clone()).collect(),
        sites: layout.cells.len() as u32,
        images_written: written.images,
        thumbnails_written: written.thumbnails,
        projections_written,
        missing: planes.missing,
        tiles: truth.tiles,
        nuclei,
        bytes_written: written.bytes,
        seconds: start.elapsed().as_secs_f64(),
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn snake_3x3_is_centre_first() {
        let ids: Vec<u32> = snake_field_ids(3, 3, &[true; 9]).into_iter().map(|x| x.unwrap()).collect();
        assert_eq!(ids, [2, 3, 4, 6, 1, 5, 7, 8, 9]);
    }

    #[test]
    fn snake_skips_absent_cells() {
        let mut p = [true; 9];
        p[0] = false;
        p[4] = false;
        let ids = snake_field_ids(3, 3, &p);
        assert_eq!(ids, [None, Some(1), Some(2), Some(4), None, Some(3), Some(5), Some(6), Some(7)]);
    }
}
