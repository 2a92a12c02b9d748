//! tifffile (Python) as an independent oracle, in both directions:
//! files we write must be read by tifffile with identical pixels and
//! metadata, and files tifffile writes must be read by us identically.
//!
//! Needs `python3` with `pip install tifffile numpy imagecodecs`; without
//! them these tests fail with that command (`hcsflow_testkit::oracle`'s
//! policy: never skipped under `CI=true`, skipped outside CI with
//! `HCSFLOW_SKIP_ORACLES=1`).

use crate::common;

use std::collections::HashMap;
use std::path::{Path, PathBuf};

use common::{assert_same, random_stack, smooth_u16};
use hcsflow_core::{DType, Stack};
use hcsflow_testkit::oracle::{self, Oracle};
use hcsflow_tiff::{read_info, read_stack, write_stack, Compression, WriteOptions};
use ndarray::Array3;

fn script() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/oracle/tiff_oracle.py")
}

/// tifffile, or `None` when it is missing and may be skipped.
fn tifffile() -> Option<Oracle> {
    oracle::require(&["tifffile", "numpy", "imagecodecs"], "pip install tifffile numpy imagecodecs")
}

/// Runs the oracle script once for all `commands` (each a list of
/// arguments) and returns each command's stdout.
fn run_batch(python: &Oracle, dir: &Path, commands: &[Vec<String>]) -> Vec<String> {
    let list = dir.join("oracle-commands.txt");
    let text: String = commands.iter().map(|c| c.join("\t") + "\n").collect();
    std::fs::write(&list, text).expect("command list");
    let stdout = python.run([path_str(&script()), "batch", path_str(&list)]);
    (0..commands.len())
        .map(|i| {
            let begin = format!("### begin {i}\n");
            let end = format!("### end {i}\n");
            let from = stdout.find(&begin).expect("begin marker") + begin.len();
            let to = stdout[from..].find(&end).expect("end marker") + from;
            stdout[from..to].to_string()
        })
        .collect()
}

/// Reads each file with tifffile: its `key=value` report and pixel bytes.
fn oracle_read_all(python: &Oracle, dir: &Path, tifs: &[PathBuf]) -> Vec<(HashMap<String, String>, Vec<u8>)> {
    let raws: Vec<PathBuf> = tifs.iter().map(|t| t.with_extension("oracle.raw")).collect();
    let commands: Vec<Vec<String>> =
        tifs.iter().zip(&raws).map(|(t, r)| vec!["read".into(), path_str(t).into(), path_str(r).into()]).collect();
    run_batch(python, dir, &commands)
        .into_iter()
        .zip(&raws)
        .map(|(report, raw)| {
            let map = report.lines().filter_map(|l| l.split_once('=')).map(|(k, v)| (k.to_string(), v.to_string())).collect();
            (map, std::fs::read(raw).expect("raw pixels"))
        })
        .collect()
}

fn path_str(p: &Path) -> &str {
    p.to_str().expect("utf-8 temp path")
}

fn hex(bytes: &[u8]) -> String {
    bytes.iter().map(|b| format!("{b:02x}")).collect()
}

#[test]
fn tifffile_reads_what_we_write() {
    let Some(python) = tifffile() else { return };
    let dir = tempfile::tempdir().expect("tempdir");
    let description = "hcsflow oracle test\nwith µm and a second line";
    let harmony = "<Image><Unit>µm</Unit></Image>";
    let mut cases = Vec::new();
    for (i, dtype) in DType::ALL.into_iter().enumerate() {
        for compression in [Compression::None, Compression::Deflate] {
            for shape in [[1, 19, 23], [3, 37, 53]] {
                let stack = random_stack(dtype, shape, 100 + i as u64);
                let path = dir.path().join(format!("ours-{dtype}-{compression:?}-{}.tif", shape[0]));
                let options = WriteOptions {
                    compression,
                    description: Some(description.into()),
                    pixel_size_um: Some(0.325),
                    extra_ascii_tags: vec![(65500, harmony.into())],
                };
                write_stack(&path, &stack, &options).expect("write");
                cases.push((path, stack, compression, shape));
            }
        }
    }
    let paths: Vec<PathBuf> = cases.iter().map(|c| c.0.clone()).collect();
    let reports = oracle_read_all(&python, dir.path(), &paths);
    for ((_, stack, compression, shape), (report, pixels)) in cases.iter().zip(reports) {
        let dtype = stack.dtype();
        let case = format!("{dtype} {compression:?} {shape:?}");
        assert!(pixels == stack.as_bytes(), "{case}: tifffile sees different pixels");
        let numpy_dtype = match dtype {
            DType::U8 => "uint8",
            DType::U16 => "uint16",
            DType::F32 => "float32",
        };
        assert_eq!(report["dtype"], numpy_dtype, "{case}");
        assert_eq!(report["pages"], shape[0].to_string(), "{case}");
        assert_eq!(report["shape"], format!("{},{},{}", shape[0], shape[1], shape[2]), "{case}");
        let code = if *compression == Compression::None { "1" } else { "8" };
        assert_eq!(report["compression"], code, "{case}");
        assert_eq!(report["description_hex"], hex(description.as_bytes()), "{case}");
        assert_eq!(report["tag65500_hex"], hex(harmony.as_bytes()), "{case}");
        assert_eq!(report["ResolutionUnit"], "3", "{case}: centimetre");
        let um: f64 = report["pixel_size_um"].parse().expect("pixel size");
        assert!((um - 0.325).abs() < 1e-9, "{case}: tifffile says {um} µm");
    }
}

#[test]
fn tifffile_reads_a_large_smooth_deflate_stack() {
    let Some(python) = tifffile() else { return };
    let dir = tempfile::tempdir().expect("tempdir");
    let stack = smooth_u16([2, 1500, 700]);
    let path = dir.path().join("smooth.tif");
    write_stack(&path, &stack, &WriteOptions { compression: Compression::Deflate, ..Default::default() }).expect("write");
    let (report, pixels) = oracle_read_all(&python, dir.path(), &[path]).remove(0);
    assert!(pixels == stack.as_bytes());
    assert_eq!(report["predictor"], "2", "horizontal predictor");
}

/// Files tifffile writes (in one batch) and we read; each case is a file
/// name and the oracle's write keys.
fn check_tifffile_files(python: &Oracle, dir: &Path, cases: &[(String, Vec<String>)]) {
    let commands: Vec<Vec<String>> = cases
        .iter()
        .map(|(name, args)| {
            let mut c = vec![
                "write".to_string(),
                path_str(&dir.join(format!("{name}.tif"))).to_string(),
                path_str(&dir.join(format!("{name}.raw"))).to_string(),
            ];
            c.extend(args.iter().cloned());
            c
        })
        .collect();
    run_batch(python, dir, &commands);
    for (name, args) in cases {
        check_tifffile_file(dir, name, args);
    }
}

/// One file tifffile wrote: we must read exactly its pixels and metadata.
fn check_tifffile_file(dir: &Path, name: &str, args: &[String]) {
    let tif = dir.join(format!("{name}.tif"));
    let raw = dir.join(format!("{name}.raw"));

    let opts: HashMap<&str, &str> = args.iter().filter_map(|a| a.split_once('=')).collect();
    let dims: Vec<usize> = opts["shape"].split(',').map(|v| v.parse().expect("dim")).collect();
    let [z, y, x] = [dims[0], dims[1], dims[2]];
    let expected_bytes = std::fs::read(&raw).expect("raw");
    let expected = match opts["dtype"] {
        "uint8" => Stack::from(Array3::from_shape_vec((z, y, x), expected_bytes).expect("shape")),
        "uint16" => Stack::from(
            Array3::from_shape_vec((z, y, x), expected_bytes.chunks_exact(2).map(|c| u16::from_ne_bytes([c[0], c[1]])).collect())
                .expect("shape"),
        ),
        "float32" => Stack::from(
            Array3::from_shape_vec(
                (z, y, x),
                expected_bytes.chunks_exact(4).map(|c| f32::from_ne_bytes([c[0], c[1], c[2], c[3]])).collect(),
            )
            .expect("shape"),
        ),
        other => panic!("dtype {other}"),
    };

    let ours = read_stack(&tif).unwrap_or_else(|e| panic!("{name}: {e}"));
    assert_same(&ours, &expected);

    let info = read_info(&tif).unwrap_or_else(|e| panic!("{name}: {e}"));
    assert_eq!((info.pages, info.height, info.width), (z, y, x), "{name}");
    assert_eq!(info.dtype, expected.dtype(), "{name}");
    let compression = match opts.get("compression").copied().unwrap_or("1") {
        "1" => "none",
        "5" => "lzw",
        "8" => "deflate",
        "32773" => "packbits",
        "32946" => "deflate-old",
        other => panic!("compression {other}"),
    };
    assert_eq!(info.compression, compression, "{name}");
    assert_eq!(info.description.as_deref(), opts.get("description").copied(), "{name}");
}

#[test]
fn we_read_what_tifffile_writes() {
    let Some(python) = tifffile() else { return };
    let dir = tempfile::tempdir().expect("tempdir");
    let mut cases: Vec<(String, Vec<String>)> = Vec::new();
    let args = |list: &[&str]| -> Vec<String> { list.iter().map(|a| a.to_string()).collect() };
    for dtype in ["uint8", "uint16", "float32"] {
        for (cname, code) in [("none", "1"), ("lzw", "5"), ("zlib", "8"), ("deflate-old", "32946"), ("packbits", "32773")] {
            let dt = format!("dtype={dtype}");
            let c = format!("compression={code}");
            let (dt, c) = (dt.as_str(), c.as_str());
            // Single page, default strips.
            cases.push((format!("{dtype}-{cname}-1"), args(&[dt, c, "shape=1,41,47", "seed=3"])));
            // Multi-page, several strips per page, with a description.
            cases.push((
                format!("{dtype}-{cname}-3"),
                args(&[dt, c, "shape=3,37,53", "rowsperstrip=5", "seed=4", "description=from tifffile"]),
            ));
            // Tiled with partial edge tiles.
            cases.push((format!("{dtype}-{cname}-tiled"), args(&[dt, c, "shape=2,37,53", "tile=16,16", "seed=5"])));
            // Big-endian.
            cases.push((format!("{dtype}-{cname}-be"), args(&[dt, c, "shape=2,21,17", "byteorder=>", "seed=6"])));
        }
    }
    check_tifffile_files(&python, dir.path(), &cases);
}

#[test]
fn we_read_tifffile_special_layouts() {
    let Some(python) = tifffile() else { return };
    let dir = tempfile::tempdir().expect("tempdir");
    let d = dir.path();
    let cases: &[(&str, &[&str])] = &[
        ("bigtiff-u16", &["dtype=uint16", "shape=3,33,35", "bigtiff=1"]),
        ("bigtiff-f32-zlib-tiled", &["dtype=float32", "shape=2,40,40", "bigtiff=1", "compression=8", "tile=16,32"]),
        ("bigtiff-be-u8", &["dtype=uint8", "shape=2,9,11", "bigtiff=1", "byteorder=>"]),
        ("lzw-predictor-u16", &["dtype=uint16", "shape=2,37,53", "compression=5", "predictor=1"]),
        ("zlib-predictor-u8-be", &["dtype=uint8", "shape=2,37,53", "compression=8", "predictor=1", "byteorder=>"]),
        ("zlib-float-predictor", &["dtype=float32", "shape=2,37,53", "compression=8", "predictor=1"]),
        ("lzw-float-predictor-be-tiled", &["dtype=float32", "shape=2,37,53", "compression=5", "predictor=1", "byteorder=>", "tile=16,16"]),
        ("miniswhite-u16", &["dtype=uint16", "shape=2,13,17", "photometric=miniswhite"]),
        ("miniswhite-u8-lzw", &["dtype=uint8", "shape=1,13,17", "photometric=miniswhite", "compression=5"]),
        ("one-row-strips", &["dtype=uint16", "shape=2,31,7", "rowsperstrip=1"]),
        ("one-pixel", &["dtype=float32", "shape=1,1,1"]),
    ];
    let cases: Vec<(String, Vec<String>)> = cases.iter().map(|(n, a)| (n.to_string(), a.iter().map(|v| v.to_string()).collect())).collect();
    check_tifffile_files(&python, d, &cases);
}

/// Pages whose samples tifffile stores as separate planes (`PlanarConfiguration`
/// 2) read as one plane per sample, page after page; interleaved samples are
/// refused with the reason; a plate read (one plane expected) refuses a
/// multi-sample page.
#[test]
fn separate_sample_planes_read_as_planes() {
    let Some(python) = tifffile() else { return };
    let dir = tempfile::tempdir().expect("tempdir");
    let d = path_str(dir.path()).to_string();
    let script = r#"
import sys, numpy as np, tifffile
d = sys.argv[1]
rgb = (np.arange(3 * 13 * 17, dtype=np.uint16) * 5).reshape(3, 13, 17)
tifffile.imwrite(d + "/rgb.tif", rgb, photometric="rgb", planarconfig="separate")
rgb.tofile(d + "/rgb.raw")
two = (np.arange(2 * 2 * 13 * 17, dtype=np.uint16) * 7).reshape(2, 2, 13, 17)
tifffile.imwrite(d + "/two.tif", two, photometric="minisblack", planarconfig="separate", compression="zlib")
two.tofile(d + "/two.raw")
tifffile.imwrite(d + "/chunky.tif", np.zeros((13, 17, 3), np.uint8), photometric="rgb")
print("ok")
"#;
    python.run(["-c", script, &d]);
    let raw = |name: &str, planes: usize| -> Stack {
        let bytes = std::fs::read(dir.path().join(name)).expect("raw");
        let values: Vec<u16> = bytes.chunks_exact(2).map(|b| u16::from_le_bytes([b[0], b[1]])).collect();
        Stack::from(Array3::from_shape_vec((planes, 13, 17), values).expect("shape"))
    };
    assert_eq!(read_stack(&dir.path().join("rgb.tif")).expect("rgb"), raw("rgb.raw", 3));
    assert_eq!(read_stack(&dir.path().join("two.tif")).expect("two pages of two samples"), raw("two.raw", 4));
    let e = read_stack(&dir.path().join("chunky.tif")).expect_err("interleaved");
    assert!(e.to_string().contains("stored interleaved"), "{e}");
    let plane = hcsflow_tiff::PlaneFormat::new(13, 17, DType::U16);
    let e =
        hcsflow_tiff::read_stack_expecting(&dir.path().join("rgb.tif"), hcsflow_tiff::Expected::one_plane(plane)).expect_err("3 planes");
    assert!(e.to_string().contains("3 samples per pixel"), "{e}");
}
