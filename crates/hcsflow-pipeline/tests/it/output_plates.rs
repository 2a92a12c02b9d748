//! A run's TIFF output is a plate: `OUT/<step>/hcsflow-plate.json` describes
//! it, `open_plate` reads it (pointing at OUT or at the step folder) with the
//! run's wells, fields, channels and metadata, and a second pipeline runs on
//! it. Neither the plate nor the first run's output is touched by reading.

use crate::common;

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};

use hcsflow::builtin;
use hcsflow_core::Stack;
use hcsflow_pipeline::{RunOptions, RunSummary};
use hcsflow_plate::{open_plate, Format, Plate, PlateError};
use hcsflow_synth::SynthConfig;

/// Max over z, to TIFF.
const MAX_Z: &str = "name = \"first\"\n[[steps]]\nname = \"max_z\"\nfunc = \"max_projection\"\nvariable_components = [\"z_index\"]\nmaterialize = [\"tiff\"]\n";
/// Min over channels, to TIFF.
const MIN_C: &str = "name = \"second\"\n[[steps]]\nname = \"min_c\"\nfunc = \"min_projection\"\nvariable_components = [\"channel\"]\ngroup_by = \"none\"\nmaterialize = [\"tiff\"]\n";
/// Two steps that both write TIFFs.
const TWO_STEPS: &str = "name = \"two\"\n[[steps]]\nname = \"max_z\"\nfunc = \"max_projection\"\nvariable_components = [\"z_index\"]\nmaterialize = [\"tiff\"]\n\
[[steps]]\nname = \"min_c\"\nfunc = \"min_projection\"\nvariable_components = [\"channel\"]\ngroup_by = \"none\"\nmaterialize = [\"tiff\"]\n";

/// Wells A01, B02 × 2×2 sites × 2 channels × 3 z, 32², in `dir/plate`.
fn plate(dir: &Path, format: Format) -> PathBuf {
    let cfg = SynthConfig {
        format,
        size: 32,
        z_planes: 3,
        grid_rows: 2,
        grid_cols: 2,
        channels: 2,
        wells: vec!["A01".into(), "B02".into()],
        ..SynthConfig::default()
    };
    common::synth_plate(&dir.join("plate"), &cfg)
}

fn run(plate: &Plate, toml: &str, out: &Path) -> RunSummary {
    let plan = common::compile_text(plate, toml, out).expect("compile");
    let summary = common::run_with(&builtin(), &plan, &RunOptions::default()).expect("run");
    assert_eq!(summary.completed.len(), plate.wells().len(), "{:?}", summary.failed);
    summary
}

/// The u16 pixels of the one-plane TIFF at `path`.
fn read(path: &Path) -> Vec<u16> {
    match hcsflow_tiff::read_stack(path).unwrap_or_else(|e| panic!("{}: {e}", path.display())) {
        Stack::U16(a) => a.pixels().to_vec(),
        other => panic!("{}: {} pixels, expected u16", path.display(), other.dtype()),
    }
}

/// The pixel-wise reduction `f` of the planes at `paths` (u16).
fn reduce(paths: &[&Path], f: fn(u16, u16) -> u16) -> Vec<u16> {
    let planes: Vec<Vec<u16>> = paths.iter().map(|p| read(p)).collect();
    (0..planes[0].len()).map(|i| planes.iter().map(|p| p[i]).reduce(f).expect("a plane")).collect()
}

/// (well, site, channel, z, t) of every image, and the image.
fn index(plate: &Plate) -> BTreeMap<(String, u32, u32, u32, u32), PathBuf> {
    plate.images.iter().map(|i| ((i.well.clone(), i.site, i.channel, i.z_index, i.timepoint), i.path.clone())).collect()
}

#[test]
fn a_runs_tiff_output_opens_as_the_plate_it_wrote_and_a_second_pipeline_runs_on_it() {
    for format in [Format::ImageXpress, Format::OperaPhenix] {
        let dir = tempfile::tempdir().expect("tempdir");
        let source = common::open(&plate(dir.path(), format));
        let before = hcsflow_testkit::contents(&source.root);
        let out1 = dir.path().join("out1");
        run(&source, MAX_Z, &out1);

        // Pointing at OUT or at the step folder opens the same plate.
        let first = open_plate(&out1, None).expect("open the run's output");
        assert_eq!(first, open_plate(&out1.join("max_z"), None).expect("open the step folder"));
        assert_eq!(first.format, Format::Hcsflow);
        let (m, s) = (&first.metadata, &source.metadata);
        assert_eq!(first.wells(), source.wells(), "{format}");
        assert_eq!((m.sites, m.channels, m.z_planes, m.timepoints), (4, 2, 1, 1));
        assert_eq!(m.channel_names, s.channel_names);
        assert_eq!(m.pixel_size_um, s.pixel_size_um);
        assert_eq!(m.stage_positions, s.stage_positions);
        assert_eq!((m.grid_rows, m.grid_cols, &m.site_cells), (s.grid_rows, s.grid_cols, &s.site_cells));
        assert_eq!((m.plate_rows, m.plate_columns), (s.plate_rows, s.plate_columns));
        assert_eq!((m.image_width, m.image_height, m.dtype), (Some(32), Some(32), s.dtype));
        assert!(first.missing.is_empty() && first.warnings.is_empty(), "{:?} {:?}", first.missing, first.warnings);
        // Every image is the max over z of the source's planes.
        let planes = index(&source);
        assert_eq!(first.images.len(), 2 * 4 * 2);
        for image in &first.images {
            let inputs: Vec<&Path> = (1..=3).map(|z| planes[&(image.well.clone(), image.site, image.channel, z, 1)].as_path()).collect();
            assert_eq!(read(&image.path), reduce(&inputs, u16::max), "{}", image.path.display());
        }

        // A second pipeline on the first's output folder: min over channels.
        let first_files = hcsflow_testkit::contents(&out1);
        let out2 = dir.path().join("out2");
        run(&first, MIN_C, &out2);
        let second = open_plate(&out2, None).expect("open the second run's output");
        assert_eq!(second.wells(), source.wells());
        assert_eq!((second.metadata.sites, second.metadata.channels, second.metadata.z_planes), (4, 1, 1));
        assert!(second.metadata.channel_names.is_empty(), "a reduced channel has no name");
        assert_eq!(second.metadata.stage_positions, s.stage_positions);
        let maxima = index(&first);
        for image in &second.images {
            let inputs: Vec<&Path> = (1..=2).map(|c| maxima[&(image.well.clone(), image.site, c, 1, 1)].as_path()).collect();
            assert_eq!(read(&image.path), reduce(&inputs, u16::min));
        }
        assert!(hcsflow_testkit::contents(&out1) == first_files, "the first run's output is the second run's input: untouched");
        assert!(hcsflow_testkit::contents(&source.root) == before, "the plate is untouched");
    }
}

#[test]
fn an_output_folder_with_several_image_steps_names_them() {
    let dir = tempfile::tempdir().expect("tempdir");
    let source = common::open(&plate(dir.path(), Format::ImageXpress));
    let out = dir.path().join("out");
    run(&source, TWO_STEPS, &out);
    let e = open_plate(&out, None).expect_err("two steps wrote images");
    assert!(matches!(e, PlateError::MultipleDescriptors { .. }), "{e:?}");
    let text = e.to_string();
    for step in ["max_z", "min_c"] {
        assert!(text.contains(&out.join(step).display().to_string()), "{text}");
    }
    // Each step folder is a plate of its own.
    assert_eq!(open_plate(&out.join("min_c"), None).expect("min_c").metadata.channels, 1);
    assert_eq!(open_plate(&out.join("max_z"), None).expect("max_z").metadata.channels, 2);
}

#[test]
fn a_damaged_output_plate_says_what_is_wrong() {
    let dir = tempfile::tempdir().expect("tempdir");
    let source = common::open(&plate(dir.path(), Format::ImageXpress));
    let out = dir.path().join("out");
    run(&source, MAX_Z, &out);
    let step = out.join("max_z");
    let descriptor = step.join(hcsflow_plate::run_output::DESCRIPTOR_NAME);

    // A deleted image is missing, with its path; the rest still opens.
    let gone = open_plate(&step, None).expect("open").images[0].path.clone();
    std::fs::remove_file(&gone).expect("remove");
    let plate = open_plate(&step, None).expect("open with one image gone");
    assert_eq!(plate.missing.len(), 1);
    assert_eq!(plate.missing[0].path.as_deref(), Some(gone.as_path()));

    // A name leaving the folder is never opened.
    let text = std::fs::read_to_string(&descriptor).expect("read");
    let escaped = text.replacen("\"file\": \"", "\"file\": \"../../plate/", 1);
    std::fs::write(&descriptor, escaped).expect("write");
    let plate = open_plate(&step, None).expect("open");
    assert!(plate.missing.iter().any(|m| m.reason.contains("leaves the plate folder")), "{:?}", plate.missing);

    // Not JSON of the descriptor's shape: an error naming the file.
    std::fs::write(&descriptor, "{\"version\": 1}").expect("write");
    let e = open_plate(&step, None).expect_err("bad descriptor");
    assert!(matches!(e, PlateError::Descriptor { .. }) && e.to_string().contains(&descriptor.display().to_string()), "{e}");
    std::fs::write(&descriptor, text.replacen("\"version\": 1", "\"version\": 99", 1)).expect("write");
    let e = open_plate(&step, None).expect_err("newer version");
    assert!(e.to_string().contains("version 99"), "{e}");
}
