//! Tiled prediction of any image size with linearly blended seams.

use burn::tensor::{Tensor, TensorData};
use ndarray::{Array2, ArrayView2};

use crate::config::SIDE_MULTIPLE;
use crate::{check_image, pad_reflect, Denoiser, N2vError};

/// Start offsets of tiles of side `tile` covering `0..len` (`len >= tile`, `overlap < tile`) with
/// at least `overlap` pixels shared between neighbours; the last tile ends at `len`.
pub(crate) fn tile_starts(len: usize, tile: usize, overlap: usize) -> Vec<usize> {
    let step = (tile - overlap).max(1);
    let mut starts = Vec::new();
    let mut s = 0;
    while s + tile < len {
        starts.push(s);
        s += step;
    }
    starts.push(len - tile);
    starts
}

/// Blending weights of a tile along one axis: a linear ramp `(i + ½) / overlap` into the tile on
/// each side shared with a neighbour, 1 elsewhere and on sides at the image border.
pub(crate) fn ramp(tile: usize, overlap: usize, first: bool, last: bool) -> Vec<f32> {
    let o = overlap.max(1) as f32;
    (0..tile)
        .map(|i| {
            let lead = if first { 1.0 } else { ((i as f32 + 0.5) / o).min(1.0) };
            let trail = if last { 1.0 } else { ((tile - i) as f32 - 0.5) / o };
            lead.min(trail.min(1.0))
        })
        .collect()
}

/// The side of the tiles along an axis of `len` pixels: the fewest tiles of at most `max` pixels
/// (a multiple of [`SIDE_MULTIPLE`]) that cover it overlapping by `overlap`, made as small as
/// that count allows, so that a 1024² plane with tiles of at most 256 is cut into 5 × 5 tiles of
/// 244 rather than 256. One tile (rounded up to [`SIDE_MULTIPLE`]) if it fits within `max`.
pub(crate) fn tile_side(len: usize, max: usize, overlap: usize) -> usize {
    let whole = round_up(len, SIDE_MULTIPLE);
    if whole <= max || max <= overlap {
        return whole.min(max);
    }
    let count = (len - overlap).div_ceil(max - overlap);
    round_up((len + (count - 1) * overlap).div_ceil(count), SIDE_MULTIPLE).min(max)
}

fn round_up(v: usize, m: usize) -> usize {
    v.div_ceil(m) * m
}

impl Denoiser {
    /// Denoises `image` (one 2-D plane of any size, finite values; the same units as the training
    /// image) and returns it in those units.
    ///
    /// The image is normalised, mirrored up to at least one tile (a multiple of 4 in each
    /// direction), cut into the fewest tiles of at most `tile_size` that overlap by at least
    /// `tile_overlap` (each as small as that count allows) and run
    /// through the network `tile_batch` tiles per call. The tiles' outputs stay on the device
    /// until the end, are read once (a tile stack of `tiles × tile_size²`, not the canvas), and
    /// are blended with linear ramps across each overlap straight into the output on the host.
    /// Deterministic.
    pub fn predict(&self, image: ArrayView2<f32>) -> Result<Array2<f32>, N2vError> {
        check_image(image)?;
        let cfg = &self.config;
        let (h, w) = image.dim();
        let th = tile_side(h, cfg.tile_size, cfg.tile_overlap);
        let tw = tile_side(w, cfg.tile_size, cfg.tile_overlap);
        let (hp, wp) = (h.max(th), w.max(tw));
        let padded = pad_reflect(image, hp, wp);
        let values: Vec<f32> = padded.iter().map(|&v| self.norm.apply(v)).collect();
        let dev = &self.device;
        let input = Tensor::<2>::from_data(TensorData::new(values, [hp, wp]), dev);

        // Tiles smaller than the configured size (small images) overlap at most half of themselves.
        let (oy, ox) = (cfg.tile_overlap.min(th / 2), cfg.tile_overlap.min(tw / 2));
        let ys = tile_starts(hp, th, oy);
        let xs = tile_starts(wp, tw, ox);
        let tiles: Vec<(usize, usize, usize, usize)> =
            ys.iter().enumerate().flat_map(|(iy, &y)| xs.iter().enumerate().map(move |(ix, &x)| (iy, y, ix, x))).collect();
        let mut outputs = Vec::with_capacity(tiles.len().div_ceil(cfg.tile_batch.max(1)));
        for chunk in tiles.chunks(cfg.tile_batch) {
            let batch: Vec<Tensor<4>> =
                chunk.iter().map(|&(_, y, _, x)| input.clone().slice([y..y + th, x..x + tw]).reshape([1, 1, th, tw])).collect();
            outputs.push(self.model.forward(Tensor::cat(batch, 0)));
        }
        // The one read of a prediction: every tile's output, in tile order.
        let stack = Tensor::cat(outputs, 0).into_data().try_to_vec::<f32>().map_err(|e| N2vError::Device(format!("{e:?}")))?;
        let mut canvas = Array2::<f32>::zeros((hp, wp));
        let mut weight_sum = Array2::<f32>::zeros((hp, wp));
        for (k, &(iy, y, ix, x)) in tiles.iter().enumerate() {
            let wy = ramp(th, oy, iy == 0, iy + 1 == ys.len());
            let wx = ramp(tw, ox, ix == 0, ix + 1 == xs.len());
            let tile = &stack[k * th * tw..(k + 1) * th * tw];
            for (i, &a) in wy.iter().enumerate() {
                let src = &tile[i * tw..(i + 1) * tw];
                let mut out = canvas.row_mut(y + i);
                let mut ws = weight_sum.row_mut(y + i);
                for (j, (&v, &b)) in src.iter().zip(&wx).enumerate() {
                    out[x + j] += v * (a * b);
                    ws[x + j] += a * b;
                }
            }
        }
        Ok(Array2::from_shape_fn((h, w), |(y, x)| self.norm.invert(canvas[[y, x]] / weight_sum[[y, x]])))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn tiles_cover_the_axis_with_the_overlap_and_end_at_its_end() {
        for (len, tile, overlap) in [(256, 256, 48), (300, 256, 48), (1024, 256, 48), (2048, 256, 48), (97, 64, 16), (65, 64, 0)] {
            let s = tile_starts(len, tile, overlap);
            assert_eq!(s[0], 0);
            assert_eq!(*s.last().unwrap() + tile, len);
            for pair in s.windows(2) {
                assert!(pair[1] > pair[0] && pair[0] + tile >= pair[1] + overlap, "{len} {tile} {overlap}: {s:?}");
            }
        }
    }

    #[test]
    fn tiles_are_the_fewest_of_at_most_the_size_and_no_larger_than_that_count_needs() {
        for len in (1..=2100).step_by(7).chain([1024, 2048, 256, 257, 208, 464]) {
            for (max, overlap) in [(256, 48), (384, 48), (64, 16), (16, 0), (512, 256)] {
                let side = tile_side(len, max, overlap);
                assert!(side <= max && side.is_multiple_of(SIDE_MULTIPLE), "{len} {max} {overlap}: {side}");
                if round_up(len, SIDE_MULTIPLE) <= max {
                    assert_eq!(side, round_up(len, SIDE_MULTIPLE));
                    continue;
                }
                let tiles = tile_starts(len, side, overlap.min(side / 2)).len();
                let fewest = (len - overlap).div_ceil(max - overlap);
                assert_eq!(tiles, fewest, "{len} {max} {overlap}: side {side}");
                // One multiple of 4 smaller would need another tile.
                let smaller = side - SIDE_MULTIPLE;
                assert!(smaller * tiles < len + (tiles - 1) * overlap, "{len} {max} {overlap}: {side} is not the smallest");
            }
        }
        assert_eq!(tile_side(1024, 256, 48), 244);
        assert_eq!(tile_side(2048, 256, 48), 248);
    }

    #[test]
    fn ramps_of_neighbours_sum_to_one_across_a_regular_overlap() {
        let (tile, overlap) = (64, 16);
        let a = ramp(tile, overlap, true, false);
        let b = ramp(tile, overlap, false, true);
        let step = tile - overlap;
        for i in 0..overlap {
            let sum = a[step + i] + b[i];
            assert!((sum - 1.0).abs() < 1e-6, "{i}: {sum}");
        }
        assert!(a.iter().chain(&b).all(|&v| v > 0.0 && v <= 1.0));
        assert_eq!(a[0], 1.0);
        assert_eq!(b[tile - 1], 1.0);
    }
}
