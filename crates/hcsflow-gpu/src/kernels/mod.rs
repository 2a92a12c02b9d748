//! GPU kernels and their registration as wgpu implementations.
//!
//! Each kernel mirrors the host implementation of the same function in
//! `hcsflow-ops` operation for operation (same accumulation order and
//! precision), so results are bit-exact where IEEE arithmetic allows; the
//! tests compare them on lavapipe. One file per family of functions.

mod assemble;
mod basic;
mod clahe;
mod equalize;
mod filters;
mod focus;
mod median;
mod n2v;
mod normalize;
mod projection;
mod tophat;

use std::sync::Arc;

use cubecl::prelude::*;
use hcsflow_core::{Array, Binding, CallContext, Conversions, FunctionArgs, FunctionDecl, FunctionError, MemoryType, Registry};

use crate::array::{as_wgpu, Download, Upload, WgpuArray};
use projection::Reduce;

pub use assemble::{assemble, assemble_chunked, DEFAULT_CHUNK_PIXELS};
pub use focus::focus_stack_wgpu;

/// Threads per workgroup for element-wise kernels.
pub(crate) const BLOCK: u32 = 256;

/// Every wgpu implementation, each bound to the declaration of the function it
/// implements (in `hcsflow-ops` or `hcsflow-stitch`): the compiler checks the
/// function exists and that the kernel reads that function's arguments. Add
/// new kernels here; the conformance test runs each against the host. A
/// kernel that allocates device memory besides its input and output in
/// proportion to the stack declares it (`with_scratch`), for the memory
/// budget (`--gpu-memory`).
pub fn implementations() -> Vec<Binding> {
    use hcsflow_ops::{composite as ops_composite, equalize as ops_equalize, filters as ops_filters, focus as ops_focus};
    use hcsflow_ops::{normalize as ops_normalize, projection as ops_projection};
    vec![
        on_wgpu(&ops_projection::MAX_PROJECTION, |a, _, _| projection::extreme_projection(a, ops_projection::MAX_PROJECTION.name, true)),
        on_wgpu(&ops_projection::MIN_PROJECTION, |a, _, _| projection::extreme_projection(a, ops_projection::MIN_PROJECTION.name, false)),
        on_wgpu(&ops_projection::MEAN_PROJECTION, |a, _, _| {
            projection::float_projection(a, ops_projection::MEAN_PROJECTION.name, Reduce::Mean)
        }),
        on_wgpu(&ops_projection::SUM_PROJECTION, |a, _, _| {
            projection::float_projection(a, ops_projection::SUM_PROJECTION.name, Reduce::Sum)
        }),
        on_wgpu(&ops_projection::STD_PROJECTION, |a, _, _| {
            projection::float_projection(a, ops_projection::STD_PROJECTION.name, Reduce::Std)
        }),
        on_wgpu(&ops_normalize::PERCENTILE_NORMALIZE, |a, p, _| {
            normalize::percentile_normalize(a, p, ops_normalize::PERCENTILE_NORMALIZE.name, true)
        })
        .with_scratch(normalize::per_plane_scratch),
        on_wgpu(&ops_normalize::STACK_PERCENTILE_NORMALIZE, |a, p, _| {
            normalize::percentile_normalize(a, p, ops_normalize::STACK_PERCENTILE_NORMALIZE.name, false)
        })
        .with_scratch(normalize::stack_scratch),
        on_wgpu(&ops_focus::FOCUS_STACK, |a, args, _| focus::focus_stack(a, args)),
        on_wgpu(&ops_equalize::STACK_EQUALIZE_HISTOGRAM, |a, args, _| equalize::stack_equalize_histogram(a, args)),
        on_wgpu(&ops_filters::GAUSSIAN_BLUR, |a, args, _| filters::gaussian_blur(a, args)).with_scratch(filters::separable_scratch),
        on_wgpu(&ops_filters::SHARPEN, |a, args, _| filters::sharpen(a, args)).with_scratch(filters::separable_scratch),
        // Every side the host takes (1..=99); two reflect tables of h + k − 1 and w + k − 1 entries, no scratch.
        on_wgpu(&ops_filters::MEDIAN_FILTER, |a, args, _| median::median_filter(a, args)),
        on_wgpu(&hcsflow_ops::tophat::WHITE_TOPHAT, |a, args, _| tophat::white_tophat(a, args)).with_scratch(tophat::scratch),
        on_wgpu(&hcsflow_ops::clahe::CLAHE, |a, args, _| clahe::clahe(a, args)).with_scratch(clahe::scratch),
        on_wgpu(&ops_composite::COMPOSITE, |a, args, _| filters::composite(a, args)),
        on_wgpu(&ops_composite::APPLY_MASK, |a, args, _| filters::apply_mask(a, args)),
        // Reads its profiles from the plate-wide fit in the call context, or the files its arguments name.
        on_wgpu(&hcsflow_ops::basic::BASIC_CORRECT, |a, args, context| basic::basic_correct(a, args, context)),
        // Reads the `positions` artifact from the call context.
        on_wgpu(&hcsflow_stitch::ASSEMBLE, assemble::assemble_call).with_host_work(hcsflow_stitch::POSITIONS, "registers the tiles"),
        // N2V2 trained and predicting on burn's wgpu backend, on the input's queue (the stack
        // reaches burn's tensors through the host: one counted download and upload per call).
        on_wgpu(&hcsflow_n2v::N2V_DENOISE, n2v::n2v_denoise),
    ]
}

/// `kernel` as the wgpu implementation of `decl`, each call's device time
/// counted in the run's transfers and traced ([`GpuContext::timed`](crate::GpuContext), on
/// the queue of its input).
fn on_wgpu<A: FunctionArgs>(
    decl: &FunctionDecl<A>,
    kernel: impl Fn(Array, &A, &mut CallContext) -> Result<Array, FunctionError> + Send + Sync + 'static,
) -> Binding {
    let name = decl.name;
    decl.device(MemoryType::Wgpu, move |array, args, context| match as_wgpu(&array).map(|a| a.context().clone()) {
        Some(gpu) => gpu.timed(name, || kernel(array, args, context)),
        None => kernel(array, args, context),
    })
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

/// Adds the host ↔ wgpu converters and every wgpu implementation
/// ([`implementations`]). A function that `hcsflow_ops::register` or
/// `hcsflow_stitch::register` has not declared yet is declared by its binding.
pub fn register(registry: &mut Registry, conversions: &mut Conversions) {
    conversions.register(MemoryType::Host, MemoryType::Wgpu, Arc::new(Upload));
    conversions.register(MemoryType::Wgpu, MemoryType::Host, Arc::new(Download));
    for binding in implementations() {
        registry.add(binding);
    }
}
