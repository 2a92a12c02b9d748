//! Where the tiles are expected to be, before registration.

use crate::StitchError;

/// The expected placement of one tile.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct TileInfo {
    /// Grid cell (0-based), for reports; neighbours are found from the stage positions.
    pub row: u32,
    pub col: u32,
    /// Expected top-left corner in pixels (stage position / pixel size). Any
    /// origin: only differences between tiles matter, and the computed
    /// positions are returned in this same frame.
    pub stage_x_px: f64,
    pub stage_y_px: f64,
}

/// The expected placement of every tile of a [`Stack`](hcsflow_core::Stack),
/// in the stack's plane order (one entry per plane).
///
/// A missing tile is simply absent: the stack holds the tiles that exist and
/// the layout lists their cells. Neighbours are the pairs whose expected
/// rectangles overlap along a side (not only at a corner), so grids with holes,
/// 1×N strips and Opera Phenix fields placed by stage position all work the same way.
#[derive(Debug, Clone, PartialEq, Default)]
pub struct TileLayout {
    pub tiles: Vec<TileInfo>,
}

impl TileLayout {
    /// A full `rows × cols` grid in raster order (row by row) of `tile_w × tile_h`
    /// tiles overlapping by `overlap` (fraction of the tile, may give fractional steps).
    pub fn grid(rows: u32, cols: u32, tile_w: usize, tile_h: usize, overlap: f64) -> TileLayout {
        let cells: Vec<(u32, u32)> = (0..rows).flat_map(|r| (0..cols).map(move |c| (r, c))).collect();
        TileLayout::from_cells(&cells, tile_w, tile_h, overlap)
    }

    /// Tiles at the given `(row, col)` cells of a regular grid (use it for
    /// grids with missing tiles), positions from the nominal step `size × (1 − overlap)`.
    pub fn from_cells(cells: &[(u32, u32)], tile_w: usize, tile_h: usize, overlap: f64) -> TileLayout {
        let sx = tile_w as f64 * (1.0 - overlap);
        let sy = tile_h as f64 * (1.0 - overlap);
        TileLayout {
            tiles: cells
                .iter()
                .map(|&(row, col)| TileInfo { row, col, stage_x_px: f64::from(col) * sx, stage_y_px: f64::from(row) * sy })
                .collect(),
        }
    }

    /// Tiles at grid `cells` whose stage positions are given in µm
    /// (image-oriented, as `hcsflow-plate` reports them), converted with
    /// `pixel_size_um`. Centre or corner positions both work (only
    /// differences matter) as long as every tile uses the same convention.
    pub fn from_stage_um(cells: &[(u32, u32)], stage_um: &[(f64, f64)], pixel_size_um: f64) -> Result<TileLayout, StitchError> {
        if !(pixel_size_um > 0.0 && pixel_size_um.is_finite()) {
            return Err(StitchError::InvalidParameter(format!("pixel size must be positive, got {pixel_size_um} µm")));
        }
        if cells.len() != stage_um.len() {
            return Err(StitchError::LayoutMismatch { tiles: stage_um.len(), layout: cells.len() });
        }
        Ok(TileLayout {
            tiles: cells
                .iter()
                .zip(stage_um)
                .map(|(&(row, col), &(x, y))| TileInfo { row, col, stage_x_px: x / pixel_size_um, stage_y_px: y / pixel_size_um })
                .collect(),
        })
    }

    pub fn len(&self) -> usize {
        self.tiles.len()
    }

    pub fn is_empty(&self) -> bool {
        self.tiles.is_empty()
    }
}
