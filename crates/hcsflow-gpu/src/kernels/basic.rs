//! BaSiC correction on the GPU: `(I − camera_offset − D) / F` per pixel.
//!
//! The profiles are read from the files the arguments name and folded on the
//! host by the host implementation's own code (`hcsflow_basic::correct::fold`:
//! `1/F` and `(D + camera_offset)/F`), uploaded once per call (8 bytes a
//! pixel), and the kernel computes the host's two f32 operations
//! `I · (1/F) − (D + offset)/F`, one thread per 32-bit word of the input
//! (4 u8, 2 u16 or 1 f32 pixel). Multiplication and subtraction are correctly
//! rounded in Vulkan/WGSL, so the result is bit-exact with the host unless
//! the shader compiler fuses them into one FMA, which it may: then a value
//! differs by at most one ulp of the larger of `I/F` and the result.

use std::sync::Arc;

use cubecl::prelude::*;
use hcsflow_core::{Array, CallContext, DType, DeviceBuffer, FunctionError};
use hcsflow_ops::basic::{profiles_for, BasicCorrectArgs, BASIC_CORRECT};

use super::{grid, kind_of, lane_f32, lanes_of, wgpu_input, BLOCK};
use crate::array::WgpuArray;

/// `output[plane, p] = lane · inverse[p] − shift[p]` for every lane of word
/// `i` of the input (storage `kind`: 0 u8, 1 u16, 2 f32); f32 output, one
/// value per pixel.
#[cube(launch)]
fn correct_words(
    input: &[u32],
    inverse: &[f32],
    shift: &[f32],
    output: &mut [f32],
    total_words: u32,
    plane_words: u32,
    pixels: u32,
    #[comptime] kind: u32,
) {
    let i = ABSOLUTE_POS;
    if i < total_words as usize {
        let plane = i / plane_words as usize;
        let word = i % plane_words as usize;
        let w = input[i];
        let lanes = lanes_of(kind);
        for j in 0..lanes {
            let p = word * lanes as usize + j as usize;
            if p < pixels as usize {
                output[plane * pixels as usize + p] = lane_f32(w, j, kind) * inverse[p] - shift[p];
            }
        }
    }
}

/// `basic_correct` on a wgpu stack: f32 planes of the same shape, with the
/// profiles of the call (`profiles_for`: a plate-wide fit in `context`, else
/// the files the arguments name), as the host implementation reads them.
pub(super) fn basic_correct(array: Array, args: &BasicCorrectArgs, context: &CallContext) -> Result<Array, FunctionError> {
    const NAME: &str = BASIC_CORRECT.name;
    let input = wgpu_input(NAME, &array)?;
    let shape = DeviceBuffer::shape(input).to_vec();
    let (h, w) = (shape[shape.len() - 2], shape[shape.len() - 1]);
    let invalid = |e: hcsflow_basic::BasicError| FunctionError::invalid(NAME, e.to_string());
    let profiles = profiles_for(args, context, (h, w))?;
    let folded = hcsflow_basic::correct::fold(&profiles, args.camera_offset as f32, (h, w)).map_err(invalid)?;
    let (planes, pixels, plane_words) = (input.planes(), input.plane_pixels(), input.plane_words());
    let (total, total_words) = (planes * pixels, planes * plane_words);
    if u32::try_from(total.max(total_words)).is_err() {
        return Err(FunctionError::too_large(NAME, "stack too large for one GPU launch"));
    }
    let ctx = input.context();
    let bytes = (total * 4).max(4);
    ctx.check_size(NAME, bytes as u64).map_err(|e| e.into_function_error(NAME))?;
    let client = ctx.client();
    // Every value is written by the kernel: no need to zero the output.
    let out = client.empty(bytes);
    if total > 0 {
        let inverse = ctx.upload_bytes(bytemuck::cast_slice(&folded.inverse));
        let shift = ctx.upload_bytes(bytemuck::cast_slice(&folded.shift));
        // SAFETY: input holds total_words words; inverse and shift hold `pixels`
        // values (fold checked the profiles are h × w) and p < pixels; output
        // holds planes × pixels values and plane < planes.
        unsafe {
            correct_words::launch(
                client,
                grid(total_words),
                CubeDim::new_1d(BLOCK),
                BufferArg::from_raw_parts(input.handle.clone(), total_words),
                BufferArg::from_raw_parts(inverse, pixels),
                BufferArg::from_raw_parts(shift, pixels),
                BufferArg::from_raw_parts(out.clone(), total),
                total_words as u32,
                plane_words as u32,
                pixels as u32,
                kind_of(DeviceBuffer::dtype(input)),
            );
        }
    }
    Ok(Array::Device(Arc::new(WgpuArray::from_parts(ctx.clone(), out, shape, DType::F32))))
}
