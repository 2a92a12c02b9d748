//! Pipelines end to end on small synthetic plates: each func form, map
//! policies, pipeline_start, compile errors naming the step, numeric results,
//! per-well failure isolation, resume, and the input plate left untouched.

use crate::common;

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};

use hcsflow::builtin;
use hcsflow_core::{ArgSpec, Contract, Conversions, Device, FunctionSpec, Implementation, Registry, Stack};
use hcsflow_pipeline::{
    compile, execute, Action, CompileConfig, Manifest, PipelineError, PipelineSpec, Plan, RunOptions, RunSummary, COLLAPSED,
};
use hcsflow_plate::{open_plate, Plate};
use hcsflow_synth::SynthConfig;
use hcsflow_testkit::snapshot;
use ndarray::{Array3, Axis};

/// A 2-well (A01, B02), 3×3-site, 2-channel, 3-z, 64² ImageXpress plate.
fn synth(dir: &Path, wells: &[&str]) -> PathBuf {
    let cfg = SynthConfig { size: 64, z_planes: 3, wells: wells.iter().map(|w| w.to_string()).collect(), ..SynthConfig::default() };
    common::synth_plate(&dir.join("plate"), &cfg)
}

/// `builtin()` plus a host-only pure_2d function with an argument, to test
/// chains, arguments and the no-GPU-implementation error.
fn registry() -> (Registry, Conversions) {
    let (mut r, c) = builtin();
    r.register(
        FunctionSpec {
            name: "test_add",
            doc: "adds `value` to every pixel (test only)",
            contract: Contract::Pure2d,
            args: vec![ArgSpec::int("value", 1, Some(0), Some(1000), "added")],
        },
        Implementation::host(|s, args, _| {
            let v = match args.get("value") {
                Some(hcsflow_core::ArgValue::Int(v)) => *v as u16,
                other => panic!("value is a declared integer argument, got {other:?}"),
            };
            match s {
                Stack::U16(a) => Ok(Stack::from(a.view().mapv(|x| x.saturating_add(v)))),
                other => Ok(other.clone()),
            }
        }),
    );
    (r, c)
}

fn config(out: &Path, device: Device) -> CompileConfig {
    CompileConfig { device, ..common::cpu_config(out, Default::default()) }
}

fn plan_for(plate: &Plate, toml: &str, out: &Path) -> Result<Plan, PipelineError> {
    common::compile_with(&registry(), plate, toml, &config(out, Device::Cpu))
}

fn run(plan: &Plan, resume: bool) -> RunSummary {
    let options = RunOptions { workers: 2, resume, ..RunOptions::default() };
    common::run_with(&registry(), plan, &options).expect("execute")
}

fn read(path: &Path) -> Stack {
    hcsflow_tiff::read_stack(path).unwrap_or_else(|e| panic!("{}: {e}", path.display()))
}

fn u16_planes(plate: &Plate, well: &str, site: u32, channel: u32) -> Vec<Array3<u16>> {
    (1..=3)
        .map(|z| match read(&plate.image(well, site, channel, z, 1).expect("image").path) {
            Stack::U16(a) => a.into_array(),
            other => panic!("expected u16, got {}", other.dtype()),
        })
        .collect()
}

fn max_of(planes: &[Array3<u16>]) -> Array3<u16> {
    let mut m = planes[0].clone();
    for p in &planes[1..] {
        m.zip_mut_with(p, |a, &b| *a = (*a).max(b));
    }
    m
}

fn step_error_text(e: &PipelineError) -> String {
    e.to_string()
}

use common::MAX_Z;

#[test]
fn max_projection_matches_per_pixel_max_and_plate_is_untouched() {
    let dir = tempfile::tempdir().unwrap();
    let root = synth(dir.path(), &["A01", "B02"]);
    let before = snapshot(&root);
    let plate = common::open(&root);
    let out = dir.path().join("out");
    let plan = plan_for(&plate, MAX_Z, &out).unwrap();
    // 9 sites × 2 channels stacks of 3 z planes per well.
    assert_eq!(plan.wells.len(), 2);
    for w in &plan.wells {
        assert_eq!(w.steps[0].groups.len(), 18);
        assert!(w.steps[0].groups.iter().all(|g| g.inputs.len() == 3 && g.outputs.len() == 1));
        assert!(w.steps[0].groups.iter().all(|g| g.outputs[0].key[2] == COLLAPSED));
    }
    let summary = run(&plan, false);
    assert_eq!(summary.completed, ["A01", "B02"]);
    assert!(summary.failed.is_empty());
    for well in ["A01", "B02"] {
        for (site, channel) in [(1, 1), (5, 2), (9, 1)] {
            let expected = max_of(&u16_planes(&plate, well, site, channel));
            let path = out.join(format!("max_z/TimePoint_1/Synth_Plate_1_{well}_s{site}_w{channel}.tif"));
            assert_eq!(read(&path), Stack::from(expected), "{}", path.display());
        }
    }
    // The CSV summary lists every output (header + 2 wells × 18).
    let csv = std::fs::read_to_string(out.join("summary.csv")).unwrap();
    assert_eq!(csv.lines().count(), 1 + 36, "{csv}");
    assert!(csv.lines().nth(1).unwrap().starts_with("A01,max_z,1,1,,1,"), "{csv}");
    // The report has timings, routes and the peak RSS.
    let r = &summary.report;
    assert!(r.input_bytes > 0 && r.mb_per_s > 0.0);
    assert_eq!(r.steps[0].chains[0].routes.len(), 2);
    assert!(r.peak_rss_bytes.unwrap_or(0) > 0);
    assert_eq!(snapshot(&root), before, "the input plate changed");
}

#[test]
fn each_func_form_compiles_to_the_expected_chains() {
    let dir = tempfile::tempdir().unwrap();
    let root = synth(dir.path(), &["A01"]);
    let plate = common::open(&root);
    let out = dir.path().join("out");
    let forms = [
        (r#"func = "max_projection""#, vec![vec!["max_projection"]]),
        (r#"func = { name = "test_add", args = { value = 5 } }"#, vec![vec!["test_add"]]),
        (r#"func = ["test_add", { name = "max_projection" }]"#, vec![vec!["test_add", "max_projection"]]),
        (
            "[steps.func]\n1 = \"max_projection\"\nGFP = [\"test_add\", \"mean_projection\"]",
            vec![vec!["max_projection"], vec!["test_add", "mean_projection"]],
        ),
    ];
    for (func, chains) in forms {
        let toml = format!("[[steps]]\nname = \"s\"\nvariable_components = [\"z_index\"]\n{func}\n");
        let plan = plan_for(&plate, &toml, &out).unwrap_or_else(|e| panic!("{func}: {e}"));
        let got: Vec<Vec<&str>> = plan.steps[0].chains.iter().map(|c| c.calls.iter().map(|c| c.function).collect()).collect();
        assert_eq!(got, chains, "{func}");
    }
    // The map's channel name resolves to the channel number.
    let toml =
        "[[steps]]\nname = \"s\"\nvariable_components = [\"z_index\"]\n[steps.func]\n1 = \"max_projection\"\nGFP = \"mean_projection\"\n";
    let plan = plan_for(&plate, toml, &out).unwrap();
    let values: Vec<Option<u32>> = plan.steps[0].chains.iter().map(|c| c.group_value).collect();
    assert_eq!(values, [Some(1), Some(2)]);
}

#[test]
fn chain_with_args_and_map_run_numerically() {
    let dir = tempfile::tempdir().unwrap();
    let root = synth(dir.path(), &["A01"]);
    let plate = common::open(&root);
    let out = dir.path().join("out");
    let toml = r#"
[[steps]]
name = "proj"
variable_components = ["z_index"]
materialize = ["tiff"]
[steps.func]
DAPI = [{ name = "test_add", args = { value = 7 } }, "max_projection"]
2 = "max_projection"
"#;
    let plan = plan_for(&plate, toml, &out).unwrap();
    let s = run(&plan, false);
    assert!(s.failed.is_empty(), "{:?}", s.failed);
    let m1 = max_of(&u16_planes(&plate, "A01", 4, 1)).mapv(|v| v.saturating_add(7));
    let m2 = max_of(&u16_planes(&plate, "A01", 4, 2));
    assert_eq!(read(&out.join("proj/TimePoint_1/Synth_Plate_1_A01_s4_w1.tif")), Stack::from(m1));
    assert_eq!(read(&out.join("proj/TimePoint_1/Synth_Plate_1_A01_s4_w2.tif")), Stack::from(m2));
}

#[test]
fn missing_groups_policies() {
    let dir = tempfile::tempdir().unwrap();
    let root = synth(dir.path(), &["A01"]);
    let plate = common::open(&root);
    let toml = |policy: &str| {
        format!(
            "[[steps]]\nname = \"proj\"\nvariable_components = [\"z_index\"]\nmaterialize = [\"tiff\"]\n{policy}\n[steps.func]\n1 = \"max_projection\"\n"
        )
    };
    // Default: a compile error naming the step, the channel and the fix.
    let e = plan_for(&plate, &toml(""), &dir.path().join("o0")).unwrap_err();
    let text = step_error_text(&e);
    assert!(text.contains("step 'proj'") && text.contains("no entry for channel 2 (GFP)") && text.contains("missing_groups"), "{text}");
    let e = plan_for(&plate, &toml("missing_groups = \"error\""), &dir.path().join("o0")).unwrap_err();
    assert!(e.is_usage());

    // passthrough: channel 2's planes go on unchanged (and are written under their own names).
    let out = dir.path().join("pass");
    let plan = plan_for(&plate, &toml("missing_groups = \"passthrough\""), &out).unwrap();
    let groups = &plan.wells[0].steps[0].groups;
    assert_eq!(groups.iter().filter(|g| g.action == Action::Passthrough).count(), 9); // channel 2 of each site
    assert!(run(&plan, false).failed.is_empty());
    let z2 = &u16_planes(&plate, "A01", 3, 2)[1];
    assert_eq!(read(&out.join("proj/TimePoint_1/ZStep_2/Synth_Plate_1_A01_s3_w2.tif")), Stack::from(z2.clone()));
    assert!(out.join("proj/TimePoint_1/Synth_Plate_1_A01_s3_w1.tif").exists());

    // skip: channel 2 is dropped.
    let out = dir.path().join("skip");
    let plan = plan_for(&plate, &toml("missing_groups = \"skip\""), &out).unwrap();
    assert!(run(&plan, false).failed.is_empty());
    let csv = std::fs::read_to_string(out.join("summary.csv")).unwrap();
    assert_eq!(csv.lines().count(), 1 + 9, "{csv}");
    assert!(!csv.contains("_w2"), "{csv}");
}

#[test]
fn pipeline_start_rereads_the_original_planes() {
    let dir = tempfile::tempdir().unwrap();
    let root = synth(dir.path(), &["A01"]);
    let plate = common::open(&root);
    let out = dir.path().join("out");
    // Step 1 collapses z; step 2 would have nothing to project over z unless it re-reads the plate.
    let toml = r#"
[[steps]]
name = "max_z"
func = "max_projection"
variable_components = ["z_index"]

[[steps]]
name = "plus"
func = { name = "test_add", args = { value = 3 } }
input_source = "pipeline_start"
variable_components = ["z_index"]
materialize = ["tiff"]
"#;
    let plan = plan_for(&plate, toml, &out).unwrap();
    assert_eq!(plan.wells[0].steps[1].groups.len(), 18);
    assert!(plan.wells[0].steps[1].groups.iter().all(|g| g.inputs.len() == 3 && g.inputs.iter().all(|k| k[2] != COLLAPSED)));
    assert!(run(&plan, false).failed.is_empty());
    let z3 = u16_planes(&plate, "A01", 2, 1)[2].mapv(|v| v.saturating_add(3));
    assert_eq!(read(&out.join("plus/TimePoint_1/ZStep_3/Synth_Plate_1_A01_s2_w1.tif")), Stack::from(z3));
    assert!(!out.join("max_z").exists(), "max_z is not materialised");
}

#[test]
fn compile_errors_name_the_step_and_the_fix() {
    let dir = tempfile::tempdir().unwrap();
    let root = synth(dir.path(), &["A01"]);
    let plate = common::open(&root);
    let out = dir.path().join("out");
    let cases = [
        (r#"func = "max_projektion""#, "did you mean 'max_projection'"),
        (r#"func = { name = "test_add", args = { valeu = 2 } }"#, "unknown argument 'valeu'"),
        (r#"func = { name = "test_add", args = { value = 5000 } }"#, "out of range"),
        (r#"func = { name = "test_add", args = { value = { a = 1 } } }"#, "cannot be table"),
        (r#"func = { name = "test_add", args = { value = [1, 2] } }"#, "expects an integer"),
        ("func = 3", "func cannot be integer"),
        ("func = []", "empty list"),
        ("[steps.func]\n1 = \"max_projection\"\nCy5 = \"max_projection\"", "func map key 'Cy5' is not a channel"),
        ("[steps.func]\n1 = \"max_projection\"\n7 = \"max_projection\"", "func map key '7' is not a channel"),
        ("[steps.func]\n1 = \"max_projection\"\nDAPI = \"max_projection\"", "both mean channel 1"),
        ("func = \"max_projection\"\ngroup_by = \"z_index\"", "also a variable component"),
        ("func = \"max_projection\"\ndtype = \"u12\"", "unknown dtype 'u12'"),
        ("func = \"max_projection\"\nvariable_components = [\"well\"]", "processed one at a time"),
    ];
    for (body, needle) in cases {
        // The first line of `body` may itself set variable_components.
        let vc = if body.contains("variable_components") { "" } else { "variable_components = [\"z_index\"]\n" };
        let toml = format!("[[steps]]\nname = \"bad_step\"\n{vc}{body}\n");
        let e = plan_for(&plate, &toml, &out).expect_err(body);
        let text = e.to_string();
        assert!(text.contains("step 'bad_step'"), "{body}: {text}");
        assert!(text.contains(needle), "{body}: expected '{needle}' in: {text}");
        assert!(text.contains("fix:"), "{body}: {text}");
        assert!(e.is_usage());
    }
    // Unknown keys in a step are refused by the parser (typos are not ignored).
    let e = PipelineSpec::parse("[[steps]]\nname = \"s\"\nfunc = \"max_projection\"\nvaraible_components = []\n", "p.toml").unwrap_err();
    assert!(e.to_string().contains("varaible_components"), "{e}");
    // Several problems are reported together.
    let toml = "[[steps]]\nname = \"a\"\nfunc = \"nope\"\n[[steps]]\nname = \"b\"\nfunc = \"nope2\"\n";
    let text = plan_for(&plate, toml, &out).unwrap_err().to_string();
    assert!(text.contains("step 'a'") && text.contains("step 'b'"), "{text}");
    // Output inside the plate is refused.
    let e = plan_for(&plate, MAX_Z, &root.join("out")).unwrap_err();
    assert!(e.to_string().contains("inside the input plate"), "{e}");
}

#[test]
fn gpu_plan_has_no_silent_cpu_fallback() {
    let dir = tempfile::tempdir().unwrap();
    let root = synth(dir.path(), &["A01"]);
    let plate = common::open(&root);
    let (r, c) = registry();
    let out = dir.path().join("out");
    // max_projection has a wgpu implementation: the plan uploads, runs on wgpu, downloads.
    let spec = PipelineSpec::parse(MAX_Z, "t").unwrap();
    let plan = compile(&plate, &spec, &r, &c, &config(&out, Device::Gpu(0))).unwrap();
    let chain = &plan.steps[0].chains[0];
    assert_eq!(chain.calls[0].implementation.memory_in, hcsflow_core::MemoryType::Wgpu);
    assert_eq!(chain.calls[0].route_in.method, "upload");
    assert_eq!(chain.route_out.method, "download");
    // test_add is host-only: on a GPU it is a compile error, not a CPU fallback.
    let spec = PipelineSpec::parse("[[steps]]\nname = \"g\"\nfunc = [\"test_add\", \"max_projection\"]\n", "t").unwrap();
    let e = compile(&plate, &spec, &r, &c, &config(&out, Device::Gpu(0))).unwrap_err();
    let text = e.to_string();
    assert!(
        text.contains("step 'g'") && text.contains("test_add has no implementation for gpu:0") && text.contains("--device cpu"),
        "{text}"
    );
    // Pinned with device = "cpu", the host-only step runs on the host; the others stay on the GPU.
    let pinned = "[[steps]]\nname = \"g\"\nfunc = \"test_add\"\ndevice = \"cpu\"\n[[steps]]\nname = \"m\"\nfunc = \"max_projection\"\nvariable_components = [\"z_index\"]\n";
    let spec = PipelineSpec::parse(pinned, "t").unwrap();
    let plan = compile(&plate, &spec, &r, &c, &config(&out, Device::Gpu(0))).unwrap();
    assert_eq!(plan.steps[0].chains[0].calls[0].device, Device::Cpu);
    assert_eq!(plan.steps[1].chains[0].calls[0].device, Device::Gpu(0));
    let spec = PipelineSpec::parse(&pinned.replace("device = \"cpu\"", "device = \"gpu\""), "t").unwrap();
    let text = compile(&plate, &spec, &r, &c, &config(&out, Device::Gpu(0))).unwrap_err().to_string();
    assert!(text.contains("step 'g'") && text.contains("not a step device"), "{text}");
}

/// Copies a plate folder (so a test can corrupt the copy, never the original).
fn copy_tree(from: &Path, to: &Path) {
    std::fs::create_dir_all(to).unwrap();
    for e in std::fs::read_dir(from).unwrap() {
        let e = e.unwrap();
        let target = to.join(e.file_name());
        if e.file_type().unwrap().is_dir() {
            copy_tree(&e.path(), &target);
        } else {
            std::fs::copy(e.path(), &target).unwrap();
        }
    }
}

#[test]
fn a_failing_well_does_not_lose_the_others_and_resume_completes_it() {
    let dir = tempfile::tempdir().unwrap();
    let original = synth(dir.path(), &["A01", "A02", "B01"]);
    let root = dir.path().join("copy");
    copy_tree(&original, &root);
    let bad = root.join("TimePoint_1/ZStep_2/Synth_Plate_1_A02_s5_w1.tif");
    let good_bytes = std::fs::read(&bad).unwrap();
    std::fs::write(&bad, b"II*\0garbage, not a TIFF").unwrap();
    let plate = common::open(&root);

    // Reference: an uninterrupted run on the intact plate.
    let reference = dir.path().join("reference");
    let intact = open_plate(&original, None).unwrap();
    let plan = plan_for(&intact, MAX_Z, &reference).unwrap();
    assert_eq!(run(&plan, false).completed.len(), 3);

    let out = dir.path().join("out");
    let plan = plan_for(&plate, MAX_Z, &out).unwrap();
    let before = snapshot(&root);
    let s = run(&plan, false);
    assert_eq!(s.completed, ["A01", "B01"]);
    assert_eq!(s.failed.len(), 1);
    assert_eq!(s.failed[0].well, "A02");
    assert!(s.failed[0].error.contains("Synth_Plate_1_A02_s5_w1.tif"), "{}", s.failed[0].error);
    assert_eq!(snapshot(&root), before, "the input plate changed");
    let manifest = Manifest::read(&out).unwrap().unwrap();
    assert_eq!(manifest.wells["A01"].status, hcsflow_pipeline::WellStatus::Complete);
    assert_eq!(manifest.wells["A02"].status, hcsflow_pipeline::WellStatus::Failed);
    assert!(!out.join("max_z/TimePoint_1/Synth_Plate_1_A02_s1_w1.tif").exists() || manifest.wells["A02"].outputs.is_empty());

    // Fix the file, resume: only A02 runs; the output equals the uninterrupted run's.
    std::fs::write(&bad, good_bytes).unwrap();
    let s = run(&plan, true);
    assert_eq!(s.skipped, ["A01", "B01"]);
    assert_eq!(s.completed, ["A02"]);
    assert!(s.failed.is_empty());
    let files = |root: &Path| -> BTreeMap<PathBuf, Vec<u8>> {
        snapshot(&root.join("max_z"))
            .into_keys()
            .filter(|p| p.is_file() && p.extension().is_some_and(|e| e == "tif"))
            .map(|p| (p.strip_prefix(root).unwrap().to_path_buf(), std::fs::read(&p).unwrap()))
            .collect()
    };
    // The images (the step folder's hcsflow-plate.json names the plate each run read).
    let (a, b) = (files(&out), files(&reference));
    assert_eq!(a.len(), 54);
    assert!(a == b, "resumed output differs from the uninterrupted run");
    assert_eq!(std::fs::read(out.join("summary.csv")).unwrap(), std::fs::read(reference.join("summary.csv")).unwrap());

    // A different pipeline refuses to resume into the same folder.
    let other = plan_for(&plate, &MAX_Z.replace("max_projection", "mean_projection"), &out).unwrap();
    let (r, c) = registry();
    let options = RunOptions { resume: true, ..RunOptions::default() };
    let e = execute(&other, &r, &c, &options, &|_| {}).unwrap_err();
    assert!(e.to_string().contains("different pipeline"), "{e}");
}

#[test]
fn memory_budget_and_cancellation() {
    let dir = tempfile::tempdir().unwrap();
    let root = synth(dir.path(), &["A01", "A02", "A03"]);
    let plate = common::open(&root);
    let out = dir.path().join("out");
    let plan = plan_for(&plate, MAX_Z, &out).unwrap();
    let (r, c) = registry();
    // A budget below one well still runs every well, one at a time.
    let options = RunOptions { workers: 3, max_memory: Some(1), ..RunOptions::default() };
    let s = execute(&plan, &r, &c, &options, &|_| {}).unwrap();
    assert_eq!(s.completed.len(), 3);
    // Cancelled before the start: nothing starts, nothing is half-written.
    let out2 = dir.path().join("out2");
    let plan = plan_for(&plate, MAX_Z, &out2).unwrap();
    let options = RunOptions { workers: 2, ..RunOptions::default() };
    options.cancel.store(true, std::sync::atomic::Ordering::SeqCst);
    let s = execute(&plan, &r, &c, &options, &|_| {}).unwrap();
    assert_eq!(s.not_started, ["A01", "A02", "A03"]);
    assert!(!out2.join("max_z").exists());
}

#[test]
fn example_pipelines_parse_and_compile() {
    let dir = tempfile::tempdir().unwrap();
    // 5 z planes: mega_flex.toml deconvolves each tile's z-stack with a PSF 5 planes deep.
    let cfg = SynthConfig { size: 64, z_planes: 5, wells: vec!["A01".into()], ..SynthConfig::default() };
    let plate = common::open(&common::synth_plate(&dir.path().join("plate"), &cfg));
    let examples = Path::new(env!("CARGO_MANIFEST_DIR")).join("../../examples");
    let mut n = 0;
    for e in std::fs::read_dir(&examples).unwrap() {
        let path = e.unwrap().path();
        if path.extension().is_some_and(|x| x == "toml") {
            let spec = PipelineSpec::read(&path).unwrap_or_else(|e| panic!("{e}"));
            let (r, c) = builtin();
            compile(&plate, &spec, &r, &c, &config(&dir.path().join("out"), Device::Cpu))
                .unwrap_or_else(|e| panic!("{}: {e}", path.display()));
            n += 1;
        }
    }
    assert!(n >= 3);
}

#[test]
fn plates_with_a_collapsed_axis_can_be_grouped_again() {
    // max over z, then the 9 sites of each channel averaged: 2 planes per well.
    let dir = tempfile::tempdir().unwrap();
    let root = synth(dir.path(), &["A01"]);
    let plate = common::open(&root);
    let out = dir.path().join("out");
    let toml = std::fs::read_to_string(Path::new(env!("CARGO_MANIFEST_DIR")).join("../../examples/chain.toml")).unwrap();
    let plan = plan_for(&plate, &toml, &out).unwrap();
    assert_eq!(plan.wells[0].steps[1].groups.len(), 2);
    assert!(run(&plan, false).failed.is_empty());
    let expected: Array3<f32> = {
        let maxes: Vec<Array3<f32>> = (1..=9).map(|s| max_of(&u16_planes(&plate, "A01", s, 2)).mapv(f32::from)).collect();
        let mut sum = Array3::<f32>::zeros(maxes[0].raw_dim());
        for m in &maxes {
            sum += m;
        }
        sum / 9.0
    };
    let Stack::F32(got) = read(&out.join("site_mean/TimePoint_1/Synth_Plate_1_A01_s1_w2.tif")) else { panic!("not f32") };
    let diff = (&got.view() - &expected).mapv(f32::abs).fold(0.0f32, |a, &b| a.max(b));
    assert!(diff < 1e-2, "max diff {diff}");
    let _ = Axis(0);
}

#[test]
fn zarr_materialisation_writes_an_ome_zarr_plate() {
    let dir = tempfile::tempdir().unwrap();
    let root = synth(dir.path(), &["A01", "B02"]);
    let plate = common::open(&root);
    let out = dir.path().join("out");
    let toml = MAX_Z.replace("materialize = [\"tiff\"]", "materialize = [\"tiff\", \"zarr\"]");
    let plan = plan_for(&plate, &toml, &out).unwrap();
    let s = run(&plan, false);
    assert!(s.failed.is_empty(), "{:?}", s.failed);
    let zarr = out.join("Synth_Plate_1.ome.zarr");
    assert_eq!(s.zarr_plates, std::slice::from_ref(&zarr));
    let meta: serde_json::Value = serde_json::from_slice(&std::fs::read(zarr.join("zarr.json")).unwrap()).unwrap();
    let plate_meta = &meta["attributes"]["ome"]["plate"];
    let wells: Vec<&str> = plate_meta["wells"].as_array().unwrap().iter().map(|w| w["path"].as_str().unwrap()).collect();
    assert_eq!(wells, ["A/1", "B/2"], "{meta}");
    // 9 fields per well, each [t=1, c=2, z=1 (collapsed), y, x] with channel names.
    let well: serde_json::Value = serde_json::from_slice(&std::fs::read(zarr.join("B/2/zarr.json")).unwrap()).unwrap();
    assert_eq!(well["attributes"]["ome"]["well"]["images"].as_array().unwrap().len(), 9, "{well}");
    let field: serde_json::Value = serde_json::from_slice(&std::fs::read(zarr.join("B/2/8/0/zarr.json")).unwrap()).unwrap();
    assert_eq!(field["shape"], serde_json::json!([1, 2, 1, 64, 64]), "{field}");
    let image: serde_json::Value = serde_json::from_slice(&std::fs::read(zarr.join("B/2/8/zarr.json")).unwrap()).unwrap();
    let labels: Vec<&str> = image["attributes"]["ome"]["omero"]["channels"]
        .as_array()
        .map(|c| c.iter().filter_map(|c| c["label"].as_str()).collect())
        .unwrap_or_default();
    assert_eq!(labels, ["DAPI", "GFP"], "{image}");
}
