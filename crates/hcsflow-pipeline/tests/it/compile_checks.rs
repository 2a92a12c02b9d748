//! Argument errors knowable before any pixel is read fail compile (a usage
//! error naming the step, the function, the argument and the stack shape it
//! was checked against), as do step names that collide with hcsflow's own
//! files in OUT. `tests/corpus/*.toml` holds one case per file; its
//! `# expect:` lines are fragments the error message must contain.

use crate::common;

use std::path::{Path, PathBuf};

use hcsflow::builtin;
use hcsflow_core::{Array, ConversionPolicy, Device, FunctionError, MemoryType, Stack, StackShape};
use hcsflow_pipeline::{PipelineError, Plan};
use hcsflow_plate::Plate;
use hcsflow_synth::SynthConfig;
use ndarray::Array3;

/// One well, 2×2 sites, 2 channels, 2 z planes, 64² pixels (the probe's plate).
fn plate(dir: &Path) -> Plate {
    let root = dir.join("plate");
    let cfg = SynthConfig {
        size: 64,
        z_planes: 2,
        channels: 2,
        grid_rows: 2,
        grid_cols: 2,
        wells: vec!["A01".into()],
        nuclei_density: 20.0,
        ..SynthConfig::default()
    };
    common::open(&common::synth_plate(&root, &cfg))
}

fn compile_text(plate: &Plate, toml: &str, out: &Path) -> Result<Plan, PipelineError> {
    common::compile_text(plate, toml, out)
}

fn corpus() -> Vec<PathBuf> {
    let dir = Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/corpus");
    let mut files: Vec<PathBuf> = std::fs::read_dir(&dir)
        .unwrap_or_else(|e| panic!("{}: {e}", dir.display()))
        .map(|e| e.expect("dir entry").path())
        .filter(|p| p.extension().is_some_and(|e| e == "toml"))
        .collect();
    files.sort();
    files
}

#[test]
fn every_corpus_case_is_a_usage_error_at_compile_naming_the_problem() {
    let dir = tempfile::tempdir().expect("tempdir");
    let plate = plate(dir.path());
    let files = corpus();
    assert!(files.len() >= 18, "corpus has {} cases", files.len());
    for file in files {
        let text = std::fs::read_to_string(&file).expect("read case");
        let expect: Vec<&str> = text.lines().filter_map(|l| l.strip_prefix("# expect: ")).collect();
        assert!(!expect.is_empty(), "{}: no '# expect:' line", file.display());
        let err = match compile_text(&plate, &text, &dir.path().join("out")) {
            Ok(_) => panic!("{}: compiled, expected a usage error", file.display()),
            Err(e) => e,
        };
        assert!(err.is_usage(), "{}: not a usage error (exit 2): {err}", file.display());
        let message = err.to_string();
        for fragment in expect {
            assert!(message.contains(fragment), "{}: message lacks {fragment:?}:\n{message}", file.display());
        }
        assert!(message.contains("fix: "), "{}: no fix in:\n{message}", file.display());
    }
}

#[test]
fn arguments_valid_for_the_plate_still_compile() {
    let dir = tempfile::tempdir().expect("tempdir");
    let plate = plate(dir.path());
    let out = dir.path().join("out");
    for toml in [
        // Odd median, ordered percentiles, equal or per-plane weights, a bin and crop that fit.
        r#"name = "x"
[[steps]]
name = "a"
func = [{ name = "median_filter", args = { size = 5 } }, { name = "percentile_normalize", args = { low_percentile = 1, high_percentile = 99 } }]"#,
        r#"name = "x"
[[steps]]
name = "a"
func = { name = "composite", args = { weights = [0, 2] } }
variable_components = ["channel"]
group_by = "none""#,
        // The crop fits the binned 32×32 plane; the mask index counts from the end.
        r#"name = "x"
[[steps]]
name = "a"
func = [{ name = "bin", args = { factor = 2 } }, { name = "crop", args = { y = 2, height = 30 } }]
[[steps]]
name = "b"
func = { name = "apply_mask", args = { mask_index = -2 } }
variable_components = ["channel"]
group_by = "none""#,
        // A kernel as large as the plane; a 64-pixel bin after a projection (one plane of 64²).
        r#"name = "x"
[[steps]]
name = "a"
func = [{ name = "max_projection" }, { name = "clahe", args = { kernel_size = 64 } }, { name = "bin", args = { factor = 64 } }]
variable_components = ["z_index"]"#,
    ] {
        if let Err(e) = compile_text(&plate, toml, &out) {
            panic!("{toml}\nrefused: {e}");
        }
    }
}

#[test]
fn a_later_step_is_checked_against_the_shape_the_earlier_step_returns() {
    let dir = tempfile::tempdir().expect("tempdir");
    let plate = plate(dir.path());
    // Step a bins 64² planes to 16²; step b's 20-pixel bin then does not fit.
    let toml = r#"name = "x"
[[steps]]
name = "a"
func = { name = "bin", args = { factor = 4 } }
[[steps]]
name = "b"
func = { name = "bin", args = { factor = 20 } }"#;
    let message = compile_text(&plate, toml, &dir.path().join("out")).expect_err("bin 20 on 16²").to_string();
    assert!(message.contains("step 'b'") && message.contains("factor 20 is larger than the 16x16 plane"), "{message}");
    // The same step reading the plate again sees 64² planes.
    let restart = format!("{toml}\ninput_source = \"pipeline_start\"");
    compile_text(&plate, &restart, &dir.path().join("out")).expect("bin 20 on the plate's 64² planes");
}

#[test]
fn map_entries_are_checked_with_their_label() {
    let dir = tempfile::tempdir().expect("tempdir");
    let plate = plate(dir.path());
    let toml = r#"name = "x"
[[steps]]
name = "a"
[steps.func]
1 = { name = "median_filter", args = { size = 3 } }
2 = { name = "median_filter", args = { size = 6 } }"#;
    let message = compile_text(&plate, toml, &dir.path().join("out")).expect_err("size 6").to_string();
    assert!(message.contains("func map entry '2': median_filter: argument 'size': size must be odd, got 6"), "{message}");
    assert!(message.contains("channel 2"), "{message}");
    assert!(!message.contains("entry '1'"), "{message}");
}

#[test]
fn the_registry_runs_the_same_check_on_the_real_stack() {
    // What `hcsflow apply` and any caller that skipped compile meet: the
    // check with the stack's real shape, before the kernel runs.
    let (registry, conversions) = builtin();
    let function = registry.get("apply_mask").expect("apply_mask");
    let args = function.parse_args(&["mask_index=99".to_string()]).expect("args in range");
    let plan =
        registry.plan_call("apply_mask", args, MemoryType::Host, Device::Cpu, &conversions, ConversionPolicy::default()).expect("plan");
    let shape = StackShape::new(2, 8, 8);
    let message = registry.check_call(&plan, &shape).expect_err("index 99 of 2 planes").to_string();
    assert!(message.contains("mask_index 99 is not a plane of this 2-plane stack"), "{message}");
    assert!(message.contains("2 planes of 8×8 pixels"), "{message}");
    let stack = Stack::from(Array3::<u16>::zeros((2, 8, 8)));
    match registry.execute(&plan, Array::from(stack), &conversions) {
        Err(FunctionError::Args(e)) => assert!(e.to_string().contains("mask_index 99"), "{e}"),
        other => panic!("expected an argument error, got {other:?}"),
    }
}
