//! Profile files.
//!
//! - One profile: a one-page f32 TIFF ([`write_profile`], [`read_profile`]).
//! - The MCMICRO/ASHLAR pair ([`write_ffp_dfp`], [`read_ffp_dfp`]):
//!   `<name>-ffp.tiff` (flat-fields, mean ≈ 1) and `<name>-dfp.tiff`
//!   (dark-fields in raw counts: ASHLAR divides them by the dtype's maximum
//!   itself), f32, one page per channel, as ASHLAR's `_load_single_profile`
//!   reads them: a 2D image for one channel, `(C, Y, X)` pages for several.
//!   ASHLAR (through skimage) reads a 3- or 4-page file as `(Y, X, C)` colour
//!   samples, which is not what pages are; basicpy-docker-mcmicro writes
//!   `(Z, Y, X, C)` with tifffile's shape metadata. Reading accepts pages only.

use std::path::{Path, PathBuf};

use hcsflow_core::Stack;
use hcsflow_tiff::{read_stack, write_stack, WriteOptions};
use ndarray::{Array2, Array3, Axis};

use crate::BasicError;

/// A flat-field (mean 1) and a dark-field (the images' units), same shape.
#[derive(Debug, Clone, PartialEq)]
pub struct Profiles {
    pub flatfield: Array2<f32>,
    pub darkfield: Array2<f32>,
}

impl Profiles {
    /// `(height, width)`.
    pub fn shape(&self) -> (usize, usize) {
        self.flatfield.dim()
    }

    /// A flat-field with no dark-field.
    pub fn flat_only(flatfield: Array2<f32>) -> Profiles {
        let darkfield = Array2::zeros(flatfield.dim());
        Profiles { flatfield, darkfield }
    }
}

/// The file names of the MCMICRO pair: `<dir>/<name>-ffp.tiff`, `<dir>/<name>-dfp.tiff`.
pub fn ffp_dfp_paths(dir: &Path, name: &str) -> (PathBuf, PathBuf) {
    (dir.join(format!("{name}-ffp.tiff")), dir.join(format!("{name}-dfp.tiff")))
}

/// Writes `profile` as a one-page f32 TIFF, atomically.
pub fn write_profile(path: &Path, profile: &Array2<f32>) -> Result<(), BasicError> {
    write_stack(path, &Stack::from(profile.clone().insert_axis(Axis(0))), &WriteOptions::default())?;
    Ok(())
}

/// Reads a one-page profile, which must be `expected` (`(height, width)`) in size.
pub fn read_profile(path: &Path, expected: (usize, usize)) -> Result<Array2<f32>, BasicError> {
    let pages = read_pages(path, expected)?;
    if pages.len_of(Axis(0)) != 1 {
        return Err(BasicError::ProfileContent {
            path: path.to_path_buf(),
            reason: format!("{} pages; a profile has one", pages.len_of(Axis(0))),
        });
    }
    Ok(pages.index_axis_move(Axis(0), 0))
}

/// Writes the MCMICRO/ASHLAR pair for the channels' profiles (in channel
/// order) into `dir`; returns the two paths (ffp, dfp).
pub fn write_ffp_dfp(dir: &Path, name: &str, channels: &[Profiles]) -> Result<(PathBuf, PathBuf), BasicError> {
    let Some(first) = channels.first() else {
        return Err(BasicError::Shape { reason: "no channel's profiles to write".into() });
    };
    let shape = first.shape();
    if let Some(c) = channels.iter().position(|p| p.shape() != shape || p.darkfield.dim() != shape) {
        return Err(BasicError::Shape { reason: format!("channel {c}'s profiles are not {}x{} like channel 0's", shape.0, shape.1) });
    }
    let stack = |pick: fn(&Profiles) -> &Array2<f32>| {
        let views: Vec<_> = channels.iter().map(|p| pick(p).view()).collect();
        ndarray::stack(Axis(0), &views).map(Stack::from).map_err(|e| BasicError::Shape { reason: e.to_string() })
    };
    let (ffp, dfp) = ffp_dfp_paths(dir, name);
    write_stack(&ffp, &stack(|p| &p.flatfield)?, &WriteOptions::default())?;
    write_stack(&dfp, &stack(|p| &p.darkfield)?, &WriteOptions::default())?;
    Ok((ffp, dfp))
}

/// Reads channel `channel`'s profiles from an `-ffp`/`-dfp` pair (a one-page
/// file serves every channel); `dfp = None` means no dark-field. Each must be
/// `expected` in size.
pub fn read_ffp_dfp(ffp: &Path, dfp: Option<&Path>, channel: usize, expected: (usize, usize)) -> Result<Profiles, BasicError> {
    let flatfield = channel_page(ffp, channel, expected)?;
    check_flatfield(ffp, &flatfield)?;
    let darkfield = match dfp {
        Some(path) => channel_page(path, channel, expected)?,
        None => Array2::zeros(expected),
    };
    Ok(Profiles { flatfield, darkfield })
}

/// A flat-field must be finite and positive everywhere (the correction divides by it).
pub fn check_flatfield(path: &Path, flatfield: &Array2<f32>) -> Result<(), BasicError> {
    let bad = flatfield.iter().filter(|v| !(v.is_finite() && **v > 0.0)).count();
    if bad > 0 {
        return Err(BasicError::ProfileContent {
            path: path.to_path_buf(),
            reason: format!("{bad} flat-field pixels are zero, negative or not finite; a flat-field must be positive"),
        });
    }
    Ok(())
}

fn channel_page(path: &Path, channel: usize, expected: (usize, usize)) -> Result<Array2<f32>, BasicError> {
    let pages = read_pages(path, expected)?;
    let count = pages.len_of(Axis(0));
    let index = if count == 1 { 0 } else { channel };
    if index >= count {
        return Err(BasicError::ProfileContent {
            path: path.to_path_buf(),
            reason: format!("{count} channels, channel {channel} asked for"),
        });
    }
    Ok(pages.index_axis_move(Axis(0), index))
}

/// Every page of `path` as f32, each checked to be `expected` in size.
fn read_pages(path: &Path, expected: (usize, usize)) -> Result<Array3<f32>, BasicError> {
    let stack = read_stack(path)?;
    let [_, h, w] = stack.shape();
    if (h, w) != expected {
        return Err(BasicError::ProfileSize { path: path.to_path_buf(), profile: (h, w), image: expected });
    }
    let pages = stack.to_f32();
    if pages.iter().any(|v| !v.is_finite()) {
        return Err(BasicError::ProfileContent { path: path.to_path_buf(), reason: "holds NaN or infinite values".into() });
    }
    Ok(pages)
}
