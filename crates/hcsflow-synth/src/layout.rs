//! What a synthetic plate holds before any pixel is drawn: the site grid and
//! well frame geometry, the ground truth (tile placements, nuclei, flat-field)
//! and the planes to write or leave out.

use std::collections::BTreeSet;
use std::path::Path;

use hcsflow_plate::Format;
use rayon::prelude::*;

use crate::render::{self, NucleusIndex, TileSpec};
use crate::rng::{derive, Rng};
use crate::{snake_field_ids, MissingPlane, SynthConfig, SynthError, TileTruth, WellRc};

/// One acquired cell of the site grid.
pub(crate) struct Cell {
    pub row: u32,
    pub col: u32,
    /// ImageXpress site number (reading order over acquired cells).
    pub site: u32,
    /// Phenix FieldID (centre-first snake).
    pub field_id: u32,
}

/// The plate's geometry: wells, site grid, well frame, stage coordinates.
pub(crate) struct Layout<'a> {
    pub cfg: &'a SynthConfig,
    pub out: &'a Path,
    pub plate_rows: u32,
    pub plate_cols: u32,
    pub wells: Vec<WellRc>,
    /// Per raster cell of the grid (row-major), whether it is acquired.
    pub present: Vec<bool>,
    pub cells: Vec<Cell>,
    /// Nominal distance between tile origins, pixels.
    pub step: f64,
    /// Room around the tiles in the well frame for jitter, pixels.
    pub margin: f64,
    pub frame_w: f64,
    pub frame_h: f64,
    /// Distance between well centres, µm.
    pub pitch_um: f64,
}

impl<'a> Layout<'a> {
    /// The site grid and well frame of `cfg` (already validated).
    pub fn new(cfg: &'a SynthConfig, out: &'a Path, plate_rows: u32, plate_cols: u32, wells: Vec<WellRc>) -> Self {
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
        Layout { cfg, out, plate_rows, plate_cols, wells, present, cells, step, margin, frame_w, frame_h, pitch_um }
    }

    /// Image-oriented stage µm of a well-frame pixel coordinate.
    pub fn stage(&self, well: &WellRc, x: f64, y: f64) -> (f64, f64) {
        let px = self.cfg.pixel_size_um;
        match self.cfg.format {
            // validate() refuses the formats synth does not write.
            Format::ImageXpress | Format::Hcsflow | Format::OmeZarr | Format::OmeTiff => {
                (f64::from(well.2 - 1) * self.pitch_um + x * px, f64::from(well.1 - 1) * self.pitch_um + y * px)
            }
            Format::OperaPhenix => ((x - self.frame_w / 2.0) * px, (y - self.frame_h / 2.0) * px),
        }
    }

    /// Whether the grid has more than one cell (ImageXpress names then carry `_s<site>`).
    pub fn sites_on(&self) -> bool {
        self.cfg.grid_rows * self.cfg.grid_cols > 1
    }
}

/// The ground truth: where every tile is, what every well holds.
pub(crate) struct Truth {
    /// Per (well, cell), well-major.
    pub tiles: Vec<TileTruth>,
    /// Per well, its nuclei.
    pub indexes: Vec<NucleusIndex>,
    /// The flat-field every tile is multiplied by, row-major `size × size`.
    pub flat: Vec<f32>,
}

impl Truth {
    /// Draws the tile placements and nuclei, seeded by well position and grid
    /// cell (not list index): a well looks the same whichever other wells are
    /// generated with it.
    pub fn draw(l: &Layout) -> Truth {
        let cfg = l.cfg;
        let half = f64::from(cfg.size) / 2.0;
        let mut tiles = Vec::new();
        for w in &l.wells {
            for c in &l.cells {
                let cell_id = u64::from(c.row * cfg.grid_cols + c.col);
                let mut r = Rng::new(derive(cfg.seed, &[1, u64::from(w.1), u64::from(w.2), cell_id]));
                let nx = l.margin + f64::from(c.col) * l.step;
                let ny = l.margin + f64::from(c.row) * l.step;
                let x = nx + r.range(-cfg.jitter_px, cfg.jitter_px);
                let y = ny + r.range(-cfg.jitter_px, cfg.jitter_px);
                let (tsx, tsy) = l.stage(w, x + half, y + half);
                let (ssx, ssy) = if cfg.stage_reports_truth { (tsx, tsy) } else { l.stage(w, nx + half, ny + half) };
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
        let indexes: Vec<NucleusIndex> = l
            .wells
            .par_iter()
            .map(|w| {
                let mut r = Rng::new(derive(cfg.seed, &[2, u64::from(w.1), u64::from(w.2)]));
                let nuclei = render::draw_nuclei(&mut r, l.frame_w, l.frame_h, cfg.nuclei_density, cfg.nucleus_radius_px, cfg.channels);
                let nuclei = render::separate(nuclei, cfg.nucleus_min_separation);
                NucleusIndex::new(nuclei, l.frame_w, l.frame_h)
            })
            .collect();
        let flat = render::flatfield(cfg.size as usize, cfg.flatfield_strength);
        Truth { tiles, indexes, flat }
    }
}

/// One plane of the plate.
#[derive(Clone, Copy)]
pub(crate) struct Job {
    /// Index into [`Layout::wells`].
    pub well: usize,
    /// Index into [`Layout::cells`].
    pub cell: usize,
    pub channel: u32,
    pub z: u32,
    pub t: u32,
}

/// Every plane of the plate, and those left out on purpose.
pub(crate) struct Planes {
    /// Time point, well, cell, channel, z order.
    pub jobs: Vec<Job>,
    pub missing: Vec<MissingPlane>,
    /// Indices into `jobs` of the planes left out.
    pub missing_set: BTreeSet<usize>,
    /// Indices into `jobs` of the left-out planes whose index entry has an empty URL (Phenix).
    pub empty_url: BTreeSet<usize>,
}

impl Planes {
    /// Lists the planes and picks `missing_planes` of them at random; refuses
    /// to leave out every plane.
    pub fn choose(l: &Layout) -> Result<Planes, SynthError> {
        let cfg = l.cfg;
        let mut jobs = Vec::new();
        for t in 1..=cfg.timepoints {
            for well in 0..l.wells.len() {
                for cell in 0..l.cells.len() {
                    for channel in 1..=cfg.channels {
                        for z in 1..=cfg.z_planes {
                            jobs.push(Job { well, cell, channel, z, t });
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
                    well: l.wells[job.well].0.clone(),
                    site: l.cells[job.cell].site,
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
        Ok(Planes { jobs, missing, missing_set, empty_url })
    }
}

/// The render specification of the plane `job` (`seed_tag` separates the
/// noise of different uses of the same plane).
pub(crate) fn tile_spec<'t>(l: &Layout, truth: &'t Truth, job: &Job, seed_tag: u64) -> TileSpec<'t> {
    let cfg = l.cfg;
    let tile = &truth.tiles[job.well * l.cells.len() + job.cell];
    let cell = &l.cells[job.cell];
    TileSpec {
        x0: tile.x_px,
        y0: tile.y_px,
        width: cfg.size as usize,
        height: cfg.size as usize,
        channel: (job.channel - 1) as usize,
        defocus: cfg.blur_at(job.z),
        background: cfg.background,
        dark_offset: cfg.dark_offset,
        read_noise: cfg.read_noise,
        flatfield: &truth.flat,
        seed: derive(
            cfg.seed,
            &[
                seed_tag,
                u64::from(l.wells[job.well].1),
                u64::from(l.wells[job.well].2),
                u64::from(cell.row * cfg.grid_cols + cell.col),
                u64::from(job.channel),
                u64::from(job.z),
                u64::from(job.t),
            ],
        ),
    }
}
