//! Which device runs the functions, and why: adapter discovery (only with a
//! GPU runtime feature) and the selection policy of
//! [`hcsflow_core::select_device`].

use hcsflow_core::adapter::ALLOW_SOFTWARE_GPU_ENV;
use hcsflow_core::{select_device, AdapterInfo, ConversionPolicy, Device, DeviceChoice, DeviceError, DeviceRequest};
use serde::Serialize;

/// How to choose the device and which conversions a plan may use: the same
/// for a pipeline run and for a single call.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct DeviceOptions {
    /// `auto` (default: a hardware GPU if there is one, else the CPU), `cpu`,
    /// `gpu` (the best usable adapter), `gpu:N`, or `gpu:N,M,…` (the wells
    /// spread over those adapters: [`hcsflow_pipeline::Plan::spread_over_gpus`]).
    pub request: DeviceRequest,
    /// Count software adapters (lavapipe/llvmpipe) as usable GPUs, for tests
    /// and CI. The environment variable `HCSFLOW_ALLOW_SOFTWARE_GPU=1` allows
    /// them too (see [`software_gpu_allowed`]).
    pub allow_software_gpu: bool,
    /// Allow copies through host memory between two GPU libraries that cannot
    /// share memory.
    pub allow_host_round_trip: bool,
}

impl DeviceOptions {
    /// Options that run everything on the CPU (no GPU driver is touched).
    pub fn cpu() -> Self {
        DeviceOptions { request: DeviceRequest::Cpu, ..Self::default() }
    }

    /// The conversions a plan may use under these options.
    pub fn conversion_policy(&self) -> ConversionPolicy {
        ConversionPolicy { allow_host_round_trip: self.allow_host_round_trip }
    }

    /// The device for these options, and why ([`choose_device`]).
    pub fn choose(&self) -> Result<DeviceChoice, DeviceError> {
        choose_device(self.request, software_gpu_allowed(self.allow_software_gpu))
    }
}

/// True if `flag` is set or the environment variable
/// `HCSFLOW_ALLOW_SOFTWARE_GPU` is `1`, `true` or `yes` (any case).
pub fn software_gpu_allowed(flag: bool) -> bool {
    flag || std::env::var(ALLOW_SOFTWARE_GPU_ENV).map(|v| matches!(v.to_ascii_lowercase().as_str(), "1" | "true" | "yes")).unwrap_or(false)
}

/// The GPU adapters this build's runtimes find, `gpu:N` numbered. Without a
/// GPU runtime feature (`wgpu`) there are none: no driver is touched.
pub fn discover_adapters() -> Vec<AdapterInfo> {
    #[cfg(feature = "wgpu")]
    {
        hcsflow_gpu::discover_adapters()
    }
    #[cfg(not(feature = "wgpu"))]
    {
        Vec::new()
    }
}

/// The default device-memory budget of a GPU call on `device`
/// ([`RunOptions::gpu_memory`](crate::RunOptions::gpu_memory)): the largest
/// buffer one binding may hold on its adapter (128 MiB on lavapipe), read
/// from the adapter's limits without initialising it. `None` for the CPU, an
/// unknown adapter, or a build without a GPU runtime.
pub fn default_gpu_memory(device: Device) -> Option<u64> {
    #[cfg(feature = "wgpu")]
    if let Device::Gpu(index) = device {
        return hcsflow_gpu::max_binding_bytes(index);
    }
    #[cfg(not(feature = "wgpu"))]
    let _ = device;
    None
}

/// Chooses the device for `request` ([`select_device`]'s policy). Adapters
/// are only looked for when a GPU could be chosen: `cpu` never touches the
/// GPU drivers. A GPU request that no adapter meets is a [`DeviceError`]
/// listing what was found, never a silent fallback to the CPU, also in a
/// build without a GPU runtime.
///
/// ```
/// use hcsflow::core::{Device, DeviceRequest};
///
/// let choice = hcsflow::choose_device(DeviceRequest::Cpu, false).unwrap();
/// assert_eq!(choice.device, Device::Cpu);
/// assert_eq!(choice.reason, "requested: --device cpu");
///
/// // `gpu:N` names one adapter; asking for one that does not exist is an error.
/// let err = hcsflow::choose_device(DeviceRequest::GpuIndex(999), true).unwrap_err();
/// assert!(err.to_string().contains("there is no adapter gpu:999"));
/// ```
pub fn choose_device(request: DeviceRequest, allow_software: bool) -> Result<DeviceChoice, DeviceError> {
    let adapters = if request == DeviceRequest::Cpu { Vec::new() } else { discover_adapters() };
    select_device(request, &adapters, allow_software)
}

/// What the machine offers for `--device auto` and why it picks what it does
/// (the device half of `hcsflow doctor`).
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct DeviceReport {
    /// Every adapter found ([`discover_adapters`]).
    pub gpu_adapters: Vec<AdapterInfo>,
    /// Whether any of them is a hardware GPU.
    pub hardware_gpu: bool,
    /// Whether software adapters count as usable ([`software_gpu_allowed`]).
    pub software_gpu_allowed: bool,
    /// What `auto` chooses, and why.
    pub default_device: DeviceChoice,
}

/// Looks for adapters and reports what `auto` would choose. `allow_software`
/// is the flag; the environment variable counts too.
pub fn device_report(allow_software: bool) -> Result<DeviceReport, DeviceError> {
    let allowed = software_gpu_allowed(allow_software);
    let adapters = discover_adapters();
    let default_device = select_device(DeviceRequest::Auto, &adapters, allowed)?;
    Ok(DeviceReport {
        hardware_gpu: adapters.iter().any(|a| !a.is_software()),
        gpu_adapters: adapters,
        software_gpu_allowed: allowed,
        default_device,
    })
}
