//! Site grids from stage positions, for every reader whose metadata places
//! sites by stage position instead of declaring a grid (Harmony fields,
//! MetaXpress database acquisitions, OME-Zarr fields).

use std::collections::BTreeSet;

use crate::{PlateMetadata, SiteCell};

/// Groups values into clusters whose consecutive members (in sorted order)
/// differ by less than `tol`. Returns the cluster index of every input value
/// (input order; clusters numbered in increasing value) and the number of clusters.
pub(crate) fn cluster(values: &[f64], tol: f64) -> (Vec<u32>, u32) {
    let mut order: Vec<usize> = (0..values.len()).collect();
    order.sort_by(|&a, &b| values[a].total_cmp(&values[b]));
    let mut out = vec![0u32; values.len()];
    let mut k = 0u32;
    for (i, &idx) in order.iter().enumerate() {
        if i > 0 && values[idx] - values[order[i - 1]] >= tol {
            k += 1;
        }
        out[idx] = k;
    }
    (out, if values.is_empty() { 0 } else { k + 1 })
}

/// The cells of positions placed on a grid.
pub(crate) struct GridCells {
    /// The 0-based (row, column) of every position, input order.
    pub cells: Vec<(u32, u32)>,
    pub rows: u32,
    pub cols: u32,
}

/// Places image-oriented stage positions `(x, y)` in µm (x grows with image
/// columns, y with image rows) on a raster grid: two positions share a column
/// when their x differ by less than half a field width (`field_w` µm), a row
/// when their y differ by less than half a field height. Rows and columns are
/// numbered from the smallest y and x. Positions may share a cell (the
/// caller decides what that means).
pub(crate) fn grid_cells(positions: &[(f64, f64)], field_w: f64, field_h: f64) -> GridCells {
    let xs: Vec<f64> = positions.iter().map(|p| p.0).collect();
    let ys: Vec<f64> = positions.iter().map(|p| p.1).collect();
    let (rows, nr) = cluster(&ys, field_h / 2.0);
    let (cols, nc) = cluster(&xs, field_w / 2.0);
    GridCells { cells: rows.into_iter().zip(cols).collect(), rows: nr, cols: nc }
}

/// The cells of `sites` in one row, in the order given.
pub(crate) fn one_row(sites: &[u32]) -> Vec<SiteCell> {
    sites.iter().enumerate().map(|(k, &site)| SiteCell { site, row: 0, col: k as u32 }).collect()
}

/// Places `sites` (site numbers, in order) of a plate whose metadata gives
/// stage positions but no grid: first in one row ([`one_row`]), then on the
/// grid the positions show: those of the first well, in numeric order, with a
/// position for every site, clustered by [`grid_cells`] (half a field apart;
/// the field is the image width and height × the pixel size). Site numbers
/// are kept. Without such a well or a field size, or when two sites fall into
/// one cell, the sites stay in one row and a warning says why; `source` names
/// where positions come from ("a MetaSeries stage-position-x/y").
pub(crate) fn place_sites(metadata: &mut PlateMetadata, sites: &[u32], warnings: &mut Vec<String>, source: &str) {
    metadata.site_cells = one_row(sites);
    (metadata.grid_rows, metadata.grid_cols) = (1, sites.len() as u32);
    if sites.len() <= 1 {
        return;
    }
    let one_row = |why: String| format!("site grid: the {} sites are placed in one row, in site order: {why}", sites.len());
    let complete = metadata.acquired_wells.iter().find_map(|w| {
        let positions: Option<Vec<(f64, f64)>> = sites.iter().map(|&s| metadata.stage_position(w, s)).collect();
        positions.map(|p| (w.clone(), p))
    });
    let Some((well, positions)) = complete else {
        warnings.push(one_row(format!("no well has {source} for every site")));
        return;
    };
    let (Some(pixel), Some(w), Some(h)) = (metadata.pixel_size_um, metadata.image_width, metadata.image_height) else {
        warnings.push(one_row("no pixel size or image size to measure the stage positions in fields".into()));
        return;
    };
    let grid = grid_cells(&positions, pixel * f64::from(w), pixel * f64::from(h));
    if grid.cells.iter().collect::<BTreeSet<_>>().len() < sites.len() {
        warnings.push(one_row(format!("in well {well}, some sites are less than half a field apart")));
        return;
    }
    metadata.site_cells = sites.iter().zip(&grid.cells).map(|(&site, &(row, col))| SiteCell { site, row, col }).collect();
    metadata.grid_rows = grid.rows;
    metadata.grid_cols = grid.cols;
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn clustering_groups_close_values() {
        let (c, n) = cluster(&[10.0, 0.2, 5.1, 0.0, 9.8, 5.0], 1.0);
        assert_eq!(n, 3);
        assert_eq!(c, [2, 0, 1, 0, 2, 1]);
        assert_eq!(cluster(&[], 1.0), (vec![], 0));
    }

    #[test]
    fn abutting_fields_in_x_or_y_and_a_jittered_grid() {
        // Two fields one field width apart in X: one row, two columns.
        let g = grid_cells(&[(79813.4, 41385.4), (80513.3, 41385.4)], 699.8, 699.8);
        assert_eq!((g.rows, g.cols, g.cells), (1, 2, vec![(0, 0), (0, 1)]));
        // Stacked in Y: two rows, one column.
        let g = grid_cells(&[(68300.0, 27625.7), (68300.0, 31094.5)], 3468.8, 3468.8);
        assert_eq!((g.rows, g.cols, g.cells), (2, 1, vec![(0, 0), (1, 0)]));
        // 2 × 2 with stage jitter well below half a field.
        let g = grid_cells(&[(0.3, 0.0), (100.0, -0.4), (-0.2, 99.6), (100.1, 100.2)], 100.0, 100.0);
        assert_eq!((g.rows, g.cols, g.cells), (2, 2, vec![(0, 0), (0, 1), (1, 0), (1, 1)]));
    }
}
