//! The GPU runtime through the CLI: `--require-gpu` refuses a plan with a
//! host step (exit 2, naming the steps and functions); the run report and
//! the trace prove where each step ran (adapter, bytes copied, wall time).
//!
//! The GPU cases run on the first adapter (lavapipe in CI): without one they
//! fail, unless HCSFLOW_SKIP_GPU_TESTS=1 outside CI.

use std::path::{Path, PathBuf};

use hcsflow_synth::{generate, SynthConfig};

use crate::common;
use common::{hcsflow, stderr};

/// True if there is an adapter to test on; panics without one (CI) unless skipped.
fn have_gpu() -> bool {
    hcsflow_testkit::gpu_test_may_run(!hcsflow_gpu::discover_adapters().is_empty())
}

/// One well, 2 sites, 1 u16 channel, `z_planes` planes of `size`².
fn small_plate(dir: &Path, z_planes: u32, size: u32) -> PathBuf {
    let cfg = SynthConfig {
        wells: vec!["A01".into()],
        grid_rows: 1,
        grid_cols: 2,
        channels: 1,
        z_planes,
        size,
        dtype: hcsflow_core::DType::U16,
        ..SynthConfig::default()
    };
    let plate = dir.join("plate");
    generate(&cfg, &plate).expect("generate");
    plate
}

fn demo_toml() -> String {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("../../examples/demo.toml").to_string_lossy().into_owned()
}

fn s(p: &Path) -> &str {
    p.to_str().unwrap()
}

#[test]
fn require_gpu_refuses_host_steps_with_exit_2_naming_them() {
    let dir = tempfile::tempdir().unwrap();
    let plate = small_plate(dir.path(), 2, 32);
    let out = dir.path().join("out");
    let demo = demo_toml();

    // On the CPU every step runs on the host.
    let o = hcsflow(&["run", s(&plate), &demo, s(&out), "--device", "cpu", "--require-gpu"]);
    assert_eq!(o.status.code(), Some(2), "{}", stderr(&o));
    let e = stderr(&o);
    assert!(e.contains("--require-gpu: 8 call(s) would run on the host, not on cpu"), "{e}");
    for (step, function) in [("normalise", "stack_percentile_normalize"), ("mosaic", "assemble"), ("count", "count_cells")] {
        assert!(e.contains(&format!("step '{step}': {function} (the run's device is cpu")), "{step}: {e}");
    }
    assert!(!out.exists(), "nothing written");

    if !have_gpu() {
        return;
    }
    // On the GPU: the two steps the demo pins with device = "cpu", and only those.
    let o = hcsflow(&["run", s(&plate), &demo, s(&out), "--device", "gpu", "--allow-software-gpu", "--require-gpu"]);
    assert_eq!(o.status.code(), Some(2), "{}", stderr(&o));
    let e = stderr(&o);
    assert!(e.contains("--require-gpu: 2 call(s) would run on the host, not on gpu:0"), "{e}");
    assert!(e.contains("step 'positions': tile_positions (the step sets device = \"cpu\")"), "{e}");
    assert!(e.contains("step 'count': count_cells (the step sets device = \"cpu\")"), "{e}");
    assert!(!e.contains("step 'max_z'"), "GPU steps are not named: {e}");
    assert!(!out.exists(), "nothing written");
    // The same run without the flag plans (dry run).
    let o = hcsflow(&["run", s(&plate), &demo, s(&out), "--device", "gpu", "--allow-software-gpu", "--dry-run"]);
    assert!(o.status.success(), "{}", stderr(&o));
}

#[test]
fn the_report_and_the_trace_prove_where_each_step_ran() {
    if !have_gpu() {
        return;
    }
    let adapter = hcsflow_gpu::discover_adapters().remove(0);
    let dir = tempfile::tempdir().unwrap();
    let (z, size) = (3u64, 32u64);
    let plate = small_plate(dir.path(), z as u32, size as u32);
    let pipeline = dir.path().join("p.toml");
    std::fs::write(
        &pipeline,
        "[[steps]]\nname = \"max_z\"\nfunc = \"max_projection\"\nvariable_components = [\"z_index\"]\n\
         [[steps]]\nname = \"sites\"\nfunc = \"mean_projection\"\nvariable_components = [\"site\"]\ndevice = \"cpu\"\n",
    )
    .unwrap();
    let (out, report, trace) = (dir.path().join("out"), dir.path().join("r.json"), dir.path().join("t.json"));
    let o = hcsflow(&[
        "run",
        s(&plate),
        s(&pipeline),
        s(&out),
        "--device",
        "gpu",
        "--allow-software-gpu",
        "--report",
        s(&report),
        "--trace",
        s(&trace),
    ]);
    assert!(o.status.success(), "{}", stderr(&o));
    let r: serde_json::Value = serde_json::from_slice(&std::fs::read(&report).unwrap()).unwrap();
    // The report written into OUT says the same.
    let in_out: serde_json::Value = serde_json::from_slice(&std::fs::read(out.join("run_report.json")).unwrap()).unwrap();
    assert_eq!(r["wells"], in_out["wells"]);

    // max_z on the GPU: 2 stacks (one per site) of z u16 planes uploaded, one plane each read back.
    let plane = size * size * 2;
    let steps = &r["wells"][0]["steps"];
    let max_z = &steps[0];
    assert_eq!(max_z["step"], "max_z");
    assert_eq!(max_z["devices"], serde_json::json!(["gpu:0"]));
    let t = &max_z["transfers"];
    assert_eq!((t["uploaded_bytes"].as_u64(), t["uploads"].as_u64()), (Some(2 * z * plane), Some(2)), "{t}");
    assert_eq!((t["downloaded_bytes"].as_u64(), t["downloads"].as_u64()), (Some(2 * plane), Some(2)), "{t}");
    let used = serde_json::json!([{ "device": "gpu:0", "name": adapter.name, "backend": adapter.backend }]);
    assert_eq!(t["adapters"], used, "the adapter that moved the data");
    let wall = max_z["seconds"].as_f64().unwrap();
    assert!(wall > 0.0 && wall >= max_z["compute"].as_f64().unwrap(), "{max_z}");
    // Kernel time: one timed call per stack, within the step's compute time,
    // measured by GPU timestamps where the adapter has them.
    assert_eq!(t["kernel_calls"].as_u64(), Some(2), "{t}");
    let kernel = t["kernel_nanos"].as_u64().expect("kernel_nanos") as f64 * 1e-9;
    assert!(kernel > 0.0 && kernel <= max_z["compute"].as_f64().unwrap(), "kernel {kernel} s: {max_z}");
    let timing = t["kernel_timing"].as_str().expect("kernel_timing");
    assert!(timing == "device" || timing == "host", "{t}");
    // The pinned host step: no copy, no adapter.
    let sites = &steps[1];
    assert_eq!((sites["step"].as_str(), &sites["devices"]), (Some("sites"), &serde_json::json!(["cpu"])));
    assert_eq!((sites["transfers"]["uploads"].as_u64(), sites["transfers"]["downloads"].as_u64()), (Some(0), Some(0)));
    assert!(sites["transfers"].get("adapters").is_none(), "{sites}");
    assert!(sites["transfers"].get("kernel_nanos").is_none() && sites["transfers"].get("kernel_calls").is_none(), "{sites}");
    // Per step over all wells (one well here).
    assert_eq!(r["steps"][0]["transfers"], *t);

    // The trace: each copy is a span naming its bytes and adapter, inside the
    // conversion of a GPU call (upload) or the chain's way back (download).
    let events: Vec<serde_json::Value> = serde_json::from_slice(&std::fs::read(&trace).unwrap()).unwrap();
    let spans = common::intervals(&events);
    let named = |n: &str| spans.iter().filter(|s| s.name == n).collect::<Vec<_>>();
    let (uploads, downloads, conversions) = (named("gpu_upload"), named("gpu_download"), named("conversion"));
    assert_eq!(uploads.len(), 2, "{uploads:?}");
    for u in &uploads {
        // tracing-chrome writes integer fields as strings.
        assert_eq!(u.args["bytes"].as_str().and_then(|b| b.parse::<u64>().ok()), Some(z * plane), "{u:?}");
        assert_eq!(u.args["adapter"].as_str(), Some(adapter.name.as_str()));
        assert_eq!(u.args["backend"].as_str(), Some(adapter.backend.as_str()));
        assert!(conversions.iter().any(|c| c.tid == u.tid && common::within(u, c)), "upload inside a conversion: {u:?}");
    }
    assert_eq!(downloads.len(), 2, "{downloads:?}");
    for d in &downloads {
        assert!(conversions.iter().any(|c| c.tid == d.tid && common::within(d, c)), "download inside a conversion: {d:?}");
    }
    // Each call is a `gpu_call` span with its device time, between its
    // stack's upload and download; together they are the report's kernel time.
    let calls = named("gpu_call");
    assert_eq!(calls.len(), 2, "{calls:?}");
    let mut traced = 0u64;
    for c in &calls {
        assert_eq!(c.args["function"].as_str(), Some("max_projection"), "{c:?}");
        assert_eq!(c.args["adapter"].as_str(), Some(adapter.name.as_str()));
        assert_eq!(c.args["timing"].as_str(), Some(timing), "{c:?}");
        traced += c.args["kernel_ns"].as_str().and_then(|n| n.parse::<u64>().ok()).expect("kernel_ns");
        assert!(uploads.iter().any(|u| u.tid == c.tid && u.end <= c.start), "a call after its upload: {c:?}");
        assert!(downloads.iter().any(|d| d.tid == c.tid && d.start >= c.end), "a call before its download: {c:?}");
    }
    assert_eq!(Some(traced), t["kernel_nanos"].as_u64());
}

#[test]
fn a_bad_gpu_memory_is_a_usage_error_naming_the_flag() {
    let dir = tempfile::tempdir().unwrap();
    let plate = small_plate(dir.path(), 2, 32);
    let out = dir.path().join("out");
    let demo = demo_toml();
    for (value, problem) in [
        ("12Q", "--gpu-memory: bad size '12Q': expected a number with an optional K, M, G or T suffix"),
        ("0", "--gpu-memory: bad size '0': must be positive"),
        ("lots", "--gpu-memory: bad size 'lots': expected a number with an optional K, M, G or T suffix"),
    ] {
        let o = hcsflow(&["run", s(&plate), &demo, s(&out), "--device", "cpu", "--gpu-memory", value]);
        assert_eq!(o.status.code(), Some(2), "{value}: {}", stderr(&o));
        assert!(stderr(&o).contains(problem), "{value}: {}", stderr(&o));
        assert!(!out.exists(), "nothing written");
    }
    // A good one is accepted (the CPU run has no GPU budget to apply).
    let o = hcsflow(&["run", s(&plate), &demo, s(&out), "--device", "cpu", "--gpu-memory", "64K", "--dry-run"]);
    assert!(o.status.success(), "{}", stderr(&o));
}
