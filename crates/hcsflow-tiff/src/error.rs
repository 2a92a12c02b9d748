//! The error type of this crate and the mapping from the `tiff` crate's errors.

use std::io;
use std::path::{Path, PathBuf};

use crate::PlaneFormat;

/// Everything that can go wrong reading or writing a TIFF file.
///
/// Every variant carries the path of the file concerned, so a message from
/// deep inside a plate run still says which of thousands of files was bad.
/// Malformed input of any kind (garbage, truncation, inconsistent tags) is
/// reported as [`NotTiff`](TiffError::NotTiff) or
/// [`Corrupt`](TiffError::Corrupt), never as a panic.
#[derive(Debug, thiserror::Error)]
pub enum TiffError {
    /// The operating system refused an operation (open, read, create, rename…).
    #[error("{path}: I/O error: {source}")]
    Io {
        path: PathBuf,
        #[source]
        source: io::Error,
    },
    /// The file has zero bytes.
    #[error("{path}: empty file (0 bytes), not a TIFF")]
    Empty { path: PathBuf },
    /// The file does not start with a TIFF or BigTIFF header.
    #[error("{path}: not a TIFF file: {message}")]
    NotTiff { path: PathBuf, message: String },
    /// The file starts like a TIFF but its structure or pixel data is broken
    /// or truncated. `message` is the decoder's explanation, prefixed with
    /// the page (IFD index) where known.
    #[error("{path}: corrupt or truncated TIFF: {message}")]
    Corrupt { path: PathBuf, message: String },
    /// A well-formed TIFF this crate does not read: a sample format, bit
    /// depth, samples-per-pixel count, compression or photometric
    /// interpretation outside u8/u16/f32 single-channel grayscale.
    #[error("{path}: page {page}: unsupported: {what}")]
    Unsupported { path: PathBuf, page: usize, what: String },
    /// A page whose size or dtype differs from page 0, so the pages cannot
    /// form one `[Z, Y, X]` stack.
    #[error("{path}: page {page} is {found} but page 0 is {expected}; all pages of a stack must share size and dtype")]
    PageMismatch { path: PathBuf, page: usize, expected: String, found: String },
    /// [`read_stacks`](crate::read_stacks): a file whose pages differ in size
    /// or dtype from the first file's, so they cannot share one stack.
    #[error("{path} is {found} but {first} is {expected}; all files of a stack must share size and dtype")]
    FileMismatch { path: PathBuf, first: PathBuf, expected: String, found: String },
    /// The path is not a regular file: a FIFO, socket, character or block
    /// device, or directory. It is refused right after a non-blocking open,
    /// so a FIFO named like an image cannot block the reader. `kind` names
    /// what it is ([`file_kind`](crate::file_kind): "a FIFO (named pipe)", "a folder"…).
    #[error("{path}: is {kind}, not a regular file")]
    NotRegularFile { path: PathBuf, kind: &'static str },
    /// [`read_stack_expecting`](crate::read_stack_expecting) and
    /// [`read_stacks_expecting`](crate::read_stacks_expecting): a page whose
    /// tags give another size or dtype than the caller expects. Found from
    /// the page's header (IFD) before any pixel of the file is decoded.
    #[error("{path}: page {page} is {found} but {expected} was expected")]
    FormatMismatch { path: PathBuf, page: usize, expected: PlaneFormat, found: PlaneFormat },
    /// [`read_stack_expecting`](crate::read_stack_expecting) and
    /// [`read_stacks_expecting`](crate::read_stacks_expecting): a file with
    /// another number of pages than the caller expects, counted from the IFD
    /// chain before any pixel is decoded.
    #[error("{path}: {found} pages but {expected} expected")]
    PageCount { path: PathBuf, expected: usize, found: usize },
    /// [`read_stacks`](crate::read_stacks) was given no files.
    #[error("no TIFF files to read")]
    NoFiles,
    /// The decoded pixels would not fit in memory (or in `usize`).
    #[error("{path}: {what} needs {bytes} bytes, which cannot be allocated")]
    TooLarge { path: PathBuf, what: String, bytes: u128 },
    /// `write_stack` was asked for something a TIFF cannot hold (an empty
    /// stack, a dimension above 2^32-1, a non-positive pixel size, a tag that
    /// collides with the image structure, a string with a NUL byte…). Nothing
    /// was written.
    #[error("{path}: cannot write: {reason}")]
    InvalidWrite { path: PathBuf, reason: String },
}

impl TiffError {
    /// The file the error is about (empty for [`TiffError::NoFiles`]).
    pub fn path(&self) -> &Path {
        match self {
            TiffError::Io { path, .. }
            | TiffError::Empty { path }
            | TiffError::NotTiff { path, .. }
            | TiffError::Corrupt { path, .. }
            | TiffError::Unsupported { path, .. }
            | TiffError::PageMismatch { path, .. }
            | TiffError::FileMismatch { path, .. }
            | TiffError::NotRegularFile { path, .. }
            | TiffError::FormatMismatch { path, .. }
            | TiffError::PageCount { path, .. }
            | TiffError::TooLarge { path, .. }
            | TiffError::InvalidWrite { path, .. } => path,
            TiffError::NoFiles => Path::new(""),
        }
    }

    pub(crate) fn io(path: &Path, source: io::Error) -> Self {
        TiffError::Io { path: path.to_path_buf(), source }
    }

    pub(crate) fn corrupt(path: &Path, page: Option<usize>, message: impl std::fmt::Display) -> Self {
        TiffError::Corrupt { path: path.to_path_buf(), message: with_page(page, message) }
    }

    pub(crate) fn invalid_write(path: &Path, reason: impl Into<String>) -> Self {
        TiffError::InvalidWrite { path: path.to_path_buf(), reason: reason.into() }
    }

    /// Classifies an error of the `tiff` decoder met while reading `path`.
    ///
    /// I/O errors from the decoder are mostly not I/O failures: an unexpected
    /// end of file means the file is truncated, and invalid-data errors come
    /// from the decompressors. Only the remaining kinds are real I/O errors.
    pub(crate) fn from_decoder(path: &Path, page: Option<usize>, e: tiff::TiffError) -> Self {
        use tiff::{TiffError as E, TiffFormatError as F};
        match e {
            E::IoError(io) => match io.kind() {
                io::ErrorKind::UnexpectedEof => Self::corrupt(path, page, format_args!("truncated (unexpected end of file: {io})")),
                io::ErrorKind::InvalidData | io::ErrorKind::InvalidInput | io::ErrorKind::Other => Self::corrupt(path, page, io),
                _ => Self::io(path, io),
            },
            E::FormatError(f @ (F::TiffSignatureNotFound | F::TiffSignatureInvalid)) if page.is_none() => {
                TiffError::NotTiff { path: path.to_path_buf(), message: f.to_string() }
            }
            E::UnsupportedError(u) => TiffError::Unsupported { path: path.to_path_buf(), page: page.unwrap_or(0), what: u.to_string() },
            E::LimitsExceeded => Self::corrupt(
                path,
                page,
                "a strip or tile needs a buffer beyond the decoder limits (far larger than the image it belongs to)",
            ),
            other => Self::corrupt(path, page, other),
        }
    }
}

fn with_page(page: Option<usize>, message: impl std::fmt::Display) -> String {
    match page {
        Some(p) => format!("page {p}: {message}"),
        None => message.to_string(),
    }
}
