//! One bad image in a small synthetic plate: a decompression bomb, a plane
//! of another size or dtype, a whole well of another size, a FIFO. Each fails
//! its own well with an error naming the file (and, for a format mismatch,
//! both sizes and dtypes), before its pixels are decoded; the other wells
//! complete.

mod common;

#[path = "../../hcsflow-tiff/tests/common/forge.rs"]
mod forge;

use std::path::{Path, PathBuf};
use std::sync::mpsc;
use std::time::Duration;

use forge::{tiff, zlib_zeros, Page};
use hcsflow::builtin;
use hcsflow_core::{DType, Stack};
use hcsflow_pipeline::{peak_rss_bytes, MissingPolicy, PipelineError, RunOptions, RunSummary};
use hcsflow_synth::SynthConfig;

/// An ImageXpress plate of `wells`, 3×3 sites, 2 channels, 3 z planes of
/// `size`² u16.
fn synth(root: &Path, wells: &[&str], size: u32) -> PathBuf {
    let cfg = SynthConfig { size, z_planes: 3, wells: wells.iter().map(|w| w.to_string()).collect(), ..SynthConfig::default() };
    common::synth_plate(root, &cfg)
}

use common::MAX_Z;

/// Compiles `toml` for the plate at `root` and runs it with two workers.
fn run(root: &Path, toml: &str, out: &Path) -> RunSummary {
    run_with(root, toml, out, MissingPolicy::default()).expect("compile")
}

/// [`run`] with a missing-image policy; `Err` is the compile error.
fn run_with(root: &Path, toml: &str, out: &Path, missing: MissingPolicy) -> Result<RunSummary, PipelineError> {
    let functions = builtin();
    let plan = common::compile_with(&functions, &common::open(root), toml, &common::cpu_config(out, missing))?;
    let options = RunOptions { workers: 2, ..RunOptions::default() };
    Ok(common::run_with(&functions, &plan, &options).expect("execute"))
}

/// The image of `well`, site, channel and z (1-based) of a synthetic plate.
fn image(root: &Path, well: &str, site: u32, channel: u32, z: u32) -> PathBuf {
    root.join(format!("TimePoint_1/ZStep_{z}/Synth_Plate_1_{well}_s{site}_w{channel}.tif"))
}

/// The error of the one failed well, which must be `well`.
fn only_failure(s: &RunSummary, well: &str) -> String {
    assert_eq!(s.failed.len(), 1, "{:?}", s.failed);
    assert_eq!(s.failed[0].well, well, "{:?}", s.failed);
    s.failed[0].error.clone()
}

#[test]
fn a_decompression_bomb_fails_only_its_well_without_the_memory_it_claims() {
    // D2: under 1 MB of Deflate declaring an 8000² u16 plane (128 MB of
    // zeros) in a 64² plate.
    let dir = tempfile::tempdir().expect("tempdir");
    let root = synth(&dir.path().join("plate"), &["A01", "A02", "B01"], 64);
    let bomb = image(&root, "A02", 2, 1, 2);
    let claimed = 8000 * 8000 * 2;
    std::fs::write(&bomb, tiff(&Page::deflate_u16(8000, 8000), &zlib_zeros(claimed))).expect("write bomb");
    let before = peak_rss_bytes();
    let s = run(&root, MAX_Z, &dir.path().join("out"));
    let after = peak_rss_bytes();
    assert_eq!(s.completed, ["A01", "B01"]);
    let e = only_failure(&s, "A02");
    assert!(e.contains(&format!("{}: page 0 is 8000x8000 u16 but 64x64 u16 was expected", bomb.display())), "{e}");
    if let (Some(before), Some(after)) = (before, after) {
        let grown = after.saturating_sub(before);
        assert!(grown < claimed as u64 / 4, "peak RSS grew by {grown} bytes for a file claiming {claimed}");
    }
}

#[test]
fn a_plane_of_another_size_or_dtype_fails_its_well_naming_the_file_and_both_formats() {
    // D10: a 100² plane among 64² ones (read as part of a z stack), and a
    // f32 plane among u16 ones.
    let dir = tempfile::tempdir().expect("tempdir");
    let root = synth(&dir.path().join("plate"), &["A01", "A02", "B01"], 64);
    let big = image(&root, "A01", 2, 1, 2);
    let float = image(&root, "B01", 5, 2, 3);
    hcsflow_tiff::write_stack(&big, &Stack::zeros(DType::U16, [1, 100, 100]), &Default::default()).expect("write");
    hcsflow_tiff::write_stack(&float, &Stack::zeros(DType::F32, [1, 64, 64]), &Default::default()).expect("write");
    let s = run(&root, MAX_Z, &dir.path().join("out"));
    assert_eq!(s.completed, ["A02"]);
    assert_eq!(s.failed.len(), 2, "{:?}", s.failed);
    let error = |well: &str| s.failed.iter().find(|f| f.well == well).map(|f| f.error.clone()).expect("failed well");
    let e = error("A01");
    assert!(e.contains(&format!("{}: page 0 is 100x100 u16 but 64x64 u16 was expected", big.display())), "{e}");
    let e = error("B01");
    assert!(e.contains(&format!("{}: page 0 is 64x64 f32 but 64x64 u16 was expected", float.display())), "{e}");
}

#[test]
fn a_plane_of_another_size_processed_alone_fails_its_well() {
    // D10/D11: planes processed one at a time (no z stack to concatenate)
    // used to pass any size through.
    let dir = tempfile::tempdir().expect("tempdir");
    let root = synth(&dir.path().join("plate"), &["A01", "B01"], 64);
    let small = image(&root, "B01", 9, 2, 1);
    hcsflow_tiff::write_stack(&small, &Stack::zeros(DType::U16, [1, 48, 48]), &Default::default()).expect("write");
    let per_plane = r#"
name = "t"
[[steps]]
name = "each"
func = "max_projection"
variable_components = []
materialize = ["tiff"]
"#;
    let s = run(&root, per_plane, &dir.path().join("out"));
    assert_eq!(s.completed, ["A01"]);
    let e = only_failure(&s, "B01");
    assert!(e.contains(&format!("{}: page 0 is 48x48 u16 but 64x64 u16 was expected", small.display())), "{e}");
}

#[test]
fn a_well_of_another_size_fails_instead_of_being_zero_padded_into_the_zarr_plate() {
    // D11: B01 re-acquired at 96² in a 64² plate used to complete, its
    // fields padded into (or padding) the OME-Zarr plate.
    let dir = tempfile::tempdir().expect("tempdir");
    let root = synth(&dir.path().join("plate"), &["A01", "B01"], 64);
    let other = synth(&dir.path().join("other"), &["B01"], 96);
    let mut replaced = 0;
    for z in 1..=3 {
        for entry in std::fs::read_dir(other.join(format!("TimePoint_1/ZStep_{z}"))).expect("read_dir") {
            let from = entry.expect("entry").path();
            let to = root.join(format!("TimePoint_1/ZStep_{z}")).join(from.file_name().expect("name"));
            assert!(to.exists(), "{} is not in the plate", to.display());
            std::fs::copy(&from, &to).expect("copy");
            replaced += 1;
        }
    }
    assert_eq!(replaced, 9 * 2 * 3);
    let zarr = MAX_Z.replace(r#"materialize = ["tiff"]"#, r#"materialize = ["tiff", "zarr"]"#);
    let s = run(&root, &zarr, &dir.path().join("out"));
    assert_eq!(s.completed, ["A01"]);
    let e = only_failure(&s, "B01");
    assert!(e.contains("Synth_Plate_1_B01_s") && e.contains("is 96x96 u16 but 64x64 u16 was expected"), "{e}");
}

#[cfg(unix)]
#[test]
fn a_fifo_named_like_an_image_is_a_missing_image_and_never_blocks() {
    // D14: opening a FIFO for reading blocks until a writer comes. The plate
    // never takes it for an image (it is a missing plane, with a warning), so
    // the default policy refuses the run at compile and skip-well runs the
    // other well; the TIFF reader's own refusal is tested in hcsflow-tiff.
    let dir = tempfile::tempdir().expect("tempdir");
    let root = synth(&dir.path().join("plate"), &["A01", "B01"], 64);
    let fifo = image(&root, "A01", 3, 1, 2);
    std::fs::remove_file(&fifo).expect("remove");
    let status = std::process::Command::new("mkfifo").arg(&fifo).status().expect("mkfifo runs");
    assert!(status.success(), "mkfifo");
    let (tx, rx) = mpsc::channel();
    let base = dir.path().to_path_buf();
    std::thread::spawn(move || {
        let refused = run_with(&root, MAX_Z, &base.join("out1"), MissingPolicy::Error);
        let skipped = run_with(&root, MAX_Z, &base.join("out2"), MissingPolicy::SkipWell);
        let _ = tx.send((refused, skipped));
    });
    let (refused, skipped) = rx.recv_timeout(Duration::from_secs(30)).expect("the run blocked on the FIFO");
    let e = refused.expect_err("a FIFO is a missing image: refused by default").to_string();
    assert!(e.contains("1 image(s) the plate declares are missing") && e.contains("well A01 site 3, channel 1, z 2"), "{e}");
    let s = skipped.expect("compiles with --missing skip-well");
    assert_eq!(s.completed, ["B01"]);
    let e = only_failure(&s, "A01");
    assert!(e.contains("not run: 1 missing image(s)"), "{e}");
}
