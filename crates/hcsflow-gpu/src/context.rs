//! Adapter discovery and the per-process GPU contexts: one per queue of an
//! adapter ([`hcsflow_core::queue`]), each a wgpu device of its own on that
//! adapter, so that wells in flight submit to their own queue.

use std::collections::HashMap;
use std::sync::{Arc, Mutex, OnceLock};

use cubecl::client::Client;
use cubecl::profile::TimingMethod;
use cubecl::server::Handle;
use cubecl::server::{IoError, LaunchError, ServerError};
use cubecl::wgpu::{
    try_init_device, try_init_setup, wgpu, AutoGraphicsApi, RuntimeOptions, WgpuBackend, WgpuDevice, WgpuDeviceKind, WgpuSetup,
};
use hcsflow_core::queue::current_queue_slot;
use hcsflow_core::transfer::{record_download, record_kernel, record_upload};
use hcsflow_core::{AdapterInfo, AdapterKind, AdapterUsed, Device, FunctionError, KernelTiming, QueueId};

/// A GPU could not be used.
#[derive(Debug, Clone, thiserror::Error)]
pub enum GpuError {
    #[error("there is no GPU adapter gpu:{0} (`hcsflow doctor` lists the adapters)")]
    NoSuchAdapter(usize),
    #[error("{device} is not a GPU device")]
    NotAGpu { device: Device },
    #[error("could not initialise {adapter}: {message}")]
    Init { adapter: String, message: String },
    #[error("{what} needs {bytes} bytes in one GPU buffer, more than {adapter} allows ({limit} bytes per binding); use a smaller stack or --device cpu")]
    TooLarge { what: String, bytes: u64, limit: u64, adapter: String },
    #[error("GPU {operation} failed on {adapter}: {message}")]
    Runtime { operation: String, adapter: String, message: String },
    #[error("GPU {operation} ran out of device memory on {adapter}: {message}")]
    OutOfMemory { operation: String, adapter: String, message: String },
    /// Invalid stitching input (tile count vs positions, non-finite positions,
    /// canvas too large): the same checks and errors as the host assembly.
    #[error(transparent)]
    Stitch(#[from] hcsflow_stitch::StitchError),
}

impl GpuError {
    /// This error as the failure of `function`, keeping it as the source and
    /// its kind: [`GpuError::TooLarge`] becomes [`FunctionError::TooLarge`],
    /// [`GpuError::OutOfMemory`] [`FunctionError::DeviceOutOfMemory`], the
    /// rest [`FunctionError::Failed`].
    pub fn into_function_error(self, function: &str) -> FunctionError {
        match self {
            GpuError::TooLarge { .. } => FunctionError::too_large(function, self),
            GpuError::OutOfMemory { .. } => FunctionError::out_of_memory(function, self),
            _ => FunctionError::failed(function, self),
        }
    }
}

/// The wgpu adapter behind a `gpu:N` index, kept with what cubecl needs to reach it.
#[derive(Debug, Clone)]
struct Discovered {
    info: AdapterInfo,
    device: WgpuDevice,
    max_binding_bytes: u64,
}

fn kind_of(t: wgpu::DeviceType) -> AdapterKind {
    match t {
        wgpu::DeviceType::DiscreteGpu => AdapterKind::DiscreteGpu,
        wgpu::DeviceType::IntegratedGpu => AdapterKind::IntegratedGpu,
        wgpu::DeviceType::VirtualGpu => AdapterKind::VirtualGpu,
        wgpu::DeviceType::Cpu => AdapterKind::Software,
        wgpu::DeviceType::Other => AdapterKind::Other,
    }
}

fn backend_of(b: wgpu::Backend) -> WgpuBackend {
    match b {
        wgpu::Backend::Vulkan => WgpuBackend::Vulkan,
        wgpu::Backend::Metal => WgpuBackend::Metal,
        wgpu::Backend::Dx12 => WgpuBackend::Dx12,
        wgpu::Backend::Gl => WgpuBackend::Gl,
        wgpu::Backend::BrowserWebGpu => WgpuBackend::WebGpu,
        _ => WgpuBackend::Auto,
    }
}

/// Enumerates adapters once per process. Creating and dropping Vulkan
/// instances concurrently crashes some loaders, so this runs exactly once.
fn discovered() -> &'static [Discovered] {
    static ADAPTERS: OnceLock<Vec<Discovered>> = OnceLock::new();
    ADAPTERS.get_or_init(|| {
        let backends = wgpu::Backends::VULKAN | wgpu::Backends::METAL | wgpu::Backends::DX12;
        let instance = wgpu::Instance::new(wgpu::InstanceDescriptor { backends, ..wgpu::InstanceDescriptor::new_without_display_handle() });
        let adapters = cubecl::future::block_on(instance.enumerate_adapters(backends));
        // cubecl addresses an adapter by (backend, device type, index among that type).
        let mut counters: HashMap<(wgpu::Backend, u8), usize> = HashMap::new();
        adapters
            .iter()
            .enumerate()
            .map(|(index, adapter)| {
                let info = adapter.get_info();
                let slot = counters.entry((info.backend, info.device_type as u8)).or_insert(0);
                let n = *slot;
                *slot += 1;
                let kind = match info.device_type {
                    wgpu::DeviceType::DiscreteGpu => WgpuDeviceKind::DiscreteGpu(n),
                    wgpu::DeviceType::IntegratedGpu => WgpuDeviceKind::IntegratedGpu(n),
                    wgpu::DeviceType::VirtualGpu => WgpuDeviceKind::VirtualGpu(n),
                    wgpu::DeviceType::Cpu => WgpuDeviceKind::Cpu,
                    wgpu::DeviceType::Other => WgpuDeviceKind::Other(n),
                };
                let limits = adapter.limits();
                Discovered {
                    info: AdapterInfo {
                        index,
                        name: info.name.clone(),
                        backend: format!("{:?}", info.backend),
                        kind: kind_of(info.device_type),
                        driver: info.driver.clone(),
                        driver_info: info.driver_info.clone(),
                    },
                    device: WgpuDevice::new(kind).on(backend_of(info.backend)),
                    max_binding_bytes: limits.max_storage_buffer_binding_size.min(limits.max_buffer_size),
                }
            })
            .collect()
    })
}

/// Every GPU adapter wgpu can see (Vulkan, Metal, DX12), numbered `gpu:0..`.
/// Empty when no driver answers. Never panics.
pub fn discover_adapters() -> Vec<AdapterInfo> {
    discovered().iter().map(|d| d.info.clone()).collect()
}

/// The largest buffer one binding may hold on adapter `gpu:index`, in bytes
/// (the smaller of its storage-binding and buffer-size limits: 128 MiB on
/// lavapipe), without initialising it; `None` if there is no such adapter.
/// The default device-memory budget of a run (`--gpu-memory`).
pub fn max_binding_bytes(index: usize) -> Option<u64> {
    discovered().get(index).map(|d| d.max_binding_bytes)
}

/// One initialised queue of a GPU: the CubeCL client of one wgpu device on an
/// adapter. Shared per process; an adapter has up to
/// [`hcsflow_core::queue::QUEUES_PER_ADAPTER`] of them.
pub struct GpuContext {
    pub info: AdapterInfo,
    pub device: Device,
    /// Which queue of the adapter this is (`gpu:0/q1`).
    pub queue: QueueId,
    client: Client,
    /// The cubecl device behind `client` (what burn's wgpu backend is given to share it).
    wgpu_device: WgpuDevice,
    max_binding_bytes: u64,
}

impl std::fmt::Debug for GpuContext {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "GpuContext({}, queue {})", self.info, self.queue)
    }
}

/// The contexts initialised so far, by queue, and the wgpu setup of each
/// adapter's first queue (what its other queues' devices are requested from).
#[derive(Default)]
struct Contexts {
    queues: HashMap<QueueId, Arc<GpuContext>>,
    setups: HashMap<usize, WgpuSetup>,
}

fn contexts() -> std::sync::MutexGuard<'static, Contexts> {
    static CONTEXTS: OnceLock<Mutex<Contexts>> = OnceLock::new();
    CONTEXTS.get_or_init(|| Mutex::new(Contexts::default())).lock().unwrap_or_else(|poisoned| poisoned.into_inner())
}

impl GpuContext {
    /// The context of `device` (`gpu:N`) on the current thread's queue slot
    /// ([`hcsflow_core::queue::current_queue_slot`]: 0 outside a
    /// [`hcsflow_core::QueueScope`]), initialised on first use and shared after.
    pub fn get(device: Device) -> Result<Arc<GpuContext>, GpuError> {
        Self::on_queue(device, current_queue_slot())
    }

    /// The context of queue `slot` (modulo
    /// [`hcsflow_core::queue::QUEUES_PER_ADAPTER`]) of `device`. Queue 0 is
    /// the adapter's device as cubecl selects it; queue k > 0 is another wgpu
    /// device requested on the same adapter with the same features and
    /// limits (so every kernel runs on it), registered with cubecl as a
    /// runtime of its own: its own submission queue, memory pools and
    /// compiled kernels. Buffers of two queues must not meet in one kernel;
    /// kernels use their input's queue.
    pub fn on_queue(device: Device, slot: usize) -> Result<Arc<GpuContext>, GpuError> {
        let Device::Gpu(index) = device else {
            return Err(GpuError::NotAGpu { device });
        };
        let found = discovered().get(index).ok_or(GpuError::NoSuchAdapter(index))?;
        let queue = QueueId { adapter: index, slot: slot % hcsflow_core::queue::QUEUES_PER_ADAPTER };
        // Initialisation holds the lock: devices come up one at a time (a
        // Vulkan loader is not always safe to call concurrently), once each.
        let mut map = contexts();
        if let Some(ctx) = map.queues.get(&queue) {
            return Ok(ctx.clone());
        }
        let init_error = |message: String| GpuError::Init { adapter: format!("{} (queue {queue})", found.info), message };
        let options = RuntimeOptions::try_default().map_err(|e| init_error(e.to_string()))?;
        let cubecl_device = match map.setups.get(&index) {
            None if queue.slot == 0 => {
                let setup = try_init_setup::<AutoGraphicsApi>(&found.device, options).map_err(|e| init_error(e.to_string()))?;
                map.setups.insert(index, setup);
                found.device.clone()
            }
            None => {
                drop(map);
                Self::on_queue(device, 0)?;
                return Self::on_queue(device, slot);
            }
            Some(first) => {
                let setup = another_device(first).map_err(init_error)?;
                try_init_device(setup, options).map_err(|e| init_error(e.to_string()))?
            }
        };
        let client = cubecl::Device::from(cubecl_device.clone()).client();
        tracing::info!(adapter = %found.info, queue = %queue, "GPU context initialised");
        let ctx = Arc::new(GpuContext {
            info: found.info.clone(),
            device,
            queue,
            client,
            wgpu_device: cubecl_device,
            max_binding_bytes: found.max_binding_bytes,
        });
        map.queues.insert(queue, ctx.clone());
        Ok(ctx)
    }

    pub(crate) fn client(&self) -> &Client {
        &self.client
    }

    /// The cubecl wgpu device of this queue: given to burn's wgpu backend, burn runs on this
    /// queue's runtime (the same client) instead of opening a device of its own.
    pub(crate) fn wgpu_device(&self) -> &WgpuDevice {
        &self.wgpu_device
    }

    /// This adapter as the run report names it.
    pub fn adapter_used(&self) -> AdapterUsed {
        AdapterUsed { device: self.device.to_string(), name: self.info.name.clone(), backend: self.info.backend.clone() }
    }

    /// A new device buffer holding `bytes`, copied from the host: every
    /// host → device copy of the runtime goes through here, counted
    /// ([`hcsflow_core::transfer`]) and traced (a `gpu_upload` span naming
    /// the adapter and the queue).
    pub(crate) fn upload_bytes(&self, bytes: &[u8]) -> Handle {
        let _span =
            tracing::info_span!("gpu_upload", bytes = bytes.len(), adapter = %self.info.name, backend = %self.info.backend, queue = %self.queue)
                .entered();
        record_upload(&self.adapter_used(), bytes.len() as u64);
        self.client.create_from_slice(bytes)
    }

    /// The contents of a device buffer, copied back to the host: every
    /// device → host copy goes through here, counted and traced (`gpu_download`,
    /// naming the adapter and the queue).
    pub(crate) fn read_back(&self, handle: Handle) -> Result<impl std::ops::Deref<Target = [u8]>, ServerError> {
        let span = tracing::info_span!(
            "gpu_download",
            bytes = tracing::field::Empty,
            adapter = %self.info.name,
            backend = %self.info.backend,
            queue = %self.queue
        )
        .entered();
        let data = self.client.read_one(handle)?;
        let bytes: &[u8] = &data;
        span.record("bytes", bytes.len());
        record_download(&self.adapter_used(), bytes.len() as u64);
        Ok(data)
    }

    /// Runs `call`, a function's work on this queue launched from this
    /// thread, inside a `gpu_call` span naming `function`, and counts the time
    /// the device spent on it ([`record_kernel`]): GPU timestamps written
    /// around the work where the adapter has timestamp queries
    /// ([`KernelTiming::Device`]), otherwise the host's clock between the
    /// queue drained before and after it ([`KernelTiming::Host`]). Either way
    /// it returns once the device has finished the call's work (the
    /// measurement is read back first), so a call's work is never counted in
    /// the next one's time. Calls are not nested: a function's work
    /// calls no other function through the registry. A window that cannot be
    /// opened or read leaves the call untimed (logged), never failed.
    pub(crate) fn timed<T>(&self, function: &str, call: impl FnOnce() -> T) -> T {
        let span = tracing::info_span!(
            "gpu_call",
            function = %function,
            adapter = %self.info.name,
            queue = %self.queue,
            kernel_ns = tracing::field::Empty,
            timing = tracing::field::Empty
        )
        .entered();
        let window = match self.client.profile_start() {
            Ok(window) => window,
            Err(e) => {
                tracing::warn!(function, error = %e, "the call's device time cannot be measured");
                return call();
            }
        };
        let out = call();
        let measured = self.client.profile_end(window).map_err(|e| e.to_string()).and_then(|duration| {
            let timing = match duration.timing_method() {
                TimingMethod::Device => KernelTiming::Device,
                TimingMethod::System => KernelTiming::Host,
            };
            let ticks = cubecl::future::block_on(duration.resolve()).ok_or("the window carried no measurement")?;
            Ok((ticks.duration(), timing))
        });
        match measured {
            Ok((spent, timing)) => {
                span.record("kernel_ns", u64::try_from(spent.as_nanos()).unwrap_or(u64::MAX));
                span.record("timing", tracing::field::display(timing.as_str()));
                record_kernel(&self.adapter_used(), spent, timing);
            }
            Err(e) => tracing::warn!(function, error = %e, "the call's device time could not be read"),
        }
        out
    }

    /// Fails with a clear message if one buffer of `bytes` exceeds the binding limit.
    pub(crate) fn check_size(&self, what: &str, bytes: u64) -> Result<(), GpuError> {
        if bytes > self.max_binding_bytes {
            return Err(GpuError::TooLarge {
                what: what.to_string(),
                bytes,
                limit: self.max_binding_bytes,
                adapter: self.info.name.clone(),
            });
        }
        Ok(())
    }

    /// The largest buffer one binding may hold on this adapter, in bytes.
    pub fn max_binding_bytes(&self) -> u64 {
        self.max_binding_bytes
    }

    /// A CubeCL server error of `operation`: out of memory stays
    /// [`GpuError::OutOfMemory`], a buffer the device can never hold
    /// [`GpuError::TooLarge`]; anything else is [`GpuError::Runtime`].
    pub(crate) fn server_error(&self, operation: &str, e: ServerError) -> GpuError {
        match e {
            ServerError::Io(IoError::OutOfMemory { .. }) | ServerError::Launch(LaunchError::OutOfMemory { .. }) => {
                GpuError::OutOfMemory { operation: operation.to_string(), adapter: self.info.name.clone(), message: format!("{e:?}") }
            }
            ServerError::Io(IoError::BufferTooBig { size, .. }) => GpuError::TooLarge {
                what: operation.to_string(),
                bytes: size,
                limit: self.max_binding_bytes,
                adapter: self.info.name.clone(),
            },
            e => self.runtime_error(operation, format!("{e:?}")),
        }
    }

    pub(crate) fn runtime_error(&self, operation: &str, message: impl ToString) -> GpuError {
        GpuError::Runtime { operation: operation.to_string(), adapter: self.info.name.clone(), message: message.to_string() }
    }
}

/// A second wgpu device on the adapter of `first`, with its features and
/// limits, as a setup cubecl can register: what queue k > 0 of an adapter
/// runs on.
fn another_device(first: &WgpuSetup) -> Result<WgpuSetup, String> {
    let descriptor = wgpu::DeviceDescriptor {
        label: Some("hcsflow queue"),
        required_features: first.device.features(),
        required_limits: first.device.limits(),
        memory_hints: wgpu::MemoryHints::MemoryUsage,
        trace: wgpu::Trace::Off,
        // SAFETY: the token cubecl passes when it requests the adapter's first
        // device (cubecl-wgpu's `backend/wgsl.rs`); the same here keeps the
        // second device's features equal to the first's, which cubecl's
        // compiler options (read from the adapter) assume.
        experimental_features: unsafe { wgpu::ExperimentalFeatures::enabled() },
    };
    let (device, queue) = cubecl::future::block_on(first.adapter.request_device(&descriptor)).map_err(|e| e.to_string())?;
    Ok(WgpuSetup { instance: first.instance.clone(), adapter: first.adapter.clone(), device, queue, backend: first.backend })
}
