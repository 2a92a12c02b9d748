//! Median filter on the GPU: `median_filter` (scipy.ndimage.median_filter,
//! `mode='reflect'`), every odd window side the host takes (1..=99), every dtype.
//!
//! One thread per 32-bit output word (4 u8, 2 u16 or 1 f32 pixel) finds the
//! median of each of its pixels' `k × k` windows by a bitwise binary search
//! over the values' order-preserving keys (the value itself for u8/u16, the
//! `total_cmp` key of an f32): the minimum and maximum key of the window fix
//! the bits all window values share; each remaining bit, from the highest, is
//! kept set when fewer than `m + 1` window values (`m = k² / 2`) lie below
//! the candidate. The result is the `m`-th smallest window value itself, so
//! the filter is exact: equal to the host for every dtype (for f32 ±0 count
//! as equal, and NaN sorts as `total_cmp` sorts it, like the host's
//! selection for sides above `NETWORK_MAX`; the host's comparator networks
//! for sides 3..=9 have no defined order for NaN). Cost per pixel: one pass
//! over the window plus one per differing bit (at most 8, 16 or 32), no
//! per-thread storage, so no side needs a limit. The reflected row and column
//! indices come from the host's `Boundary::Reflect`, uploaded as two small
//! tables (`h + k − 1` and `w + k − 1` entries).

use std::sync::Arc;

use cubecl::prelude::*;
use hcsflow_core::{Array, DeviceBuffer, FunctionError};
use hcsflow_ops::convolve::Boundary;
use hcsflow_ops::filters::{MedianFilterArgs, MEDIAN_FILTER};

use super::normalize::{geometry, key_of, zeros};
use super::{grid, kind_of, lane, lanes_of, wgpu_input, BLOCK};
use crate::array::WgpuArray;

const NAME: &str = MEDIAN_FILTER.name;

/// The order-preserving key of pixel `p` of plane `plane` (storage `kind`).
#[cube]
fn key_at(input: &[u32], plane_base: u32, p: u32, #[comptime] kind: u32) -> u32 {
    let lanes = lanes_of(kind);
    let raw = lane(input[(plane_base + p / lanes) as usize], p % lanes, kind);
    let mut k = raw;
    if kind == 2 {
        k = key_of(raw);
    }
    k
}

/// The f32 bits of an order-preserving key (inverse of `key_of`).
#[cube]
fn bits_of_key(k: u32) -> u32 {
    let mut b = k ^ 0xFFFF_FFFFu32;
    if (k & 0x8000_0000u32) != 0u32 {
        b = k & 0x7FFF_FFFFu32;
    }
    b
}

/// Window columns read per loop iteration (unrolled; see [`UNROLL`]'s use).
const UNROLL: u32 = 16;

/// `(min, max)` of the keys of the `k × k` window at `(y, x)`. Columns go
/// [`UNROLL`] at a time in an unrolled body, so a window costs
/// `k · ⌈k / 16⌉` loop iterations: lavapipe (llvmpipe) stops every loop of a
/// shader invocation after 65,535 iterations in total, and the side-99 window
/// of a 4-lane word would pass that column by column.
// CubeCL kernels take the plain arithmetic, not div_ceil.
#[cube]
#[allow(clippy::too_many_arguments, clippy::manual_div_ceil)]
fn window_range(
    input: &[u32],
    rows: &[u32],
    cols: &[u32],
    base: u32,
    y: u32,
    x: u32,
    width: u32,
    k: u32,
    #[comptime] kind: u32,
) -> (u32, u32) {
    let mut lo = 0xFFFF_FFFFu32;
    let mut hi = 0u32;
    let blocks = (k + UNROLL - 1u32) / UNROLL;
    for dy in 0..k {
        let row = rows[(y + dy) as usize] * width;
        for b in 0..blocks {
            let dx0 = b * UNROLL;
            #[unroll]
            for u in 0..UNROLL {
                let dx = dx0 + u;
                if dx < k {
                    let v = key_at(input, base, row + cols[(x + dx) as usize], kind);
                    if v < lo {
                        lo = v;
                    }
                    if v > hi {
                        hi = v;
                    }
                }
            }
        }
    }
    (lo, hi)
}

/// How many keys of the `k × k` window at `(y, x)` are below `cand`.
#[cube]
#[allow(clippy::too_many_arguments, clippy::manual_div_ceil)]
fn count_below(
    input: &[u32],
    rows: &[u32],
    cols: &[u32],
    base: u32,
    y: u32,
    x: u32,
    width: u32,
    k: u32,
    cand: u32,
    #[comptime] kind: u32,
) -> u32 {
    let mut below = 0u32;
    let blocks = (k + UNROLL - 1u32) / UNROLL;
    for dy in 0..k {
        let row = rows[(y + dy) as usize] * width;
        for b in 0..blocks {
            let dx0 = b * UNROLL;
            #[unroll]
            for u in 0..UNROLL {
                let dx = dx0 + u;
                if dx < k && key_at(input, base, row + cols[(x + dx) as usize], kind) < cand {
                    below += 1u32;
                }
            }
        }
    }
    below
}

/// Median of the `k × k` window of every pixel; thread `i` writes output word `i`.
/// `rows[y + d]` / `cols[x + d]` are the reflected indices of `y + d − r` / `x + d − r`.
#[cube(launch)]
#[allow(clippy::too_many_arguments)]
fn median_words(
    input: &[u32],
    rows: &[u32],
    cols: &[u32],
    output: &mut [u32],
    total_words: u32,
    plane_words: u32,
    pixels: u32,
    width: u32,
    k: u32,
    #[comptime] kind: u32,
) {
    let i = ABSOLUTE_POS as u32;
    if i < total_words {
        let plane = i / plane_words;
        let word = i % plane_words;
        let base = plane * plane_words;
        let lanes = lanes_of(kind);
        let bits = 32u32 / lanes;
        let rank = k * k / 2u32;
        let mut out = 0u32;
        for j in 0..lanes {
            let p = word * lanes + j;
            if p < pixels {
                let y = p / width;
                let x = p % width;
                // The window's min and max fix the bits every value shares.
                let (lo, hi) = window_range(input, rows, cols, base, y, x, width, k, kind);
                let diff = lo ^ hi;
                let mut ans = 0u32;
                for t in 0..bits {
                    let bit = 1u32 << (bits - 1u32 - t);
                    if diff < bit {
                        ans |= lo & bit;
                    } else {
                        let cand = ans | bit;
                        if count_below(input, rows, cols, base, y, x, width, k, cand, kind) <= rank {
                            ans = cand;
                        }
                    }
                }
                if kind == 2 {
                    out = bits_of_key(ans);
                } else {
                    out |= ans << (j * bits);
                }
            }
        }
        output[i as usize] = out;
    }
}

/// The reflected index of every position `0..n + k − 1` of a padded line of
/// `n` samples (position `d` is sample `d − k/2`).
fn reflect_table(n: usize, k: usize) -> Vec<u32> {
    let r = (k / 2) as isize;
    (0..n + k - 1).map(|d| Boundary::Reflect.index(d as isize - r, n) as u32).collect()
}

pub(super) fn median_filter(array: Array, args: &MedianFilterArgs) -> Result<Array, FunctionError> {
    let input = wgpu_input(NAME, &array)?;
    let size = args.size;
    if size % 2 == 0 || size < 1 {
        return Err(FunctionError::invalid(NAME, format!("size must be odd, got {size}")));
    }
    let k = size as usize;
    let g = geometry(NAME, input)?;
    let shape = DeviceBuffer::shape(input).to_vec();
    let (h, w) = (shape[shape.len() - 2], shape[shape.len() - 1]);
    let dtype = DeviceBuffer::dtype(input);
    let ctx = input.context();
    let rows = reflect_table(h, k);
    let cols = reflect_table(w, k);
    let row_buf = ctx.upload_bytes(bytemuck::cast_slice(&rows));
    let col_buf = ctx.upload_bytes(bytemuck::cast_slice(&cols));
    let out = zeros(ctx, NAME, g.total_words)?;
    // SAFETY: input and output hold total_words words; every pixel index
    // rows[..] · w + cols[..] is inside its plane (the tables hold reflected
    // indices < h and < w, h + k − 1 and w + k − 1 of them, read at y + dy and
    // x + dx with dy, dx < k).
    unsafe {
        median_words::launch(
            ctx.client(),
            grid(g.total_words),
            CubeDim::new_1d(BLOCK),
            BufferArg::from_raw_parts(input.handle.clone(), g.total_words),
            BufferArg::from_raw_parts(row_buf, rows.len()),
            BufferArg::from_raw_parts(col_buf, cols.len()),
            BufferArg::from_raw_parts(out.clone(), g.total_words),
            g.total_words as u32,
            g.plane_words as u32,
            g.pixels as u32,
            w as u32,
            k as u32,
            kind_of(dtype),
        );
    }
    Ok(Array::Device(Arc::new(WgpuArray::from_parts(ctx.clone(), out, shape, dtype))))
}

#[cfg(test)]
mod tests {
    use super::reflect_table;

    #[test]
    fn reflect_table_mirrors_with_the_edge_sample() {
        // scipy 'reflect': (d c b a | a b c d | d c b a)
        assert_eq!(reflect_table(4, 5), vec![1, 0, 0, 1, 2, 3, 3, 2]);
        assert_eq!(reflect_table(1, 3), vec![0, 0, 0]);
    }
}
