//! The pixels of a plate's image, wherever the plate keeps them: a one-plane
//! TIFF file, a page of a multi-page TIFF ([`PlaneAt::TiffPage`], OME-TIFF),
//! or a plane of an OME-Zarr field array ([`PlaneAt::Zarr`]).
//! Every reader of plate images (the pipeline, the Python package, `verify`)
//! goes through here, so a new container is one match arm.

use std::path::Path;

use hcsflow_core::{DType, Stack};
use hcsflow_tiff::{Expected, PlaneFormat, TiffError};
use hcsflow_zarr::ZarrError;

use crate::{ImageRecord, PlaneAt};

/// Why an image's pixels could not be read; each variant's text names the file.
#[derive(Debug, thiserror::Error)]
pub enum ImageError {
    #[error(transparent)]
    Tiff(#[from] TiffError),
    #[error(transparent)]
    Zarr(#[from] ZarrError),
}

/// The plane of `path` at `at` (see [`ImageRecord`]) as a `[1, Y, X]` stack
/// that must be `expected` (height, width, dtype): a TIFF file must be one
/// page of that format, checked from its tags before its pixels are decoded;
/// a Zarr array's planes must be of that format, checked from its metadata.
pub fn read_image(path: &Path, at: Option<&PlaneAt>, expected: (usize, usize, DType)) -> Result<Stack, ImageError> {
    let (h, w, dtype) = expected;
    match at {
        None => Ok(hcsflow_tiff::read_stack_expecting(path, Expected::one_plane(PlaneFormat::new(h, w, dtype)))?),
        Some(PlaneAt::TiffPage { page }) => Ok(hcsflow_tiff::read_page_expecting(path, *page as usize, PlaneFormat::new(h, w, dtype))?),
        Some(PlaneAt::Zarr { index }) => Ok(hcsflow_zarr::read_plane(path, index, Some(expected))?),
    }
}

/// The plane height, width and dtype of `image`, from its file's header
/// (page 0's: an OME-TIFF's pages share one format, which [`read_image`]
/// checks) or array's metadata, no pixels decoded; and the image's page
/// count: a one-plane file's (which must be 1), 1 for a plane inside a container.
pub fn image_format(image: &ImageRecord) -> Result<(usize, usize, DType, usize), ImageError> {
    match &image.at {
        None | Some(PlaneAt::TiffPage { .. }) => {
            let info = hcsflow_tiff::read_info(&image.path)?;
            let pages = if image.at.is_none() { info.pages } else { 1 };
            Ok((info.height, info.width, info.dtype, pages))
        }
        Some(PlaneAt::Zarr { .. }) => {
            let (h, w, dtype) = hcsflow_zarr::plane_format(&image.path)?;
            Ok((h, w, dtype, 1))
        }
    }
}
