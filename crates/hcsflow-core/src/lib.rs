//! Core types of hcsflow.
//!
//! - [`Stack`]: a 3D `[Z, Y, X]` host array of u8, u16 or f32 — what every
//!   function sees.
//! - [`MemoryType`], [`Device`], [`Array`]: where data lives, and data in any of those places.
//! - [`convert`]: conversion routes between memory types, planned ahead of time.
//! - [`stack_slices`] / [`unstack_slices`]: 2D slices ↔ 3D stacks with validation.
//! - [`registry`]: logical functions with implementations per memory type,
//!   contracts and typed arguments.
//! - [`call`]: one function on a host stack outside a pipeline — plan, run,
//!   result back on the host ([`Registry::call`]).
//! - [`artifact`]: what a function sees besides its stack (plane metadata,
//!   tables from earlier steps) and the tables it produces.
//! - [`adapter`]: GPU adapter descriptions, the device-selection policy and
//!   the spreading of wells over several adapters.
//! - [`queue`]: which queue of an adapter the current thread's GPU work goes to.
//!
//! This crate has no I/O and no GPU dependency; everything above it points down to it.

pub mod adapter;
pub mod artifact;
pub mod call;
pub mod convert;
pub mod dtype;
pub mod memory;
pub mod queue;
pub mod registry;
pub mod slices;
pub mod stack;
pub mod transfer;

pub use adapter::{assign_adapters, select_device, AdapterInfo, AdapterKind, AdapterLoad, AssignError, DeviceChoice, DeviceError, Spread};
pub use artifact::{ArtifactDecl, ArtifactKind, Artifacts, CallContext, Cell, PlaneInfo, Row, StackInfo, Table};
pub use call::CallError;
pub use convert::{plan_route, ConversionError, ConversionPolicy, Conversions, Route, RouteKind};
pub use dtype::{DType, DTypeConversion, DTypePolicy, OutputDType};
pub use memory::{Array, BadDevice, Device, DeviceBuffer, DeviceRequest, GpuSet, MemorySpace, MemoryType, Runtime};
pub use queue::{QueueId, QueueScope};
pub use registry::{
    blamed, one_plane, same_shape, ArgCheck, ArgDecl, ArgError, ArgProblem, ArgSpec, ArgType, ArgValue, Args, Binding, CallPlan, Contract,
    FunctionArgs, FunctionDecl, FunctionError, FunctionSpec, HostWork, Implementation, NoArgs, PlanError, PlaneReduction, Registry,
    ScratchRule, ShapeRule, StackShape, ZSplit,
};
pub use slices::{stack_slices, unstack_slices, SliceError};
pub use stack::{HostArray, Pixel, SharedPixels, Stack, StackArray};
pub use transfer::{AdapterUsed, KernelTiming, TransferMeter, Transfers};
