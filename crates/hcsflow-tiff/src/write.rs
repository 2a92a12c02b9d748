//! Writing stacks as multi-page TIFF files, atomically.

use std::collections::BTreeSet;
use std::fs::File;
use std::io::{self, BufWriter, Seek, Write};
use std::path::Path;

use hcsflow_core::{with_pixels, Pixel, Stack};
use hcsflow_io::Durability;
use ndarray::Axis;
use tiff::encoder::colortype::{self, ColorType};
use tiff::encoder::{DeflateLevel, Predictor, Rational, TiffEncoder, TiffKind, TiffKindBig, TiffKindStandard, TiffValue};
use tiff::tags::{ResolutionUnit, Tag, Type};
use tiff::Directory;

use crate::TiffError;

/// Compression of the pixel data written by [`write_stack`].
#[derive(Default, Clone, Copy, Debug, PartialEq, Eq)]
pub enum Compression {
    /// Uncompressed, one strip per page: fastest to write and read, and
    /// memory-mappable by other tools.
    #[default]
    None,
    /// Deflate (zlib, TIFF compression 8, level 6), with the horizontal
    /// predictor for u8/u16 (lossless; it typically shrinks microscopy
    /// images by a further third). f32 gets no predictor: the encoder has no
    /// floating-point predictor. Strips of about 1 MB.
    Deflate,
}

/// How [`write_stack`] writes a file. The default is an uncompressed file
/// with no description, no pixel size and no extra tags.
#[derive(Default, Clone, Debug)]
pub struct WriteOptions {
    pub compression: Compression,
    /// Written as `ImageDescription` (tag 270) of page 0 only, as ImageJ and
    /// tifffile do. UTF-8 is written as is (the TIFF ASCII type holds bytes;
    /// libtiff and tifffile do the same). Must not contain NUL.
    pub description: Option<String>,
    /// Pixel size in micrometres, written on every page as
    /// `XResolution = YResolution = 10_000 / pixel_size_um` pixels per
    /// centimetre with `ResolutionUnit = 3` (centimetre) — the TIFF
    /// baseline way, which tifffile, ImageJ/Fiji and libtiff understand. The
    /// rational is exact to about 1e-9 relative. Must be finite and > 0.
    pub pixel_size_um: Option<f64>,
    /// Extra ASCII tags of page 0, e.g. `(65500, harmony_xml)`. Codes that
    /// define the image structure or that this writer sets itself (width,
    /// strips, resolution, description…) are refused, as are duplicates and
    /// values containing NUL.
    pub extra_ascii_tags: Vec<(u16, String)>,
}

/// Tag codes [`WriteOptions::extra_ascii_tags`] may not use: the image
/// structure (baseline and extension tags that change how pixels are laid
/// out or interpreted) and everything this writer sets.
const RESERVED_TAGS: &[u16] = &[
    254, 255, 256, 257, 258, 259, 262, 263, 266, 270, 273, 274, 277, 278, 279, 280, 281, 282, 283, 284, 290, 291, 296, 317, 318, 319, 320,
    322, 323, 324, 325, 330, 338, 339, 340, 341, 347, 529, 530, 531, 532,
];

/// Writes `stack` to `path` as a TIFF with one page per plane (Z = pages).
///
/// The write is atomic with respect to failures of this process and to
/// concurrent readers: the file is written as a hidden temporary
/// ([`hcsflow_io::temp_name`]) in the target directory and renamed over `path` only
/// when complete, so `path` holds either its previous content or the whole
/// new file. If writing fails the temporary is removed. (A process killed
/// outright can leave the hidden temporary behind, never a partial `path`.)
/// The data is not fsync'ed: that would cost more than the write itself on
/// network file systems, and durability across power loss is not promised.
/// If `path` is a symbolic link, the link itself is replaced by the file.
///
/// Files are little- or big-endian as the machine is, classic TIFF unless the
/// pixel data approaches 4 GiB, then BigTIFF (which tifffile, ImageJ and
/// libtiff read).
pub fn write_stack(path: &Path, stack: &Stack, options: &WriteOptions) -> Result<(), TiffError> {
    let plan = Plan::new(path, stack, options)?;
    atomic_write(path, |w| {
        let result = if plan.bigtiff {
            encode(TiffEncoder::<_, TiffKindBig>::new_generic(w), stack, &plan)
        } else {
            encode(TiffEncoder::<_, TiffKindStandard>::new_generic(w), stack, &plan)
        };
        result.map_err(|e| encoder_error(path, e))
    })
}

/// Everything about the file decided and validated before any byte is written.
struct Plan {
    width: u32,
    height: u32,
    compression: Compression,
    resolution: Option<Rational>,
    /// ASCII tags of page 0, as bytes including the terminating NUL.
    page0_text: Vec<(Tag, Vec<u8>)>,
    bigtiff: bool,
}

impl Plan {
    fn new(path: &Path, stack: &Stack, options: &WriteOptions) -> Result<Plan, TiffError> {
        let invalid = |reason: String| TiffError::invalid_write(path, reason);
        let [z, y, x] = stack.shape();
        if z == 0 || y == 0 || x == 0 {
            return Err(invalid(format!("the stack is empty (shape [{z}, {y}, {x}])")));
        }
        let (Ok(width), Ok(height)) = (u32::try_from(x), u32::try_from(y)) else {
            return Err(invalid(format!("a plane of {y}x{x} exceeds the TIFF limit of 2^32-1 pixels per side")));
        };
        let resolution = options
            .pixel_size_um
            .map(|um| pixels_per_cm(um).ok_or_else(|| invalid(format!("pixel size {um} µm is not a finite positive number in range"))))
            .transpose()?;

        let mut page0_text = Vec::new();
        let mut seen = BTreeSet::new();
        if let Some(d) = &options.description {
            page0_text.push((Tag::ImageDescription, ascii_bytes(d).ok_or_else(|| invalid("the description contains a NUL byte".into()))?));
            seen.insert(Tag::ImageDescription.to_u16());
        }
        for (code, value) in &options.extra_ascii_tags {
            if RESERVED_TAGS.contains(code) {
                return Err(invalid(format!(
                    "tag {code} is part of the image structure or set by the writer; it cannot be an extra ASCII tag"
                )));
            }
            if !seen.insert(*code) {
                return Err(invalid(format!("tag {code} is given twice")));
            }
            let bytes = ascii_bytes(value).ok_or_else(|| invalid(format!("the value of tag {code} contains a NUL byte")))?;
            page0_text.push((Tag::from_u16_exhaustive(*code), bytes));
        }

        // Classic TIFF offsets are 32-bit. Leave room for Deflate's worst
        // case (incompressible data grows by well under 1/64), the tags and
        // one IFD per page.
        let payload = stack.nbytes() as u128;
        let text: u128 = page0_text.iter().map(|(_, b)| b.len() as u128).sum();
        let estimate = payload + payload / 64 + text + z as u128 * 4096 + (1 << 20);
        let bigtiff = estimate > u32::MAX as u128;

        Ok(Plan { width, height, compression: options.compression, resolution, page0_text, bigtiff })
    }
}

/// `text` with its terminating NUL, or `None` if it contains a NUL.
fn ascii_bytes(text: &str) -> Option<Vec<u8>> {
    if text.as_bytes().contains(&0) {
        return None;
    }
    let mut bytes = Vec::with_capacity(text.len() + 1);
    bytes.extend_from_slice(text.as_bytes());
    bytes.push(0);
    Some(bytes)
}

/// `10_000 / um` pixels per centimetre as a rational with the largest
/// power-of-ten denominator that keeps the numerator in `u32`, reduced.
fn pixels_per_cm(um: f64) -> Option<Rational> {
    if !um.is_finite() || um <= 0.0 {
        return None;
    }
    let per_cm = 10_000.0 / um;
    for k in (0..=9).rev() {
        let d = 10u64.pow(k);
        let n = (per_cm * d as f64).round();
        if n >= 1.0 && n <= u32::MAX as f64 {
            let (n, d) = (n as u64, d);
            let g = gcd(n, d);
            return Some(Rational { n: (n / g) as u32, d: (d / g) as u32 });
        }
    }
    None
}

fn gcd(mut a: u64, mut b: u64) -> u64 {
    while b != 0 {
        (a, b) = (b, a % b);
    }
    a
}

/// Pixel types with a grayscale TIFF colour type.
trait Encodable: Pixel {
    type Color: ColorType<Inner = Self>;
    /// Whether the horizontal predictor applies (integers only).
    const PREDICT: bool;
}

impl Encodable for u8 {
    type Color = colortype::Gray8;
    const PREDICT: bool = true;
}
impl Encodable for u16 {
    type Color = colortype::Gray16;
    const PREDICT: bool = true;
}
impl Encodable for f32 {
    type Color = colortype::Gray32Float;
    const PREDICT: bool = false;
}

fn encode<W: Write + Seek, K: TiffKind>(encoder: tiff::TiffResult<TiffEncoder<W, K>>, stack: &Stack, plan: &Plan) -> tiff::TiffResult<()> {
    let encoder = encoder?;
    with_pixels!(Stack, stack, a, T => {
        let mut encoder = configure::<W, K, T>(encoder, plan.compression);
        for (z, plane) in a.view().axis_iter(Axis(0)).enumerate() {
            let plane = plane.as_standard_layout();
            let data = plane.as_slice().unwrap_or(&[]);
            write_page::<W, K, T>(&mut encoder, data, z, plan)?;
        }
        Ok(())
    })
}

fn configure<W: Write + Seek, K: TiffKind, T: Encodable>(encoder: TiffEncoder<W, K>, compression: Compression) -> TiffEncoder<W, K> {
    match compression {
        Compression::None => encoder,
        Compression::Deflate => {
            let encoder = encoder.with_compression(tiff::encoder::Compression::Deflate(DeflateLevel::Balanced));
            if T::PREDICT {
                encoder.with_predictor(Predictor::Horizontal)
            } else {
                encoder
            }
        }
    }
}

fn write_page<W: Write + Seek, K: TiffKind, T: Encodable>(
    encoder: &mut TiffEncoder<W, K>,
    data: &[T],
    z: usize,
    plan: &Plan,
) -> tiff::TiffResult<()>
where
    [T]: TiffValue,
{
    let mut image = encoder.new_image::<T::Color>(plan.width, plan.height)?;
    if plan.compression == Compression::None {
        // One contiguous strip per page: one read per page, and other tools
        // can memory-map the plane.
        image.rows_per_strip(plan.height)?;
    }
    if let Some(res) = &plan.resolution {
        let dir = image.encoder();
        dir.write_tag(Tag::XResolution, res.clone())?;
        dir.write_tag(Tag::YResolution, res.clone())?;
        dir.write_tag(Tag::ResolutionUnit, ResolutionUnit::Centimeter)?;
    }
    if z == 0 {
        for (tag, bytes) in &plan.page0_text {
            let dir = image.encoder();
            let entry = dir.write_entry_bytes(Type::ASCII, bytes)?;
            dir.extend_from(&Directory::from_iter([(*tag, entry)]));
        }
    }
    image.write_data(data)
}

/// Errors of the encoder: I/O stays I/O; anything else means we asked the
/// encoder for something it cannot do.
fn encoder_error(path: &Path, e: tiff::TiffError) -> TiffError {
    match e {
        tiff::TiffError::IoError(io) => TiffError::io(path, io),
        other => TiffError::invalid_write(path, format!("the TIFF encoder refused: {other}")),
    }
}

/// Why the atomic write of a TIFF failed: creating, flushing or renaming
/// the temporary ([`hcsflow_io::write_atomic_with`]), or the encoder.
enum WriteFailure {
    Io(io::Error),
    Tiff(TiffError),
}

impl From<io::Error> for WriteFailure {
    fn from(e: io::Error) -> Self {
        WriteFailure::Io(e)
    }
}

/// Writes through `write` into a temporary file beside `target`, then
/// renames it to `target` ([`hcsflow_io::write_atomic_with`], not fsync'ed).
fn atomic_write(target: &Path, write: impl FnOnce(&mut BufWriter<&File>) -> Result<(), TiffError>) -> Result<(), TiffError> {
    if target.file_name().is_none_or(|n| n.is_empty()) {
        return Err(TiffError::invalid_write(target, "the path does not name a file"));
    }
    hcsflow_io::write_atomic_with(target, Durability::Process, |w| write(w).map_err(WriteFailure::Tiff)).map_err(|e| match e {
        WriteFailure::Io(e) => TiffError::io(target, e),
        WriteFailure::Tiff(e) => e,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn pixel_size_rational_is_close() {
        for um in [0.1083, 0.325, 0.65, 1.0, 6.5, 1234.5, 20000.0, 1e-3] {
            let r = pixels_per_cm(um).expect("in range");
            let back = 10_000.0 * r.d as f64 / r.n as f64;
            assert!(((back - um) / um).abs() < 1e-8, "{um} -> {}/{} -> {back}", r.n, r.d);
        }
        assert!(pixels_per_cm(0.0).is_none());
        assert!(pixels_per_cm(-1.0).is_none());
        assert!(pixels_per_cm(f64::NAN).is_none());
        assert!(pixels_per_cm(1e-9).is_none());
    }

    #[test]
    fn bigtiff_forced_round_trip() {
        // The 4 GiB switch cannot be exercised in a unit test; write a small
        // stack through the BigTIFF path directly and read it back.
        let dir = tempfile::tempdir().expect("tempdir");
        let path = dir.path().join("big.tif");
        let a = ndarray::Array3::from_shape_fn((3, 5, 7), |(z, y, x)| (z * 100 + y * 10 + x) as u16);
        let stack = Stack::from(a);
        let mut plan = Plan::new(&path, &stack, &WriteOptions::default()).expect("plan");
        plan.bigtiff = true;
        atomic_write(&path, |w| encode(TiffEncoder::<_, TiffKindBig>::new_generic(w), &stack, &plan).map_err(|e| encoder_error(&path, e)))
            .expect("write");
        let bytes = std::fs::read(&path).expect("read bytes");
        assert_eq!(u16::from_ne_bytes([bytes[2], bytes[3]]), 43, "BigTIFF magic");
        assert_eq!(crate::read_stack(&path).expect("read"), stack);
    }
}
