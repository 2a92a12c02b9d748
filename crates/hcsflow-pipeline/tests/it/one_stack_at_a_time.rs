//! A function declared one stack at a time (`FunctionDecl::with_one_stack_at_a_time`,
//! e.g. `n2v_denoise`): the executor runs a well's stacks for that step one
//! after another, where it otherwise runs them side by side; the outputs are
//! the same either way.

use crate::common;

use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::Duration;

use hcsflow::builtin;
use hcsflow_core::{Contract, FunctionDecl, NoArgs, Registry, Stack};
use hcsflow_pipeline::RunOptions;
use hcsflow_synth::SynthConfig;

/// Calls in flight now and at most, per function.
struct Concurrency {
    now: AtomicUsize,
    most: AtomicUsize,
}

impl Concurrency {
    const fn new() -> Self {
        Concurrency { now: AtomicUsize::new(0), most: AtomicUsize::new(0) }
    }

    /// Counts a call in flight for a while, then returns `stack` unchanged.
    fn hold(&self, stack: &Stack) -> Stack {
        let now = self.now.fetch_add(1, Ordering::SeqCst) + 1;
        self.most.fetch_max(now, Ordering::SeqCst);
        // Long enough for a second rayon thread to steal a sibling stack.
        std::thread::sleep(Duration::from_millis(30));
        self.now.fetch_sub(1, Ordering::SeqCst);
        stack.clone()
    }
}

static ALONE_CALLS: Concurrency = Concurrency::new();
static SIDE_BY_SIDE_CALLS: Concurrency = Concurrency::new();

static ALONE: FunctionDecl<NoArgs> =
    FunctionDecl::new("test_alone", Contract::Pure3d, "identity, one stack at a time (test only)").with_one_stack_at_a_time();
static SIDE_BY_SIDE: FunctionDecl<NoArgs> = FunctionDecl::new("test_side_by_side", Contract::Pure3d, "identity (test only)");

fn registry() -> (Registry, hcsflow_core::Conversions) {
    let (mut r, c) = builtin();
    r.add(ALONE.host(|s, _, _| Ok(ALONE_CALLS.hold(s))));
    r.add(SIDE_BY_SIDE.host(|s, _, _| Ok(SIDE_BY_SIDE_CALLS.hold(s))));
    (r, c)
}

/// One step over z stacks (9 sites × 2 channels = 18 stacks in the well),
/// the function's output as TIFF.
fn pipeline(func: &str) -> String {
    format!("name = \"p\"\n[[steps]]\nname = \"s\"\nfunc = \"{func}\"\nvariable_components = [\"z_index\"]\nmaterialize = [\"tiff\"]\n")
}

#[test]
fn a_step_calling_a_one_stack_at_a_time_function_runs_its_stacks_in_turn() {
    let dir = tempfile::tempdir().unwrap();
    let cfg = SynthConfig { size: 32, z_planes: 2, wells: vec!["A01".into()], ..SynthConfig::default() };
    let plate = common::open(&common::synth_plate(&dir.path().join("plate"), &cfg));
    let functions = registry();
    let mut outputs = Vec::new();
    for (func, calls) in [("test_side_by_side", &SIDE_BY_SIDE_CALLS), ("test_alone", &ALONE_CALLS)] {
        let out = dir.path().join(func);
        let plan = common::compile_with(&functions, &plate, &pipeline(func), &common::cpu_config(&out, Default::default())).unwrap();
        assert_eq!(plan.steps[0].runs_one_stack_at_a_time(), func == "test_alone");
        let summary = common::run_with(&functions, &plan, &RunOptions::default()).unwrap();
        assert_eq!(summary.completed, ["A01"], "{:?}", summary.failed);
        let most = calls.most.load(Ordering::SeqCst);
        if func == "test_alone" {
            assert_eq!(most, 1, "stacks of a one-stack-at-a-time step overlapped");
        } else if rayon::current_num_threads() >= 2 {
            // The control: without the declaration the same step's stacks overlap.
            assert!(most >= 2, "stacks never overlapped without the declaration (most in flight {most})");
        }
        let files = tiffs(&out.join("s"), &out.join("s"));
        assert_eq!(files.len(), 18 * 2, "one TIFF per plane of each stack");
        outputs.push(files);
    }
    assert!(outputs[0] == outputs[1], "the same identity step wrote different images one stack at a time");
}

/// Every TIFF under `dir` (recursively) as (path relative to `root`, bytes), sorted.
fn tiffs(root: &Path, dir: &Path) -> Vec<(PathBuf, Vec<u8>)> {
    let mut found = Vec::new();
    for entry in std::fs::read_dir(dir).unwrap() {
        let path = entry.unwrap().path();
        if path.is_dir() {
            found.extend(tiffs(root, &path));
        } else if path.extension().is_some_and(|x| x.eq_ignore_ascii_case("tif")) {
            found.push((path.strip_prefix(root).unwrap().to_path_buf(), std::fs::read(&path).unwrap()));
        }
    }
    found.sort();
    found
}
