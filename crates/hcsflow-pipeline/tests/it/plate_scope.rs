//! Plate-wide steps (`scope = "plate"`, issue #17): BaSiC fitted on a sample
//! of the whole plate and applied per well. The example pipeline against the
//! synthetic plate's true flat-field and its true tile positions (seams), the
//! sample (bounded, deterministic, the same as fitting the sampled tiles
//! directly), the compile errors of impossible wiring, resume keeping the fit,
//! and a corrupt sampled image failing the run by name.

use crate::common;

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};

use hcsflow::builtin;
use hcsflow_core::{Conversions, DType, Device, Registry, Stack};
use hcsflow_pipeline::{Manifest, PipelineError, Plan, RunOptions, RunSummary, WellStatus};
use hcsflow_plate::Plate;
use hcsflow_synth::SynthConfig;

/// The example pipeline of the repository.
fn example() -> String {
    let path = Path::new(env!("CARGO_MANIFEST_DIR")).join("../../examples/basic_flatfield.toml");
    std::fs::read_to_string(&path).unwrap_or_else(|e| panic!("{}: {e}", path.display()))
}

/// A small plate: `wells` wells × 3×3 sites × 2 channels × `z` planes of `size`² px.
fn synth(dir: &Path, wells: &[&str], z: u32, size: u32) -> PathBuf {
    let cfg = SynthConfig { wells: wells.iter().map(|w| w.to_string()).collect(), z_planes: z, size, ..SynthConfig::default() };
    common::synth_plate(&dir.join("plate"), &cfg)
}

fn plan(plate: &Plate, toml: &str, out: &Path) -> Result<Plan, PipelineError> {
    common::compile_text(plate, toml, out)
}

fn run(plan: &Plan, options: &RunOptions) -> Result<RunSummary, PipelineError> {
    common::run_with(&builtin(), plan, options)
}

fn f32_planes(path: &Path) -> Vec<Vec<f32>> {
    let stack = hcsflow_tiff::read_stack(path).unwrap_or_else(|e| panic!("{}: {e}", path.display()));
    let a = stack.to_f32();
    a.outer_iter().map(|p| p.iter().copied().collect()).collect()
}

/// CSV → rows of (column → text).
fn read_csv(path: &Path) -> Vec<BTreeMap<String, String>> {
    let text = std::fs::read_to_string(path).unwrap_or_else(|e| panic!("{}: {e}", path.display()));
    let mut lines = text.lines();
    let header: Vec<&str> = lines.next().expect("header").split(',').collect();
    lines.map(|l| header.iter().map(|h| h.to_string()).zip(l.split(',').map(str::to_string)).collect()).collect()
}

/// The fit pipeline with `extra` keys on the fit step and `correct` as the
/// correction step's extra keys.
fn fit_and_correct(fit_extra: &str, correct_extra: &str) -> String {
    format!(
        r#"
name = "fit"
[[steps]]
name = "flatfield"
func = {{ name = "basic_fit", args = {{ working_size = 32 }} }}
scope = "plate"
variable_components = ["site", "z_index"]
{fit_extra}

[[steps]]
name = "corrected"
func = "basic_correct"
variable_components = ["site"]
materialize = ["tiff"]
{correct_extra}
"#
    )
}

/// Mean over tile pairs of |mean of the overlap in tile a − mean of the same
/// region in tile b|: the intensity step a seam shows, per channel pooled.
/// `tile(well, site, channel)` gives a tile's pixels; positions are the true
/// top-left corners (px, fractional) from the ground truth. Tile b is sampled
/// bilinearly at the positions of tile a's pixels.
fn seam_step(
    positions: &BTreeMap<(String, u32), (f64, f64)>,
    cells: &BTreeMap<(String, u32), (u32, u32)>,
    size: usize,
    channels: &[u32],
    tile: &dyn Fn(&str, u32, u32) -> Vec<f32>,
) -> f64 {
    let mut steps = Vec::new();
    for ((well, site_a), &(ra, ca)) in cells {
        for ((well_b, site_b), &(rb, cb)) in cells {
            let neighbours = well == well_b && ((ra == rb && cb == ca + 1) || (ca == cb && rb == ra + 1));
            if !neighbours {
                continue;
            }
            let (xa, ya) = positions[&(well.clone(), *site_a)];
            let (xb, yb) = positions[&(well.clone(), *site_b)];
            for &c in channels {
                let (a, b) = (tile(well, *site_a, c), tile(well, *site_b, c));
                let (mut sum_a, mut sum_b, mut n) = (0.0, 0.0, 0usize);
                for v in 0..size {
                    for u in 0..size {
                        // Tile a's pixel (u, v) seen in tile b.
                        let (bx, by) = (u as f64 + xa - xb, v as f64 + ya - yb);
                        if bx < 0.0 || by < 0.0 || bx > (size - 1) as f64 || by > (size - 1) as f64 {
                            continue;
                        }
                        let (x0, y0) = (bx.floor() as usize, by.floor() as usize);
                        let (x1, y1) = ((x0 + 1).min(size - 1), (y0 + 1).min(size - 1));
                        let (fx, fy) = (bx - x0 as f64, by - y0 as f64);
                        let at = |x: usize, y: usize| f64::from(b[y * size + x]);
                        let vb =
                            (1.0 - fy) * ((1.0 - fx) * at(x0, y0) + fx * at(x1, y0)) + fy * ((1.0 - fx) * at(x0, y1) + fx * at(x1, y1));
                        sum_a += f64::from(a[v * size + u]);
                        sum_b += vb;
                        n += 1;
                    }
                }
                assert!(n > 0, "tiles {well} {site_a}/{site_b} do not overlap");
                steps.push((sum_a / n as f64 - sum_b / n as f64).abs());
            }
        }
    }
    assert!(!steps.is_empty());
    steps.iter().sum::<f64>() / steps.len() as f64
}

/// The repository's example on a 4-well plate (3×3 sites, 2 channels, 256²,
/// the synthetic camera offset of 100 counts, which the example subtracts):
/// the fitted flat-field of each channel matches the synthetic plate's true
/// shading (measured: relative error mean 0.18 % / 0.25 %, 99th percentile
/// 1.01 % / 0.83 %, worst pixel 2.95 % / 1.83 % for DAPI / GFP, at the
/// corner pixel; ≥ 4 px from the border at most 0.87 % / 1.13 %). BaSiCPy
/// 2.0 on the same 36 tiles per channel gives the same numbers to the
/// hundredth of a percent: the corner error is BaSiC's (its DCT smoothing
/// flattens the shading's slope at the border), not the port's. Correcting
/// the tiles shrinks the mean intensity step across their overlaps (true
/// positions) from 6.54 to 0.41 counts.
#[test]
fn the_basic_example_recovers_the_true_flatfield_and_reduces_seams() {
    let dir = tempfile::tempdir().expect("tempdir");
    let size = 256usize;
    let cfg = SynthConfig {
        wells: ["A01", "A02", "B01", "B02"].iter().map(|w| w.to_string()).collect(),
        z_planes: 1,
        size: size as u32,
        ..SynthConfig::default()
    };
    let root = common::synth_plate(&dir.path().join("plate"), &cfg);
    let plate = common::open(&root);
    let out = dir.path().join("out");
    let plan = plan(&plate, &example(), &out).expect("compile the example");
    let summary = run(&plan, &RunOptions { workers: 2, ..Default::default() }).expect("run");
    assert!(summary.failed.is_empty(), "{:?}", summary.failed);
    assert_eq!(summary.completed.len(), 4);

    // The fit against the truth (both normalised to mean 1).
    let truth = f32_planes(&root.join("ground_truth/flatfield.tif")).remove(0);
    let truth_mean = truth.iter().map(|&v| f64::from(v)).sum::<f64>() / truth.len() as f64;
    for (c, name) in [(1, "DAPI"), (2, "GFP")] {
        let path = out.join(format!("flatfield/channel_{c}_{name}.tif"));
        let planes = f32_planes(&path);
        assert_eq!(planes.len(), 2, "[flat-field, dark-field]");
        let flat = &planes[0];
        let flat_mean = flat.iter().map(|&v| f64::from(v)).sum::<f64>() / flat.len() as f64;
        let errors: Vec<f64> = flat
            .iter()
            .zip(&truth)
            .map(|(&f, &t)| ((f64::from(f) / flat_mean) - f64::from(t) / truth_mean).abs() / (f64::from(t) / truth_mean))
            .collect();
        let max = errors.iter().copied().fold(0.0, f64::max);
        let mean = errors.iter().sum::<f64>() / errors.len() as f64;
        let mut sorted = errors.clone();
        sorted.sort_by(f64::total_cmp);
        let p99 = sorted[sorted.len() * 99 / 100];
        println!(
            "channel {c}: flat-field vs truth: relative error mean {:.2} %, 99th percentile {:.2} %, max {:.2} %",
            mean * 100.0,
            p99 * 100.0,
            max * 100.0
        );
        assert!(mean < 0.01 && p99 < 0.02 && max < 0.04, "channel {c}: relative error mean {mean}, p99 {p99}, max {max}");
    }

    // Seams before (the plate's tiles) and after (the corrected tiles).
    let mut positions = BTreeMap::new();
    let mut cells = BTreeMap::new();
    for row in read_csv(&root.join("ground_truth/tile_positions.csv")) {
        let key = (row["well"].clone(), row["site"].parse::<u32>().expect("site"));
        positions.insert(key.clone(), (row["x_px"].parse::<f64>().expect("x"), row["y_px"].parse::<f64>().expect("y")));
        cells.insert(key, (row["grid_row"].parse::<u32>().expect("row"), row["grid_col"].parse::<u32>().expect("col")));
    }
    let raw: BTreeMap<(String, u32, u32), PathBuf> =
        plate.images.iter().map(|i| ((i.well.clone(), i.site, i.channel), i.path.clone())).collect();
    let manifest = Manifest::read(&out).expect("manifest").expect("a manifest");
    let out_dir = out.as_path();
    let corrected: BTreeMap<(String, u32, u32), PathBuf> = manifest
        .wells
        .iter()
        .flat_map(|(w, r)| {
            r.outputs.iter().filter(|o| o.step == "corrected").map(move |o| ((w.clone(), o.key[0], o.key[1]), out_dir.join(&o.path)))
        })
        .collect();
    assert_eq!(corrected.len(), raw.len(), "every tile corrected");
    let read = |files: &BTreeMap<(String, u32, u32), PathBuf>| {
        let files = files.clone();
        move |w: &str, s: u32, c: u32| f32_planes(&files[&(w.to_string(), s, c)]).remove(0)
    };
    let before = seam_step(&positions, &cells, size, &[1, 2], &read(&raw));
    let after = seam_step(&positions, &cells, size, &[1, 2], &read(&corrected));
    println!("mean intensity step across tile overlaps: before {before:.2}, after {after:.2} (counts)");
    assert!(after < 0.5 * before, "seams: before {before}, after {after}");

    // The mosaics exist, one per channel and well.
    let mosaics = manifest.wells.values().flat_map(|r| r.outputs.iter()).filter(|o| o.step == "mosaic").count();
    assert_eq!(mosaics, 8);
    // The fit's notes reach the report; its table has a row per sampled plane.
    assert!(
        summary.report.notes.iter().any(|n| n.step == "flatfield" && n.text.contains("BaSiC fit of 36 tiles")),
        "{:?}",
        summary.report.notes
    );
    assert_eq!(read_csv(&out.join("flatfield/basic_baseline.csv")).len(), 72);
}

/// `sample = N` below the planes available: every group reads exactly N,
/// the same N for the same seed whatever the worker count (another seed
/// picks others), and the plate-wide fit equals basic_fit called on those
/// tiles stacked at full size (reducing them as they are read changes nothing).
#[test]
fn the_sample_is_bounded_deterministic_and_equal_to_fitting_those_tiles() {
    let dir = tempfile::tempdir().expect("tempdir");
    let root = synth(dir.path(), &["A01", "B02"], 2, 64);
    let plate = common::open(&root);
    let toml = fit_and_correct("sample = 5\nseed = 7", "");
    let out1 = dir.path().join("out1");
    let plan1 = plan(&plate, &toml, &out1).expect("compile");
    let ps = &plan1.plate_steps[0];
    assert_eq!(ps.groups.len(), 2, "one group per channel");
    for g in &ps.groups {
        assert_eq!((g.inputs.len(), g.available, g.wells <= 2), (5, 36, true), "{g:?}");
    }
    let again = plan(&plate, &toml, &dir.path().join("other")).expect("compile");
    let sampled = |p: &Plan| p.plate_steps[0].groups.iter().map(|g| g.inputs.clone()).collect::<Vec<_>>();
    assert_eq!(sampled(&plan1), sampled(&again), "the same seed, the same planes");
    let other_seed = plan(&plate, &fit_and_correct("sample = 5\nseed = 8", ""), &dir.path().join("o2")).expect("compile");
    assert_ne!(sampled(&plan1), sampled(&other_seed), "another seed, other planes");
    // The plan says it.
    let text = hcsflow::plan_text(&plan1);
    assert!(
        text.contains("plate-wide: runs once before the wells, on a sample of at most 5 plane(s) per group across all wells (seed 7)"),
        "{text}"
    );
    assert!(text.contains("group channel 1 (DAPI), timepoint 1: sampled 5 of 36 plane(s) from 2 well(s)"), "{text}");
    assert!(text.contains("resized to 32×32 as it is read"), "{text}");
    assert!(text.contains("consumes 'basic_profiles' from the plate-wide step 'flatfield'"), "{text}");

    run(&plan1, &RunOptions { workers: 1, ..Default::default() }).expect("run 1 worker");
    let out2 = dir.path().join("out2");
    let plan2 = plan(&plate, &toml, &out2).expect("compile");
    run(&plan2, &RunOptions { workers: 2, ..Default::default() }).expect("run 2 workers");
    for name in ["channel_1_DAPI.tif", "channel_2_GFP.tif"] {
        let (a, b) =
            (std::fs::read(out1.join("flatfield").join(name)).expect("1"), std::fs::read(out2.join("flatfield").join(name)).expect("2"));
        assert_eq!(a, b, "{name}: 1 and 2 workers");
    }

    // The same fit from basic_fit on the sampled tiles at full size.
    let (registry, conversions): (Registry, Conversions) = builtin();
    for g in &ps.groups {
        let tiles: Vec<Stack> = g.inputs.iter().map(|p| hcsflow_tiff::read_stack(&p.path).expect("tile")).collect();
        let stack = Stack::concat_owned(tiles).expect("stack");
        let direct = hcsflow_testkit::call(&registry, &conversions, "basic_fit", &["working_size=32"], &stack, Device::Cpu).expect("fit");
        let fitted = hcsflow_tiff::read_stack(&g.output).expect("result");
        assert_eq!(fitted.dtype(), DType::F32);
        assert_eq!(fitted.to_f32(), direct.to_f32(), "{}", g.output.display());
    }
}

/// Every wiring a plate-wide step cannot do is refused at compile time, with
/// the step, the channel and the fix.
#[test]
fn impossible_wiring_is_a_compile_error() {
    let dir = tempfile::tempdir().expect("tempdir");
    let root = synth(dir.path(), &["A01"], 1, 32);
    let plate = common::open(&root);
    let out = dir.path().join("out");
    let refused = |toml: &str| -> String {
        let e = plan(&plate, toml, &out).expect_err("refused");
        assert!(e.is_usage(), "{e}");
        e.to_string()
    };
    // A consumer naming a step that does not exist, or a later one.
    let e = refused(&fit_and_correct("", "artifacts_from = { basic_profiles = \"nope\" }"));
    assert!(e.contains("step 'corrected'") && e.contains("no step is named 'nope'"), "{e}");
    let later = r#"
[[steps]]
name = "corrected"
func = "basic_correct"
artifacts_from = { basic_profiles = "flatfield" }
[[steps]]
name = "flatfield"
func = "basic_fit"
scope = "plate"
input_source = "pipeline_start"
"#;
    let e = refused(later);
    assert!(e.contains("step 'flatfield' does not run before this one"), "{e}");
    // A fit that does not cover a channel the correction runs on.
    let only_dapi = r#"
[[steps]]
name = "flatfield"
scope = "plate"
missing_groups = "skip"
[steps.func]
DAPI = { name = "basic_fit", args = { working_size = 16 } }
[[steps]]
name = "corrected"
func = "basic_correct"
"#;
    let e = refused(only_dapi);
    assert!(
        e.contains("step 'corrected'")
            && e.contains("the plate-wide step 'flatfield' has no 'basic_profiles' for channel 2 (GFP)")
            && e.contains("it has results for: 1 (DAPI)")
            && e.contains("fix: make step 'flatfield' fit channel 2 (GFP) too"),
        "{e}"
    );
    // A per-plane function cannot take a plate sample.
    let e = refused("[[steps]]\nname = \"blur\"\nfunc = \"gaussian_blur\"\nscope = \"plate\"\n");
    assert!(e.contains("step 'blur'") && e.contains("gaussian_blur (pure_2d) works plane by plane"), "{e}");
    // sample/seed without scope = "plate".
    let e = refused("[[steps]]\nname = \"z\"\nfunc = \"max_projection\"\nsample = 3\n");
    assert!(e.contains("add scope = \"plate\""), "{e}");
    // The profiles from a per-well fit.
    let e = refused(&fit_and_correct("", "").replace("scope = \"plate\"\n", ""));
    assert!(e.contains("'basic_profiles' is the result of step 'flatfield', which runs per well"), "{e}");
    // Neither a fit nor a file; or both.
    let e = refused("[[steps]]\nname = \"corrected\"\nfunc = \"basic_correct\"\n");
    assert!(e.contains("basic_correct needs 'basic_profiles' from an earlier plate-wide step, or the argument flatfield"), "{e}");
    let both = fit_and_correct("", "")
        .replace("func = \"basic_correct\"", "func = { name = \"basic_correct\", args = { flatfield = \"ff.tif\" } }");
    let e =
        refused(&both.replace("materialize = [\"tiff\"]", "materialize = [\"tiff\"]\nartifacts_from = { basic_profiles = \"flatfield\" }"));
    assert!(e.contains("gets 'basic_profiles' from step 'flatfield' and also flatfield = 'ff.tif'"), "{e}");

    // A channel with a single plane across the plate cannot be fitted.
    let single = SynthConfig { wells: vec!["A01".into()], grid_rows: 1, grid_cols: 1, z_planes: 1, size: 32, ..SynthConfig::default() };
    let root1 = common::synth_plate(&dir.path().join("single"), &single);
    let e = plan(&common::open(&root1), &fit_and_correct("", ""), &dir.path().join("out1")).expect_err("one plane per channel");
    let e = e.to_string();
    assert!(
        e.contains("step 'flatfield'")
            && e.contains("basic_fit: the input stack: BaSiC needs at least 2 images of one channel to fit, the stack has 1")
            && !e.contains("working_size")
            && e.contains("the plate-wide sample of channel 2 (GFP), timepoint 1: 1 of 1 plane(s) across 1 well(s)"),
        "{e}"
    );
}

/// `--resume` keeps a finished fit (its file is not rewritten) and gives the
/// wells it runs the re-read profiles; a fit file changed since is fitted
/// again; `--overwrite` for another pipeline removes the fit's files.
#[test]
fn resume_keeps_the_finished_fit_and_overwrite_removes_it() {
    let dir = tempfile::tempdir().expect("tempdir");
    let root = synth(dir.path(), &["A01", "B02"], 1, 48);
    let plate = common::open(&root);
    let toml = fit_and_correct("", "");
    let out = dir.path().join("out");
    let p = plan(&plate, &toml, &out).expect("compile");
    run(&p, &RunOptions::default()).expect("first run");
    let fit = out.join("flatfield/channel_1_DAPI.tif");
    let mtime = |p: &Path| std::fs::metadata(p).and_then(|m| m.modified()).expect("mtime");
    let first = mtime(&fit);
    let corrected_b02: Vec<(PathBuf, Vec<u8>)> = std::fs::read_dir(out.join("corrected"))
        .expect("corrected")
        .flat_map(|e| walk(&e.expect("entry").path()))
        .filter(|p| p.to_string_lossy().contains("B02"))
        .map(|p| (p.clone(), std::fs::read(&p).expect("read")))
        .collect();
    assert!(!corrected_b02.is_empty());

    // Forget well B02 and resume: the fit is re-read, B02 corrected as before.
    let manifest_path = out.join("run_manifest.json");
    let mut manifest: serde_json::Value = serde_json::from_slice(&std::fs::read(&manifest_path).expect("read")).expect("json");
    manifest["wells"].as_object_mut().expect("wells").remove("B02");
    assert_eq!(manifest["plate_steps"]["flatfield"]["status"], "complete");
    std::fs::write(&manifest_path, serde_json::to_vec(&manifest).expect("json")).expect("write");
    for (path, _) in &corrected_b02 {
        std::fs::remove_file(path).expect("remove");
    }
    std::thread::sleep(std::time::Duration::from_millis(20));
    let summary = run(&p, &RunOptions { resume: true, ..Default::default() }).expect("resume");
    assert_eq!((summary.completed.as_slice(), summary.skipped.as_slice()), (&["B02".to_string()][..], &["A01".to_string()][..]));
    assert_eq!(mtime(&fit), first, "the fit was not run again");
    for (path, bytes) in &corrected_b02 {
        assert_eq!(&std::fs::read(path).expect("read"), bytes, "{}", path.display());
    }

    // A fit file changed since: resume fits again.
    let mut bytes = std::fs::read(&fit).expect("read");
    let last = bytes.len() - 1;
    bytes[last] ^= 0xff;
    std::fs::write(&fit, &bytes).expect("write");
    let changed = mtime(&fit);
    std::thread::sleep(std::time::Duration::from_millis(20));
    run(&p, &RunOptions { resume: true, ..Default::default() }).expect("resume");
    assert_ne!(mtime(&fit), changed, "fitted again");
    assert_ne!(std::fs::read(&fit).expect("read"), bytes);

    // Another pipeline with --overwrite removes the fit's files.
    let other = plan(&plate, common::MAX_Z, &out).expect("compile");
    run(&other, &RunOptions { overwrite: true, ..Default::default() }).expect("overwrite");
    assert!(!out.join("flatfield").exists(), "the fit's folder is gone");
}

/// A corrupt image in the sample fails the run before any well, naming the
/// file; no well is corrected with nothing.
#[test]
fn a_corrupt_sampled_image_fails_the_run_naming_the_file() {
    let dir = tempfile::tempdir().expect("tempdir");
    let root = synth(dir.path(), &["A01", "B02"], 1, 32);
    let plate = common::open(&root);
    let bad = plate.images.iter().find(|i| i.well == "B02" && i.channel == 2).expect("an image").path.clone();
    std::fs::write(&bad, b"not a tiff at all").expect("corrupt");
    let out = dir.path().join("out");
    let p = plan(&plate, &fit_and_correct("", ""), &out).expect("compile");
    let e = run(&p, &RunOptions::default()).expect_err("the fit fails");
    let text = e.to_string();
    assert!(matches!(e, PipelineError::PlateStep { ref step, .. } if step == "flatfield"), "{text}");
    assert!(!e.is_usage());
    assert!(text.contains("plate-wide step 'flatfield' failed, so no well was run") && text.contains(&bad.display().to_string()), "{text}");
    assert!(text.contains("channel 2 (GFP)"), "{text}");
    assert!(!out.join("corrected").exists(), "no well ran");
    let manifest = Manifest::read(&out).expect("manifest").expect("a manifest");
    let record = &manifest.plate_steps["flatfield"];
    assert_eq!(record.status, WellStatus::Failed);
    assert!(record.error.as_deref().is_some_and(|e| e.contains(&bad.display().to_string())));
    assert!(manifest.wells.is_empty());
}

fn walk(path: &Path) -> Vec<PathBuf> {
    if path.is_dir() {
        std::fs::read_dir(path).expect("dir").flat_map(|e| walk(&e.expect("entry").path())).collect()
    } else {
        vec![path.to_path_buf()]
    }
}
