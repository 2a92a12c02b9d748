//! Write → read round trips, metadata, and the error variants of read and write.

use crate::common;

use std::fs::File;
use std::io::BufReader;
use std::path::Path;

use common::{assert_same, random_stack, smooth_u16};
use hcsflow_core::{DType, Stack};
use hcsflow_tiff::{read_info, read_stack, write_stack, Compression, TiffError, WriteOptions};
use ndarray::Array3;
use tiff::decoder::Decoder;
use tiff::encoder::{colortype, TiffEncoder};
use tiff::tags::Tag;

fn opts(compression: Compression) -> WriteOptions {
    WriteOptions { compression, ..Default::default() }
}

#[test]
fn every_dtype_and_compression_round_trips_multi_page() {
    let dir = tempfile::tempdir().expect("tempdir");
    for (i, dtype) in DType::ALL.into_iter().enumerate() {
        for compression in [Compression::None, Compression::Deflate] {
            for shape in [[1, 1, 1], [1, 37, 53], [4, 29, 31]] {
                let stack = random_stack(dtype, shape, 7 + i as u64);
                let path = dir.path().join(format!("{dtype}-{compression:?}-{}.tif", shape[0]));
                write_stack(&path, &stack, &opts(compression)).expect("write");
                let back = read_stack(&path).expect("read");
                assert_same(&back, &stack);

                let info = read_info(&path).expect("info");
                assert_eq!(info.pages, shape[0]);
                assert_eq!((info.height, info.width), (shape[1], shape[2]));
                assert_eq!(info.dtype, dtype);
                assert_eq!(info.description, None);
                let expected = if compression == Compression::None { "none" } else { "deflate" };
                assert_eq!(info.compression, expected);
            }
        }
    }
}

#[test]
fn large_deflate_plane_spans_many_strips_and_compresses() {
    let dir = tempfile::tempdir().expect("tempdir");
    let stack = smooth_u16([2, 1800, 640]);
    let path = dir.path().join("smooth.tif");
    write_stack(&path, &stack, &opts(Compression::Deflate)).expect("write");
    assert_same(&read_stack(&path).expect("read"), &stack);
    let size = std::fs::metadata(&path).expect("meta").len() as usize;
    assert!(size < stack.nbytes() / 3, "deflate+predictor should compress a smooth image: {size} bytes");

    let mut dec = Decoder::new(BufReader::new(File::open(&path).expect("open"))).expect("decoder");
    let strips = dec.strip_count().expect("strips");
    assert!(strips > 1, "expected several strips, got {strips}");
    assert_eq!(dec.find_tag_unsigned::<u16>(Tag::Predictor).expect("tag"), Some(2));
}

#[test]
fn uncompressed_pages_are_one_contiguous_strip() {
    let dir = tempfile::tempdir().expect("tempdir");
    let stack = smooth_u16([2, 300, 200]);
    let path = dir.path().join("plain.tif");
    write_stack(&path, &stack, &WriteOptions::default()).expect("write");
    let mut dec = Decoder::new(BufReader::new(File::open(&path).expect("open"))).expect("decoder");
    assert_eq!(dec.strip_count().expect("strips"), 1);
}

#[test]
fn non_standard_layout_stacks_are_written_in_zyx_order() {
    let dir = tempfile::tempdir().expect("tempdir");
    // Built as [X, Y, Z] and permuted: a view whose memory is not [Z, Y, X].
    let xyz = Array3::from_shape_fn((5, 4, 3), |(x, y, z)| (z * 100 + y * 10 + x) as u16);
    let zyx = xyz.permuted_axes([2, 1, 0]);
    assert!(!zyx.is_standard_layout());
    let stack = Stack::from(zyx.clone());
    let path = dir.path().join("permuted.tif");
    write_stack(&path, &stack, &WriteOptions::default()).expect("write");
    let back = read_stack(&path).expect("read");
    let expected = Array3::from_shape_fn((3, 4, 5), |(z, y, x)| (z * 100 + y * 10 + x) as u16);
    assert_eq!(back, Stack::from(expected));
}

#[test]
fn description_pixel_size_and_extra_tags_are_written() {
    let dir = tempfile::tempdir().expect("tempdir");
    let path = dir.path().join("meta.tif");
    let xml = "<Harmony><Pixel unit=\"µm\">0.65</Pixel></Harmony>";
    let options = WriteOptions {
        compression: Compression::Deflate,
        description: Some("hcsflow test\nline two: 5 µm".into()),
        pixel_size_um: Some(0.65),
        extra_ascii_tags: vec![(65500, xml.into()), (305, "hcsflow".into())],
    };
    let stack = random_stack(DType::U16, [3, 8, 9], 1);
    write_stack(&path, &stack, &options).expect("write");

    let info = read_info(&path).expect("info");
    assert_eq!(info.description.as_deref(), options.description.as_deref());
    assert_same(&read_stack(&path).expect("read"), &stack);

    // Read the tags with the tiff crate directly, page by page.
    let mut dec = Decoder::new(BufReader::new(File::open(&path).expect("open"))).expect("decoder");
    for page in 0..3 {
        if page > 0 {
            dec.next_image().expect("next page");
        }
        assert_eq!(dec.find_tag_unsigned::<u16>(Tag::ResolutionUnit).expect("unit"), Some(3), "centimetre");
        for tag in [Tag::XResolution, Tag::YResolution] {
            let value = dec.get_tag(tag).expect("resolution");
            let tiff::decoder::ifd::Value::Rational(n, d) = value else {
                panic!("{tag:?} is not a rational: {value:?}");
            };
            let um = 10_000.0 * d as f64 / n as f64;
            assert!((um - 0.65).abs() < 1e-9, "page {page}: {n}/{d} px/cm is {um} µm");
        }
        let has_text = dec.find_tag(Tag::Unknown(65500)).expect("tag").is_some();
        assert_eq!(has_text, page == 0, "extra tags go on page 0 only");
    }
    let mut dec = Decoder::new(BufReader::new(File::open(&path).expect("open"))).expect("decoder");
    let harmony = dec.get_tag_ascii_string(Tag::Unknown(65500)).expect("65500");
    assert_eq!(harmony, xml);
    assert_eq!(dec.get_tag_ascii_string(Tag::Software).expect("software"), "hcsflow");
}

#[test]
fn overwriting_replaces_the_previous_file() {
    let dir = tempfile::tempdir().expect("tempdir");
    let path = dir.path().join("again.tif");
    write_stack(&path, &random_stack(DType::F32, [3, 10, 10], 1), &WriteOptions::default()).expect("first");
    let second = random_stack(DType::U8, [1, 4, 6], 2);
    write_stack(&path, &second, &WriteOptions::default()).expect("second");
    assert_same(&read_stack(&path).expect("read"), &second);
    let names: Vec<_> = std::fs::read_dir(dir.path()).expect("ls").map(|e| e.expect("entry").file_name()).collect();
    assert_eq!(names, vec![std::ffi::OsString::from("again.tif")], "no temporary left behind");
}

fn assert_invalid_write(options: &WriteOptions, stack: &Stack, needle: &str) {
    let dir = tempfile::tempdir().expect("tempdir");
    let path = dir.path().join("refused.tif");
    let err = write_stack(&path, stack, options).expect_err("must refuse");
    assert!(matches!(err, TiffError::InvalidWrite { .. }), "{err:?}");
    let msg = err.to_string();
    assert!(msg.contains("refused.tif") && msg.contains(needle), "{msg}");
    assert_eq!(std::fs::read_dir(dir.path()).expect("ls").count(), 0, "nothing written");
}

#[test]
fn invalid_write_options_are_refused_before_writing() {
    let s = random_stack(DType::U8, [1, 2, 2], 0);
    let with = |f: fn(&mut WriteOptions)| {
        let mut o = WriteOptions::default();
        f(&mut o);
        o
    };
    assert_invalid_write(&with(|o| o.pixel_size_um = Some(0.0)), &s, "pixel size");
    assert_invalid_write(&with(|o| o.pixel_size_um = Some(f64::NAN)), &s, "pixel size");
    assert_invalid_write(&with(|o| o.description = Some("a\0b".into())), &s, "NUL");
    assert_invalid_write(&with(|o| o.extra_ascii_tags = vec![(256, "x".into())]), &s, "tag 256");
    assert_invalid_write(&with(|o| o.extra_ascii_tags = vec![(270, "x".into())]), &s, "tag 270");
    assert_invalid_write(&with(|o| o.extra_ascii_tags = vec![(65500, "a".into()), (65500, "b".into())]), &s, "twice");
    assert_invalid_write(&WriteOptions::default(), &Stack::zeros(DType::U16, [0, 4, 4]), "empty");
    assert_invalid_write(&WriteOptions::default(), &Stack::zeros(DType::U16, [2, 0, 4]), "empty");
}

/// Writes a file with the tiff crate's own encoder, one call per page.
fn write_raw(path: &Path, pages: impl FnOnce(&mut TiffEncoder<&mut File>)) {
    let mut file = File::create(path).expect("create");
    let mut enc = TiffEncoder::new(&mut file).expect("encoder");
    pages(&mut enc);
}

#[test]
fn pages_of_different_size_or_dtype_are_named() {
    let dir = tempfile::tempdir().expect("tempdir");
    let path = dir.path().join("mixed-size.tif");
    write_raw(&path, |e| {
        e.write_image::<colortype::Gray16>(4, 3, &[1u16; 12]).expect("p0");
        e.write_image::<colortype::Gray16>(4, 3, &[2u16; 12]).expect("p1");
        e.write_image::<colortype::Gray16>(2, 3, &[3u16; 6]).expect("p2");
    });
    let err = read_stack(&path).expect_err("mismatch");
    match &err {
        TiffError::PageMismatch { page, expected, found, .. } => {
            assert_eq!(*page, 2);
            assert_eq!(expected, "4x3 u16");
            assert_eq!(found, "2x3 u16");
        }
        other => panic!("{other:?}"),
    }
    assert!(err.to_string().contains("mixed-size.tif"));
    assert_eq!(read_info(&path).expect("info of page 0").pages, 3);

    let path = dir.path().join("mixed-dtype.tif");
    write_raw(&path, |e| {
        e.write_image::<colortype::Gray8>(4, 3, &[1u8; 12]).expect("p0");
        e.write_image::<colortype::Gray32Float>(4, 3, &[2f32; 12]).expect("p1");
    });
    let err = read_stack(&path).expect_err("mismatch");
    assert!(matches!(&err, TiffError::PageMismatch { page: 1, found, .. } if found == "4x3 f32"), "{err:?}");
}

#[test]
fn unsupported_formats_say_what_they_are() {
    let dir = tempfile::tempdir().expect("tempdir");
    type Writer = Box<dyn FnOnce(&mut TiffEncoder<&mut File>)>;
    let cases: Vec<(&str, Writer, &str)> = vec![
        ("rgb.tif", Box::new(|e| e.write_image::<colortype::RGB8>(2, 2, &[0u8; 12]).expect("w")), "3 samples per pixel"),
        ("i16.tif", Box::new(|e| e.write_image::<colortype::GrayI16>(2, 2, &[0i16; 4]).expect("w")), "16-bit signed integer"),
        ("u32.tif", Box::new(|e| e.write_image::<colortype::Gray32>(2, 2, &[0u32; 4]).expect("w")), "32-bit unsigned integer"),
        ("f64.tif", Box::new(|e| e.write_image::<colortype::Gray64Float>(2, 2, &[0f64; 4]).expect("w")), "64-bit floating point"),
    ];
    for (name, write, needle) in cases {
        let path = dir.path().join(name);
        write_raw(&path, write);
        for err in [read_stack(&path).expect_err(name), read_info(&path).expect_err(name)] {
            assert!(matches!(err, TiffError::Unsupported { page: 0, .. }), "{name}: {err:?}");
            let msg = err.to_string();
            assert!(msg.contains(name) && msg.contains(needle), "{msg}");
        }
    }
}

#[test]
fn missing_empty_and_non_tiff_files() {
    let dir = tempfile::tempdir().expect("tempdir");
    let missing = dir.path().join("missing.tif");
    let err = read_stack(&missing).expect_err("missing");
    assert!(matches!(&err, TiffError::Io { source, .. } if source.kind() == std::io::ErrorKind::NotFound));
    assert_eq!(err.path(), missing);

    let empty = dir.path().join("empty.tif");
    std::fs::write(&empty, b"").expect("write");
    assert!(matches!(read_stack(&empty), Err(TiffError::Empty { .. })));
    assert!(matches!(read_info(&empty), Err(TiffError::Empty { .. })));

    let png = dir.path().join("image.png");
    std::fs::write(&png, b"\x89PNG\r\n\x1a\n0000000000000").expect("write");
    let err = read_stack(&png).expect_err("not a tiff");
    assert!(matches!(err, TiffError::NotTiff { .. }), "{err:?}");
    assert!(err.to_string().contains("image.png"));
}

#[test]
fn white_is_zero_pages_keep_their_stored_values() {
    // Built by patching PhotometricInterpretation 1 → 0 in a file of ours:
    // readers like tifffile return stored values, and so must we.
    let dir = tempfile::tempdir().expect("tempdir");
    let path = dir.path().join("miniswhite.tif");
    let stack = random_stack(DType::U16, [2, 5, 6], 3);
    write_stack(&path, &stack, &WriteOptions::default()).expect("write");
    let mut bytes = std::fs::read(&path).expect("read");
    let patched = patch_short_tag(&mut bytes, 262, 0);
    assert_eq!(patched, 2, "one Photometric tag per page");
    std::fs::write(&path, &bytes).expect("write");
    assert_same(&read_stack(&path).expect("read"), &stack);
}

/// Sets every SHORT tag `tag` in the IFD chain of a little-endian classic
/// TIFF to `value`; returns how many were patched.
fn patch_short_tag(bytes: &mut [u8], tag: u16, value: u16) -> usize {
    assert_eq!(&bytes[..4], b"II*\0", "little-endian classic TIFF");
    let u16_at = |b: &[u8], o: usize| u16::from_le_bytes([b[o], b[o + 1]]);
    let u32_at = |b: &[u8], o: usize| u32::from_le_bytes([b[o], b[o + 1], b[o + 2], b[o + 3]]) as usize;
    let mut ifd = u32_at(bytes, 4);
    let mut patched = 0;
    while ifd != 0 {
        let n = u16_at(bytes, ifd) as usize;
        for i in 0..n {
            let e = ifd + 2 + 12 * i;
            if u16_at(bytes, e) == tag && u16_at(bytes, e + 2) == 3 {
                bytes[e + 8..e + 10].copy_from_slice(&value.to_le_bytes());
                patched += 1;
            }
        }
        ifd = u32_at(bytes, ifd + 2 + 12 * n);
    }
    patched
}

#[test]
fn read_stacks_concatenates_files_in_order_like_read_stack_then_concat() {
    let dir = tempfile::tempdir().expect("tempdir");
    for (i, dtype) in DType::ALL.into_iter().enumerate() {
        let parts = [[1, 19, 23], [3, 19, 23], [1, 19, 23]];
        let mut paths = Vec::new();
        let mut stacks = Vec::new();
        for (k, shape) in parts.into_iter().enumerate() {
            let stack = random_stack(dtype, shape, 40 + 3 * i as u64 + k as u64);
            let compression = if k == 1 { Compression::Deflate } else { Compression::None };
            let p = dir.path().join(format!("{dtype}_{k}.tif"));
            write_stack(&p, &stack, &opts(compression)).expect("write");
            paths.push(p);
            stacks.push(stack);
        }
        let expected = Stack::concat(&stacks).expect("same shapes");
        let got = hcsflow_tiff::read_stacks(&paths).expect("read_stacks");
        assert_same(&got, &expected);
        let single = hcsflow_tiff::read_stacks(&paths[1..2]).expect("one file");
        assert_same(&single, &read_stack(&paths[1]).expect("read_stack"));
    }
}

#[test]
fn read_stacks_names_the_file_that_differs_or_fails() {
    let dir = tempfile::tempdir().expect("tempdir");
    let a = dir.path().join("a.tif");
    let b = dir.path().join("b.tif");
    let c = dir.path().join("c.tif");
    let bad = dir.path().join("bad.tif");
    write_stack(&a, &random_stack(DType::U16, [1, 8, 9], 1), &opts(Compression::None)).expect("write");
    write_stack(&b, &random_stack(DType::U16, [1, 9, 8], 2), &opts(Compression::None)).expect("write");
    write_stack(&c, &random_stack(DType::U8, [1, 8, 9], 3), &opts(Compression::None)).expect("write");
    std::fs::write(&bad, b"not a tiff at all").expect("write");

    for (other, found) in [(&b, "8x9 u16"), (&c, "9x8 u8")] {
        let err = hcsflow_tiff::read_stacks(&[&a, other]).expect_err("mismatch");
        assert!(matches!(err, TiffError::FileMismatch { .. }), "{err:?}");
        assert_eq!(err.path(), other.as_path());
        let msg = err.to_string();
        assert!(msg.contains("a.tif") && msg.contains(found) && msg.contains("9x8 u16"), "{msg}");
    }
    let err = hcsflow_tiff::read_stacks(&[&a, &bad]).expect_err("not a TIFF");
    assert!(matches!(err, TiffError::NotTiff { .. }), "{err:?}");
    assert_eq!(err.path(), bad.as_path());
    let none: [&Path; 0] = [];
    assert!(matches!(hcsflow_tiff::read_stacks(&none), Err(TiffError::NoFiles)));
}
