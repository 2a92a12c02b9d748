//! Whole-stack histogram equalisation on the GPU.
//!
//! u8/u16: the histogram kernel with atomics, the host's lookup table
//! (`hcsflow_ops::equalize`, the same code on 256 KB of counts), then the LUT
//! kernel. Bit-exact with the host.
//!
//! f32 (the host's skimage semantics, `nbins` equal bins): min/max of the
//! non-NaN values by atomics on order-preserving keys; the host's float32
//! bin edges; a histogram kernel that finds each value's bin by binary search
//! over those edges (`e <= v`, like the host, so the counts are exact); the
//! cdf and bin centres on the host; then per pixel the linear interpolation
//! between bin centres. The host interpolates in f64, the GPU (no f64 on most
//! GPUs) in f32 as `cdf[j] + (x − c[j]) / (c[j+1] − c[j]) · (cdf[j+1] − cdf[j])`,
//! which cannot overflow for any bin width: outputs lie in [0, 1] and agree
//! with the host within 2e-6 (a few f32 ulps of 1). Subnormal inputs may be
//! flushed to zero by the GPU.

use std::sync::Arc;

use cubecl::prelude::*;
use hcsflow_core::{Array, DType, DeviceBuffer, FunctionError};
use hcsflow_ops::equalize::{equalize_lut, linspace_f32, EqualizeArgs, STACK_EQUALIZE_HISTOGRAM};
use hcsflow_ops::histogram::{cumulative, f32_from_key};

use super::normalize::{apply_luts, failed, geometry, integer_histograms, key_of, read_u32, zeros};
use super::{grid, wgpu_input, BLOCK};
use crate::array::WgpuArray;

const NAME: &str = STACK_EQUALIZE_HISTOGRAM.name;

/// Values each thread of [`minmax_keys`] folds before its two atomics.
const PER_THREAD: u32 = 16;

/// `keys[0]` = min, `keys[1]` = max of the order-preserving keys of the
/// non-NaN values; thread `i` folds values `i + m · threads`.
#[cube(launch)]
fn minmax_keys(input: &[f32], keys: &mut [Atomic<u32>], total: u32, threads: u32) {
    let i = ABSOLUTE_POS as u32;
    if i < threads {
        let mut lo = 0xFFFF_FFFFu32;
        let mut hi = 0u32;
        for m in 0..PER_THREAD {
            let j = i + m * threads;
            if j < total {
                let b = u32::reinterpret(input[j as usize]);
                if (b & 0x7FFF_FFFFu32) <= 0x7F80_0000u32 {
                    let k = key_of(b);
                    if k < lo {
                        lo = k;
                    }
                    if k > hi {
                        hi = k;
                    }
                }
            }
        }
        if lo <= hi {
            keys[0].fetch_min(lo);
            keys[1].fetch_max(hi);
        }
    }
}

/// Number of `sorted` values (`len` of them) that are `<= v`, by `steps`
/// halvings (`steps` ≥ ⌈log2(len + 1)⌉).
#[cube]
fn count_le(sorted: &[f32], len: u32, v: f32, steps: u32) -> u32 {
    let mut lo = 0u32;
    let mut hi = len;
    for _ in 0..steps {
        if lo < hi {
            let mid = (lo + hi) / 2u32;
            if sorted[mid as usize] <= v {
                lo = mid + 1u32;
            } else {
                hi = mid;
            }
        }
    }
    lo
}

/// numpy's bin of each non-NaN value: `i` with `edges[i] <= v < edges[i+1]`,
/// the last bin closed (the host's `partition_point` rule).
// CubeCL kernels take the plain comparison, not saturating_sub.
#[allow(clippy::implicit_saturating_sub)]
#[cube(launch)]
fn histogram_f32_edges(input: &[f32], edges: &[f32], hist: &mut [Atomic<u32>], total: u32, nbins: u32, steps: u32) {
    let i = ABSOLUTE_POS;
    if i < total as usize {
        let v = input[i];
        let b = u32::reinterpret(v);
        if (b & 0x7FFF_FFFFu32) <= 0x7F80_0000u32 {
            let mut bin = count_le(edges, nbins + 1u32, v, steps);
            if bin > 0u32 {
                bin -= 1u32;
            }
            if bin > nbins - 1u32 {
                bin = nbins - 1u32;
            }
            hist[bin as usize].fetch_add(1u32);
        }
    }
}

/// `np.interp(x, centres, cdf)` in f32 (see the module docs); NaN stays NaN.
#[cube(launch)]
fn interp_f32(input: &[f32], centres: &[f32], cdf: &[f32], output: &mut [f32], total: u32, nbins: u32, steps: u32) {
    let i = ABSOLUTE_POS;
    if i < total as usize {
        let x = input[i];
        let last = (nbins - 1u32) as usize;
        let mut r = x;
        if (u32::reinterpret(x) & 0x7FFF_FFFFu32) <= 0x7F80_0000u32 {
            if x < centres[0] {
                r = cdf[0];
            } else if x >= centres[last] {
                r = cdf[last];
            } else {
                let j = (count_le(centres, nbins, x, steps) - 1u32) as usize;
                let t = (x - centres[j]) / (centres[j + 1] - centres[j]);
                r = cdf[j] + t * (cdf[j + 1] - cdf[j]);
            }
        }
        output[i] = r;
    }
}

pub(super) fn stack_equalize_histogram(array: Array, args: &EqualizeArgs) -> Result<Array, FunctionError> {
    let input = wgpu_input(NAME, &array)?;
    let g = geometry(NAME, input)?;
    let empty = || FunctionError::invalid(NAME, "the stack has no pixels (or only NaN)");
    let lut: Vec<u32> = match DeviceBuffer::dtype(input) {
        DType::U8 | DType::U16 => {
            let hists = integer_histograms(NAME, input, &g, false)?;
            let hist = hists.first().ok_or_else(empty)?;
            if DeviceBuffer::dtype(input) == DType::U8 {
                equalize_lut::<u8>(hist).ok_or_else(empty)?.into_iter().map(u32::from).collect()
            } else {
                equalize_lut::<u16>(hist).ok_or_else(empty)?.into_iter().map(u32::from).collect()
            }
        }
        DType::F32 => return equalize_f32(input, g.planes * g.pixels, args.nbins.max(1) as usize),
    };
    apply_luts(NAME, input, &g, &lut, 0)
}

/// Halvings that settle a binary search over `len` sorted values.
fn steps_for(len: usize) -> u32 {
    usize::BITS - len.leading_zeros() + 1
}

fn equalize_f32(input: &WgpuArray, total: usize, nbins: usize) -> Result<Array, FunctionError> {
    let ctx = input.context();
    let client = ctx.client();
    let (t, nb) = (total as u32, u32::try_from(nbins).map_err(|_| FunctionError::invalid(NAME, "nbins too large"))?);
    let dim = CubeDim::new_1d(BLOCK);
    // Pass 1: min and max.
    let threads = total.div_ceil(PER_THREAD as usize);
    let keys = ctx.upload_bytes(bytemuck::cast_slice(&[u32::MAX, 0u32]));
    // SAFETY: input holds `total` f32 values (every index j < total); keys holds 2.
    unsafe {
        minmax_keys::launch(
            client,
            grid(threads),
            dim,
            BufferArg::from_raw_parts(input.handle.clone(), total),
            BufferArg::from_raw_parts(keys.clone(), 2),
            t,
            threads as u32,
        );
    }
    let k = read_u32(ctx, NAME, keys, 2)?;
    if k[0] > k[1] {
        return Err(FunctionError::invalid(NAME, "the stack has no pixels (or only NaN)"));
    }
    let (mn, mx) = (f32_from_key(k[0]), f32_from_key(k[1]));
    if !mn.is_finite() || !mx.is_finite() {
        return Err(FunctionError::invalid(NAME, format!("the value range [{mn}, {mx}] is not finite")));
    }
    let (lo, hi) = if mn == mx { (mn - 0.5, mx + 0.5) } else { (mn, mx) };
    let edges = linspace_f32(lo, hi, nbins);
    // Pass 2: histogram over the edges.
    let edge_buf = ctx.upload_bytes(bytemuck::cast_slice(&edges));
    let hist = zeros(ctx, NAME, nbins)?;
    // SAFETY: edges holds nbins + 1 values (the search reads indices < nbins + 1);
    // hist holds nbins counters and every bin is clamped below nbins.
    unsafe {
        histogram_f32_edges::launch(
            client,
            grid(total),
            dim,
            BufferArg::from_raw_parts(input.handle.clone(), total),
            BufferArg::from_raw_parts(edge_buf, edges.len()),
            BufferArg::from_raw_parts(hist.clone(), nbins),
            t,
            nb,
            steps_for(edges.len()),
        );
    }
    let counts: Vec<u64> = read_u32(ctx, NAME, hist, nbins)?.into_iter().map(u64::from).collect();
    // The host's cdf (f32) and bin centres (f32).
    let cdf = cumulative(&counts);
    let n = *cdf.last().ok_or_else(|| failed(NAME, "no bins"))? as f64;
    let cdf32: Vec<f32> = cdf.iter().map(|&c| (c as f64 / n) as f32).collect();
    let centres: Vec<f32> = edges.windows(2).map(|w| (w[0] + w[1]) / 2.0).collect();
    // Pass 3: interpolation.
    let centre_buf = ctx.upload_bytes(bytemuck::cast_slice(&centres));
    let cdf_buf = ctx.upload_bytes(bytemuck::cast_slice(&cdf32));
    let out = zeros(ctx, NAME, total)?;
    // SAFETY: centres and cdf hold nbins values, indices j + 1 ≤ nbins − 1;
    // input and output hold `total` values.
    unsafe {
        interp_f32::launch(
            client,
            grid(total),
            dim,
            BufferArg::from_raw_parts(input.handle.clone(), total),
            BufferArg::from_raw_parts(centre_buf, nbins),
            BufferArg::from_raw_parts(cdf_buf, nbins),
            BufferArg::from_raw_parts(out.clone(), total),
            t,
            nb,
            steps_for(nbins),
        );
    }
    let shape = DeviceBuffer::shape(input).to_vec();
    Ok(Array::Device(Arc::new(WgpuArray::from_parts(ctx.clone(), out, shape, DType::F32))))
}
