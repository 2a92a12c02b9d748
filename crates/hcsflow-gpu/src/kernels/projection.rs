//! Projections over the stack axis (max, min, mean, sum, std).
//!
//! One kernel per reduction for all dtypes: a thread reduces the lanes of
//! one 32-bit word (4 u8, 2 u16 or 1 f32 pixel, the storage `kind` a comptime
//! parameter), pixel by pixel in the host's operation order.

use std::sync::Arc;

use cubecl::prelude::*;
use hcsflow_core::{Array, DType, FunctionError};

use super::{grid, kind_of, lane, lane_f32, lanes_of, wgpu_input, BLOCK};
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

/// `v` replaces `m` (raw lane bits): compared as u32, or as f32 for `kind` 2
/// (NaN never replaces a number, like the host code).
#[allow(unused_assignments)]
#[cube]
fn better(v: u32, m: u32, #[comptime] kind: u32, #[comptime] is_max: bool) -> bool {
    let mut b = false;
    if kind == 2 {
        b = better_f32(f32::reinterpret(v), f32::reinterpret(m), is_max);
    } else {
        b = better_u32(v, m, is_max);
    }
    b
}

/// Max (or min) over planes, one thread per word of every lane; plane 0
/// seeds; output in the input's storage.
#[cube(launch)]
fn extreme_projection_words(
    input: &[u32],
    output: &mut [u32],
    planes: u32,
    plane_words: u32,
    #[comptime] kind: u32,
    #[comptime] is_max: bool,
) {
    let i = ABSOLUTE_POS;
    if i < plane_words as usize {
        let stride = plane_words as usize;
        let lanes = lanes_of(kind);
        let bits = 32u32 / lanes;
        let mut out = 0u32;
        for j in 0..lanes {
            let mut m = lane(input[i], j, kind);
            for z in 1..planes {
                let v = lane(input[z as usize * stride + i], j, kind);
                if better(v, m, kind, is_max) {
                    m = v;
                }
            }
            out |= m << (j * bits);
        }
        output[i] = out;
    }
}

/// Mean (or, without `divide`, sum) over planes, f32 output, one value per
/// pixel. Sums in f32 in plane order, then divides (dividing by 1 leaves the
/// sum unchanged): exact sums of u8/u16 for up to 256 planes.
#[cube(launch)]
fn mean_projection_words(
    input: &[u32],
    output: &mut [f32],
    planes: u32,
    plane_words: u32,
    pixels: u32,
    #[comptime] kind: u32,
    #[comptime] divide: bool,
) {
    let i = ABSOLUTE_POS;
    if i < plane_words as usize {
        let stride = plane_words as usize;
        let lanes = lanes_of(kind);
        let mut n = 1.0f32;
        if divide {
            n = f32::cast_from(planes);
        }
        for j in 0..lanes {
            let p = i * lanes as usize + j as usize;
            if p < pixels as usize {
                let mut s = 0.0f32;
                for z in 0..planes {
                    s += lane_f32(input[z as usize * stride + i], j, kind);
                }
                output[p] = s / n;
            }
        }
    }
}

/// Population std over planes (f32 output): the host's two passes in the
/// same order: `mean = Σv / n`, `sqrt(Σ(v - mean)² / n)`.
#[cube(launch)]
fn std_projection_words(input: &[u32], output: &mut [f32], planes: u32, plane_words: u32, pixels: u32, #[comptime] kind: u32) {
    let i = ABSOLUTE_POS;
    if i < plane_words as usize {
        let stride = plane_words as usize;
        let lanes = lanes_of(kind);
        let n = f32::cast_from(planes);
        for j in 0..lanes {
            let p = i * lanes as usize + j as usize;
            if p < pixels as usize {
                let mut s = 0.0f32;
                for z in 0..planes {
                    s += lane_f32(input[z as usize * stride + i], j, kind);
                }
                let m = s / n;
                let mut d = 0.0f32;
                for z in 0..planes {
                    let t = lane_f32(input[z as usize * stride + i], j, kind) - m;
                    d += t * t;
                }
                output[p] = f32::sqrt(d / n);
            }
        }
    }
}

fn projection_shape(input: &WgpuArray) -> Result<(u32, u32, Vec<usize>), FunctionError> {
    let shape = hcsflow_core::DeviceBuffer::shape(input);
    let planes = u32::try_from(input.planes()).map_err(|_| FunctionError::too_large("projection", "too many planes"))?;
    let words = u32::try_from(input.plane_words()).map_err(|_| FunctionError::too_large("projection", "plane too large"))?;
    Ok((planes, words, vec![1, shape[shape.len() - 2], shape[shape.len() - 1]]))
}

/// Max (`is_max`) or min projection; keeps the dtype.
pub(super) fn extreme_projection(array: Array, name: &str, is_max: bool) -> Result<Array, FunctionError> {
    let input = wgpu_input(name, &array)?;
    let ctx = input.context().clone();
    let dtype = hcsflow_core::DeviceBuffer::dtype(input);
    let (planes, words, out_shape) = projection_shape(input)?;
    if planes == 0 {
        return Err(FunctionError::invalid(name, "the stack has no planes"));
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
        extreme_projection_words::launch(client, count, dim, inp, outp, planes, words, kind_of(dtype), is_max);
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
        return Err(FunctionError::invalid(name, "the stack has no planes"));
    }
    let pixels = input.plane_pixels();
    let pixels_u32 = u32::try_from(pixels).map_err(|_| FunctionError::too_large(name, "plane too large"))?;
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
        if reduce == Reduce::Std {
            std_projection_words::launch(client, count, dim, inp, outp, planes, words, pixels_u32, kind_of(dtype));
        } else {
            mean_projection_words::launch(client, count, dim, inp, outp, planes, words, pixels_u32, kind_of(dtype), divide);
        }
    }
    Ok(Array::Device(Arc::new(WgpuArray::from_parts(ctx.clone(), out, out_shape, DType::F32))))
}
