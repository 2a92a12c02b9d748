//! Projections over the stack axis (max, mean).

use std::sync::Arc;

use cubecl::prelude::*;
use hcsflow_core::{Array, DType, FunctionError};

use super::{grid, wgpu_input, BLOCK};
use crate::array::{words_for, WgpuArray};

/// Max over planes of u16 pixels packed two per word.
#[cube(launch)]
fn max_projection_u16(input: &[u32], output: &mut [u32], planes: u32, plane_words: u32) {
    let i = ABSOLUTE_POS;
    if i < plane_words as usize {
        let stride = plane_words as usize;
        let mut lo = 0u32;
        let mut hi = 0u32;
        for z in 0..planes {
            let w = input[z as usize * stride + i];
            let a = w & 0xFFFFu32;
            let b = w >> 16u32;
            if a > lo {
                lo = a;
            }
            if b > hi {
                hi = b;
            }
        }
        output[i] = lo | (hi << 16u32);
    }
}

/// Max over planes of u8 pixels packed four per word.
#[cube(launch)]
fn max_projection_u8(input: &[u32], output: &mut [u32], planes: u32, plane_words: u32) {
    let i = ABSOLUTE_POS;
    if i < plane_words as usize {
        let stride = plane_words as usize;
        let mut m0 = 0u32;
        let mut m1 = 0u32;
        let mut m2 = 0u32;
        let mut m3 = 0u32;
        for z in 0..planes {
            let w = input[z as usize * stride + i];
            let a = w & 0xFFu32;
            let b = (w >> 8u32) & 0xFFu32;
            let c = (w >> 16u32) & 0xFFu32;
            let d = w >> 24u32;
            if a > m0 {
                m0 = a;
            }
            if b > m1 {
                m1 = b;
            }
            if c > m2 {
                m2 = c;
            }
            if d > m3 {
                m3 = d;
            }
        }
        output[i] = m0 | (m1 << 8u32) | (m2 << 16u32) | (m3 << 24u32);
    }
}

/// Max over planes of f32 pixels (plane 0 seeds the maximum, like the host code).
#[cube(launch)]
fn max_projection_f32(input: &[f32], output: &mut [f32], planes: u32, plane_words: u32) {
    let i = ABSOLUTE_POS;
    if i < plane_words as usize {
        let stride = plane_words as usize;
        let mut m = input[i];
        for z in 1..planes {
            let v = input[z as usize * stride + i];
            if v > m {
                m = v;
            }
        }
        output[i] = m;
    }
}

/// Mean over planes of u16 pixels packed two per word; f32 output, one value per pixel.
/// Sums in f32 in plane order, then divides: exact sums for up to 256 planes.
#[cube(launch)]
fn mean_projection_u16(input: &[u32], output: &mut [f32], planes: u32, plane_words: u32, pixels: u32) {
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
        let n = f32::cast_from(planes);
        output[2 * i] = lo / n;
        if 2 * i + 1 < pixels as usize {
            output[2 * i + 1] = hi / n;
        }
    }
}

/// Mean over planes of u8 pixels packed four per word; f32 output.
#[cube(launch)]
fn mean_projection_u8(input: &[u32], output: &mut [f32], planes: u32, plane_words: u32, pixels: u32) {
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
        let n = f32::cast_from(planes);
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

/// Mean over planes of f32 pixels.
#[cube(launch)]
fn mean_projection_f32(input: &[f32], output: &mut [f32], planes: u32, plane_words: u32) {
    let i = ABSOLUTE_POS;
    if i < plane_words as usize {
        let stride = plane_words as usize;
        let mut s = 0.0f32;
        for z in 0..planes {
            s += input[z as usize * stride + i];
        }
        output[i] = s / f32::cast_from(planes);
    }
}

fn projection_shape(input: &WgpuArray) -> Result<(u32, u32, Vec<usize>), FunctionError> {
    let shape = hcsflow_core::DeviceBuffer::shape(input);
    let planes = u32::try_from(input.planes()).map_err(|_| FunctionError::failed("projection", "too many planes"))?;
    let words = u32::try_from(input.plane_words()).map_err(|_| FunctionError::failed("projection", "plane too large"))?;
    Ok((planes, words, vec![1, shape[shape.len() - 2], shape[shape.len() - 1]]))
}

pub(super) fn max_projection(array: Array) -> Result<Array, FunctionError> {
    let input = wgpu_input("max_projection", &array)?;
    let ctx = input.context().clone();
    let dtype = hcsflow_core::DeviceBuffer::dtype(input);
    let (planes, words, out_shape) = projection_shape(input)?;
    if planes == 0 {
        return Err(FunctionError::failed("max_projection", "the stack has no planes"));
    }
    let client = ctx.client();
    let out = client.empty(words as usize * 4);
    let n_in = planes as usize * words as usize;
    let count = grid(words as usize);
    let dim = CubeDim::new_1d(BLOCK);
    // SAFETY: both buffers hold at least the lengths given (planes × words and words).
    unsafe {
        let inp = BufferArg::from_raw_parts(input.handle.clone(), n_in);
        let outp = BufferArg::from_raw_parts(out.clone(), words as usize);
        match dtype {
            DType::U16 => max_projection_u16::launch(client, count, dim, inp, outp, planes, words),
            DType::U8 => max_projection_u8::launch(client, count, dim, inp, outp, planes, words),
            DType::F32 => max_projection_f32::launch(client, count, dim, inp, outp, planes, words),
        }
    }
    Ok(Array::Device(Arc::new(WgpuArray::from_parts(ctx.clone(), out, out_shape, dtype))))
}

pub(super) fn mean_projection(array: Array) -> Result<Array, FunctionError> {
    let input = wgpu_input("mean_projection", &array)?;
    let ctx = input.context().clone();
    let dtype = hcsflow_core::DeviceBuffer::dtype(input);
    let (planes, words, out_shape) = projection_shape(input)?;
    if planes == 0 {
        return Err(FunctionError::failed("mean_projection", "the stack has no planes"));
    }
    let pixels = input.plane_pixels();
    let pixels_u32 = u32::try_from(pixels).map_err(|_| FunctionError::failed("mean_projection", "plane too large"))?;
    let out_words = words_for(DType::F32, pixels);
    let client = ctx.client();
    let out = client.empty(out_words.max(1) * 4);
    let n_in = planes as usize * words as usize;
    let count = grid(words as usize);
    let dim = CubeDim::new_1d(BLOCK);
    // SAFETY: input holds planes × words words; output holds one f32 per pixel.
    unsafe {
        let inp = BufferArg::from_raw_parts(input.handle.clone(), n_in);
        let outp = BufferArg::from_raw_parts(out.clone(), out_words);
        match dtype {
            DType::U16 => mean_projection_u16::launch(client, count, dim, inp, outp, planes, words, pixels_u32),
            DType::U8 => mean_projection_u8::launch(client, count, dim, inp, outp, planes, words, pixels_u32),
            DType::F32 => mean_projection_f32::launch(client, count, dim, inp, outp, planes, words),
        }
    }
    Ok(Array::Device(Arc::new(WgpuArray::from_parts(ctx.clone(), out, out_shape, DType::F32))))
}
