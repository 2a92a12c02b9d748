//! Projections over the stack axis (max, min, mean, sum, std).

use std::sync::Arc;

use cubecl::prelude::*;
use hcsflow_core::{Array, DType, FunctionError};

use super::{grid, wgpu_input, BLOCK};
use crate::array::{words_for, WgpuArray};

/// `v` replaces `m` if strictly greater (`is_max`) or strictly smaller.
#[cube]
fn better_u32(v: u32, m: u32, #[comptime] is_max: bool) -> bool {
    if is_max {
        v > m
    } else {
        v < m
    }
}

#[cube]
fn better_f32(v: f32, m: f32, #[comptime] is_max: bool) -> bool {
    if is_max {
        v > m
    } else {
        v < m
    }
}

/// Max (or min) over planes of u16 pixels packed two per word; plane 0 seeds.
#[cube(launch)]
fn extreme_projection_u16(input: &[u32], output: &mut [u32], planes: u32, plane_words: u32, #[comptime] is_max: bool) {
    let i = ABSOLUTE_POS;
    if i < plane_words as usize {
        let stride = plane_words as usize;
        let w0 = input[i];
        let mut lo = w0 & 0xFFFFu32;
        let mut hi = w0 >> 16u32;
        for z in 1..planes {
            let w = input[z as usize * stride + i];
            let a = w & 0xFFFFu32;
            let b = w >> 16u32;
            if better_u32(a, lo, is_max) {
                lo = a;
            }
            if better_u32(b, hi, is_max) {
                hi = b;
            }
        }
        output[i] = lo | (hi << 16u32);
    }
}

/// Max (or min) over planes of u8 pixels packed four per word; plane 0 seeds.
#[cube(launch)]
fn extreme_projection_u8(input: &[u32], output: &mut [u32], planes: u32, plane_words: u32, #[comptime] is_max: bool) {
    let i = ABSOLUTE_POS;
    if i < plane_words as usize {
        let stride = plane_words as usize;
        let w0 = input[i];
        let mut m0 = w0 & 0xFFu32;
        let mut m1 = (w0 >> 8u32) & 0xFFu32;
        let mut m2 = (w0 >> 16u32) & 0xFFu32;
        let mut m3 = w0 >> 24u32;
        for z in 1..planes {
            let w = input[z as usize * stride + i];
            let a = w & 0xFFu32;
            let b = (w >> 8u32) & 0xFFu32;
            let c = (w >> 16u32) & 0xFFu32;
            let d = w >> 24u32;
            if better_u32(a, m0, is_max) {
                m0 = a;
            }
            if better_u32(b, m1, is_max) {
                m1 = b;
            }
            if better_u32(c, m2, is_max) {
                m2 = c;
            }
            if better_u32(d, m3, is_max) {
                m3 = d;
            }
        }
        output[i] = m0 | (m1 << 8u32) | (m2 << 16u32) | (m3 << 24u32);
    }
}

/// Max (or min) over planes of f32 pixels (plane 0 seeds, like the host code:
/// NaN never replaces a number).
#[cube(launch)]
fn extreme_projection_f32(input: &[f32], output: &mut [f32], planes: u32, plane_words: u32, #[comptime] is_max: bool) {
    let i = ABSOLUTE_POS;
    if i < plane_words as usize {
        let stride = plane_words as usize;
        let mut m = input[i];
        for z in 1..planes {
            let v = input[z as usize * stride + i];
            if better_f32(v, m, is_max) {
                m = v;
            }
        }
        output[i] = m;
    }
}

/// Mean (or, without `divide`, sum) over planes of u16 pixels packed two per word;
/// f32 output, one value per pixel. Dividing by 1 leaves the sum unchanged.
/// Sums in f32 in plane order, then divides: exact sums for up to 256 planes.
#[cube(launch)]
fn mean_projection_u16(input: &[u32], output: &mut [f32], planes: u32, plane_words: u32, pixels: u32, #[comptime] divide: bool) {
    let i = ABSOLUTE_POS;
    if i < plane_words as usize {
        let stride = plane_words as usize;
        let mut lo = 0.0f32;
        let mut hi = 0.0f32;
        for z in 0..planes {
            let w = input[z as usize * stride + i];
            lo += f32::cast_from(w & 0xFFFFu32);
            hi += f32::cast_from(w >> 16u32);
        }
        let mut n = 1.0f32;
        if divide {
            n = f32::cast_from(planes);
        }
        output[2 * i] = lo / n;
        if 2 * i + 1 < pixels as usize {
            output[2 * i + 1] = hi / n;
        }
    }
}

/// Mean (or sum) over planes of u8 pixels packed four per word; f32 output.
#[cube(launch)]
fn mean_projection_u8(input: &[u32], output: &mut [f32], planes: u32, plane_words: u32, pixels: u32, #[comptime] divide: bool) {
    let i = ABSOLUTE_POS;
    if i < plane_words as usize {
        let stride = plane_words as usize;
        let mut s0 = 0.0f32;
        let mut s1 = 0.0f32;
        let mut s2 = 0.0f32;
        let mut s3 = 0.0f32;
        for z in 0..planes {
            let w = input[z as usize * stride + i];
            s0 += f32::cast_from(w & 0xFFu32);
            s1 += f32::cast_from((w >> 8u32) & 0xFFu32);
            s2 += f32::cast_from((w >> 16u32) & 0xFFu32);
            s3 += f32::cast_from(w >> 24u32);
        }
        let mut n = 1.0f32;
        if divide {
            n = f32::cast_from(planes);
        }
        let base = 4 * i;
        let px = pixels as usize;
        output[base] = s0 / n;
        if base + 1 < px {
            output[base + 1] = s1 / n;
        }
        if base + 2 < px {
            output[base + 2] = s2 / n;
        }
        if base + 3 < px {
            output[base + 3] = s3 / n;
        }
    }
}

/// Mean (or sum) over planes of f32 pixels.
#[cube(launch)]
fn mean_projection_f32(input: &[f32], output: &mut [f32], planes: u32, plane_words: u32, #[comptime] divide: bool) {
    let i = ABSOLUTE_POS;
    if i < plane_words as usize {
        let stride = plane_words as usize;
        let mut s = 0.0f32;
        for z in 0..planes {
            s += input[z as usize * stride + i];
        }
        let mut n = 1.0f32;
        if divide {
            n = f32::cast_from(planes);
        }
        output[i] = s / n;
    }
}

/// Population std over planes of u16 pixels packed two per word (f32 output):
/// the host's two passes in the same order: `mean = Σv / n`, `sqrt(Σ(v - mean)² / n)`.
#[cube(launch)]
fn std_projection_u16(input: &[u32], output: &mut [f32], planes: u32, plane_words: u32, pixels: u32) {
    let i = ABSOLUTE_POS;
    if i < plane_words as usize {
        let stride = plane_words as usize;
        let n = f32::cast_from(planes);
        let mut s0 = 0.0f32;
        let mut s1 = 0.0f32;
        for z in 0..planes {
            let w = input[z as usize * stride + i];
            s0 += f32::cast_from(w & 0xFFFFu32);
            s1 += f32::cast_from(w >> 16u32);
        }
        let m0 = s0 / n;
        let m1 = s1 / n;
        let mut d0 = 0.0f32;
        let mut d1 = 0.0f32;
        for z in 0..planes {
            let w = input[z as usize * stride + i];
            let t0 = f32::cast_from(w & 0xFFFFu32) - m0;
            let t1 = f32::cast_from(w >> 16u32) - m1;
            d0 += t0 * t0;
            d1 += t1 * t1;
        }
        output[2 * i] = f32::sqrt(d0 / n);
        if 2 * i + 1 < pixels as usize {
            output[2 * i + 1] = f32::sqrt(d1 / n);
        }
    }
}

/// Population std over planes of u8 pixels packed four per word (f32 output).
#[cube(launch)]
fn std_projection_u8(input: &[u32], output: &mut [f32], planes: u32, plane_words: u32, pixels: u32) {
    let i = ABSOLUTE_POS;
    if i < plane_words as usize {
        let stride = plane_words as usize;
        let n = f32::cast_from(planes);
        let px = pixels as usize;
        for k in 0..4u32 {
            let p = 4 * i + k as usize;
            if p < px {
                let shift = 8u32 * k;
                let mut s = 0.0f32;
                for z in 0..planes {
                    s += f32::cast_from((input[z as usize * stride + i] >> shift) & 0xFFu32);
                }
                let m = s / n;
                let mut d = 0.0f32;
                for z in 0..planes {
                    let t = f32::cast_from((input[z as usize * stride + i] >> shift) & 0xFFu32) - m;
                    d += t * t;
                }
                output[p] = f32::sqrt(d / n);
            }
        }
    }
}

/// Population std over planes of f32 pixels.
#[cube(launch)]
fn std_projection_f32(input: &[f32], output: &mut [f32], planes: u32, plane_words: u32) {
    let i = ABSOLUTE_POS;
    if i < plane_words as usize {
        let stride = plane_words as usize;
        let n = f32::cast_from(planes);
        let mut s = 0.0f32;
        for z in 0..planes {
            s += input[z as usize * stride + i];
        }
        let m = s / n;
        let mut d = 0.0f32;
        for z in 0..planes {
            let t = input[z as usize * stride + i] - m;
            d += t * t;
        }
        output[i] = f32::sqrt(d / n);
    }
}

fn projection_shape(input: &WgpuArray) -> Result<(u32, u32, Vec<usize>), FunctionError> {
    let shape = hcsflow_core::DeviceBuffer::shape(input);
    let planes = u32::try_from(input.planes()).map_err(|_| FunctionError::failed("projection", "too many planes"))?;
    let words = u32::try_from(input.plane_words()).map_err(|_| FunctionError::failed("projection", "plane too large"))?;
    Ok((planes, words, vec![1, shape[shape.len() - 2], shape[shape.len() - 1]]))
}

/// Max (`is_max`) or min projection; keeps the dtype.
pub(super) fn extreme_projection(array: Array, name: &str, is_max: bool) -> Result<Array, FunctionError> {
    let input = wgpu_input(name, &array)?;
    let ctx = input.context().clone();
    let dtype = hcsflow_core::DeviceBuffer::dtype(input);
    let (planes, words, out_shape) = projection_shape(input)?;
    if planes == 0 {
        return Err(FunctionError::failed(name, "the stack has no planes"));
    }
    let client = ctx.client();
    let out = client.empty(words.max(1) as usize * 4);
    let n_in = planes as usize * words as usize;
    let count = grid(words as usize);
    let dim = CubeDim::new_1d(BLOCK);
    // SAFETY: both buffers hold at least the lengths given (planes × words and words).
    unsafe {
        let inp = BufferArg::from_raw_parts(input.handle.clone(), n_in);
        let outp = BufferArg::from_raw_parts(out.clone(), words as usize);
        match dtype {
            DType::U16 => extreme_projection_u16::launch(client, count, dim, inp, outp, planes, words, is_max),
            DType::U8 => extreme_projection_u8::launch(client, count, dim, inp, outp, planes, words, is_max),
            DType::F32 => extreme_projection_f32::launch(client, count, dim, inp, outp, planes, words, is_max),
        }
    }
    Ok(Array::Device(Arc::new(WgpuArray::from_parts(ctx.clone(), out, out_shape, dtype))))
}

/// Which f32 reduction over planes.
#[derive(Clone, Copy, PartialEq, Eq)]
pub(super) enum Reduce {
    Mean,
    Sum,
    Std,
}

/// Mean, sum or population std over planes, as f32.
pub(super) fn float_projection(array: Array, name: &str, reduce: Reduce) -> Result<Array, FunctionError> {
    let input = wgpu_input(name, &array)?;
    let ctx = input.context().clone();
    let dtype = hcsflow_core::DeviceBuffer::dtype(input);
    let (planes, words, out_shape) = projection_shape(input)?;
    if planes == 0 {
        return Err(FunctionError::failed(name, "the stack has no planes"));
    }
    let pixels = input.plane_pixels();
    let pixels_u32 = u32::try_from(pixels).map_err(|_| FunctionError::failed(name, "plane too large"))?;
    let out_words = words_for(DType::F32, pixels);
    let client = ctx.client();
    let out = client.empty(out_words.max(1) * 4);
    let n_in = planes as usize * words as usize;
    let count = grid(words as usize);
    let dim = CubeDim::new_1d(BLOCK);
    let divide = reduce == Reduce::Mean;
    // SAFETY: input holds planes × words words; output holds one f32 per pixel.
    unsafe {
        let inp = BufferArg::from_raw_parts(input.handle.clone(), n_in);
        let outp = BufferArg::from_raw_parts(out.clone(), out_words);
        match (dtype, reduce) {
            (DType::U16, Reduce::Std) => std_projection_u16::launch(client, count, dim, inp, outp, planes, words, pixels_u32),
            (DType::U8, Reduce::Std) => std_projection_u8::launch(client, count, dim, inp, outp, planes, words, pixels_u32),
            (DType::F32, Reduce::Std) => std_projection_f32::launch(client, count, dim, inp, outp, planes, words),
            (DType::U16, _) => mean_projection_u16::launch(client, count, dim, inp, outp, planes, words, pixels_u32, divide),
            (DType::U8, _) => mean_projection_u8::launch(client, count, dim, inp, outp, planes, words, pixels_u32, divide),
            (DType::F32, _) => mean_projection_f32::launch(client, count, dim, inp, outp, planes, words, divide),
        }
    }
    Ok(Array::Device(Arc::new(WgpuArray::from_parts(ctx.clone(), out, out_shape, DType::F32))))
}
