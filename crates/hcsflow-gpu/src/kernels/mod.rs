//! GPU kernels and their registration as wgpu implementations.
//!
//! Each kernel mirrors the host implementation of the same function in
//! `hcsflow-ops` operation for operation (same accumulation order and
//! precision), so results are bit-exact where IEEE arithmetic allows; the
//! tests compare them on lavapipe. One file per family of functions.

mod assemble;
mod equalize;
mod filters;
mod focus;
mod normalize;
mod projection;

use std::sync::Arc;

use cubecl::prelude::*;
use hcsflow_core::{Array, Conversions, FunctionError, Implementation, MemoryType, Registry};

use crate::array::{as_wgpu, Download, Upload, WgpuArray};
use projection::Reduce;

pub use assemble::{assemble, assemble_chunked, DEFAULT_CHUNK_PIXELS};
pub use focus::focus_stack_wgpu;

/// Threads per workgroup for element-wise kernels.
pub(crate) const BLOCK: u32 = 256;

/// A GPU kernel as registered: whole array in, array out, with the call's arguments.
type Kernel = fn(Array, &hcsflow_core::Args) -> Result<Array, FunctionError>;

/// Every wgpu implementation: (function name, kernel). Add new families here.
fn kernels() -> Vec<(&'static str, Kernel)> {
    vec![
        ("max_projection", |a, _| projection::extreme_projection(a, "max_projection", true)),
        ("min_projection", |a, _| projection::extreme_projection(a, "min_projection", false)),
        ("mean_projection", |a, _| projection::float_projection(a, "mean_projection", Reduce::Mean)),
        ("sum_projection", |a, _| projection::float_projection(a, "sum_projection", Reduce::Sum)),
        ("std_projection", |a, _| projection::float_projection(a, "std_projection", Reduce::Std)),
        ("percentile_normalize", |a, args| normalize::percentile_normalize(a, args, "percentile_normalize", true)),
        ("focus_stack", focus::focus_stack),
        ("stack_percentile_normalize", |a, args| normalize::percentile_normalize(a, args, "stack_percentile_normalize", false)),
        ("stack_equalize_histogram", equalize::stack_equalize_histogram),
        ("gaussian_blur", filters::gaussian_blur),
        ("sharpen", filters::sharpen),
        ("composite", filters::composite),
        ("apply_mask", filters::apply_mask),
    ]
}

/// A launch grid covering `n` threads in blocks of [`BLOCK`], split over two
/// dimensions when one would exceed the 65,535-workgroup limit.
pub(crate) fn grid(n: usize) -> CubeCount {
    let blocks = n.div_ceil(BLOCK as usize).max(1) as u32;
    if blocks <= 65_535 {
        CubeCount::Static(blocks, 1, 1)
    } else {
        CubeCount::Static(65_535, blocks.div_ceil(65_535), 1)
    }
}

/// The storage kind the kernels take as a comptime parameter: 0 = u8 (4 per
/// 32-bit word), 1 = u16 (2 per word), 2 = f32 (the word is the f32's bits).
pub(crate) fn kind_of(dtype: hcsflow_core::DType) -> u32 {
    match dtype {
        hcsflow_core::DType::U8 => 0,
        hcsflow_core::DType::U16 => 1,
        hcsflow_core::DType::F32 => 2,
    }
}

/// Lanes per 32-bit word of a storage `kind` (see `kind_of`): 4, 2 or 1.
#[cube]
pub(crate) fn lanes_of(#[comptime] kind: u32) -> u32 {
    let mut lanes = 1u32;
    if kind == 0 {
        lanes = 4u32;
    } else if kind == 1 {
        lanes = 2u32;
    }
    lanes
}

/// Lane `j` of `word` as raw bits: the u8/u16 value, or the f32's bits.
#[cube]
pub(crate) fn lane(word: u32, j: u32, #[comptime] kind: u32) -> u32 {
    let mut v = word;
    if kind == 0 {
        v = (word >> (8u32 * j)) & 0xFFu32;
    } else if kind == 1 {
        v = (word >> (16u32 * j)) & 0xFFFFu32;
    }
    v
}

/// Lane `j` of `word` as f32 (integers converted, f32 reinterpreted).
#[allow(unused_assignments)]
#[cube]
pub(crate) fn lane_f32(word: u32, j: u32, #[comptime] kind: u32) -> f32 {
    let mut v = 0.0f32;
    if kind == 2 {
        v = f32::reinterpret(word);
    } else {
        v = f32::cast_from(lane(word, j, kind));
    }
    v
}

pub(crate) fn wgpu_input<'a>(function: &str, array: &'a Array) -> Result<&'a WgpuArray, FunctionError> {
    as_wgpu(array).ok_or_else(|| FunctionError::WrongMemory {
        function: function.to_string(),
        expected: MemoryType::Wgpu,
        got: array.memory_type(),
    })
}

/// Adds the host ↔ wgpu converters and the wgpu implementations of the
/// functions the host registry already declares (`hcsflow_ops::register` and
/// `hcsflow_stitch::register` must run first; a function it does not know is
/// skipped with a warning).
pub fn register(registry: &mut Registry, conversions: &mut Conversions) {
    conversions.register(MemoryType::Host, MemoryType::Wgpu, Arc::new(Upload));
    conversions.register(MemoryType::Wgpu, MemoryType::Host, Arc::new(Download));
    let mut implementations: Vec<(&str, Implementation)> = kernels()
        .into_iter()
        .map(|(name, kernel)| (name, Implementation::array(MemoryType::Wgpu, MemoryType::Wgpu, Arc::new(kernel))))
        .collect();
    // Reads the `positions` artifact from the call context.
    implementations
        .push(("assemble", Implementation::array_in_context(MemoryType::Wgpu, MemoryType::Wgpu, Arc::new(assemble::assemble_call))));
    for (name, implementation) in implementations {
        if !registry.add_implementation(name, implementation) {
            tracing::warn!(function = name, "no host declaration for this GPU kernel; not registered");
        }
    }
}
