//! synth → open_plate round trips over a matrix of layouts and edge cases,
//! for both formats: every option the generator writes must come back out of
//! the reader, and reading must not touch the plate.

use std::collections::{BTreeMap, BTreeSet};
use std::path::Path;

use hcsflow_core::{DType, Stack};
use hcsflow_plate::{open_plate, summary_text, Format, Plate};
use hcsflow_synth::{generate, GuidStyle, IxLayout, SynthConfig, SynthSummary};
use hcsflow_testkit::snapshot;

type Key = (String, u32, u32, u32, u32);

fn small(format: Format) -> SynthConfig {
    SynthConfig { format, size: 64, nuclei_density: 400.0, nucleus_radius_px: (3.0, 5.0), ..SynthConfig::default() }
}

/// Generates `cfg`, opens it (detected and with explicit format), checks
/// everything against the config and the generator's truth; returns both.
fn roundtrip(cfg: &SynthConfig) -> (tempfile::TempDir, SynthSummary, Plate) {
    let dir = tempfile::tempdir().unwrap();
    let out = dir.path().join("plate");
    let s = generate(cfg, &out).unwrap_or_else(|e| panic!("generate {cfg:?}: {e}"));
    let before = snapshot(&out);
    let plate = open_plate(&out, None).unwrap_or_else(|e| panic!("open: {e}"));
    let explicit = open_plate(&out, Some(cfg.format)).unwrap();
    assert_eq!(snapshot(&out), before, "opening the plate changed its files");
    assert_eq!(plate, explicit);
    assert_eq!(plate.format, cfg.format);

    let m = &plate.metadata;
    // wells
    assert_eq!(m.acquired_wells, s.wells, "acquired wells");
    let (pr, pc) = hcsflow_plate::well::plate_dimensions(cfg.plate_size).unwrap();
    assert_eq!((m.plate_rows, m.plate_columns), (pr, pc));
    // counts and dims
    assert_eq!(m.sites, s.sites);
    assert_eq!(m.channels, cfg.channels);
    assert_eq!(m.z_planes, cfg.z_planes);
    assert_eq!(m.timepoints, cfg.timepoints);
    assert_eq!((m.image_width, m.image_height), (Some(cfg.size), Some(cfg.size)));
    assert_eq!(m.dtype, Some(DType::U16));
    assert_eq!(m.bit_depth, Some(16));
    let px = m.pixel_size_um.expect("pixel size");
    assert!((px - cfg.pixel_size_um).abs() < 1e-9, "pixel size {px}");
    let names: BTreeMap<u32, String> = (1..=cfg.channels).map(|c| (c, cfg.channel_name(c))).collect();
    assert_eq!(m.channel_names, names);

    // images: exactly every plane not left out, numeric order
    let mut expected: BTreeSet<Key> = BTreeSet::new();
    for w in &s.wells {
        for site in 1..=s.sites {
            for c in 1..=cfg.channels {
                for z in 1..=cfg.z_planes {
                    for t in 1..=cfg.timepoints {
                        expected.insert((w.clone(), site, c, z, t));
                    }
                }
            }
        }
    }
    let missing: BTreeSet<Key> = s.missing.iter().map(|m| (m.well.clone(), m.site, m.channel, m.z_index, m.timepoint)).collect();
    let got: BTreeSet<Key> = plate.images.iter().map(|i| (i.well.clone(), i.site, i.channel, i.z_index, i.timepoint)).collect();
    assert_eq!(got.len(), plate.images.len(), "duplicate images");
    assert_eq!(got, expected.difference(&missing).cloned().collect::<BTreeSet<_>>());
    assert_eq!(plate.images.len(), s.images_written);
    assert!(plate.images.windows(2).all(|w| w[0].sort_key() < w[1].sort_key()), "numeric order");
    assert!(plate.images.iter().all(|i| i.path.is_file()));
    // missing planes reported, with the right reason
    let reported: BTreeSet<Key> = plate.missing.iter().map(|m| (m.well.clone(), m.site, m.channel, m.z_index, m.timepoint)).collect();
    assert_eq!(reported, missing, "missing planes");
    for mp in &s.missing {
        let r = plate
            .missing
            .iter()
            .find(|x| {
                x.well == mp.well && x.site == mp.site && x.channel == mp.channel && x.z_index == mp.z_index && x.timepoint == mp.timepoint
            })
            .unwrap();
        match mp.kind.as_str() {
            "empty-url" => assert!(r.reason.contains("empty URL"), "{}", r.reason),
            _ if cfg.format == Format::OperaPhenix => assert!(r.reason.contains("not found") && r.path.is_some(), "{}", r.reason),
            _ => assert!(r.reason.contains("no image file"), "{}", r.reason),
        }
    }

    // grid, site cells, stage positions
    assert_eq!((m.grid_rows, m.grid_cols), (cfg.grid_rows, cfg.grid_cols), "grid");
    for t in &s.tiles {
        assert_eq!(m.site_cell(t.site), Some((t.grid_row, t.grid_col)), "cell of site {}", t.site);
        if cfg.format == Format::OperaPhenix {
            assert_eq!(m.field_to_site.get(&t.field_id), Some(&t.site), "field {}", t.field_id);
        }
        let has_image = plate.images.iter().any(|i| i.well == t.well && i.site == t.site);
        if has_image {
            let (x, y) = m.stage_position(&t.well, t.site).unwrap_or_else(|| panic!("no stage position for {} {}", t.well, t.site));
            assert!(
                (x - t.stage_x_um).abs() < 1e-6 && (y - t.stage_y_um).abs() < 1e-6,
                "{} s{}: ({x}, {y}) vs ({}, {})",
                t.well,
                t.site,
                t.stage_x_um,
                t.stage_y_um
            );
        }
    }

    // pixels: right shape and dtype
    let first = hcsflow_tiff::read_stack(&plate.images[0].path).unwrap();
    assert_eq!(first.shape(), [1, cfg.size as usize, cfg.size as usize]);
    assert_eq!(first.dtype(), DType::U16);

    // JSON and text views
    let json = serde_json::to_string(&plate).unwrap();
    let mut back: Plate = serde_json::from_str(&json).unwrap();
    // serde_json parses floats to within an ulp; everything else is exact
    for (b, p) in back.metadata.stage_positions.iter_mut().zip(&plate.metadata.stage_positions) {
        assert!((b.x_um - p.x_um).abs() < 1e-9 && (b.y_um - p.y_um).abs() < 1e-9);
        (b.x_um, b.y_um) = (p.x_um, p.y_um);
    }
    assert_eq!(back, plate);
    let text = summary_text(&plate);
    assert!(text.contains(cfg.format.name()));
    assert!(text.contains(&format!("Images:      {}", plate.images.len())), "{text}");
    assert!(text.contains(&format!("Missing:     {}", plate.missing.len())), "{text}");
    assert!(text.contains(&format!("1={}", cfg.channel_name(1))), "{text}");
    (dir, s, plate)
}

#[test]
fn imagexpress_default_layout() {
    let (_d, _s, p) = roundtrip(&small(Format::ImageXpress));
    // the Windows-1252 description (en dash, micro sign) decodes
    assert_eq!(p.metadata.description.as_deref(), Some("Synthetic plate \u{2013} 0.65 \u{b5}m/px"));
    assert!(p.warnings.is_empty(), "{:?}", p.warnings);
    assert!(p.images[0].path.to_string_lossy().contains("TimePoint_1"));
}

#[test]
fn imagexpress_1536_guid_thumbnails_upper_case_single_channel_skipped_site() {
    let cfg = SynthConfig {
        plate_size: 1536,
        wells: vec!["AF48".into(), "A01".into(), "AA12".into()],
        grid_rows: 2,
        grid_cols: 3,
        skip_sites: vec![2],
        channels: 1,
        guid_style: GuidStyle::Bare,
        thumbnails: true,
        upper_case_tif: true,
        plate_name: "Week1_150607".into(),
        ..small(Format::ImageXpress)
    };
    let (_d, s, p) = roundtrip(&cfg);
    assert!(p.warnings.is_empty(), "{:?}", p.warnings);
    assert_eq!(s.sites, 5);
    assert!(s.thumbnails_written > 0);
    assert!(p.images.iter().all(|i| !i.path.to_string_lossy().contains("_thumb")));
    let name = p.images[0].path.file_name().unwrap().to_string_lossy().into_owned();
    assert!(name.starts_with("Week1_150607_A01_s1") && name.ends_with(".TIF") && name.len() > 40, "{name}");
    assert_eq!(p.wells(), ["A01", "AA12", "AF48"]);
}

#[test]
fn imagexpress_single_site_z_stack_projection_timepoints_bracketed_guid_missing() {
    let cfg = SynthConfig {
        grid_rows: 1,
        grid_cols: 1,
        channels: 3,
        z_planes: 3,
        z_projection: true,
        timepoints: 2,
        guid_style: GuidStyle::Bracketed,
        missing_planes: 3,
        ..small(Format::ImageXpress)
    };
    let (_d, s, p) = roundtrip(&cfg);
    assert_eq!(s.missing.len(), 3);
    // single site: no _s in names
    assert!(p.images.iter().all(|i| !i.path.file_name().unwrap().to_string_lossy().contains("_s1")));
    assert!(p.images.iter().any(|i| i.path.to_string_lossy().contains("ZStep_3")));
    assert_eq!(p.projections.len(), s.projections_written);
    assert_eq!(p.projections.len(), 2 * 3 * 2); // wells x channels x timepoints
    assert!(p.projections.iter().all(|i| i.z_index == 0));
    assert!(p.warnings.is_empty(), "{:?}", p.warnings);
}

#[test]
fn imagexpress_flat_384_and_sites_past_nine_sort_numerically() {
    let cfg = SynthConfig {
        plate_size: 384,
        wells: vec!["P24".into(), "A01".into()],
        grid_rows: 3,
        grid_cols: 4,
        ix_layout: IxLayout::Flat,
        cp1252_description: false,
        missing_planes: 1,
        ..small(Format::ImageXpress)
    };
    let (_d, _s, p) = roundtrip(&cfg);
    let sites: Vec<u32> = p.images.iter().filter(|i| i.well == "A01" && i.channel == 1).map(|i| i.site).collect();
    let mut sorted = sites.clone();
    sorted.sort();
    assert_eq!(sites, sorted);
    assert!(sites.contains(&10) && sites.contains(&12));
    assert!(p.images.iter().all(|i| i.path.parent() == Some(p.root.as_path())));
}

#[test]
fn phenix_default_layout_fields_are_placed_by_position() {
    let (_d, s, p) = roundtrip(&small(Format::OperaPhenix));
    assert!(p.warnings.is_empty(), "{:?}", p.warnings);
    // centre-first snake: field 1 is the centre cell, which is raster site 5
    assert_eq!(p.metadata.field_to_site.get(&1), Some(&5));
    assert_eq!(p.metadata.field_to_site.get(&2), Some(&1));
    assert_eq!(p.metadata.field_to_site.get(&6), Some(&4));
    assert!(s.tiles.iter().any(|t| t.field_id != t.site));
    // by default the metadata reports nominal positions; the truth is jittered
    assert!(s.tiles.iter().any(|t| (t.stage_x_um - t.true_stage_x_um).abs() > 0.1));
    assert!(s.tiles.iter().all(|t| (t.stage_x_um - t.true_stage_x_um).abs() <= 2.0 * 0.65 + 1e-9));
    assert!(p.descriptor.ends_with("Images/Index.idx.xml"));
}

#[test]
fn phenix_1536_v6_index_xml_z_t_missing() {
    let cfg = SynthConfig {
        plate_size: 1536,
        wells: vec!["AF48".into(), "B03".into()],
        grid_rows: 4,
        grid_cols: 4,
        harmony_v6: true,
        phenix_index_name: "Index.xml".into(),
        missing_planes: 4,
        z_planes: 2,
        timepoints: 2,
        ..small(Format::OperaPhenix)
    };
    let (_d, s, p) = roundtrip(&cfg);
    assert_eq!(s.missing.iter().filter(|m| m.kind == "empty-url").count(), 2);
    assert!(p.descriptor.ends_with("Index.xml"));
    // sk in the names is t + 1 of the 0-based TimepointID
    assert!(p.images.iter().filter(|i| i.timepoint == 2).all(|i| i.path.to_string_lossy().contains("sk2")));
    assert!(p.warnings.is_empty(), "{:?}", p.warnings);
}

#[test]
fn phenix_single_field_single_channel_ref_index() {
    let cfg =
        SynthConfig { grid_rows: 1, grid_cols: 1, channels: 1, phenix_index_name: "Index.ref.xml".into(), ..small(Format::OperaPhenix) };
    let (_d, _s, p) = roundtrip(&cfg);
    assert_eq!(p.metadata.field_to_site.len(), 1);
}

#[test]
fn phenix_skipped_field_three_channels_large_jitter_true_stage() {
    let cfg = SynthConfig {
        grid_rows: 3,
        grid_cols: 4,
        skip_sites: vec![6],
        channels: 3,
        channel_names: vec!["Hoechst".into(), "Phalloidin".into()],
        jitter_px: 7.5,
        stage_reports_truth: true,
        seed: 99,
        ..small(Format::OperaPhenix)
    };
    let (_d, s, p) = roundtrip(&cfg);
    assert_eq!(s.sites, 11);
    assert_eq!(p.metadata.channel_names.get(&1).map(String::as_str), Some("Hoechst"));
    assert_eq!(p.metadata.channel_names.get(&3).map(String::as_str), Some("Cy3"));
    // with stage_reports_truth, reported = true positions (jitter visible)
    assert!(s.tiles.iter().all(|t| t.stage_x_um == t.true_stage_x_um && t.stage_y_um == t.true_stage_y_um));
    assert!(s.tiles.iter().any(|t| (t.x_px - t.nominal_x_px).abs() > 0.5));
}

#[test]
fn same_seed_same_bytes_different_seed_different_pixels() {
    let cfg = small(Format::ImageXpress);
    let (d1, _, p1) = roundtrip(&cfg);
    let (d2, _, p2) = roundtrip(&cfg);
    let (d3, _, p3) = roundtrip(&SynthConfig { seed: 1, ..cfg });
    let read = |p: &Plate, root: &Path| -> Vec<u8> {
        let rel = p.images[3].path.strip_prefix(&p.root).unwrap().to_path_buf();
        std::fs::read(root.join("plate").join(rel)).unwrap()
    };
    assert_eq!(read(&p1, d1.path()), read(&p2, d2.path()));
    assert_ne!(read(&p1, d1.path()), read(&p3, d3.path()));
    assert_eq!(
        std::fs::read(d1.path().join("plate/ground_truth/nuclei.csv")).unwrap(),
        std::fs::read(d2.path().join("plate/ground_truth/nuclei.csv")).unwrap()
    );
}

#[test]
fn ground_truth_files_match_the_summary() {
    let cfg = SynthConfig {
        z_planes: 5,
        z_focus: Some(2.0),
        channels: 1,
        grid_rows: 1,
        grid_cols: 2,
        defocus_px_per_plane: 2.5,
        ..small(Format::ImageXpress)
    };
    let (d, s, p) = roundtrip(&cfg);
    let gt = d.path().join("plate/ground_truth");
    let tiles = std::fs::read_to_string(gt.join("tile_positions.csv")).unwrap();
    assert_eq!(tiles.lines().count(), 1 + s.tiles.len());
    let nuclei = std::fs::read_to_string(gt.join("nuclei.csv")).unwrap();
    assert_eq!(nuclei.lines().count(), 1 + s.nuclei);
    assert!(s.nuclei > 0);
    let focus: serde_json::Value = serde_json::from_str(&std::fs::read_to_string(gt.join("focus.json")).unwrap()).unwrap();
    assert_eq!(focus["z_focus"], 2.0);
    let back: SynthConfig = serde_json::from_str(&std::fs::read_to_string(gt.join("synth_config.json")).unwrap()).unwrap();
    assert_eq!(back, cfg);
    match hcsflow_tiff::read_stack(&gt.join("flatfield.tif")).unwrap() {
        Stack::F32(a) => {
            let expect = hcsflow_synth::render::flatfield(64, cfg.flatfield_strength);
            assert_eq!(a.pixels(), &expect[..]);
        }
        other => panic!("flat-field dtype {:?}", other.dtype()),
    }
    // defocus: the in-focus plane is the sharpest (largest variance) of the stack
    let var = |z: u32| {
        let img = p.image("A01", 1, 1, z, 1).unwrap();
        let a = hcsflow_tiff::read_stack(&img.path).unwrap().to_f32();
        let mean = a.mean().unwrap();
        a.mapv(|v| (v - mean).powi(2)).mean().unwrap()
    };
    let v: Vec<f32> = (1..=5).map(var).collect();
    assert!(v[1] > v[0] && v[1] > v[2] && v[2] > v[3] && v[3] > v[4], "{v:?}");
}

#[test]
fn refuses_non_empty_folder_and_foreign_overwrite() {
    let dir = tempfile::tempdir().unwrap();
    std::fs::write(dir.path().join("precious.txt"), b"x").unwrap();
    let cfg = small(Format::ImageXpress);
    assert!(matches!(generate(&cfg, dir.path()), Err(hcsflow_synth::SynthError::NotEmpty { .. })));
    let over = SynthConfig { overwrite: true, ..cfg.clone() };
    assert!(matches!(generate(&over, dir.path()), Err(hcsflow_synth::SynthError::NotSynthetic { .. })));
    assert!(dir.path().join("precious.txt").exists());
    assert!(matches!(generate(&over, &dir.path().join("precious.txt")), Err(hcsflow_synth::SynthError::NotADirectory { .. })));
    // a previous synthetic plate may be replaced
    let out = dir.path().join("p");
    generate(&cfg, &out).unwrap();
    assert!(generate(&cfg, &out).is_err());
    let s = generate(&SynthConfig { format: Format::OperaPhenix, ..over }, &out).unwrap();
    assert_eq!(open_plate(&out, None).unwrap().images.len(), s.images_written);
}

#[test]
fn invalid_configs_are_errors() {
    let base = small(Format::ImageXpress);
    let bad = [
        SynthConfig { plate_size: 100, ..base.clone() },
        SynthConfig { wells: vec!["Q01".into()], ..base.clone() },
        SynthConfig { plate_size: 384, wells: vec!["AF48".into()], ..base.clone() },
        SynthConfig { channels: 10, ..base.clone() },
        SynthConfig { grid_rows: 0, ..base.clone() },
        SynthConfig { overlap: 0.95, ..base.clone() },
        SynthConfig { dtype: DType::F32, ..base.clone() },
        SynthConfig { ix_layout: IxLayout::Flat, z_planes: 2, ..base.clone() },
        SynthConfig { skip_sites: (1..=9).collect(), ..base.clone() },
        SynthConfig { missing_planes: 1000, ..base.clone() },
        SynthConfig { phenix_index_name: "index.txt".into(), ..base.clone() },
        SynthConfig { focus_blur_px: -1.0, ..base.clone() },
        SynthConfig { focus_blur_px: f64::NAN, ..base.clone() },
        SynthConfig { defocus_px_per_plane: f64::INFINITY, ..base.clone() },
    ];
    for cfg in bad {
        let dir = tempfile::tempdir().unwrap();
        match generate(&cfg, &dir.path().join("p")) {
            Err(hcsflow_synth::SynthError::InvalidConfig(_)) => {}
            other => panic!("{cfg:?}: expected InvalidConfig, got {other:?}"),
        }
    }
}

/// Pearson correlation of two equally long slices.
fn corr(a: &[f64], b: &[f64]) -> f64 {
    let n = a.len() as f64;
    let (ma, mb) = (a.iter().sum::<f64>() / n, b.iter().sum::<f64>() / n);
    let cov: f64 = a.iter().zip(b).map(|(x, y)| (x - ma) * (y - mb)).sum();
    let va: f64 = a.iter().map(|x| (x - ma).powi(2)).sum();
    let vb: f64 = b.iter().map(|y| (y - mb).powi(2)).sum();
    cov / (va * vb).sqrt()
}

#[test]
fn tiles_are_flatfield_times_truth_window_at_the_true_position() {
    // integer positions (no jitter, 25 % overlap of 64 px = 48 px steps)
    let cfg = SynthConfig {
        jitter_px: 0.0,
        overlap: 0.25,
        truth_images: true,
        channels: 1,
        nuclei_density: 4000.0,
        wells: vec!["C04".into()],
        ..small(Format::OperaPhenix)
    };
    let (d, s, p) = roundtrip(&cfg);
    let gt = d.path().join("plate/ground_truth");
    let truth = match hcsflow_tiff::read_stack(&gt.join("truth_C04_ch1.tif")).unwrap() {
        Stack::F32(a) => a,
        other => panic!("{:?}", other.dtype()),
    };
    let ff = hcsflow_synth::render::flatfield(64, cfg.flatfield_strength);
    for t in &s.tiles {
        let img = hcsflow_tiff::read_stack(&p.image("C04", t.site, 1, 1, 1).unwrap().path).unwrap().to_f32();
        let (x0, y0) = (t.x_px as usize, t.y_px as usize);
        assert_eq!((x0 as f64, y0 as f64), (t.x_px, t.y_px));
        let tile: Vec<f64> = img.iter().map(|&v| f64::from(v)).collect();
        let window = |x: usize| -> Vec<f64> {
            (0..64 * 64).map(|k| f64::from(truth[[0, y0 + k / 64, x + k % 64]]) * f64::from(ff[k]) + cfg.dark_offset).collect()
        };
        let exact = window(x0);
        let c = corr(&tile, &exact);
        assert!(c > 0.95, "site {}: correlation {c}", t.site);
        // the mean intensity matches dark + flatfield * truth (noise is zero-mean)
        let diff = tile.iter().zip(&exact).map(|(a, b)| a - b).sum::<f64>() / tile.len() as f64;
        assert!(diff.abs() < 1.5, "site {}: mean residual {diff}", t.site);
        // a window 3 px off matches clearly worse: the test can tell positions apart
        let off = if x0 >= 3 { x0 - 3 } else { x0 + 3 };
        assert!(corr(&tile, &window(off)) < c - 0.1, "site {}", t.site);
    }
}

#[test]
fn an_in_focus_blur_blurs_every_plane_and_the_clean_image_is_the_blurred_truth() {
    // One tile at an integer position, so tile pixels and image pixels align.
    let cfg = SynthConfig {
        jitter_px: 0.0,
        truth_images: true,
        channels: 1,
        grid_rows: 1,
        grid_cols: 1,
        nuclei_density: 4000.0,
        focus_blur_px: 2.0,
        z_planes: 3,
        wells: vec!["A01".into()],
        ..small(Format::ImageXpress)
    };
    let (d, s, p) = roundtrip(&cfg);
    let gt = d.path().join("plate/ground_truth");
    let plane = |name: &str| -> (Vec<f64>, usize) {
        let a = hcsflow_tiff::read_stack(&gt.join(name)).unwrap().to_f32();
        (a.iter().map(|&v| f64::from(v)).collect(), a.shape()[2])
    };
    let ((truth, frame_width), (clean, _)) = (plane("truth_A01_ch1.tif"), plane("clean_A01_ch1.tif"));
    let focus: serde_json::Value = serde_json::from_str(&std::fs::read_to_string(gt.join("focus.json")).unwrap()).unwrap();
    assert_eq!(focus["focus_blur_sigma_px"], 2.0);
    // Blurring conserves the signal (nuclei away from the frame's border
    // aside: a few percent) and lowers the peaks.
    let sum = |v: &[f64]| v.iter().sum::<f64>();
    assert!((sum(&clean) / sum(&truth) - 1.0).abs() < 0.03, "{} vs {}", sum(&clean), sum(&truth));
    let max = |v: &[f64]| v.iter().cloned().fold(f64::MIN, f64::max);
    assert!(max(&clean) < 0.97 * max(&truth), "{} vs {}", max(&clean), max(&truth));
    // The acquired in-focus tile (z 2 of 3, noise aside) follows the clean
    // image better than the unblurred truth.
    let t = &s.tiles[0];
    let ff = hcsflow_synth::render::flatfield(64, cfg.flatfield_strength);
    let tile: Vec<f64> =
        hcsflow_tiff::read_stack(&p.image("A01", t.site, 1, 2, 1).unwrap().path).unwrap().to_f32().iter().map(|&v| f64::from(v)).collect();
    let window = |image: &[f64]| -> Vec<f64> {
        let (x0, y0) = (t.x_px as usize, t.y_px as usize);
        (0..64 * 64).map(|k| image[(y0 + k / 64) * frame_width + x0 + k % 64] * f64::from(ff[k])).collect()
    };
    let (to_clean, to_truth) = (corr(&tile, &window(&clean)), corr(&tile, &window(&truth)));
    assert!(to_clean > 0.95 && to_clean > to_truth + 0.005, "clean {to_clean}, truth {to_truth}");
    // Without the blur no clean image is written: it would be the truth again.
    let sharp = SynthConfig { focus_blur_px: 0.0, ..cfg };
    let (d, _, _) = roundtrip(&sharp);
    let gt = d.path().join("plate/ground_truth");
    assert!(gt.join("truth_A01_ch1.tif").is_file() && !gt.join("clean_A01_ch1.tif").exists());
}

#[test]
fn a_well_is_the_same_whichever_wells_come_with_it() {
    let a = SynthConfig { wells: vec!["B02".into()], ..small(Format::ImageXpress) };
    let b = SynthConfig { wells: vec!["A01".into(), "B02".into(), "H12".into()], ..small(Format::ImageXpress) };
    let (da, sa, pa) = roundtrip(&a);
    let (db, sb, pb) = roundtrip(&b);
    let bytes = |p: &Plate, d: &Path| {
        let img = p.image("B02", 5, 2, 1, 1).unwrap();
        std::fs::read(d.join("plate").join(img.path.strip_prefix(&p.root).unwrap())).unwrap()
    };
    assert_eq!(bytes(&pa, da.path()), bytes(&pb, db.path()));
    let tiles_b02 = |s: &SynthSummary| s.tiles.iter().filter(|t| t.well == "B02").cloned().collect::<Vec<_>>();
    assert_eq!(tiles_b02(&sa), tiles_b02(&sb));
}
