//! `hcsflow synth` then `hcsflow inspect --json` round-trips the options, for both formats.

use hcsflow_testkit::snapshot;
use std::collections::BTreeSet;
use std::process::Output;

use crate::common;
use common::hcsflow;

fn ok(o: Output) -> Output {
    assert!(o.status.success(), "stderr: {}", String::from_utf8_lossy(&o.stderr));
    o
}

struct Case {
    args: &'static [&'static str],
    wells: usize,
    sites: u64,
    grid: (u64, u64),
    channels: u64,
    z: u64,
    t: u64,
    missing: usize,
}

#[test]
fn synth_then_inspect_round_trips_the_options() {
    let cases = [
        Case {
            args: &[
                "--format",
                "imagexpress",
                "--wells",
                "A01,B02",
                "--grid",
                "2x3",
                "--channels",
                "2",
                "--z",
                "3",
                "--missing-planes",
                "2",
            ],
            wells: 2,
            sites: 6,
            grid: (2, 3),
            channels: 2,
            z: 3,
            t: 1,
            missing: 2,
        },
        Case {
            args: &[
                "--format",
                "imagexpress",
                "--plate",
                "1536",
                "--wells",
                "AF48,A01",
                "--grid",
                "1x1",
                "--channels",
                "1",
                "--guid",
                "bare",
                "--thumbnails",
                "--upper-case-tif",
            ],
            wells: 2,
            sites: 1,
            grid: (1, 1),
            channels: 1,
            z: 1,
            t: 1,
            missing: 0,
        },
        Case {
            args: &[
                "--format",
                "imagexpress",
                "--wells",
                "C03",
                "--grid",
                "3x3",
                "--skip-sites",
                "1,9",
                "--timepoints",
                "2",
                "--guid",
                "bracketed",
            ],
            wells: 1,
            sites: 7,
            grid: (3, 3),
            channels: 2,
            z: 1,
            t: 2,
            missing: 0,
        },
        Case {
            args: &["--format", "imagexpress", "--wells", "D04", "--grid", "1x2", "--flat", "--channels", "3"],
            wells: 1,
            sites: 2,
            grid: (1, 2),
            channels: 3,
            z: 1,
            t: 1,
            missing: 0,
        },
        Case {
            args: &[
                "--format",
                "opera-phenix",
                "--wells",
                "A01,H12",
                "--grid",
                "3x3",
                "--z",
                "2",
                "--timepoints",
                "2",
                "--missing-planes",
                "3",
            ],
            wells: 2,
            sites: 9,
            grid: (3, 3),
            channels: 2,
            z: 2,
            t: 2,
            missing: 3,
        },
        Case {
            args: &[
                "--format",
                "opera-phenix",
                "--wells",
                "B01",
                "--grid",
                "2x4",
                "--channels",
                "4",
                "--index-name",
                "Index.xml",
                "--harmony-v6",
            ],
            wells: 1,
            sites: 8,
            grid: (2, 4),
            channels: 4,
            z: 1,
            t: 1,
            missing: 0,
        },
    ];
    let dir = tempfile::tempdir().unwrap();
    for (i, c) in cases.iter().enumerate() {
        let out = dir.path().join(format!("plate{i}"));
        let mut args = vec!["synth", out.to_str().unwrap(), "--size", "48", "--seed", "7", "--pixel-size", "0.325"];
        args.extend_from_slice(c.args);
        ok(hcsflow(&args));
        let before = snapshot(&out);
        let o = ok(hcsflow(&["inspect", out.to_str().unwrap(), "--json"]));
        assert_eq!(snapshot(&out), before, "inspect must not touch the plate");
        let v: serde_json::Value = serde_json::from_slice(&o.stdout).unwrap();
        let m = &v["metadata"];
        let ctx = format!("case {i} {:?}", c.args);
        assert_eq!(v["format"], c.args[1], "{ctx}");
        let wells: BTreeSet<&str> = v["images"].as_array().unwrap().iter().map(|r| r["well"].as_str().unwrap()).collect();
        assert_eq!(wells.len(), c.wells, "{ctx}");
        assert_eq!(m["sites"], c.sites, "{ctx}");
        assert_eq!((m["grid_rows"].as_u64().unwrap(), m["grid_cols"].as_u64().unwrap()), c.grid, "{ctx}");
        assert_eq!(m["channels"], c.channels, "{ctx}");
        assert_eq!(m["z_planes"], c.z, "{ctx}");
        assert_eq!(m["timepoints"], c.t, "{ctx}");
        assert_eq!(m["pixel_size_um"], 0.325, "{ctx}");
        assert_eq!((m["image_width"].as_u64(), m["dtype"].as_str()), (Some(48), Some("u16")), "{ctx}");
        let missing = v["missing"].as_array().unwrap().len();
        assert_eq!(missing, c.missing, "{ctx}");
        let expected_images = c.wells as u64 * c.sites * c.channels * c.z * c.t - c.missing as u64;
        assert_eq!(v["images"].as_array().unwrap().len() as u64, expected_images, "{ctx}");
        // The human summary names the missing planes too.
        let text = ok(hcsflow(&["inspect", out.to_str().unwrap()]));
        let text = String::from_utf8_lossy(&text.stdout);
        assert!(text.contains(&format!("Missing:     {missing}")), "{ctx}: {text}");
    }
}

#[test]
fn synth_and_inspect_errors() {
    let dir = tempfile::tempdir().unwrap();
    let bad_grid = hcsflow(&["synth", dir.path().join("x").to_str().unwrap(), "--grid", "3by3"]);
    assert_eq!(bad_grid.status.code(), Some(2));
    assert!(String::from_utf8_lossy(&bad_grid.stderr).contains("bad --grid '3by3'"));
    // A non-empty folder that is not a synthetic plate is never overwritten.
    std::fs::write(dir.path().join("keep.txt"), "precious").unwrap();
    let o = hcsflow(&["synth", dir.path().to_str().unwrap(), "--overwrite"]);
    assert!(!o.status.success());
    assert_eq!(std::fs::read_to_string(dir.path().join("keep.txt")).unwrap(), "precious");
    // Inspecting something that is not a plate names the folder.
    let o = hcsflow(&["inspect", dir.path().to_str().unwrap()]);
    assert_eq!(o.status.code(), Some(1));
    assert!(String::from_utf8_lossy(&o.stderr).contains(dir.path().to_str().unwrap()));
    let o = hcsflow(&["inspect", dir.path().to_str().unwrap(), "--format", "zeiss"]);
    assert_eq!(o.status.code(), Some(2));
}

/// `hcsflow inspect OUT --json` of a run's output reports the wells, fields
/// and channels of the planes the run wrote (its `summary.csv`), and
/// `hcsflow run OUT …` runs a second pipeline on them.
#[test]
fn inspect_of_a_runs_output_reports_what_the_run_wrote() {
    let dir = tempfile::tempdir().unwrap();
    let plate = dir.path().join("plate");
    let args = ["--wells", "A01,B03", "--grid", "2x2", "--channels", "2", "--z", "3", "--size", "32", "--pixel-size", "0.5"];
    ok(hcsflow(&[&["synth", plate.to_str().unwrap()], &args[..]].concat()));
    let pipeline = dir.path().join("max.toml");
    std::fs::write(
        &pipeline,
        "name = \"max\"\n[[steps]]\nname = \"max_z\"\nfunc = \"max_projection\"\nvariable_components = [\"z_index\"]\nmaterialize = [\"tiff\"]\n",
    )
    .unwrap();
    let out = dir.path().join("out");
    ok(hcsflow(&["run", plate.to_str().unwrap(), pipeline.to_str().unwrap(), out.to_str().unwrap(), "--device", "cpu"]));

    let before = snapshot(&out);
    let o = ok(hcsflow(&["inspect", out.to_str().unwrap(), "--json"]));
    assert_eq!(snapshot(&out), before, "inspect must not touch the output");
    let v: serde_json::Value = serde_json::from_slice(&o.stdout).unwrap();
    assert_eq!(v["format"], "hcsflow");
    let inspected: BTreeSet<(String, u64, u64)> = v["images"]
        .as_array()
        .unwrap()
        .iter()
        .map(|r| (r["well"].as_str().unwrap().to_string(), r["site"].as_u64().unwrap(), r["channel"].as_u64().unwrap()))
        .collect();
    let summary = std::fs::read_to_string(out.join("summary.csv")).unwrap();
    let written: BTreeSet<(String, u64, u64)> = summary
        .lines()
        .skip(1)
        .map(|l| {
            let f: Vec<&str> = l.split(',').collect();
            (f[0].to_string(), f[2].parse().unwrap(), f[3].parse().unwrap())
        })
        .collect();
    assert_eq!(inspected, written);
    assert_eq!(inspected.len(), 2 * 4 * 2);
    let m = &v["metadata"];
    assert_eq!((m["sites"].as_u64(), m["channels"].as_u64(), m["z_planes"].as_u64()), (Some(4), Some(2), Some(1)));
    assert_eq!(m["pixel_size_um"], 0.5);

    // A second pipeline on the first run's output folder.
    let out2 = dir.path().join("out2");
    ok(hcsflow(&["run", out.to_str().unwrap(), pipeline.to_str().unwrap(), out2.to_str().unwrap(), "--device", "cpu"]));
    assert_eq!(snapshot(&out), before, "the second run leaves its input untouched");
    let o = ok(hcsflow(&["inspect", out2.to_str().unwrap(), "--json"]));
    let v: serde_json::Value = serde_json::from_slice(&o.stdout).unwrap();
    assert_eq!(v["images"].as_array().unwrap().len(), 2 * 4 * 2);
}
