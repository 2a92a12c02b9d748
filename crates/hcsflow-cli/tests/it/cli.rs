//! The `hcsflow` binary end to end: doctor, functions, apply (CPU and GPU), errors and exit codes.

use std::path::Path;
use std::process::Command;

use hcsflow_core::{DType, Stack};
use ndarray::Array3;

use crate::common;
use common::{hcsflow, stderr};

/// A u16 stack with a known per-pixel maximum: plane z holds (x + 3y + 7z) mod 1000,
/// plus one bright pixel on the last plane.
fn write_input(dir: &Path) -> (std::path::PathBuf, Stack) {
    let (z, y, x) = (5, 17, 23);
    let mut a = Array3::from_shape_fn((z, y, x), |(k, j, i)| ((i + 3 * j + 7 * k) % 1000) as u16);
    a[[4, 2, 3]] = 60000;
    let s = Stack::from(a);
    let path = dir.join("in.tif");
    hcsflow_tiff::write_stack(&path, &s, &Default::default()).unwrap();
    (path, s)
}

fn expected_max(s: &Stack) -> Stack {
    let Stack::U16(a) = s else { unreachable!() };
    let m = a.view().fold_axis(ndarray::Axis(0), 0u16, |&acc, &v| acc.max(v));
    Stack::from(m.insert_axis(ndarray::Axis(0)))
}

fn has_software_adapter_only() -> bool {
    let adapters = hcsflow_gpu::discover_adapters();
    !adapters.is_empty() && adapters.iter().all(|a| a.is_software())
}

#[test]
fn doctor_json_reports_adapters_and_the_default_device_with_a_reason() {
    let o = hcsflow(&["doctor", "--json"]);
    assert!(o.status.success(), "{}", stderr(&o));
    let v: serde_json::Value = serde_json::from_slice(&o.stdout).unwrap();
    assert!(v["cpu"]["logical_cores"].as_u64().unwrap() >= 1);
    assert!(v["memory"]["total_bytes"].as_u64().unwrap() > 0);
    assert!(v["cuda_driver"]["present"].is_boolean());
    let reason = v["default_device"]["reason"].as_str().unwrap();
    assert!(reason.starts_with("auto:"), "{reason}");
    if has_software_adapter_only() {
        // This machine in CI: lavapipe only → auto picks the CPU and says why.
        assert_eq!(v["hardware_gpu"], false);
        assert_eq!(v["default_device"]["device"], "cpu");
        assert!(reason.contains("software rasterizer"), "{reason}");
        assert!(v["gpu_adapters"][0]["name"].as_str().unwrap().contains("llvmpipe"));
        assert_eq!(v["gpu_adapters"][0]["kind"], "software");
    }
    let text = hcsflow(&["doctor"]);
    let out = String::from_utf8_lossy(&text.stdout);
    assert!(out.contains("Default device (--device auto)") && out.contains("why:"), "{out}");
}

#[test]
fn doctor_on_a_headless_machine_prints_no_display_server_noise() {
    // Mesa's device-select layer would print this twice without a display server.
    let o = Command::new(env!("CARGO_BIN_EXE_hcsflow"))
        .arg("doctor")
        .env_remove("XDG_RUNTIME_DIR")
        .env_remove("WAYLAND_DISPLAY")
        .env_remove("DISPLAY")
        .env_remove("NODEVICE_SELECT")
        .output()
        .unwrap();
    assert!(o.status.success(), "{}", stderr(&o));
    let err = stderr(&o);
    assert!(!err.contains("XDG_RUNTIME_DIR"), "{err}");
}

#[test]
fn functions_json_lists_every_registered_function() {
    let o = hcsflow(&["functions", "--json"]);
    assert!(o.status.success(), "{}", stderr(&o));
    let v: serde_json::Value = serde_json::from_slice(&o.stdout).unwrap();
    let names: Vec<&str> = v.as_array().unwrap().iter().map(|f| f["name"].as_str().unwrap()).collect();
    let (registry, _) = hcsflow::builtin();
    let expected: Vec<&str> = registry.functions().map(|f| f.spec.name).collect();
    assert_eq!(names, expected);
    let max = v.as_array().unwrap().iter().find(|f| f["name"] == "max_projection").unwrap();
    assert_eq!(max["contract"], "volumetric_to_slice");
    assert_eq!(max["memory_types"], serde_json::json!(["host", "wgpu"]));
    for name in ["tile_positions", "assemble", "white_tophat", "focus_stack", "count_cells"] {
        assert!(names.contains(&name), "{name} is listed");
    }
}

#[test]
fn apply_max_projection_on_cpu_matches_reference() {
    let dir = tempfile::tempdir().unwrap();
    let (input, stack) = write_input(dir.path());
    let out = dir.path().join("out.tif");
    let o = hcsflow(&["apply", "max_projection", input.to_str().unwrap(), out.to_str().unwrap(), "--device", "cpu"]);
    assert!(o.status.success(), "{}", stderr(&o));
    assert_eq!(hcsflow_tiff::read_stack(&out).unwrap(), expected_max(&stack));
}

#[test]
fn apply_mean_projection_keeps_input_dtype_or_f32_on_request() {
    let dir = tempfile::tempdir().unwrap();
    let (input, stack) = write_input(dir.path());
    let f = stack.to_f32();
    let mean = f.mean_axis(ndarray::Axis(0)).unwrap().insert_axis(ndarray::Axis(0));
    let out = dir.path().join("mean.tif");
    let o = hcsflow(&["apply", "mean_projection", input.to_str().unwrap(), out.to_str().unwrap(), "--device", "cpu"]);
    assert!(o.status.success(), "{}", stderr(&o));
    let got = hcsflow_tiff::read_stack(&out).unwrap();
    assert_eq!(got, Stack::from_f32_array(mean.clone(), DType::U16));
    let out32 = dir.path().join("mean32.tif");
    let o = hcsflow(&["apply", "mean_projection", input.to_str().unwrap(), out32.to_str().unwrap(), "--device", "cpu", "--dtype", "f32"]);
    assert!(o.status.success(), "{}", stderr(&o));
    let Stack::F32(got) = hcsflow_tiff::read_stack(&out32).unwrap() else { panic!("f32 expected") };
    let max_err = got.pixels().iter().zip(mean.iter()).map(|(a, b)| (a - b).abs()).fold(0.0f32, f32::max);
    assert!(max_err <= 1e-3, "max error {max_err}");
}

#[test]
fn apply_on_gpu_needs_the_software_allowance_and_then_matches_cpu() {
    if !has_software_adapter_only() {
        eprintln!("not a software-only machine; the lavapipe-specific checks do not apply");
        return;
    }
    let dir = tempfile::tempdir().unwrap();
    let (input, stack) = write_input(dir.path());
    let out = dir.path().join("gpu.tif");
    let o = hcsflow(&["apply", "max_projection", input.to_str().unwrap(), out.to_str().unwrap(), "--device", "gpu"]);
    assert_eq!(o.status.code(), Some(3), "{}", stderr(&o));
    let e = stderr(&o);
    assert!(e.contains("no usable GPU"), "{e}");
    assert!(e.contains("llvmpipe"), "lists what was found: {e}");
    assert!(e.contains("--allow-software-gpu") && e.contains("HCSFLOW_ALLOW_SOFTWARE_GPU=1"), "{e}");
    assert!(!out.exists(), "nothing written on a refused device");

    let o =
        hcsflow(&["apply", "max_projection", input.to_str().unwrap(), out.to_str().unwrap(), "--device", "gpu", "--allow-software-gpu"]);
    assert!(o.status.success(), "{}", stderr(&o));
    assert!(stderr(&o).contains("host → wgpu (device copy, upload)"), "plan shows the route: {}", stderr(&o));
    assert_eq!(hcsflow_tiff::read_stack(&out).unwrap(), expected_max(&stack));
    // The same through the environment variable and gpu:0, for mean too, equal to --device cpu.
    let cpu = dir.path().join("mean_cpu.tif");
    let gpu = dir.path().join("mean_gpu.tif");
    assert!(hcsflow(&["apply", "mean_projection", input.to_str().unwrap(), cpu.to_str().unwrap(), "--device", "cpu"]).status.success());
    let o = Command::new(env!("CARGO_BIN_EXE_hcsflow"))
        .args(["apply", "mean_projection", input.to_str().unwrap(), gpu.to_str().unwrap(), "--device", "gpu:0"])
        .env("HCSFLOW_ALLOW_SOFTWARE_GPU", "1")
        .output()
        .unwrap();
    assert!(o.status.success(), "{}", stderr(&o));
    assert_eq!(hcsflow_tiff::read_stack(&gpu).unwrap(), hcsflow_tiff::read_stack(&cpu).unwrap());
}

#[test]
fn apply_usage_errors_exit_2_before_reading_pixels() {
    let dir = tempfile::tempdir().unwrap();
    let missing = dir.path().join("does-not-exist.tif");
    let out = dir.path().join("out.tif");
    let (m, o) = (missing.to_str().unwrap(), out.to_str().unwrap());
    // The input does not exist: usage errors must be reported first, proving no read happened.
    let cases: [(&[&str], &str); 5] = [
        (&["apply", "max_projectoin", m, o], "unknown function 'max_projectoin' (did you mean 'max_projection'?)"),
        (&["apply", "max_projection", m, o, "--arg", "sigma=2"], "max_projection: unknown argument 'sigma'; its arguments are: (none)"),
        (&["apply", "max_projection", m, o, "--arg", "nonsense"], "malformed argument 'nonsense': expected name=value"),
        (&["apply", "max_projection", m, o, "--device", "tpu"], "bad device 'tpu': expected auto, cpu, gpu or gpu:N"),
        (&["apply", "max_projection", m, o, "--dtype", "u12"], "unknown dtype 'u12'"),
    ];
    for (args, message) in cases {
        let r = hcsflow(args);
        assert_eq!(r.status.code(), Some(2), "{args:?}: {}", stderr(&r));
        assert!(stderr(&r).contains(message), "{args:?}: {}", stderr(&r));
    }
    // A valid command on a missing file fails at run time (exit 1) naming the file.
    let r = hcsflow(&["apply", "max_projection", m, o, "--device", "cpu"]);
    assert_eq!(r.status.code(), Some(1), "{}", stderr(&r));
    assert!(stderr(&r).contains("does-not-exist.tif"), "{}", stderr(&r));
    assert!(!out.exists());
}
