//! numpy arrays in and out of the engine.

use hcsflow::core::{Array, HostArray, Stack};
use numpy::{PyArrayDyn, PyArrayMethods};
use pyo3::prelude::*;

use crate::errors::{ArrayError, MemoryConversionError};

/// A 3D numpy array as a stack (copied); its dtype must be one hcsflow has.
pub fn stack_of(array: &Bound<'_, PyAny>) -> PyResult<Stack> {
    let shape: Vec<usize> = array.getattr("shape")?.extract()?;
    let not_3d = || ArrayError::new_err(format!("expected a 3D array [Z, Y, X], got shape {shape:?}"));
    if shape.len() != 3 {
        return Err(not_3d());
    }
    host_array_of(array)?.into_stack().map_err(|_| not_3d())
}

/// A numpy array of any number of axes as a host array (copied).
pub fn host_array_of(array: &Bound<'_, PyAny>) -> PyResult<HostArray> {
    if let Ok(a) = array.cast::<PyArrayDyn<u8>>() {
        return Ok(HostArray::from(a.readonly().as_array().to_owned()));
    }
    if let Ok(a) = array.cast::<PyArrayDyn<u16>>() {
        return Ok(HostArray::from(a.readonly().as_array().to_owned()));
    }
    if let Ok(a) = array.cast::<PyArrayDyn<f32>>() {
        return Ok(HostArray::from(a.readonly().as_array().to_owned()));
    }
    let dtype = array.getattr("dtype").and_then(|d| d.str().map(|s| s.to_string())).unwrap_or_else(|_| "unknown".into());
    Err(ArrayError::new_err(format!("dtype {dtype} is not one hcsflow takes: uint8, uint16 or float32")))
}

/// An engine array as a Python object: host memory as a numpy array owning
/// its buffer (moved, not copied); an array of a Python library as itself.
pub fn numpy_of(py: Python<'_>, array: Array) -> PyResult<Bound<'_, PyAny>> {
    match array {
        Array::Host(HostArray::U8(a)) => Ok(PyArrayDyn::from_owned_array(py, a).into_any()),
        Array::Host(HostArray::U16(a)) => Ok(PyArrayDyn::from_owned_array(py, a).into_any()),
        Array::Host(HostArray::F32(a)) => Ok(PyArrayDyn::from_owned_array(py, a).into_any()),
        Array::Device(b) => match crate::python_functions::PythonArray::object(py, b.as_ref()) {
            Some(object) => Ok(object),
            None => Err(MemoryConversionError::new_err(format!("the result is {} memory, which Python cannot hold", b.memory_type()))),
        },
    }
}
