//! Adapter discovery and the per-process GPU contexts.

use std::collections::HashMap;
use std::sync::{Arc, Mutex, OnceLock};

use cubecl::client::Client;
use cubecl::server::Handle;
use cubecl::server::{IoError, LaunchError, ServerError};
use cubecl::wgpu::{try_init_setup, wgpu, AutoGraphicsApi, RuntimeOptions, WgpuBackend, WgpuDevice, WgpuDeviceKind};
use hcsflow_core::transfer::{record_download, record_upload};
use hcsflow_core::{AdapterInfo, AdapterKind, AdapterUsed, Device, FunctionError};

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

/// One initialised GPU: the CubeCL client of an adapter. Shared per process.
pub struct GpuContext {
    pub info: AdapterInfo,
    pub device: Device,
    client: Client,
    max_binding_bytes: u64,
}

impl std::fmt::Debug for GpuContext {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "GpuContext({})", self.info)
    }
}

impl GpuContext {
    /// The context of `device` (`gpu:N`), initialised on first use and shared after.
    pub fn get(device: Device) -> Result<Arc<GpuContext>, GpuError> {
        static CONTEXTS: OnceLock<Mutex<HashMap<usize, Arc<GpuContext>>>> = OnceLock::new();
        let Device::Gpu(index) = device else {
            return Err(GpuError::NotAGpu { device });
        };
        let found = discovered().get(index).ok_or(GpuError::NoSuchAdapter(index))?;
        let contexts = CONTEXTS.get_or_init(|| Mutex::new(HashMap::new()));
        let mut map = contexts.lock().unwrap_or_else(|poisoned| poisoned.into_inner());
        if let Some(ctx) = map.get(&index) {
            return Ok(ctx.clone());
        }
        let init_error = |message: String| GpuError::Init { adapter: found.info.to_string(), message };
        let options = RuntimeOptions::try_default().map_err(|e| init_error(e.to_string()))?;
        try_init_setup::<AutoGraphicsApi>(&found.device, options).map_err(|e| init_error(e.to_string()))?;
        let client = cubecl::Device::from(found.device.clone()).client();
        tracing::info!(adapter = %found.info, "GPU context initialised");
        let ctx = Arc::new(GpuContext { info: found.info.clone(), device, client, max_binding_bytes: found.max_binding_bytes });
        map.insert(index, ctx.clone());
        Ok(ctx)
    }

    pub(crate) fn client(&self) -> &Client {
        &self.client
    }

    /// This adapter as the run report names it.
    pub fn adapter_used(&self) -> AdapterUsed {
        AdapterUsed { device: self.device.to_string(), name: self.info.name.clone(), backend: self.info.backend.clone() }
    }

    /// A new device buffer holding `bytes`, copied from the host: every
    /// host → device copy of the runtime goes through here, counted
    /// ([`hcsflow_core::transfer`]) and traced (a `gpu_upload` span).
    pub(crate) fn upload_bytes(&self, bytes: &[u8]) -> Handle {
        let _span =
            tracing::info_span!("gpu_upload", bytes = bytes.len(), adapter = %self.info.name, backend = %self.info.backend).entered();
        record_upload(&self.adapter_used(), bytes.len() as u64);
        self.client.create_from_slice(bytes)
    }

    /// The contents of a device buffer, copied back to the host: every
    /// device → host copy goes through here, counted and traced (`gpu_download`).
    pub(crate) fn read_back(&self, handle: Handle) -> Result<impl std::ops::Deref<Target = [u8]>, ServerError> {
        let span = tracing::info_span!(
            "gpu_download",
            bytes = tracing::field::Empty,
            adapter = %self.info.name,
            backend = %self.info.backend
        )
        .entered();
        let data = self.client.read_one(handle)?;
        let bytes: &[u8] = &data;
        span.record("bytes", bytes.len());
        record_download(&self.adapter_used(), bytes.len() as u64);
        Ok(data)
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
