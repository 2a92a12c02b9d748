//! Gaussian blur, sharpen (unsharp mask), channel composite and apply-mask on the GPU.
//!
//! Same algorithm as the host (`hcsflow_ops::convolve` / `filters` /
//! `composite`): pixels unpacked to f32, the same f32 weights, a Y pass then
//! an X pass with scipy's `'reflect'` boundary, taps added in the same order.
//! Shader compilers may fuse a multiply and an add into one FMA, so results
//! agree with the host within 1e-6 × max|input| rather than bit for bit.
//! apply_mask only moves pixels: bit-exact.

use std::sync::Arc;

use cubecl::prelude::*;
use cubecl::server::Handle;
use hcsflow_core::{Array, DType, DeviceBuffer, FunctionError, StackShape};
use hcsflow_ops::composite::{composite_weights, ApplyMaskArgs, CompositeArgs, APPLY_MASK, COMPOSITE};
use hcsflow_ops::convolve::Kernel1d;
use hcsflow_ops::filters::{GaussianBlurArgs, SharpenArgs, GAUSSIAN_BLUR, SHARPEN};

use super::normalize::zeros;
use super::{grid, wgpu_input, BLOCK};
use crate::array::WgpuArray;

/// Unpacks u8/u16 pixels (`per_word` per 32-bit word, `bits` each) of every
/// plane into one f32 per pixel.
#[cube(launch)]
fn unpack_f32(input: &[u32], output: &mut [f32], total: u32, pixels: u32, plane_words: u32, log2_per: u32, bits: u32, mask: u32) {
    let i = ABSOLUTE_POS;
    if i < total as usize {
        let plane = i / pixels as usize;
        let p = (i % pixels as usize) as u32;
        let word = input[plane * plane_words as usize + (p >> log2_per) as usize];
        let lane = p & ((1u32 << log2_per) - 1u32);
        output[i] = f32::cast_from((word >> (lane * bits)) & mask);
    }
}

/// scipy `'reflect'` index of `i` on a line of `n` samples.
#[cube]
fn reflect(i: i32, n: i32) -> i32 {
    let period = 2i32 * n;
    let mut m = i % period;
    if m < 0i32 {
        m += period;
    }
    if m >= n {
        m = period - 1i32 - m;
    }
    m
}

/// Y pass: `out[p, y, x] = Σ_k w[k] · in[p, reflect(y + k - r), x]`, taps folded like the host.
#[cube(launch)]
fn correlate_y(input: &[f32], weights: &[f32], output: &mut [f32], total: u32, h: u32, w: u32, radius: u32) {
    let i = ABSOLUTE_POS;
    if i < total as usize {
        let plane_px = (h * w) as usize;
        let base = (i / plane_px) * plane_px;
        let rem = i % plane_px;
        let y = (rem / w as usize) as i32;
        let x = rem % w as usize;
        let r = radius as usize;
        let mut acc = weights[r] * input[i];
        for k in 1..radius + 1 {
            let ki = k as i32;
            let wk = weights[r + k as usize];
            let wm = weights[r - k as usize];
            let a = input[base + reflect(y - ki, h as i32) as usize * w as usize + x];
            let b = input[base + reflect(y + ki, h as i32) as usize * w as usize + x];
            if wk == wm {
                acc += wk * (a + b);
            } else {
                acc += wm * a + wk * b;
            }
        }
        output[i] = acc;
    }
}

/// X pass: `out[p, y, x] = Σ_k w[k] · in[p, y, reflect(x + k - r)]`.
#[cube(launch)]
fn correlate_x(input: &[f32], weights: &[f32], output: &mut [f32], total: u32, w: u32, radius: u32) {
    let i = ABSOLUTE_POS;
    if i < total as usize {
        let row = (i / w as usize) * w as usize;
        let x = (i % w as usize) as i32;
        let r = radius as usize;
        let mut acc = weights[r] * input[i];
        for k in 1..radius + 1 {
            let ki = k as i32;
            let wk = weights[r + k as usize];
            let wm = weights[r - k as usize];
            let a = input[row + reflect(x - ki, w as i32) as usize];
            let b = input[row + reflect(x + ki, w as i32) as usize];
            if wk == wm {
                acc += wk * (a + b);
            } else {
                acc += wm * a + wk * b;
            }
        }
        output[i] = acc;
    }
}

/// `out = x + (x - blurred) · amount` in place on `blurred`.
#[cube(launch)]
fn unsharp_combine(x: &[f32], blurred: &mut [f32], total: u32, amount: f32) {
    let i = ABSOLUTE_POS;
    if i < total as usize {
        let v = x[i];
        blurred[i] = v + (v - blurred[i]) * amount;
    }
}

/// `out[y, x] = Σ_z w[z] · in[z, y, x]`, plane order, first term assigned.
#[cube(launch)]
fn weighted_sum(input: &[f32], weights: &[f32], output: &mut [f32], pixels: u32, planes: u32) {
    let i = ABSOLUTE_POS;
    if i < pixels as usize {
        let mut acc = weights[0] * input[i];
        for z in 1..planes {
            acc += weights[z as usize] * input[z as usize * pixels as usize + i];
        }
        output[i] = acc;
    }
}

/// The stack as one f32 per pixel on the device (a copy for u8/u16; the
/// handle itself for f32), with (planes, h, w).
fn as_f32(name: &str, input: &WgpuArray) -> Result<(Handle, usize, usize, usize), FunctionError> {
    let shape = DeviceBuffer::shape(input);
    let (h, w) = (shape[shape.len() - 2], shape[shape.len() - 1]);
    let planes = input.planes();
    let total = planes * h * w;
    if total == 0 {
        return Err(FunctionError::invalid(name, "the stack has no pixels"));
    }
    if u32::try_from(total).is_err() {
        return Err(FunctionError::too_large(name, "stack too large for one GPU launch"));
    }
    let dtype = DeviceBuffer::dtype(input);
    let (log2_per, bits, mask) = match dtype {
        DType::F32 => return Ok((input.handle.clone(), planes, h, w)),
        DType::U16 => (1u32, 16u32, 0xFFFFu32),
        DType::U8 => (2u32, 8u32, 0xFFu32),
    };
    let ctx = input.context();
    let out = zeros(ctx, name, total)?;
    launch_unpack(ctx, input, &out, total, h * w, (log2_per, bits, mask));
    Ok((out, planes, h, w))
}

/// Unpacks `input` (u8/u16) into `out`, which holds `total` f32 values.
fn launch_unpack(ctx: &crate::GpuContext, input: &WgpuArray, out: &Handle, total: usize, pixels: usize, packing: (u32, u32, u32)) {
    let (log2_per, bits, mask) = packing;
    let words = input.planes() * input.plane_words();
    // SAFETY: input holds planes × plane_words words and every index p >> log2_per
    // of a pixel p < pixels lies inside its plane; out holds total values.
    unsafe {
        unpack_f32::launch(
            ctx.client(),
            grid(total),
            CubeDim::new_1d(BLOCK),
            BufferArg::from_raw_parts(input.handle.clone(), words),
            BufferArg::from_raw_parts(out.clone(), total),
            total as u32,
            pixels as u32,
            input.plane_words() as u32,
            log2_per,
            bits,
            mask,
        );
    }
}

/// Device scratch of a blur (or sharpen) on `shape`: the pixels unpacked to
/// f32 (not for an f32 stack) and the Y pass's f32 result.
pub(super) fn separable_scratch(shape: &StackShape, dtype: DType) -> u64 {
    let plane = (shape.height * shape.width * 4) as u64;
    let copies = if dtype == DType::F32 { 1 } else { 2 };
    shape.depth as u64 * plane * copies
}

/// Separable correlation of every plane of `src` (f32, `planes × h × w`).
/// `dims` = (planes, h, w).
fn separable(
    name: &str,
    ctx: &crate::GpuContext,
    src: &Handle,
    dims: (usize, usize, usize),
    ky: &Kernel1d,
    kx: &Kernel1d,
) -> Result<Handle, FunctionError> {
    let (planes, h, w) = dims;
    let total = planes * h * w;
    let client = ctx.client();
    let tmp = zeros(ctx, name, total)?;
    let out = zeros(ctx, name, total)?;
    let wy = ctx.upload_bytes(bytemuck::cast_slice(&ky.weights));
    let wx = ctx.upload_bytes(bytemuck::cast_slice(&kx.weights));
    // SAFETY: every buffer holds `total` f32 values (weights: 2r + 1); indices
    // are reflected into the plane.
    unsafe {
        correlate_y::launch(
            client,
            grid(total),
            CubeDim::new_1d(BLOCK),
            BufferArg::from_raw_parts(src.clone(), total),
            BufferArg::from_raw_parts(wy, ky.weights.len()),
            BufferArg::from_raw_parts(tmp.clone(), total),
            total as u32,
            h as u32,
            w as u32,
            ky.radius() as u32,
        );
        correlate_x::launch(
            client,
            grid(total),
            CubeDim::new_1d(BLOCK),
            BufferArg::from_raw_parts(tmp, total),
            BufferArg::from_raw_parts(wx, kx.weights.len()),
            BufferArg::from_raw_parts(out.clone(), total),
            total as u32,
            w as u32,
            kx.radius() as u32,
        );
    }
    Ok(out)
}

fn f32_result(input: &WgpuArray, handle: Handle, shape: Vec<usize>) -> Array {
    Array::Device(Arc::new(WgpuArray::from_parts(input.context().clone(), handle, shape, DType::F32)))
}

pub(super) fn gaussian_blur(array: Array, args: &GaussianBlurArgs) -> Result<Array, FunctionError> {
    const NAME: &str = GAUSSIAN_BLUR.name;
    let input = wgpu_input(NAME, &array)?;
    let (sigma_y, sigma_x) = args.axis_sigmas()?;
    let ky = Kernel1d::gaussian(sigma_y, args.truncate);
    let kx = Kernel1d::gaussian(sigma_x, args.truncate);
    let (src, planes, h, w) = as_f32(NAME, input)?;
    let out = separable(NAME, input.context(), &src, (planes, h, w), &ky, &kx)?;
    Ok(f32_result(input, out, DeviceBuffer::shape(input).to_vec()))
}

pub(super) fn sharpen(array: Array, args: &SharpenArgs) -> Result<Array, FunctionError> {
    const NAME: &str = SHARPEN.name;
    let input = wgpu_input(NAME, &array)?;
    let k = Kernel1d::gaussian(args.radius, 4.0);
    let (src, planes, h, w) = as_f32(NAME, input)?;
    let ctx = input.context();
    let out = separable(NAME, ctx, &src, (planes, h, w), &k, &k)?;
    let total = planes * h * w;
    // SAFETY: both buffers hold `total` f32 values.
    unsafe {
        unsharp_combine::launch(
            ctx.client(),
            grid(total),
            CubeDim::new_1d(BLOCK),
            BufferArg::from_raw_parts(src, total),
            BufferArg::from_raw_parts(out.clone(), total),
            total as u32,
            args.amount as f32,
        );
    }
    Ok(f32_result(input, out, DeviceBuffer::shape(input).to_vec()))
}

pub(super) fn composite(array: Array, args: &CompositeArgs) -> Result<Array, FunctionError> {
    const NAME: &str = COMPOSITE.name;
    let input = wgpu_input(NAME, &array)?;
    let weights = composite_weights(&args.weights, input.planes())?;
    let (src, planes, h, w) = as_f32(NAME, input)?;
    let ctx = input.context();
    let client = ctx.client();
    let pixels = h * w;
    let out = zeros(ctx, NAME, pixels)?;
    let wbuf = ctx.upload_bytes(bytemuck::cast_slice(&weights));
    // SAFETY: src holds planes × pixels values, weights one per plane, out pixels.
    unsafe {
        weighted_sum::launch(
            client,
            grid(pixels),
            CubeDim::new_1d(BLOCK),
            BufferArg::from_raw_parts(src, planes * pixels),
            BufferArg::from_raw_parts(wbuf, weights.len()),
            BufferArg::from_raw_parts(out.clone(), pixels),
            pixels as u32,
            planes as u32,
        );
    }
    Ok(f32_result(input, out, vec![1, h, w]))
}

/// apply_mask on packed u8/u16 words: lanes whose mask lane is 0 get `fill`.
#[cube(launch)]
fn mask_packed(
    input: &[u32],
    output: &mut [u32],
    total_words: u32,
    plane_words: u32,
    mask_plane: u32,
    lanes: u32,
    bits: u32,
    lane_mask: u32,
    fill: u32,
) {
    let i = ABSOLUTE_POS;
    if i < total_words as usize {
        let pw = plane_words as usize;
        let op = (i / pw) as u32;
        let wi = i % pw;
        let mut src = op;
        if op >= mask_plane {
            src = op + 1u32;
        }
        let m = input[mask_plane as usize * pw + wi];
        let v = input[src as usize * pw + wi];
        let mut out = 0u32;
        for k in 0..lanes {
            let sh = k * bits;
            let mut lane = (v >> sh) & lane_mask;
            if ((m >> sh) & lane_mask) == 0u32 {
                lane = fill;
            }
            out |= lane << sh;
        }
        output[i] = out;
    }
}

/// apply_mask on f32 planes.
#[cube(launch)]
fn mask_f32(input: &[f32], output: &mut [f32], total: u32, pixels: u32, mask_plane: u32, fill: f32) {
    let i = ABSOLUTE_POS;
    if i < total as usize {
        let px = pixels as usize;
        let op = (i / px) as u32;
        let p = i % px;
        let mut src = op;
        if op >= mask_plane {
            src = op + 1u32;
        }
        let mut v = input[src as usize * px + p];
        if input[mask_plane as usize * px + p] == 0.0f32 {
            v = fill;
        }
        output[i] = v;
    }
}

pub(super) fn apply_mask(array: Array, args: &ApplyMaskArgs) -> Result<Array, FunctionError> {
    const NAME: &str = APPLY_MASK.name;
    let input = wgpu_input(NAME, &array)?;
    let n = input.planes();
    let idx = args.mask_plane(n).filter(|_| DeviceBuffer::shape(input).len() == 3).ok_or_else(|| args.no_mask_plane(n))?;
    let ctx = input.context();
    let client = ctx.client();
    let dtype = DeviceBuffer::dtype(input);
    let pw = input.plane_words();
    let total_words = (n - 1) * pw;
    if u32::try_from(n * pw).is_err() {
        return Err(FunctionError::too_large(NAME, "stack too large for one GPU launch"));
    }
    let out = zeros(ctx, NAME, total_words)?;
    let fill = args.fill as f32;
    let mut shape = DeviceBuffer::shape(input).to_vec();
    shape[0] = n - 1;
    // SAFETY: input holds n × pw words, output (n - 1) × pw; plane indices stay below n.
    unsafe {
        let inp = BufferArg::from_raw_parts(input.handle.clone(), n * pw);
        let o = BufferArg::from_raw_parts(out.clone(), total_words);
        let (count, dim) = (grid(total_words), CubeDim::new_1d(BLOCK));
        match dtype {
            DType::F32 => mask_f32::launch(client, count, dim, inp, o, total_words as u32, pw as u32, idx as u32, fill),
            DType::U16 => {
                let f = u32::from(<u16 as hcsflow_core::Pixel>::from_f32_clip(fill));
                mask_packed::launch(client, count, dim, inp, o, total_words as u32, pw as u32, idx as u32, 2, 16, 0xFFFF, f)
            }
            DType::U8 => {
                let f = u32::from(<u8 as hcsflow_core::Pixel>::from_f32_clip(fill));
                mask_packed::launch(client, count, dim, inp, o, total_words as u32, pw as u32, idx as u32, 4, 8, 0xFF, f)
            }
        }
    }
    Ok(Array::Device(Arc::new(WgpuArray::from_parts(ctx.clone(), out, shape, dtype))))
}
