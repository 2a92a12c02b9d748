//! The expecting readers (`read_stack_expecting`, `read_stacks_expecting`):
//! a file is checked against the plane size, dtype and page count the caller
//! knows before any pixel is decoded, and decoding is budgeted to that plane.
//! And every reader refuses, without blocking, a path that is not a regular
//! file.

use crate::common;
#[path = "../common/forge.rs"]
mod forge;

use std::io::Read;
use std::path::Path;
use std::sync::mpsc;
use std::time::Duration;

use common::{assert_same, random_stack};
use forge::{tiff, zlib_zeros, Page};
use hcsflow_core::{DType, Stack};
use hcsflow_tiff::{
    read_info, read_stack, read_stack_expecting, read_stacks, read_stacks_expecting, write_stack, Compression, Expected, PlaneFormat,
    TiffError, WriteOptions,
};

fn u16_plane(size: usize) -> PlaneFormat {
    PlaneFormat::new(size, size, DType::U16)
}

fn write(path: &Path, stack: &Stack, compression: Compression) {
    let options = WriteOptions { compression, ..WriteOptions::default() };
    write_stack(path, stack, &options).expect("write");
}

#[test]
fn the_forged_zlib_stream_inflates_to_zeros() {
    for n in [1, 2, 258, 259, 260, 1000, 70_000] {
        let mut out = Vec::new();
        flate2::read::ZlibDecoder::new(&zlib_zeros(n)[..]).read_to_end(&mut out).expect("valid zlib");
        assert_eq!(out.len(), n);
        assert!(out.iter().all(|&b| b == 0));
    }
}

#[test]
fn a_small_file_claiming_a_huge_image_fails_on_its_tags_before_decoding() {
    // D2: a valid 8000² u16 Deflate plane of zeros (128 MB) in under 1 MB,
    // where the caller expects 64² u16.
    let dir = tempfile::tempdir().expect("tempdir");
    let bomb = dir.path().join("bomb.tif");
    let claimed = 8000 * 8000 * 2;
    std::fs::write(&bomb, tiff(&Page::deflate_u16(8000, 8000), &zlib_zeros(claimed))).expect("write");
    assert!(std::fs::metadata(&bomb).expect("meta").len() < 1_000_000);
    let expected = Expected::one_plane(u16_plane(64));
    let err = read_stack_expecting(&bomb, expected).expect_err("must not decode");
    match &err {
        TiffError::FormatMismatch { path, page, expected, found } => {
            assert_eq!(path, &bomb);
            assert_eq!(*page, 0);
            assert_eq!(*expected, u16_plane(64));
            assert_eq!(*found, u16_plane(8000));
        }
        other => panic!("expected FormatMismatch, got {other:?}"),
    }
    let message = err.to_string();
    assert!(message.contains(&*bomb.to_string_lossy()), "{message}");
    assert!(message.contains("page 0 is 8000x8000 u16 but 64x64 u16 was expected"), "{message}");

    // The check comes before any decoding: with garbage in place of the
    // compressed data the error is the same, where the unchecked reader
    // (which decodes first) reports the broken data.
    let garbage = dir.path().join("garbage.tif");
    let noise = hcsflow_testkit::Rng::new(13).bytes(40_000);
    std::fs::write(&garbage, tiff(&Page::deflate_u16(8000, 8000), &noise)).expect("write");
    let err = read_stack_expecting(&garbage, expected).expect_err("must not decode");
    assert!(matches!(err, TiffError::FormatMismatch { .. }), "{err:?}");
    let err = read_stacks_expecting(&[&garbage], expected).expect_err("must not decode");
    assert!(matches!(err, TiffError::FormatMismatch { .. }), "{err:?}");
    let err = read_stack(&garbage).expect_err("garbage data");
    assert!(matches!(err, TiffError::Corrupt { .. }), "{err:?}");
}

#[test]
fn a_dtype_or_size_mismatch_names_both_formats() {
    let dir = tempfile::tempdir().expect("tempdir");
    let path = dir.path().join("u8.tif");
    write(&path, &random_stack(DType::U8, [1, 32, 48], 1), Compression::Deflate);
    let err = read_stack_expecting(&path, Expected::one_plane(u16_plane(64))).expect_err("u8");
    assert!(err.to_string().ends_with("u8.tif: page 0 is 48x32 u8 but 64x64 u16 was expected"), "{err}");
    // Same size, other dtype.
    let err = read_stack_expecting(&path, Expected::one_plane(PlaneFormat::new(32, 48, DType::U16))).expect_err("u8");
    assert!(err.to_string().contains("page 0 is 48x32 u8 but 48x32 u16 was expected"), "{err}");
    // The unchecked multi-file reader names both files and both formats.
    let other = dir.path().join("u16.tif");
    write(&other, &random_stack(DType::U16, [1, 64, 64], 2), Compression::None);
    let err = read_stacks(&[&other, &path]).expect_err("mismatch");
    assert!(matches!(err, TiffError::FileMismatch { .. }), "{err:?}");
    let message = err.to_string();
    assert!(message.contains("u8.tif is 48x32 u8 but") && message.contains("u16.tif is 64x64 u16"), "{message}");
}

#[test]
fn page_counts_are_checked_against_the_expected_count() {
    let dir = tempfile::tempdir().expect("tempdir");
    let path = dir.path().join("three.tif");
    let stack = random_stack(DType::U16, [3, 8, 8], 3);
    write(&path, &stack, Compression::Deflate);
    let plane = u16_plane(8);
    let err = read_stack_expecting(&path, Expected::one_plane(plane)).expect_err("3 pages");
    assert!(matches!(err, TiffError::PageCount { expected: 1, found: 3, .. }), "{err:?}");
    assert!(err.to_string().ends_with("three.tif: 3 pages but 1 expected"), "{err}");
    let err = read_stack_expecting(&path, Expected { plane, pages: Some(4) }).expect_err("3 pages");
    assert!(matches!(err, TiffError::PageCount { expected: 4, found: 3, .. }), "{err:?}");
    assert_eq!(read_stack_expecting(&path, Expected { plane, pages: Some(3) }).expect("3 pages"), stack);
    assert_eq!(read_stack_expecting(&path, Expected { plane, pages: None }).expect("any count"), stack);
}

#[test]
fn matching_files_read_as_the_unchecked_readers_read_them() {
    let dir = tempfile::tempdir().expect("tempdir");
    for (i, dtype) in [DType::U8, DType::U16, DType::F32].into_iter().enumerate() {
        let mut paths = Vec::new();
        for (j, compression) in [Compression::None, Compression::Deflate].into_iter().enumerate() {
            let path = dir.path().join(format!("{dtype}-{j}.tif"));
            let stack = random_stack(dtype, [1, 17, 23], (i * 2 + j) as u64);
            write(&path, &stack, compression);
            let expected = Expected::one_plane(PlaneFormat::new(17, 23, dtype));
            assert_same(&read_stack_expecting(&path, expected).expect("matches"), &stack);
            paths.push(path);
        }
        let expected = Expected::one_plane(PlaneFormat::new(17, 23, dtype));
        assert_same(&read_stacks_expecting(&paths, expected).expect("matches"), &read_stacks(&paths).expect("unchecked"));
    }
    let none: [&Path; 0] = [];
    assert!(matches!(read_stacks_expecting(&none, Expected::one_plane(u16_plane(8))), Err(TiffError::NoFiles)));
}

#[test]
fn the_decoders_buffers_are_budgeted_to_the_expected_plane() {
    // A 64² page in one tile 32768 pixels wide: the tags match the expected
    // plane, but decoding the tile's 64 visible rows at its full width needs
    // a 4 MiB buffer for an 8 KiB plane. The budget refuses it before the
    // allocation.
    let dir = tempfile::tempdir().expect("tempdir");
    let path = dir.path().join("wide-tile.tif");
    let page = Page { tile: Some((32768, 64)), ..Page::deflate_u16(64, 64) };
    std::fs::write(&path, tiff(&page, &zlib_zeros(32768 * 64 * 2))).expect("write");
    let err = read_stack_expecting(&path, Expected::one_plane(u16_plane(64))).expect_err("over budget");
    assert!(matches!(err, TiffError::Corrupt { .. }), "{err:?}");
    assert!(err.to_string().contains("limits"), "{err}");
    // The unchecked reader has only the 4096x expansion budget: it decodes
    // the tile and keeps its visible corner.
    let stack = read_stack(&path).expect("unchecked read decodes the tile");
    assert_eq!(stack, Stack::zeros(DType::U16, [1, 64, 64]));
}

#[test]
fn codecs_that_size_their_own_output_are_refused_for_an_expected_plane() {
    // A JPEG decoder allocates what the JPEG stream declares (up to 16384²
    // in zune-jpeg), whatever the TIFF tags say.
    let dir = tempfile::tempdir().expect("tempdir");
    let path = dir.path().join("jpeg.tif");
    let page = Page { bits: 8, compression: 7, ..Page::deflate_u16(64, 64) };
    std::fs::write(&path, tiff(&page, &[0xFF, 0xD8, 0xFF, 0xD9])).expect("write");
    let err = read_stack_expecting(&path, Expected::one_plane(PlaneFormat::new(64, 64, DType::U8))).expect_err("jpeg");
    assert!(matches!(err, TiffError::Unsupported { page: 0, .. }), "{err:?}");
    assert!(err.to_string().contains("jpeg compression"), "{err}");
}

/// Runs `f` on another thread; fails the test if it has not returned in 5 s
/// (the thread is then left blocked, and ends with the test process).
fn within_5s<T: Send + 'static>(what: &str, f: impl FnOnce() -> T + Send + 'static) -> T {
    let (tx, rx) = mpsc::channel();
    std::thread::spawn(move || {
        let _ = tx.send(f());
    });
    rx.recv_timeout(Duration::from_secs(5)).unwrap_or_else(|_| panic!("{what} blocked for 5 s"))
}

#[cfg(unix)]
#[test]
fn a_fifo_named_like_an_image_is_refused_without_blocking() {
    // D14: opening a FIFO for reading blocks until a writer comes.
    let dir = tempfile::tempdir().expect("tempdir");
    let fifo = dir.path().join("Synth_Plate_1_A01_s2.tif");
    let c_path = std::ffi::CString::new(fifo.to_str().expect("utf-8").as_bytes()).expect("no NUL");
    // SAFETY: a valid NUL-terminated path; mkfifo only creates the node.
    assert_eq!(unsafe { libc::mkfifo(c_path.as_ptr(), 0o600) }, 0, "mkfifo");
    let expected = Expected::one_plane(u16_plane(64));
    let results: Vec<(&str, Result<(), TiffError>)> = within_5s("reading a FIFO", {
        let fifo = fifo.clone();
        move || {
            vec![
                ("read_stack", read_stack(&fifo).map(drop)),
                ("read_info", read_info(&fifo).map(drop)),
                ("read_stacks", read_stacks(&[&fifo]).map(drop)),
                ("read_stack_expecting", read_stack_expecting(&fifo, expected).map(drop)),
                ("read_stacks_expecting", read_stacks_expecting(&[&fifo], expected).map(drop)),
            ]
        }
    });
    for (reader, result) in results {
        let err = result.expect_err(reader);
        assert!(matches!(&err, TiffError::NotRegularFile { path, kind: "a FIFO (named pipe)" } if *path == fifo), "{reader}: {err:?}");
        assert!(err.to_string().ends_with("Synth_Plate_1_A01_s2.tif: is a FIFO (named pipe), not a regular file"), "{err}");
    }
}

#[cfg(unix)]
#[test]
fn directories_and_devices_are_not_regular_files() {
    let dir = tempfile::tempdir().expect("tempdir");
    let folder = dir.path().join("folder.tif");
    std::fs::create_dir(&folder).expect("mkdir");
    let err = within_5s("reading a directory", move || read_stack(&folder)).expect_err("directory");
    assert!(matches!(err, TiffError::NotRegularFile { kind: "a folder", .. }), "{err:?}");
    if Path::new("/dev/zero").exists() {
        let err = within_5s("reading /dev/zero", || read_stack(Path::new("/dev/zero"))).expect_err("device");
        assert_eq!(err.to_string(), "/dev/zero: is a character device, not a regular file");
    }
}
