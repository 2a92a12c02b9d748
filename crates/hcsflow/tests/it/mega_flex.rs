//! The Mega Flex example end to end on a tiny synthetic plate (1 well, 3×3
//! tiles of 128², 2 channels, 5 planes, read noise 40, optics blurring the
//! in-focus plane by σ 2.5 px), with N2V trained briefly (300 steps of a small
//! network): each step measured against the plate's truth, with margins from
//! the numbers measured on this plate (the run is deterministic: one worker,
//! seeded N2V).
//!
//! Measured (input → output, 2026-11-28, the 1 × 1 head on the host kernel):
//! flat-field mean relative error 6.24 → 5.61 % (DAPI), 6.24 → 5.68 % (GFP);
//! PSNR of the in-focus plane vs the clean in-focus plane 27.29 → 30.24 dB
//! (DAPI), 21.29 → 29.41 dB (GFP); after Richardson–Lucy (4 iterations) PSNR
//! of the max-Z tile vs the unblurred truth 29.27 → 30.06 dB (DAPI), 28.26 →
//! 28.46 dB (GFP); its sharpness (`mega_flex::sharpness`) 0.001642 → 0.002205
//! (truth 0.003057) on DAPI, 0.0002423 → 0.0002733 (truth 0.0002406) on GFP;
//! RMS tile position error 1.68 px (stage) → 1.39 px (registered); 65 nuclei
//! counted, 63 true. With 150 steps, RL's gain on GFP was 0.03 dB with burn's
//! head and −0.12 dB with the host kernel's rounding (N2V2 trained along
//! another path): on this plate it is that close to 0, hence the longer
//! training.
//!
//! Denoising must be trained well enough for deconvolution to gain: with 90
//! steps of batch 8 the planes kept enough noise that 4 RL iterations first
//! smoothed DAPI (sharpness further from the truth) and 10 lost 0.5 dB on GFP.
//! The sharpness smooths at σ 1 px before its Laplacian so that residual
//! noise weighs little, but it measures blur only while noise does not
//! dominate it: a max-Z tile already "sharper" than the truth (as GFP's is
//! here: the maximum of five planes' residual noise, after the tiny network's
//! denoising) has no blur left for deconvolution to show there, which is then
//! judged by its PSNR alone. Where the tile is blurrier than the truth (DAPI
//! here, both channels in the 256² demo), its sharpness must move towards the
//! truth's.

use std::sync::atomic::AtomicBool;
use std::sync::Arc;

use hcsflow::mega_flex::{self, QualityRow};
use hcsflow::pipeline::PipelineSpec;

/// The example's N2V arguments, and the test's: a few training steps of a
/// small network (the example's realistic defaults take minutes here).
const EXAMPLE_N2V_ARGS: &str = "epochs = 2, steps_per_epoch = 100, patch_size = 64, batch_size = 16, seed = 1";
const TEST_N2V_ARGS: &str =
    "epochs = 6, steps_per_epoch = 50, patch_size = 32, batch_size = 16, features = 8, tile_size = 128, tile_overlap = 32, seed = 1";

fn row<'a>(rows: &'a [QualityRow], step: &str, channel: Option<u32>, measure: &str) -> &'a QualityRow {
    rows.iter()
        .find(|r| r.step == step && r.channel == channel && r.measure.starts_with(measure))
        .unwrap_or_else(|| panic!("no row {step} {channel:?} {measure} in {rows:#?}"))
}

/// Whether a sharpness row's input was already sharper than the truth: residual noise, not blur,
/// dominates its Laplacian (see the module's comment).
fn noise_dominated(sharpness: &QualityRow) -> bool {
    sharpness.truth.is_some_and(|truth| sharpness.input.is_some_and(|input| input >= truth))
}

#[test]
fn mega_flex_improves_every_step_against_the_truth() {
    let dir = tempfile::tempdir().unwrap();
    let plate = dir.path().join("plate");
    let config = mega_flex::mega_flex_synth_config(vec!["A01".into()], 128, 5);
    hcsflow_synth::generate(&config, &plate).unwrap();
    assert!(mega_flex::MEGA_FLEX_PIPELINE.contains(EXAMPLE_N2V_ARGS), "the example's N2V arguments changed: update this test");
    let toml = mega_flex::MEGA_FLEX_PIPELINE.replace(EXAMPLE_N2V_ARGS, TEST_N2V_ARGS);
    let spec = PipelineSpec::parse(&toml, "mega_flex.toml (test)").unwrap();
    let engine = hcsflow::Engine::builtin();
    let options = hcsflow::RunOptions { device: hcsflow::DeviceOptions::cpu(), workers: 1, ..Default::default() };
    let out = dir.path().join("out");
    let plan = engine.plan_spec(&plate, &spec, &out, &options).unwrap();
    let summary = engine.execute(&plan, &options, Arc::new(AtomicBool::new(false)), &|_| {}).unwrap();
    assert_eq!(summary.completed, ["A01"]);

    let rows = mega_flex::quality_against_truth(&plate, &out).unwrap();
    print!("{}", mega_flex::quality_text(&rows));
    let written = mega_flex::write_quality(&out, &rows).unwrap();
    assert!(written.iter().all(|p| p.is_file()));
    // Written again over the first (atomically): the same table, no temporary left.
    assert_eq!(mega_flex::write_quality(&out, &rows).unwrap(), written);
    let names: Vec<String> = std::fs::read_dir(&out).unwrap().map(|e| e.unwrap().file_name().to_string_lossy().into_owned()).collect();
    assert!(!names.iter().any(|n| hcsflow_io::is_temp_name(n)), "{names:?}");
    let csv = std::fs::read_to_string(out.join(mega_flex::QUALITY_CSV_NAME)).unwrap();
    assert_eq!(csv.lines().count(), rows.len() + 1, "{csv}");

    for c in [1, 2] {
        let flat = row(&rows, "flatfield", Some(c), "flat-field mean relative error");
        let (before, after) = (flat.input.unwrap(), flat.output);
        assert!(after < 0.93 * before, "channel {c}: flat-field error {before} % → {after} %");
        assert_eq!(flat.improved(), Some(true));
    }
    let dapi = row(&rows, "denoised", Some(1), "PSNR");
    assert!(dapi.output > dapi.input.unwrap() + 2.0, "DAPI denoising gains 2.9 dB on this plate: {dapi:?}");
    let gfp = row(&rows, "denoised", Some(2), "PSNR");
    assert!(gfp.output > gfp.input.unwrap() + 5.0, "GFP denoising gains 8.1 dB on this plate: {gfp:?}");
    for c in [1, 2] {
        let sharp = row(&rows, "deconvolved", Some(c), "sharpness");
        if !noise_dominated(sharp) {
            assert_eq!(
                sharp.improved(),
                Some(true),
                "channel {c}: deconvolution brings the tile's sharpness closer to the truth's: {sharp:?}"
            );
        }
        // It gains 0.8 dB on DAPI here, 0.2 dB on GFP (the 256² demo gains 2.5 and 2.2 dB).
        let psnr = row(&rows, "deconvolved", Some(c), "PSNR");
        let margin = if c == 1 { 0.5 } else { 0.0 };
        assert!(
            psnr.output > psnr.input.unwrap() + margin,
            "channel {c}: deconvolution gains 0.8 (DAPI) and 0.2 dB (GFP) against the truth: {psnr:?}"
        );
    }
    let positions = row(&rows, "positions", None, "RMS tile position error");
    assert!(positions.output < 0.9 * positions.input.unwrap(), "registration beats the stage: {positions:?}");
    let nuclei = row(&rows, "nuclei", Some(1), "nuclei counted");
    let truth = nuclei.truth.unwrap();
    assert!(truth > 40.0 && (nuclei.output - truth).abs() <= 0.1 * truth, "{nuclei:?}");
    // The QC report, written again now that the table exists, shows every row.
    hcsflow::report::write_report(&out).unwrap();
    let html = std::fs::read_to_string(out.join(hcsflow::pipeline::REPORT_HTML_NAME)).unwrap();
    let section = &html[html.find("Against the ground truth").expect("the report has the truth table")..];
    let section = &section[..section.find("</table>").unwrap()];
    assert_eq!(section.matches("<tr><td>").count(), rows.len(), "one report row per table row");
    for r in &rows {
        // minijinja escapes '/' too (as &#x2f;).
        let escaped = r.measure.replace('/', "&#x2f;");
        assert!(section.contains(&r.measure) || section.contains(&escaped), "{} missing from the report", r.measure);
    }
    let excusable = |r: &&QualityRow| r.measure.starts_with("sharpness") && noise_dominated(r);
    let excused = rows.iter().filter(excusable).count();
    assert!(rows.iter().filter(|r| !excusable(r)).all(|r| r.improved() != Some(false)), "every step improves on its input: {rows:?}");
    let worse_rows = rows.iter().filter(|r| r.improved() == Some(false)).count();
    assert!(worse_rows <= excused, "only noise-dominated sharpness rows may get worse: {rows:?}");
    assert_eq!(section.matches("class=\"worse\"").count(), worse_rows, "the rows that got worse, and only they, are marked");
    // A row that got worse is marked: the table again with the first row's input and output swapped.
    let mut worse = rows.clone();
    let first = &mut worse[0];
    (first.input, first.output) = (Some(first.output), first.input.unwrap());
    assert_eq!(first.improved(), Some(false));
    mega_flex::write_quality(&out, &worse).unwrap();
    hcsflow::report::write_report(&out).unwrap();
    let html = std::fs::read_to_string(out.join(hcsflow::pipeline::REPORT_HTML_NAME)).unwrap();
    let section = &html[html.find("Against the ground truth").expect("the report has the truth table")..];
    let marked = section[..section.find("</table>").unwrap()].matches("class=\"worse\"").count();
    assert_eq!(marked, worse_rows + 1, "the worse row is marked");
}

#[test]
fn the_quality_table_needs_the_truth_images_and_names_the_file() {
    let dir = tempfile::tempdir().unwrap();
    let plate = dir.path().join("plate");
    let config = hcsflow_synth::SynthConfig { wells: vec!["A01".into()], size: 32, truth_images: false, ..Default::default() };
    hcsflow_synth::generate(&config, &plate).unwrap();
    let e = mega_flex::quality_against_truth(&plate, &dir.path().join("out")).unwrap_err().to_string();
    assert!(e.contains("synth_config.json") && e.contains("no truth images"), "{e}");
}
