//! Hand-made TIFF files whose tags say whatever a test needs, whatever their
//! pixel data holds: a small file claiming a huge image, a tile far larger
//! than its image, a codec the file does not use. Only `std`, so the tests of
//! other crates (the pipeline's bad-image tests) include this file with
//! `#[path]` instead of keeping a second copy.

#![allow(dead_code)]

/// The tags of a forged one-page, single-sample grayscale TIFF.
#[derive(Debug, Clone, Copy)]
pub struct Page {
    pub width: u32,
    pub height: u32,
    /// Bits per sample (8, 16, 32).
    pub bits: u16,
    /// `SampleFormat`: 1 unsigned integer, 3 IEEE float.
    pub sample_format: u16,
    /// `Compression`: 1 none, 5 LZW, 7 JPEG, 8 Deflate, …
    pub compression: u16,
    /// `Some((width, height))`: one tile of that size instead of one strip.
    pub tile: Option<(u32, u32)>,
}

impl Page {
    /// A `width`×`height` u16 page in one Deflate strip.
    pub fn deflate_u16(width: u32, height: u32) -> Page {
        Page { width, height, bits: 16, sample_format: 1, compression: 8, tile: None }
    }
}

/// A little-endian classic TIFF: the header, one IFD with `page`'s tags, and
/// `data` as its only strip (or tile), whatever the tags claim it decodes to.
pub fn tiff(page: &Page, data: &[u8]) -> Vec<u8> {
    const SHORT: u16 = 3;
    const LONG: u16 = 4;
    let mut entries: Vec<(u16, u16, u32)> = vec![
        (256, LONG, page.width),
        (257, LONG, page.height),
        (258, SHORT, u32::from(page.bits)),
        (259, SHORT, u32::from(page.compression)),
        (262, SHORT, 1), // BlackIsZero
        (277, SHORT, 1), // SamplesPerPixel
        (339, SHORT, u32::from(page.sample_format)),
    ];
    let count = match page.tile {
        None => 10,
        Some(_) => 11,
    };
    let data_offset = 8 + 2 + 12 * count + 4;
    let len = data.len() as u32;
    match page.tile {
        None => entries.extend([(273, LONG, data_offset), (278, LONG, page.height), (279, LONG, len)]),
        Some((tw, th)) => entries.extend([(322, LONG, tw), (323, LONG, th), (324, LONG, data_offset), (325, LONG, len)]),
    }
    entries.sort_by_key(|e| e.0);
    assert_eq!(entries.len() as u32, count);
    let mut b = b"II*\0\x08\0\0\0".to_vec();
    b.extend_from_slice(&(entries.len() as u16).to_le_bytes());
    for (tag, ty, value) in entries {
        b.extend_from_slice(&tag.to_le_bytes());
        b.extend_from_slice(&ty.to_le_bytes());
        b.extend_from_slice(&1u32.to_le_bytes());
        if ty == SHORT {
            b.extend_from_slice(&(value as u16).to_le_bytes());
            b.extend_from_slice(&[0, 0]);
        } else {
            b.extend_from_slice(&value.to_le_bytes());
        }
    }
    b.extend_from_slice(&0u32.to_le_bytes());
    assert_eq!(b.len() as u32, data_offset);
    b.extend_from_slice(data);
    b
}

/// A valid zlib stream of `n` (≥ 1) zero bytes, written by hand in about
/// 13 bits per 258 bytes (one fixed-Huffman block: a literal 0, then
/// length-258 matches at distance 1), so a test can make a decompression
/// bomb without compressing, or allocating, what it claims.
pub fn zlib_zeros(n: usize) -> Vec<u8> {
    assert!(n >= 1);
    let mut w = Bits::default();
    w.put(1, 1); // BFINAL
    w.put(1, 2); // BTYPE 01: fixed Huffman
    let literal_zero = || (0x30u32, 8); // codes 0..=143 are 0x30 + literal, 8 bits
    let (code, len) = literal_zero();
    w.huffman(code, len);
    let rest = n - 1;
    for _ in 0..rest / 258 {
        w.huffman(0xC5, 8); // length code 285 (258 bytes), no extra bits
        w.put(0, 5); // distance code 0 (distance 1), no extra bits
    }
    for _ in 0..rest % 258 {
        w.huffman(code, len);
    }
    w.huffman(0, 7); // end of block (256)
    let mut out = vec![0x78, 0x01];
    out.extend(w.finish());
    let adler = ((n % 65521) as u32) << 16 | 1; // a = 1, b = n · 1
    out.extend_from_slice(&adler.to_be_bytes());
    out
}

/// A deflate bit writer: values LSB first, Huffman codes MSB first.
#[derive(Default)]
struct Bits {
    out: Vec<u8>,
    acc: u64,
    used: u32,
}

impl Bits {
    fn put(&mut self, value: u32, count: u32) {
        self.acc |= u64::from(value) << self.used;
        self.used += count;
        while self.used >= 8 {
            self.out.push(self.acc as u8);
            self.acc >>= 8;
            self.used -= 8;
        }
    }

    fn huffman(&mut self, code: u32, len: u32) {
        self.put(code.reverse_bits() >> (32 - len), len);
    }

    fn finish(mut self) -> Vec<u8> {
        if self.used > 0 {
            self.out.push(self.acc as u8);
        }
        self.out
    }
}
