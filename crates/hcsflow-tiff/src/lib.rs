//! TIFF reading and writing of hcsflow [`Stack`]s.
//!
//! Microscopy cameras and HCS instruments write grayscale TIFFs: one plane
//! per file or many planes (z, channels, timepoints) as pages of one file.
//! This crate maps between such files and a `[Z, Y, X]` [`Stack`]:
//!
//! - [`read_stack`]: every page of a file becomes one plane. Pages must share
//!   width, height and dtype. Supported: u8, u16 and f32 single-sample
//!   grayscale, and pages whose samples are stored as separate planes
//!   (`PlanarConfiguration` 2, in strips: one plane per sample, in order);
//!   strips or tiles; uncompressed, LZW, Deflate (Adobe and old
//!   style) and PackBits; horizontal and floating-point predictors; either
//!   byte order; classic TIFF and BigTIFF. (Other codecs of the `tiff` crate,
//!   such as JPEG, may decode but are not tested.)
//! - [`read_stacks`]: several files into one stack, read in parallel
//!   straight into it (the tiles of a grid, one-plane-per-file z-stacks).
//! - [`read_stack_expecting`], [`read_stacks_expecting`]: the same, for
//!   files whose plane size and dtype (and page count) the caller knows, as
//!   a plate does: every page's tags are checked against it before any pixel
//!   is decoded, and decoding is budgeted to it, so a small file claiming a
//!   huge image costs nothing.
//! - [`read_page_expecting`]: one page of a multi-page file (a plane of an
//!   OME-TIFF), checked and budgeted the same way.
//! - [`read_info`]: page count, size, dtype, description and compression
//!   without decoding pixels.
//! - [`write_stack`]: one page per plane, optionally Deflate-compressed, with
//!   a description, pixel size and extra ASCII tags (e.g. Harmony's tag 65500).
//!   Writes are atomic: a temporary file in the target directory is renamed
//!   over the target only once complete.
//!
//! Malformed input never panics; every error names the file ([`TiffError`]).
//! Files are opened without blocking and read only if regular, so a FIFO
//! named like an image is an error, not a hang.

mod descriptions;
mod error;
mod read;
mod write;

pub use error::TiffError;
pub use read::{
    file_kind, read_info, read_page_expecting, read_stack, read_stack_expecting, read_stacks, read_stacks_expecting, Expected, PlaneFormat,
    TiffInfo,
};
pub use write::{write_stack, Compression, WriteOptions};

pub use hcsflow_core::{DType, Stack};

// Not called directly: depending on flate2 with its `zlib-rs` feature makes
// the `tiff` crate's Deflate use zlib-rs instead of miniz_oxide (about six
// times faster at level 6, and faster to decode).
use flate2 as _;
