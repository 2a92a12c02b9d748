//! The GPU memory budget (`RunOptions::gpu_memory`, `hcsflow run
//! --gpu-memory`): a stack over it runs in chunks of planes where its
//! functions allow it, with the same result as an unsplit run and the split
//! in the run report; a function that cannot split fails its well naming the
//! sizes. On the first adapter (lavapipe in CI): without one the tests fail,
//! unless HCSFLOW_SKIP_GPU_TESTS=1 outside CI. One process, one device.

#![cfg(feature = "wgpu")]

use std::path::{Path, PathBuf};

use hcsflow::core::{DType, DeviceRequest, Stack};
use hcsflow::pipeline::{GpuSplit, PipelineSpec, RunSummary};
use hcsflow::{DeviceOptions, Engine, RunOptions};
use hcsflow_synth::{generate, SynthConfig};

/// 30 planes of 64² u16: 240 KiB, over a 64 KiB budget.
const Z: u32 = 30;
const SIZE: u32 = 64;
const BUDGET: u64 = 64 << 10;

/// Options on the first adapter (software allowed), or `None` when skipped.
fn gpu() -> Option<DeviceOptions> {
    if !hcsflow_testkit::gpu_test_may_run(!hcsflow::discover_adapters().is_empty()) {
        return None;
    }
    Some(DeviceOptions { request: DeviceRequest::Gpu, allow_software_gpu: true, ..Default::default() })
}

/// One well, one site, one u16 channel of `Z` planes of `SIZE`².
fn plate(dir: &Path) -> PathBuf {
    let cfg = SynthConfig {
        wells: vec!["A01".into()],
        grid_rows: 1,
        grid_cols: 1,
        channels: 1,
        z_planes: Z,
        size: SIZE,
        dtype: DType::U16,
        ..SynthConfig::default()
    };
    let plate = dir.join("plate");
    generate(&cfg, &plate).expect("generate");
    plate
}

/// One step: the chain `functions` over Z.
fn pipeline(functions: &str) -> PipelineSpec {
    let text = format!("[[steps]]\nname = \"z\"\nfunc = {functions}\nvariable_components = [\"z_index\"]\nmaterialize = [\"tiff\"]\n");
    PipelineSpec::parse(&text, "t.toml").expect("pipeline")
}

fn run(plate: &Path, spec: &PipelineSpec, out: &Path, device: DeviceOptions, gpu_memory: Option<u64>) -> RunSummary {
    let engine = Engine::builtin();
    let options = RunOptions { device, workers: 1, gpu_memory, ..Default::default() };
    let plan = engine.plan_spec(plate, spec, out, &options).expect("plan");
    engine.execute(&plan, &options, Default::default(), &|_| {}).expect("execute")
}

/// Every TIFF under `dir`, by path relative to it, with its pixels.
fn images(dir: &Path) -> Vec<(PathBuf, Stack)> {
    let mut found = Vec::new();
    let mut pending = vec![dir.to_path_buf()];
    while let Some(d) = pending.pop() {
        for entry in std::fs::read_dir(&d).unwrap() {
            let path = entry.unwrap().path();
            if path.is_dir() {
                pending.push(path);
            } else if path.extension().is_some_and(|e| e == "tif") {
                let stack = hcsflow::tiff::read_stack(&path).unwrap();
                found.push((path.strip_prefix(dir).unwrap().to_path_buf(), stack));
            }
        }
    }
    found.sort_by(|a, b| a.0.cmp(&b.0));
    found
}

fn split(stack: &str, functions: &[&str], planes: usize, chunks: usize, chunk_planes: usize) -> (String, Vec<String>, usize, usize, usize) {
    (stack.into(), functions.iter().map(|f| f.to_string()).collect(), planes, chunks, chunk_planes)
}

fn shape(s: &GpuSplit) -> (String, Vec<String>, usize, usize, usize) {
    (s.stack.clone(), s.functions.clone(), s.planes, s.chunks, s.chunk_planes)
}

#[test]
fn a_stack_over_the_budget_runs_in_chunks_with_the_unsplit_result() {
    let Some(device) = gpu() else { return };
    let dir = tempfile::tempdir().unwrap();
    let plate = plate(dir.path());
    let spec = pipeline("[\"gaussian_blur\", \"max_projection\"]");
    let host = run(&plate, &spec, &dir.path().join("cpu"), DeviceOptions::cpu(), None);
    let whole = run(&plate, &spec, &dir.path().join("gpu"), device, None);
    let chunked = run(&plate, &spec, &dir.path().join("chunks"), device, Some(BUDGET));
    for s in [&host, &whole, &chunked] {
        assert!(s.failed.is_empty(), "{:?}", s.failed);
    }

    // The same pixels, bit for bit, as the host run and the unsplit GPU run.
    let expected = images(&dir.path().join("cpu"));
    assert_eq!(expected.len(), 1, "one max projection");
    assert_eq!(expected[0].1.shape(), [1, SIZE as usize, SIZE as usize]);
    assert_eq!(expected[0].1.dtype(), DType::U16);
    assert_eq!(images(&dir.path().join("gpu")), expected, "unsplit GPU run vs host");
    assert_eq!(images(&dir.path().join("chunks")), expected, "GPU run in chunks vs host");

    // The default budget (the adapter's largest binding) holds the stack whole.
    let whole_report = &whole.report;
    assert_eq!(whole_report.gpu_memory, hcsflow::default_gpu_memory(hcsflow::core::Device::Gpu(0)));
    assert!(whole_report.wells[0].steps[0].splits.is_empty(), "{:?}", whole_report.wells[0].steps[0].splits);
    assert_eq!(host.report.gpu_memory, None, "no GPU, no budget");

    // How it split. A u16 plane of 64² through gaussian_blur needs 8 KiB in,
    // 16 KiB out (f32) and 32 KiB of scratch: 56 KiB, so one plane per chunk,
    // each reduced by max_projection; then max_projection combines the 30
    // maxima (16 KiB each, 16 KiB out): 3 per chunk, 30 → 10 → 4 → 2, and
    // the last 2 fit whole.
    let r = &chunked.report;
    assert_eq!(r.gpu_memory, Some(BUDGET));
    let step = &r.wells[0].steps[0];
    let at = step.splits[0].stack.clone();
    let expected_splits = vec![
        split(&at, &["gaussian_blur", "max_projection"], 30, 30, 1),
        split(&at, &["max_projection"], 30, 10, 3),
        split(&at, &["max_projection"], 10, 4, 3),
        split(&at, &["max_projection"], 4, 2, 3),
    ];
    assert_eq!(step.splits.iter().map(shape).collect::<Vec<_>>(), expected_splits);
    assert_eq!(at, "site 1, channel 1, z 1, t 1", "the stack, by its first plane");
    assert!(
        step.splits[0].reason.starts_with(&format!(
            "gaussian_blur needs 1.6 MiB on {Z} planes of {SIZE}×{SIZE} pixels, over the budget of 64.0 KiB; chunks of 1 plane fit"
        )),
        "{}",
        step.splits[0].reason
    );
    assert_eq!(r.steps[0].split_stacks, 4);
    // Every chunk went through the GPU: 30 planes uploaded as chunks of one,
    // 30 + 10 + 4 + 2 maxima uploaded again to be combined (f32).
    let (plane_u16, plane_f32) = (u64::from(SIZE * SIZE) * 2, u64::from(SIZE * SIZE) * 4);
    let uploaded_pixels = u64::from(Z) * plane_u16 + (30 + 10 + 4 + 2) * plane_f32;
    assert!(step.transfers.uploaded_bytes >= uploaded_pixels, "{:?}", step.transfers);
    // The run report on disk says the same.
    let json: serde_json::Value = serde_json::from_slice(&std::fs::read(dir.path().join("chunks/run_report.json")).unwrap()).unwrap();
    assert_eq!(json["gpu_memory"], BUDGET);
    // And the QC report.
    let html = std::fs::read_to_string(dir.path().join("chunks").join(hcsflow::pipeline::REPORT_HTML_NAME)).unwrap();
    assert!(
        html.contains("GPU memory budget</td><td>0.06 MiB per call and stack · 4 stacks ran in chunks of planes"),
        "budget line missing"
    );
    assert!(html.contains(" · 4 in chunks</td>"), "the step's line says it split");
    assert_eq!(json["wells"][0]["steps"][0]["splits"][0]["chunks"], 30);
    assert_eq!(json["wells"][0]["steps"][0]["splits"][3]["functions"], serde_json::json!(["max_projection"]));
    let text = hcsflow::summary_text(
        &hcsflow::Engine::builtin()
            .plan_spec(&plate, &spec, &dir.path().join("chunks"), &RunOptions { device, ..Default::default() })
            .unwrap(),
        &chunked,
    );
    assert!(text.contains("GPU memory: 4 stack(s) ran in chunks of planes (budget 64.0 KiB, --gpu-memory)"), "{text}");
}

#[test]
fn a_function_that_cannot_split_fails_its_well_with_the_sizes() {
    let Some(device) = gpu() else { return };
    let dir = tempfile::tempdir().unwrap();
    let plate = plate(dir.path());

    // Whole-stack normalisation (pure_3d): 240 KiB in, 480 KiB out (f32), 512 KiB of
    // histogram and look-up table = 1.2 MiB, and no chunks allowed.
    let spec = pipeline("[\"stack_percentile_normalize\", \"max_projection\"]");
    let summary = run(&plate, &spec, &dir.path().join("a"), device, Some(BUDGET));
    assert_eq!(summary.failed.len(), 1, "{:?}", summary.failed);
    let e = &summary.failed[0].error;
    assert!(
        e.contains(&format!(
            "stack_percentile_normalize needs 1.2 MiB of GPU memory for {Z} planes of {SIZE}×{SIZE} pixels (input, output and scratch), \
             over the budget of 64.0 KiB (--gpu-memory); stack_percentile_normalize cannot run in chunks of planes: it is pure_3d \
             (it sees the whole stack); no chunk tried; fix: a larger --gpu-memory"
        )),
        "{e}"
    );
    assert!(e.starts_with("step 'z': stack at site 1, channel 1, z 1, t 1: "), "{e}");
    assert!(summary.report.wells[0].steps[0].splits.is_empty());
    assert_eq!(summary.report.wells[0].steps[0].transfers.uploads, 0, "nothing ran, on any device");

    // Per-plane normalisation splits, but one u16 plane already needs 536 KiB
    // (8 KiB in, 16 KiB out, 512 KiB of histogram and look-up table).
    let spec = pipeline("[\"percentile_normalize\"]");
    let summary = run(&plate, &spec, &dir.path().join("b"), device, Some(BUDGET));
    assert_eq!(summary.failed.len(), 1, "{:?}", summary.failed);
    let e = &summary.failed[0].error;
    assert!(e.contains("percentile_normalize needs 15.7 MiB of GPU memory for 30 planes"), "{e}");
    assert!(e.contains("a chunk of 1 plane already needs 536.0 KiB; largest chunk tried: 1 plane; fix:"), "{e}");
    // With room for 4 planes (2.1 MiB) it runs in chunks of 4, as on the host.
    let summary = run(&plate, &spec, &dir.path().join("c"), device, Some((4 * 536) << 10));
    assert!(summary.failed.is_empty(), "{:?}", summary.failed);
    let splits = &summary.report.wells[0].steps[0].splits;
    assert_eq!(splits.iter().map(|s| (s.planes, s.chunks, s.chunk_planes)).collect::<Vec<_>>(), [(30, 8, 4)]);
    let host = run(&plate, &spec, &dir.path().join("d"), DeviceOptions::cpu(), None);
    assert!(host.failed.is_empty());
    assert_eq!(images(&dir.path().join("c")), images(&dir.path().join("d")), "chunks of 4 vs host");
}
