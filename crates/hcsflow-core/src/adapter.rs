//! GPU adapters as the runtime found them, and the device-selection policy.
//!
//! Selection is a pure function of (request, adapters, allowance) so the
//! policy is tested without GPUs; `hcsflow-gpu` supplies the adapter list.

use std::fmt;

use serde::Serialize;

use crate::memory::{Device, DeviceRequest};

/// What kind of adapter the driver reports.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize)]
#[serde(rename_all = "snake_case")]
pub enum AdapterKind {
    DiscreteGpu,
    IntegratedGpu,
    VirtualGpu,
    /// A software rasterizer running on the CPU (lavapipe/llvmpipe, WARP, SwiftShader).
    Software,
    Other,
}

impl AdapterKind {
    /// Preference order for `--device gpu` (lower is better).
    fn rank(self) -> u8 {
        match self {
            AdapterKind::DiscreteGpu => 0,
            AdapterKind::IntegratedGpu => 1,
            AdapterKind::VirtualGpu => 2,
            AdapterKind::Other => 3,
            AdapterKind::Software => 4,
        }
    }
}

impl fmt::Display for AdapterKind {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(match self {
            AdapterKind::DiscreteGpu => "discrete GPU",
            AdapterKind::IntegratedGpu => "integrated GPU",
            AdapterKind::VirtualGpu => "virtual GPU",
            AdapterKind::Software => "software (runs on the CPU)",
            AdapterKind::Other => "other",
        })
    }
}

/// One adapter found by the GPU runtime. `index` is its `gpu:N` number.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct AdapterInfo {
    pub index: usize,
    pub name: String,
    /// Graphics API: "Vulkan", "Metal", "Dx12", "Gl".
    pub backend: String,
    pub kind: AdapterKind,
    pub driver: String,
    pub driver_info: String,
}

impl AdapterInfo {
    pub fn is_software(&self) -> bool {
        self.kind == AdapterKind::Software
    }
}

impl fmt::Display for AdapterInfo {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "gpu:{} {} — {}, {}", self.index, self.name, self.backend, self.kind)?;
        if !self.driver.is_empty() {
            write!(f, ", driver {} {}", self.driver, self.driver_info)?;
        }
        Ok(())
    }
}

/// The device chosen and why, for `doctor` and run reports.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct DeviceChoice {
    pub device: Device,
    pub reason: String,
}

/// The environment variable that allows software adapters (same as `--allow-software-gpu`).
pub const ALLOW_SOFTWARE_GPU_ENV: &str = "HCSFLOW_ALLOW_SOFTWARE_GPU";

/// A GPU was requested but none usable exists.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("{}", self.render())]
pub struct DeviceError {
    pub request: DeviceRequest,
    pub adapters: Vec<AdapterInfo>,
    pub problem: String,
}

impl DeviceError {
    fn render(&self) -> String {
        let mut s = format!("--device {}: {}.", self.request, self.problem);
        if self.adapters.is_empty() {
            s.push_str(
                "\nNo GPU adapter was found (no Vulkan/Metal/DX12 driver answered). \
                 On Linux install the vendor driver, or for testing Mesa's software device: \
                 apt-get install mesa-vulkan-drivers libvulkan1.",
            );
        } else {
            s.push_str(&format!("\nFound {} adapter(s):", self.adapters.len()));
            for a in &self.adapters {
                s.push_str(&format!("\n  {a}"));
            }
        }
        if self.adapters.iter().any(AdapterInfo::is_software) {
            s.push_str(&format!(
                "\nSoftware adapters are used only when allowed: pass --allow-software-gpu \
                 or set {ALLOW_SOFTWARE_GPU_ENV}=1 (meant for tests; it is slower than --device cpu)."
            ));
        }
        s.push_str("\nUse --device cpu to run on the CPU.");
        s
    }
}

/// Chooses the device for `request` among `adapters`.
///
/// `auto` never picks a software adapter (the native CPU code is faster than a
/// software rasterizer); `gpu` and `gpu:N` pick one only when `allow_software`.
pub fn select_device(request: DeviceRequest, adapters: &[AdapterInfo], allow_software: bool) -> Result<DeviceChoice, DeviceError> {
    let usable = |a: &&AdapterInfo| !a.is_software() || allow_software;
    let best = |pred: &dyn Fn(&&AdapterInfo) -> bool| adapters.iter().filter(pred).min_by_key(|a| (a.kind.rank(), a.index));
    let error = |problem: String| DeviceError { request, adapters: adapters.to_vec(), problem };
    match request {
        DeviceRequest::Cpu => Ok(DeviceChoice { device: Device::Cpu, reason: "requested: --device cpu".into() }),
        DeviceRequest::Auto => match best(&|a| !a.is_software()) {
            Some(a) => Ok(DeviceChoice { device: Device::Gpu(a.index), reason: format!("auto: using hardware adapter {a}") }),
            None if adapters.is_empty() => {
                Ok(DeviceChoice { device: Device::Cpu, reason: "auto: no GPU adapter found; using the CPU".into() })
            }
            None => Ok(DeviceChoice {
                device: Device::Cpu,
                reason: format!(
                    "auto: no hardware GPU; the only adapter{} ({}) {} a software rasterizer, \
                     slower than the native CPU code; using the CPU",
                    if adapters.len() > 1 { "s" } else { "" },
                    adapters.iter().map(|a| a.name.as_str()).collect::<Vec<_>>().join(", "),
                    if adapters.len() > 1 { "are" } else { "is" },
                ),
            }),
        },
        DeviceRequest::Gpu => match best(&usable) {
            Some(a) => Ok(DeviceChoice {
                device: Device::Gpu(a.index),
                reason: format!("requested: --device gpu; using {a}{}", if a.is_software() { " (software adapter allowed)" } else { "" }),
            }),
            None if adapters.is_empty() => Err(error("no GPU adapter found".into())),
            None => Err(error("no usable GPU: every adapter found is a software rasterizer".into())),
        },
        DeviceRequest::GpuIndex(n) => match adapters.iter().find(|a| a.index == n) {
            None => Err(error(format!("there is no adapter gpu:{n}"))),
            Some(a) if !usable(&a) => Err(error(format!("gpu:{n} ({}) is a software rasterizer", a.name))),
            Some(a) => Ok(DeviceChoice { device: Device::Gpu(n), reason: format!("requested: --device gpu:{n}; using {a}") }),
        },
    }
}
