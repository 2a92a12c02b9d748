//! Several GPUs (`--device gpu:0,1`): the wells whose calls run on a GPU are
//! spread over the adapters round-robin in plan order, and the plan says
//! which well runs on which adapter. Planning only (no device is opened), so
//! a machine with one adapter tests the spreading too; running on it is
//! `hcsflow-cli`'s `gpu_queues` test.

#![cfg(feature = "wgpu")]

use std::path::Path;

use hcsflow::core::{AssignError, DType, DeviceRequest};
use hcsflow::pipeline::{PipelineSpec, Plan};
use hcsflow::{DeviceOptions, Engine, RunOptions};
use hcsflow_synth::{generate, SynthConfig};

const WELLS: [&str; 4] = ["A01", "A02", "A03", "A04"];

fn plan(dir: &Path, request: DeviceRequest) -> Plan {
    let cfg = SynthConfig {
        wells: WELLS.iter().map(|w| w.to_string()).collect(),
        grid_rows: 1,
        grid_cols: 1,
        channels: 1,
        z_planes: 2,
        size: 16,
        dtype: DType::U16,
        ..SynthConfig::default()
    };
    let plate = dir.join("plate");
    if !plate.exists() {
        generate(&cfg, &plate).expect("generate");
    }
    let spec = PipelineSpec::parse("[[steps]]\nname = \"z\"\nfunc = \"max_projection\"\nvariable_components = [\"z_index\"]\n", "t.toml")
        .expect("pipeline");
    let device = DeviceOptions { request, allow_software_gpu: true, ..Default::default() };
    Engine::builtin().plan_spec(&plate, &spec, &dir.join("out"), &RunOptions { device, ..Default::default() }).expect("plan")
}

fn gpus(plan: &Plan) -> Vec<Option<usize>> {
    plan.wells.iter().map(|w| w.gpu).collect()
}

#[test]
fn wells_spread_over_gpus_round_robin_and_the_plan_says_where() {
    let dir = tempfile::tempdir().unwrap();
    // On the CPU no well has an adapter, and the plan text names none.
    let cpu = plan(dir.path(), DeviceRequest::Cpu);
    assert_eq!(gpus(&cpu), [None; 4]);
    assert!(!hcsflow::plan_text(&cpu).contains("gpus:"), "{}", hcsflow::plan_text(&cpu));

    if !hcsflow_testkit::gpu_test_may_run(!hcsflow::discover_adapters().is_empty()) {
        return;
    }
    let mut on_gpu = plan(dir.path(), DeviceRequest::GpuIndex(0));
    assert_eq!(gpus(&on_gpu), [Some(0); 4]);
    let text = hcsflow::plan_text(&on_gpu);
    assert!(
        text.contains("gpus: gpu:0 runs 4 wells (A01, A02, A03, A04) (each worker submits to its own queue of its adapter)\n"),
        "{text}"
    );
    // What `gpu:0,1` does once both adapters are found (this machine may have one).
    on_gpu.spread_over_gpus(&[0, 1]).unwrap();
    assert_eq!(gpus(&on_gpu), [Some(0), Some(1), Some(0), Some(1)]);
    let text = hcsflow::plan_text(&on_gpu);
    assert!(text.contains("gpus: gpu:0 runs 2 wells (A01, A03); gpu:1 runs 2 wells (A02, A04) ("), "{text}");
    on_gpu.spread_over_gpus(&[2]).unwrap();
    assert_eq!(gpus(&on_gpu), [Some(2); 4]);
    assert_eq!(on_gpu.spread_over_gpus(&[]), Err(AssignError::NoAdapters));
    assert_eq!(on_gpu.spread_over_gpus(&[1, 1]), Err(AssignError::Duplicate(1)));
}
