//! Plates from Python: what the engine reads of a plate folder, and its
//! images read into stacks.

use std::path::PathBuf;

use hcsflow::core::{Array, Stack};
use hcsflow::plate::{image_format, read_image, Format, ImageRecord, PlaneAt};
use pyo3::prelude::*;

use crate::arrays::numpy_of;
use crate::errors::{CompileError, HcsflowError, PlateError};

/// The plate at `path` (`format`: `imagexpress`, `operaphenix` or `None` to
/// detect it) as JSON text: format, root, descriptor, metadata, images,
/// projections, missing images and warnings, as the engine reads them.
#[pyfunction]
#[pyo3(signature = (path, format = None))]
pub fn plate_json(py: Python<'_>, path: PathBuf, format: Option<&str>) -> PyResult<String> {
    let format = format.map(|f| f.parse::<Format>().map_err(|e| CompileError::new_err(e.to_string()))).transpose()?;
    let plate =
        py.detach(|| hcsflow::plate::open_plate(&path, format)).map_err(|e| PlateError::new_err(format!("{}: {e}", path.display())))?;
    serde_json::to_string(&plate).map_err(|e| HcsflowError::new_err(format!("{}: {e}", path.display())))
}

/// The images at `paths` read into one `[Z, Y, X]` numpy array. `at[k]` is
/// the JSON of image k's place in its file (`ImageRecord::at`: a page of an
/// OME-TIFF, a plane of an OME-Zarr array), `None` for a one-plane file.
/// One-plane files are read in parallel straight into the result; planes of
/// containers one by one, each checked against the first image's format.
#[pyfunction]
#[pyo3(signature = (paths, at = None))]
pub fn read_stack<'py>(py: Python<'py>, paths: Vec<PathBuf>, at: Option<Vec<Option<String>>>) -> PyResult<Bound<'py, PyAny>> {
    let at: Vec<Option<PlaneAt>> = at
        .unwrap_or_default()
        .iter()
        .map(|a| a.as_deref().map(serde_json::from_str).transpose())
        .collect::<Result<_, _>>()
        .map_err(|e| HcsflowError::new_err(format!("read_stack: not an image location: {e}")))?;
    let stack = py
        .detach(|| -> Result<Stack, String> {
            if at.iter().all(Option::is_none) {
                return hcsflow::tiff::read_stacks(&paths).map_err(|e| e.to_string());
            }
            let records: Vec<ImageRecord> = paths
                .iter()
                .zip(at.iter().chain(std::iter::repeat(&None)))
                .map(|(path, at)| ImageRecord {
                    well: String::new(),
                    site: 0,
                    channel: 0,
                    z_index: 0,
                    timepoint: 0,
                    path: path.clone(),
                    at: at.clone(),
                })
                .collect();
            let first = records.first().ok_or("read_stack: no images")?;
            let (h, w, dtype, _) = image_format(first).map_err(|e| e.to_string())?;
            let planes = records
                .iter()
                .map(|r| read_image(&r.path, r.at.as_ref(), (h, w, dtype)))
                .collect::<Result<Vec<Stack>, _>>()
                .map_err(|e| e.to_string())?;
            Stack::concat_owned(planes).ok_or_else(|| "read_stack: no images".to_string())
        })
        .map_err(PlateError::new_err)?;
    numpy_of(py, Array::from(stack))
}
