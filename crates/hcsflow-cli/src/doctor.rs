//! `hcsflow doctor`: what this machine offers and which device `auto` picks, and why.

use std::path::{Path, PathBuf};

use anyhow::Context;
use clap::Args;
use hcsflow::core::adapter::ALLOW_SOFTWARE_GPU_ENV;
use hcsflow::core::{AdapterInfo, DeviceChoice};
use serde::Serialize;

use crate::CliResult;

#[derive(Args)]
pub struct DoctorArgs {
    /// Print JSON instead of text.
    #[arg(long)]
    json: bool,
    /// Count software adapters (lavapipe/llvmpipe) as usable GPUs, as `--device gpu` would.
    #[arg(long)]
    allow_software_gpu: bool,
}

#[derive(Serialize)]
struct Report {
    version: &'static str,
    cpu: Cpu,
    memory: Memory,
    gpu_adapters: Vec<AdapterInfo>,
    hardware_gpu: bool,
    software_gpu_allowed: bool,
    cuda_driver: CudaDriver,
    default_device: DeviceChoice,
}

#[derive(Serialize)]
struct Cpu {
    brand: String,
    arch: &'static str,
    logical_cores: usize,
    physical_cores: Option<usize>,
    simd: Vec<&'static str>,
}

#[derive(Serialize)]
struct Memory {
    total_bytes: u64,
    available_bytes: u64,
}

#[derive(Serialize)]
struct CudaDriver {
    present: bool,
    /// Where libcuda was found, or the places searched.
    detail: String,
}

fn simd_features() -> Vec<&'static str> {
    #[allow(unused_mut)]
    let mut found = Vec::new();
    #[cfg(any(target_arch = "x86", target_arch = "x86_64"))]
    {
        macro_rules! check {
            ($($f:tt),*) => { $( if std::arch::is_x86_feature_detected!($f) { found.push($f); } )* };
        }
        check!("sse2", "sse4.1", "sse4.2", "avx", "avx2", "fma", "avx512f", "avx512bw", "avx512vl");
    }
    #[cfg(target_arch = "aarch64")]
    {
        if std::arch::is_aarch64_feature_detected!("neon") {
            found.push("neon");
        }
        if std::arch::is_aarch64_feature_detected!("sve") {
            found.push("sve");
        }
    }
    found
}

/// Looks for the CUDA driver library without loading it (loading libcuda on a
/// machine without a GPU can abort; the CUDA runtime is not part of this build).
fn cuda_driver() -> CudaDriver {
    let mut dirs: Vec<PathBuf> = std::env::var_os("LD_LIBRARY_PATH").map(|v| std::env::split_paths(&v).collect()).unwrap_or_default();
    for d in
        ["/usr/lib/x86_64-linux-gnu", "/usr/lib/aarch64-linux-gnu", "/usr/lib64", "/usr/lib", "/usr/local/cuda/lib64", "/usr/lib/wsl/lib"]
    {
        dirs.push(PathBuf::from(d));
    }
    for d in &dirs {
        for name in ["libcuda.so.1", "libcuda.so"] {
            let p = d.join(name);
            if p.exists() {
                let version = std::fs::read_to_string("/proc/driver/nvidia/version")
                    .ok()
                    .and_then(|v| v.lines().next().map(str::to_string))
                    .unwrap_or_default();
                return CudaDriver { present: true, detail: format!("{} {}", p.display(), version).trim().to_string() };
            }
        }
    }
    let searched: Vec<_> = dirs.iter().map(|d| d.display().to_string()).collect();
    CudaDriver {
        present: Path::new("/proc/driver/nvidia/version").exists(),
        detail: format!("libcuda.so.1 not found in {}", searched.join(", ")),
    }
}

pub fn run(a: DoctorArgs) -> CliResult {
    let devices = hcsflow::device_report(a.allow_software_gpu).context("selecting the default device")?;
    let allow = devices.software_gpu_allowed;
    let mut sys = sysinfo::System::new();
    sys.refresh_memory();
    sys.refresh_cpu_all();
    let brand = sys.cpus().first().map(|c| c.brand().trim().to_string()).unwrap_or_default();
    let report = Report {
        version: env!("CARGO_PKG_VERSION"),
        cpu: Cpu {
            brand,
            arch: std::env::consts::ARCH,
            logical_cores: std::thread::available_parallelism().map(|n| n.get()).unwrap_or(1),
            physical_cores: sysinfo::System::physical_core_count(),
            simd: simd_features(),
        },
        memory: Memory { total_bytes: sys.total_memory(), available_bytes: sys.available_memory() },
        hardware_gpu: devices.hardware_gpu,
        gpu_adapters: devices.gpu_adapters,
        software_gpu_allowed: allow,
        cuda_driver: cuda_driver(),
        default_device: devices.default_device,
    };
    if a.json {
        outln!("{}", serde_json::to_string_pretty(&report).context("serialising the report")?)?;
        return Ok(());
    }
    let gib = |b: u64| b as f64 / (1u64 << 30) as f64;
    outln!("hcsflow {}", report.version)?;
    outln!(
        "CPU:      {} ({}, {} logical cores{})",
        report.cpu.brand,
        report.cpu.arch,
        report.cpu.logical_cores,
        report.cpu.physical_cores.map(|p| format!(", {p} physical")).unwrap_or_default()
    )?;
    outln!("SIMD:     {}", if report.cpu.simd.is_empty() { "none detected".to_string() } else { report.cpu.simd.join(" ") })?;
    outln!("Memory:   {:.1} GiB total, {:.1} GiB available", gib(report.memory.total_bytes), gib(report.memory.available_bytes))?;
    if report.gpu_adapters.is_empty() {
        outln!("GPU adapters (wgpu): none found (no Vulkan/Metal/DX12 driver answered)")?;
    } else {
        outln!("GPU adapters (wgpu):")?;
        for ad in &report.gpu_adapters {
            outln!("  {ad}")?;
        }
    }
    outln!("Hardware GPU: {}", if report.hardware_gpu { "yes" } else { "none" })?;
    outln!("Software GPU allowed: {} (--allow-software-gpu or {ALLOW_SOFTWARE_GPU_ENV}=1)", if allow { "yes" } else { "no" })?;
    outln!("CUDA driver: {} ({})", if report.cuda_driver.present { "present" } else { "not found" }, report.cuda_driver.detail)?;
    outln!("Default device (--device auto): {}", report.default_device.device)?;
    outln!("  why: {}", report.default_device.reason)?;
    Ok(())
}
