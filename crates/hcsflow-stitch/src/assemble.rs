//! Mosaic assembly: tiles placed at float positions on one canvas.

use std::str::FromStr;

use hcsflow_core::{with_pixels, Pixel, Stack};
use ndarray::Array3;
use rayon::prelude::*;

use crate::StitchError;

/// How overlapping tiles combine.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum Blend {
    /// Weighted mean; each tile's weight falls linearly from its centre to
    /// ~0 at its edges (`min(t + ½, size − ½ − t)` per axis, product of the
    /// two axes), so seams fade across the overlap instead of showing a step
    /// where vignetting differs.
    #[default]
    Linear,
    /// No blending: tiles are painted in stack order, a later tile covers an earlier one.
    None,
    /// Per-pixel maximum of the covering tiles.
    Max,
}

impl Blend {
    pub fn name(self) -> &'static str {
        match self {
            Blend::Linear => "linear",
            Blend::None => "none",
            Blend::Max => "max",
        }
    }
}

impl FromStr for Blend {
    type Err = StitchError;
    fn from_str(s: &str) -> Result<Self, Self::Err> {
        match s {
            "linear" => Ok(Blend::Linear),
            "none" => Ok(Blend::None),
            "max" => Ok(Blend::Max),
            _ => Err(StitchError::InvalidParameter(format!("blend must be linear, none or max, not '{s}'"))),
        }
    }
}

/// Canvas origin `(x, y)` and size `(height, width)`.
pub type Canvas = ((i64, i64), (usize, usize));

/// The canvas for tiles of `tile_h × tile_w` at `positions` (top-left `(x, y)`):
/// origin `(x, y)` = the floor of the smallest coordinates, and `(height, width)`.
/// Canvas pixel `(r, c)` is at position `(origin_x + c, origin_y + r)`.
pub fn canvas_geometry(positions: &[(f64, f64)], tile_h: usize, tile_w: usize) -> Result<Canvas, StitchError> {
    if positions.is_empty() {
        return Err(StitchError::Empty);
    }
    if let Some(k) = positions.iter().position(|p| !(p.0.is_finite() && p.1.is_finite() && p.0.abs() < 1e12 && p.1.abs() < 1e12)) {
        return Err(StitchError::InvalidParameter(format!("position of tile {k} is not finite")));
    }
    let ox = positions.iter().map(|p| p.0.floor() as i64).min().unwrap_or(0);
    let oy = positions.iter().map(|p| p.1.floor() as i64).min().unwrap_or(0);
    let w = positions.iter().map(|p| p.0.floor() as i64 - ox + tile_w as i64).max().unwrap_or(0) as usize;
    let h = positions.iter().map(|p| p.1.floor() as i64 - oy + tile_h as i64).max().unwrap_or(0) as usize;
    const MAX_PIXELS: usize = 1 << 34;
    if w.saturating_mul(h) > MAX_PIXELS {
        return Err(StitchError::CanvasTooLarge { height: h, width: w });
    }
    Ok(((ox, oy), (h, w)))
}

/// Assembles `tiles` (`[N, Y, X]`) at `positions` (top-left `(x, y)` px, one
/// per plane, e.g. [`TilePositions::positions`](crate::TilePositions)) into one
/// plane `[1, H, W]` of the input dtype (integers rounded and clipped).
///
/// Sub-pixel placement: each tile is shifted by the fractional part of its
/// position with bilinear interpolation (the tile's first row/column is
/// dropped when that fraction is non-zero, since it has no left/upper
/// neighbour to interpolate from), then laid at the integer part. Bilinear
/// keeps the cost at one pass and never overshoots; it smooths by at most
/// a quarter-pixel kernel. Canvas pixels no tile covers are 0. The canvas
/// geometry is [`canvas_geometry`].
pub fn assemble(tiles: &Stack, positions: &[(f64, f64)], blend: Blend) -> Result<Stack, StitchError> {
    let [n, th, tw] = tiles.shape();
    if n == 0 {
        return Err(StitchError::Empty);
    }
    if positions.len() != n {
        return Err(StitchError::LayoutMismatch { tiles: n, layout: positions.len() });
    }
    let ((ox, oy), (h, w)) = canvas_geometry(positions, th, tw)?;
    Ok(with_pixels!(Stack, tiles, a, T => {
        Stack::from(assemble_typed::<T>(a.pixels(), n, th, tw, positions, (ox, oy), (h, w), blend))
    }))
}

/// One tile's placement on the canvas: the sub-pixel rule of [`assemble`],
/// shared with the GPU implementation so both place tiles identically.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct Placement {
    /// Canvas row/column of tile pixel (0, 0) (before the fractional shift).
    pub row: i64,
    pub col: i64,
    /// Fractional parts of the position (f32, as the blend arithmetic uses them).
    pub fy: f32,
    pub fx: f32,
    /// 1 when the fraction is non-zero (the previous pixel is interpolated in).
    pub dy: usize,
    pub dx: usize,
}

/// The [`Placement`] of every tile at `positions` (top-left `(x, y)` px) on a
/// canvas whose pixel (0, 0) is at `origin` (from [`canvas_geometry`]).
pub fn placements(positions: &[(f64, f64)], origin: (i64, i64)) -> Vec<Placement> {
    positions
        .iter()
        .map(|&(x, y)| {
            let (fx, fy) = ((x - x.floor()) as f32, (y - y.floor()) as f32);
            Placement {
                row: y.floor() as i64 - origin.1,
                col: x.floor() as i64 - origin.0,
                fy,
                fx,
                dy: usize::from(fy > 0.0),
                dx: usize::from(fx > 0.0),
            }
        })
        .collect()
}

#[allow(clippy::too_many_arguments)]
fn assemble_typed<T: Pixel>(
    data: &[T],
    n: usize,
    th: usize,
    tw: usize,
    positions: &[(f64, f64)],
    origin: (i64, i64),
    (h, w): (usize, usize),
    blend: Blend,
) -> Array3<T> {
    let placed = placements(positions, origin);
    let ramp = |t: f32, size: usize| (t + 0.5).min(size as f32 - 0.5 - t).max(1e-3);
    let mut out = Array3::<T>::default((1, h, w));
    let Some(out_slice) = out.as_slice_mut() else { return out };
    if data.len() < n * th * tw || h == 0 || w == 0 {
        return out;
    }
    const BAND: usize = 32;
    out_slice.par_chunks_mut(BAND * w).enumerate().for_each_init(
        || (vec![0f32; BAND * w], vec![0f32; BAND * w]),
        |(acc, wsum), (band, dst)| {
            let r0 = band * BAND;
            let rows = dst.len() / w;
            acc[..rows * w].fill(if blend == Blend::Max { f32::NEG_INFINITY } else { 0.0 });
            wsum[..rows * w].fill(0.0);
            for (k, p) in placed.iter().enumerate() {
                let tile = &data[k * th * tw..(k + 1) * th * tw];
                // Tile rows q (local) with canvas row p.row + q inside this band.
                let qlo = (r0 as i64 - p.row).max(p.dy as i64);
                let qhi = ((r0 + rows) as i64 - p.row).min(th as i64);
                if qlo >= qhi {
                    continue;
                }
                let clo = (-p.col).max(p.dx as i64) as usize;
                let chi = (w as i64 - p.col).min(tw as i64);
                if clo as i64 >= chi {
                    continue;
                }
                let chi = chi as usize;
                let (cx0, cx1) = (1.0 - p.fx, p.fx);
                let (cy0, cy1) = (1.0 - p.fy, p.fy);
                for q in qlo as usize..qhi as usize {
                    let crow = (p.row + q as i64) as usize - r0;
                    let ra = &tile[q * tw..(q + 1) * tw];
                    let rb = &tile[(q - p.dy) * tw..(q - p.dy + 1) * tw];
                    let wy = ramp(q as f32 - p.fy, th);
                    let base = crow * w + (p.col + clo as i64) as usize;
                    let acc_row = &mut acc[base..base + (chi - clo)];
                    let ws_row = &mut wsum[base..base + (chi - clo)];
                    for (i, qx) in (clo..chi).enumerate() {
                        let v = cy0 * (cx0 * ra[qx].to_f32() + cx1 * ra[qx - p.dx].to_f32())
                            + cy1 * (cx0 * rb[qx].to_f32() + cx1 * rb[qx - p.dx].to_f32());
                        match blend {
                            Blend::Linear => {
                                let wt = wy * ramp(qx as f32 - p.fx, tw);
                                acc_row[i] += wt * v;
                                ws_row[i] += wt;
                            }
                            Blend::None => {
                                acc_row[i] = v;
                                ws_row[i] = 1.0;
                            }
                            Blend::Max => {
                                acc_row[i] = acc_row[i].max(v);
                                ws_row[i] = 1.0;
                            }
                        }
                    }
                }
            }
            for ((d, &a), &s) in dst.iter_mut().zip(acc.iter()).zip(wsum.iter()) {
                *d = if s > 0.0 { T::from_f32_clip(if blend == Blend::Linear { a / s } else { a }) } else { T::default() };
            }
        },
    );
    out
}
