//! The built-in functions and conversions, and device selection from CLI flags.

use hcsflow_core::adapter::ALLOW_SOFTWARE_GPU_ENV;
use hcsflow_core::{select_device, AdapterInfo, Conversions, DeviceChoice, DeviceError, DeviceRequest, Registry};

/// Every function this build has and the converters: one implementation, in hcsflow-pipeline.
pub fn builtin() -> (Registry, Conversions) {
    hcsflow::builtin()
}

/// True if the flag is given or the environment variable is set to 1/true/yes.
pub fn software_gpu_allowed(flag: bool) -> bool {
    flag || std::env::var(ALLOW_SOFTWARE_GPU_ENV).map(|v| matches!(v.to_ascii_lowercase().as_str(), "1" | "true" | "yes")).unwrap_or(false)
}

/// Adapters are only enumerated when a GPU could be chosen: `--device cpu`
/// never touches the GPU drivers.
pub fn choose_device(request: DeviceRequest, allow_software: bool) -> Result<(DeviceChoice, Vec<AdapterInfo>), DeviceError> {
    let adapters = if request == DeviceRequest::Cpu { Vec::new() } else { hcsflow_gpu::discover_adapters() };
    let choice = select_device(request, &adapters, allow_software)?;
    Ok((choice, adapters))
}
