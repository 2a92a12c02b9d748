//! The metadata files and file listings of real instruments
//! (`../shared/data/real-plates/`, byte for byte) with tiny TIFFs under the
//! names they list: what the reader makes of them. Every test checks that
//! opening (and verifying) leaves the input tree byte-identical, mtimes included.

use std::collections::{BTreeMap, BTreeSet};
use std::path::{Path, PathBuf};

use hcsflow_core::Stack;
use hcsflow_plate::{detect, open_plate, verify, Format, Plate, PlateError, SiteCell};
use hcsflow_testkit::{snapshot, Entry};

/// Every entry below `root` with its length, mtime and (files) bytes.
fn tree(root: &Path) -> BTreeMap<PathBuf, (Entry, Option<Vec<u8>>)> {
    snapshot(root)
        .into_iter()
        .map(|(p, e)| {
            let bytes = (!e.is_dir).then(|| std::fs::read(&p).unwrap_or_else(|err| panic!("{}: {err}", p.display())));
            (p, (e, bytes))
        })
        .collect()
}

/// Runs `f` and asserts that the tree below `root` is unchanged by it:
/// the same entries, bytes and mtimes.
fn unchanged<T>(root: &Path, f: impl FnOnce() -> T) -> T {
    let before = tree(root);
    assert!(!before.is_empty(), "{}: empty input tree", root.display());
    let out = f();
    assert!(tree(root) == before, "{}: the input tree changed", root.display());
    out
}

/// Opens `path` (format detected), asserting the tree below `root` unchanged.
fn open_unchanged(root: &Path, path: &Path) -> Plate {
    unchanged(root, || open_plate(path, None)).unwrap_or_else(|e| panic!("{}: {e}", path.display()))
}

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
    let plate = open_unchanged(dir.path(), &dir.path().join("plate"));
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
        let plate = open_unchanged(dir.path(), &dir.path().join("plate"));
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
    let plate = open_unchanged(dir.path(), &dir.path().join("plate"));
    let want: BTreeSet<&str> = ["Alexa 647", "Alexa 568", "488 long", "Alexa 488", "HOECHST 33342", "Brightfield"].into();
    assert_eq!(names(&plate).into_iter().collect::<BTreeSet<_>>(), want);
}

#[test]
fn operetta_cls_fields_one_field_width_apart_form_a_row() {
    let dir = tempfile::tempdir().unwrap();
    let (index, bytes) = harmony_plate(dir.path(), "harmony-v5-operetta-cls-2022", "Index.idx.xml");
    let plate = open_unchanged(dir.path(), &dir.path().join("plate"));
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
/// image, byte-identical where the listing's blob ids are equal and different
/// where they differ (pixels from the blob's number, a MetaSeries-like
/// description carrying the blob id as acquisition time).
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
        let description = format!("<MetaData>\r\n<prop id=\"acquisition-time-local\" type=\"time\" value=\"{blob}\"/>\r\n</MetaData>\r\n");
        let options = hcsflow_tiff::WriteOptions { description: Some(description), ..Default::default() };
        hcsflow_tiff::write_stack(&path, &stack, &options).unwrap();
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
        let plate = open_unchanged(&root, &root);
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
    let plate = open_unchanged(dir.path(), &root);
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
    // Sites 1 and 2 abut in X (699.9 µm, one field width): one row, two columns.
    assert_eq!((m.grid_rows, m.grid_cols), (1, 2), "{context}");
    assert_eq!(m.site_cells, [SiteCell { site: 1, row: 0, col: 0 }, SiteCell { site: 2, row: 0, col: 1 }]);
    assert!(!plate.warnings.iter().any(|w| w.contains("site grid")), "{context}");
    // Wave 3 exists only as a projection: a channel of the plate all the same.
    assert_eq!(plate.channels(), [1, 2, 3, 4]);
    let summary = hcsflow_plate::summary_text(&plate);
    assert!(summary.contains("Channels:    4 (1=FITC_05, 2=FITC_05-2, 3=FITC_05-3, 4=FITC_05-4)\n"), "{summary}");
    assert!(summary.contains("Sites:       2 (grid 1 rows x 2 columns)\n"), "{summary}");

    let dir = tempfile::tempdir().unwrap();
    let root = database_plate(dir.path(), "imagexpress-db-1well-3C-2S-Zmix-T", "2024-04-22/1697");
    let plate = open_unchanged(dir.path(), &root);
    let m = &plate.metadata;
    assert_eq!(plate.wells(), ["C07"]);
    assert_eq!((m.sites, m.channels, m.z_planes, m.timepoints), (2, 3, 1, 2), "{:?}", plate.warnings);
    assert_eq!(names(&plate), ["Copy of FITC", "Copy of Cy3", "Copy of Texas Red"]);
    assert_eq!(plate.images.len(), 2 * 3 * 2);
    // Sites 1 and 2 are one field height apart in Y: two rows, one column.
    assert_eq!((m.grid_rows, m.grid_cols), (2, 1), "{:?}", plate.warnings);
    assert_eq!(m.site_cells, [SiteCell { site: 1, row: 0, col: 0 }, SiteCell { site: 2, row: 1, col: 0 }]);
    assert_eq!(plate.channels(), [1, 2, 3]);
    assert!(plate.missing.is_empty(), "{:?}", plate.missing);
    // The listing's `Thumbs.db` is not an image and no thumbnail is one.
    assert!(plate.images.iter().all(|i| !i.path.to_string_lossy().contains("thumb")));
}

/// A 4×4 TIFF's bytes, to write under many names quickly.
fn tiny_tiff(dir: &Path) -> Vec<u8> {
    let path = dir.join("tiny.tif");
    let stack = Stack::from_vec([1, 4, 4], vec![3u16; 16]).unwrap();
    hcsflow_tiff::write_stack(&path, &stack, &hcsflow_tiff::WriteOptions::default()).unwrap();
    let bytes = std::fs::read(&path).unwrap();
    std::fs::remove_file(&path).unwrap();
    bytes
}

/// Writes every listed path below `root`: TIFF names as `tiff`, anything
/// else (PNGs, a Python script, `Thumbs.db`) as a few junk bytes.
fn write_listed<'a>(root: &Path, paths: impl IntoIterator<Item = &'a str>, tiff: &[u8]) {
    for rel in paths {
        let path = root.join(rel);
        std::fs::create_dir_all(path.parent().unwrap()).unwrap();
        let is_tiff = rel.to_ascii_lowercase().ends_with(".tif");
        std::fs::write(&path, if is_tiff { tiff } else { b"\x00junk\xff".as_slice() }).unwrap();
    }
}

/// The carragher-2015 plate (`images.txt`, paths below
/// `/mnt/ImageXpress/2015-07-31 val screen/`; the junk entries without a
/// folder go into the acquisition folder). Returns (tree root, plate folder, acquisition).
fn carragher_plate(dir: &Path) -> (PathBuf, PathBuf, PathBuf) {
    let listing = std::fs::read_to_string(real_plates().join("imagexpress-db-carragher-2015/images.txt")).unwrap();
    let root = dir.join("carragher");
    let plate = root.join("val screen/HCC15691");
    let acquisition = plate.join("2015-07-31/4014");
    let tiff = tiny_tiff(dir);
    let mut paths = Vec::new();
    for line in listing.lines().filter(|l| !l.is_empty()) {
        match line.strip_prefix("/mnt/ImageXpress/2015-07-31 val screen/") {
            Some(rel) => paths.push(rel.to_string()),
            None => paths.push(format!("val screen/HCC15691/2015-07-31/4014/{line}")),
        }
    }
    assert_eq!(paths.len(), 3602);
    write_listed(&root, paths.iter().map(String::as_str), &tiff);
    (root, plate, acquisition)
}

#[test]
fn carragher_acquisition_with_a_spaced_prefix_thumbnails_and_junk_opens() {
    let dir = tempfile::tempdir().unwrap();
    let (root, plate_folder, acquisition) = carragher_plate(dir.path());
    let plate = open_unchanged(&root, &acquisition);
    let m = &plate.metadata;
    let context = format!("{:#?}", plate.warnings);
    let wells: Vec<String> = "BCDEFG".chars().flat_map(|r| (2..=11).map(move |c| format!("{r}{c:02}"))).collect();
    assert_eq!(plate.wells(), wells, "{context}");
    assert_eq!((m.sites, m.channels, m.z_planes, m.timepoints), (6, 5, 1, 1), "{context}");
    assert_eq!(m.name, "val screen");
    assert_eq!((m.plate_rows, m.plate_columns), (8, 12));
    assert_eq!(plate.images.len(), 60 * 6 * 5, "thumbnails skipped, {context}");
    assert!(plate.images.iter().all(|i| !i.path.to_string_lossy().contains("_thumb")));
    assert!(plate.projections.is_empty() && plate.missing.is_empty(), "{:?}", plate.missing);
    // No MetaSeries description in these TIFFs: one row of sites, and the warnings say why.
    assert_eq!((m.grid_rows, m.grid_cols), (1, 6));
    let junk = plate.warnings.iter().filter(|w| w.contains("Thumbs.db") || w.contains("DS_STORE")).count();
    assert!(junk <= 1, "{context}");
    assert_eq!(
        plate.warnings,
        [
            format!(
                "{}: no .HTD; read as a MetaXpress database acquisition folder (wells, sites, waves, z and time points from the files)",
                acquisition.display()
            ),
            "360 site(s) without MetaSeries stage-position-x/y in their TIFF".to_string(),
            "no pixel size (spatial-calibration-x) in the images' MetaSeries metadata".to_string(),
            "site grid: the 6 sites are placed in one row, in site order: no well has a MetaSeries stage-position-x/y for every site"
                .to_string(),
        ]
    );

    // The plate folder above (`<plate>/<date>/<id>/`) and the date folder open the one acquisition.
    for above in [plate_folder.clone(), plate_folder.join("2015-07-31")] {
        assert_eq!(unchanged(&root, || detect(&above)).unwrap(), Format::ImageXpress);
        let from_above = open_unchanged(&root, &above);
        assert_eq!(from_above.root, acquisition);
        assert_eq!(from_above.images, plate.images);
        assert_eq!(
            from_above.warnings[0],
            format!("{}: opened {}, the only MetaXpress acquisition folder below it", above.display(), acquisition.display())
        );
        assert_eq!(from_above.warnings[1..], plate.warnings[..]);
    }
}

#[test]
fn a_plate_folder_with_several_acquisitions_is_an_error_listing_them() {
    let dir = tempfile::tempdir().unwrap();
    let (root, plate_folder, first) = carragher_plate(dir.path());
    // A second acquisition of the plate, another day.
    let second = plate_folder.join("2015-08-02/4020");
    let tiff = tiny_tiff(dir.path());
    write_listed(&second, ["val screen_B02_s1_w1.tif", "val screen_B02_s1_w2.tif"], &tiff);
    for result in [unchanged(&root, || detect(&plate_folder)).map(|_| ()), unchanged(&root, || open_plate(&plate_folder, None)).map(|_| ())]
    {
        match result {
            Err(e @ PlateError::SeveralAcquisitions { .. }) => {
                let PlateError::SeveralAcquisitions { path, folders } = &e else { unreachable!() };
                assert_eq!(path, &plate_folder);
                assert_eq!(folders, &[first.clone(), second.clone()]);
                let text = e.to_string();
                assert!(
                    text.contains(&format!("2 MetaXpress acquisition folders below ({}, {})", first.display(), second.display()))
                        && text.contains("point at one of them"),
                    "{text}"
                );
            }
            other => panic!("expected SeveralAcquisitions, got {other:?}"),
        }
    }
    // Either acquisition opens when pointed at.
    assert_eq!(open_unchanged(&root, &second).images.len(), 2);
    assert_eq!(open_unchanged(&root, &first).images.len(), 1800);
}

/// What one pharmbio acquisition must open as.
struct Pharmbio {
    plate: &'static str,
    acquisition: &'static str,
    wells: &'static [&'static str],
    sites: &'static [u32],
    waves: u32,
    timepoints: u32,
}

#[test]
fn pharmbio_acquisitions_open_despite_pngs_scripts_and_foreign_thumbnail_prefixes() {
    let listing = std::fs::read_to_string(real_plates().join("imagexpress-db-pharmbio-2019/FILES.tsv")).unwrap();
    let dir = tempfile::tempdir().unwrap();
    let root = dir.path().join("pharmbio");
    let tiff = tiny_tiff(dir.path());
    let paths = listing.lines().filter(|l| !l.starts_with('#') && !l.is_empty()).map(|l| l.split('\t').next().unwrap());
    write_listed(&root, paths, &tiff);
    let cases = [
        Pharmbio {
            plate: "MDC Polina Georgiev/exp-TimeLapse/A549-20X-DB-HD-BpA-pilot1",
            acquisition: "2019-03-27/84",
            wells: &["B04"],
            sites: &[1, 2, 3, 4],
            waves: 1,
            timepoints: 21,
        },
        // The thumbnails here are named ACHN-20X-P009041_… (another plate's prefix).
        Pharmbio {
            plate: "MDC Polina Georgiev/exp-WIDE/ACHN-20X-P009060",
            acquisition: "2019-02-19/51",
            wells: &["B02"],
            sites: &[1],
            waves: 5,
            timepoints: 1,
        },
        // Only site 2 was kept: the plate's one site is site 2, nothing missing.
        Pharmbio {
            plate: "MDC Polina Georgiev/exp-WIDE/MCF7-20X-P009086",
            acquisition: "2019-03-06/56",
            wells: &["D05"],
            sites: &[2],
            waves: 5,
            timepoints: 1,
        },
    ];
    for Pharmbio { plate: plate_folder, acquisition, wells, sites, waves, timepoints } in cases {
        let acq = root.join(plate_folder).join(acquisition);
        let plate = open_unchanged(&root, &acq);
        let m = &plate.metadata;
        let context = format!("{plate_folder}: {:#?}", plate.warnings);
        assert_eq!(plate.wells(), wells, "{context}");
        assert_eq!(m.name, plate_folder.rsplit('/').next().unwrap(), "{context}");
        let site_numbers: Vec<u32> = m.site_cells.iter().map(|c| c.site).collect();
        assert_eq!(site_numbers, sites, "{context}");
        assert_eq!((m.sites, m.channels, m.z_planes, m.timepoints), (sites.len() as u32, waves, 1, timepoints), "{context}");
        assert_eq!(plate.channels(), (1..=waves).collect::<Vec<_>>());
        assert_eq!(plate.images.len(), sites.len() * waves as usize * timepoints as usize, "{context}");
        assert!(plate.images.iter().all(|i| !i.path.to_string_lossy().contains("_thumb")), "{context}");
        assert!(plate.missing.is_empty(), "{context}: {:?}", plate.missing);
        // PNGs, the script and t-N-120.png are not images and not worth a warning each.
        assert!(!plate.warnings.iter().any(|w| w.contains(".png") || w.contains(".py") || w.contains("prefixes")), "{context}");
        // The plate folder above opens the same acquisition.
        let from_above = open_unchanged(&root, &root.join(plate_folder));
        assert_eq!((from_above.root, from_above.images), (acq, plate.images.clone()));
    }
    // A folder of plate folders is not a plate.
    let wide = root.join("MDC Polina Georgiev/exp-WIDE");
    assert!(matches!(unchanged(&root, || open_plate(&wide, None)), Err(PlateError::NoPlateFound { .. })));
}

/// (well, site, channel, z, t) of a plane; z 0 is the projection.
type Plane = (String, u32, u32, u32, u32);

/// The duplicated planes `verify` reports for the export listing `folder`,
/// as (copy, original) planes; asserts the tree unchanged and that every
/// copy's `copy_of` is its original's file.
fn reported_copies(folder: &str) -> BTreeSet<(Plane, Plane)> {
    let dir = tempfile::tempdir().unwrap();
    let root = export_plate(dir.path(), folder);
    let plate = open_unchanged(&root, &root);
    let report = unchanged(&root, || verify(&plate));
    assert!(report.is_clean(), "{folder}: {:?}", report.problems);
    let by_path: BTreeMap<&Path, Plane> = plate
        .images
        .iter()
        .chain(&plate.projections)
        .map(|i| (i.path.as_path(), (i.well.clone(), i.site, i.channel, i.z_index, i.timepoint)))
        .collect();
    let copies: BTreeSet<(Plane, Plane)> =
        report.duplicates.iter().map(|d| (by_path[d.path.as_path()].clone(), by_path[d.copy_of.as_path()].clone())).collect();
    assert_eq!(copies.len(), report.duplicates.len(), "{folder}: each copy reported once");
    for d in &report.duplicates {
        assert_eq!(by_path[d.path.as_path()], (d.well.clone(), d.site, d.channel, d.z_index, d.timepoint));
        assert!(d.message.contains(&d.path.display().to_string()) && d.message.contains(&d.copy_of.display().to_string()));
    }
    copies
}

/// Every (well, site) of the exports.
fn export_fields() -> Vec<(String, u32)> {
    ["B02", "B03"].into_iter().flat_map(|w| [(w.to_string(), 1), (w.to_string(), 2)]).collect()
}

#[test]
fn verify_reports_the_planes_metaxpress_wrote_as_copies() {
    // 3434: FITC (w2) is a projection only, Texas Red (w3) and Cy5 (w4) one
    // plane each: every ZStep folder holds the same file, ZStep_0's first.
    let mut want = BTreeSet::new();
    for (well, site) in export_fields() {
        for w in 2..=4 {
            for z in 1..=3 {
                want.insert(((well.clone(), site, w, z, 1), (well.clone(), site, w, 0, 1)));
            }
        }
    }
    assert_eq!(want.len(), 36);
    assert_eq!(reported_copies("imagexpress-export-9987_Plate_3434"), want);

    // 3435: time points forward-filled from the last acquired one: FITC (w2)
    // at t1 only, Texas Red (w3) at t1 and t6, Cy5 (w4) at t1 and t4.
    let mut want = BTreeSet::new();
    for (well, site) in export_fields() {
        let mut copy = |w: u32, t: u32, of: u32| want.insert(((well.clone(), site, w, 1, t), (well.clone(), site, w, 1, of)));
        for t in 2..=6 {
            copy(2, t, 1);
        }
        for t in 2..=5 {
            copy(3, t, 1);
        }
        for (t, of) in [(2, 1), (3, 1), (5, 4), (6, 4)] {
            copy(4, t, of);
        }
    }
    assert_eq!(want.len(), 52);
    assert_eq!(reported_copies("imagexpress-export-9987_Plate_3435"), want);

    // No blob is repeated in the other two exports.
    for folder in ["imagexpress-export-9987_Plate_3420", "imagexpress-export-9987_Plate_3433"] {
        assert!(reported_copies(folder).is_empty(), "{folder}");
    }
}
