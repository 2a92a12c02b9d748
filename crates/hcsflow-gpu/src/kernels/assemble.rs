//! Mosaic assembly on the GPU: the same mosaic as `hcsflow_stitch::assemble`
//! (canvas from [`canvas_geometry`], bilinear sub-pixel placement, linear /
//! none / max blending, input dtype out).
//!
//! Gather, not scatter: one thread per output word (4 u8, 2 u16 or 1 f32
//! pixels) walks the tiles touching its canvas chunk **in stack order** and
//! accumulates in registers exactly as the host does per pixel, so there are
//! no f32 accumulator planes (only the tiles and the output need a binding),
//! no atomics, and the result is deterministic.
//!
//! The canvas is processed in chunks of whole words (default
//! [`DEFAULT_CHUNK_PIXELS`]), one launch each, each with the list of tiles
//! whose rows meet the chunk: a thread then tests only those tiles, and no
//! single dispatch runs long enough to hit a driver watchdog on large mosaics.
//!
//! Agreement with the host: the per-tile coefficients (fractions, bilinear
//! weights) are computed on the host with the host's expressions, and the
//! kernel repeats the host's operations in the host's order. The shader
//! compiler may fuse `a * b + c` into an FMA and GPU division need not be
//! correctly rounded, so: integer positions with `none`/`max` are bit-exact;
//! otherwise values differ by a few f32 ulps before rounding (u8/u16 ≤ 1 DN).
//! NaN pixels in f32 tiles with `max` blending are not specified on the GPU.

use std::sync::Arc;

use cubecl::prelude::*;
use hcsflow_core::{Array, CallContext, DType, DeviceBuffer, FunctionError};
use hcsflow_stitch::{canvas_geometry, placements, positions_from_table, AssembleArgs, Blend, StitchError, ASSEMBLE, POSITIONS};

use super::focus::load_pixel;
use super::{grid, kind_of, wgpu_input, BLOCK};
use crate::array::{download, words_for, WgpuArray};
use crate::context::GpuError;

const NAME: &str = ASSEMBLE.name;

/// Canvas pixels per launch by default: 1 Mi pixels keeps every launch short
/// (no driver watchdog) and its tile list small, while a 33 MPix mosaic needs
/// only ~33 launches (on lavapipe 16 Mi-pixel chunks were no faster).
pub const DEFAULT_CHUNK_PIXELS: usize = 1 << 20;

/// i32 values per listed tile: canvas row, canvas column of tile pixel (0, 0),
/// tile index, dy, dx (1 when the fraction is non-zero).
const OFFSETS: usize = 5;
/// f32 values per listed tile: fx, fy, 1 − fx, 1 − fy.
const COEFFS: usize = 4;

/// The host's blending ramp `min(t + ½, size − ½ − t)`, floored at 1e-3.
#[cube]
fn ramp(t: f32, size: f32) -> f32 {
    let a = t + 0.5f32;
    let b = size - 0.5f32 - t;
    let mut m = a;
    if b < m {
        m = b;
    }
    if m < 0.001f32 {
        m = 0.001f32;
    }
    m
}

/// Canvas pixel `p` (row-major in a canvas `width` wide) from the `listed`
/// tiles of this chunk, in stack order; 0 where no tile covers it.
/// `blend`: 0 linear, 1 none, 2 max. `kind`: the tiles' storage (see `load_pixel`).
#[allow(clippy::too_many_arguments)]
#[cube]
fn mosaic_pixel(
    tiles: &[u32],
    offsets: &[i32],
    coeffs: &[f32],
    p: u32,
    width: u32,
    listed: u32,
    th: u32,
    tw: u32,
    plane_words: u32,
    #[comptime] kind: u32,
    #[comptime] blend: u32,
) -> f32 {
    let r = (p / width) as i32;
    let c = (p % width) as i32;
    let thi = th as i32;
    let twi = tw as i32;
    let thf = f32::cast_from(th);
    let twf = f32::cast_from(tw);
    let mut acc = 0.0f32;
    let mut wsum = 0.0f32;
    let mut covered = false;
    for t in 0..listed {
        let o = t as usize * 5usize;
        let q = r - offsets[o];
        let qx = c - offsets[o + 1];
        let dy = offsets[o + 3];
        let dx = offsets[o + 4];
        if q >= dy && q < thi && qx >= dx && qx < twi {
            let k = offsets[o + 2] as u32;
            let f = t as usize * 4usize;
            let fx = coeffs[f];
            let fy = coeffs[f + 1];
            let cx0 = coeffs[f + 2];
            let cy0 = coeffs[f + 3];
            let cx1 = fx;
            let cy1 = fy;
            let ra = (q * twi) as u32;
            let rb = ((q - dy) * twi) as u32;
            let xa = qx as u32;
            let xb = (qx - dx) as u32;
            let a = load_pixel(tiles, k, plane_words, ra + xa, kind);
            let b = load_pixel(tiles, k, plane_words, ra + xb, kind);
            let cc = load_pixel(tiles, k, plane_words, rb + xa, kind);
            let d = load_pixel(tiles, k, plane_words, rb + xb, kind);
            let v = cy0 * (cx0 * a + cx1 * b) + cy1 * (cx0 * cc + cx1 * d);
            if blend == 0 {
                let wt = ramp(f32::cast_from(q) - fy, thf) * ramp(f32::cast_from(qx) - fx, twf);
                acc += wt * v;
                wsum += wt;
            } else if blend == 1 {
                acc = v;
                covered = true;
            } else {
                if !covered || v > acc {
                    acc = v;
                }
                covered = true;
            }
        }
    }
    let mut out = 0.0f32;
    if blend == 0 {
        if wsum > 0.0f32 {
            out = acc / wsum;
        }
    } else if covered {
        out = acc;
    }
    out
}

/// `round_ties_even(v)` clamped to `[0, max]`, as the host's `from_f32_clip`.
#[cube]
fn to_int(v: f32, max: f32) -> u32 {
    let mut r = f32::round(v);
    if r < 0.0f32 {
        r = 0.0f32;
    }
    if r > max {
        r = max;
    }
    u32::cast_from(r)
}

/// Writes output words `word_start .. word_start + word_count` of the canvas.
#[allow(clippy::too_many_arguments)]
#[cube(launch)]
fn assemble_chunk(
    tiles: &[u32],
    offsets: &[i32],
    coeffs: &[f32],
    output: &mut [u32],
    word_start: u32,
    word_count: u32,
    listed: u32,
    width: u32,
    pixels: u32,
    th: u32,
    tw: u32,
    plane_words: u32,
    #[comptime] kind: u32,
    #[comptime] blend: u32,
) {
    let i = ABSOLUTE_POS as u32;
    if i < word_count {
        let word = word_start + i;
        let mut out = 0u32;
        if kind == 2 {
            if word < pixels {
                let v = mosaic_pixel(tiles, offsets, coeffs, word, width, listed, th, tw, plane_words, kind, blend);
                out = u32::reinterpret(v);
            }
        } else if kind == 1 {
            for j in 0..2u32 {
                let p = word * 2u32 + j;
                if p < pixels {
                    let v = mosaic_pixel(tiles, offsets, coeffs, p, width, listed, th, tw, plane_words, kind, blend);
                    out |= to_int(v, 65535.0f32) << (j * 16u32);
                }
            }
        } else {
            for j in 0..4u32 {
                let p = word * 4u32 + j;
                if p < pixels {
                    let v = mosaic_pixel(tiles, offsets, coeffs, p, width, listed, th, tw, plane_words, kind, blend);
                    out |= to_int(v, 255.0f32) << (j * 8u32);
                }
            }
        }
        output[word as usize] = out;
    }
}

/// Assembles GPU `tiles` (`[N, Y, X]`) at `positions` (top-left `(x, y)` px,
/// one per tile) into one plane `[1, H, W]` of the input dtype on the same
/// device: the mosaic of [`hcsflow_stitch::assemble`] (see the module docs
/// for how closely they agree). Chunks of [`DEFAULT_CHUNK_PIXELS`].
pub fn assemble(tiles: &WgpuArray, positions: &[(f64, f64)], blend: Blend) -> Result<WgpuArray, GpuError> {
    assemble_chunked(tiles, positions, blend, DEFAULT_CHUNK_PIXELS)
}

/// [`assemble`] with about `chunk_pixels` canvas pixels per launch (rounded
/// to whole 32-bit words; at least one word). The result does not depend on it.
pub fn assemble_chunked(tiles: &WgpuArray, positions: &[(f64, f64)], blend: Blend, chunk_pixels: usize) -> Result<WgpuArray, GpuError> {
    let ctx = tiles.context().clone();
    let shape = DeviceBuffer::shape(tiles);
    if shape.len() != 3 {
        return Err(ctx.runtime_error("assemble", format!("tiles must be a [N, Y, X] stack, got shape {shape:?}")));
    }
    let (n, th, tw) = (shape[0], shape[1], shape[2]);
    if n == 0 {
        return Err(StitchError::Empty.into());
    }
    if positions.len() != n {
        return Err(StitchError::LayoutMismatch { tiles: n, layout: positions.len() }.into());
    }
    let ((ox, oy), (h, w)) = canvas_geometry(positions, th, tw)?;
    let dtype = DeviceBuffer::dtype(tiles);
    let pixels = h * w;
    let words = words_for(dtype, pixels);
    let too_large = |what: &str| ctx.runtime_error("assemble", format!("{what} too large for 32-bit GPU indexing"));
    let pixels_u = u32::try_from(pixels).map_err(|_| too_large("the mosaic"))?;
    u32::try_from(n * tiles.plane_words()).map_err(|_| too_large("the tile stack"))?;
    let (th_u, tw_u) = (u32::try_from(th).map_err(|_| too_large("a tile"))?, u32::try_from(tw).map_err(|_| too_large("a tile"))?);
    ctx.check_size("the mosaic", (words.max(1) * 4) as u64)?;
    let out = ctx.client().empty(words.max(1) * 4);
    let place = placements(positions, (ox, oy));
    if place.iter().any(|p| i32::try_from(p.row).is_err() || i32::try_from(p.col).is_err()) {
        return Err(too_large("the mosaic"));
    }
    let per_word = if dtype == DType::F32 { 1 } else { 4 / dtype.size_bytes() };
    let chunk_words = (chunk_pixels / per_word).max(1);
    let (kind, mode) = (
        kind_of(dtype),
        match blend {
            Blend::Linear => 0u32,
            Blend::None => 1,
            Blend::Max => 2,
        },
    );
    let client = ctx.client();
    let mut start = 0;
    while start < words {
        let end = (start + chunk_words).min(words);
        // Canvas rows this chunk's pixels span (the last word may hold padding).
        let first_px = start * per_word;
        let last_px = (end * per_word).min(pixels).max(first_px + 1) - 1;
        let (rlo, rhi) = ((first_px / w) as i64, (last_px / w) as i64 + 1);
        let mut offsets: Vec<i32> = Vec::new();
        let mut coeffs: Vec<f32> = Vec::new();
        for (k, p) in place.iter().enumerate() {
            let rows = (p.row + p.dy as i64).max(rlo) < (p.row + th as i64).min(rhi);
            let cols = (p.col + p.dx as i64).max(0) < (p.col + tw as i64).min(w as i64);
            if rows && cols {
                offsets.extend([p.row as i32, p.col as i32, k as i32, p.dy as i32, p.dx as i32]);
                coeffs.extend([p.fx, p.fy, 1.0 - p.fx, 1.0 - p.fy]);
            }
        }
        let listed = offsets.len() / OFFSETS;
        if listed == 0 {
            // Keep the buffers non-empty; the kernel reads none of them.
            offsets.extend([0; OFFSETS]);
            coeffs.extend([0.0; COEFFS]);
        }
        let count = end - start;
        let off_buf = ctx.upload_bytes(bytemuck::cast_slice(&offsets));
        let coeff_buf = ctx.upload_bytes(bytemuck::cast_slice(&coeffs));
        // SAFETY: tiles holds n × plane_words words and every pixel index is
        // inside a tile k < n (bounds tested in the kernel); offsets/coeffs hold
        // `listed` entries; the threads write words start..end < words.
        unsafe {
            assemble_chunk::launch(
                client,
                grid(count),
                CubeDim::new_1d(BLOCK),
                BufferArg::from_raw_parts(tiles.handle.clone(), n * tiles.plane_words()),
                BufferArg::from_raw_parts(off_buf, offsets.len()),
                BufferArg::from_raw_parts(coeff_buf, coeffs.len()),
                BufferArg::from_raw_parts(out.clone(), words.max(1)),
                start as u32,
                count as u32,
                listed as u32,
                w as u32,
                pixels_u,
                th_u,
                tw_u,
                tiles.plane_words() as u32,
                kind,
                mode,
            );
        }
        start = end;
    }
    Ok(WgpuArray::from_parts(ctx, out, vec![1, h, w], dtype))
}

/// The registered `assemble` on wgpu arrays, with the host's argument
/// semantics: positions from the `positions` artifact when an earlier step
/// produced it, else the tiles are registered on the host by
/// [`hcsflow_stitch::register_for_assembly`] (the host `assemble`'s own path:
/// same layout rules, arguments and run-report notes); then the mosaic is
/// assembled on the GPU.
pub(super) fn assemble_call(array: Array, args: &AssembleArgs, ctx: &mut CallContext) -> Result<Array, FunctionError> {
    let input = wgpu_input(NAME, &array)?;
    let fail = |e: String| FunctionError::failed(NAME, e);
    let blend = args.blend_mode()?;
    let n = input.planes();
    let positions = match ctx.inputs.get(POSITIONS) {
        Some(table) => positions_from_table(table, n, &ctx.stack)?,
        None => {
            // Registration runs on the host, exactly as the host `assemble` does it.
            let tiles = download(input)
                .map_err(|e| e.into_function_error(NAME))?
                .into_stack()
                .map_err(|_| fail("the tiles are not a stack".into()))?;
            hcsflow_stitch::register_for_assembly(&tiles, &args.grid, ctx)?
        }
    };
    let out = assemble(input, &positions, blend).map_err(|e| e.into_function_error(NAME))?;
    Ok(Array::Device(Arc::new(out)))
}
