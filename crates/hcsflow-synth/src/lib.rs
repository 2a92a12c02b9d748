//! Synthetic ImageXpress and Opera Phenix plates with ground truth.
//!
//! No real plate can be downloaded in our environment, so this generator is
//! how every reader and every later step is tested. [`generate`] draws, per
//! well, a ground-truth frame of nuclei (Gaussian blobs of known centre, size
//! and per-channel brightness), cuts it into a grid of tiles with overlap and
//! per-tile stage jitter (fractional), multiplies by a known flat-field, adds a
//! dark offset, Poisson and read noise and a defocus blur that grows with
//! |z − z_focus|, and writes the vendor layout and metadata as
//! `shared/docs/formats.md` §4 describes, plus `ground_truth/`:
//!
//! - `tile_positions.csv`: per (well, site) the true top-left position in the
//!   well frame (pixels), the nominal one, and the stage positions in µm the
//!   metadata reports and the true ones (image-oriented, as `hcsflow-plate` reports them);
//! - `flatfield.tif`: the f32 flat-field every tile was multiplied by;
//! - `nuclei.csv`: every nucleus: well, centre (px in the well frame and µm in
//!   the stage frame), radius, per-channel sigma and amplitude;
//! - `focus.json`: focus plane, z step, defocus per plane;
//! - `missing.csv`: the planes left out on purpose;
//! - with `truth_images`, `truth_<well>_ch<c>.tif`: the noise-free, in-focus,
//!   un-vignetted signal of the whole well frame (f32), which tile (x_px, y_px)
//!   windows cut from — the reference for stitching and correction tests;
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
use std::fmt::Write as _;
use std::path::{Path, PathBuf};
use std::time::Instant;

use hcsflow_core::{DType, Stack};
use hcsflow_plate::well::{parse_well, plate_dimensions, well_name};
use hcsflow_plate::Format;
use hcsflow_tiff::{write_stack, TiffError, WriteOptions};
use ndarray::Array3;
use rayon::prelude::*;
use serde::{Deserialize, Serialize};

mod config;
pub mod render;
pub mod rng;
mod vendor;

pub use config::{GuidStyle, IxLayout, SynthConfig};
use render::{NucleusIndex, TileSpec};
use rng::{derive, Rng};

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
}

fn io(path: &Path) -> impl FnOnce(std::io::Error) -> SynthError + '_ {
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

struct Cell {
    row: u32,
    col: u32,
    site: u32,
    field_id: u32,
}

struct Job {
    well: usize,
    cell: usize,
    channel: u32,
    z: u32,
    t: u32,
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
type WellRc = (String, u32, u32);

/// Checks the configuration; returns the plate rows, columns and the wells.
fn validate(cfg: &SynthConfig) -> Result<(u32, u32, Vec<WellRc>), SynthError> {
    let bad = |m: String| Err(SynthError::InvalidConfig(m));
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

fn write_file(path: &Path, bytes: &[u8]) -> Result<(), SynthError> {
    std::fs::write(path, bytes).map_err(io(path))
}

/// Generates the plate described by `config` into the folder `out` (created if
/// needed). Refuses a non-empty folder unless `config.overwrite` is set and the
/// folder is a previous synthetic plate.
pub fn generate(config: &SynthConfig, out: &Path) -> Result<SynthSummary, SynthError> {
    let start = Instant::now();
    let cfg = config;
    let (prow, pcol, wells) = validate(cfg)?;
    prepare_out(cfg, out)?;
    let size = cfg.size as usize;
    let px = cfg.pixel_size_um;

    // Site grid: acquired cells, IX site numbers (reading order), Phenix field IDs.
    let ncell = cfg.grid_rows * cfg.grid_cols;
    let present: Vec<bool> = (1..=ncell).map(|i| !cfg.skip_sites.contains(&i)).collect();
    let fields = snake_field_ids(cfg.grid_rows, cfg.grid_cols, &present);
    let mut cells = Vec::new();
    for i in 0..ncell {
        if present[i as usize] {
            cells.push(Cell {
                row: i / cfg.grid_cols,
                col: i % cfg.grid_cols,
                site: cells.len() as u32 + 1,
                field_id: fields[i as usize].unwrap_or(0),
            });
        }
    }

    // Well frame geometry.
    let step = f64::from(cfg.size) * (1.0 - cfg.overlap);
    let margin = cfg.jitter_px.ceil() + 2.0;
    let frame_w = 2.0 * margin + step * f64::from(cfg.grid_cols - 1) + f64::from(cfg.size);
    let frame_h = 2.0 * margin + step * f64::from(cfg.grid_rows - 1) + f64::from(cfg.size);
    let pitch_um = match cfg.plate_size {
        96 => 9000.0,
        384 => 4500.0,
        _ => 2250.0,
    };
    // Image-oriented stage µm of a well-frame pixel coordinate.
    let stage = |well: &WellRc, x: f64, y: f64| -> (f64, f64) {
        match cfg.format {
            Format::ImageXpress => (f64::from(well.2 - 1) * pitch_um + x * px, f64::from(well.1 - 1) * pitch_um + y * px),
            Format::OperaPhenix => ((x - frame_w / 2.0) * px, (y - frame_h / 2.0) * px),
        }
    };

    // Truth: tiles and nuclei per well.
    let half = f64::from(cfg.size) / 2.0;
    let mut tiles = Vec::new();
    for w in &wells {
        for c in &cells {
            // seeded by well position and grid cell, not list index: a well
            // looks the same whichever other wells are generated with it
            let cell_id = u64::from(c.row * cfg.grid_cols + c.col);
            let mut r = Rng::new(derive(cfg.seed, &[1, u64::from(w.1), u64::from(w.2), cell_id]));
            let nx = margin + f64::from(c.col) * step;
            let ny = margin + f64::from(c.row) * step;
            let x = nx + r.range(-cfg.jitter_px, cfg.jitter_px);
            let y = ny + r.range(-cfg.jitter_px, cfg.jitter_px);
            let (tsx, tsy) = stage(w, x + half, y + half);
            let (ssx, ssy) = if cfg.stage_reports_truth { (tsx, tsy) } else { stage(w, nx + half, ny + half) };
            tiles.push(TileTruth {
                well: w.0.clone(),
                site: c.site,
                field_id: if cfg.format == Format::OperaPhenix { c.field_id } else { c.site },
                grid_row: c.row,
                grid_col: c.col,
                x_px: x,
                y_px: y,
                nominal_x_px: nx,
                nominal_y_px: ny,
                stage_x_um: ssx,
                stage_y_um: ssy,
                true_stage_x_um: tsx,
                true_stage_y_um: tsy,
            });
        }
    }
    let indexes: Vec<NucleusIndex> = wells
        .par_iter()
        .map(|w| {
            let mut r = Rng::new(derive(cfg.seed, &[2, u64::from(w.1), u64::from(w.2)]));
            let nuclei = render::draw_nuclei(&mut r, frame_w, frame_h, cfg.nuclei_density, cfg.nucleus_radius_px, cfg.channels);
            NucleusIndex::new(nuclei, frame_w, frame_h)
        })
        .collect();
    let flat = render::flatfield(size, cfg.flatfield_strength);

    // Jobs and the planes left out.
    let mut jobs = Vec::new();
    for t in 1..=cfg.timepoints {
        for wi in 0..wells.len() {
            for ci in 0..cells.len() {
                for ch in 1..=cfg.channels {
                    for z in 1..=cfg.z_planes {
                        jobs.push(Job { well: wi, cell: ci, channel: ch, z, t });
                    }
                }
            }
        }
    }
    if cfg.missing_planes as usize >= jobs.len() {
        return Err(SynthError::InvalidConfig(format!(
            "missing_planes ({}) must leave at least one of the {} planes",
            cfg.missing_planes,
            jobs.len()
        )));
    }
    let mut order: Vec<usize> = (0..jobs.len()).collect();
    let mut mr = Rng::new(derive(cfg.seed, &[3]));
    for i in 0..cfg.missing_planes as usize {
        let j = i + (mr.next_u64() % (order.len() - i) as u64) as usize;
        order.swap(i, j);
    }
    let mut missing_idx: Vec<usize> = order[..cfg.missing_planes as usize].to_vec();
    missing_idx.sort_unstable();
    // Phenix: alternate "empty URL" and "URL but no file".
    let missing_kind = |k: usize| if cfg.format == Format::OperaPhenix && k & 1 == 0 { "empty-url" } else { "no-file" };
    let missing: Vec<MissingPlane> = missing_idx
        .iter()
        .enumerate()
        .map(|(k, &j)| {
            let job = &jobs[j];
            MissingPlane {
                well: wells[job.well].0.clone(),
                site: cells[job.cell].site,
                channel: job.channel,
                z_index: job.z,
                timepoint: job.t,
                kind: missing_kind(k).into(),
            }
        })
        .collect();
    let missing_set: BTreeSet<usize> = missing_idx.iter().copied().collect();
    let empty_url: BTreeSet<usize> =
        missing_idx.iter().enumerate().filter(|(k, _)| missing_kind(*k) == "empty-url").map(|(_, &j)| j).collect();

    let z_focus = cfg.focus_plane();
    let spec_for = |job: &Job, seed_tag: u64| TileSpec {
        x0: tiles[job.well * cells.len() + job.cell].x_px,
        y0: tiles[job.well * cells.len() + job.cell].y_px,
        width: size,
        height: size,
        channel: (job.channel - 1) as usize,
        defocus: cfg.defocus_px_per_plane * (f64::from(job.z) - z_focus).abs(),
        background: cfg.background,
        dark_offset: cfg.dark_offset,
        read_noise: cfg.read_noise,
        flatfield: &flat,
        seed: derive(
            cfg.seed,
            &[
                seed_tag,
                u64::from(wells[job.well].1),
                u64::from(wells[job.well].2),
                u64::from(cells[job.cell].row * cfg.grid_cols + cells[job.cell].col),
                u64::from(job.channel),
                u64::from(job.z),
                u64::from(job.t),
            ],
        ),
    };
    // Renders into a worker's reused buffers (scratch signal, u16 stack).
    let plane_into = |job: &Job, sig: &mut Vec<f32>, stack: &mut Stack| {
        if let Stack::U16(a) = stack {
            if let Some(px) = a.as_slice_mut() {
                render::render_tile_into(&indexes[job.well], &spec_for(job, 4), sig, px);
            }
        }
    };
    let new_buffers = || (Vec::<f32>::new(), Stack::U16(Array3::zeros((1, size, size))));

    let channel_names: Vec<String> = (1..=cfg.channels).map(|c| cfg.channel_name(c)).collect();
    let ext = if cfg.upper_case_tif { "TIF" } else { "tif" };
    let sites_on = ncell > 1;
    let waves_on = cfg.channels > 1;
    let guid_of = |j: usize, tag: u64| Rng::new(derive(cfg.seed, &[tag, j as u64])).guid();
    let ix_stem = |job: &Job| {
        let mut s = format!("{}_{}", cfg.plate_name, wells[job.well].0);
        if sites_on {
            let _ = write!(s, "_s{}", cells[job.cell].site);
        }
        if waves_on {
            let _ = write!(s, "_w{}", job.channel);
        }
        s
    };
    let ix_dir = |t: u32, z: Option<u32>| -> PathBuf {
        match (cfg.ix_layout, z) {
            (IxLayout::Flat, _) => out.to_path_buf(),
            (IxLayout::TimePoint, Some(z)) if cfg.z_planes > 1 => out.join(format!("TimePoint_{t}")).join(format!("ZStep_{z}")),
            (IxLayout::TimePoint, _) => out.join(format!("TimePoint_{t}")),
        }
    };
    let phenix_name = |job: &Job| {
        let f = cells[job.cell].field_id;
        let ff = if f > 99 { format!("{f:03}") } else { format!("{f:02}") };
        let (_, r, c) = &wells[job.well];
        format!("r{r:02}c{c:02}f{ff}p{:02}-ch{}sk{}fk1fl1.tiff", job.z, job.channel, job.t)
    };

    // Folders.
    let mut dirs = BTreeSet::new();
    match cfg.format {
        Format::ImageXpress => {
            for t in 1..=cfg.timepoints {
                for z in 1..=cfg.z_planes {
                    dirs.insert(ix_dir(t, Some(z)));
                }
            }
        }
        Format::OperaPhenix => {
            dirs.insert(out.join("Images"));
        }
    }
    dirs.insert(out.join("ground_truth"));
    for d in &dirs {
        std::fs::create_dir_all(d).map_err(io(d))?;
    }

    // Pixels, in parallel over planes.
    let tile_of = |job: &Job| &tiles[job.well * cells.len() + job.cell];
    let results: Vec<Result<u64, SynthError>> = jobs
        .par_iter()
        .enumerate()
        .filter(|(j, _)| !missing_set.contains(j))
        .map_init(new_buffers, |(sig, stack), (j, job)| {
            plane_into(job, sig, stack);
            let stack = &*stack;
            let tile = tile_of(job);
            let (path, opts) = match cfg.format {
                Format::ImageXpress => {
                    let mut name = ix_stem(job);
                    match cfg.guid_style {
                        GuidStyle::None => {}
                        GuidStyle::Bare => name.push_str(&guid_of(j, 5)),
                        GuidStyle::Bracketed => {
                            let _ = write!(name, "_[{}]", guid_of(j, 5));
                        }
                    }
                    let desc = vendor::metaseries_xml(&vendor::MetaSeries {
                        pixel_size_um: px,
                        stage_x_um: tile.stage_x_um,
                        stage_y_um: tile.stage_y_um,
                        z_um: f64::from(job.z - 1) * cfg.z_step_um,
                        wavelength_nm: cfg.emission_nm(job.channel),
                        channel_name: &channel_names[(job.channel - 1) as usize],
                        stage_label: format!("{} : Site_{}", tile.well, tile.site),
                        width: cfg.size,
                        height: cfg.size,
                    });
                    let opts = WriteOptions { description: Some(desc), pixel_size_um: Some(px), ..WriteOptions::default() };
                    (ix_dir(job.t, Some(job.z)).join(format!("{name}.{ext}")), opts)
                }
                Format::OperaPhenix => {
                    let harmony = format!(
                        "<?xml version=\"1.0\" encoding=\"utf-8\"?><Harmony xmlns=\"http://www.perkinelmer.com/PEHH/HarmonyV5\"><Image><ChannelName>{}</ChannelName></Image></Harmony>",
                        vendor::xml_escape(&channel_names[(job.channel - 1) as usize])
                    );
                    let opts = WriteOptions { pixel_size_um: Some(px), extra_ascii_tags: vec![(65500, harmony)], ..WriteOptions::default() };
                    (out.join("Images").join(phenix_name(job)), opts)
                }
            };
            write_stack(&path, stack, &opts)?;
            let mut bytes = (size * size * 2) as u64;
            if cfg.format == Format::ImageXpress && cfg.thumbnails && job.z == 1 {
                let thumb = downsample(stack, 8);
                let tpath = ix_dir(job.t, Some(job.z)).join(format!("{}_thumb{}.{ext}", ix_stem(job), guid_of(j, 6)));
                write_stack(&tpath, &thumb, &WriteOptions::default())?;
                bytes += thumb.nbytes() as u64;
            }
            Ok(bytes)
        })
        .collect();
    let mut bytes_written = 0;
    for r in results {
        bytes_written += r?;
    }
    let images_written = jobs.len() - missing_set.len();
    let thumbnails_written = if cfg.format == Format::ImageXpress && cfg.thumbnails {
        jobs.iter().enumerate().filter(|(j, job)| job.z == 1 && !missing_set.contains(j)).count()
    } else {
        0
    };

    // ImageXpress z projections: max over z of the very planes written.
    let mut projections_written = 0;
    if cfg.format == Format::ImageXpress && cfg.z_projection && cfg.z_planes > 1 {
        let firsts: Vec<&Job> = jobs.iter().filter(|j| j.z == 1).collect();
        let res: Vec<Result<(), SynthError>> = firsts
            .par_iter()
            .map(|job| {
                let mut acc = vec![0u16; size * size];
                for z in 1..=cfg.z_planes {
                    let j = Job { z, ..**job };
                    let v = render::render_tile(&indexes[job.well], &spec_for(&j, 4));
                    for (a, b) in acc.iter_mut().zip(v) {
                        *a = (*a).max(b);
                    }
                }
                let stack = Stack::U16(Array3::from_shape_vec((1, size, size), acc).unwrap_or_else(|_| Array3::zeros((1, size, size))));
                let path = out.join(format!("TimePoint_{}", job.t)).join(format!("{}.{ext}", ix_stem(job)));
                write_stack(&path, &stack, &WriteOptions { pixel_size_um: Some(px), ..WriteOptions::default() })?;
                Ok(())
            })
            .collect();
        for r in res {
            r?;
        }
        projections_written = firsts.len();
    }

    // Descriptor.
    let well_rc: Vec<(u32, u32)> = wells.iter().map(|w| (w.1, w.2)).collect();
    match cfg.format {
        Format::ImageXpress => {
            let description_bytes = if cfg.cp1252_description {
                // "Synthetic plate – 0.65 µm/px" in Windows-1252: en dash 0x96, micro 0xB5
                let mut d = b"Synthetic plate \x96 ".to_vec();
                d.extend_from_slice(format!("{px} ").as_bytes());
                d.extend_from_slice(b"\xB5m/px");
                d
            } else {
                format!("Synthetic plate - {px} um/px").into_bytes()
            };
            let bytes = vendor::htd_bytes(&vendor::HtdSpec {
                description_bytes,
                timepoints: cfg.timepoints,
                z_steps: cfg.z_planes,
                z_projection: cfg.z_projection && cfg.z_planes > 1,
                plate_rows: prow,
                plate_cols: pcol,
                wells: &well_rc,
                grid_rows: cfg.grid_rows,
                grid_cols: cfg.grid_cols,
                site_selected: &present,
                sites_on,
                wave_names: &channel_names,
                guid: Rng::new(derive(cfg.seed, &[7])).guid(),
            });
            write_file(&out.join(format!("{}.HTD", cfg.plate_name)), &bytes)?;
        }
        Format::OperaPhenix => {
            let entries: Vec<vendor::IndexImage> = jobs
                .iter()
                .enumerate()
                .map(|(j, job)| {
                    let tile = tile_of(job);
                    vendor::IndexImage {
                        url: if empty_url.contains(&j) { String::new() } else { phenix_name(job) },
                        row: wells[job.well].1,
                        col: wells[job.well].2,
                        field: cells[job.cell].field_id,
                        plane: job.z,
                        timepoint: job.t - 1,
                        channel: job.channel,
                        channel_name: &channel_names[(job.channel - 1) as usize],
                        resolution_m: px * 1e-6,
                        size: cfg.size,
                        pos_x_m: tile.stage_x_um * 1e-6,
                        // stage Y grows upward: image-oriented y is its negative
                        pos_y_m: -tile.stage_y_um * 1e-6,
                        pos_z_m: f64::from(job.z - 1) * cfg.z_step_um * 1e-6,
                        emission_nm: cfg.emission_nm(job.channel),
                        time_offset_s: f64::from(job.t - 1) * 600.0,
                    }
                })
                .collect();
            let xml = vendor::harmony_index(&cfg.plate_name, cfg.harmony_v6, prow, pcol, &well_rc, &entries);
            let mut bytes = b"\xEF\xBB\xBF".to_vec();
            bytes.extend_from_slice(xml.as_bytes());
            write_file(&out.join("Images").join(&cfg.phenix_index_name), &bytes)?;
        }
    }

    // Ground truth.
    let gt = out.join("ground_truth");
    let mut csv = String::from(
        "well,site,field_id,grid_row,grid_col,x_px,y_px,nominal_x_px,nominal_y_px,stage_x_um,stage_y_um,true_stage_x_um,true_stage_y_um\n",
    );
    for t in &tiles {
        let _ = writeln!(
            csv,
            "{},{},{},{},{},{},{},{},{},{},{},{},{}",
            t.well,
            t.site,
            t.field_id,
            t.grid_row,
            t.grid_col,
            t.x_px,
            t.y_px,
            t.nominal_x_px,
            t.nominal_y_px,
            t.stage_x_um,
            t.stage_y_um,
            t.true_stage_x_um,
            t.true_stage_y_um
        );
    }
    write_file(&gt.join("tile_positions.csv"), csv.as_bytes())?;
    let mut ncsv = String::from("well,nucleus,x_px,y_px,x_um,y_um,radius_px");
    for c in 1..=cfg.channels {
        let _ = write!(ncsv, ",sigma_px_ch{c},amplitude_ch{c}");
    }
    ncsv.push('\n');
    let mut nuclei = 0;
    for (w, idx) in wells.iter().zip(&indexes) {
        for (i, n) in idx.nuclei.iter().enumerate() {
            let (xu, yu) = stage(w, n.x, n.y);
            let _ = write!(ncsv, "{},{},{},{},{},{},{}", w.0, i + 1, n.x, n.y, xu, yu, n.radius);
            for c in 0..cfg.channels as usize {
                let _ = write!(ncsv, ",{},{}", n.sigma[c], n.amplitude[c]);
            }
            ncsv.push('\n');
            nuclei += 1;
        }
    }
    write_file(&gt.join("nuclei.csv"), ncsv.as_bytes())?;
    let mut mcsv = String::from("well,site,channel,z_index,timepoint,kind\n");
    for m in &missing {
        let _ = writeln!(mcsv, "{},{},{},{},{},{}", m.well, m.site, m.channel, m.z_index, m.timepoint, m.kind);
    }
    write_file(&gt.join("missing.csv"), mcsv.as_bytes())?;
    let focus = serde_json::json!({
        "z_focus": z_focus,
        "z_planes": cfg.z_planes,
        "z_step_um": cfg.z_step_um,
        "defocus_sigma_px_per_plane": cfg.defocus_px_per_plane,
        "note": "blur sigma added at plane z = defocus_sigma_px_per_plane * |z - z_focus| (planes 1-based)"
    });
    write_file(&gt.join("focus.json"), focus.to_string().as_bytes())?;
    let ff = Stack::F32(Array3::from_shape_vec((1, size, size), flat.clone()).unwrap_or_else(|_| Array3::zeros((1, size, size))));
    write_stack(&gt.join("flatfield.tif"), &ff, &WriteOptions::default())?;
    if cfg.truth_images {
        let (fw, fh) = (frame_w.ceil() as usize, frame_h.ceil() as usize);
        let res: Vec<Result<(), SynthError>> = (0..wells.len())
            .flat_map(|wi| (1..=cfg.channels).map(move |c| (wi, c)))
            .collect::<Vec<_>>()
            .par_iter()
            .map(|&(wi, c)| {
                let spec = TileSpec {
                    x0: 0.0,
                    y0: 0.0,
                    width: fw,
                    height: fh,
                    channel: (c - 1) as usize,
                    defocus: 0.0,
                    background: cfg.background,
                    dark_offset: 0.0,
                    read_noise: 0.0,
                    flatfield: &[],
                    seed: 0,
                };
                let sig = render::render_signal(&indexes[wi], &spec);
                let stack = Stack::F32(Array3::from_shape_vec((1, fh, fw), sig).unwrap_or_else(|_| Array3::zeros((1, fh, fw))));
                let path = gt.join(format!("truth_{}_ch{c}.tif", wells[wi].0));
                write_stack(&path, &stack, &WriteOptions { pixel_size_um: Some(px), ..WriteOptions::default() })?;
                Ok(())
            })
            .collect();
        for r in res {
            r?;
        }
    }
    let cfg_json = serde_json::to_string_pretty(cfg).map_err(|e| SynthError::InvalidConfig(e.to_string()))?;
    write_file(&gt.join("synth_config.json"), cfg_json.as_bytes())?;

    Ok(SynthSummary {
        out: out.to_path_buf(),
        format: cfg.format,
        wells: wells.iter().map(|w| w.0.clone()).collect(),
        sites: cells.len() as u32,
        images_written,
        thumbnails_written,
        projections_written,
        missing,
        tiles,
        nuclei,
        bytes_written,
        seconds: start.elapsed().as_secs_f64(),
    })
}

/// Block-mean downsampling by `f` (thumbnails).
fn downsample(s: &Stack, f: usize) -> Stack {
    let a = match s {
        Stack::U16(a) => a,
        _ => return s.clone(),
    };
    let (_, h, w) = a.dim();
    let (th, tw) = ((h / f).max(1), (w / f).max(1));
    let mut out = Array3::<u16>::zeros((1, th, tw));
    for y in 0..th {
        for x in 0..tw {
            let mut sum = 0u64;
            let mut n = 0u64;
            for yy in y * f..((y + 1) * f).min(h) {
                for xx in x * f..((x + 1) * f).min(w) {
                    sum += u64::from(a[[0, yy, xx]]);
                    n += 1;
                }
            }
            out[[0, y, x]] = (sum / n.max(1)) as u16;
        }
    }
    Stack::U16(out)
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
