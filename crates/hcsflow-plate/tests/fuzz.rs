//! Seeded mutation fuzzing of the HTD and Harmony index parsers through
//! `open_plate` on small synthetic plates: byte flips, truncations, numbers
//! replaced by huge, negative, NaN or empty values, duplicated and deleted
//! lines. Every mutant must end in a plate or a `PlateError` — never a panic,
//! never a hang — and neither outcome may allocate without bound: each
//! thread's live heap is capped while a mutant is opened (an allocation
//! beyond the cap aborts the test binary), and the plate lists no more
//! planes than the count rule allows. Fixed seeds make every run identical.
//!
//! `corpus_replays` opens the inputs in `tests/corpus/` that crashed or hung
//! earlier versions (see its README) and checks each one's outcome.

use std::alloc::{GlobalAlloc, Layout, System};
use std::cell::Cell;
use std::path::{Path, PathBuf};
use std::sync::mpsc;
use std::time::Duration;

use hcsflow_plate::imagexpress::{MAX_EXPECTED_FLOOR, MAX_EXPECTED_PER_FILE};
use hcsflow_plate::{open_plate, Format, Plate, PlateError};
use hcsflow_synth::{generate, SynthConfig};
use hcsflow_testkit::Rng;

/// Live heap bytes a thread may hold while it opens a mutant.
const HEAP_CAP: usize = 512 << 20;

thread_local! {
    static LIVE: Cell<isize> = const { Cell::new(0) };
    static CAPPED: Cell<bool> = const { Cell::new(false) };
}

/// The system allocator, counting each thread's live bytes; while the
/// thread is `CAPPED`, an allocation that would exceed [`HEAP_CAP`] fails
/// (which aborts: an allocation explosion ends the test instead of the machine).
struct Counting;

unsafe impl GlobalAlloc for Counting {
    unsafe fn alloc(&self, layout: Layout) -> *mut u8 {
        let over = LIVE
            .try_with(|l| CAPPED.try_with(|c| c.get()).unwrap_or(false) && l.get() + layout.size() as isize > HEAP_CAP as isize)
            .unwrap_or(false);
        if over {
            return std::ptr::null_mut();
        }
        let p = unsafe { System.alloc(layout) };
        if !p.is_null() {
            let _ = LIVE.try_with(|l| l.set(l.get() + layout.size() as isize));
        }
        p
    }
    unsafe fn dealloc(&self, ptr: *mut u8, layout: Layout) {
        unsafe { System.dealloc(ptr, layout) };
        let _ = LIVE.try_with(|l| l.set(l.get() - layout.size() as isize));
    }
}

#[global_allocator]
static ALLOC: Counting = Counting;

/// Opens `plate` with the heap cap on, on this thread.
fn open_capped(plate: &Path) -> std::thread::Result<Result<Plate, PlateError>> {
    CAPPED.with(|c| c.set(true));
    let r = std::panic::catch_unwind(|| open_plate(plate, None));
    CAPPED.with(|c| c.set(false));
    r
}

const NUMBERS: [&str; 14] = [
    "0",
    "-1",
    "NaN",
    "inf",
    "",
    "1e9",
    "65536",
    "1000000",
    "2147483647",
    "2147483648",
    "4294967295",
    "4294967296",
    "-2147483648",
    "99999999999999999999999999",
];

/// One mutation of `text`, chosen by `rng`.
fn mutate(text: &[u8], rng: &mut Rng) -> Vec<u8> {
    let mut m = text.to_vec();
    match rng.below(6) {
        // flip one to three bytes
        0 => {
            for _ in 0..=rng.below(3) {
                let i = rng.below(m.len());
                m[i] ^= 1 << rng.below(8);
            }
        }
        // truncate
        1 => m.truncate(rng.below(m.len())),
        // replace a run of digits by a hostile number
        2 | 3 => {
            let runs: Vec<(usize, usize)> = {
                let mut v = Vec::new();
                let mut i = 0;
                while i < m.len() {
                    if m[i].is_ascii_digit() {
                        let s = i;
                        while i < m.len() && m[i].is_ascii_digit() {
                            i += 1;
                        }
                        v.push((s, i));
                    } else {
                        i += 1;
                    }
                }
                v
            };
            if !runs.is_empty() {
                let (s, e) = runs[rng.below(runs.len())];
                m.splice(s..e, NUMBERS[rng.below(NUMBERS.len())].bytes());
            }
        }
        // duplicate or delete a line
        _ => {
            let lines: Vec<&[u8]> = text.split_inclusive(|b| *b == b'\n').collect();
            let i = rng.below(lines.len());
            let mut out: Vec<&[u8]> = lines.clone();
            if rng.below(2) == 0 {
                out.insert(i, lines[i]);
            } else {
                out.remove(i);
            }
            m = out.concat();
        }
    }
    m
}

fn synth(dir: &Path, cfg: SynthConfig) -> PathBuf {
    generate(&SynthConfig { size: 16, ..cfg }, dir).unwrap_or_else(|e| panic!("generate: {e}"));
    dir.to_path_buf()
}

/// Image files under `dir` (any depth).
fn count_files(dir: &Path, ext: &str) -> u64 {
    let mut n = 0;
    for e in std::fs::read_dir(dir).unwrap().flatten() {
        let p = e.path();
        if p.is_dir() {
            n += count_files(&p, ext);
        } else if p.extension().is_some_and(|x| x.eq_ignore_ascii_case(ext)) {
            n += 1;
        }
    }
    n
}

/// Runs `body` on its own thread; a hang fails the test instead of blocking it.
fn bounded(what: &str, body: impl FnOnce() + Send + 'static) {
    let (tx, rx) = mpsc::channel();
    std::thread::spawn(move || {
        body();
        let _ = tx.send(());
    });
    match rx.recv_timeout(Duration::from_secs(120)) {
        Ok(()) => {}
        Err(mpsc::RecvTimeoutError::Timeout) => panic!("{what}: did not finish"),
        Err(mpsc::RecvTimeoutError::Disconnected) => panic!("{what}: failed (see the panic above)"),
    }
}

/// Every mutant of `descriptor` opens to a bounded plate or an error naming
/// a file. Returns how many were refused for an implausible count.
fn fuzz(plate: PathBuf, descriptor: PathBuf, seed: u64, mutants: usize, max_planes: u64) -> usize {
    let original = std::fs::read(&descriptor).unwrap();
    // The seed is the raw xorshift64 state, as when these mutants were first
    // run (their seeds and mutant numbers are quoted in failures).
    let mut rng = Rng::from_state(seed);
    let mut implausible = 0;
    for k in 0..mutants {
        let m = mutate(&original, &mut rng);
        std::fs::write(&descriptor, &m).unwrap();
        let what = format!("seed {seed} mutant {k}: {:?}", String::from_utf8_lossy(&m));
        match open_capped(&plate) {
            Err(_) => panic!("{what}: panicked"),
            Ok(Ok(p)) => {
                let planes = (p.images.len() + p.missing.len()) as u64;
                assert!(planes <= max_planes, "{what}: {planes} planes listed");
            }
            Ok(Err(e)) => {
                implausible += usize::from(matches!(e, PlateError::ImplausibleCount { .. }));
                let msg = e.to_string();
                assert!(msg.contains(&*plate.to_string_lossy()), "{what}: error names no file: {msg}");
            }
        }
    }
    std::fs::write(&descriptor, &original).unwrap();
    implausible
}

#[test]
fn htd_mutants_open_or_fail_cleanly() {
    let d = tempfile::tempdir().unwrap();
    let cfg = SynthConfig {
        wells: vec!["A01".into(), "B02".into()],
        grid_rows: 1,
        grid_cols: 2,
        channels: 2,
        z_planes: 2,
        ..SynthConfig::default()
    };
    let plate = synth(&d.path().join("ix"), cfg);
    let files = count_files(&plate, "tif");
    let limit = MAX_EXPECTED_FLOOR.max(MAX_EXPECTED_PER_FILE * files);
    let htd = plate.join("Synth_Plate_1.HTD");
    bounded("HTD fuzz", move || {
        let refused = fuzz(plate, htd, 0x5EED_0001, 1500, limit + files);
        // The mutants reach the count refusal (the number is fixed by the seed).
        assert!(refused > 10, "{refused} mutants refused for their counts");
    });
    drop(d);
}

#[test]
fn index_xml_mutants_open_or_fail_cleanly() {
    let d = tempfile::tempdir().unwrap();
    let cfg = SynthConfig {
        format: Format::OperaPhenix,
        wells: vec!["A01".into(), "B02".into()],
        grid_rows: 2,
        grid_cols: 2,
        channels: 2,
        z_planes: 2,
        ..SynthConfig::default()
    };
    let plate = synth(&d.path().join("ph"), cfg);
    let index = plate.join("Images/Index.idx.xml");
    // Each <Image> entry gives at most one image or missing record; a
    // duplicated line can add at most one entry.
    let entries = std::fs::read_to_string(&index).unwrap().matches("<Image ").count() as u64 + 1;
    bounded("index fuzz", move || {
        fuzz(plate, index, 0x5EED_0002, 1000, entries);
    });
    drop(d);
}

#[test]
fn corpus_replays() {
    let corpus = Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/corpus");
    // (file, Some(key) when refused as implausible / None when it opens with its 2 images)
    let expected: [(&str, Option<&str>); 6] = [
        ("zsteps-2147483648.HTD", Some("ZSteps")),
        ("timepoints-2147483647.HTD", Some("TimePoints")),
        ("nwavelengths-2147483647-waves-false.HTD", None),
        ("nwavelengths-1000000-waves-true.HTD", Some("NWavelengths")),
        ("sites-100000x100000-no-selection.HTD", Some("XSites × YSites")),
        ("ywells-4000000000.HTD", None),
    ];
    let mut listed: Vec<String> = std::fs::read_dir(&corpus)
        .unwrap()
        .flatten()
        .map(|e| e.file_name().to_string_lossy().into_owned())
        .filter(|n| n.ends_with(".HTD"))
        .collect();
    listed.sort();
    let mut names: Vec<String> = expected.iter().map(|(n, _)| n.to_string()).collect();
    names.sort();
    assert_eq!(listed, names, "every corpus file has an expected outcome here");

    let d = tempfile::tempdir().unwrap();
    let cfg = SynthConfig { wells: vec!["A01".into()], grid_rows: 1, grid_cols: 1, channels: 1, z_planes: 2, ..SynthConfig::default() };
    let plate = synth(&d.path().join("p"), cfg);
    let htd = plate.join("Synth_Plate_1.HTD");
    bounded("corpus", move || {
        for (name, want) in expected {
            std::fs::copy(corpus.join(name), &htd).unwrap();
            match (open_capped(&plate), want) {
                (Err(_), _) => panic!("{name}: panicked"),
                (Ok(Ok(p)), None) => assert_eq!((p.images.len(), p.missing.len()), (2, 0), "{name}"),
                (Ok(Err(PlateError::ImplausibleCount { key, files, .. })), Some(k)) => {
                    assert_eq!((key.as_str(), files), (k, 2), "{name}")
                }
                (Ok(other), _) => panic!("{name}: expected {want:?}, got {other:?}"),
            }
        }
    });
    drop(d);
}
