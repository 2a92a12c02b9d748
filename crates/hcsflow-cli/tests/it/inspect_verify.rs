//! `hcsflow inspect --verify` (D18, D11) and the plate-reading defects of the
//! reliability probes as the CLI shows them: absurd HTD counts (D3), macOS
//! AppleDouble files (D4), index URLs outside the plate (D13), a FIFO named
//! like an image (D14).

use std::path::{Path, PathBuf};
use std::process::{Command, Output, Stdio};
use std::time::{Duration, Instant};

use serde_json::Value;

use crate::common;
use common::{hcsflow, stderr};

fn stdout(o: &Output) -> String {
    String::from_utf8_lossy(&o.stdout).into_owned()
}

fn synth(dir: &Path, name: &str, args: &[&str]) -> PathBuf {
    let out = dir.join(name);
    let mut all = vec!["synth", out.to_str().unwrap(), "--size", "32", "--seed", "3"];
    all.extend_from_slice(args);
    let o = hcsflow(&all);
    assert!(o.status.success(), "synth: {}", stderr(&o));
    out
}

fn max_z(dir: &Path) -> PathBuf {
    let p = dir.join("max_z.toml");
    std::fs::write(
        &p,
        "name = \"max_z\"\n[[steps]]\nname = \"max_z\"\nfunc = \"max_projection\"\nvariable_components = [\"z_index\"]\nmaterialize = [\"tiff\"]\n",
    )
    .unwrap();
    p
}

/// Runs hcsflow, killing it if it has not finished after a minute: a command
/// that blocks (on a FIFO) fails the test instead of hanging it.
fn hcsflow_or_kill(args: &[&str]) -> Output {
    let mut child =
        Command::new(env!("CARGO_BIN_EXE_hcsflow")).args(args).stdout(Stdio::piped()).stderr(Stdio::piped()).spawn().expect("run hcsflow");
    let start = Instant::now();
    while child.try_wait().unwrap().is_none() {
        if start.elapsed() > Duration::from_secs(60) {
            child.kill().unwrap();
            panic!("hcsflow {args:?} blocked");
        }
        std::thread::sleep(Duration::from_millis(20));
    }
    child.wait_with_output().unwrap()
}

fn tiff(path: &Path, size: usize) {
    let s = hcsflow_core::Stack::from(ndarray::Array3::from_elem((1, size, size), 9u16));
    hcsflow_tiff::write_stack(path, &s, &hcsflow_tiff::WriteOptions::default()).unwrap();
}

#[test]
fn verify_lists_every_bad_file_and_exits_1() {
    let d = tempfile::tempdir().unwrap();
    let plate = synth(d.path(), "p", &["--wells", "A01,A02,A03,A04", "--grid", "1x1", "--channels", "1", "--flat"]);
    let p = plate.to_str().unwrap();
    let f = |w: &str| plate.join(format!("Synth_Plate_1_{w}.tif"));

    let o = hcsflow(&["inspect", p, "--verify"]);
    assert_eq!(o.status.code(), Some(0), "{}", stderr(&o));
    let out = stdout(&o);
    assert!(out.contains("Verify:      4 image file(s) checked, plane 32 x 32 u16 (4 of 4 images)\nProblems:    0\n"), "{out}");

    std::fs::write(f("A02"), b"").unwrap();
    std::fs::write(f("A03"), b"garbage, not a TIFF").unwrap();
    tiff(&f("A04"), 48);
    // Plain inspect does not read every header: unchanged, exit 0.
    assert_eq!(hcsflow(&["inspect", p]).status.code(), Some(0));

    let o = hcsflow(&["inspect", p, "--verify"]);
    assert_eq!(o.status.code(), Some(1));
    let out = stdout(&o);
    assert!(out.contains("Verify:      4 image file(s) checked, plane 32 x 32 u16 (1 of 4 images)\nProblems:    3\n"), "{out}");
    assert!(out.contains(&format!("  {}: empty file (0 bytes)", f("A02").display())), "{out}");
    assert!(out.contains(&format!("  {}: not a TIFF file", f("A03").display())), "{out}");
    assert!(out.contains(&format!("  {}: plane is 48 x 48 u16 but the plate's is 32 x 32 u16", f("A04").display())), "{out}");
    assert!(stderr(&o).contains("verify: 3 problem(s) in 4 image file(s) checked"), "{}", stderr(&o));

    let o = hcsflow(&["inspect", p, "--verify", "--json"]);
    assert_eq!(o.status.code(), Some(1));
    let v: Value = serde_json::from_slice(&o.stdout).unwrap();
    assert_eq!(v["format"], "imagexpress", "the plate's JSON is still there");
    let problems: Vec<(&str, &str)> =
        v["verify"]["problems"].as_array().unwrap().iter().map(|p| (p["path"].as_str().unwrap(), p["kind"].as_str().unwrap())).collect();
    let (a2, a3, a4) = (f("A02"), f("A03"), f("A04"));
    assert_eq!(problems, [(a2.to_str().unwrap(), "empty"), (a3.to_str().unwrap(), "not-tiff"), (a4.to_str().unwrap(), "mismatch")]);
    assert_eq!(v["verify"]["problems"][2]["found"]["width"], 48);
    assert_eq!(v["verify"]["checked"], 4);
}

#[test]
fn verify_says_when_the_plate_size_comes_from_an_odd_first_image() {
    // D11: the plate's plane size is the first image's.
    let d = tempfile::tempdir().unwrap();
    let plate = synth(d.path(), "p", &["--wells", "A01,B01", "--grid", "2x2", "--channels", "1", "--flat"]);
    let odd = plate.join("Synth_Plate_1_A01_s1.tif");
    tiff(&odd, 40);
    let o = hcsflow(&["inspect", plate.to_str().unwrap(), "--verify"]);
    assert_eq!(o.status.code(), Some(1));
    let out = stdout(&o);
    assert!(out.contains("Image:       40 x 40 px"), "{out}");
    assert!(out.contains(&format!("  {}: plane is 40 x 40 u16 but the plate's is 32 x 32 u16 (7 of 8 images)", odd.display())), "{out}");
    assert!(
        out.contains("the plate's plane size 40 x 40 u16 (taken from the first image header read) is not the images' majority 32 x 32 u16"),
        "{out}"
    );
}

#[test]
fn verify_lists_planes_that_are_copies_of_another_in_text_and_json() {
    let d = tempfile::tempdir().unwrap();
    let plate = synth(d.path(), "copies", &["--wells", "A01", "--grid", "1x1", "--channels", "1", "--timepoints", "3"]);
    let f = |t: u32| plate.join(format!("TimePoint_{t}/Synth_Plate_1_A01.tif"));
    // What MetaXpress does for a time point it skipped: the last acquired file again.
    std::fs::copy(f(2), f(3)).unwrap();
    let p = plate.to_str().unwrap();
    let o = hcsflow(&["inspect", p, "--verify"]);
    assert_eq!(o.status.code(), Some(0), "a copy is reported, not a problem: {}", stderr(&o));
    let out = stdout(&o);
    assert!(out.contains("Problems:    0\nDuplicates:  1 image(s) with the same bytes as another plane"), "{out}");
    assert!(out.contains(&format!("  {}: the same bytes as {} (", f(3).display(), f(2).display())), "{out}");

    let o = hcsflow(&["inspect", p, "--verify", "--json"]);
    assert_eq!(o.status.code(), Some(0));
    let v: Value = serde_json::from_slice(&o.stdout).unwrap();
    let copies = v["verify"]["duplicates"].as_array().unwrap();
    assert_eq!(copies.len(), 1, "{copies:?}");
    assert_eq!((copies[0]["path"].as_str(), copies[0]["copy_of"].as_str()), (f(3).to_str(), f(2).to_str()));
    assert_eq!((copies[0]["timepoint"].as_u64(), copies[0]["z_index"].as_u64()), (Some(3), Some(1)));
}

#[test]
fn d3_absurd_htd_counts_fail_fast_in_inspect_dry_run_and_run() {
    let d = tempfile::tempdir().unwrap();
    let plate = synth(d.path(), "htd", &["--wells", "A01", "--grid", "1x1", "--channels", "1", "--z", "2"]);
    let htd = plate.join("Synth_Plate_1.HTD");
    let bytes = std::fs::read(&htd).unwrap();
    let pos = bytes.windows(12).position(|w| w == b"\"ZSteps\", 2\r").unwrap();
    let mut m = bytes[..pos].to_vec();
    m.extend_from_slice(b"\"ZSteps\", 2147483648");
    m.extend_from_slice(&bytes[pos + 11..]);
    std::fs::write(&htd, m).unwrap();
    let toml = max_z(d.path());
    let (p, t, out) = (plate.to_str().unwrap(), toml.to_str().unwrap(), d.path().join("out"));
    for args in [vec!["inspect", p], vec!["run", p, t, out.to_str().unwrap(), "--dry-run"], vec!["run", p, t, out.to_str().unwrap()]] {
        let o = hcsflow(&args);
        assert_eq!(o.status.code(), Some(1), "{args:?}");
        let e = stderr(&o);
        assert!(e.contains(&format!("{}: ZSteps 2147483648 but the plate folder has 2 image file(s)", htd.display())), "{args:?}: {e}");
        assert!(e.contains("a corrupt HTD?"), "{e}");
    }
}

#[test]
fn d4_appledouble_file_does_not_replace_the_image() {
    let d = tempfile::tempdir().unwrap();
    let plate = synth(d.path(), "mac", &["--wells", "A01,B02", "--grid", "2x2", "--channels", "2", "--z", "2"]);
    let junk = plate.join("TimePoint_1/ZStep_1/._Synth_Plate_1_A01_s1_w1.tif");
    std::fs::write(&junk, b"\x00\x05\x16\x07\x00\x02\x00\x00Mac OS X        ").unwrap();
    let o = hcsflow(&["inspect", plate.to_str().unwrap()]);
    let out = stdout(&o);
    assert!(!out.contains("duplicate") && !out.contains("prefixes"), "{out}");
    assert!(out.contains("1 hidden TIFF-named file(s)"), "{out}");
    let toml = max_z(d.path());
    let o = hcsflow(&["run", plate.to_str().unwrap(), toml.to_str().unwrap(), d.path().join("out").to_str().unwrap()]);
    assert_eq!(o.status.code(), Some(0), "{}", stderr(&o));
}

#[test]
fn d13_index_url_outside_the_plate_is_not_opened() {
    let d = tempfile::tempdir().unwrap();
    let plate = synth(d.path(), "ph", &["--format", "opera-phenix", "--wells", "A01", "--grid", "1x2", "--channels", "1"]);
    let index = plate.join("Images/Index.idx.xml");
    let xml = std::fs::read_to_string(&index).unwrap();
    std::fs::write(&index, xml.replacen("<URL>r01c01f01p01-ch1sk1fk1fl1.tiff</URL>", "<URL>/etc/hostname</URL>", 1)).unwrap();
    let o = hcsflow(&["inspect", plate.to_str().unwrap()]);
    assert_eq!(o.status.code(), Some(0), "{}", stderr(&o));
    let out = stdout(&o);
    assert!(out.contains("Missing:     1\n"), "{out}");
    assert!(out.contains("URL \"/etc/hostname\" points outside the plate; not opened"), "{out}");
}

#[test]
fn d14_a_fifo_named_like_an_image_does_not_block_inspect() {
    let d = tempfile::tempdir().unwrap();
    let plate = synth(d.path(), "fifo", &["--wells", "A01", "--grid", "2x2", "--channels", "1", "--flat"]);
    let fifo = plate.join("Synth_Plate_1_A01_s2.tif");
    std::fs::remove_file(&fifo).unwrap();
    assert!(Command::new("mkfifo").arg(&fifo).status().unwrap().success());
    let o = hcsflow_or_kill(&["inspect", plate.to_str().unwrap()]);
    assert_eq!(o.status.code(), Some(0), "{}", stderr(&o));
    assert!(stdout(&o).contains(&format!("{} is a FIFO (named pipe), not a regular file; not opened", fifo.display())), "{}", stdout(&o));
    let o = hcsflow_or_kill(&["inspect", plate.to_str().unwrap(), "--verify"]);
    assert_eq!(o.status.code(), Some(1), "a missing plane is a problem for --verify");
    assert!(stderr(&o).contains("verify: 1 problem(s) in 3 image file(s) checked, 1 missing image(s)"), "{}", stderr(&o));
}
