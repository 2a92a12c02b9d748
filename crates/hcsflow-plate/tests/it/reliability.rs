//! Regression tests for the plate-side defects of the reliability probes
//! (shared/docs/reliability-probes.md): absurd HTD counts (D3), macOS
//! AppleDouble companions (D4), index URLs outside the plate (D13),
//! non-regular files named like images (D14) and `verify` (D18, D11).

use std::path::{Path, PathBuf};
use std::sync::mpsc;
use std::time::Duration;

use hcsflow_core::{DType, Stack};
use hcsflow_plate::{open_plate, verify, Format, Plate, PlateError, ProblemKind};
use hcsflow_synth::{generate, IxLayout, SynthConfig};
use ndarray::Array3;

/// A small synthetic plate at `dir/name`.
fn synth(dir: &Path, name: &str, cfg: SynthConfig) -> PathBuf {
    let out = dir.join(name);
    generate(&SynthConfig { size: 16, ..cfg }, &out).unwrap_or_else(|e| panic!("generate: {e}"));
    out
}

fn one_well(z: u32) -> SynthConfig {
    SynthConfig { wells: vec!["A01".into()], grid_rows: 1, grid_cols: 1, channels: 1, z_planes: z, ..SynthConfig::default() }
}

/// Opens the plate on another thread: a reader that blocks (on a FIFO) fails
/// the test instead of hanging it.
fn open_or_block(path: &Path) -> Result<Plate, PlateError> {
    let (tx, rx) = mpsc::channel();
    let p = path.to_path_buf();
    std::thread::spawn(move || {
        let _ = tx.send(open_plate(&p, None));
    });
    rx.recv_timeout(Duration::from_secs(60)).expect("open_plate blocked (did it open a FIFO?)")
}

/// The HTD as text, byte for byte (the synthetic description holds Windows-1252 bytes).
fn read_htd(htd: &Path) -> String {
    std::fs::read(htd).unwrap().into_iter().map(char::from).collect()
}

fn write_htd(htd: &Path, text: &str) {
    std::fs::write(htd, text.chars().map(|c| c as u8).collect::<Vec<u8>>()).unwrap();
}

fn edit_htd(plate: &Path, edits: &[(&str, &str)]) -> PathBuf {
    let htd = plate.join("Synth_Plate_1.HTD");
    let mut text = read_htd(&htd);
    for (from, to) in edits {
        assert!(text.contains(from), "{from:?} not in the HTD");
        text = text.replacen(from, to, 1);
    }
    write_htd(&htd, &text);
    htd
}

fn tiff(path: &Path, size: usize, dtype: DType, planes: usize) {
    let s = match dtype {
        DType::U8 => Stack::from(Array3::<u8>::from_elem((planes, size, size), 3u8)),
        _ => Stack::from(Array3::<u16>::from_elem((planes, size, size), 7u16)),
    };
    hcsflow_tiff::write_stack(path, &s, &hcsflow_tiff::WriteOptions::default()).unwrap();
}

// ---------------------------------------------------------------- D3

type Case<'a> = (&'a str, &'a [(&'a str, &'a str)], &'a str, u64);

#[test]
fn d3_absurd_htd_counts_are_refused_naming_the_htd_the_key_its_value_and_the_files() {
    let d = tempfile::tempdir().unwrap();
    // (plate name, HTD edits, the key refused, its value)
    let cases: [Case; 3] = [
        ("z", &[("\"ZSteps\", 2", "\"ZSteps\", 2147483648")], "ZSteps", 2147483648),
        ("t", &[("\"TimePoints\", 1", "\"TimePoints\", 2147483647")], "TimePoints", 2147483647),
        ("w", &[("\"NWavelengths\", 1", "\"NWavelengths\", 1000000"), ("\"Waves\", FALSE", "\"Waves\", TRUE")], "NWavelengths", 1000000),
    ];
    for (name, edits, want_key, want_value) in cases {
        let plate = synth(d.path(), name, one_well(2));
        let htd = edit_htd(&plate, edits);
        match open_plate(&plate, None) {
            Err(e @ PlateError::ImplausibleCount { .. }) => {
                let msg = e.to_string();
                let PlateError::ImplausibleCount { path, key, value, files, .. } = e else { unreachable!() };
                assert_eq!((path, key.as_str(), value, files), (htd.clone(), want_key, want_value, 2), "{msg}");
                assert!(
                    msg.starts_with(&format!("{}: {want_key} {want_value} but the plate folder has 2 image file(s)", htd.display())),
                    "{msg}"
                );
                assert!(msg.ends_with("a corrupt HTD?"), "{msg}");
            }
            other => panic!("{name}: expected ImplausibleCount, got {other:?}"),
        }
    }
}

#[test]
fn d3_a_huge_wavelength_count_with_waves_false_is_not_enumerated() {
    // The probe's CPU loop: 2^31-1 iterations formatting WaveName keys.
    let d = tempfile::tempdir().unwrap();
    let plate = synth(d.path(), "p", one_well(2));
    edit_htd(&plate, &[("\"NWavelengths\", 1", "\"NWavelengths\", 2147483647")]);
    let p = open_plate(&plate, None).unwrap();
    assert_eq!((p.images.len(), p.metadata.channels, p.missing.len()), (2, 1, 0));
}

#[test]
fn d3_a_site_grid_without_selection_rows_is_bounded() {
    // XSites × YSites overflowed u32 (a panic in debug builds) and the grid
    // was enumerated cell by cell.
    let d = tempfile::tempdir().unwrap();
    let plate = synth(d.path(), "p", SynthConfig { grid_rows: 2, grid_cols: 1, ..one_well(1) });
    let htd = plate.join("Synth_Plate_1.HTD");
    let text: String = read_htd(&htd).lines().filter(|l| !l.starts_with("\"SiteSelection")).map(|l| format!("{l}\r\n")).collect();
    let text = text.replace("\"XSites\", 1", "\"XSites\", 100000").replace("\"YSites\", 2", "\"YSites\", 100000");
    write_htd(&htd, &text);
    match open_plate(&plate, None) {
        Err(PlateError::ImplausibleCount { key, value, files, .. }) => {
            assert_eq!((key.as_str(), value, files), ("XSites × YSites", 10_000_000_000, 2))
        }
        other => panic!("expected ImplausibleCount, got {other:?}"),
    }
}

#[test]
fn d3_a_plate_that_lost_most_of_its_files_still_opens_with_them_missing() {
    // The rule refuses the implausible, not an aborted acquisition: 96 wells
    // × 4 sites × 3 channels × 2 z declared, one well on disk.
    let d = tempfile::tempdir().unwrap();
    let plate = synth(d.path(), "p", SynthConfig { grid_rows: 2, grid_cols: 2, channels: 3, ..one_well(2) });
    let htd = plate.join("Synth_Plate_1.HTD");
    let text = read_htd(&htd);
    let all = ["TRUE"; 12].join(", ");
    let text: String = text
        .lines()
        .map(|l| if l.starts_with("\"WellsSelection") { format!("{}, {all}", l.split(',').next().unwrap()) } else { l.to_string() })
        .map(|l| format!("{l}\r\n"))
        .collect();
    write_htd(&htd, &text);
    let p = open_plate(&plate, None).unwrap();
    assert_eq!(p.images.len(), 24);
    assert_eq!(p.missing.len(), 95 * 24);
}

// ---------------------------------------------------------------- D4

fn mac_plate(dir: &Path) -> PathBuf {
    synth(
        dir,
        "mac",
        SynthConfig {
            wells: vec!["A01".into(), "B02".into()],
            grid_rows: 2,
            grid_cols: 2,
            channels: 2,
            z_planes: 2,
            ..SynthConfig::default()
        },
    )
}

fn assert_real_image_used(p: &Plate, real: &Path) {
    let img = p.image("A01", 1, 1, 1, 1).expect("A01 s1 w1 z1");
    assert_eq!(img.path, real);
    assert!(p.missing.is_empty(), "{:?}", p.missing);
    let all = p.warnings.join("\n");
    assert!(!all.contains("duplicate") && !all.contains("several plate prefixes"), "{all}");
    assert!(all.contains("1 hidden TIFF-named file(s)") && all.contains("._Synth_Plate_1_A01_s1_w1.tif"), "{all}");
}

#[test]
fn d4_appledouble_companions_are_never_images() {
    let d = tempfile::tempdir().unwrap();
    let plate = mac_plate(d.path());
    let zdir = plate.join("TimePoint_1/ZStep_1");
    let real = zdir.join("Synth_Plate_1_A01_s1_w1.tif");
    let junk = zdir.join("._Synth_Plate_1_A01_s1_w1.tif");
    // The probe's AppleDouble header.
    std::fs::write(&junk, b"\x00\x05\x16\x07\x00\x02\x00\x00Mac OS X        ").unwrap();
    assert_real_image_used(&open_plate(&plate, None).unwrap(), &real);
    // A junk file that IS a valid TIFF must not be used either.
    std::fs::copy(zdir.join("Synth_Plate_1_B02_s1_w1.tif"), &junk).unwrap();
    assert_real_image_used(&open_plate(&plate, None).unwrap(), &real);
}

#[test]
fn d4_duplicates_prefer_the_htd_prefix() {
    let d = tempfile::tempdir().unwrap();
    let plate = mac_plate(d.path());
    let zdir = plate.join("TimePoint_1/ZStep_1");
    // Sorts before the real file, so folder order alone would keep it.
    let stray = zdir.join("Copy_A01_s1_w1.tif");
    std::fs::copy(zdir.join("Synth_Plate_1_B02_s1_w1.tif"), &stray).unwrap();
    let p = open_plate(&plate, None).unwrap();
    assert_eq!(p.image("A01", 1, 1, 1, 1).unwrap().path, zdir.join("Synth_Plate_1_A01_s1_w1.tif"));
    let dup = p.warnings.iter().find(|w| w.contains("duplicate")).expect("duplicate warning");
    assert!(dup.starts_with(&format!("{}: duplicate image", stray.display())), "{dup}");
}

// ---------------------------------------------------------------- D13

fn phenix(dir: &Path) -> (PathBuf, PathBuf, String) {
    let plate = synth(dir, "ph", SynthConfig { format: Format::OperaPhenix, grid_rows: 1, grid_cols: 2, ..one_well(1) });
    let index = plate.join("Images/Index.idx.xml");
    let first = open_plate(&plate, None).unwrap().images[0].path.file_name().unwrap().to_string_lossy().into_owned();
    (plate, index, first)
}

#[test]
fn d13_index_urls_outside_the_plate_are_never_opened() {
    let d = tempfile::tempdir().unwrap();
    let (plate, index, first) = phenix(d.path());
    let original = std::fs::read_to_string(&index).unwrap();
    // A readable TIFF right outside the plate: the old reader took it.
    tiff(&d.path().join("outside.tiff"), 16, DType::U16, 1);
    let outside_abs = d.path().join("outside.tiff").display().to_string();
    for url in [
        "/etc/hostname",
        outside_abs.as_str(),
        "../../outside.tiff",
        "../../../../../../etc/passwd",
        "sub/../../../outside.tiff",
        "http://example.com/x.tiff",
        "file:///etc/passwd",
        "file:../../outside.tiff",
    ] {
        std::fs::write(&index, original.replace(&format!("<URL>{first}</URL>"), &format!("<URL>{url}</URL>"))).unwrap();
        let p = open_plate(&plate, None).unwrap();
        assert_eq!(p.images.len(), 1, "{url}: {:?}", p.images);
        assert_eq!(p.missing.len(), 1, "{url}");
        let want = format!("URL {url:?} points outside the plate; not opened");
        assert_eq!(p.missing[0].reason, want);
        assert!(p.warnings.iter().any(|w| w.ends_with(&want)), "{url}: {:?}", p.warnings);
    }
    // Inside the plate, even through `..`, is fine.
    let inside = format!("../Images/./{first}");
    std::fs::write(&index, original.replace(&format!("<URL>{first}</URL>"), &format!("<URL>{inside}</URL>"))).unwrap();
    let p = open_plate(&plate, None).unwrap();
    assert_eq!((p.images.len(), p.missing.len()), (2, 0));
}

#[test]
fn a_timepoint_id_without_a_successor_is_an_ignored_image_not_a_panic() {
    // Found by the index fuzz: TimepointID 4294967295 overflowed `timepoint0 + 1`
    // (a panic in debug builds, timepoint 0 in release builds).
    let d = tempfile::tempdir().unwrap();
    let (plate, index, first) = phenix(d.path());
    let original = std::fs::read_to_string(&index).unwrap();
    let at = original.find(&format!("<URL>{first}</URL>")).unwrap();
    let image_start = original[..at].rfind("<Image ").or_else(|| original[..at].rfind("<Image>")).unwrap();
    let tp = image_start + original[image_start..].find("<TimepointID>").unwrap();
    let tp_end = tp + original[tp..].find("</TimepointID>").unwrap() + "</TimepointID>".len();
    let edited = format!("{}<TimepointID>4294967295</TimepointID>{}", &original[..tp], &original[tp_end..]);
    std::fs::write(&index, edited).unwrap();
    let p = open_plate(&plate, None).unwrap();
    assert_eq!(p.images.len(), 1, "{:?}", p.images);
    assert!(p.warnings.iter().any(|w| w.contains("TimepointID 4294967295 is out of range; image ignored")), "{:?}", p.warnings);
}

#[test]
fn d13_symlinks_inside_the_plate_may_point_outside() {
    let d = tempfile::tempdir().unwrap();
    let (plate, _, first) = phenix(d.path());
    let img = plate.join("Images").join(&first);
    let moved = d.path().join("share.tiff");
    std::fs::rename(&img, &moved).unwrap();
    std::os::unix::fs::symlink(&moved, &img).unwrap();
    let p = open_plate(&plate, None).unwrap();
    assert_eq!((p.images.len(), p.missing.len()), (2, 0));
}

// ---------------------------------------------------------------- D14

#[test]
fn d14_fifos_devices_folders_and_broken_links_named_like_images_are_missing_not_opened() {
    let d = tempfile::tempdir().unwrap();
    let plate = synth(d.path(), "fifo", SynthConfig { grid_rows: 2, grid_cols: 2, ix_layout: IxLayout::Flat, ..one_well(1) });
    let name = |s: u32| plate.join(format!("Synth_Plate_1_A01_s{s}.tif"));
    std::fs::remove_file(name(2)).unwrap();
    let st = std::process::Command::new("mkfifo").arg(name(2)).status().unwrap();
    assert!(st.success());
    std::fs::remove_file(name(3)).unwrap();
    std::os::unix::fs::symlink("/dev/zero", name(3)).unwrap();
    std::fs::remove_file(name(4)).unwrap();
    std::fs::create_dir(name(4)).unwrap();
    let p = open_or_block(&plate).unwrap();
    assert_eq!(p.images.len(), 1);
    let missing: Vec<(u32, String)> = p.missing.iter().map(|m| (m.site, m.reason.clone())).collect();
    assert_eq!(
        missing,
        [
            (2, "the file is a FIFO (named pipe), not a regular file".to_string()),
            (3, "the file is a character device, not a regular file".to_string()),
            (4, "the file is a folder, not a regular file".to_string()),
        ]
    );
    for s in 2..=4 {
        let w = format!("{}", name(s).display());
        assert!(
            p.warnings.iter().any(|x| x.starts_with(&w) && x.ends_with("not opened, the plane counts as missing")),
            "{s}: {:?}",
            p.warnings
        );
    }
    // Dangling link.
    std::fs::remove_file(name(3)).unwrap();
    std::os::unix::fs::symlink(d.path().join("gone.tif"), name(3)).unwrap();
    let p = open_or_block(&plate).unwrap();
    let m = p.missing.iter().find(|m| m.site == 3).unwrap();
    assert!(m.reason.starts_with("the file is a symbolic link that cannot be followed"), "{}", m.reason);
}

#[test]
fn d14_a_fifo_descriptor_is_refused_not_read() {
    let d = tempfile::tempdir().unwrap();
    let plate = synth(d.path(), "p", one_well(1));
    let htd = plate.join("Synth_Plate_1.HTD");
    std::fs::remove_file(&htd).unwrap();
    assert!(std::process::Command::new("mkfifo").arg(&htd).status().unwrap().success());
    match open_or_block(&plate) {
        Err(e @ PlateError::NotRegularFile { .. }) => {
            assert_eq!(e.to_string(), format!("{}: is a FIFO (named pipe), not a regular file; not opened", htd.display()))
        }
        other => panic!("{other:?}"),
    }
}

// ---------------------------------------------------------------- verify

#[test]
fn verify_reports_every_bad_file_by_kind() {
    let d = tempfile::tempdir().unwrap();
    let wells: Vec<String> = ["A01", "A02", "A03", "A04", "A05", "A06", "B01"].map(String::from).to_vec();
    let plate = synth(d.path(), "v", SynthConfig { wells, ix_layout: IxLayout::Flat, ..one_well(1) });
    let f = |w: &str| plate.join(format!("Synth_Plate_1_{w}.tif"));
    let clean = verify(&open_plate(&plate, None).unwrap());
    assert!(clean.is_clean(), "{clean:?}");
    assert_eq!((clean.checked, clean.plane_count), (7, 7));

    std::fs::write(f("A02"), b"").unwrap();
    let bytes = std::fs::read(f("A03")).unwrap();
    std::fs::write(f("A03"), &bytes[..bytes.len() / 2]).unwrap();
    std::fs::write(f("A04"), b"this is not a TIFF at all").unwrap();
    tiff(&f("A05"), 16, DType::U16, 3);
    tiff(&f("A06"), 24, DType::U16, 1);
    tiff(&f("B01"), 16, DType::U8, 1);
    let r = verify(&open_plate(&plate, None).unwrap());
    assert_eq!(r.checked, 7);
    let plane = hcsflow_plate::PlaneShape { width: 16, height: 16, dtype: DType::U16 };
    assert_eq!(r.plane, Some(plane));
    let got: Vec<(PathBuf, ProblemKind)> = r.problems.iter().map(|p| (p.path.clone(), p.kind.clone())).collect();
    assert_eq!(
        got,
        [
            (f("A02"), ProblemKind::Empty),
            (f("A03"), ProblemKind::Truncated),
            (f("A04"), ProblemKind::NotTiff),
            (f("A05"), ProblemKind::MultiPage { pages: 3 }),
            (
                f("A06"),
                ProblemKind::Mismatch { found: hcsflow_plate::PlaneShape { width: 24, height: 24, dtype: DType::U16 }, expected: plane }
            ),
            (
                f("B01"),
                ProblemKind::Mismatch { found: hcsflow_plate::PlaneShape { width: 16, height: 16, dtype: DType::U8 }, expected: plane }
            ),
        ]
    );
    for p in &r.problems {
        assert!(p.message.starts_with(&p.path.display().to_string()), "{}", p.message);
    }
    let a06 = &r.problems[4].message;
    assert!(a06.contains("plane is 24 x 24 u16 but the plate's is 16 x 16 u16"), "{a06}");
}

#[test]
fn verify_says_when_the_first_image_is_the_odd_one() {
    let d = tempfile::tempdir().unwrap();
    let wells: Vec<String> = ["A01", "A02", "A03"].map(String::from).to_vec();
    let plate = synth(d.path(), "v", SynthConfig { wells, ix_layout: IxLayout::Flat, ..one_well(1) });
    let first = plate.join("Synth_Plate_1_A01.tif");
    tiff(&first, 24, DType::U16, 1);
    let p = open_plate(&plate, None).unwrap();
    assert_eq!(p.metadata.image_width, Some(24), "the plate's plane comes from the first image");
    let r = verify(&p);
    assert_eq!(r.problems.len(), 1);
    assert_eq!(r.problems[0].path, first);
    assert_eq!(r.plate_problems.len(), 1);
    let msg = &r.plate_problems[0];
    assert!(msg.starts_with("the plate's plane size 24 x 24 u16 (taken from the first image header read) is not the images' majority 16 x 16 u16 (2 of 3 images)"), "{msg}");
}

#[test]
fn verify_confirms_copied_planes_by_their_bytes_not_their_description() {
    // Synthetic time points share one MetaSeries description per plane (the
    // acquisition time is fixed), so every time point is a candidate.
    let d = tempfile::tempdir().unwrap();
    let plate = synth(d.path(), "v", SynthConfig { timepoints: 4, ..one_well(1) });
    let opened = open_plate(&plate, None).unwrap();
    let f = |t: u32| opened.image("A01", 1, 1, 1, t).unwrap().path.clone();
    let description = |t: u32| hcsflow_tiff::read_info(&f(t)).unwrap().description;
    assert!(description(1).is_some_and(|d| !d.is_empty()) && (2..=4).all(|t| description(t) == description(1)));
    assert!(verify(&opened).duplicates.is_empty(), "different pixels are not copies");

    // t3 becomes a copy of t1; t4 differs from t1 in one (uncompressed,
    // little-endian) pixel.
    let first = std::fs::read(f(1)).unwrap();
    std::fs::write(f(3), &first).unwrap();
    let pixels = hcsflow_tiff::read_stack(&f(1)).unwrap();
    let at = first.windows(512).position(|w| w == pixels.as_bytes()).expect("the uncompressed pixels in the file");
    let mut almost = first.clone();
    almost[at + 2 * 17] ^= 1;
    std::fs::write(f(4), &almost).unwrap();
    assert_ne!(hcsflow_tiff::read_stack(&f(4)).unwrap(), hcsflow_tiff::read_stack(&f(1)).unwrap());
    let before = hcsflow_testkit::snapshot(&plate);
    let r = verify(&open_plate(&plate, None).unwrap());
    assert_eq!(hcsflow_testkit::snapshot(&plate), before);
    let got: Vec<(PathBuf, PathBuf, u32)> = r.duplicates.iter().map(|c| (c.path.clone(), c.copy_of.clone(), c.timepoint)).collect();
    assert_eq!(got, [(f(3), f(1), 3)]);
    assert!(r.duplicates[0].message.contains("z 1 t 3 is a copy of z 1 t 1"), "{}", r.duplicates[0].message);
    assert!(r.is_clean(), "copies are reported, not problems: {r:?}");
}

/// D17: a plate path that is a symlink loop says so, not "no such file or folder".
#[cfg(unix)]
#[test]
fn a_symlink_loop_as_the_plate_is_named_as_one() {
    let dir = tempfile::tempdir().expect("tempdir");
    let link = dir.path().join("loop");
    std::os::unix::fs::symlink(&link, &link).expect("symlink");
    let e = open_plate(&link, None).expect_err("a loop is not a plate");
    assert!(matches!(e, PlateError::Io { .. }), "{e:?}");
    assert!(e.to_string().contains("symbolic links"), "{e}");
    let gone = open_plate(&dir.path().join("absent"), None).expect_err("absent");
    assert!(matches!(gone, PlateError::NotFound { .. }), "{gone:?}");
}
