//! Percentile normalisation on the GPU: histograms with atomics, percentiles
//! and lookup tables by the host helpers of `hcsflow-ops` (the same code the
//! host implementation runs, on 256 KB of counts), then a LUT kernel.
//!
//! u8/u16: identical to the host (same histogram, same f64 LUT). f32: exact
//! percentiles by two histogram passes over the order-preserving key (as the
//! host), then the mapping in f32 instead of f64: within
//! `1e-6 · |target_max - target_min|` (+ 1e-6 relative) of the host.

use std::sync::Arc;

use cubecl::prelude::*;
use cubecl::server::Handle;
use hcsflow_core::registry::BoxError;
use hcsflow_core::{Array, DType, DeviceBuffer, FunctionError, StackShape};
use hcsflow_ops::histogram::{percentile_rank_list, percentiles_by_rank, percentiles_from_histogram, F32Selection};
use hcsflow_ops::normalize::{integer_lut, PercentileNormalize};

use super::{grid, kind_of, lane, lanes_of, wgpu_input, BLOCK};
use crate::array::WgpuArray;
use crate::context::GpuContext;

/// Bucket id that matches no key (keys' high halves are ≤ 0xFFFF).
const NO_BUCKET: u32 = 0x1_0000;
/// Buckets per population in the second f32 pass (2 percentiles × 2 ranks).
const SLOTS: usize = 4;

/// Counts packed u8/u16 values (storage `kind` 0/1) into `hist[plane · hist_stride + v]`.
#[cube(launch)]
pub(super) fn histogram_packed(
    input: &[u32],
    hist: &mut [Atomic<u32>],
    total_words: u32,
    plane_words: u32,
    pixels: u32,
    hist_stride: u32,
    #[comptime] kind: u32,
) {
    let i = ABSOLUTE_POS;
    if i < total_words as usize {
        let plane = i / plane_words as usize;
        let word = i % plane_words as usize;
        let base = plane * hist_stride as usize;
        let w = input[i];
        let lanes = lanes_of(kind);
        for j in 0..lanes {
            if word * lanes as usize + (j as usize) < pixels as usize {
                hist[base + lane(w, j, kind) as usize].fetch_add(1u32);
            }
        }
    }
}

/// Order-preserving key of an f32's bits; NaN gets 0xFFFF_FFFF... callers test NaN first.
#[cube]
pub(super) fn key_of(b: u32) -> u32 {
    let mut k = b | 0x8000_0000u32;
    if (b & 0x8000_0000u32) != 0u32 {
        k = b ^ 0xFFFF_FFFFu32;
    }
    k
}

/// Counts the high 16 key bits of non-NaN f32 values into `hist[plane · hist_stride + hi]`.
#[cube(launch)]
fn histogram_f32_hi(input: &[f32], hist: &mut [Atomic<u32>], total: u32, pixels: u32, hist_stride: u32) {
    let i = ABSOLUTE_POS;
    if i < total as usize {
        let plane = i / pixels as usize;
        let b = u32::reinterpret(input[i]);
        if (b & 0x7FFF_FFFFu32) <= 0x7F80_0000u32 {
            let k = key_of(b);
            hist[plane * hist_stride as usize + (k >> 16u32) as usize].fetch_add(1u32);
        }
    }
}

/// Counts the low 16 key bits of values whose high bits equal one of the
/// population's 4 buckets: `hist[(pop · 4 + slot) · 65536 + lo]`.
#[cube(launch)]
fn histogram_f32_lo(input: &[f32], buckets: &[u32], hist: &mut [Atomic<u32>], total: u32, pixels: u32, per_plane: u32) {
    let i = ABSOLUTE_POS;
    if i < total as usize {
        let pop = (i / pixels as usize) * per_plane as usize;
        let b = u32::reinterpret(input[i]);
        if (b & 0x7FFF_FFFFu32) <= 0x7F80_0000u32 {
            let k = key_of(b);
            for s in 0..4u32 {
                let slot = pop * 4 + s as usize;
                if buckets[slot] == (k >> 16u32) {
                    hist[slot * 65536 + (k & 0xFFFFu32) as usize].fetch_add(1u32);
                }
            }
        }
    }
}

/// `output = lut[plane · lut_stride + v]` for packed u8/u16 values (storage `kind` 0/1).
#[cube(launch)]
fn lut_packed(input: &[u32], lut: &[u32], output: &mut [u32], total_words: u32, plane_words: u32, lut_stride: u32, #[comptime] kind: u32) {
    let i = ABSOLUTE_POS;
    if i < total_words as usize {
        let base = (i / plane_words as usize) * lut_stride as usize;
        let w = input[i];
        let lanes = lanes_of(kind);
        let bits = 32u32 / lanes;
        let mut out = 0u32;
        for j in 0..lanes {
            out |= lut[base + lane(w, j, kind) as usize] << (j * bits);
        }
        output[i] = out;
    }
}

/// `(clamp(v, lo, hi) - lo) · scale + tmin` per f32 pixel with the parameters
/// `params[pop · 4 ..]` = (lo, hi, scale, tmin); NaN stays NaN.
#[cube(launch)]
fn normalize_f32(input: &[f32], params: &[f32], output: &mut [f32], total: u32, pixels: u32, per_plane: u32) {
    let i = ABSOLUTE_POS;
    if i < total as usize {
        let p = (i / pixels as usize) * per_plane as usize * 4;
        let v = input[i];
        let b = u32::reinterpret(v);
        if (b & 0x7FFF_FFFFu32) <= 0x7F80_0000u32 {
            let lo = params[p];
            let hi = params[p + 1];
            let mut c = v;
            if c < lo {
                c = lo;
            }
            if c > hi {
                c = hi;
            }
            output[i] = (c - lo) * params[p + 2] + params[p + 3];
        } else {
            output[i] = v;
        }
    }
}

/// A failure of `name` caused by `e` (an error, or a message).
pub(super) fn failed(name: &str, e: impl Into<BoxError>) -> FunctionError {
    FunctionError::failed(name, e)
}

/// A zero-filled buffer of `words` 32-bit words.
pub(super) fn zeros(ctx: &GpuContext, name: &str, words: usize) -> Result<Handle, FunctionError> {
    ctx.check_size(name, (words * 4) as u64).map_err(|e| e.into_function_error(name))?;
    Ok(ctx.upload_bytes(&vec![0u8; words.max(1) * 4]))
}

/// Reads `words` u32 values back from the device.
pub(super) fn read_u32(ctx: &GpuContext, name: &str, handle: Handle, words: usize) -> Result<Vec<u32>, FunctionError> {
    let bytes = ctx.read_back(handle).map_err(|e| ctx.server_error("read-back", e).into_function_error(name))?;
    let bytes: &[u8] = &bytes;
    if bytes.len() < words * 4 {
        return Err(failed(name, format!("read {} bytes, expected {}", bytes.len(), words * 4)));
    }
    Ok(bytemuck::pod_collect_to_vec(&bytes[..words * 4]))
}

/// Geometry of a stack on the device, as the kernels take it.
pub(super) struct Geometry {
    pub planes: usize,
    pub plane_words: usize,
    pub pixels: usize,
    pub total_words: usize,
}

pub(super) fn geometry(name: &str, input: &WgpuArray) -> Result<Geometry, FunctionError> {
    let g = Geometry {
        planes: input.planes(),
        plane_words: input.plane_words(),
        pixels: input.plane_pixels(),
        total_words: input.planes() * input.plane_words(),
    };
    if g.planes == 0 || g.pixels == 0 {
        return Err(FunctionError::invalid(name, "the stack has no pixels (or only NaN)"));
    }
    if u32::try_from(g.total_words.max(g.planes * g.pixels)).is_err() {
        return Err(FunctionError::too_large(name, "stack too large for one GPU launch"));
    }
    Ok(g)
}

/// Launches the u8/u16 histogram kernel; returns counts per population
/// (`per_plane`: one histogram per plane, else one for the stack).
pub(super) fn integer_histograms(name: &str, input: &WgpuArray, g: &Geometry, per_plane: bool) -> Result<Vec<Vec<u64>>, FunctionError> {
    let ctx = input.context();
    let dtype = DeviceBuffer::dtype(input);
    let bins = if dtype == DType::U8 { 256 } else { 65_536 };
    let pops = if per_plane { g.planes } else { 1 };
    let hist = zeros(ctx, name, pops * bins)?;
    let stride = if per_plane { bins as u32 } else { 0 };
    let client = ctx.client();
    // SAFETY: input holds total_words words; hist holds pops × bins counters and
    // every index is plane · stride + v < pops × bins.
    unsafe {
        let inp = BufferArg::from_raw_parts(input.handle.clone(), g.total_words);
        let h = BufferArg::from_raw_parts(hist.clone(), pops * bins);
        let (count, dim) = (grid(g.total_words), CubeDim::new_1d(BLOCK));
        let (t, w, p) = (g.total_words as u32, g.plane_words as u32, g.pixels as u32);
        histogram_packed::launch(client, count, dim, inp, h, t, w, p, stride, kind_of(dtype));
    }
    let counts = read_u32(ctx, name, hist, pops * bins)?;
    Ok(counts.chunks(bins).map(|c| c.iter().map(|&v| u64::from(v)).collect()).collect())
}

/// Applies one u32-per-entry LUT per population to packed u8/u16 pixels.
pub(super) fn apply_luts(name: &str, input: &WgpuArray, g: &Geometry, luts: &[u32], lut_stride: usize) -> Result<Array, FunctionError> {
    let ctx = input.context();
    let dtype = DeviceBuffer::dtype(input);
    let client = ctx.client();
    let lut = ctx.upload_bytes(bytemuck::cast_slice(luts));
    let out = zeros(ctx, name, g.total_words)?;
    // SAFETY: lut holds pops × lut_stride entries and indices stay below it.
    unsafe {
        let inp = BufferArg::from_raw_parts(input.handle.clone(), g.total_words);
        let l = BufferArg::from_raw_parts(lut, luts.len());
        let o = BufferArg::from_raw_parts(out.clone(), g.total_words);
        let (count, dim) = (grid(g.total_words), CubeDim::new_1d(BLOCK));
        let (t, w, s) = (g.total_words as u32, g.plane_words as u32, lut_stride as u32);
        lut_packed::launch(client, count, dim, inp, l, o, t, w, s, kind_of(dtype));
    }
    let shape = DeviceBuffer::shape(input).to_vec();
    Ok(Array::Device(Arc::new(WgpuArray::from_parts(ctx.clone(), out, shape, dtype))))
}

/// Device scratch of per-plane percentile normalisation on `shape`: one
/// histogram and one look-up table per plane (u8: 256 entries, u16: 65,536;
/// f32: the two histogram passes, (1 + 4) × 65,536 counters).
pub(super) fn per_plane_scratch(shape: &StackShape, dtype: DType) -> u64 {
    shape.depth as u64 * histogram_bytes(dtype)
}

/// Device scratch of whole-stack percentile normalisation: one histogram
/// (and look-up table) for the stack.
pub(super) fn stack_scratch(_shape: &StackShape, dtype: DType) -> u64 {
    histogram_bytes(dtype)
}

/// Bytes of one population's histograms and look-up table.
fn histogram_bytes(dtype: DType) -> u64 {
    match dtype {
        DType::U8 => 2 * 256 * 4,
        DType::U16 => 2 * 65_536 * 4,
        DType::F32 => (1 + SLOTS as u64) * 65_536 * 4,
    }
}

/// Whole-stack (`per_plane = false`) or per-plane percentile normalisation.
pub(super) fn percentile_normalize(array: Array, p: &PercentileNormalize, name: &str, per_plane: bool) -> Result<Array, FunctionError> {
    let input = wgpu_input(name, &array)?;
    if p.low_percentile > p.high_percentile {
        return Err(FunctionError::invalid(
            "percentile_normalize",
            format!("low_percentile ({}) must not exceed high_percentile ({})", p.low_percentile, p.high_percentile),
        ));
    }
    let g = geometry(name, input)?;
    let ps = [p.low_percentile, p.high_percentile];
    let empty = || FunctionError::invalid(name, "the stack has no pixels (or only NaN)");
    match DeviceBuffer::dtype(input) {
        DType::U8 | DType::U16 => {
            let u8 = DeviceBuffer::dtype(input) == DType::U8;
            let hists = integer_histograms(name, input, &g, per_plane)?;
            let mut luts = Vec::new();
            for h in &hists {
                let q = percentiles_from_histogram(h, &ps).ok_or_else(empty)?;
                if u8 {
                    luts.extend(integer_lut::<u8>(|v| p.map(v, q[0], q[1])).into_iter().map(u32::from));
                } else {
                    luts.extend(integer_lut::<u16>(|v| p.map(v, q[0], q[1])).into_iter().map(u32::from));
                }
            }
            let stride = if per_plane {
                if u8 {
                    256
                } else {
                    65_536
                }
            } else {
                0
            };
            apply_luts(name, input, &g, &luts, stride)
        }
        DType::F32 => normalize_f32_stack(name, input, &g, p, per_plane),
    }
}

fn normalize_f32_stack(
    name: &str,
    input: &WgpuArray,
    g: &Geometry,
    p: &PercentileNormalize,
    per_plane: bool,
) -> Result<Array, FunctionError> {
    let ctx = input.context();
    let client = ctx.client();
    let pops = if per_plane { g.planes } else { 1 };
    let total = g.planes * g.pixels;
    let (count, dim) = (grid(total), CubeDim::new_1d(BLOCK));
    let (t, px, pp) = (total as u32, g.pixels as u32, u32::from(per_plane));
    // Pass 1: high key bits.
    let hist = zeros(ctx, name, pops * 65_536)?;
    // SAFETY: input holds total f32 values; hist holds pops × 65536 counters.
    unsafe {
        let inp = BufferArg::from_raw_parts(input.handle.clone(), total);
        let h = BufferArg::from_raw_parts(hist.clone(), pops * 65_536);
        histogram_f32_hi::launch(client, count.clone(), dim, inp, h, t, px, if per_plane { 65_536 } else { 0 });
    }
    let counts = read_u32(ctx, name, hist, pops * 65_536)?;
    let hists: Vec<Vec<u64>> = counts.chunks(65_536).map(|c| c.iter().map(|&v| u64::from(v)).collect()).collect();
    // Locate the buckets of the wanted ranks per population.
    let ps = [p.low_percentile, p.high_percentile];
    let mut selections = Vec::with_capacity(pops);
    let mut buckets = vec![NO_BUCKET; pops * SLOTS];
    for (k, h) in hists.iter().enumerate() {
        let n: u64 = h.iter().sum();
        let mut sel = None;
        if n > 0 {
            let s = F32Selection::locate(h, &percentile_rank_list(n, &ps)).ok_or_else(|| failed(name, "rank outside the histogram"))?;
            buckets[k * SLOTS..k * SLOTS + s.buckets().len()].copy_from_slice(s.buckets());
            sel = Some(s);
        }
        selections.push((n, sel));
    }
    // Pass 2: low key bits inside those buckets.
    let lows = zeros(ctx, name, pops * SLOTS * 65_536)?;
    let bucket_buf = ctx.upload_bytes(bytemuck::cast_slice(&buckets));
    // SAFETY: buckets holds pops × 4 ids; lows holds pops × 4 × 65536 counters.
    unsafe {
        let inp = BufferArg::from_raw_parts(input.handle.clone(), total);
        let b = BufferArg::from_raw_parts(bucket_buf, buckets.len());
        let h = BufferArg::from_raw_parts(lows.clone(), pops * SLOTS * 65_536);
        histogram_f32_lo::launch(client, count.clone(), dim, inp, b, h, t, px, pp);
    }
    let low_counts = read_u32(ctx, name, lows, pops * SLOTS * 65_536)?;
    let low_counts: Vec<u64> = low_counts.into_iter().map(u64::from).collect();
    let mut params = Vec::with_capacity(pops * 4);
    for (k, (n, sel)) in selections.iter().enumerate() {
        let sel = sel.as_ref().ok_or_else(|| FunctionError::invalid(name, "the stack has no pixels (or only NaN)"))?;
        let slots: Vec<&[u64]> = (0..SLOTS).map(|s| &low_counts[(k * SLOTS + s) * 65_536..(k * SLOTS + s + 1) * 65_536]).collect();
        let q = percentiles_by_rank(*n, &ps, |_| sel.finish(&slots)).ok_or_else(|| failed(name, "rank outside the histogram"))?;
        let scale = if q[1] == q[0] { 0.0 } else { (p.target_max - p.target_min) / (q[1] - q[0]) };
        params.extend([q[0] as f32, q[1] as f32, scale as f32, p.target_min as f32]);
    }
    let param_buf = ctx.upload_bytes(bytemuck::cast_slice(&params));
    let out = zeros(ctx, name, total)?;
    // SAFETY: params holds pops × 4 values; output holds total f32 values.
    unsafe {
        let inp = BufferArg::from_raw_parts(input.handle.clone(), total);
        let pb = BufferArg::from_raw_parts(param_buf, params.len());
        let o = BufferArg::from_raw_parts(out.clone(), total);
        normalize_f32::launch(client, count, dim, inp, pb, o, t, px, pp);
    }
    let shape = DeviceBuffer::shape(input).to_vec();
    Ok(Array::Device(Arc::new(WgpuArray::from_parts(ctx.clone(), out, shape, DType::F32))))
}
