//! GPU adapters as the runtime found them, and the device-selection policy.
//!
//! Selection is a pure function of (request, adapters, allowance) so the
//! policy is tested without GPUs; `hcsflow-gpu` supplies the adapter list.
//! So is the spreading of a run's wells over several adapters
//! ([`assign_adapters`], for `--device gpu:0,1`).

use std::fmt;

use serde::Serialize;

use crate::memory::{Device, DeviceRequest, GpuSet};

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
    /// The device the plan's calls are planned on: the CPU, or the first of
    /// [`DeviceChoice::gpus`].
    pub device: Device,
    pub reason: String,
    /// The GPU adapters the run's wells are spread over
    /// ([`assign_adapters`]), in index order: several for `--device gpu:N,M`,
    /// else the one of `device` (none for the CPU).
    #[serde(skip_serializing_if = "at_most_one")]
    pub gpus: Vec<usize>,
}

fn at_most_one(gpus: &[usize]) -> bool {
    gpus.len() <= 1
}

impl DeviceChoice {
    fn new(device: Device, reason: String) -> DeviceChoice {
        let gpus = match device {
            Device::Gpu(n) => vec![n],
            Device::Cpu => Vec::new(),
        };
        DeviceChoice { device, reason, gpus }
    }
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
        DeviceRequest::Cpu => Ok(DeviceChoice::new(Device::Cpu, "requested: --device cpu".into())),
        DeviceRequest::Auto => match best(&|a| !a.is_software()) {
            Some(a) => Ok(DeviceChoice::new(Device::Gpu(a.index), format!("auto: using hardware adapter {a}"))),
            None if adapters.is_empty() => Ok(DeviceChoice::new(Device::Cpu, "auto: no GPU adapter found; using the CPU".into())),
            None => Ok(DeviceChoice::new(
                Device::Cpu,
                format!(
                    "auto: no hardware GPU; the only adapter{} ({}) {} a software rasterizer, \
                     slower than the native CPU code; using the CPU",
                    if adapters.len() > 1 { "s" } else { "" },
                    adapters.iter().map(|a| a.name.as_str()).collect::<Vec<_>>().join(", "),
                    if adapters.len() > 1 { "are" } else { "is" },
                ),
            )),
        },
        DeviceRequest::Gpu => match best(&usable) {
            Some(a) => Ok(DeviceChoice::new(
                Device::Gpu(a.index),
                format!("requested: --device gpu; using {a}{}", if a.is_software() { " (software adapter allowed)" } else { "" }),
            )),
            None if adapters.is_empty() => Err(error("no GPU adapter found".into())),
            None => Err(error("no usable GPU: every adapter found is a software rasterizer".into())),
        },
        DeviceRequest::GpuIndex(n) => match adapters.iter().find(|a| a.index == n) {
            None => Err(error(format!("there is no adapter gpu:{n}"))),
            Some(a) if !usable(&a) => Err(error(format!("gpu:{n} ({}) is a software rasterizer", a.name))),
            Some(a) => Ok(DeviceChoice::new(Device::Gpu(n), format!("requested: --device gpu:{n}; using {a}"))),
        },
        DeviceRequest::GpuSet(set) => select_set(set, adapters, allow_software).map_err(error),
    }
}

/// [`select_device`] for `gpu:N,M,…`: every adapter listed must exist and be
/// usable; the error names the first that is not (the [`DeviceError`] lists
/// the adapters found).
fn select_set(set: GpuSet, adapters: &[AdapterInfo], allow_software: bool) -> Result<DeviceChoice, String> {
    let mut chosen = Vec::new();
    for n in set.indices() {
        match adapters.iter().find(|a| a.index == n) {
            None => return Err(format!("there is no adapter gpu:{n}")),
            Some(a) if a.is_software() && !allow_software => return Err(format!("gpu:{n} ({}) is a software rasterizer", a.name)),
            Some(a) => chosen.push(a),
        }
    }
    let first = chosen.first().ok_or_else(|| "no adapter listed".to_string())?;
    let listed: Vec<String> = chosen.iter().map(|a| a.to_string()).collect();
    Ok(DeviceChoice {
        device: Device::Gpu(first.index),
        reason: format!("requested: --device {set}; wells spread round-robin over {}", listed.join("; ")),
        gpus: chosen.iter().map(|a| a.index).collect(),
    })
}

/// How [`assign_adapters`] spreads wells over adapters.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Spread {
    /// Well `i` (in plan order) on adapter `i mod n`: wells started one after
    /// the other land on different adapters.
    RoundRobin,
    /// Each well, in plan order, on the adapter with the most free memory
    /// left after the wells already placed (ties: the first listed). Needs
    /// every adapter's free memory.
    ByFreeMemory,
}

/// One adapter wells may go to: its `gpu:N` index and, where the runtime
/// can tell, its free device memory in bytes.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct AdapterLoad {
    pub index: usize,
    pub free_bytes: Option<u64>,
}

/// Wells could not be spread over the adapters given.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum AssignError {
    #[error("no GPU adapter to run the wells on")]
    NoAdapters,
    #[error("gpu:{0} is listed twice")]
    Duplicate(usize),
    #[error("spreading wells by free memory needs every adapter's free memory; gpu:{0} does not report it")]
    FreeMemoryUnknown(usize),
}

/// The adapter (`gpu:N` index) of each well: `well_bytes[i]` is well `i`'s
/// estimated device memory (used by [`Spread::ByFreeMemory`] only), the
/// result has one index per well, in the same order. Pure: the policy is
/// tested on made-up adapter lists.
pub fn assign_adapters(adapters: &[AdapterLoad], well_bytes: &[u64], spread: Spread) -> Result<Vec<usize>, AssignError> {
    if adapters.is_empty() {
        return Err(AssignError::NoAdapters);
    }
    for (i, a) in adapters.iter().enumerate() {
        if adapters[..i].iter().any(|b| b.index == a.index) {
            return Err(AssignError::Duplicate(a.index));
        }
    }
    match spread {
        Spread::RoundRobin => Ok((0..well_bytes.len()).map(|i| adapters[i % adapters.len()].index).collect()),
        Spread::ByFreeMemory => {
            let mut free = adapters
                .iter()
                .map(|a| a.free_bytes.map(i128::from).ok_or(AssignError::FreeMemoryUnknown(a.index)))
                .collect::<Result<Vec<i128>, AssignError>>()?;
            Ok(well_bytes
                .iter()
                .map(|&bytes| {
                    // The most free memory left; the first listed among equals.
                    let best = (0..free.len()).fold(0, |best, k| if free[k] > free[best] { k } else { best });
                    free[best] -= i128::from(bytes);
                    adapters[best].index
                })
                .collect())
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn adapter(index: usize, name: &str, kind: AdapterKind) -> AdapterInfo {
        AdapterInfo { index, name: name.into(), backend: "Vulkan".into(), kind, driver: String::new(), driver_info: String::new() }
    }

    fn two_gpus_and_lavapipe() -> Vec<AdapterInfo> {
        vec![
            adapter(0, "RTX A", AdapterKind::DiscreteGpu),
            adapter(1, "RTX B", AdapterKind::DiscreteGpu),
            adapter(2, "llvmpipe", AdapterKind::Software),
        ]
    }

    fn load(index: usize, free: Option<u64>) -> AdapterLoad {
        AdapterLoad { index, free_bytes: free }
    }

    #[test]
    fn several_gpus_parse_each_once_and_never_with_the_cpu() {
        let set = |s: &str| match s.parse::<DeviceRequest>() {
            Ok(DeviceRequest::GpuSet(set)) => set.indices().collect::<Vec<_>>(),
            other => panic!("{s}: {other:?}"),
        };
        assert_eq!(set("gpu:0,1"), [0, 1]);
        assert_eq!(set("gpu:2,gpu:0"), [0, 2], "either spelling; index order");
        assert_eq!("gpu:1,0".parse::<DeviceRequest>().unwrap().to_string(), "gpu:0,1");
        assert_eq!("gpu:3".parse::<DeviceRequest>(), Ok(DeviceRequest::GpuIndex(3)), "one adapter stays gpu:N");
        let problem = |s: &str| s.parse::<DeviceRequest>().unwrap_err();
        let e = problem("gpu:0,0");
        assert_eq!(e.to_string(), "bad device 'gpu:0,0': gpu:0 is listed twice; name each adapter once");
        for mixed in ["cpu,gpu:0", "gpu:0,cpu", "gpu:1,auto"] {
            assert!(problem(mixed).problem.starts_with("a run is on the CPU or on GPUs, not both"), "{mixed}: {}", problem(mixed));
        }
        for bad in ["gpu:0,", "gpu:0,x", "gpu:0,-1", "gpu,0", "0,1"] {
            assert!(problem(bad).problem.starts_with("expected auto, cpu, gpu or gpu:N, or gpu:N,M"), "{bad}: {}", problem(bad));
        }
        assert!(problem("gpu:0,64").problem.contains("gpu:0 to gpu:63"), "{}", problem("gpu:0,64"));
    }

    #[test]
    fn several_gpus_must_all_exist_and_be_usable() {
        let adapters = two_gpus_and_lavapipe();
        let request = |s: &str| s.parse::<DeviceRequest>().unwrap();
        let c = select_device(request("gpu:0,1"), &adapters, false).unwrap();
        assert_eq!((c.device, c.gpus.as_slice()), (Device::Gpu(0), &[0, 1][..]));
        assert!(c.reason.starts_with("requested: --device gpu:0,1; wells spread round-robin over gpu:0 RTX A"), "{}", c.reason);
        // An adapter that does not exist: named, with the adapters found.
        let e = select_device(request("gpu:1,5"), &adapters, false).unwrap_err().to_string();
        assert!(e.starts_with("--device gpu:1,5: there is no adapter gpu:5."), "{e}");
        assert!(e.contains("Found 3 adapter(s):\n  gpu:0 RTX A") && e.contains("\n  gpu:2 llvmpipe"), "{e}");
        // A software adapter only when allowed.
        let e = select_device(request("gpu:1,2"), &adapters, false).unwrap_err().to_string();
        assert!(e.contains("gpu:2 (llvmpipe) is a software rasterizer"), "{e}");
        assert_eq!(select_device(request("gpu:1,2"), &adapters, true).unwrap().gpus, [1, 2]);
        // One adapter: its index; the CPU: none.
        assert_eq!(select_device(DeviceRequest::GpuIndex(1), &adapters, false).unwrap().gpus, [1]);
        assert!(select_device(DeviceRequest::Cpu, &adapters, false).unwrap().gpus.is_empty());
    }

    #[test]
    fn round_robin_alternates_in_plan_order() {
        let adapters = [load(3, None), load(1, None)];
        assert_eq!(assign_adapters(&adapters, &[10; 5], Spread::RoundRobin), Ok(vec![3, 1, 3, 1, 3]));
        assert_eq!(assign_adapters(&adapters[..1], &[10; 3], Spread::RoundRobin), Ok(vec![3, 3, 3]));
        assert_eq!(assign_adapters(&adapters, &[], Spread::RoundRobin), Ok(vec![]));
    }

    #[test]
    fn by_free_memory_fills_the_emptiest_adapter_first() {
        let adapters = [load(0, Some(100)), load(1, Some(250))];
        // Free 100 / 250 → well 1 on gpu:1 (150 left), well 2 on gpu:1 (50
        // left), well 3 on gpu:0 (0 left), well 4 on gpu:1 (50 > 0).
        let wells = [100, 100, 100, 100];
        assert_eq!(assign_adapters(&adapters, &wells, Spread::ByFreeMemory), Ok(vec![1, 1, 0, 1]));
        // Equal free memory: the first listed, then alternation.
        let equal = [load(4, Some(64)), load(2, Some(64))];
        assert_eq!(assign_adapters(&equal, &[8, 8, 8], Spread::ByFreeMemory), Ok(vec![4, 2, 4]));
        // Wells larger than every adapter still get one (the budget splits them later).
        assert_eq!(assign_adapters(&equal, &[1 << 40, 1 << 40], Spread::ByFreeMemory), Ok(vec![4, 2]));
    }

    #[test]
    fn assignment_errors_name_the_adapter() {
        assert_eq!(assign_adapters(&[], &[1], Spread::RoundRobin), Err(AssignError::NoAdapters));
        let twice = [load(0, None), load(1, None), load(0, None)];
        assert_eq!(assign_adapters(&twice, &[1], Spread::RoundRobin), Err(AssignError::Duplicate(0)));
        assert_eq!(AssignError::Duplicate(0).to_string(), "gpu:0 is listed twice");
        let unknown = [load(0, Some(5)), load(1, None)];
        let e = assign_adapters(&unknown, &[1], Spread::ByFreeMemory).unwrap_err();
        assert_eq!(e, AssignError::FreeMemoryUnknown(1));
        assert!(e.to_string().contains("gpu:1 does not report it"), "{e}");
    }
}
