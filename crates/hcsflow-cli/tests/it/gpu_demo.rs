//! The demo pipeline (`examples/demo.toml`) executed with `--device gpu` on a
//! software Vulkan adapter (lavapipe), compared with `--device cpu`.
//!
//! On a machine whose only adapter is a software one (this machine, CI):
//! without the allowance the run exits 3 naming the adapter; with
//! `--allow-software-gpu` the dry run shows every demo function on the GPU
//! with its upload/download routes, the run completes, the report says so,
//! and every output plane agrees with the CPU run:
//! - `channels_max_z` (max-Z of the raw planes): bit-exact;
//! - `max_z` (percentile normalisation → channel composite → max-Z): also
//!   bit-exact, because the GPU kernels mirror the host implementations
//!   operation for operation (measured on lavapipe: max |gpu − cpu| = 0).
//!
//! Without any adapter the test fails (CI installs lavapipe);
//! `HCSFLOW_SKIP_GPU_TESTS=1` skips it, except under `CI=true`.

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::process::Command;

use hcsflow_core::Stack;
use hcsflow_synth::{generate, SynthConfig};

use crate::common;
use common::{hcsflow, intervals, stderr, within, Interval};

fn demo_toml() -> String {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("../../examples/demo.toml").to_string_lossy().into_owned()
}

/// Relative path → image of every TIFF under `out/<step>`.
fn images(out: &Path, step: &str) -> BTreeMap<PathBuf, Stack> {
    let mut found = BTreeMap::new();
    let mut dirs = vec![out.join(step)];
    while let Some(d) = dirs.pop() {
        for e in std::fs::read_dir(&d).unwrap_or_else(|e| panic!("{}: {e}", d.display())) {
            let p = e.unwrap().path();
            if p.is_dir() {
                dirs.push(p);
            } else if !p.file_name().unwrap().to_string_lossy().starts_with('.') && p.extension().is_some_and(|e| e == "tif") {
                let s = hcsflow_tiff::read_stack(&p).unwrap_or_else(|e| panic!("{}: {e}", p.display()));
                found.insert(p.strip_prefix(out).unwrap().to_path_buf(), s);
            }
        }
    }
    found
}

fn max_abs_diff(a: &Stack, b: &Stack) -> f32 {
    assert_eq!((a.dtype(), a.shape()), (b.dtype(), b.shape()));
    a.to_f32().iter().zip(b.to_f32().iter()).map(|(x, y)| (x - y).abs()).fold(0.0, f32::max)
}

#[test]
fn demo_pipeline_on_lavapipe_gpu_agrees_with_cpu() {
    let adapters = hcsflow_gpu::discover_adapters();
    if !hcsflow_testkit::gpu_test_may_run(!adapters.is_empty()) {
        return;
    }
    let dir = tempfile::tempdir().unwrap();
    let plate = dir.path().join("plate");
    let cfg = SynthConfig {
        wells: vec!["A01".into(), "B02".into()],
        grid_rows: 2,
        grid_cols: 2,
        z_planes: 3,
        size: 64,
        ..SynthConfig::default()
    };
    generate(&cfg, &plate).expect("generate");
    let (plate, demo) = (plate.to_string_lossy().into_owned(), demo_toml());
    let out_of = |name: &str| dir.path().join(name).to_string_lossy().into_owned();

    if adapters.iter().all(|a| a.is_software()) {
        let o = hcsflow(&["run", &plate, &demo, &out_of("refused"), "--device", "gpu"]);
        assert_eq!(o.status.code(), Some(3), "{}", stderr(&o));
        let e = stderr(&o);
        assert!(e.contains(&adapters[0].name), "names the software adapter '{}': {e}", adapters[0].name);
        assert!(e.contains("--allow-software-gpu"), "says how to allow it: {e}");
        assert!(!dir.path().join("refused").exists(), "nothing written on a refused device");
    }

    let o = hcsflow(&["run", &plate, &demo, &out_of("dry"), "--device", "gpu", "--allow-software-gpu", "--dry-run"]);
    assert!(o.status.success(), "{}", stderr(&o));
    let plan = String::from_utf8_lossy(&o.stdout);
    assert!(plan.contains("device: gpu:0"), "{plan}");
    for function in ["stack_percentile_normalize", "composite", "max_projection", "assemble"] {
        let on_gpu = plan.lines().any(|l| l.contains(&format!("chain: {function} (")) && l.ends_with("wgpu → wgpu on gpu:0)"));
        assert!(on_gpu, "{function} on the GPU: {plan}");
        assert!(plan.contains(&format!("route into {function}: host → wgpu (device copy, upload)")), "{function} upload route: {plan}");
    }
    assert!(plan.contains("route out: wgpu → host (device copy, download)"), "{plan}");
    // assemble gets its positions from the positions step: no download inside it.
    assert!(!plan.contains("route inside"), "{plan}");
    // Without that step, the wgpu assemble registers the tiles on the host, and the plan says so.
    let alone = dir.path().join("assemble.toml");
    std::fs::write(&alone, "[[steps]]\nname = \"mosaic\"\nfunc = \"assemble\"\nvariable_components = [\"site\"]\n").unwrap();
    let alone = alone.to_string_lossy().into_owned();
    let o = hcsflow(&["run", &plate, &alone, &out_of("dry2"), "--device", "gpu", "--allow-software-gpu", "--dry-run"]);
    assert!(o.status.success(), "{}", stderr(&o));
    let text = String::from_utf8_lossy(&o.stdout);
    let inside = "route inside assemble (no 'positions' from an earlier step; it registers the tiles on the host): wgpu → host (device copy, download)";
    assert!(text.contains(inside), "{text}");
    // Only the steps pinned with device = "cpu" (host-only functions) run on the host, visibly.
    let on_cpu: Vec<&str> = plan.lines().filter(|l| l.contains("on cpu)")).collect();
    assert_eq!(on_cpu.len(), 2, "{plan}");
    for function in ["tile_positions", "count_cells"] {
        assert!(on_cpu.iter().any(|l| l.contains(&format!("chain: {function} ("))), "{function} pinned to the host: {plan}");
    }

    let (cpu, gpu) = (out_of("cpu"), out_of("gpu"));
    let (report, trace) = (out_of("gpu-report.json"), out_of("gpu-trace.json"));
    let o = hcsflow(&["run", &plate, &demo, &cpu, "--device", "cpu"]);
    assert!(o.status.success(), "{}", stderr(&o));
    let o = Command::new(env!("CARGO_BIN_EXE_hcsflow"))
        .args(["run", &plate, &demo, &gpu, "--device", "gpu", "--report", &report, "--trace", &trace])
        .env("HCSFLOW_ALLOW_SOFTWARE_GPU", "1")
        .output()
        .unwrap();
    assert!(o.status.success(), "{}", stderr(&o));
    let r: serde_json::Value = serde_json::from_slice(&std::fs::read(&report).unwrap()).unwrap();
    assert_eq!(r["device"], "gpu:0");
    assert!(r["failures"].as_array().unwrap().is_empty(), "{r}");
    let functions = r["steps"][0]["chains"][0]["functions"][0].as_str().unwrap();
    assert!(functions.contains("wgpu → wgpu on gpu:0"), "{functions}");
    assert_eq!(r["steps"][0]["chains"][0]["routes"][0]["kind"], "device_copy", "{r}");
    // The trace shows each upload as a conversion span inside its GPU call,
    // and host calls without one.
    let events: Vec<serde_json::Value> = serde_json::from_slice(&std::fs::read(&trace).unwrap()).unwrap();
    let spans = intervals(&events);
    let conversions: Vec<&Interval> = spans.iter().filter(|s| s.name == "conversion").collect();
    let calls: Vec<&Interval> = spans.iter().filter(|s| s.name == "call").collect();
    let on = |c: &Interval, device: &str| c.args["device"].as_str().is_some_and(|d| d.starts_with(device));
    let (gpu_calls, cpu_calls) = (calls.iter().filter(|c| on(c, "gpu")).count(), calls.iter().filter(|c| on(c, "cpu")).count());
    assert!(gpu_calls > 0 && cpu_calls > 0, "{calls:?}");
    for c in &calls {
        let uploads = conversions
            .iter()
            .filter(|v| v.tid == c.tid && within(v, c) && v.args["route"].as_str().is_some_and(|r| r.contains("upload")))
            .count();
        assert_eq!(uploads, usize::from(on(c, "gpu")), "one upload span inside each GPU call, none in host calls: {c:?}");
    }

    for step in ["channels_max_z", "max_z", "mosaic", "count"] {
        let (c, g) = (images(Path::new(&cpu), step), images(Path::new(&gpu), step));
        assert_eq!(c.keys().collect::<Vec<_>>(), g.keys().collect::<Vec<_>>(), "{step}: same files");
        let expected = match step {
            "max_z" => 2 * 4,  // well × site
            "mosaic" => 2 * 2, // well × channel
            "count" => 2,      // well (DAPI)
            _ => 2 * 4 * 2,    // well × site × channel
        };
        assert_eq!(c.len(), expected, "{step}: planes");
        let worst = c.iter().map(|(p, a)| max_abs_diff(a, &g[p])).fold(0.0, f32::max);
        assert_eq!(worst, 0.0, "{step}: max |gpu − cpu| = {worst}; the GPU kernels are bit-exact with the host");
    }
    // Same positions and counts (computed on the host from bit-exact GPU images).
    for table in ["positions/positions.csv", "count/counts.csv", "count/objects.csv"] {
        let read = |root: &str| std::fs::read_to_string(Path::new(root).join(table)).unwrap();
        assert_eq!(read(&cpu), read(&gpu), "{table}");
    }
}
