//! The tile layout a `tile_positions` step found for a well, drawn over the
//! well's enlarged mosaic in the report: each tile's border where it was
//! placed, its stage position (dashed), and each overlap edge between two tile
//! centres, coloured by whether registration accepted it and labelled with
//! its score.
//!
//! It reads two of the well's artifact tables (`OUT/<step>/<artifact>/<well>.csv`):
//! the positions (columns `site`, `x_px`, `y_px`, `stage_x_px`, `stage_y_px`)
//! and, from the same step, the edges (`site_a`, `site_b`, `score`,
//! `status`). A step that computes positions per time point or channel writes
//! one layout per stack; the view shows the first (the lowest timepoint,
//! channel and z as the table writes them).
//!
//! Coordinates are those of the mosaic `assemble` makes from the positions:
//! the canvas' origin is the floor of the smallest coordinates, so a tile at
//! `x_px` starts at canvas column `floor(x_px) − origin`. The tile size is not
//! in the tables: it is what the shown mosaic's size leaves after the span of
//! the positions (`width − (max floor x − origin)`). When the well shows no
//! image, or one whose size does not fit the positions (not a mosaic of this
//! layout), there is no view: the stitching heatmaps still have the numbers.

use std::path::Path;

use hcsflow_pipeline::ArtifactRecord;
use serde::Serialize;

use crate::tables::{self, parse_csv};

/// One tile of the layout, in mosaic pixels.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct TileBox {
    pub site: String,
    /// Where the tile was placed (its top-left corner).
    pub x: f64,
    pub y: f64,
    /// Where the stage put it, shifted by the well's mean registered − stage
    /// offset (registration anchors the grid anywhere; what matters is how
    /// each tile moved relative to the others).
    pub stage_x: f64,
    pub stage_y: f64,
}

/// One overlap edge between two tiles' centres.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct EdgeLine {
    pub x1: f64,
    pub y1: f64,
    pub x2: f64,
    pub y2: f64,
    pub score: f64,
    pub status: String,
    pub accepted: bool,
}

/// A well's layout over its mosaic (`width × height` pixels).
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct StitchView {
    /// `step/artifact` of the positions table.
    pub source: String,
    pub width: usize,
    pub height: usize,
    pub tile_width: f64,
    pub tile_height: f64,
    pub tiles: Vec<TileBox>,
    pub edges: Vec<EdgeLine>,
    /// The size of the labels, in mosaic pixels (a fortieth of the larger side).
    pub font: f64,
}

/// A table as (header, rows) with its column lookup.
struct Table {
    header: Vec<String>,
    rows: Vec<Vec<String>>,
}

impl Table {
    fn read(out: &Path, record: &ArtifactRecord) -> Option<Table> {
        let text = std::fs::read_to_string(out.join(&record.path)).ok()?;
        let mut records = parse_csv(&text);
        if records.is_empty() {
            return None;
        }
        let header = records.remove(0);
        Some(Table { header, rows: records })
    }

    fn has(&self, columns: &[&str]) -> bool {
        columns.iter().all(|c| self.header.iter().any(|h| h == c))
    }

    fn column(&self, name: &str) -> Option<usize> {
        self.header.iter().position(|h| h == name)
    }

    /// The rows of the first stack: the smallest (timepoint, channel, z_index)
    /// values as written.
    fn first_stack(&self) -> Vec<&Vec<String>> {
        let key = |r: &Vec<String>| {
            ["timepoint", "channel", "z_index"].map(|c| self.column(c).and_then(|i| r.get(i)).cloned().unwrap_or_default())
        };
        let Some(first) = self.rows.iter().map(key).min() else { return Vec::new() };
        self.rows.iter().filter(|r| key(r) == first).collect()
    }
}

fn number(row: &[String], column: Option<usize>) -> Option<f64> {
    column.and_then(|c| tables::number(row, c))
}

/// The view of a well whose shown image is `mosaic` (`(height, width)`), from
/// its artifact tables; `None` when it has no positions table or the image is
/// not a mosaic of its layout (see the module docs). A table that cannot be
/// read is left out (the report lists it once, from [`crate::tables`]).
pub fn stitch_view(out: &Path, artifacts: &[ArtifactRecord], mosaic: Option<(usize, usize)>) -> Option<StitchView> {
    const POSITIONS: [&str; 5] = ["site", "x_px", "y_px", "stage_x_px", "stage_y_px"];
    const EDGES: [&str; 4] = ["site_a", "site_b", "score", "status"];
    let (height, width) = mosaic?;
    let (record, positions) = artifacts.iter().find_map(|a| Table::read(out, a).filter(|t| t.has(&POSITIONS)).map(|t| (a, t)))?;
    let [site, x, y, sx, sy] = POSITIONS.map(|c| positions.column(c));
    let placed: Vec<(String, f64, f64, f64, f64)> = positions
        .first_stack()
        .into_iter()
        .filter_map(|r| Some((r.get(site?)?.clone(), number(r, x)?, number(r, y)?, number(r, sx)?, number(r, sy)?)))
        .collect();
    if placed.is_empty() {
        return None;
    }
    let origin_x = placed.iter().map(|p| p.1.floor()).fold(f64::INFINITY, f64::min);
    let origin_y = placed.iter().map(|p| p.2.floor()).fold(f64::INFINITY, f64::min);
    let span_x = placed.iter().map(|p| p.1.floor() - origin_x).fold(0.0, f64::max);
    let span_y = placed.iter().map(|p| p.2.floor() - origin_y).fold(0.0, f64::max);
    let (tile_width, tile_height) = (width as f64 - span_x, height as f64 - span_y);
    // A mosaic of this layout is larger than the span of its tiles' corners.
    if tile_width < 1.0 || tile_height < 1.0 {
        return None;
    }
    let n = placed.len() as f64;
    let (mean_dx, mean_dy) = placed.iter().fold((0.0, 0.0), |(a, b), p| (a + (p.1 - p.3) / n, b + (p.2 - p.4) / n));
    let tiles: Vec<TileBox> = placed
        .iter()
        .map(|(site, x, y, sx, sy)| TileBox {
            site: site.clone(),
            x: x.floor() - origin_x,
            y: y.floor() - origin_y,
            stage_x: sx + mean_dx - origin_x,
            stage_y: sy + mean_dy - origin_y,
        })
        .collect();
    let centre = |site: &str| tiles.iter().find(|t| t.site == site).map(|t| (t.x + tile_width / 2.0, t.y + tile_height / 2.0));
    let edge_table = artifacts
        .iter()
        .filter(|a| a.step == record.step && a.path != record.path)
        .find_map(|a| Table::read(out, a).filter(|t| t.has(&EDGES)));
    let edges = edge_table
        .map(|t| {
            let [a, b, score, status] = EDGES.map(|c| t.column(c));
            t.first_stack()
                .into_iter()
                .filter_map(|r| {
                    let (x1, y1) = centre(r.get(a?)?)?;
                    let (x2, y2) = centre(r.get(b?)?)?;
                    let status = r.get(status?)?.clone();
                    Some(EdgeLine { x1, y1, x2, y2, score: number(r, score).unwrap_or(f64::NAN), accepted: status == "accepted", status })
                })
                .collect()
        })
        .unwrap_or_default();
    Some(StitchView {
        source: format!("{}/{}", record.step, record.artifact),
        width,
        height,
        tile_width,
        tile_height,
        tiles,
        edges,
        font: width.max(height) as f64 / 40.0,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    fn record(dir: &Path, step: &str, name: &str, text: &str) -> ArtifactRecord {
        std::fs::write(dir.join(name), text).unwrap();
        ArtifactRecord { step: step.into(), artifact: name.trim_end_matches(".csv").into(), path: name.into(), rows: 0 }
    }

    const POSITIONS: &str = "well,site,channel,z_index,timepoint,x_px,y_px,stage_x_px,stage_y_px\n\
        A01,1,,,1,10.4,20.7,0,0\nA01,2,,,1,100.2,20.1,90,0\nA01,1,,,2,50,50,0,0\nA01,2,,,2,140,50,90,0\n";
    const EDGES: &str = "well,site,channel,z_index,timepoint,tile_a,tile_b,site_a,site_b,score,status\n\
        A01,,,,1,1,2,1,2,0.8,accepted\nA01,,,,2,1,2,1,2,0.1,low_score\n";

    #[test]
    fn tiles_and_edges_of_the_first_stack_in_mosaic_pixels() {
        let dir = tempfile::tempdir().unwrap();
        let artifacts = [
            record(dir.path(), "positions", "edges.csv", EDGES),
            record(dir.path(), "positions", "positions.csv", POSITIONS),
            record(dir.path(), "count", "counts.csv", "well,count\nA01,3\n"),
        ];
        // Origin (10, 20); span 90 × 0; a 150 × 64 mosaic leaves 60 × 64 tiles.
        let view = stitch_view(dir.path(), &artifacts, Some((64, 150))).expect("a view");
        assert_eq!((view.source.as_str(), view.width, view.height), ("positions/positions", 150, 64));
        assert_eq!((view.tile_width, view.tile_height), (60.0, 64.0));
        assert_eq!(view.tiles.len(), 2, "the first time point's layout only");
        // Registered − stage offsets (10.4, 20.7) and (10.2, 20.1): mean (10.3, 20.4).
        let t = &view.tiles[1];
        assert_eq!((t.site.as_str(), t.x, t.y), ("2", 90.0, 0.0));
        assert!((t.stage_x - (90.0 + 10.3 - 10.0)).abs() < 1e-9 && (t.stage_y - (20.4 - 20.0)).abs() < 1e-9, "{t:?}");
        assert_eq!(view.edges.len(), 1);
        let e = &view.edges[0];
        assert_eq!((e.x1, e.y1, e.x2, e.y2), (30.0, 32.0, 120.0, 32.0), "tile centres");
        assert!(e.accepted && e.score == 0.8 && e.status == "accepted");
    }

    #[test]
    fn no_view_without_a_mosaic_of_the_layout_or_a_positions_table() {
        let dir = tempfile::tempdir().unwrap();
        let positions = record(dir.path(), "positions", "positions.csv", POSITIONS);
        let one = std::slice::from_ref(&positions);
        assert_eq!(stitch_view(dir.path(), one, None), None, "no image shown");
        assert_eq!(stitch_view(dir.path(), one, Some((64, 80))), None, "narrower than the span of the corners");
        assert!(stitch_view(dir.path(), one, Some((64, 91))).is_some(), "one pixel wider");
        let counts = record(dir.path(), "count", "counts.csv", "well,count\nA01,3\n");
        let gone = ArtifactRecord { step: "p".into(), artifact: "gone".into(), path: "gone.csv".into(), rows: 0 };
        assert_eq!(stitch_view(dir.path(), &[counts, gone], Some((64, 150))), None, "no positions table");
    }
}
