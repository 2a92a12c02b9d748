//! `RunOptions::require_gpu` (`hcsflow run --require-gpu`): compile refuses a
//! plan in which any call would run on the host, naming each step and
//! function and why, as a usage error; a plan with every call on the GPU
//! compiles. Planning only: no pixel is read and no GPU context is created.
//!
//! The GPU cases need an adapter (lavapipe in CI): without one they fail,
//! unless HCSFLOW_SKIP_GPU_TESTS=1 outside CI; they are built with the `wgpu`
//! feature only.

// Without the `wgpu` feature the GPU case and its imports are not built.
#![cfg_attr(not(feature = "wgpu"), allow(unused_imports))]

use std::path::Path;

use hcsflow::core::{Device, DeviceRequest};
use hcsflow::pipeline::{HostCall, PipelineError, PipelineSpec};
use hcsflow::{DeviceOptions, Engine, Error, ErrorKind, RunOptions};
use hcsflow_synth::{generate, SynthConfig};

fn plate(dir: &Path) -> std::path::PathBuf {
    let cfg = SynthConfig { wells: vec!["A01".into()], grid_rows: 2, grid_cols: 2, z_planes: 2, size: 32, ..SynthConfig::default() };
    let plate = dir.join("plate");
    generate(&cfg, &plate).expect("generate");
    plate
}

/// Options on the software GPU (lavapipe), or `None` when skipped.
#[cfg(feature = "wgpu")]
fn gpu_options() -> Option<DeviceOptions> {
    if !hcsflow_testkit::gpu_test_may_run(!hcsflow::discover_adapters().is_empty()) {
        return None;
    }
    Some(DeviceOptions { request: DeviceRequest::Gpu, allow_software_gpu: true, ..Default::default() })
}

fn host_calls(e: &Error) -> &[HostCall] {
    match e {
        Error::Pipeline(PipelineError::HostCalls { calls, .. }) => calls,
        e => panic!("expected the --require-gpu refusal, got {e:?}"),
    }
}

fn named(calls: &[HostCall]) -> Vec<(&str, &str)> {
    calls.iter().map(|c| (c.step.as_str(), c.function.as_str())).collect()
}

#[test]
fn on_the_cpu_every_step_is_refused_and_named() {
    let dir = tempfile::tempdir().unwrap();
    let plate = plate(dir.path());
    let spec = hcsflow::demo_pipeline().unwrap();
    let out = dir.path().join("out");
    let options = RunOptions { device: DeviceOptions::cpu(), require_gpu: true, ..Default::default() };
    let e = Engine::builtin().plan_spec(&plate, &spec, &out, &options).unwrap_err();
    assert_eq!(e.kind(), ErrorKind::Usage, "{e}");
    let calls = host_calls(&e);
    let expected = [
        ("normalise", "stack_percentile_normalize"),
        ("composite", "composite"),
        ("max_z", "max_projection"),
        ("positions", "tile_positions"),
        ("channels_normalise", "stack_percentile_normalize"),
        ("channels_max_z", "max_projection"),
        ("mosaic", "assemble"),
        ("count", "count_cells"),
    ];
    assert_eq!(named(calls), expected);
    assert!(calls.iter().all(|c| c.why == "the run's device is cpu: requested: --device cpu"), "{calls:?}");
    let text = e.to_string();
    assert!(
        text.starts_with("--require-gpu: 8 call(s) would run on the host, not on cpu:\n  step 'normalise': stack_percentile_normalize ("),
        "{text}"
    );
    assert!(text.contains("fix: run on a GPU (--device gpu"), "{text}");
    assert!(!out.exists(), "nothing is written at compile time");
    // The same plan without the flag compiles.
    let options = RunOptions { require_gpu: false, ..options };
    Engine::builtin().plan_spec(&plate, &spec, &out, &options).expect("without --require-gpu");
}

/// Needs the GPU engine (the `wgpu` feature; `--no-default-features` has no adapter to plan for).
#[cfg(feature = "wgpu")]
#[test]
fn on_the_gpu_only_the_pinned_steps_and_host_work_are_refused() {
    let Some(device) = gpu_options() else { return };
    let dir = tempfile::tempdir().unwrap();
    let plate = plate(dir.path());
    let out = dir.path().join("out");
    let engine = Engine::builtin();
    let options = RunOptions { device, require_gpu: true, ..Default::default() };

    // The demo pins two host-only functions with device = "cpu".
    let e = engine.plan_spec(&plate, &hcsflow::demo_pipeline().unwrap(), &out, &options).unwrap_err();
    assert_eq!(e.kind(), ErrorKind::Usage, "{e}");
    let calls = host_calls(&e);
    assert_eq!(named(calls), [("positions", "tile_positions"), ("count", "count_cells")]);
    assert!(calls.iter().all(|c| c.why == "the step sets device = \"cpu\""), "{calls:?}");
    assert!(matches!(&e, Error::Pipeline(PipelineError::HostCalls { device: Device::Gpu(_), .. })), "{e:?}");

    // A GPU assemble without the positions artifact registers the tiles on the host.
    let spec =
        PipelineSpec::parse("[[steps]]\nname = \"mosaic\"\nfunc = \"assemble\"\nvariable_components = [\"site\"]\n", "t.toml").unwrap();
    let e = engine.plan_spec(&plate, &spec, &out, &options).unwrap_err();
    let calls = host_calls(&e);
    assert_eq!(named(calls), [("mosaic", "assemble")]);
    assert!(calls[0].why.ends_with("registers the tiles on the host: no 'positions' from an earlier step"), "{calls:?}");

    // Every call on the GPU: the plan compiles, with the flag.
    let spec = PipelineSpec::parse(
        "[[steps]]\nname = \"norm\"\nfunc = \"stack_percentile_normalize\"\nvariable_components = [\"z_index\"]\n\
         [[steps]]\nname = \"max_z\"\nfunc = \"max_projection\"\nvariable_components = [\"z_index\"]\n",
        "t.toml",
    )
    .unwrap();
    let plan = engine.plan_spec(&plate, &spec, &out, &options).expect("an all-GPU plan compiles under require_gpu");
    assert!(plan.steps.iter().flat_map(|s| &s.chains).flat_map(|c| &c.calls).all(|c| matches!(c.device, Device::Gpu(_))));
}
