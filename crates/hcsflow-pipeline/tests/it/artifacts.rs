//! Artifacts between steps and injected metadata: positions computed on the
//! composite and used to assemble each channel (checked against the synthetic
//! plate's true tile positions and against the stitching library), count and
//! object tables, fallback notes in the report, and wiring errors at compile time.

use crate::common;

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};

use hcsflow::builtin;
use hcsflow_core::{ArtifactDecl, Artifacts, Contract, FunctionSpec, Implementation, Stack};
use hcsflow_pipeline::{compile, CompileConfig, PipelineError, PipelineSpec, Plan, RunOptions, RunSummary};
use hcsflow_plate::Plate;
use hcsflow_synth::SynthConfig;

/// A 1-well 3×3 plate of `size`² tiles, 2 channels, 1 z plane; nuclei dense
/// enough that every overlap has texture unless `blank`.
fn synth(dir: &Path, size: u32, blank: bool) -> PathBuf {
    let cfg = SynthConfig {
        size,
        z_planes: 1,
        wells: vec!["B03".into()],
        nuclei_density: if blank { 0.0 } else { 600.0 },
        ..SynthConfig::default()
    };
    common::synth_plate(&dir.join("plate"), &cfg)
}

fn config(out: &Path) -> CompileConfig {
    common::cpu_config(out, Default::default())
}

fn plan_for(plate: &Plate, toml: &str, out: &Path) -> Result<Plan, PipelineError> {
    common::compile_text(plate, toml, out)
}

fn run(plan: &Plan) -> RunSummary {
    common::run_with(&builtin(), plan, &RunOptions::default()).expect("execute")
}

/// CSV → rows of (column → text).
fn read_csv(path: &Path) -> Vec<BTreeMap<String, String>> {
    let text = std::fs::read_to_string(path).unwrap_or_else(|e| panic!("{}: {e}", path.display()));
    let mut lines = text.lines();
    let header: Vec<&str> = lines.next().expect("header").split(',').collect();
    lines.map(|l| header.iter().map(|h| h.to_string()).zip(l.split(',').map(str::to_string)).collect()).collect()
}

fn num(row: &BTreeMap<String, String>, col: &str) -> f64 {
    row[col].parse().unwrap_or_else(|_| panic!("{col} = {:?}", row[col]))
}

const STITCH: &str = r#"
name = "stitch"
[[steps]]
name = "composite"
func = "composite"
variable_components = ["channel"]
group_by = "none"

[[steps]]
name = "positions"
func = "tile_positions"
variable_components = ["site"]
group_by = "none"

[[steps]]
name = "mosaic"
func = "assemble"
variable_components = ["site"]
input_source = "pipeline_start"
materialize = ["tiff"]
"#;

#[test]
fn positions_from_the_composite_assemble_every_channel() {
    let dir = tempfile::tempdir().unwrap();
    let root = synth(dir.path(), 256, false);
    let plate = common::open(&root);
    let out = dir.path().join("out");
    let plan = plan_for(&plate, STITCH, &out).unwrap();
    // The mosaic step consumes the positions of the positions step.
    let mosaic = &plan.steps[2];
    assert_eq!(mosaic.consumes.len(), 1);
    assert_eq!((mosaic.consumes[0].name.as_str(), mosaic.consumes[0].from_step), ("positions", Some(1)));
    assert_eq!(plan.steps[1].produces, ["positions", "edges"]);
    let summary = run(&plan);
    assert_eq!(summary.completed, ["B03"], "{:?}", summary.failed);

    // Positions agree with the plate's ground truth up to a common offset.
    let ours = read_csv(&out.join("positions/positions.csv"));
    let truth = read_csv(&root.join("ground_truth/tile_positions.csv"));
    assert_eq!(ours.len(), 9);
    let site = |r: &BTreeMap<String, String>| r["site"].parse::<u32>().unwrap();
    let by_site: BTreeMap<u32, (f64, f64)> = truth.iter().map(|r| (site(r), (num(r, "x_px"), num(r, "y_px")))).collect();
    let (ox, oy) = (num(&ours[0], "x_px") - by_site[&site(&ours[0])].0, num(&ours[0], "y_px") - by_site[&site(&ours[0])].1);
    let mut worst: f64 = 0.0;
    for r in &ours {
        assert_eq!(r["well"], "B03");
        assert_eq!((r["channel"].as_str(), r["z_index"].as_str()), ("", "1"), "collapsed components are empty");
        let (tx, ty) = by_site[&site(r)];
        worst = worst.max((num(r, "x_px") - ox - tx).abs()).max((num(r, "y_px") - oy - ty).abs());
    }
    assert!(worst <= 0.5, "max position error {worst} px");
    // The per-well file and the summary of artifacts.
    assert_eq!(read_csv(&out.join("positions/positions/B03.csv")), ours);
    let listed = read_csv(&out.join("artifacts.csv"));
    assert_eq!(
        listed.iter().map(|r| (r["artifact"].as_str(), r["rows"].as_str())).collect::<Vec<_>>(),
        [("positions", "9"), ("edges", "12")]
    );
    assert_eq!(read_csv(&out.join("positions/edges.csv")).len(), 12, "3×3 grid: 12 overlaps");

    // Each channel's mosaic is the library's assembly of that channel's tiles
    // at the composite's positions.
    let positions: Vec<(f64, f64)> = {
        let mut v: Vec<(u32, (f64, f64))> = ours.iter().map(|r| (site(r), (num(r, "x_px"), num(r, "y_px")))).collect();
        v.sort_by_key(|(s, _)| *s);
        v.into_iter().map(|(_, p)| p).collect()
    };
    for channel in [1, 2] {
        let tiles: Vec<Stack> =
            (1..=9).map(|s| hcsflow_tiff::read_stack(&plate.image("B03", s, channel, 1, 1).unwrap().path).unwrap()).collect();
        let expected = hcsflow_stitch::assemble(&Stack::concat(&tiles).unwrap(), &positions, hcsflow_stitch::Blend::Linear).unwrap();
        let written = hcsflow_tiff::read_stack(&out.join(format!("mosaic/TimePoint_1/Synth_Plate_1_B03_s1_w{channel}.tif"))).unwrap();
        assert_eq!(written, expected, "channel {channel}");
    }
    assert!(summary.report.notes.is_empty(), "{:?}", summary.report.notes);
}

#[test]
fn counts_and_objects_are_tables_per_image() {
    let dir = tempfile::tempdir().unwrap();
    let root = synth(dir.path(), 128, false);
    let plate = common::open(&root);
    let out = dir.path().join("out");
    let toml = r#"
[[steps]]
name = "count"
variable_components = ["site"]
func = { name = "count_cells", args = { method = "threshold" } }
"#;
    let summary = run(&plan_for(&plate, toml, &out).unwrap());
    assert_eq!(summary.completed, ["B03"], "{:?}", summary.failed);
    let counts = read_csv(&out.join("count/counts.csv"));
    let objects = read_csv(&out.join("count/objects.csv"));
    // One count per image (9 sites × 2 channels), rows keyed by site and channel.
    assert_eq!(counts.len(), 18);
    for channel in [1u32, 2] {
        for site in 1..=9u32 {
            let key = |r: &&BTreeMap<String, String>| r["site"] == site.to_string() && r["channel"] == channel.to_string();
            let count: Vec<&BTreeMap<String, String>> = counts.iter().filter(key).collect();
            assert_eq!(count.len(), 1);
            let n = objects.iter().filter(key).count();
            assert_eq!(num(count[0], "count") as usize, n, "site {site} channel {channel}");
            // The same numbers as the library on that image.
            let image = hcsflow_tiff::read_stack(&plate.image("B03", site, channel, 1, 1).unwrap().path).unwrap();
            let lib = hcsflow_ops::count::count_cells(
                &image,
                &hcsflow_ops::count::CountMethod::Threshold {
                    method: hcsflow_ops::threshold::ThresholdMethod::Otsu,
                    connectivity: hcsflow_ops::label::Connectivity::Eight,
                    min_area: 10,
                    max_area: 100_000,
                },
            )
            .unwrap();
            assert_eq!(lib.counts.rows[0].count, n);
        }
    }
    assert!(counts.iter().map(|r| num(r, "count")).sum::<f64>() > 0.0);
}

#[test]
fn a_blank_grid_falls_back_to_stage_positions_and_the_report_says_so() {
    let dir = tempfile::tempdir().unwrap();
    let root = synth(dir.path(), 128, true);
    let plate = common::open(&root);
    let out = dir.path().join("out");
    let summary = run(&plan_for(&plate, STITCH, &out).unwrap());
    assert_eq!(summary.completed, ["B03"], "{:?}", summary.failed);
    let notes = &summary.report.notes;
    assert_eq!(notes.len(), 1, "{notes:?}");
    assert_eq!((notes[0].well.as_str(), notes[0].step.as_str()), ("B03", "positions"));
    assert!(notes[0].text.contains("stage"), "{}", notes[0].text);
    let manifest = hcsflow_pipeline::Manifest::read(&out).unwrap().unwrap();
    assert_eq!(manifest.wells["B03"].notes, *notes, "notes survive in the manifest (resume)");
    // Every tile sits at its stage position.
    for r in read_csv(&out.join("positions/positions.csv")) {
        assert_eq!(r["stage_only"], "true");
        assert!((num(&r, "x_px") - num(&r, "stage_x_px")).abs() < 1e-9);
    }
}

/// A function that needs an artifact nobody produces, to test the wiring errors.
fn registry_with_consumer() -> (hcsflow_core::Registry, hcsflow_core::Conversions) {
    let (mut r, c) = builtin();
    r.register_with_artifacts(
        FunctionSpec { name: "needs_labels", doc: "test only", contract: Contract::Pure3d, args: vec![] },
        Artifacts { produces: vec![], consumes: vec![ArtifactDecl::table("labels", "test")] },
        Implementation::host(|s, _, _| Ok(s.clone())),
    );
    (r, c)
}

fn compile_error(plate: &Plate, toml: &str, out: &Path) -> String {
    let (r, c) = registry_with_consumer();
    let spec = PipelineSpec::parse(toml, "test.toml").unwrap();
    match compile(plate, &spec, &r, &c, &config(out)) {
        Ok(_) => panic!("compiled:\n{toml}"),
        Err(e) => {
            assert!(e.is_usage());
            e.to_string()
        }
    }
}

#[test]
fn artifact_wiring_errors_name_the_step_and_the_fix() {
    let dir = tempfile::tempdir().unwrap();
    let root = synth(dir.path(), 64, false);
    let plate = common::open(&root);
    let out = dir.path().join("out");
    // No producer of a required artifact.
    let e = compile_error(&plate, "[[steps]]\nname = \"a\"\nfunc = \"needs_labels\"\n", &out);
    assert!(e.contains("step 'a'") && e.contains("needs the 'labels' artifact") && e.contains("fix:"), "{e}");
    // artifacts_from: unknown step, later step, a step that does not produce it, an artifact not consumed.
    let e = compile_error(&plate, "[[steps]]\nname = \"m\"\nfunc = \"assemble\"\nartifacts_from = { positions = \"nope\" }\n", &out);
    assert!(e.contains("no step is named 'nope'"), "{e}");
    let later = "[[steps]]\nname = \"m\"\nfunc = \"assemble\"\nartifacts_from = { positions = \"p\" }\n[[steps]]\nname = \"p\"\nfunc = \"tile_positions\"\n";
    assert!(compile_error(&plate, later, &out).contains("step 'p' does not run before this one"));
    let wrong = "[[steps]]\nname = \"p\"\nfunc = \"max_projection\"\nvariable_components = [\"z_index\"]\n[[steps]]\nname = \"m\"\nfunc = \"assemble\"\nartifacts_from = { positions = \"p\" }\n";
    let e = compile_error(&plate, wrong, &out);
    assert!(e.contains("step 'p' does not produce 'positions'") && e.contains("tile_positions"), "{e}");
    let unused =
        "[[steps]]\nname = \"p\"\nfunc = \"max_projection\"\nvariable_components = [\"z_index\"]\nartifacts_from = { positions = \"p\" }\n";
    assert!(compile_error(&plate, unused, &out).contains("no function of this step consumes"));
    // Positions per channel cannot serve stacks that mix channels.
    let mismatch = r#"
[[steps]]
name = "p"
func = "tile_positions"
variable_components = ["site"]
[[steps]]
name = "m"
func = "assemble"
variable_components = ["site", "channel"]
group_by = "none"
"#;
    let e = compile_error(&plate, mismatch, &out);
    assert!(e.contains("step 'm'") && e.contains("no 'positions' artifact of step 'p' covers"), "{e}");
    // Without a producer, assemble's optional input is simply absent.
    let plan = plan_for(&plate, "[[steps]]\nname = \"m\"\nfunc = \"assemble\"\n", &out).unwrap();
    assert_eq!(plan.steps[0].consumes[0].from_step, None);
}

/// The wgpu `assemble` registers the tiles on the host when no earlier step
/// produced `positions`: the plan says so, with the planned download, and
/// says nothing when `tile_positions` runs first.
#[test]
fn a_device_call_working_on_the_host_without_an_artifact_shows_that_route_in_the_plan() {
    let dir = tempfile::tempdir().unwrap();
    let plate = common::open(&synth(dir.path(), 64, false));
    let out = dir.path().join("out");
    let gpu = CompileConfig { device: hcsflow_core::Device::Gpu(0), ..config(&out) };
    let alone = "[[steps]]\nname = \"mosaic\"\nfunc = \"assemble\"\nvariable_components = [\"site\"]\n";
    let plan = common::compile_with(&builtin(), &plate, alone, &gpu).unwrap();
    let chain = &plan.steps[0].chains[0];
    assert_eq!(chain.calls[0].implementation.memory_in, hcsflow_core::MemoryType::Wgpu);
    let work = chain.host_work[0].as_ref().expect("the download to register on the host is planned");
    assert_eq!((work.without, work.work), ("positions", "registers the tiles"));
    assert_eq!(
        (work.route.source, work.route.target, work.route.method),
        (hcsflow_core::MemoryType::Wgpu, hcsflow_core::MemoryType::Host, "download")
    );
    // With the positions from an earlier step (tile_positions is host-only: pinned to the CPU), assemble stays on the device.
    let plan = common::compile_with(
        &builtin(),
        &plate,
        &STITCH.replace("func = \"tile_positions\"\n", "func = \"tile_positions\"\ndevice = \"cpu\"\n"),
        &gpu,
    )
    .unwrap();
    let mosaic = plan.steps.iter().find(|s| s.name == "mosaic").unwrap();
    assert!(mosaic.chains.iter().all(|c| c.host_work.iter().all(Option::is_none)), "{:?}", mosaic.chains[0].host_work);
    // On the host there is nothing to declare.
    let plan = common::compile_with(&builtin(), &plate, alone, &config(&out)).unwrap();
    assert!(plan.steps[0].chains[0].host_work[0].is_none());
}
