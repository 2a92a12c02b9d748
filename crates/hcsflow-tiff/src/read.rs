//! Reading TIFF files into stacks.

use std::fmt;
use std::fs::{File, OpenOptions};
use std::io::BufReader;
use std::panic::{catch_unwind, AssertUnwindSafe};
use std::path::Path;

use hcsflow_core::{DType, Pixel, Stack};
use ndarray::Array3;
use rayon::prelude::*;
use tiff::decoder::{ChunkType, Decoder, DecodingResult, Limits};
use tiff::tags::{ByteOrder, PhotometricInterpretation, SampleFormat, Tag, Type};
use tiff::ColorType;

use crate::TiffError;

type Dec = Decoder<BufReader<File>>;

/// The size and pixel type of one plane, as a caller expects every page of a
/// file to be (for a plate: the size and dtype all its images share).
///
/// Displayed as `WIDTHxHEIGHT dtype` (`128x128 u16`), the form of every size
/// in this crate's messages.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct PlaneFormat {
    /// Rows (the Y extent).
    pub height: usize,
    /// Columns (the X extent).
    pub width: usize,
    /// Pixel type.
    pub dtype: DType,
}

impl PlaneFormat {
    pub fn new(height: usize, width: usize, dtype: DType) -> PlaneFormat {
        PlaneFormat { height, width, dtype }
    }

    /// Bytes of one decoded plane.
    pub fn bytes(&self) -> u128 {
        self.width as u128 * self.height as u128 * self.dtype.size_bytes() as u128
    }
}

impl fmt::Display for PlaneFormat {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}x{} {}", self.width, self.height, self.dtype)
    }
}

/// What each file given to [`read_stack_expecting`] or
/// [`read_stacks_expecting`] must hold, checked from the tags before any
/// pixel is decoded.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Expected {
    /// The size and dtype of every page.
    pub plane: PlaneFormat,
    /// The number of pages of each file; `None` accepts any number.
    pub pages: Option<usize>,
}

impl Expected {
    /// Exactly one page of `plane` per file: one image of a plate.
    pub fn one_plane(plane: PlaneFormat) -> Expected {
        Expected { plane, pages: Some(1) }
    }
}

/// Headroom over one expected plane for the buffers the decoder allocates in
/// the expecting readers: a tile wider than the image (tiles come in
/// multiples of 16 pixels), the tag arrays (strip offsets) of a small plane.
const DECODE_SLACK: usize = 1024 * 1024;

/// Compression codes whose decoders stream into the output buffer, so their
/// memory is bounded by the plane they decode: none, LZW, Deflate (Adobe and
/// old style) and PackBits. JPEG and the others size their own output from
/// the compressed stream.
const STREAMING_CODECS: [u16; 5] = [1, 5, 8, 32946, 32773];

/// What [`read_info`] reports about a TIFF file, from its tags alone.
#[derive(Debug, Clone, PartialEq)]
pub struct TiffInfo {
    /// Number of pages (images in the main IFD chain; SubIFDs are not counted).
    pub pages: usize,
    /// Width of page 0 in pixels (the X extent of the stack).
    pub width: usize,
    /// Height of page 0 in pixels (the Y extent of the stack).
    pub height: usize,
    /// Pixel type of page 0.
    pub dtype: DType,
    /// The `ImageDescription` tag of page 0 — the first, when there are
    /// several (tifffile appends its own after its caller's). Bytes that are
    /// not UTF-8 are replaced with U+FFFD; the text ends at the first NUL.
    pub description: Option<String>,
    /// Compression of page 0 in lower case: `none`, `lzw`, `deflate`
    /// (Adobe, code 8), `deflate-old` (code 32946), `packbits`, `jpeg`, … or
    /// `unknown(N)`.
    pub compression: String,
}

/// Reads every page of the TIFF at `path` as one plane of a `[Z, Y, X]` stack.
///
/// All pages must have the width, height and dtype of page 0, otherwise
/// [`TiffError::PageMismatch`] names the first page that differs (files with
/// thumbnails or reduced-resolution pages in the main IFD chain are therefore
/// rejected rather than silently mixed). Pixel values are returned as stored:
/// for `WhiteIsZero` integer images that means the raw values, as tifffile
/// reports them, not an inverted image.
///
/// Strip-organised pages (what cameras and most writers produce) are decoded
/// straight into the stack's buffer, one page after the other; tiled pages go
/// through one tile-sized buffer. There is no per-pixel conversion unless the
/// file's byte order differs from the machine's or a predictor has to be
/// undone.
///
/// Only the tags bound what is allocated, up to 4096 times the file's
/// length for compressed pages (see [`read_stack_expecting`] to bound it by
/// a known plane size). A path that is not a regular file (a FIFO, a device,
/// a directory) is [`TiffError::NotRegularFile`], found without blocking.
pub fn read_stack(path: &Path) -> Result<Stack, TiffError> {
    read_files(&[path], false, None)
}

/// Reads the TIFF at `path` like [`read_stack`], but only if it holds what
/// `expected` says: before any pixel is decoded, every page's tags (width,
/// height, bits and format of its samples, samples per pixel) are checked
/// against `expected.plane` ([`TiffError::FormatMismatch`] names the page and
/// both formats) and the pages are counted against `expected.pages`
/// ([`TiffError::PageCount`]).
///
/// Decoding is then budgeted to the expected plane: no buffer the decoder
/// allocates (a tile, a tag array) may exceed one plane plus 1 MiB, and no
/// compressed strip or tile may exceed twice the plane plus 1 MiB (the file
/// is then [`TiffError::Corrupt`]). Only codecs that decode straight into
/// the plane are read (none, LZW, Deflate, PackBits); others, such as JPEG,
/// whose decoders size their own output from the stream, are
/// [`TiffError::Unsupported`]. So a small file whose header claims a huge
/// image fails on its tags, and memory never grows beyond the planes the
/// caller expects.
pub fn read_stack_expecting(path: &Path, expected: Expected) -> Result<Stack, TiffError> {
    read_files(&[path], false, Some(expected))
}

/// Reads several TIFF files into one `[Z, Y, X]` stack: the pages of
/// `paths[0]`, then those of `paths[1]`, and so on — the tiles of a grid, or
/// the z-planes of a field written one file per plane.
///
/// Each file is read as by [`read_stack`], the files in parallel, straight
/// into their part of the one result buffer: there is no per-file stack and
/// no concatenation, so every pixel is written once. All pages of all files
/// must share the size and dtype of the first file's page 0; a file that
/// differs is [`TiffError::FileMismatch`], naming both files. An empty
/// `paths` is [`TiffError::NoFiles`].
pub fn read_stacks<P: AsRef<Path> + Sync>(paths: &[P]) -> Result<Stack, TiffError> {
    read_files(paths, true, None)
}

/// Reads several TIFF files into one stack like [`read_stacks`], each file
/// checked and budgeted as by [`read_stack_expecting`] before any file is
/// decoded. An empty `paths` is [`TiffError::NoFiles`].
pub fn read_stacks_expecting<P: AsRef<Path> + Sync>(paths: &[P], expected: Expected) -> Result<Stack, TiffError> {
    read_files(paths, true, Some(expected))
}

/// Reads page `page` (0-based) of the TIFF at `path` as a `[1, Y, X]` stack,
/// only if it is a `plane`: its tags are checked and decoding budgeted as by
/// [`read_stack_expecting`], the other pages are neither checked nor
/// decoded (a multi-page OME-TIFF holds planes of several images). A file
/// with fewer pages is [`TiffError::Corrupt`] naming the page. Finding the
/// page walks the IFD chain from the start: reading every page of an
/// N-page file this way parses O(N²) IFDs, fine for the tens to hundreds of
/// planes of one field's file.
pub fn read_page_expecting(path: &Path, page: usize, plane: PlaneFormat) -> Result<Stack, TiffError> {
    let (mut dec, file_len) = open(path, limits(Some(&Expected::one_plane(plane))))?;
    if page > 0 {
        guarded(path, Some(page), || dec.seek_to_image(page))?;
    }
    let meta = page_meta(&mut dec, path, page)?;
    check_page(path, page, &meta, plane)?;
    check_budget(path, &[meta], file_len)?;
    let mut stack = match meta.dtype {
        DType::U8 => Stack::from(decode_page::<u8>(&mut dec, path, page, meta)?),
        DType::U16 => Stack::from(decode_page::<u16>(&mut dec, path, page, meta)?),
        DType::F32 => Stack::from(decode_page::<f32>(&mut dec, path, page, meta)?),
    };
    undo_white_is_zero(&mut stack, &[meta]);
    Ok(stack)
}

/// The decoder's current page (page `page`, described by `meta`) as a one-plane array.
fn decode_page<T: Pixel>(dec: &mut Dec, path: &Path, page: usize, meta: PageMeta) -> Result<Array3<T>, TiffError> {
    let mut data = vec![T::zeroed(); meta.planes * meta.height * meta.width];
    decode_pages(dec, path, page, &[meta], &mut data)?;
    Array3::from_shape_vec((meta.planes, meta.height, meta.width), data).map_err(|e| TiffError::corrupt(path, Some(page), e))
}

/// A file whose pages have been scanned; the decoder is on page 0.
type Scanned = (Dec, Vec<PageMeta>);

/// The one implementation behind [`read_stack`], [`read_stacks`] and their
/// expecting forms: scan every file (checking it against `expected`), check
/// they agree, allocate once, decode each file into its planes.
fn read_files<P: AsRef<Path> + Sync>(paths: &[P], parallel: bool, expected: Option<Expected>) -> Result<Stack, TiffError> {
    let scan = |path: &P| -> Result<Scanned, TiffError> {
        let path = path.as_ref();
        let (mut dec, file_len) = open(path, limits(expected.as_ref()))?;
        let pages = scan_pages(&mut dec, path, expected.as_ref())?;
        check_budget(path, &pages, file_len)?;
        if pages.len() > 1 {
            guarded(path, Some(0), || dec.seek_to_image(0))?;
        }
        Ok((dec, pages))
    };
    let scanned: Vec<Scanned> =
        if parallel { paths.par_iter().map(scan).collect::<Result<_, _>>()? } else { paths.iter().map(scan).collect::<Result<_, _>>()? };
    let (Some(first_path), Some((_, first_pages))) = (paths.first(), scanned.first()) else {
        return Err(TiffError::NoFiles);
    };
    let first = first_pages[0];
    for (path, (_, pages)) in paths.iter().zip(&scanned) {
        let page = pages[0];
        if (page.width, page.height, page.dtype) != (first.width, first.height, first.dtype) {
            return Err(TiffError::FileMismatch {
                path: path.as_ref().to_path_buf(),
                first: first_path.as_ref().to_path_buf(),
                expected: first.describe(),
                found: page.describe(),
            });
        }
    }
    let all_pages: Vec<PageMeta> = scanned.iter().flat_map(|(_, pages)| pages.iter().copied()).collect();
    let mut stack = match first.dtype {
        DType::U8 => Stack::from(decode_files::<u8, P>(paths, scanned, first, parallel)?),
        DType::U16 => Stack::from(decode_files::<u16, P>(paths, scanned, first, parallel)?),
        DType::F32 => Stack::from(decode_files::<f32, P>(paths, scanned, first, parallel)?),
    };
    undo_white_is_zero(&mut stack, &all_pages);
    Ok(stack)
}

/// Allocates the stack of all files' pages (each of `first`'s size, as
/// [`read_files`] checked) and decodes each file into its planes.
fn decode_files<T: Pixel, P: AsRef<Path> + Sync>(
    paths: &[P],
    scanned: Vec<Scanned>,
    first: PageMeta,
    parallel: bool,
) -> Result<Array3<T>, TiffError> {
    let first_path = paths.first().map_or(Path::new(""), |p| p.as_ref());
    let (height, width) = (first.height, first.width);
    let depth: usize = scanned.iter().flat_map(|(_, pages)| pages.iter().map(|p| p.planes)).sum();
    let total = (height * width).checked_mul(depth).ok_or_else(|| TiffError::TooLarge {
        path: first_path.to_path_buf(),
        what: format!("a stack of {depth} planes"),
        bytes: first.decoded_bytes() * depth as u128,
    })?;
    // Zero-initialised through the allocator (calloc), so untouched pages
    // cost nothing until the decoder writes them.
    let mut data = vec![T::zeroed(); total];
    let mut rest = data.as_mut_slice();
    let mut jobs = Vec::with_capacity(scanned.len());
    for (path, (dec, pages)) in paths.iter().zip(scanned) {
        let planes: usize = pages.iter().map(|p| p.planes).sum();
        let (mine, tail) = std::mem::take(&mut rest).split_at_mut(planes * height * width);
        rest = tail;
        jobs.push((path.as_ref(), dec, pages, mine));
    }
    let decode = |(path, mut dec, pages, out): (&Path, Dec, Vec<PageMeta>, &mut [T])| decode_pages(&mut dec, path, 0, &pages, out);
    if parallel {
        jobs.into_par_iter().try_for_each(decode)?;
    } else {
        jobs.into_iter().try_for_each(decode)?;
    }
    Array3::from_shape_vec((depth, height, width), data).map_err(|e| TiffError::corrupt(first_path, None, e))
}

/// Reads the page count and page 0's size, dtype, description and
/// compression without decoding any pixels.
///
/// Every IFD of the main chain is parsed (to count pages), so structural
/// damage anywhere in the chain is reported; damage inside pixel data is not.
/// Fails with [`TiffError::Unsupported`] if page 0 is not u8/u16/f32
/// grayscale (or samples stored as separate planes).
pub fn read_info(path: &Path) -> Result<TiffInfo, TiffError> {
    let (mut dec, file_len) = open(path, limits(None))?;
    let first = page_meta(&mut dec, path, 0)?;
    // The first description is the one that holds the metadata (tifffile
    // appends its own JSON after its caller's); the decoder keeps only the last.
    let description = match crate::descriptions::page0_descriptions(path).into_iter().next() {
        Some(first) => Some(first),
        None => read_text_tag(&mut dec, path, Tag::ImageDescription, file_len)?,
    };
    let compression = guarded(path, Some(0), || dec.find_tag_unsigned::<u16>(Tag::Compression))?.unwrap_or(1);
    let mut pages = 1;
    while dec.more_images() {
        guarded(path, Some(pages), || dec.next_image())?;
        pages += 1;
    }
    Ok(TiffInfo {
        pages,
        width: first.width,
        height: first.height,
        dtype: first.dtype,
        description,
        compression: compression_name(compression),
    })
}

/// Shape, dtype and decoding facts of one page, from its tags.
#[derive(Debug, Clone, Copy)]
struct PageMeta {
    width: usize,
    height: usize,
    dtype: DType,
    white_is_zero: bool,
    compressed: bool,
    /// The `Compression` tag (1 if absent).
    compression: u16,
    /// Samples per pixel, each stored as its own plane (`PlanarConfiguration`
    /// 2): every sample is one plane of the stack. 1 for grayscale.
    planes: usize,
}

impl PageMeta {
    fn format(&self) -> PlaneFormat {
        PlaneFormat::new(self.height, self.width, self.dtype)
    }

    fn describe(&self) -> String {
        self.format().to_string()
    }

    /// The bytes of all the page's planes.
    fn decoded_bytes(&self) -> u128 {
        self.format().bytes() * self.planes as u128
    }
}

/// Opens `path` (as by [`open_regular`]) and parses the header and the
/// first IFD; `limits` apply from the second IFD on and to all decoding.
fn open(path: &Path, limits: Limits) -> Result<(Dec, u64), TiffError> {
    let (file, file_len) = open_regular(path)?;
    if file_len == 0 {
        return Err(TiffError::Empty { path: path.to_path_buf() });
    }
    let dec = guarded(path, None, || Decoder::new(BufReader::with_capacity(64 * 1024, file)))?;
    Ok((dec.with_limits(limits), file_len))
}

/// Opens `path` for reading, without blocking, and only if it is a regular
/// file; returns the file and its length.
///
/// Opening a FIFO for reading blocks until a writer appears, so the open is
/// non-blocking (`O_NONBLOCK`, which does not change how regular files
/// read) and the opened file is then checked with `fstat`: a FIFO, socket,
/// device or directory is [`TiffError::NotRegularFile`].
fn open_regular(path: &Path) -> Result<(File, u64), TiffError> {
    let mut options = OpenOptions::new();
    options.read(true);
    #[cfg(unix)]
    {
        use std::os::unix::fs::OpenOptionsExt;
        options.custom_flags(libc::O_NONBLOCK);
    }
    let file = options.open(path).map_err(|e| TiffError::io(path, e))?;
    let meta = file.metadata().map_err(|e| TiffError::io(path, e))?;
    if !meta.is_file() {
        return Err(TiffError::NotRegularFile { path: path.to_path_buf(), kind: file_kind(&meta.file_type()) });
    }
    Ok((file, meta.len()))
}

/// What a file that is not a regular file is ("a FIFO (named pipe)", "a
/// folder", …), for [`TiffError::NotRegularFile`] and for the plate reader's
/// warnings: one wording everywhere.
pub fn file_kind(kind: &std::fs::FileType) -> &'static str {
    if kind.is_dir() {
        return "a folder";
    }
    #[cfg(unix)]
    {
        use std::os::unix::fs::FileTypeExt;
        if kind.is_fifo() {
            return "a FIFO (named pipe)";
        }
        if kind.is_socket() {
            return "a socket";
        }
        if kind.is_char_device() {
            return "a character device";
        }
        if kind.is_block_device() {
            return "a block device";
        }
    }
    "a special file"
}

/// Decoder limits for microscopy files; with `expected`, budgeted to its
/// plane (see [`read_stack_expecting`]).
///
/// In `tiff` 0.11.3, `decoding_buffer_size` bounds every buffer the decoder
/// allocates itself (an image or chunk it returns, the tile buffer of
/// `read_chunk_to_buffer`, tag values), `intermediate_buffer_size` bounds the
/// compressed bytes of one strip or tile, and `ifd_value_size` is not used.
/// Strips are decoded into our own buffer, sized by the tags.
///
/// Without `expected`, the default limit on one compressed chunk (128 MiB)
/// would refuse a large uncompressed single-strip plane, so it is lifted:
/// [`check_budget`] bounds the memory a file can make us allocate instead.
fn limits(expected: Option<&Expected>) -> Limits {
    let mut limits = Limits::default();
    limits.intermediate_buffer_size = usize::MAX;
    limits.ifd_value_size = 64 * 1024 * 1024;
    if let Some(e) = expected {
        let plane = usize::try_from(e.plane.bytes()).unwrap_or(usize::MAX);
        limits.decoding_buffer_size = plane.saturating_add(DECODE_SLACK);
        limits.intermediate_buffer_size = plane.saturating_mul(2).saturating_add(DECODE_SLACK);
    }
    limits
}

/// Runs a call into the `tiff` decoder, turning its errors — and, as a last
/// line of defence against bugs on malformed input, its panics — into
/// [`TiffError`]s naming `path`.
fn guarded<T>(path: &Path, page: Option<usize>, f: impl FnOnce() -> tiff::TiffResult<T>) -> Result<T, TiffError> {
    match catch_unwind(AssertUnwindSafe(f)) {
        Ok(Ok(v)) => Ok(v),
        Ok(Err(e)) => Err(TiffError::from_decoder(path, page, e)),
        Err(_) => Err(TiffError::corrupt(path, page, "the TIFF decoder failed on malformed data")),
    }
}

/// Reads the facts of every page and checks they agree with page 0 and,
/// page by page, with `expected` (format, codec, page count). Leaves the
/// decoder on the last page.
fn scan_pages(dec: &mut Dec, path: &Path, expected: Option<&Expected>) -> Result<Vec<PageMeta>, TiffError> {
    let check = |meta: &PageMeta, page: usize| match expected {
        Some(e) => check_page(path, page, meta, e.plane),
        None => Ok(()),
    };
    // The number of pages, counted on from `seen` (IFDs are parsed, no pixel decoded).
    let count_pages = |dec: &mut Dec, seen: usize| -> Result<usize, TiffError> {
        let mut found = seen;
        while dec.more_images() {
            guarded(path, Some(found), || dec.next_image())?;
            found += 1;
        }
        Ok(found)
    };
    let wrong_count = |expected: usize, found: usize| TiffError::PageCount { path: path.to_path_buf(), expected, found };
    let wanted = expected.and_then(|e| e.pages);
    let first = page_meta(dec, path, 0)?;
    check(&first, 0)?;
    let mut pages = vec![first];
    while dec.more_images() {
        let index = pages.len();
        if let Some(n) = wanted.filter(|&n| index >= n) {
            return Err(wrong_count(n, count_pages(dec, index)?));
        }
        guarded(path, Some(index), || dec.next_image())?;
        let meta = page_meta(dec, path, index)?;
        check(&meta, index)?;
        if (meta.width, meta.height, meta.dtype) != (first.width, first.height, first.dtype) {
            return Err(TiffError::PageMismatch {
                path: path.to_path_buf(),
                page: index,
                expected: first.describe(),
                found: meta.describe(),
            });
        }
        pages.push(meta);
    }
    if let Some(n) = wanted.filter(|&n| pages.len() != n) {
        return Err(wrong_count(n, pages.len()));
    }
    Ok(pages)
}

/// Whether `meta` (page `page` of `path`) is a `plane` whose codec decodes
/// within its size ([`read_stack_expecting`]'s check).
fn check_page(path: &Path, page: usize, meta: &PageMeta, plane: PlaneFormat) -> Result<(), TiffError> {
    if meta.planes != 1 {
        return Err(TiffError::Unsupported {
            path: path.to_path_buf(),
            page,
            what: format!("{} samples per pixel (separate planes) where one {plane} plane is expected", meta.planes),
        });
    }
    if meta.format() != plane {
        return Err(TiffError::FormatMismatch { path: path.to_path_buf(), page, expected: plane, found: meta.format() });
    }
    if !STREAMING_CODECS.contains(&meta.compression) {
        return Err(TiffError::Unsupported {
            path: path.to_path_buf(),
            page,
            what: format!(
                "{} compression for an image of known size (only none, LZW, Deflate and PackBits are decoded within its size)",
                compression_name(meta.compression)
            ),
        });
    }
    Ok(())
}

/// The facts of the decoder's current page; errors if it is not a
/// supported grayscale image.
fn page_meta(dec: &mut Dec, path: &Path, page: usize) -> Result<PageMeta, TiffError> {
    let unsupported = |what: String| TiffError::Unsupported { path: path.to_path_buf(), page, what };
    let (width, height) = guarded(path, Some(page), || dec.dimensions())?;
    let color = guarded(path, Some(page), || dec.colortype())?;
    let (bits, planes) = match color {
        ColorType::Gray(bits) => (bits, 1),
        ColorType::GrayA(bits) => (bits, 2),
        ColorType::RGB(bits) => (bits, 3),
        ColorType::RGBA(bits) => (bits, 4),
        ColorType::Multiband { bit_depth, num_samples } => (bit_depth, usize::from(num_samples)),
        other => {
            return Err(unsupported(format!("{} samples per pixel ({other:?}); only grayscale samples are read", other.num_samples())))
        }
    };
    let separate = guarded(path, Some(page), || dec.find_tag_unsigned::<u16>(Tag::PlanarConfiguration))? == Some(2);
    if planes > 1 && !separate {
        return Err(unsupported(format!(
            "{planes} samples per pixel stored interleaved; only single-sample grayscale, or samples stored as separate planes \
             (PlanarConfiguration 2, read as one plane each), are read"
        )));
    }
    let layout = guarded(path, Some(page), || dec.image_buffer_layout())?;
    let dtype = match (layout.sample_format, bits) {
        (SampleFormat::Uint, 8) => DType::U8,
        (SampleFormat::Uint, 16) => DType::U16,
        (SampleFormat::IEEEFP, 32) => DType::F32,
        (format, bits) => {
            return Err(unsupported(format!(
                "{bits}-bit {} samples; only 8/16-bit unsigned integer and 32-bit float are read",
                sample_format_name(format)
            )))
        }
    };
    let photometric = guarded(path, Some(page), || dec.find_tag_unsigned::<u16>(Tag::PhotometricInterpretation))?;
    let white_is_zero = photometric == Some(PhotometricInterpretation::WhiteIsZero.to_u16());
    if white_is_zero && dtype == DType::F32 {
        // The decoder maps v to 1 - v, which cannot be undone exactly.
        return Err(unsupported("32-bit float with WhiteIsZero photometric interpretation".into()));
    }
    let compression = guarded(path, Some(page), || dec.find_tag_unsigned::<u16>(Tag::Compression))?.unwrap_or(1);
    let meta = PageMeta {
        width: width as usize,
        height: height as usize,
        dtype,
        white_is_zero,
        compressed: compression != 1,
        compression,
        planes,
    };
    if planes > 1 && dec.get_chunk_type() == ChunkType::Tile {
        return Err(unsupported(format!("{planes} separate sample planes in tiles; separate planes are read from strips")));
    }
    if width == 0 || height == 0 || layout.planes != planes || layout.complete_len as u128 != meta.decoded_bytes() {
        return Err(TiffError::corrupt(path, Some(page), format_args!("inconsistent image layout for a {} page", meta.describe())));
    }
    Ok(meta)
}

/// Refuses files whose tags claim far more pixels than the file can hold,
/// before allocating for them.
///
/// Uncompressed pixels must be stored in the file, so they cannot exceed its
/// length. No codec the `tiff` crate reads expands data by more than 4096×
/// (LZW, the worst, emits at most 4096 bytes per 9-bit code), so compressed
/// pages get that factor. A garbage header claiming a 4-gigapixel image thus
/// fails here instead of allocating gigabytes.
fn check_budget(path: &Path, pages: &[PageMeta], file_len: u64) -> Result<(), TiffError> {
    const MAX_EXPANSION: u128 = 4096;
    let (mut raw, mut compressed) = (0u128, 0u128);
    for p in pages {
        if p.compressed {
            compressed += p.decoded_bytes();
        } else {
            raw += p.decoded_bytes();
        }
    }
    let stored_at_least = raw + compressed.div_ceil(MAX_EXPANSION);
    if stored_at_least > file_len as u128 {
        return Err(TiffError::corrupt(
            path,
            None,
            format_args!(
                "the tags describe {} bytes of pixels in {} page(s) but the file has only {file_len} bytes (truncated?)",
                raw + compressed,
                pages.len()
            ),
        ));
    }
    let total = raw + compressed;
    if usize::try_from(total).is_err() {
        return Err(TiffError::TooLarge { path: path.to_path_buf(), what: "the stack".into(), bytes: total });
    }
    Ok(())
}

/// Decodes `pages.len()` pages of a file, starting at the decoder's current
/// page (page `first`, named in errors), into `data`: each page's planes (one,
/// or one per separately stored sample) of the first page's size, in order.
fn decode_pages<T: Pixel>(dec: &mut Dec, path: &Path, first: usize, pages: &[PageMeta], data: &mut [T]) -> Result<(), TiffError> {
    let (height, width) = (pages[0].height, pages[0].width);
    let plane = height * width;
    let mut rest = data;
    for (k, meta) in pages.iter().enumerate() {
        let z = first + k;
        let need = plane * meta.planes;
        if rest.len() < need {
            return Err(TiffError::corrupt(path, Some(z), "more planes than the stack was sized for"));
        }
        let (out, tail) = std::mem::take(&mut rest).split_at_mut(need);
        rest = tail;
        if k > 0 {
            guarded(path, Some(z), || dec.next_image())?;
        }
        let bytes: &mut [u8] = bytemuck::cast_slice_mut(out);
        if read_raw_page(dec, path, z, &pages[k], bytes)? {
            continue;
        }
        if dec.get_chunk_type() == ChunkType::Tile {
            read_tiled(dec, path, z, bytes, width, height)?;
        } else {
            guarded(path, Some(z), || dec.read_image_bytes(bytes))?;
        }
    }
    Ok(())
}

/// Reads the decoder's current page straight from the file into `out` when
/// its pixels are stored exactly as they are laid out in memory: uncompressed
/// strips, one after the other, no predictor, the machine's byte order (or
/// 8-bit samples), not `WhiteIsZero`. That is what cameras and tifffile write,
/// and one positioned read of the whole plane is about three times faster than
/// the decoder's strip-by-strip copies through its buffered reader.
///
/// Returns `false` (nothing read) when the page does not qualify or its strip
/// tags do not describe exactly `out.len()` contiguous bytes; the decoder then
/// reads it, with its own error reporting.
fn read_raw_page(dec: &mut Dec, path: &Path, page: usize, meta: &PageMeta, out: &mut [u8]) -> Result<bool, TiffError> {
    let native = match dec.byte_order() {
        ByteOrder::LittleEndian => cfg!(target_endian = "little"),
        ByteOrder::BigEndian => cfg!(target_endian = "big"),
    };
    if meta.compressed
        || meta.white_is_zero
        || meta.planes != 1
        || dec.get_chunk_type() != ChunkType::Strip
        || !(native || meta.dtype.size_bytes() == 1)
    {
        return Ok(false);
    }
    let predictor = guarded(path, Some(page), || dec.find_tag_unsigned::<u16>(Tag::Predictor))?;
    if predictor.is_some_and(|p| p != 1) {
        return Ok(false);
    }
    let offsets = guarded(path, Some(page), || dec.find_tag_unsigned_vec::<u64>(Tag::StripOffsets))?;
    let counts = guarded(path, Some(page), || dec.find_tag_unsigned_vec::<u64>(Tag::StripByteCounts))?;
    let (Some(offsets), Some(counts)) = (offsets, counts) else {
        return Ok(false);
    };
    let contiguous = offsets.len() == counts.len() && offsets.windows(2).zip(&counts).all(|(o, &c)| o[0].checked_add(c) == Some(o[1]));
    let total = counts.iter().try_fold(0u64, |a, &c| a.checked_add(c));
    if !contiguous || total != Some(out.len() as u64) {
        return Ok(false);
    }
    let Some(&start) = offsets.first() else {
        return Ok(false);
    };
    positioned_read(dec.inner().get_ref(), start, out).map_err(|e| match e.kind() {
        std::io::ErrorKind::UnexpectedEof => TiffError::corrupt(
            path,
            Some(page),
            format_args!("the pixel data ({} bytes at offset {start}) runs past the end of the file (truncated?)", out.len()),
        ),
        _ => TiffError::io(path, e),
    })
}

/// Fills `out` from `file` at `offset` without moving the file position the
/// decoder's buffered reader relies on. `Ok(false)` where the platform has no
/// positioned read (the decoder reads the page instead).
#[cfg(unix)]
fn positioned_read(file: &File, offset: u64, out: &mut [u8]) -> std::io::Result<bool> {
    std::os::unix::fs::FileExt::read_exact_at(file, out, offset).map(|()| true)
}

#[cfg(not(unix))]
fn positioned_read(_file: &File, _offset: u64, _out: &mut [u8]) -> std::io::Result<bool> {
    Ok(false)
}

/// Decodes a tiled page tile by tile into `out` (`height` rows of `width`
/// pixels).
///
/// `read_image_bytes` would decode edge tiles row by row in pieces of the
/// visible width, and in `tiff` 0.11.3 that path fails on valid LZW tiles
/// ("no lzw end code found") when the stream's last codes are already
/// buffered. Decoding each tile with its full padded row stride reads the
/// tile in one piece, like a strip; the visible part is then copied out.
fn read_tiled(dec: &mut Dec, path: &Path, page: usize, out: &mut [u8], width: usize, height: usize) -> Result<(), TiffError> {
    let corrupt = |what: &str| TiffError::corrupt(path, Some(page), what);
    let pixel = out.len() / (width * height);
    let (tile_w, tile_h) = dec.chunk_dimensions();
    let (tile_w, tile_h) = (tile_w as usize, tile_h as usize);
    let tiles_across = width.div_ceil(tile_w);
    let tiles = guarded(path, Some(page), || dec.tile_count())? as usize;
    if tiles != tiles_across * height.div_ceil(tile_h) {
        return Err(corrupt("tile count does not match the image and tile sizes"));
    }
    let tile_row = tile_w * pixel;
    let mut buf = DecodingResult::U8(Vec::new());
    for t in 0..tiles {
        guarded(path, Some(page), || dec.read_chunk_to_buffer(&mut buf, t as u32, tile_row))?;
        let (x0, y0) = ((t % tiles_across) * tile_w, (t / tiles_across) * tile_h);
        let (w, h) = (tile_w.min(width - x0), tile_h.min(height - y0));
        let tile = buf.as_buffer(0);
        let tile = tile.as_bytes();
        for r in 0..h {
            let src = tile.get(r * tile_row..r * tile_row + w * pixel);
            let start = ((y0 + r) * width + x0) * pixel;
            let dst = out.get_mut(start..start + w * pixel);
            match (src, dst) {
                (Some(src), Some(dst)) => dst.copy_from_slice(src),
                _ => return Err(corrupt("a tile decoded to fewer bytes than its size")),
            }
        }
    }
    Ok(())
}

/// The decoder inverts `WhiteIsZero` integer pages; invert them back so the
/// stack holds the stored values (bitwise NOT is its own inverse).
fn undo_white_is_zero(stack: &mut Stack, pages: &[PageMeta]) {
    let mut z = 0;
    for page in pages.iter() {
        let planes = z..z + page.planes;
        z += page.planes;
        if !page.white_is_zero {
            continue;
        }
        for plane in planes {
            match stack {
                Stack::U8(a) => a.plane_mut(plane).iter_mut().for_each(|v| *v = !*v),
                Stack::U16(a) => a.plane_mut(plane).iter_mut().for_each(|v| *v = !*v),
                // Rejected in `page_meta`.
                Stack::F32(_) => {}
            }
        }
    }
}

/// Reads an ASCII tag of the current page as text, leniently: non-UTF-8
/// bytes are replaced, the text ends at the first NUL, a tag of a non-text
/// type counts as absent.
fn read_text_tag(dec: &mut Dec, path: &Path, tag: Tag, file_len: u64) -> Result<Option<String>, TiffError> {
    let mut ifd = dec.image_ifd();
    let Some(entry) = ifd.find_entry(tag) else {
        return Ok(None);
    };
    if !matches!(entry.field_type(), Type::ASCII | Type::BYTE | Type::UNDEFINED) {
        return Ok(None);
    }
    let len = entry.count();
    if len > file_len {
        return Err(TiffError::corrupt(path, Some(0), format_args!("tag {tag:?} claims {len} bytes but the file has only {file_len}")));
    }
    let mut bytes = vec![0u8; len as usize];
    guarded(path, Some(0), || ifd.find_tag_bytes(tag, &mut bytes, 0))?;
    if let Some(nul) = bytes.iter().position(|&b| b == 0) {
        bytes.truncate(nul);
    }
    Ok(Some(String::from_utf8_lossy(&bytes).into_owned()))
}

fn sample_format_name(format: SampleFormat) -> String {
    match format {
        SampleFormat::Uint => "unsigned integer".into(),
        SampleFormat::Int => "signed integer".into(),
        SampleFormat::IEEEFP => "floating point".into(),
        SampleFormat::Void => "untyped (void)".into(),
        other => format!("sample format {}", other.to_u16()),
    }
}

/// Lower-case names for the TIFF `Compression` tag values.
fn compression_name(code: u16) -> String {
    match code {
        1 => "none",
        2 => "ccitt-rle",
        3 => "fax3",
        4 => "fax4",
        5 => "lzw",
        6 => "jpeg-old",
        7 => "jpeg",
        8 => "deflate",
        32773 => "packbits",
        32946 => "deflate-old",
        34887 => "lerc",
        34925 => "lzma",
        50000 => "zstd",
        50001 => "webp",
        other => return format!("unknown({other})"),
    }
    .to_string()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn compression_names_cover_common_codes() {
        assert_eq!(compression_name(1), "none");
        assert_eq!(compression_name(32946), "deflate-old");
        assert_eq!(compression_name(12345), "unknown(12345)");
    }
}
