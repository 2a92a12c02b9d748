//! Plates from Python: what the engine reads of a plate folder, and its
//! images read into stacks.

use std::path::PathBuf;

use hcsflow::core::Array;
use hcsflow::plate::Format;
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

/// The images at `paths` (TIFF files, one plane or more each) read into one
/// `[Z, Y, X]` numpy array, files in parallel, each pixel written once.
#[pyfunction]
pub fn read_stack<'py>(py: Python<'py>, paths: Vec<PathBuf>) -> PyResult<Bound<'py, PyAny>> {
    let stack = py.detach(|| hcsflow::tiff::read_stacks(&paths)).map_err(|e| PlateError::new_err(e.to_string()))?;
    numpy_of(py, Array::from(stack))
}
