//! The TIFF calls the plate readers and the synthetic generator need.
//!
//! This module mirrors the API of `hcsflow-tiff` (`read_info`, `read_stack`,
//! `write_stack`, `TiffInfo`, `WriteOptions`) so that the plate code is written
//! against that contract. Until that crate's implementation lands, the calls are
//! served by a small backend on the `tiff` crate here; switching means replacing
//! the bodies below with re-exports and nothing else changes.
//!
//! Scope of this backend: single-sample grayscale u8/u16/f32, uncompressed
//! writes, first page read. That is all the plate code uses.

use std::fs::File;
use std::io::{BufReader, BufWriter, Write};
use std::path::{Path, PathBuf};

use hcsflow_core::{DType, Stack};
use ndarray::Array3;
use tiff::decoder::{Decoder, DecodingResult};
use tiff::encoder::{colortype, TiffEncoder, TiffValue};
use tiff::tags::Tag;

/// A TIFF operation failed; names the file.
#[derive(Debug, thiserror::Error)]
#[error("TIFF {path}: {message}")]
pub struct TiffIoError {
    pub path: PathBuf,
    pub message: String,
}

fn err(path: &Path, message: impl std::fmt::Display) -> TiffIoError {
    TiffIoError { path: path.to_path_buf(), message: message.to_string() }
}

/// Header facts of a TIFF file (same fields as `hcsflow_tiff::TiffInfo`).
#[derive(Debug, Clone, PartialEq)]
pub struct TiffInfo {
    pub pages: usize,
    pub width: u32,
    pub height: u32,
    pub dtype: DType,
    /// The ImageDescription tag of the first page.
    pub description: Option<String>,
    pub compression: String,
}

/// Options for [`write_stack`] (same fields as `hcsflow_tiff::WriteOptions`;
/// this backend writes uncompressed only).
#[derive(Debug, Clone, Default, PartialEq)]
pub struct WriteOptions {
    pub description: Option<String>,
    pub pixel_size_um: Option<f64>,
    /// Extra ASCII tags, e.g. (65500, Harmony XML) on Phenix images.
    pub extra_ascii_tags: Vec<(u16, String)>,
}

fn open_decoder(path: &Path) -> Result<Decoder<BufReader<File>>, TiffIoError> {
    let f = File::open(path).map_err(|e| err(path, e))?;
    Decoder::new(BufReader::new(f)).map_err(|e| err(path, e))
}

fn dtype_of(path: &Path, dec: &mut Decoder<BufReader<File>>) -> Result<DType, TiffIoError> {
    match dec.colortype().map_err(|e| err(path, e))? {
        tiff::ColorType::Gray(8) => Ok(DType::U8),
        tiff::ColorType::Gray(16) => Ok(DType::U16),
        tiff::ColorType::Gray(32) => Ok(DType::F32),
        other => Err(err(path, format!("unsupported pixel layout {other:?}"))),
    }
}

/// Reads the header facts of `path` (first page, page count).
pub fn read_info(path: &Path) -> Result<TiffInfo, TiffIoError> {
    let mut dec = open_decoder(path)?;
    let (width, height) = dec.dimensions().map_err(|e| err(path, e))?;
    let dtype = dtype_of(path, &mut dec)?;
    let description = match dec.find_tag(Tag::ImageDescription).map_err(|e| err(path, e))? {
        Some(v) => Some(v.into_string().map_err(|e| err(path, e))?),
        None => None,
    };
    let compression = match dec.find_tag_unsigned::<u16>(Tag::Compression) {
        Ok(Some(1)) | Ok(None) => "none".to_string(),
        Ok(Some(5)) => "lzw".to_string(),
        Ok(Some(8)) | Ok(Some(32946)) => "deflate".to_string(),
        Ok(Some(32773)) => "packbits".to_string(),
        Ok(Some(c)) => format!("code {c}"),
        Err(e) => return Err(err(path, e)),
    };
    let mut pages = 1;
    while dec.more_images() {
        dec.next_image().map_err(|e| err(path, e))?;
        pages += 1;
    }
    Ok(TiffInfo { pages, width, height, dtype, description, compression })
}

/// Reads the first page of `path` as a one-plane stack.
pub fn read_stack(path: &Path) -> Result<Stack, TiffIoError> {
    let mut dec = open_decoder(path)?;
    let (w, h) = dec.dimensions().map_err(|e| err(path, e))?;
    let shape = (1, h as usize, w as usize);
    let bad = |e: ndarray::ShapeError| err(path, e);
    match dec.read_image().map_err(|e| err(path, e))? {
        DecodingResult::U8(v) => Ok(Stack::U8(Array3::from_shape_vec(shape, v).map_err(bad)?)),
        DecodingResult::U16(v) => Ok(Stack::U16(Array3::from_shape_vec(shape, v).map_err(bad)?)),
        DecodingResult::F32(v) => Ok(Stack::F32(Array3::from_shape_vec(shape, v).map_err(bad)?)),
        _ => Err(err(path, "unsupported sample format")),
    }
}

/// Writes `stack` (one page per plane) to `path` atomically: a temporary file in
/// the same folder is renamed over `path` only once it is complete.
pub fn write_stack(path: &Path, stack: &Stack, options: &WriteOptions) -> Result<(), TiffIoError> {
    let dir = path.parent().unwrap_or(Path::new("."));
    let name = path.file_name().map(|n| n.to_string_lossy().into_owned()).unwrap_or_default();
    let tmp = dir.join(format!(".{name}.partial-{}", std::process::id()));
    let result = write_file(&tmp, stack, options).and_then(|_| {
        std::fs::rename(&tmp, path).map_err(|e| err(path, format!("rename failed: {e}")))
    });
    if result.is_err() {
        let _ = std::fs::remove_file(&tmp);
    }
    result.map_err(|mut e| {
        e.path = path.to_path_buf();
        e
    })
}

fn write_file(tmp: &Path, stack: &Stack, options: &WriteOptions) -> Result<(), TiffIoError> {
    let f = File::create(tmp).map_err(|e| err(tmp, e))?;
    let mut w = BufWriter::new(f);
    {
        let mut enc = TiffEncoder::new(&mut w).map_err(|e| err(tmp, e))?;
        let [depth, h, wd] = stack.shape();
        for z in 0..depth {
            match stack {
                Stack::U8(a) => page::<colortype::Gray8, _>(&mut enc, a, z, wd, h, options, tmp)?,
                Stack::U16(a) => page::<colortype::Gray16, _>(&mut enc, a, z, wd, h, options, tmp)?,
                Stack::F32(a) => {
                    page::<colortype::Gray32Float, _>(&mut enc, a, z, wd, h, options, tmp)?
                }
            }
        }
    }
    w.flush().map_err(|e| err(tmp, e))?;
    Ok(())
}

fn page<C, W>(
    enc: &mut TiffEncoder<W>,
    a: &Array3<C::Inner>,
    z: usize,
    width: usize,
    height: usize,
    options: &WriteOptions,
    path: &Path,
) -> Result<(), TiffIoError>
where
    C: colortype::ColorType,
    C::Inner: Copy,
    [C::Inner]: TiffValue,
    W: std::io::Write + std::io::Seek,
{
    let plane: Vec<C::Inner> = a.index_axis(ndarray::Axis(0), z).iter().copied().collect();
    let mut img = enc.new_image::<C>(width as u32, height as u32).map_err(|e| err(path, e))?;
    if let Some(d) = &options.description {
        img.encoder().write_tag(Tag::ImageDescription, d.as_str()).map_err(|e| err(path, e))?;
    }
    for (tag, value) in &options.extra_ascii_tags {
        img.encoder().write_tag(Tag::Unknown(*tag), value.as_str()).map_err(|e| err(path, e))?;
    }
    if let Some(px) = options.pixel_size_um.filter(|p| *p > 0.0) {
        // pixels per centimetre, as a rational with micro-precision
        let per_cm = 10_000.0 / px;
        let r = tiff::encoder::Rational { n: (per_cm * 1000.0).round() as u32, d: 1000 };
        img.resolution(tiff::tags::ResolutionUnit::Centimeter, r);
    }
    img.write_data(&plane).map_err(|e| err(path, e))
}
