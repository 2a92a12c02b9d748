//! ImageXpress plates whose file names start with the well (`A01_s001_w1.tif`,
//! `A01_s001_w1_z001.tif`), as OpenHCS's synthetic generator writes them.
//!
//! The reference is a synthetic plate with native MetaXpress names
//! (`<Plate>_<Well>_s<S>_w<W>.tif`, z in `ZStep_<z>/`), opened by the reader.
//! Each test copies its image files under prefix-less names in one of the
//! layouts OpenHCS uses and checks that the copy is read as the same plate:
//! the same wells × sites × channels × z × t, each component pointing at a file
//! with the same bytes, and the same plate metadata.

use std::path::{Path, PathBuf};

use hcsflow_plate::{open_plate, ImageRecord, Plate, PlateError};
use hcsflow_synth::{generate, SynthConfig};

/// 2 wells × 2×2 sites × 2 channels × 3 z, tiny tiles.
fn reference(dir: &Path) -> Plate {
    let cfg = SynthConfig {
        wells: vec!["A01".into(), "B02".into()],
        grid_rows: 2,
        grid_cols: 2,
        channels: 2,
        z_planes: 3,
        size: 24,
        ..SynthConfig::default()
    };
    let out = dir.join("reference");
    generate(&cfg, &out).unwrap_or_else(|e| panic!("generate: {e}"));
    let p = open_plate(&out, None).unwrap_or_else(|e| panic!("open reference: {e}"));
    assert!(p.images.iter().all(|i| i.path.file_name().unwrap().to_string_lossy().starts_with("Synth_Plate_1_")));
    assert_eq!(p.images.len(), 2 * 4 * 2 * 3);
    p
}

/// Copies `reference` (HTD and images) to `dir`, each image at `rename(image)`.
fn copy_as(reference: &Plate, dir: &Path, rename: impl Fn(&ImageRecord) -> PathBuf) -> PathBuf {
    std::fs::create_dir_all(dir).unwrap();
    std::fs::copy(&reference.descriptor, dir.join(reference.descriptor.file_name().unwrap())).unwrap();
    for img in &reference.images {
        let dst = dir.join(rename(img));
        std::fs::create_dir_all(dst.parent().unwrap()).unwrap();
        std::fs::copy(&img.path, &dst).unwrap();
    }
    dir.to_path_buf()
}

/// (well, site, channel, z, t) of an image.
type Components = (String, u32, u32, u32, u32);
/// How a layout names the copy of an image (path relative to the plate).
type Rename = Box<dyn Fn(&ImageRecord) -> PathBuf>;

/// Components and file bytes of every image, plate order.
fn contents(p: &Plate) -> Vec<(Components, Vec<u8>)> {
    p.images.iter().map(|i| ((i.well.clone(), i.site, i.channel, i.z_index, i.timepoint), std::fs::read(&i.path).unwrap())).collect()
}

fn assert_same_plate(reference: &Plate, copy: &Plate, what: &str) {
    assert_eq!(contents(copy), contents(reference), "{what}: images differ");
    assert_eq!(copy.metadata, reference.metadata, "{what}: metadata differs");
    assert_eq!(copy.missing, reference.missing, "{what}: missing differs");
    assert!(copy.projections.is_empty(), "{what}: {:?}", copy.projections);
    assert_eq!(copy.warnings, reference.warnings, "{what}: warnings differ");
}

#[test]
fn prefix_less_names_read_as_the_prefixed_plate() {
    let d = tempfile::tempdir().unwrap();
    let r = reference(d.path());
    let layouts: [(&str, Rename); 3] = [
        // OpenHCS's default for z-stacks: ZStep folders, names without z
        ("ZStep folders", Box::new(|i| format!("TimePoint_1/ZStep_{}/{}_s{:03}_w{}.tif", i.z_index, i.well, i.site, i.channel).into())),
        // z in the name, one folder
        ("_z names", Box::new(|i| format!("TimePoint_1/{}_s{:03}_w{}_z{:03}.tif", i.well, i.site, i.channel, i.z_index).into())),
        // OpenHCS's "all components" names, in ZStep folders as well
        (
            "_z_t names in ZStep folders",
            Box::new(|i| {
                format!("TimePoint_1/ZStep_{z}/{}_s{:03}_w{}_z{z:03}_t{:03}.tif", i.well, i.site, i.channel, i.timepoint, z = i.z_index)
                    .into()
            }),
        ),
    ];
    for (k, (what, rename)) in layouts.iter().enumerate() {
        let dir = copy_as(&r, &d.path().join(format!("copy{k}")), rename);
        let p = open_plate(&dir, None).unwrap_or_else(|e| panic!("{what}: {e}"));
        assert!(p.images.iter().all(|i| i.path.file_name().unwrap().to_string_lossy().starts_with(&i.well)), "{what}");
        assert_same_plate(&r, &p, what);
    }
}

#[test]
fn mixed_prefixed_and_prefix_less_names_are_an_error_naming_both() {
    let d = tempfile::tempdir().unwrap();
    let r = reference(d.path());
    let dir = copy_as(&r, &d.path().join("mixed"), |i| {
        format!("TimePoint_1/{}_s{:03}_w{}_z{:03}.tif", i.well, i.site, i.channel, i.z_index).into()
    });
    let odd = dir.join("TimePoint_1/Synth_Plate_1_B02_s4_w2_z3.tif");
    std::fs::rename(dir.join("TimePoint_1/B02_s004_w2_z003.tif"), &odd).unwrap();
    match open_plate(&dir, None) {
        Err(e @ PlateError::MixedNaming { .. }) => {
            let msg = e.to_string();
            assert!(msg.contains(&odd.display().to_string()), "{msg}");
            assert!(msg.contains(&dir.join("TimePoint_1/A01_s001_w1_z001.tif").display().to_string()), "{msg}");
        }
        other => panic!("expected MixedNaming, got {other:?}"),
    }
}

#[test]
fn z_token_disagreeing_with_its_zstep_folder_is_reported() {
    let d = tempfile::tempdir().unwrap();
    let r = reference(d.path());
    let dir = copy_as(&r, &d.path().join("zdiff"), |i| {
        format!("TimePoint_1/ZStep_{z}/{}_s{:03}_w{}_z{z:03}.tif", i.well, i.site, i.channel, z = i.z_index).into()
    });
    let odd = dir.join("TimePoint_1/ZStep_2/A01_s001_w1_z003.tif");
    std::fs::rename(dir.join("TimePoint_1/ZStep_2/A01_s001_w1_z002.tif"), &odd).unwrap();
    let p = open_plate(&dir, None).unwrap();
    // the folder decides, so the plate is still complete and identical
    assert_eq!(contents(&p), contents(&r));
    let w: Vec<&String> = p.warnings.iter().filter(|w| w.contains("ZStep_2")).collect();
    assert_eq!(w.len(), 1, "{:?}", p.warnings);
    assert!(w[0].starts_with(&odd.display().to_string()) && w[0].contains("_z3"), "{}", w[0]);
}
