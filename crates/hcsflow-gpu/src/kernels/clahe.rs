//! CLAHE on the GPU: `clahe` (skimage's `equalize_adapthist`), the host's
//! steps of `hcsflow_ops::clahe` with the host's own helpers for the small
//! per-plane tables:
//!
//! 1. f32 planes become 16-bit on the device as the host does it (per-plane
//!    min/max by atomics on order-preserving keys, NaN/±inf refused with the
//!    host's error, `rint(v·65535)` or the min..max stretch in f32); the
//!    16-bit values' range per plane comes from per-plane histograms.
//! 2. The bin of every value: `bin_lut_for_range` on the host (256 or 65,536
//!    entries a plane), uploaded.
//! 3. Tile histograms on the device (atomics; mirrored tiles past the plane
//!    through the host's `Boundary::Mirror` index tables), read back
//!    (`tiles × nbins` counts a plane: 16,384 × 4 bytes by default).
//! 4. Clip and cumulate each tile's histogram into its grey-level map on the
//!    host with `tile_map` (skimage's integer clipping in i64; its f64 map),
//!    uploaded as u32.
//! 5. Per pixel the bilinear mix of the four tile maps. The host adds four f32
//!    terms `f32(m · f64(wx·wy))`; GPUs have no f64, so the weight products
//!    `f64(wx·wy)` come from the host (one table of `ky × kx` positions in a
//!    tile, 4 corners) as f64 significands split in 14-bit limbs, and the
//!    device forms `m · significand` exactly in integers and rounds it as the
//!    host does, to 53 bits then to 24 (ties to even each time): every term,
//!    hence the f32 sum and its truncation, is the host's bit for bit.
//! 6. Per-plane min/max of the levels by atomics, the host's output table
//!    (`integer_output_lut` / `f32_output_lut`), applied on the device.
//!
//! Result: equal to the host for every dtype. The f32 input's stretch
//! `(v − min) / span` needs a correctly rounded f32 division, which lavapipe
//! and most GPUs give; a GPU whose division is not may move a value by one
//! 16-bit step there. The weight table is `48 · ky · kx` bytes: a
//! `kernel_size` making it larger than a binding fails with the sizes.

use std::sync::Arc;

use cubecl::prelude::*;
use cubecl::server::Handle;
use hcsflow_core::{Array, DType, DeviceBuffer, FunctionError, StackShape};
use hcsflow_ops::clahe::{bin_lut_for_range, clip_count, f32_output_lut, integer_output_lut, tile_map, ClaheArgs, CLAHE};
use hcsflow_ops::convolve::Boundary;

use super::normalize::{geometry, integer_histograms, key_of, read_u32, zeros, Geometry};
use super::{grid, kind_of, lane, lanes_of, wgpu_input, BLOCK};
use crate::array::{words_for, WgpuArray};
use crate::context::GpuContext;

const NAME: &str = CLAHE.name;

/// Added to the weights' binary exponents so that they travel as positive u32.
const EXP_BIAS: i32 = 4096;

/// Device scratch of CLAHE on `shape` (default arguments): the 16-bit copy
/// of an f32 stack, one level per pixel, per plane a 65,536-counter histogram,
/// a bin table and a 16,384-entry output table, the tile histograms and maps
/// (256 bins), and the weight table (48 bytes a position in a tile).
pub(super) fn scratch(shape: &StackShape, dtype: DType) -> u64 {
    let planes = shape.depth as u64;
    let pixels = (shape.height * shape.width) as u64;
    let copy = if dtype == DType::F32 { planes * words_for(DType::U16, pixels as usize) as u64 * 4 } else { 0 };
    let (ky, kx) = ((shape.height / 8).max(1), (shape.width / 8).max(1));
    let tiles = (shape.height.div_ceil(ky) * shape.width.div_ceil(kx)) as u64;
    let per_plane = pixels * 4 + (2 * 65_536 + 16_384) * 4 + tiles * 256 * 4 * 2;
    copy + planes * per_plane + (ky * kx * 48) as u64
}

/// Per-plane min and max keys of the f32 values; `flags[0]` set on NaN or ±inf.
#[cube(launch)]
fn f32_plane_range(input: &[f32], keys: &mut [Atomic<u32>], flags: &mut [Atomic<u32>], total: u32, pixels: u32) {
    let t = ABSOLUTE_POS as u32;
    if t < total {
        let plane = t / pixels;
        let b = u32::reinterpret(input[t as usize]);
        if (b & 0x7FFF_FFFFu32) >= 0x7F80_0000u32 {
            flags[0].fetch_max(1u32);
        } else {
            let k = key_of(b);
            keys[(2u32 * plane) as usize].fetch_min(k);
            keys[(2u32 * plane + 1u32) as usize].fetch_max(k);
        }
    }
}

/// skimage's `img_as_uint` in f32: `clamp(rint(u · 65535), 0, 65535)`, ties to even.
#[cube]
fn to_u16(u: f32) -> u32 {
    let x = u * 65535.0f32;
    // Negative values round to 0 or below: 0 after the clamp.
    let mut r = 0u32;
    if x > 0.0f32 {
        // x ≤ 65535: truncation is the floor, exact in f32 and u32.
        let f = u32::cast_from(x);
        let d = x - f32::cast_from(f);
        r = f;
        if d > 0.5f32 || (d == 0.5f32 && (f & 1u32) != 0u32) {
            r = f + 1u32;
        }
        if r > 65535u32 {
            r = 65535u32;
        }
    }
    r
}

/// The 16-bit values of the f32 planes, packed 2 per word: `params[3·plane..]`
/// = (mode, min, span): mode 0 `rint(v·65535)`, 1 `(v − min) / span` first,
/// 2 `clamp(v, 0, 1)` first (a constant plane outside [-1, 1]).
// CubeCL kernels take the plain comparisons, not clamp.
#[allow(clippy::manual_clamp)]
#[cube(launch)]
fn f32_to_u16(input: &[f32], params: &[f32], output: &mut [u32], total_words: u32, plane_words: u32, pixels: u32) {
    let i = ABSOLUTE_POS as u32;
    if i < total_words {
        let plane = i / plane_words;
        let word = i % plane_words;
        let mode = params[(3u32 * plane) as usize];
        let mn = params[(3u32 * plane + 1u32) as usize];
        let span = params[(3u32 * plane + 2u32) as usize];
        let mut out = 0u32;
        for j in 0..2u32 {
            let p = word * 2u32 + j;
            if p < pixels {
                let mut v = input[(plane * pixels + p) as usize];
                if mode == 1.0f32 {
                    v = (v - mn) / span;
                } else if mode == 2.0f32 {
                    if v < 0.0f32 {
                        v = 0.0f32;
                    }
                    if v > 1.0f32 {
                        v = 1.0f32;
                    }
                }
                out |= to_u16(v) << (16u32 * j);
            }
        }
        output[i as usize] = out;
    }
}

/// Tile histograms: position `(i, j)` of the tiled (mirrored) plane counts
/// its pixel's bin into `hist[((plane · ny + i / ky) · nx + j / kx) · nbins + bin]`.
#[cube(launch)]
#[allow(clippy::too_many_arguments)]
fn tile_histograms(
    input: &[u32],
    bins: &[u32],
    rows: &[u32],
    cols: &[u32],
    hist: &mut [Atomic<u32>],
    total: u32,
    tiled_h: u32,
    tiled_w: u32,
    geometry: &[u32],
    #[comptime] kind: u32,
) {
    let t = ABSOLUTE_POS as u32;
    if t < total {
        // geometry = [plane_words, w, ky, kx, ny, nx, nbins, bin_stride]
        let plane_words = geometry[0];
        let w = geometry[1];
        let ky = geometry[2];
        let kx = geometry[3];
        let ny = geometry[4];
        let nx = geometry[5];
        let nbins = geometry[6];
        let bin_stride = geometry[7];
        let per_plane = tiled_h * tiled_w;
        let plane = t / per_plane;
        let q = t % per_plane;
        let i = q / tiled_w;
        let j = q % tiled_w;
        let p = rows[i as usize] * w + cols[j as usize];
        let lanes = lanes_of(kind);
        let v = lane(input[(plane * plane_words + p / lanes) as usize], p % lanes, kind);
        let b = bins[(plane * bin_stride + v) as usize];
        let tile = (plane * ny + i / ky) * nx + j / kx;
        hist[(tile * nbins + b) as usize].fetch_add(1u32);
    }
}

/// `f32(f64(m · W))` for an integer `m < 2^14` and `W = significand · 2^exp`
/// (`limbs`: the 53-bit significand in 14-bit limbs, two a word): the exact
/// product in integers, rounded to 53 bits then to 24, ties to even, as the
/// host's f64 multiplication and f32 conversion round it.
#[cube]
fn mul_round(m: u32, l01: u32, l23: u32, exp: i32) -> f32 {
    let mut r = 0.0f32;
    if m != 0u32 && l23 != 0xFFFF_FFFFu32 {
        let w0 = l01 & 0x3FFFu32;
        let w1 = l01 >> 16u32;
        let w2 = l23 & 0x3FFFu32;
        let w3 = l23 >> 16u32;
        // 14-bit limbs of the product (< 2^67).
        let mut c = m * w0;
        let p0 = c & 0x3FFFu32;
        c = (c >> 14u32) + m * w1;
        let p1 = c & 0x3FFFu32;
        c = (c >> 14u32) + m * w2;
        let p2 = c & 0x3FFFu32;
        c = (c >> 14u32) + m * w3;
        let p3 = c & 0x3FFFu32;
        let p4 = c >> 14u32;
        // As 32-bit words: q0 bits 0..32, q1 32..64, q2 64..
        let q0 = p0 | (p1 << 14u32) | ((p2 & 0xFu32) << 28u32);
        let q1 = (p2 >> 4u32) | (p3 << 10u32) | ((p4 & 0xFFu32) << 24u32);
        let q2 = p4 >> 8u32;
        // Bit length (≥ 53: the significand is ≥ 2^52 and m ≥ 1).
        let mut len = 64u32 - q1.leading_zeros();
        if q2 != 0u32 {
            len = 96u32 - q2.leading_zeros();
        }
        // Round to 53 bits: drop d (0..=14) bits.
        let d = len - 53u32;
        let mut r0 = q0;
        let mut r1 = q1;
        let mut r2 = q2;
        let mut rem = 0u32;
        let mut half = 0u32;
        if d > 0u32 {
            rem = q0 & ((1u32 << d) - 1u32);
            half = 1u32 << (d - 1u32);
            r0 = (q0 >> d) | (q1 << (32u32 - d));
            r1 = (q1 >> d) | (q2 << (32u32 - d));
            r2 = 0u32;
        }
        if d > 0u32 && (rem > half || (rem == half && (r0 & 1u32) != 0u32)) {
            r0 += 1u32;
            if r0 == 0u32 {
                r1 += 1u32;
            }
        }
        // r2 is 0 here (53 or 54 bits in r1:r0); round to 24 bits: drop 29.
        let rem2 = r0 & 0x1FFF_FFFFu32;
        let mut s = (r1 << 3u32) | (r0 >> 29u32) | (r2 << 3u32);
        if rem2 > 0x1000_0000u32 || (rem2 == 0x1000_0000u32 && (s & 1u32) != 0u32) {
            s += 1u32;
        }
        // value = s · 2^(exp + d + 29), s in [2^23, 2^24].
        let mut e = exp + i32::cast_from(d) + 29i32;
        if s >= 0x0100_0000u32 {
            // Only 2^24, after a carry: even, halved exactly.
            s >>= 1u32;
            e += 1i32;
        }
        let biased = e + 23i32 + 127i32;
        r = f32::reinterpret((u32::cast_from(biased) << 23u32) | (s & 0x007F_FFFFu32));
    }
    r
}

/// The CLAHE level of every pixel (step 5), and each plane's min/max level.
#[cube(launch)]
#[allow(clippy::too_many_arguments)]
fn interpolate(
    input: &[u32],
    bins: &[u32],
    maps: &[u32],
    weights: &[u32],
    levels: &mut [u32],
    range: &mut [Atomic<u32>],
    total: u32,
    geometry: &[u32],
    #[comptime] kind: u32,
) {
    let t = ABSOLUTE_POS as u32;
    if t < total {
        // geometry = [plane_words, pixels, w, ky, kx, ny, nx, nbins, bin_stride]
        let plane_words = geometry[0];
        let pixels = geometry[1];
        let w = geometry[2];
        let ky = geometry[3];
        let kx = geometry[4];
        let ny = geometry[5];
        let nx = geometry[6];
        let nbins = geometry[7];
        let bin_stride = geometry[8];
        let plane = t / pixels;
        let p = t % pixels;
        let y = p / w;
        let x = p % w;
        let lanes = lanes_of(kind);
        let v = lane(input[(plane * plane_words + p / lanes) as usize], p % lanes, kind);
        let b = bins[(plane * bin_stride + v) as usize];
        let py = y + ky / 2u32;
        let px = x + kx / 2u32;
        let by = py / ky;
        let bx = px / kx;
        let iy = py % ky;
        let ix = px % kx;
        // Tiles by-1, by × bx-1, bx, clamped to the grid.
        let mut ty0 = 0u32;
        if by > 0u32 {
            ty0 = by - 1u32;
        }
        let mut ty1 = by;
        if ty1 > ny - 1u32 {
            ty1 = ny - 1u32;
        }
        if ty0 > ny - 1u32 {
            ty0 = ny - 1u32;
        }
        let mut tx0 = 0u32;
        if bx > 0u32 {
            tx0 = bx - 1u32;
        }
        let mut tx1 = bx;
        if tx1 > nx - 1u32 {
            tx1 = nx - 1u32;
        }
        if tx0 > nx - 1u32 {
            tx0 = nx - 1u32;
        }
        let base = plane * ny;
        let m00 = maps[(((base + ty0) * nx + tx0) * nbins + b) as usize];
        let m01 = maps[(((base + ty0) * nx + tx1) * nbins + b) as usize];
        let m10 = maps[(((base + ty1) * nx + tx0) * nbins + b) as usize];
        let m11 = maps[(((base + ty1) * nx + tx1) * nbins + b) as usize];
        let wbase = ((iy * kx + ix) * 12u32) as usize;
        let mut r = 0.0f32;
        r += mul_round(m00, weights[wbase], weights[wbase + 1], i32::cast_from(weights[wbase + 2]) - EXP_BIAS);
        r += mul_round(m01, weights[wbase + 3], weights[wbase + 4], i32::cast_from(weights[wbase + 5]) - EXP_BIAS);
        r += mul_round(m10, weights[wbase + 6], weights[wbase + 7], i32::cast_from(weights[wbase + 8]) - EXP_BIAS);
        r += mul_round(m11, weights[wbase + 9], weights[wbase + 10], i32::cast_from(weights[wbase + 11]) - EXP_BIAS);
        let level = u32::cast_from(r);
        levels[t as usize] = level;
        range[(2u32 * plane) as usize].fetch_min(level);
        range[(2u32 * plane + 1u32) as usize].fetch_max(level);
    }
}

/// Output word `i` from the levels through each plane's table
/// (`lut[plane · lut_stride + level]`: u8/u16 values or f32 bits).
#[cube(launch)]
fn apply_levels(
    levels: &[u32],
    lut: &[u32],
    output: &mut [u32],
    total_words: u32,
    plane_words: u32,
    pixels: u32,
    lut_stride: u32,
    #[comptime] kind: u32,
) {
    let i = ABSOLUTE_POS as u32;
    if i < total_words {
        let plane = i / plane_words;
        let word = i % plane_words;
        let lanes = lanes_of(kind);
        let bits = 32u32 / lanes;
        let mut out = 0u32;
        for j in 0..lanes {
            let p = word * lanes + j;
            if p < pixels {
                let v = lut[(plane * lut_stride + levels[(plane * pixels + p) as usize]) as usize];
                if kind == 2 {
                    out = v;
                } else {
                    out |= v << (j * bits);
                }
            }
        }
        output[i as usize] = out;
    }
}

/// The host's f64 weight product split for [`mul_round`]: (limbs 0|1, limbs
/// 2|3, exponent); a zero weight as (0, 0xFFFF_FFFF, 0).
fn split_weight(w: f64) -> [u32; 3] {
    if w == 0.0 {
        return [0, u32::MAX, 0];
    }
    let bits = w.to_bits();
    let exp = ((bits >> 52) & 0x7FF) as i32;
    let sig = (bits & ((1u64 << 52) - 1)) | (1u64 << 52);
    let limb = |k: u32| ((sig >> (14 * k)) & 0x3FFF) as u32;
    [limb(0) | (limb(1) << 16), limb(2) | (limb(3) << 16), (exp - 1075 + EXP_BIAS) as u32]
}

/// The four weight products of every position `(iy, ix)` in a `ky × kx` tile, as the host forms them.
fn weight_table(ky: usize, kx: usize) -> Vec<u32> {
    let mut table = Vec::with_capacity(ky * kx * 12);
    for iy in 0..ky {
        let fy = iy as f64 / ky as f64;
        let (wy0, wy1) = (1.0 - fy, fy);
        for ix in 0..kx {
            let fx = ix as f64 / kx as f64;
            let (wx0, wx1) = (1.0 - fx, fx);
            for w in [wx0 * wy0, wx1 * wy0, wx0 * wy1, wx1 * wy1] {
                table.extend(split_weight(w));
            }
        }
    }
    table
}

fn upload_checked(ctx: &GpuContext, what: &str, words: &[u32]) -> Result<Handle, FunctionError> {
    ctx.check_size(what, (words.len() * 4) as u64).map_err(|e| e.into_function_error(NAME))?;
    Ok(ctx.upload_bytes(bytemuck::cast_slice(words)))
}

fn device(ctx: &Arc<GpuContext>, handle: Handle, shape: Vec<usize>, dtype: DType) -> WgpuArray {
    WgpuArray::from_parts(ctx.clone(), handle, shape, dtype)
}

/// The f32 stack as skimage's 16-bit values (step 1), a u16 wgpu array.
fn f32_as_u16(input: &WgpuArray, g: &Geometry) -> Result<WgpuArray, FunctionError> {
    let ctx = input.context();
    let client = ctx.client();
    let total = g.planes * g.pixels;
    let mut init = Vec::with_capacity(2 * g.planes);
    (0..g.planes).for_each(|_| init.extend([u32::MAX, 0]));
    let keys = ctx.upload_bytes(bytemuck::cast_slice(&init));
    let flags = zeros(ctx, NAME, 1)?;
    // SAFETY: input holds total f32 values, keys 2 per plane, flags one.
    unsafe {
        f32_plane_range::launch(
            client,
            grid(total),
            CubeDim::new_1d(BLOCK),
            BufferArg::from_raw_parts(input.handle.clone(), total),
            BufferArg::from_raw_parts(keys.clone(), 2 * g.planes),
            BufferArg::from_raw_parts(flags.clone(), 1),
            total as u32,
            g.pixels as u32,
        );
    }
    if read_u32(ctx, NAME, flags, 1)?[0] != 0 {
        return Err(FunctionError::invalid(NAME, "the plane holds NaN or infinite values"));
    }
    let keys = read_u32(ctx, NAME, keys, 2 * g.planes)?;
    let mut params = Vec::with_capacity(3 * g.planes);
    for k in keys.chunks(2) {
        let (mn, mx) = (hcsflow_ops::histogram::f32_from_key(k[0]), hcsflow_ops::histogram::f32_from_key(k[1]));
        if mn < -1.0 || mx > 1.0 {
            // rescale_intensity in f32, as the host: the span a Python float cast to f32.
            let span = (mx as f64 - mn as f64) as f32;
            params.extend(if mn == mx { [2.0, 0.0, 1.0] } else { [1.0, mn, span] });
        } else {
            params.extend([0.0, 0.0, 1.0]);
        }
    }
    let param_buf = ctx.upload_bytes(bytemuck::cast_slice(&params));
    let plane_words = words_for(DType::U16, g.pixels);
    let total_words = g.planes * plane_words;
    let out = zeros(ctx, NAME, total_words)?;
    // SAFETY: params holds 3 per plane, output planes × plane_words words.
    unsafe {
        f32_to_u16::launch(
            client,
            grid(total_words),
            CubeDim::new_1d(BLOCK),
            BufferArg::from_raw_parts(input.handle.clone(), total),
            BufferArg::from_raw_parts(param_buf, params.len()),
            BufferArg::from_raw_parts(out.clone(), total_words),
            total_words as u32,
            plane_words as u32,
            g.pixels as u32,
        );
    }
    Ok(device(ctx, out, DeviceBuffer::shape(input).to_vec(), DType::U16))
}

pub(super) fn clahe(array: Array, args: &ClaheArgs) -> Result<Array, FunctionError> {
    let input = wgpu_input(NAME, &array)?;
    if args.nbins < 1 {
        return Err(FunctionError::invalid(NAME, "nbins must be at least 1"));
    }
    if args.clip_limit.is_nan() || args.clip_limit < 0.0 {
        return Err(FunctionError::invalid(NAME, format!("clip_limit must be >= 0, got {}", args.clip_limit)));
    }
    let g = geometry(NAME, input)?;
    let shape = DeviceBuffer::shape(input).to_vec();
    let (h, w) = (shape[shape.len() - 2], shape[shape.len() - 1]);
    let dtype = DeviceBuffer::dtype(input);
    let ctx = input.context();
    let client = ctx.client();
    let dim = CubeDim::new_1d(BLOCK);
    // Step 1: 16-bit values (the u8 values stand for v·257, as the host's bin table reads them).
    let converted = if dtype == DType::F32 { Some(f32_as_u16(input, &g)?) } else { None };
    let src = converted.as_ref().unwrap_or(input);
    let src_kind = kind_of(DeviceBuffer::dtype(src));
    let u8_input = dtype == DType::U8;
    // Step 2: each plane's 16-bit range from its histogram, and its bin table.
    let hists = integer_histograms(NAME, src, &geometry(NAME, src)?, true)?;
    let nbins = args.nbins as usize;
    let mut bins: Vec<u32> = Vec::new();
    for hist in &hists {
        let lo = hist.iter().position(|&c| c > 0).unwrap_or(0);
        let hi = hist.iter().rposition(|&c| c > 0).unwrap_or(0);
        let scale = if u8_input { 257 } else { 1 };
        bins.extend(bin_lut_for_range((lo * scale) as u16, (hi * scale) as u16, nbins, u8_input).into_iter().map(u32::from));
    }
    let bin_stride = if u8_input { 256 } else { 65_536 };
    let bin_buf = upload_checked(ctx, "the bin tables", &bins)?;
    // Step 3: tile histograms.
    let k = args.kernel_size as usize;
    let (ky, kx) = if k > 0 { (k, k) } else { ((h / 8).max(1), (w / 8).max(1)) };
    let (ny, nx) = (h.div_ceil(ky), w.div_ceil(kx));
    let elements = (ky * kx) as i64;
    if u32::try_from(ky * kx * 12).is_err() || u32::try_from(g.planes * ny * nx * nbins).is_err() {
        return Err(FunctionError::too_large(NAME, "tiles too large for one GPU launch"));
    }
    let rows: Vec<u32> = (0..ny * ky).map(|i| Boundary::Mirror.index(i as isize, h) as u32).collect();
    let cols: Vec<u32> = (0..nx * kx).map(|j| Boundary::Mirror.index(j as isize, w) as u32).collect();
    let counters = g.planes * ny * nx * nbins;
    let hist = zeros(ctx, NAME, counters)?;
    let tiled = g.planes * rows.len() * cols.len();
    if u32::try_from(tiled).is_err() {
        return Err(FunctionError::too_large(NAME, "tiles too large for one GPU launch"));
    }
    let src_plane_words = src.plane_words();
    let src_words = g.planes * src_plane_words;
    let geo = [src_plane_words, w, ky, kx, ny, nx, nbins, bin_stride].map(|v| v as u32);
    let geo_buf = ctx.upload_bytes(bytemuck::cast_slice(&geo));
    let (row_buf, col_buf) = (upload_checked(ctx, "rows", &rows)?, upload_checked(ctx, "columns", &cols)?);
    // SAFETY: rows/cols hold mirrored indices < h / < w, so every pixel index is
    // inside its plane; bins holds planes × bin_stride entries, each < nbins, so
    // every counter index is < planes × ny × nx × nbins.
    unsafe {
        tile_histograms::launch(
            client,
            grid(tiled),
            dim,
            BufferArg::from_raw_parts(src.handle.clone(), src_words),
            BufferArg::from_raw_parts(bin_buf.clone(), bins.len()),
            BufferArg::from_raw_parts(row_buf, rows.len()),
            BufferArg::from_raw_parts(col_buf, cols.len()),
            BufferArg::from_raw_parts(hist.clone(), counters),
            tiled as u32,
            rows.len() as u32,
            cols.len() as u32,
            BufferArg::from_raw_parts(geo_buf, geo.len()),
            src_kind,
        );
    }
    // Step 4: clipped, cumulated maps on the host.
    let counts = read_u32(ctx, NAME, hist, counters)?;
    let clip = clip_count(args.clip_limit, elements);
    let mut maps = Vec::with_capacity(counters);
    let mut tile = vec![0i64; nbins];
    for c in counts.chunks(nbins) {
        tile.iter_mut().zip(c).for_each(|(t, &v)| *t = i64::from(v));
        tile_map(&mut tile, clip, elements, &mut maps);
    }
    let maps: Vec<u32> = maps.into_iter().map(|m| m as u32).collect();
    let map_buf = upload_checked(ctx, "the tile maps", &maps)?;
    // Step 5: levels.
    let weights = weight_table(ky, kx);
    let weight_buf = upload_checked(ctx, "the interpolation weights", &weights)?;
    let total = g.planes * g.pixels;
    let levels = zeros(ctx, NAME, total)?;
    let mut init = Vec::with_capacity(2 * g.planes);
    (0..g.planes).for_each(|_| init.extend([u32::MAX, 0]));
    let range = ctx.upload_bytes(bytemuck::cast_slice(&init));
    let geo = [src_plane_words, g.pixels, w, ky, kx, ny, nx, nbins, bin_stride].map(|v| v as u32);
    let geo_buf = ctx.upload_bytes(bytemuck::cast_slice(&geo));
    // SAFETY: maps holds planes × ny × nx × nbins entries and tiles are clamped
    // to the grid; weights holds ky × kx × 12 words (iy < ky, ix < kx); levels
    // total values; range 2 per plane.
    unsafe {
        interpolate::launch(
            client,
            grid(total),
            dim,
            BufferArg::from_raw_parts(src.handle.clone(), src_words),
            BufferArg::from_raw_parts(bin_buf, bins.len()),
            BufferArg::from_raw_parts(map_buf, maps.len()),
            BufferArg::from_raw_parts(weight_buf, weights.len()),
            BufferArg::from_raw_parts(levels.clone(), total),
            BufferArg::from_raw_parts(range.clone(), 2 * g.planes),
            total as u32,
            BufferArg::from_raw_parts(geo_buf, geo.len()),
            src_kind,
        );
    }
    // Step 6: the output tables and their application.
    let range = read_u32(ctx, NAME, range, 2 * g.planes)?;
    let stride = 16_384usize;
    let mut lut = vec![0u32; g.planes * stride];
    for (plane, r) in range.chunks(2).enumerate() {
        let (lo, hi) = (r[0] as u16, r[1] as u16);
        let dst = &mut lut[plane * stride..];
        match dtype {
            DType::U8 => integer_output_lut::<u8>(lo, hi).into_iter().zip(dst.iter_mut()).for_each(|(v, d)| *d = u32::from(v)),
            DType::U16 => integer_output_lut::<u16>(lo, hi).into_iter().zip(dst.iter_mut()).for_each(|(v, d)| *d = u32::from(v)),
            DType::F32 => f32_output_lut(lo, hi).into_iter().zip(dst.iter_mut()).for_each(|(v, d)| *d = v.to_bits()),
        }
    }
    let lut_buf = upload_checked(ctx, "the output tables", &lut)?;
    let out = zeros(ctx, NAME, g.total_words)?;
    // SAFETY: levels are < 16,384 (truncations of sums of maps ≤ 16,383 with
    // weights summing to 1) and the tables hold 16,384 entries a plane.
    unsafe {
        apply_levels::launch(
            client,
            grid(g.total_words),
            dim,
            BufferArg::from_raw_parts(levels, total),
            BufferArg::from_raw_parts(lut_buf, lut.len()),
            BufferArg::from_raw_parts(out.clone(), g.total_words),
            g.total_words as u32,
            g.plane_words as u32,
            g.pixels as u32,
            stride as u32,
            kind_of(dtype),
        );
    }
    Ok(Array::Device(Arc::new(device(ctx, out, shape, dtype))))
}

#[cfg(test)]
mod tests {
    use super::split_weight;

    /// The limbs and exponent put the weight back together exactly.
    #[test]
    fn weights_split_exactly() {
        for w in [1.0f64, 0.5, 0.75 * 0.25, (1.0 - 1.0 / 3.0) * (2.0 / 7.0), 1e-9] {
            let [a, b, e] = split_weight(w);
            let limbs = [a & 0x3FFF, a >> 16, b & 0x3FFF, b >> 16];
            let sig: u64 = limbs.iter().enumerate().map(|(k, &l)| u64::from(l) << (14 * k)).sum();
            assert_eq!(sig as f64 * 2f64.powi(e as i32 - super::EXP_BIAS), w);
        }
        assert_eq!(split_weight(0.0), [0, u32::MAX, 0]);
    }
}
