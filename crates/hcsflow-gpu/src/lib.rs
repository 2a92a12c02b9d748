//! The GPU runtime of hcsflow: CubeCL kernels on wgpu (Vulkan, Metal, DX12).
//!
//! - [`discover_adapters`]: every adapter wgpu can see, as [`AdapterInfo`]
//!   (`gpu:N` numbering used by `--device`).
//! - [`GpuContext::get`]: one shared CubeCL client per queue of an adapter
//!   per process (up to `QUEUES_PER_ADAPTER` queues, each its own wgpu device;
//!   the current thread's `QueueScope` chooses one); kernels JIT-compile on
//!   a queue's first launch of them, sharing keeps that cost once per queue.
//! - [`WgpuArray`]: a stack in GPU memory, the [`MemoryType::Wgpu`] array;
//!   [`register`] adds host ↔ wgpu converters and the GPU implementations
//!   of registered functions.
//! - [`assemble`]: a tile stack on the GPU stitched into one mosaic plane,
//!   the same mosaic as `hcsflow_stitch::assemble`.
//!
//! Pixel storage on the device: wgpu shaders have no 8/16-bit integer
//! storage everywhere, so u8 and u16 planes are stored packed into 32-bit
//! words (4 or 2 pixels per word, little-endian), each plane padded to a
//! whole number of words; f32 planes are stored as is.

mod array;
mod context;
mod kernels;

pub use array::{download, upload, upload_stack, WgpuArray};
pub use context::{discover_adapters, max_binding_bytes, GpuContext, GpuError};
pub use hcsflow_stitch::Blend;
pub use kernels::{assemble, assemble_chunked, focus_stack_wgpu, implementations, register, DEFAULT_CHUNK_PIXELS};

pub use hcsflow_core::{AdapterInfo, MemoryType};
