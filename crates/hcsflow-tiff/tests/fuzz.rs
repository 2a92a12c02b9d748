//! Fuzz-style robustness: truncated files, random garbage, flipped bytes and
//! mutated tag values must give a `TiffError` naming the file — never a
//! panic, never a hang, never a huge allocation — through the unchecked
//! readers and the expecting reader alike, and the expecting reader returns
//! only what it was told to expect. Fixed seeds make every run identical.

mod common;

use std::cell::Cell;
use std::fs::File;
use std::path::Path;
use std::sync::Once;

use common::{random_stack, smooth_u16, Rng};
use hcsflow_core::{DType, Stack};
use hcsflow_tiff::{read_info, read_stack, read_stack_expecting, write_stack, Compression, Expected, PlaneFormat, TiffError, WriteOptions};
use tiff::encoder::{colortype, TiffEncoder};

thread_local! {
    static PANICS: Cell<usize> = const { Cell::new(0) };
}
static HOOK: Once = Once::new();

/// Counts panics per thread (each test runs on its own thread), including
/// the decoder's that hcsflow-tiff catches and would otherwise be invisible.
fn count_panics() {
    HOOK.call_once(|| {
        std::panic::set_hook(Box::new(|info| {
            PANICS.with(|p| p.set(p.get() + 1));
            eprintln!("panic: {info}");
        }))
    });
}

fn panics() -> usize {
    PANICS.with(|p| p.get())
}

/// Seed files covering our writer (both compressions, all dtypes, several
/// pages) and the tiff crate's own LZW and PackBits encoders.
fn seed_files(dir: &Path) -> Vec<(String, Vec<u8>)> {
    let mut seeds = Vec::new();
    let ours: [(&str, Stack, Compression); 4] = [
        ("u16-none", random_stack(DType::U16, [3, 9, 11], 1), Compression::None),
        ("u8-deflate", random_stack(DType::U8, [2, 13, 7], 2), Compression::Deflate),
        ("f32-deflate", random_stack(DType::F32, [2, 6, 5], 3), Compression::Deflate),
        ("u16-smooth-deflate", smooth_u16([2, 40, 33]), Compression::Deflate),
    ];
    for (name, stack, compression) in ours {
        let path = dir.join(format!("{name}.tif"));
        let options = WriteOptions {
            compression,
            description: Some("fuzz seed".into()),
            pixel_size_um: Some(0.5),
            extra_ascii_tags: vec![(65500, "<x/>".into())],
        };
        write_stack(&path, &stack, &options).expect("write seed");
        seeds.push((name.to_string(), std::fs::read(&path).expect("read seed")));
    }
    for (name, compression) in [("u16-lzw", tiff::encoder::Compression::Lzw), ("u8-packbits", tiff::encoder::Compression::Packbits)] {
        let path = dir.join(format!("{name}.tif"));
        let mut file = File::create(&path).expect("create");
        {
            let mut enc = TiffEncoder::new(&mut file).expect("encoder").with_compression(compression);
            if name.starts_with("u16") {
                let data: Vec<u16> = (0..15 * 17).map(|i| (i * 37 % 4000) as u16).collect();
                enc.write_image::<colortype::Gray16>(17, 15, &data).expect("page 0");
                enc.write_image::<colortype::Gray16>(17, 15, &data).expect("page 1");
            } else {
                let data: Vec<u8> = (0..15 * 17).map(|i| (i / 5) as u8).collect();
                enc.write_image::<colortype::Gray8>(17, 15, &data).expect("page 0");
            }
        }
        seeds.push((name.to_string(), std::fs::read(&path).expect("read seed")));
    }
    seeds
}

/// Replaces the file's content. Unlinking first avoids ext4's flush on
/// truncate-and-rewrite (auto_da_alloc), which made these tests I/O-bound.
fn rewrite(path: &Path, bytes: &[u8]) {
    let _ = std::fs::remove_file(path);
    std::fs::write(path, bytes).expect("write probe");
}

/// What the seed file at `path` holds, as an [`Expected`] for its mutants.
fn expected_of(path: &Path) -> Expected {
    let info = read_info(path).expect("seed info");
    Expected { plane: PlaneFormat::new(info.height, info.width, info.dtype), pages: Some(info.pages) }
}

/// Runs the three readers on `bytes` written to `path`. Errors must name the
/// file. The expecting reader, told `expected`, may only return a stack of
/// that shape and dtype, equal to what `read_stack` reads; where `read_stack`
/// reads such a stack, the expecting reader refuses it only for its codec or
/// its decoding budget. Returns `true` if `read_stack` succeeded.
fn probe(path: &Path, bytes: &[u8], expected: Expected) -> bool {
    rewrite(path, bytes);
    let check = |err: &TiffError| {
        assert_eq!(err.path(), path, "error names the file: {err}");
        assert!(err.to_string().contains(&*path.to_string_lossy()), "message names the file: {err}");
    };
    if let Err(e) = read_info(path) {
        check(&e);
    }
    let unchecked = read_stack(path);
    let checked = read_stack_expecting(path, expected);
    let p = expected.plane;
    let fits = |s: &Stack| s.dtype() == p.dtype && s.shape()[1..] == [p.height, p.width] && Some(s.depth()) == expected.pages;
    match (&unchecked, &checked) {
        (Ok(a), Ok(b)) => {
            assert!(fits(b), "the expecting reader returned {:?} {} for {p}", b.shape(), b.dtype());
            assert!(a.as_bytes() == b.as_bytes(), "the readers disagree on {}", path.display());
        }
        (Err(e), Ok(_)) => panic!("the expecting reader read what read_stack refuses ({e})"),
        (Ok(a), Err(e)) => {
            check(e);
            let budget = matches!(e, TiffError::Unsupported { .. })
                || matches!(e, TiffError::Corrupt { message, .. } if message.contains("decoder limits"));
            assert!(!fits(a) || budget, "the expecting reader refused a matching file: {e}");
        }
        (Err(a), Err(b)) => {
            check(a);
            check(b);
        }
    }
    unchecked.is_ok()
}

#[test]
fn truncated_files_are_errors() {
    count_panics();
    let dir = tempfile::tempdir().expect("tempdir");
    let probe_path = dir.path().join("truncated.tif");
    let mut cuts_tried = 0;
    for (name, bytes) in seed_files(dir.path()) {
        let original = read_stack(&dir.path().join(format!("{name}.tif"))).expect("seed reads");
        // Every cut point of the small seeds; the IFDs sit at the end of the
        // files, so most cuts break the structure, the rest the pixel data.
        let step = (bytes.len() / 1500).max(1);
        for cut in (0..bytes.len()).step_by(step) {
            cuts_tried += 1;
            rewrite(&probe_path, &bytes[..cut]);
            match read_stack(&probe_path) {
                Err(e) => assert_eq!(e.path(), probe_path),
                // A cut that only drops bytes no reader needs must still
                // give the original pixels, never garbage.
                Ok(s) => assert_eq!(s, original, "{name} cut at {cut} read wrong pixels"),
            }
            if cut == 0 {
                assert!(matches!(read_stack(&probe_path), Err(TiffError::Empty { .. })));
            }
        }
    }
    assert!(cuts_tried > 1000, "{cuts_tried}");
    assert_eq!(panics(), 0, "the decoder panicked (caught) on truncated input");
}

#[test]
fn random_garbage_is_an_error() {
    count_panics();
    let dir = tempfile::tempdir().expect("tempdir");
    let path = dir.path().join("garbage.tif");
    let expected = Expected::one_plane(PlaneFormat::new(13, 7, DType::U8));
    let mut rng = Rng::new(0x5EED);
    let headers: [&[u8]; 5] = [b"", b"II*\0", b"MM\0*", b"II+\0\x08\0\0\0", b"MM\0+\0\x08\0\0"];
    for i in 0..3000 {
        let header = headers[i % headers.len()];
        let len = rng.below(2048) + 8;
        let mut bytes = header.to_vec();
        bytes.extend(rng.bytes(len));
        // Point the first IFD somewhere inside the file half of the time.
        if header.len() == 4 && i % 2 == 0 {
            let off = (rng.below(bytes.len()) as u32).to_le_bytes();
            if header[0] == b'I' {
                bytes[4..8].copy_from_slice(&off);
            } else {
                let be = u32::from_le_bytes(off).to_be_bytes();
                bytes[4..8].copy_from_slice(&be);
            }
        }
        assert!(!probe(&path, &bytes, expected), "garbage #{i} decoded as an image");
    }
    assert_eq!(panics(), 0, "the decoder panicked (caught) on garbage");
}

#[test]
fn flipped_bytes_in_header_and_ifds_do_not_panic() {
    count_panics();
    let dir = tempfile::tempdir().expect("tempdir");
    let path = dir.path().join("flipped.tif");
    let mut rng = Rng::new(42);
    let (mut errors, mut total) = (0usize, 0usize);
    for (name, bytes) in seed_files(dir.path()) {
        let expected = expected_of(&dir.path().join(format!("{name}.tif")));
        // The header and, for our files, the IFDs and tag data at the end.
        let tail = bytes.len().saturating_sub(600);
        let positions: Vec<usize> = (0..16.min(bytes.len())).chain(tail..bytes.len()).collect();
        for &pos in &positions {
            for mask in [0x01u8, 0x80, 0xFF] {
                let mut m = bytes.clone();
                m[pos] ^= mask;
                total += 1;
                errors += usize::from(!probe(&path, &m, expected));
            }
        }
        // And a few hundred multi-byte corruptions anywhere.
        for _ in 0..300 {
            let mut m = bytes.clone();
            for _ in 0..1 + rng.below(8) {
                let pos = rng.below(m.len());
                m[pos] = rng.next_u64() as u8;
            }
            total += 1;
            errors += usize::from(!probe(&path, &m, expected));
        }
    }
    eprintln!("flipped bytes: {errors} of {total} mutants rejected, the rest decoded");
    assert!(errors > total / 10, "structure damage should mostly be detected: {errors}/{total}");
    assert_eq!(panics(), 0, "the decoder panicked (caught) on corrupted input");
}

/// The page-0 IFD entries of a little-endian classic TIFF whose value is
/// inline (a count of one SHORT or LONG): (type, offset of the value).
fn inline_entries(bytes: &[u8]) -> Vec<(u16, usize)> {
    let u16_at = |i: usize| u16::from_le_bytes([bytes[i], bytes[i + 1]]);
    let u32_at = |i: usize| u32::from_le_bytes([bytes[i], bytes[i + 1], bytes[i + 2], bytes[i + 3]]);
    assert_eq!(&bytes[..4], b"II*\0", "seeds are little-endian classic TIFF");
    let ifd = u32_at(4) as usize;
    (0..u16_at(ifd) as usize)
        .map(|k| ifd + 2 + 12 * k)
        .filter(|&e| matches!(u16_at(e + 2), 3 | 4) && u32_at(e + 4) == 1)
        .map(|e| (u16_at(e + 2), e + 8))
        .collect()
}

#[test]
fn mutated_tag_values_never_get_past_the_expecting_reader() {
    // Every inline SHORT/LONG tag of page 0 (size, bits, sample format,
    // samples per pixel, compression, strip and tile layout…) set to values
    // around the real ones and to extremes, with the seed's own format as
    // the expectation: the header checks must catch every change of size or
    // dtype, and nothing may panic or allocate for what the tags claim.
    count_panics();
    let dir = tempfile::tempdir().expect("tempdir");
    let path = dir.path().join("tags.tif");
    let (mut mutants, mut read) = (0usize, 0usize);
    for (name, bytes) in seed_files(dir.path()) {
        let expected = expected_of(&dir.path().join(format!("{name}.tif")));
        for (ty, at) in inline_entries(&bytes) {
            let real = if ty == 3 {
                u64::from(u16::from_le_bytes([bytes[at], bytes[at + 1]]))
            } else {
                u64::from(u32::from_le_bytes([bytes[at], bytes[at + 1], bytes[at + 2], bytes[at + 3]]))
            };
            let values = [0, 1, 2, 3, 7, 8, 16, 32, 64, real.saturating_sub(1), real + 1, real * 2, 8000, 0xFFFF, 0xFFFF_FFFF];
            for value in values {
                if value == real {
                    continue;
                }
                let mut m = bytes.clone();
                if ty == 3 {
                    m[at..at + 2].copy_from_slice(&(value.min(0xFFFF) as u16).to_le_bytes());
                } else {
                    m[at..at + 4].copy_from_slice(&(value.min(0xFFFF_FFFF) as u32).to_le_bytes());
                }
                mutants += 1;
                if probe(&path, &m, expected) {
                    read += 1;
                }
            }
        }
    }
    eprintln!("mutated tags: {mutants} mutants, {read} still read by read_stack");
    assert!(mutants > 300, "{mutants}");
    assert_eq!(panics(), 0, "the decoder panicked (caught) on mutated tags");
}

#[test]
fn huge_dimensions_in_a_tiny_file_are_refused_without_allocating() {
    // A valid header and IFD claiming a 65535 x 65535 u16 page (8 GiB),
    // uncompressed, in a file of a few hundred bytes.
    let dir = tempfile::tempdir().expect("tempdir");
    let path = dir.path().join("huge.tif");
    let mut b: Vec<u8> = b"II*\0\x08\0\0\0".to_vec();
    let entries: [(u16, u16, u32, u32); 8] = [
        (256, 4, 1, 65535),    // ImageWidth
        (257, 4, 1, 65535),    // ImageLength
        (258, 3, 1, 16),       // BitsPerSample
        (259, 3, 1, 1),        // Compression none
        (262, 3, 1, 1),        // BlackIsZero
        (273, 4, 1, 200),      // StripOffsets
        (278, 4, 1, 65535),    // RowsPerStrip
        (279, 4, 1, u32::MAX), // StripByteCounts
    ];
    b.extend_from_slice(&(entries.len() as u16).to_le_bytes());
    for (tag, ty, count, value) in entries {
        b.extend_from_slice(&tag.to_le_bytes());
        b.extend_from_slice(&ty.to_le_bytes());
        b.extend_from_slice(&count.to_le_bytes());
        b.extend_from_slice(&value.to_le_bytes());
    }
    b.extend_from_slice(&0u32.to_le_bytes());
    b.resize(300, 7);
    std::fs::write(&path, &b).expect("write");
    let info = read_info(&path).expect("the header itself is valid");
    assert_eq!((info.width, info.height, info.dtype), (65535, 65535, DType::U16));
    let err = read_stack(&path).expect_err("must not decode");
    assert!(matches!(err, TiffError::Corrupt { .. }), "{err:?}");
    assert!(err.to_string().contains("only 300 bytes"), "{err}");
}

#[test]
fn corpus_files_go_through_every_reader() {
    // tests/corpus: inputs that once misbehaved or stand for a class of them
    // (see its README). Copied to a scratch file so `probe` can rewrite it.
    count_panics();
    let corpus = Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/corpus");
    let dir = tempfile::tempdir().expect("tempdir");
    let path = dir.path().join("corpus.tif");
    let expected = Expected::one_plane(PlaneFormat::new(64, 64, DType::U16));
    let mut files: Vec<_> = std::fs::read_dir(&corpus)
        .expect("corpus folder")
        .map(|e| e.expect("entry").path())
        .filter(|p| p.extension().is_some_and(|x| x == "tif"))
        .collect();
    files.sort();
    assert!(files.len() >= 4, "{files:?}");
    for file in files {
        let bytes = std::fs::read(&file).expect("read corpus file");
        assert!(bytes.len() <= 16 * 1024, "{}: keep corpus files small", file.display());
        probe(&path, &bytes, expected);
        let err = read_stack_expecting(&path, expected).expect_err("every corpus file is refused");
        eprintln!("{}: {err}", file.display());
    }
    assert_eq!(panics(), 0, "the decoder panicked (caught) on a corpus file");
}
