//! Uncompressed pages whose strips are not one contiguous run, or whose pixel
//! data lies past the end of the file: the raw fast path must either read them
//! exactly like the decoder or leave them to it, and never return wrong pixels.

use std::path::Path;

use hcsflow_core::Stack;
use hcsflow_tiff::{read_stack, TiffError};

const WIDTH: u16 = 5;
const HEIGHT: u16 = 3;

/// A little-endian classic TIFF of `file_len` bytes with one `WIDTH`×`HEIGHT`
/// u16 page, one row per strip, the strips at `offsets` (zeros until the caller
/// writes the rows there, e.g. with [`put_row`]).
fn tiff_with_strips(offsets: [u32; 3], file_len: usize) -> Vec<u8> {
    let mut f = vec![0u8; file_len];
    f[..4].copy_from_slice(b"II*\0");
    f[4..8].copy_from_slice(&8u32.to_le_bytes());
    let row_bytes = u32::from(WIDTH) * 2;
    // Tag arrays for StripOffsets/StripByteCounts live right after the IFD.
    let entries: Vec<(u16, u16, u32, u32)> = vec![
        (256, 3, 1, u32::from(WIDTH)),  // ImageWidth
        (257, 3, 1, u32::from(HEIGHT)), // ImageLength
        (258, 3, 1, 16),                // BitsPerSample
        (259, 3, 1, 1),                 // Compression: none
        (262, 3, 1, 1),                 // BlackIsZero
        (273, 4, 3, 0),                 // StripOffsets -> array (filled below)
        (277, 3, 1, 1),                 // SamplesPerPixel
        (278, 3, 1, 1),                 // RowsPerStrip
        (279, 4, 3, 0),                 // StripByteCounts -> array
        (339, 3, 1, 1),                 // SampleFormat: uint
    ];
    let ifd_len = 2 + entries.len() * 12 + 4;
    let arrays = 8 + ifd_len;
    let mut at = 8;
    f[at..at + 2].copy_from_slice(&(entries.len() as u16).to_le_bytes());
    at += 2;
    for (tag, ty, count, mut value) in entries {
        if tag == 273 {
            value = arrays as u32;
        }
        if tag == 279 {
            value = arrays as u32 + 12;
        }
        f[at..at + 2].copy_from_slice(&tag.to_le_bytes());
        f[at + 2..at + 4].copy_from_slice(&ty.to_le_bytes());
        f[at + 4..at + 8].copy_from_slice(&count.to_le_bytes());
        if ty == 3 && count == 1 {
            f[at + 8..at + 10].copy_from_slice(&(value as u16).to_le_bytes());
        } else {
            f[at + 8..at + 12].copy_from_slice(&value.to_le_bytes());
        }
        at += 12;
    }
    for (i, o) in offsets.iter().enumerate() {
        f[arrays + 4 * i..arrays + 4 * i + 4].copy_from_slice(&o.to_le_bytes());
        f[arrays + 12 + 4 * i..arrays + 16 + 4 * i].copy_from_slice(&row_bytes.to_le_bytes());
    }
    f
}

/// Where the header, IFD and strip tag arrays end.
const DATA_START: usize = 8 + 2 + 10 * 12 + 4 + 24;

fn put_row(f: &mut [u8], offset: usize, row: u16) {
    for x in 0..WIDTH {
        let v = 1000 * row + x;
        f[offset + 2 * x as usize..offset + 2 * x as usize + 2].copy_from_slice(&v.to_le_bytes());
    }
}

fn expected() -> Vec<u16> {
    (0..HEIGHT).flat_map(|y| (0..WIDTH).map(move |x| 1000 * y + x)).collect()
}

fn pixels(path: &Path) -> Vec<u16> {
    match read_stack(path).expect("readable") {
        Stack::U16(a) => {
            assert_eq!(a.dim(), (1, HEIGHT as usize, WIDTH as usize));
            a.pixels().to_vec()
        }
        other => panic!("expected u16, got {:?}", other.dtype()),
    }
}

/// Writes a file whose row `y` is stored at `offsets[y]` (the file `len`
/// bytes long) and reads its pixels back.
fn read_rows_stored_at(name: &str, offsets: [usize; 3], len: usize) -> Vec<u16> {
    let dir = tempfile::tempdir().expect("tempdir");
    let offsets = offsets.map(|o| o as u32);
    let mut f = tiff_with_strips(offsets, len);
    for (y, &o) in offsets.iter().enumerate() {
        put_row(&mut f, o as usize, y as u16);
    }
    let p = dir.path().join(name);
    std::fs::write(&p, &f).expect("write");
    pixels(&p)
}

#[test]
fn contiguous_strips_are_read_in_order() {
    let row = 2 * WIDTH as usize;
    let offsets = [0, 1, 2].map(|i| DATA_START + i * row);
    assert_eq!(read_rows_stored_at("contiguous.tif", offsets, DATA_START + 3 * row), expected());
}

#[test]
fn strips_stored_out_of_order_or_with_gaps_are_placed_by_their_offsets() {
    let row = 2 * WIDTH as usize;
    // Row 0 last, row 2 first, with a 6-byte gap between rows 1 and 0.
    let offsets = [DATA_START + 2 * row + 6, DATA_START + row, DATA_START];
    assert_eq!(read_rows_stored_at("shuffled.tif", offsets, DATA_START + 3 * row + 6), expected());
}

#[test]
fn contiguous_pixels_running_past_the_end_of_the_file_are_a_corrupt_file_error() {
    let dir = tempfile::tempdir().expect("tempdir");
    let row = 2 * WIDTH as usize;
    // The file is long enough to hold the pixels, but they are claimed to start
    // 4 bytes before its end.
    let len = DATA_START + 3 * row;
    let start = len - 4;
    let offsets = [start, start + row, start + 2 * row].map(|o| o as u32);
    let f = tiff_with_strips(offsets, len);
    let p = dir.path().join("short.tif");
    std::fs::write(&p, &f).expect("write");
    let err = read_stack(&p).expect_err("pixels past the end must not read");
    assert!(matches!(err, TiffError::Corrupt { .. }), "{err:?}");
    let msg = err.to_string();
    assert!(msg.contains("short.tif"), "{msg}");
    assert!(msg.contains("past the end of the file"), "{msg}");
}
