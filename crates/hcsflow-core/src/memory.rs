//! Memory types, devices, and the arrays that live in them.
//!
//! A [`MemoryType`] names an array library and where its memory lives. Every
//! function implementation declares the memory type it takes and returns; the
//! conversion planner ([`crate::convert`]) decides ahead of time how data moves
//! between them.

use std::any::Any;
use std::fmt;
use std::str::FromStr;
use std::sync::Arc;

use serde::{Deserialize, Serialize};

use crate::dtype::DType;
use crate::stack::{HostArray, Stack};

/// Where the bytes of an array physically are.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum MemorySpace {
    /// CPU RAM.
    Host,
    /// CUDA device memory (reachable by DLPack between CUDA libraries).
    Cuda,
    /// wgpu buffers (Vulkan/Metal/DX12): not shareable with CUDA libraries.
    Wgpu,
    /// OpenCL buffers (pyclesperanto).
    OpenCl,
}

/// How an array of this memory type can be shared without a copy.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum Exchange {
    /// DLPack capsules / the buffer protocol: zero-copy with others in the same space.
    Dlpack,
    /// No zero-copy protocol: every move is a copy.
    None,
}

/// An array library and where its memory lives.
///
/// The set is fixed by design (semantics.md §4), so that adding the runtime of
/// one of them (CUDA, the Python bindings) changes no caller: routes between
/// every pair are already defined; only whether a converter is *available* in
/// this build changes. Match with a wildcard arm: the enum is `non_exhaustive`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
#[non_exhaustive]
pub enum MemoryType {
    /// Rust host arrays ([`Stack`]).
    Host,
    /// GPU buffers on a wgpu device (CubeCL).
    Wgpu,
    /// Raw CUDA device buffers (future `cudarc` runtime).
    Cuda,
    /// numpy arrays (Python bindings).
    Numpy,
    /// torch tensors (Python bindings): CPU tensors on the host runtime.
    Torch,
    /// cupy arrays (Python bindings).
    Cupy,
    /// jax arrays (Python bindings): CPU arrays on the host runtime.
    Jax,
    /// tensorflow tensors (Python bindings): CPU tensors on the host runtime.
    Tensorflow,
    /// pyclesperanto (OpenCL) arrays (Python bindings), on the OpenCL device
    /// pyclesperanto selects (pocl on a machine without a GPU).
    Pyclesperanto,
}

impl MemoryType {
    /// Every memory type, in a stable order.
    pub const ALL: [MemoryType; 9] = [
        MemoryType::Host,
        MemoryType::Wgpu,
        MemoryType::Cuda,
        MemoryType::Numpy,
        MemoryType::Torch,
        MemoryType::Cupy,
        MemoryType::Jax,
        MemoryType::Tensorflow,
        MemoryType::Pyclesperanto,
    ];

    pub fn name(self) -> &'static str {
        match self {
            MemoryType::Host => "host",
            MemoryType::Wgpu => "wgpu",
            MemoryType::Cuda => "cuda",
            MemoryType::Numpy => "numpy",
            MemoryType::Torch => "torch",
            MemoryType::Cupy => "cupy",
            MemoryType::Jax => "jax",
            MemoryType::Tensorflow => "tensorflow",
            MemoryType::Pyclesperanto => "pyclesperanto",
        }
    }

    /// Where arrays of this type live when a step runs in `runtime`, or
    /// `None` if this type has no arrays there.
    ///
    /// Most libraries hold one kind of memory whatever the runtime (numpy the
    /// host's, cupy CUDA's, wgpu its buffers, pyclesperanto its own OpenCL
    /// device's). torch, jax and tensorflow follow the step's device: CPU
    /// tensors on the host runtime; they have no wgpu tensors (a CUDA runtime
    /// would place them in CUDA memory).
    pub fn space_in(self, runtime: Runtime) -> Option<MemorySpace> {
        match self {
            MemoryType::Host | MemoryType::Numpy => Some(MemorySpace::Host),
            MemoryType::Wgpu => Some(MemorySpace::Wgpu),
            MemoryType::Cuda | MemoryType::Cupy => Some(MemorySpace::Cuda),
            MemoryType::Pyclesperanto => Some(MemorySpace::OpenCl),
            MemoryType::Torch | MemoryType::Jax | MemoryType::Tensorflow => match runtime {
                Runtime::Host => Some(MemorySpace::Host),
                Runtime::Wgpu => None,
            },
        }
    }

    /// How arrays of this type can be shared without copying.
    pub fn exchange(self) -> Exchange {
        match self {
            MemoryType::Wgpu | MemoryType::Pyclesperanto => Exchange::None,
            _ => Exchange::Dlpack,
        }
    }

    /// True if this type's arrays are in host memory when a step runs in `runtime`.
    pub fn on_host_in(self, runtime: Runtime) -> bool {
        self.space_in(runtime) == Some(MemorySpace::Host)
    }
}

impl fmt::Display for MemoryType {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.name())
    }
}

impl FromStr for MemoryType {
    type Err = String;
    fn from_str(s: &str) -> Result<Self, Self::Err> {
        MemoryType::ALL.into_iter().find(|m| m.name() == s).ok_or_else(|| {
            let names: Vec<_> = MemoryType::ALL.iter().map(|m| m.name()).collect();
            format!("unknown memory type '{s}': expected one of {}", names.join(", "))
        })
    }
}

/// The runtime that runs kernels on a device and owns its arrays: which
/// implementations of a function can run there ([`Runtime::runs`]).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
#[non_exhaustive]
pub enum Runtime {
    /// Host code on the CPU.
    Host,
    /// CubeCL kernels on a wgpu adapter.
    Wgpu,
}

impl Runtime {
    pub fn name(self) -> &'static str {
        match self {
            Runtime::Host => "host",
            Runtime::Wgpu => "wgpu",
        }
    }

    /// Where the arrays of this runtime live.
    pub fn memory_space(self) -> MemorySpace {
        match self {
            Runtime::Host => MemorySpace::Host,
            Runtime::Wgpu => MemorySpace::Wgpu,
        }
    }

    /// True if an implementation taking `memory` runs on this runtime: its
    /// arrays live in the runtime's memory there, or on the OpenCL device
    /// pyclesperanto chooses itself (reached by a device copy the plan shows).
    pub fn runs(self, memory: MemoryType) -> bool {
        match memory.space_in(self) {
            Some(MemorySpace::OpenCl) => true,
            Some(space) => space == self.memory_space(),
            None => false,
        }
    }
}

impl fmt::Display for Runtime {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.name())
    }
}

/// A concrete place where a function runs, in the runtime it belongs to
/// ([`Device::runtime`]).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum Device {
    /// The host CPU ([`Runtime::Host`]).
    Cpu,
    /// Adapter `n` of the wgpu runtime ([`Runtime::Wgpu`]), in the order
    /// `hcsflow doctor` lists them. Another GPU runtime gets its own variant.
    Gpu(usize),
}

impl Device {
    /// The runtime this device belongs to.
    pub fn runtime(self) -> Runtime {
        match self {
            Device::Cpu => Runtime::Host,
            Device::Gpu(_) => Runtime::Wgpu,
        }
    }
}

impl fmt::Display for Device {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Device::Cpu => f.write_str("cpu"),
            Device::Gpu(n) => write!(f, "gpu:{n}"),
        }
    }
}

/// What the user asked for with `--device`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Default, Serialize, Deserialize)]
pub enum DeviceRequest {
    /// A usable hardware GPU if there is one, else the CPU (the reason is reported).
    #[default]
    Auto,
    Cpu,
    /// The best usable GPU; an error if there is none.
    Gpu,
    /// GPU adapter `n`; an error if it does not exist or is not usable.
    GpuIndex(usize),
    /// Several GPU adapters (`gpu:0,1`), the wells spread over them
    /// ([`crate::adapter::assign_adapters`]); an error if any of them does
    /// not exist or is not usable.
    GpuSet(GpuSet),
}

/// A set of GPU adapter indices (`gpu:0,1`), at most 64 (indices `0..64`),
/// each once; iterated in index order.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Default, Serialize, Deserialize)]
pub struct GpuSet(u64);

impl GpuSet {
    /// Indices above this are refused by [`GpuSet::insert`].
    pub const MAX_INDEX: usize = 63;

    /// Adds `index`; `false` if it was there already or is above [`Self::MAX_INDEX`].
    pub fn insert(&mut self, index: usize) -> bool {
        if index > Self::MAX_INDEX || self.contains(index) {
            return false;
        }
        self.0 |= 1 << index;
        true
    }

    pub fn contains(self, index: usize) -> bool {
        index <= Self::MAX_INDEX && self.0 & (1 << index) != 0
    }

    /// The indices, in increasing order.
    pub fn indices(self) -> impl Iterator<Item = usize> {
        (0..=Self::MAX_INDEX).filter(move |&i| self.contains(i))
    }

    pub fn len(self) -> usize {
        self.0.count_ones() as usize
    }

    pub fn is_empty(self) -> bool {
        self.0 == 0
    }
}

impl fmt::Display for GpuSet {
    /// `gpu:0,1`.
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let list: Vec<String> = self.indices().map(|i| i.to_string()).collect();
        write!(f, "gpu:{}", list.join(","))
    }
}

/// A `--device` value that is not `auto`, `cpu`, `gpu`, `gpu:N` or `gpu:N,M,…`.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("bad device '{value}': {problem}")]
pub struct BadDevice {
    /// The value as given.
    pub value: String,
    /// What is wrong with it.
    pub problem: String,
}

impl BadDevice {
    fn new(value: &str, problem: impl Into<String>) -> BadDevice {
        BadDevice { value: value.to_string(), problem: problem.into() }
    }
}

const EXPECTED_DEVICE: &str =
    "expected auto, cpu, gpu or gpu:N, or gpu:N,M,… for several adapters (N = adapter index from `hcsflow doctor`)";

impl FromStr for DeviceRequest {
    type Err = BadDevice;
    /// `auto`, `cpu`, `gpu`, `gpu:N`, or `gpu:N,M,…` (also `gpu:N,gpu:M`):
    /// several adapters, each named once. A list that mixes the CPU in
    /// (`cpu,gpu:0`) is refused: a run is on the CPU or on GPUs (a step goes
    /// to the host with `device = "cpu"` in the pipeline).
    fn from_str(s: &str) -> Result<Self, Self::Err> {
        match s {
            "auto" => return Ok(DeviceRequest::Auto),
            "cpu" => return Ok(DeviceRequest::Cpu),
            "gpu" => return Ok(DeviceRequest::Gpu),
            _ => {}
        }
        let items: Vec<&str> = s.split(',').map(str::trim).collect();
        if items.len() > 1 && items.iter().any(|i| matches!(*i, "cpu" | "auto")) {
            return Err(BadDevice::new(
                s,
                "a run is on the CPU or on GPUs, not both (to run one step on the host, set device = \"cpu\" in its pipeline step)",
            ));
        }
        let Some(first) = items[0].strip_prefix("gpu:") else { return Err(BadDevice::new(s, EXPECTED_DEVICE)) };
        let index = |item: &str| item.strip_prefix("gpu:").unwrap_or(item).parse::<usize>().ok();
        let first = index(first).ok_or_else(|| BadDevice::new(s, EXPECTED_DEVICE))?;
        if items.len() == 1 {
            return Ok(DeviceRequest::GpuIndex(first));
        }
        let mut set = GpuSet::default();
        for (i, item) in items.iter().enumerate() {
            let n = if i == 0 { first } else { index(item).ok_or_else(|| BadDevice::new(s, EXPECTED_DEVICE))? };
            if n > GpuSet::MAX_INDEX {
                return Err(BadDevice::new(s, format!("adapter gpu:{n}: a list names adapters gpu:0 to gpu:{}", GpuSet::MAX_INDEX)));
            }
            if !set.insert(n) {
                return Err(BadDevice::new(s, format!("gpu:{n} is listed twice; name each adapter once")));
            }
        }
        Ok(DeviceRequest::GpuSet(set))
    }
}

impl fmt::Display for DeviceRequest {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            DeviceRequest::Auto => f.write_str("auto"),
            DeviceRequest::Cpu => f.write_str("cpu"),
            DeviceRequest::Gpu => f.write_str("gpu"),
            DeviceRequest::GpuIndex(n) => write!(f, "gpu:{n}"),
            DeviceRequest::GpuSet(set) => write!(f, "{set}"),
        }
    }
}

/// An array held by a device runtime (a wgpu buffer, later CUDA or Python
/// objects). Implemented by the runtime crates; core only sees this interface.
pub trait DeviceBuffer: Send + Sync + fmt::Debug + Any {
    fn memory_type(&self) -> MemoryType;
    fn device(&self) -> Device;
    fn shape(&self) -> &[usize];
    fn dtype(&self) -> DType;
    /// For runtimes to recover their concrete type.
    fn as_any(&self) -> &dyn Any;
}

/// An array in any memory type: what flows between the functions of a chain.
#[derive(Debug, Clone)]
pub enum Array {
    /// Host memory ([`MemoryType::Host`]), any number of axes.
    Host(HostArray),
    /// Memory owned by a device runtime.
    Device(Arc<dyn DeviceBuffer>),
}

impl Array {
    pub fn memory_type(&self) -> MemoryType {
        match self {
            Array::Host(_) => MemoryType::Host,
            Array::Device(b) => b.memory_type(),
        }
    }

    pub fn device(&self) -> Device {
        match self {
            Array::Host(_) => Device::Cpu,
            Array::Device(b) => b.device(),
        }
    }

    pub fn shape(&self) -> &[usize] {
        match self {
            Array::Host(a) => a.shape(),
            Array::Device(b) => b.shape(),
        }
    }

    pub fn dtype(&self) -> DType {
        match self {
            Array::Host(a) => a.dtype(),
            Array::Device(b) => b.dtype(),
        }
    }

    /// The host stack inside, if this is a 3D host array.
    pub fn into_host_stack(self) -> Option<Stack> {
        match self {
            Array::Host(a) => a.into_stack().ok(),
            Array::Device(_) => None,
        }
    }
}

impl From<Stack> for Array {
    fn from(s: Stack) -> Self {
        Array::Host(s.into_host_array())
    }
}

impl From<HostArray> for Array {
    fn from(a: HostArray) -> Self {
        Array::Host(a)
    }
}

/// Checks that `device` can hold arrays of `memory_type`; the reason if not.
pub fn check_device(memory_type: MemoryType, device: Device) -> Result<(), String> {
    let runtime = device.runtime();
    if runtime.runs(memory_type) {
        return Ok(());
    }
    Err(match (memory_type.space_in(runtime), device) {
        (None, device) => format!(
            "{memory_type} has no tensors on {device} ({runtime} buffers): {memory_type} functions run on the cpu (use device cpu); \
             this build has no CUDA runtime"
        ),
        (Some(MemorySpace::Host), Device::Gpu(n)) => format!("{memory_type} arrays live in host memory, not on gpu:{n}; use device cpu"),
        (Some(MemorySpace::Cuda), _) => format!(
            "{memory_type} arrays live on a CUDA GPU (no CPU device holds them) and this build has no CUDA runtime, so \
             {memory_type} functions cannot run here; use a numpy, torch or jax function instead"
        ),
        (Some(_), Device::Cpu) => format!("{memory_type} arrays live on a GPU, not on the cpu; use device gpu or gpu:N"),
        (Some(_), device) => format!("{memory_type} arrays are not {runtime} arrays, which {device} holds"),
    })
}
