//! Fuzz-style and hand-built plates: garbage descriptors, malformed index XML,
//! unknown file names, detection. Every case must end in a specific error or
//! warning — never a panic.

use std::path::Path;

use hcsflow_core::Stack;
use hcsflow_plate::{detect, open_plate, Format, PlateError};
use ndarray::Array3;

const HTD: &str = "\"HTSInfoFile\", Version 1.0\r\n\"Description\", \"test\"\r\n\"TimePoints\", 1\r\n\"ZSeries\", FALSE\r\n\"XWells\", 12\r\n\"YWells\", 8\r\n\"WellsSelection1\", TRUE, FALSE, FALSE, FALSE, FALSE, FALSE, FALSE, FALSE, FALSE, FALSE, FALSE, FALSE\r\n\"Sites\", TRUE\r\n\"XSites\", 2\r\n\"YSites\", 1\r\n\"SiteSelection1\", TRUE, TRUE\r\n\"Waves\", TRUE\r\n\"NWavelengths\", 2\r\n\"WaveName1\", \"DAPI\"\r\n\"WaveName2\", \"FITC, 488\"\r\n\"EndFile\"\r\n";

fn tiff(path: &Path) {
    let s = Stack::from(Array3::<u16>::from_elem((1, 8, 8), 7u16));
    hcsflow_tiff::write_stack(path, &s, &hcsflow_tiff::WriteOptions::default()).unwrap();
}

/// Deterministic pseudo-random bytes (bits 24..32 of the test generator's outputs).
fn noise(seed: u64, n: usize) -> Vec<u8> {
    hcsflow_testkit::random_values(n, seed, |v| (v >> 24) as u8)
}

fn ix_plate(dir: &Path) {
    std::fs::write(dir.join("My_Plate.HTD"), HTD).unwrap();
    for s in 1..=2 {
        for w in 1..=2 {
            tiff(&dir.join(format!("My_Plate_A01_s{s}_w{w}.tif")));
        }
    }
}

#[test]
fn valid_hand_built_imagexpress_plate() {
    let d = tempfile::tempdir().unwrap();
    ix_plate(d.path());
    let p = open_plate(d.path(), None).unwrap();
    assert_eq!(p.images.len(), 4);
    assert_eq!(p.metadata.channel_names.get(&2).map(String::as_str), Some("FITC, 488"));
    assert!(p.missing.is_empty());
    // no MetaSeries XML in these TIFFs: reported, not fatal
    assert!(p.warnings.iter().any(|w| w.contains("stage-position")), "{:?}", p.warnings);
    assert!(p.warnings.iter().any(|w| w.contains("pixel size")), "{:?}", p.warnings);
    assert_eq!(p.metadata.image_width, Some(8));
}

#[test]
fn unknown_file_names_are_warnings_naming_the_files() {
    let d = tempfile::tempdir().unwrap();
    ix_plate(d.path());
    tiff(&d.path().join("overlay_export.tif"));
    tiff(&d.path().join("My_Plate_A1_s1_w1.tif"));
    std::fs::write(d.path().join("notes.txt"), "x").unwrap();
    std::fs::write(d.path().join("My_Plate_A01_s1_w1.png"), "x").unwrap();
    tiff(&d.path().join("My_Plate_A01_s1_w1_thumb.tif"));
    let p = open_plate(d.path(), None).unwrap();
    assert_eq!(p.images.len(), 4);
    let w = p.warnings.iter().find(|w| w.contains("not ImageXpress image names")).expect("warning");
    assert!(w.starts_with("2 TIFF"), "{w}");
    assert!(w.contains("overlay_export.tif") && w.contains("My_Plate_A1_s1_w1.tif"), "{w}");
    assert!(!w.contains("thumb") && !w.contains("notes.txt"), "{w}");
}

#[test]
fn names_that_contradict_the_htd_are_reported() {
    let d = tempfile::tempdir().unwrap();
    ix_plate(d.path());
    tiff(&d.path().join("My_Plate_A01_s1.tif")); // no wave although 2 wavelengths
    tiff(&d.path().join("My_Plate_A01_s7_w1.tif")); // site beyond the selection
    tiff(&d.path().join("My_Plate_B03_s1_w1.tif")); // well not selected
    let p = open_plate(d.path(), None).unwrap();
    let all = p.warnings.join("\n");
    assert!(all.contains("My_Plate_A01_s1.tif: no _w<wave>"), "{all}");
    assert!(all.contains("site 7 is outside"), "{all}");
    assert!(all.contains("wells not selected"), "{all}");
    assert_eq!(p.images.len(), 6);
}

#[test]
fn missing_images_are_listed() {
    let d = tempfile::tempdir().unwrap();
    ix_plate(d.path());
    std::fs::remove_file(d.path().join("My_Plate_A01_s2_w2.tif")).unwrap();
    let p = open_plate(d.path(), None).unwrap();
    assert_eq!(p.missing.len(), 1);
    assert_eq!((p.missing[0].site, p.missing[0].channel), (2, 2));
    let text = hcsflow_plate::summary_text(&p);
    for want in [
        "Format:      imagexpress",
        "Wells:       1 with images, 1 acquired (A01)",
        "Sites:       2 (grid 1 rows x 2 columns)",
        "Channels:    2 (1=DAPI, 2=FITC, 488)",
        "Image:       8 x 8 px, u16 (16-bit)",
        "Images:      3",
        "Missing:     1",
        "  A01 site 2 channel 2 z 1 t 1: no image file found",
        "Pixel size:  unknown",
    ] {
        assert!(text.contains(want), "{want:?} not in\n{text}");
    }
    assert!(text.contains(&format!("Warnings:    {}", p.warnings.len())));
}

#[test]
fn garbage_htd_files_are_errors_naming_the_file() {
    for seed in 0..40u64 {
        let d = tempfile::tempdir().unwrap();
        ix_plate(d.path());
        let htd = d.path().join("My_Plate.HTD");
        std::fs::write(&htd, noise(seed, 10 + 37 * seed as usize)).unwrap();
        match open_plate(d.path(), None) {
            Err(PlateError::Htd { path, .. }) => assert_eq!(path, htd),
            other => panic!("seed {seed}: {other:?}"),
        }
    }
}

#[test]
fn every_truncation_and_mutation_of_an_htd_is_handled() {
    let d = tempfile::tempdir().unwrap();
    ix_plate(d.path());
    let htd = d.path().join("My_Plate.HTD");
    let bytes = HTD.as_bytes();
    for cut in 0..bytes.len() {
        std::fs::write(&htd, &bytes[..cut]).unwrap();
        match open_plate(d.path(), None) {
            Ok(p) => assert!(!p.images.is_empty()),
            Err(e) => assert!(e.to_string().contains("My_Plate.HTD") || matches!(e, PlateError::NoImages { .. }), "{e}"),
        }
    }
    for seed in 0..200u64 {
        let mut m = bytes.to_vec();
        let r = noise(seed, 3);
        let i = (usize::from(r[0]) * 256 + usize::from(r[1])) % m.len();
        m[i] = r[2];
        std::fs::write(&htd, &m).unwrap();
        let _ = open_plate(d.path(), None); // must not panic
    }
}

#[test]
fn htd_without_images_is_no_images() {
    let d = tempfile::tempdir().unwrap();
    std::fs::write(d.path().join("P.htd"), HTD).unwrap();
    assert!(matches!(open_plate(d.path(), None), Err(PlateError::NoImages { .. })));
}

#[test]
fn two_htd_files_are_ambiguous() {
    let d = tempfile::tempdir().unwrap();
    ix_plate(d.path());
    std::fs::write(d.path().join("Other.HTD"), HTD).unwrap();
    assert!(matches!(open_plate(d.path(), None), Err(PlateError::MultipleDescriptors { .. })));
    // pointing at one of them works
    assert_eq!(open_plate(&d.path().join("My_Plate.HTD"), None).unwrap().images.len(), 4);
}

/// (FieldID, ChannelID, TimepointID, URL, stage position in metres)
type Entry<'a> = (u32, u32, u32, &'a str, Option<(f64, f64)>);

fn index_xml(ns: &str, images: &[Entry]) -> String {
    let mut s = format!("<?xml version=\"1.0\" encoding=\"utf-8\"?>\n<EvaluationInputData Version=\"1\" xmlns=\"{ns}\">\n<Plates><Plate><Name>P</Name><PlateRows>16</PlateRows><PlateColumns>24</PlateColumns></Plate></Plates>\n<Images>\n");
    for (i, (field, ch, t0, url, pos)) in images.iter().enumerate() {
        s.push_str(&format!(
            "<Image Version=\"1\"><id>{i}</id><URL>{url}</URL><Row>2</Row><Col>3</Col><FieldID>{field}</FieldID><PlaneID>1</PlaneID><TimepointID>{t0}</TimepointID><ChannelID>{ch}</ChannelID><ChannelName>C{ch}</ChannelName><ImageResolutionX Unit=\"m\">1E-06</ImageResolutionX><ImageSizeX>100</ImageSizeX><ImageSizeY>100</ImageSizeY><MaxIntensity>4095</MaxIntensity>"
        ));
        if let Some((x, y)) = pos {
            s.push_str(&format!("<PositionX Unit=\"m\">{x:E}</PositionX><PositionY Unit=\"m\">{y:E}</PositionY>"));
        }
        s.push_str("</Image>\n");
    }
    s.push_str("</Images>\n</EvaluationInputData>\n");
    s
}

#[test]
fn hand_built_phenix_index_in_plate_dir_with_bom_and_v6() {
    let d = tempfile::tempdir().unwrap();
    std::fs::create_dir(d.path().join("Images")).unwrap();
    // two fields side by side: field 1 on the right (x = +50 µm), field 2 on the left
    let imgs = [
        (1, 1, 0, "r02c03f01p01-ch1sk1fk1fl1.tiff", Some((50e-6, 0.0))),
        (2, 1, 0, "r02c03f02p01-ch1sk1fk1fl1.tiff", Some((-50e-6, 0.0))),
        (1, 1, 1, "", Some((50e-6, 0.0))),
        (2, 1, 1, "r02c03f02p01-ch1sk2fk1fl1.tiff", Some((-50e-6, 0.0))),
    ];
    for (_, _, _, url, _) in &imgs[..2] {
        tiff(&d.path().join("Images").join(url));
    }
    let mut bytes = b"\xEF\xBB\xBF".to_vec();
    bytes.extend_from_slice(index_xml("http://www.perkinelmer.com/PEHH/HarmonyV6", &imgs).as_bytes());
    std::fs::write(d.path().join("Index.xml"), bytes).unwrap();
    assert_eq!(detect(d.path()).unwrap(), Format::OperaPhenix);
    let p = open_plate(d.path(), None).unwrap();
    assert!(p.warnings.is_empty(), "{:?}", p.warnings);
    assert_eq!(p.metadata.field_to_site.get(&2), Some(&1)); // left field is site 1
    assert_eq!(p.metadata.field_to_site.get(&1), Some(&2));
    assert_eq!((p.metadata.grid_rows, p.metadata.grid_cols), (1, 2));
    assert_eq!(p.images.len(), 2);
    assert!(p.images.iter().all(|i| i.well == "B03"));
    assert_eq!(p.missing.len(), 2);
    assert!(p.missing.iter().any(|m| m.reason.contains("empty URL") && m.timepoint == 2 && m.site == 2));
    assert!(p.missing.iter().any(|m| m.reason.contains("not found") && m.timepoint == 2 && m.site == 1));
    assert_eq!(p.metadata.bit_depth, Some(12));
    assert_eq!(p.metadata.pixel_size_um, Some(1.0));
    assert_eq!(p.metadata.stage_position("B03", 2), Some((50.0, -0.0)));
}

#[test]
fn phenix_rows_come_from_minus_y() {
    let d = tempfile::tempdir().unwrap();
    let imgs = [
        (1, 1, 0, "a.tiff", Some((0.0, -80e-6))), // lower on the stage → second row
        (2, 1, 0, "b.tiff", Some((0.0, 80e-6))),
    ];
    std::fs::write(d.path().join("Index.idx.xml"), index_xml("http://www.perkinelmer.com/PEHH/HarmonyV5", &imgs)).unwrap();
    tiff(&d.path().join("a.tiff"));
    tiff(&d.path().join("b.tiff"));
    let p = open_plate(d.path(), None).unwrap();
    assert_eq!(p.metadata.field_to_site.get(&2), Some(&1));
    assert_eq!((p.metadata.grid_rows, p.metadata.grid_cols), (2, 1));
    // file names that are not Phenix names are accepted (the index is authoritative)
    assert_eq!(p.images.len(), 2);
}

#[test]
fn malformed_index_xml_is_an_error_naming_the_file() {
    let good = index_xml("http://www.perkinelmer.com/PEHH/HarmonyV5", &[(1, 1, 0, "a.tiff", Some((0.0, 0.0)))]);
    let d = tempfile::tempdir().unwrap();
    let idx = d.path().join("Index.idx.xml");
    tiff(&d.path().join("a.tiff"));
    for cut in [0, 10, good.len() / 2, good.len() - 5] {
        std::fs::write(&idx, &good.as_bytes()[..cut]).unwrap();
        match open_plate(d.path(), Some(Format::OperaPhenix)) {
            Err(PlateError::Xml { path, .. }) => assert_eq!(path, idx),
            other => panic!("cut {cut}: {other:?}"),
        }
    }
    std::fs::write(&idx, "<EvaluationInputData xmlns=\"x\"><Plates/></EvaluationInputData>").unwrap();
    assert!(matches!(open_plate(d.path(), None), Err(PlateError::IndexContent { .. })));
    std::fs::write(&idx, good.replace("<Row>2</Row>", "<Row>two</Row>")).unwrap();
    match open_plate(d.path(), None) {
        Err(PlateError::IndexContent { message, .. }) => assert!(message.contains("no usable")),
        other => panic!("{other:?}"),
    }
    std::fs::write(&idx, noise(3, 5000)).unwrap();
    assert!(matches!(open_plate(d.path(), None), Err(PlateError::Xml { .. })));
    for seed in 0..300u64 {
        let mut m = good.as_bytes().to_vec();
        let r = noise(seed, 3);
        let i = (usize::from(r[0]) * 256 + usize::from(r[1])) % m.len();
        m[i] = r[2];
        std::fs::write(&idx, &m).unwrap();
        let _ = open_plate(d.path(), None); // must not panic
    }
}

#[test]
fn detection_and_override() {
    let d = tempfile::tempdir().unwrap();
    assert!(matches!(detect(d.path()), Err(PlateError::NoPlateFound { .. })));
    assert!(matches!(open_plate(d.path(), None), Err(PlateError::NoPlateFound { .. })));
    assert!(matches!(open_plate(&d.path().join("nope"), None), Err(PlateError::NotFound { .. })));
    ix_plate(d.path());
    assert_eq!(detect(d.path()).unwrap(), Format::ImageXpress);
    assert_eq!(detect(&d.path().join("My_Plate.HTD")).unwrap(), Format::ImageXpress);
    std::fs::create_dir(d.path().join("Images")).unwrap();
    std::fs::write(
        d.path().join("Images/Index.idx.xml"),
        index_xml("http://www.perkinelmer.com/PEHH/HarmonyV5", &[(1, 1, 0, "a.tiff", Some((0.0, 0.0)))]),
    )
    .unwrap();
    tiff(&d.path().join("Images/a.tiff"));
    assert!(matches!(detect(d.path()), Err(PlateError::AmbiguousFormat { .. })));
    assert_eq!(open_plate(d.path(), Some(Format::ImageXpress)).unwrap().images.len(), 4);
    assert_eq!(open_plate(d.path(), Some(Format::OperaPhenix)).unwrap().images.len(), 1);
    assert_eq!("opera-phenix".parse::<Format>().unwrap(), Format::OperaPhenix);
    assert!("zeiss".parse::<Format>().is_err());
}
