//! Synthetic plates from hcsflow-synth, read back like a pipeline would
//! (plate metadata → layout, TIFFs → stack), with their ground truth.
//! Shared by the tests and the `accuracy` example.
#![allow(dead_code)]

use std::path::Path;

use hcsflow_core::Stack;
use hcsflow_plate::{open_plate, Format};
use hcsflow_stitch::TileLayout;
use hcsflow_synth::{generate, SynthConfig};

/// One synthetic grid.
#[derive(Debug, Clone)]
pub struct Case {
    pub name: String,
    pub rows: u32,
    pub cols: u32,
    pub size: u32,
    pub overlap: f64,
    pub jitter_px: f64,
    pub seed: u64,
    /// Nuclei per 10⁶ px² (synth default 250).
    pub density: f64,
    pub skip_sites: Vec<u32>,
    pub format: Format,
}

impl Case {
    pub fn new(rows: u32, cols: u32, size: u32, overlap: f64, jitter_frac: f64, seed: u64) -> Case {
        Case {
            name: format!("{rows}x{cols}x{size} ov{:.0}% jit{:.1}% s{seed}", overlap * 100.0, jitter_frac * 100.0),
            rows,
            cols,
            size,
            overlap,
            jitter_px: jitter_frac * f64::from(size),
            seed,
            density: 250.0,
            skip_sites: Vec::new(),
            format: Format::ImageXpress,
        }
    }
}

/// Tiles (site order), layout from the plate metadata, true top-left positions.
pub struct Loaded {
    pub tiles: Stack,
    pub layout: TileLayout,
    pub truth: Vec<(f64, f64)>,
    pub pixel_size_um: f64,
}

pub fn load(case: &Case, dir: &Path) -> Loaded {
    let cfg = SynthConfig {
        format: case.format,
        wells: vec!["A01".into()],
        grid_rows: case.rows,
        grid_cols: case.cols,
        skip_sites: case.skip_sites.clone(),
        overlap: case.overlap,
        jitter_px: case.jitter_px,
        channels: 1,
        size: case.size,
        seed: case.seed,
        nuclei_density: case.density,
        overwrite: true,
        ..SynthConfig::default()
    };
    let summary = generate(&cfg, dir).expect("generate");
    let plate = open_plate(dir, None).expect("open plate");
    let md = &plate.metadata;
    let px = md.pixel_size_um.expect("pixel size");
    let mut sites: Vec<u32> = plate.images.iter().filter(|i| i.well == "A01").map(|i| i.site).collect();
    sites.sort_unstable();
    sites.dedup();
    let mut planes = Vec::new();
    let mut cells = Vec::new();
    let mut stage = Vec::new();
    let mut truth = Vec::new();
    for &s in &sites {
        let img = plate.image("A01", s, 1, 1, 1).expect("image");
        planes.push(hcsflow_tiff::read_stack(&img.path).expect("read"));
        cells.push(md.site_cell(s).expect("cell"));
        stage.push(md.stage_position("A01", s).expect("stage"));
        let t = summary.tiles.iter().find(|t| t.well == "A01" && t.site == s).expect("truth");
        truth.push((t.x_px, t.y_px));
    }
    let tiles = Stack::concat(&planes).expect("same-size tiles");
    let layout = TileLayout::from_stage_um(&cells, &stage, px).expect("layout");
    Loaded { tiles, layout, truth, pixel_size_um: px }
}

/// Max and mean Euclidean error after removing the mean offset (positions
/// are relative: any global translation is as good as another).
pub fn errors(pos: &[(f64, f64)], truth: &[(f64, f64)]) -> (f64, f64) {
    let n = pos.len() as f64;
    let mx = pos.iter().zip(truth).map(|(p, t)| p.0 - t.0).sum::<f64>() / n;
    let my = pos.iter().zip(truth).map(|(p, t)| p.1 - t.1).sum::<f64>() / n;
    let e: Vec<f64> = pos.iter().zip(truth).map(|(p, t)| ((p.0 - t.0 - mx).powi(2) + (p.1 - t.1 - my).powi(2)).sqrt()).collect();
    (e.iter().copied().fold(0.0, f64::max), e.iter().sum::<f64>() / n)
}
