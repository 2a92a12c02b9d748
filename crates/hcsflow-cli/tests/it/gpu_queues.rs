//! One queue per worker and several GPUs, through the CLI (issue #22):
//! - two workers on one adapter submit their wells to two queues
//!   (`gpu:0/q0`, `gpu:0/q1`: each a wgpu device of its own); the report
//!   names each well's adapter and queue, and the trace's GPU copies name
//!   their queue, the two wells' copies interleaved in time;
//! - `--device gpu:0` runs on the first adapter (lavapipe in CI) and the plan
//!   and report name it for every well; `--device gpu:0,N` with no adapter N
//!   fails before anything is read, naming it; malformed lists are usage errors;
//! - a sharded run's finalized report names each well's adapter and queue.
//!
//! Without an adapter the GPU cases fail, unless HCSFLOW_SKIP_GPU_TESTS=1 outside CI.

use std::collections::{BTreeMap, BTreeSet};
use std::path::{Path, PathBuf};

use hcsflow_synth::{generate, SynthConfig};

use crate::common;
use common::{hcsflow, stderr};

fn have_gpu() -> bool {
    hcsflow_testkit::gpu_test_may_run(!hcsflow_gpu::discover_adapters().is_empty())
}

/// Wells A01 and A02, 2 × 2 sites, one u16 channel of 3 planes of 64².
fn plate(dir: &Path) -> PathBuf {
    let cfg = SynthConfig {
        wells: vec!["A01".into(), "A02".into()],
        grid_rows: 2,
        grid_cols: 2,
        channels: 1,
        z_planes: 3,
        size: 64,
        dtype: hcsflow_core::DType::U16,
        ..SynthConfig::default()
    };
    let plate = dir.join("plate");
    generate(&cfg, &plate).expect("generate");
    plate
}

/// Three GPU steps over Z: each stack (site) is uploaded and read back in each.
fn pipeline(dir: &Path) -> PathBuf {
    let path = dir.join("p.toml");
    std::fs::write(
        &path,
        "[[steps]]\nname = \"blur\"\nfunc = \"gaussian_blur\"\nvariable_components = [\"z_index\"]\n\
         [[steps]]\nname = \"blur_again\"\nfunc = \"gaussian_blur\"\nvariable_components = [\"z_index\"]\n\
         [[steps]]\nname = \"max_z\"\nfunc = \"max_projection\"\nvariable_components = [\"z_index\"]\n",
    )
    .unwrap();
    path
}

fn s(p: &Path) -> &str {
    p.to_str().unwrap()
}

#[test]
fn a_sharded_runs_report_names_each_wells_adapter_and_queue() {
    // Each shard runs one well on one worker (a shard writes no report);
    // --finalize merges them: the report names each well's adapter and queue
    // as a run of the whole plate does.
    if !have_gpu() {
        return;
    }
    let dir = tempfile::tempdir().unwrap();
    let (plate, pipeline) = (plate(dir.path()), pipeline(dir.path()));
    let out = dir.path().join("out");
    let gpu = ["--device", "gpu:0", "--allow-software-gpu", "--workers", "1"];
    for shard in ["1/2", "2/2"] {
        let o = hcsflow(&[&["run", s(&plate), s(&pipeline), s(&out), "--shard", shard][..], &gpu[..]].concat());
        assert!(o.status.success(), "{}", stderr(&o));
    }
    let o = hcsflow(&[&["run", s(&plate), s(&pipeline), s(&out), "--finalize"][..], &gpu[..]].concat());
    assert!(o.status.success(), "{}", stderr(&o));
    let report: serde_json::Value = serde_json::from_slice(&std::fs::read(out.join("run_report.json")).unwrap()).unwrap();
    let wells = report["wells"].as_array().unwrap();
    assert_eq!(wells.iter().map(|w| w["well"].as_str().unwrap()).collect::<Vec<_>>(), ["A01", "A02"]);
    for w in wells {
        assert_eq!(w["status"], "complete", "{w}");
        assert_eq!(w["adapter"], "gpu:0", "{w}");
        assert_eq!(w["queue"], "gpu:0/q0", "{w}");
    }
}

#[test]
fn two_workers_run_their_wells_on_their_own_queues_interleaved() {
    if !have_gpu() {
        return;
    }
    let dir = tempfile::tempdir().unwrap();
    let (plate, pipeline) = (plate(dir.path()), pipeline(dir.path()));
    let (out, trace) = (dir.path().join("out"), dir.path().join("t.json"));
    let gpu = ["--device", "gpu:0", "--allow-software-gpu"];

    // The plan names the adapter of every well.
    let o = hcsflow(&[&["run", s(&plate), s(&pipeline), s(&out), "--dry-run"][..], &gpu[..]].concat());
    assert!(o.status.success(), "{}", stderr(&o));
    let plan = String::from_utf8_lossy(&o.stdout);
    assert!(plan.contains("gpus: gpu:0 runs 2 wells (A01, A02)"), "{plan}");

    let o = hcsflow(&[&["run", s(&plate), s(&pipeline), s(&out), "--workers", "2", "--trace", s(&trace)][..], &gpu[..]].concat());
    assert!(o.status.success(), "{}", stderr(&o));

    // The report: every well on gpu:0, the two wells on two queues.
    let report: serde_json::Value = serde_json::from_slice(&std::fs::read(out.join("run_report.json")).unwrap()).unwrap();
    assert_eq!(report["workers"], 2);
    let mut queue_of: BTreeMap<String, String> = BTreeMap::new();
    for w in report["wells"].as_array().unwrap() {
        assert_eq!(w["status"], "complete", "{w}");
        assert_eq!(w["adapter"], "gpu:0", "{w}");
        queue_of.insert(w["queue"].as_str().unwrap().to_string(), w["well"].as_str().unwrap().to_string());
    }
    let queues: BTreeSet<&str> = queue_of.keys().map(String::as_str).collect();
    assert_eq!(queues, BTreeSet::from(["gpu:0/q0", "gpu:0/q1"]), "{queue_of:?}");

    // The trace: each well span names its queue, as the report does.
    let events: Vec<serde_json::Value> = serde_json::from_slice(&std::fs::read(&trace).unwrap()).unwrap();
    let spans = common::intervals(&events);
    for w in spans.iter().filter(|s| s.name == "well") {
        let (well, queue) = (w.args["well"].as_str().unwrap(), w.args["queue"].as_str().unwrap());
        assert_eq!(queue_of.get(queue).map(String::as_str), Some(well), "{w:?}");
    }
    // Every copy to or from the GPU names its queue: those of a queue are
    // the copies the report counts for its well (over both steps).
    let copies: Vec<&common::Interval> = spans.iter().filter(|s| s.name == "gpu_upload" || s.name == "gpu_download").collect();
    let mut by_queue: BTreeMap<&str, Vec<&common::Interval>> = BTreeMap::new();
    for c in &copies {
        by_queue.entry(c.args["queue"].as_str().unwrap()).or_default().push(c);
    }
    assert_eq!(by_queue.keys().copied().collect::<BTreeSet<_>>(), queues);
    for w in report["wells"].as_array().unwrap() {
        let counted: u64 = w["steps"]
            .as_array()
            .unwrap()
            .iter()
            .map(|st| st["transfers"]["uploads"].as_u64().unwrap() + st["transfers"]["downloads"].as_u64().unwrap())
            .sum();
        assert!(counted >= 24, "3 steps × 4 sites, each up and back at least: {w}");
        assert_eq!(by_queue[w["queue"].as_str().unwrap()].len() as u64, counted, "{w}");
    }

    // Interleaved: each well's copies lie partly inside the other's window
    // [its first copy's start, its last copy's end]. An ordering claim, not
    // a timing one, though not guaranteed by construction: the two workers
    // start their wells together, and the stacks of both wells' steps run
    // on the one rayon pool, which takes them in the order they come; a
    // well's next step comes after its current one, by when the other well's
    // step is waiting, so with three steps the wells' steps alternate unless
    // one worker is not scheduled for the whole of the other's run.
    let window = |c: &[&common::Interval]| {
        (c.iter().map(|i| i.start).fold(f64::INFINITY, f64::min), c.iter().map(|i| i.end).fold(f64::NEG_INFINITY, f64::max))
    };
    let (a, b) = (&by_queue["gpu:0/q0"], &by_queue["gpu:0/q1"]);
    let (wa, wb) = (window(a), window(b));
    let inside = |c: &[&common::Interval], (from, to): (f64, f64)| c.iter().filter(|i| i.start >= from && i.end <= to).count();
    let (a_in_b, b_in_a) = (inside(a, wb), inside(b, wa));
    let mut all: Vec<&&common::Interval> = copies.iter().collect();
    all.sort_by(|x, y| x.start.total_cmp(&y.start));
    let switches = all.windows(2).filter(|p| p[0].args["queue"] != p[1].args["queue"]).count();
    eprintln!(
        "q0 copies {:.1}..{:.1} ms, q1 {:.1}..{:.1} ms; q0 copies inside q1's window: {a_in_b}, q1's inside q0's: {b_in_a}; \
         queue switches in start order: {switches}",
        wa.0 / 1e3,
        wa.1 / 1e3,
        wb.0 / 1e3,
        wb.1 / 1e3
    );
    assert!(a_in_b > 0 && b_in_a > 0, "not interleaved: q0 {wa:?}, q1 {wb:?}");
}

#[test]
fn several_gpus_need_every_adapter_and_a_well_formed_list() {
    let dir = tempfile::tempdir().unwrap();
    let (plate, pipeline) = (plate(dir.path()), pipeline(dir.path()));
    let out = dir.path().join("out");
    let run = |device: &str| hcsflow(&["run", s(&plate), s(&pipeline), s(&out), "--device", device, "--allow-software-gpu", "--dry-run"]);
    // Malformed lists: usage errors (exit 2) saying what is wrong.
    for (device, problem) in [
        ("gpu:0,0", "bad device 'gpu:0,0': gpu:0 is listed twice; name each adapter once"),
        ("cpu,gpu:0", "bad device 'cpu,gpu:0': a run is on the CPU or on GPUs, not both"),
        ("gpu:0,x", "bad device 'gpu:0,x': expected auto, cpu, gpu or gpu:N, or gpu:N,M"),
    ] {
        let o = run(device);
        assert_eq!(o.status.code(), Some(2), "{device}: {}", stderr(&o));
        assert!(stderr(&o).contains(problem), "{device}: {}", stderr(&o));
    }
    if !have_gpu() {
        return;
    }
    // An adapter that is not there: refused at plan time, naming it and the
    // adapters found (exit 3, as for `--device gpu:N`: the device is not available).
    let adapters = hcsflow_gpu::discover_adapters();
    let missing = adapters.len();
    let device = format!("gpu:0,{missing}");
    let o = run(&device);
    assert_eq!(o.status.code(), Some(3), "{}", stderr(&o));
    let e = stderr(&o);
    assert!(e.contains(&format!("--device {device}: there is no adapter gpu:{missing}.")), "{e}");
    assert!(e.contains(&format!("gpu:0 {}", adapters[0].name)), "lists the adapters found: {e}");
    assert!(!out.exists(), "nothing written");
}
