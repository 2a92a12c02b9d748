//! The Harmony index files of real instruments (`../shared/data/real-plates/`,
//! byte for byte) with tiny TIFFs under the names they list: what the reader
//! makes of them. The index files stay byte-identical.

use std::collections::BTreeSet;
use std::path::{Path, PathBuf};

use hcsflow_core::Stack;
use hcsflow_plate::{open_plate, Plate};

/// The real-plates folder: `HCSFLOW_REAL_PLATES`, else `shared/data/real-plates`
/// beside the repository or one of its ancestors, else the workplace's
/// `/work/shared`. Not finding it fails the test (it is never skipped).
fn real_plates() -> PathBuf {
    if let Some(dir) = std::env::var_os("HCSFLOW_REAL_PLATES") {
        return PathBuf::from(dir);
    }
    let repo = Path::new(env!("CARGO_MANIFEST_DIR")).join("../..");
    let candidates = repo.ancestors().map(|a| a.join("shared/data/real-plates")).chain([PathBuf::from("/work/shared/data/real-plates")]);
    let found = candidates.into_iter().find(|c| c.is_dir());
    found.unwrap_or_else(|| panic!("../shared/data/real-plates not found beside {}; set HCSFLOW_REAL_PLATES", repo.display()))
}

/// A plate folder with `index` (copied) in `Images/` and a 4×4 TIFF for every URL it lists.
fn harmony_plate(dir: &Path, folder: &str, index: &str) -> (PathBuf, Vec<u8>) {
    let source = real_plates().join(folder).join(index);
    let bytes = std::fs::read(&source).unwrap_or_else(|e| panic!("{}: {e}", source.display()));
    let images = dir.join("plate").join("Images");
    std::fs::create_dir_all(&images).unwrap();
    std::fs::write(images.join(index), &bytes).unwrap();
    let text = String::from_utf8_lossy(&bytes);
    for url in text.split("<URL>").skip(1).filter_map(|s| s.split("</URL>").next()).filter(|u| !u.is_empty()) {
        let stack = Stack::from_vec([1, 4, 4], vec![7u16; 16]).unwrap();
        hcsflow_tiff::write_stack(&images.join(url), &stack, &hcsflow_tiff::WriteOptions::default()).unwrap();
    }
    (images.join(index), bytes)
}

fn names(plate: &Plate) -> Vec<&str> {
    plate.metadata.channel_names.values().map(String::as_str).collect()
}

fn no_name_warnings(plate: &Plate) {
    assert!(!plate.warnings.iter().any(|w| w.contains("disagrees")), "{:?}", plate.warnings);
}

#[test]
fn harmony_v7_reads_channels_from_maps_and_timepoints_from_one() {
    let dir = tempfile::tempdir().unwrap();
    let (index, bytes) = harmony_plate(dir.path(), "harmony-v7-phenix-2024", "Index.xml");
    let plate = open_plate(&dir.path().join("plate"), None).unwrap();
    let m = &plate.metadata;
    assert_eq!(plate.wells(), ["A01"]);
    assert_eq!((m.timepoints, m.z_planes, m.sites, m.channels), (1, 1, 1, 7));
    assert!(plate.images.iter().all(|i| i.timepoint == 1));
    assert_eq!(
        names(&plate),
        ["Alexa 488", "Alexa 568", "Alexa 488 Em 650", "405ex, 570-630-em)", "Alexa 647", "HOECHST 33342", "Brightfield"]
    );
    let pixel = m.pixel_size_um.unwrap();
    assert!((pixel - 0.296688132474701).abs() < 1e-9, "{pixel}");
    assert_eq!((m.image_width, m.image_height, m.bit_depth), (Some(2160), Some(2160), Some(16)));
    assert_eq!((m.plate_rows, m.plate_columns), (8, 12));
    no_name_warnings(&plate);
    assert!(plate.missing.is_empty(), "{:?}", plate.missing);
    assert_eq!(std::fs::read(index).unwrap(), bytes);
}

#[test]
fn harmony_v5_files_keep_their_numbering_and_names() {
    let cases: [(&str, &[&str], u32, usize); 3] = [
        ("harmony-v5-phenix-2018", &["A01", "A02"], 1, 2),
        ("harmony-v5-phenix-2021", &["A01"], 1, 6),
        ("harmony-v5-phenix-2023", &["A01"], 1, 6),
    ];
    for (folder, wells, sites, channels) in cases {
        let dir = tempfile::tempdir().unwrap();
        let (index, bytes) = harmony_plate(dir.path(), folder, "Index.idx.xml");
        let plate = open_plate(&dir.path().join("plate"), None).unwrap();
        let m = &plate.metadata;
        assert_eq!(plate.wells(), wells, "{folder}");
        assert_eq!((m.timepoints, m.sites, m.channels as usize), (1, sites, channels), "{folder}");
        assert_eq!(m.channel_names.len(), channels, "{folder}: every channel named");
        assert!(plate.images.iter().all(|i| i.timepoint == 1), "{folder}");
        assert_eq!(m.bit_depth, Some(16), "{folder}");
        no_name_warnings(&plate);
        assert_eq!(std::fs::read(index).unwrap(), bytes);
    }
    let dir = tempfile::tempdir().unwrap();
    harmony_plate(dir.path(), "harmony-v5-phenix-2021", "Index.idx.xml");
    let plate = open_plate(&dir.path().join("plate"), None).unwrap();
    let want: BTreeSet<&str> = ["Alexa 647", "Alexa 568", "488 long", "Alexa 488", "HOECHST 33342", "Brightfield"].into();
    assert_eq!(names(&plate).into_iter().collect::<BTreeSet<_>>(), want);
}

#[test]
fn operetta_cls_fields_one_field_width_apart_form_a_row() {
    let dir = tempfile::tempdir().unwrap();
    let (index, bytes) = harmony_plate(dir.path(), "harmony-v5-operetta-cls-2022", "Index.idx.xml");
    let plate = open_plate(&dir.path().join("plate"), None).unwrap();
    let m = &plate.metadata;
    assert_eq!(plate.wells(), ["C03"]);
    assert_eq!((m.sites, m.channels, m.timepoints), (2, 1, 1));
    assert_eq!(names(&plate), ["Fluorescein (FITC)"]);
    assert_eq!((m.grid_rows, m.grid_cols), (1, 2));
    let pixel = m.pixel_size_um.unwrap();
    assert!((pixel - 1.19595).abs() < 1e-4, "{pixel}");
    no_name_warnings(&plate);
    assert_eq!(std::fs::read(index).unwrap(), bytes);
}

/// A plate folder from an ImageXpress export listing (`FILES.tsv`): the real
/// HTD byte for byte wherever the listing has one, and a 4×4 TIFF for every
/// image, byte-identical where the listing's blob ids are equal.
fn export_plate(dir: &Path, folder: &str) -> PathBuf {
    let source = real_plates().join(folder);
    let listing = std::fs::read_to_string(source.join("FILES.tsv")).unwrap();
    let htd = std::fs::read(source.join("9987.HTD")).unwrap();
    let root = dir.join(folder);
    let mut blobs: Vec<String> = Vec::new();
    for line in listing.lines().filter(|l| !l.starts_with('#') && !l.trim().is_empty()) {
        let cols: Vec<&str> = line.split('\t').collect();
        let (path, blob) = (root.join(cols[0]), cols[2].to_string());
        std::fs::create_dir_all(path.parent().unwrap()).unwrap();
        if cols[0].to_ascii_uppercase().ends_with(".HTD") {
            std::fs::write(&path, &htd).unwrap();
            continue;
        }
        let n = blobs.iter().position(|b| *b == blob).unwrap_or_else(|| {
            blobs.push(blob.clone());
            blobs.len() - 1
        });
        let stack = Stack::from_vec([1, 4, 4], vec![100 + n as u16; 16]).unwrap();
        hcsflow_tiff::write_stack(&path, &stack, &hcsflow_tiff::WriteOptions::default()).unwrap();
    }
    root
}

/// What an export listing must open as.
struct Export {
    folder: &'static str,
    wells: &'static [&'static str],
    sites: u32,
    waves: &'static [&'static str],
    z: u32,
    t: u32,
    projections: usize,
}

#[test]
fn imagexpress_exports_open_with_their_projections_and_htd_copies() {
    const FOUR: &[&str] = &["DAPI", "FITC", "Texas Red", "Cy5"];
    let cases = [
        Export { folder: "imagexpress-export-9987_Plate_3420", wells: &["B02"], sites: 1, waves: &["DAPI"], z: 1, t: 1, projections: 0 },
        Export {
            folder: "imagexpress-export-9987_Plate_3433",
            wells: &["B02", "B03"],
            sites: 2,
            waves: &["DAPI", "FITC"],
            z: 3,
            t: 1,
            projections: 8,
        },
        Export { folder: "imagexpress-export-9987_Plate_3434", wells: &["B02", "B03"], sites: 2, waves: FOUR, z: 3, t: 1, projections: 16 },
        Export { folder: "imagexpress-export-9987_Plate_3435", wells: &["B02", "B03"], sites: 2, waves: FOUR, z: 1, t: 6, projections: 0 },
    ];
    for Export { folder, wells, sites, waves, z, t, projections } in cases {
        let dir = tempfile::tempdir().unwrap();
        let root = export_plate(dir.path(), folder);
        let htd = std::fs::read(root.join("9987.HTD")).unwrap();
        let plate = open_plate(&root, None).unwrap_or_else(|e| panic!("{folder}: {e}"));
        let m = &plate.metadata;
        let context = format!("{folder}: {:?}", plate.warnings);
        assert_eq!(plate.wells(), wells, "{context}");
        assert_eq!((m.sites, m.z_planes, m.timepoints), (sites, z, t), "{context}");
        assert_eq!(names(&plate), waves, "{context}");
        let planes = wells.len() * sites as usize * waves.len() * z as usize * t as usize;
        assert_eq!(plate.images.len(), planes, "{context}");
        assert!(plate.missing.is_empty(), "{context}: {:?}", plate.missing);
        // ZStep_0 holds the projections of an export (one per well, site and wave).
        assert_eq!(plate.projections.len(), projections, "{context}");
        assert!(plate.projections.iter().all(|p| p.z_index == 0 && p.path.to_string_lossy().contains("ZStep_0")));
        // The HTD copies in every folder are the same plate, not competing descriptors.
        assert_eq!(plate.descriptor, root.join("9987.HTD"));
        // A Description that is not valid cp1252 (0x82 0x81 line joins) still reads.
        assert!(m.description.as_deref().is_some_and(|d| !d.is_empty()), "{context}");
        assert_eq!(std::fs::read(root.join("9987.HTD")).unwrap(), htd);
    }
}

/// A MetaXpress database acquisition folder from a listing whose columns
/// carry each TIFF's MetaSeries properties: tiny TIFFs under the real names,
/// each with a MetaSeries description of its listed properties. Returns the
/// acquisition folder (`<date>/<id>/`).
fn database_plate(dir: &Path, folder: &str, acquisition: &str) -> PathBuf {
    let listing = std::fs::read_to_string(real_plates().join(folder).join("FILES.tsv")).unwrap();
    let mut lines = listing.lines();
    let header: Vec<&str> = lines.next().unwrap().trim_start_matches("# ").split('\t').collect();
    let root = dir.join(folder);
    for line in lines.filter(|l| !l.trim().is_empty()) {
        let cols: Vec<&str> = line.split('\t').collect();
        let path = root.join(cols[0]);
        std::fs::create_dir_all(path.parent().unwrap()).unwrap();
        let props: String =
            header.iter().zip(&cols).skip(3).map(|(k, v)| format!("<prop id=\"{k}\" type=\"string\" value=\"{v}\"/>\r\n")).collect();
        let options =
            hcsflow_tiff::WriteOptions { description: Some(format!("<MetaData>\r\n{props}</MetaData>\r\n")), ..Default::default() };
        let stack = Stack::from_vec([1, 4, 4], vec![9u16; 16]).unwrap();
        hcsflow_tiff::write_stack(&path, &stack, &options).unwrap();
    }
    root.join(acquisition)
}

#[test]
fn metaxpress_database_folders_open_without_an_htd() {
    let dir = tempfile::tempdir().unwrap();
    let root = database_plate(dir.path(), "imagexpress-db-Projection-Mix", "2023-02-21/1334");
    let plate = open_plate(&root, None).unwrap();
    let m = &plate.metadata;
    let context = format!("{:?}", plate.warnings);
    assert_eq!(plate.format, hcsflow_plate::Format::ImageXpress);
    assert_eq!(plate.wells(), ["E07", "E08"], "{context}");
    assert_eq!((m.sites, m.channels, m.z_planes, m.timepoints), (2, 4, 10, 1), "{context}");
    assert_eq!(names(&plate), ["FITC_05", "FITC_05-2", "FITC_05-3", "FITC_05-4"]);
    // Waves 1–2: 10 planes; wave 4: one plane in ZStep_1; wave 3: a projection only.
    assert_eq!(plate.images.len(), 2 * 2 * (2 * 10 + 1), "{context}");
    assert_eq!(plate.projections.len(), 2 * 2 * 3, "{context}");
    assert!(plate.images.iter().filter(|i| i.channel == 4).all(|i| i.z_index == 1));
    assert!(plate.missing.is_empty(), "{:?}", plate.missing);
    assert!(plate.warnings.iter().any(|w| w.contains("wave 3: a projection only") && w.contains("wave 4: 1 plane(s)")), "{context}");
    assert!((m.pixel_size_um.unwrap() - 1.3668).abs() < 1e-9);
    assert_eq!(m.stage_positions.len(), 4, "every site's stage position, {context}");
    assert_eq!((m.plate_rows, m.plate_columns), (8, 12));

    let dir = tempfile::tempdir().unwrap();
    let root = database_plate(dir.path(), "imagexpress-db-1well-3C-2S-Zmix-T", "2024-04-22/1697");
    let plate = open_plate(&root, None).unwrap();
    let m = &plate.metadata;
    assert_eq!(plate.wells(), ["C07"]);
    assert_eq!((m.sites, m.channels, m.z_planes, m.timepoints), (2, 3, 1, 2), "{:?}", plate.warnings);
    assert_eq!(names(&plate), ["Copy of FITC", "Copy of Cy3", "Copy of Texas Red"]);
    assert_eq!(plate.images.len(), 2 * 3 * 2);
    assert!(plate.missing.is_empty(), "{:?}", plate.missing);
    // The listing's `Thumbs.db` is not an image and no thumbnail is one.
    assert!(plate.images.iter().all(|i| !i.path.to_string_lossy().contains("thumb")));
}
