//! The facade's errors keep their engine type and sort into the three kinds a
//! front end acts on (the CLI's exit codes 2, 1, 3), in the order the checks
//! run: pipeline file, options, plate, device, compile.

use std::path::Path;

use hcsflow::core::DeviceRequest;
use hcsflow::{DeviceOptions, Engine, Error, ErrorKind, OptionsError, RunOptions};

fn cpu() -> RunOptions {
    RunOptions { device: DeviceOptions::cpu(), ..Default::default() }
}

#[test]
fn an_unreadable_pipeline_file_is_a_usage_error_found_before_the_plate() {
    let dir = tempfile::tempdir().unwrap();
    let missing = dir.path().join("nope.toml");
    let e = Engine::builtin().plan(&dir.path().join("no-plate"), &missing, &dir.path().join("out"), &cpu()).unwrap_err();
    assert!(matches!(e, Error::Spec(_)), "{e:?}");
    assert_eq!(e.kind(), ErrorKind::Usage);
    assert!(e.to_string().contains("nope.toml"), "{e}");
}

#[test]
fn zero_workers_is_a_usage_error_found_before_the_plate() {
    let spec = hcsflow::demo_pipeline().unwrap();
    let options = RunOptions { workers: 0, ..cpu() };
    let e = Engine::builtin().plan_spec(Path::new("/nonexistent/plate"), &spec, Path::new("/nonexistent/out"), &options).unwrap_err();
    assert!(matches!(e, Error::Options(OptionsError::NoWorkers)), "{e:?}");
    assert_eq!(e.kind(), ErrorKind::Usage);
    assert_eq!(e.to_string(), "--workers must be at least 1");
}

#[test]
fn a_plate_that_cannot_be_opened_is_a_failure_naming_it_with_the_plate_error_as_source() {
    let dir = tempfile::tempdir().unwrap();
    let spec = hcsflow::demo_pipeline().unwrap();
    let e = Engine::builtin().plan_spec(dir.path(), &spec, &dir.path().join("out"), &cpu()).unwrap_err();
    let Error::Plate { path, source } = &e else { panic!("{e:?}") };
    assert_eq!(path, dir.path());
    assert_eq!(e.kind(), ErrorKind::Failure);
    assert_eq!(e.to_string(), format!("opening plate {}", dir.path().display()));
    assert_eq!(std::error::Error::source(&e).map(|s| s.to_string()), Some(source.to_string()));
}

#[test]
fn one_call_errors_are_usage_errors_of_their_own_type() {
    let engine = Engine::builtin();
    let e = engine.plan_call("max_projectio", &[], &DeviceOptions::cpu()).unwrap_err();
    assert!(matches!(e, Error::Call(_)) && e.kind() == ErrorKind::Usage, "{e:?}");
    assert!(e.to_string().contains("did you mean 'max_projection'"), "{e}");
    let e = engine.plan_call("gaussian_blur", &["foo=1".into()], &DeviceOptions::cpu()).unwrap_err();
    assert!(matches!(e, Error::Arg(_)) && e.kind() == ErrorKind::Usage, "{e:?}");
}

/// A GPU request in a build without a GPU runtime finds no adapter: the
/// device error, never a silent CPU fallback.
#[cfg(not(feature = "wgpu"))]
#[test]
fn without_a_gpu_runtime_a_gpu_request_is_device_unavailable() {
    assert!(hcsflow::discover_adapters().is_empty());
    for request in [DeviceRequest::Gpu, DeviceRequest::GpuIndex(0)] {
        let device = DeviceOptions { request, allow_software_gpu: true, ..Default::default() };
        let e = Engine::builtin().plan_call("max_projection", &[], &device).unwrap_err();
        assert!(matches!(e, Error::Device(_)), "{e:?}");
        assert_eq!(e.kind(), ErrorKind::DeviceUnavailable);
    }
    // `auto` falls back to the CPU, and says so: that is its contract.
    let choice = DeviceOptions::default().choose().unwrap();
    assert_eq!(choice.device, hcsflow::core::Device::Cpu);
    assert_eq!(choice.reason, "auto: no GPU adapter found; using the CPU");
}

/// `gpu:N` beyond the adapters found is a device error in every build.
#[test]
fn an_adapter_that_does_not_exist_is_device_unavailable() {
    let device = DeviceOptions { request: DeviceRequest::GpuIndex(999), allow_software_gpu: true, ..Default::default() };
    let e = Engine::builtin().plan_call("max_projection", &[], &device).unwrap_err();
    assert!(matches!(e, Error::Device(_)) && e.kind() == ErrorKind::DeviceUnavailable, "{e:?}");
}
