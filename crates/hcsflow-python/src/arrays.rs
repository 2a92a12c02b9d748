//! numpy arrays in and out of the engine.

use std::sync::Arc;

use hcsflow::core::{Array, HostArray, Pixel, SharedPixels, Stack, StackArray};
use numpy::{Element, PyArray3, PyArrayDyn, PyArrayMethods, PyUntypedArrayMethods};
use pyo3::prelude::*;

use crate::errors::{ArrayError, MemoryConversionError};

/// `array` as a numpy array: itself, or, for another library's array on the
/// CPU (torch, jax, ...), numpy's view of it through DLPack (no copy).
/// The one implementation is `hcsflow._memory.as_numpy`, which the
/// pipeline's conversions use too.
pub fn as_numpy<'py>(array: &Bound<'py, PyAny>) -> PyResult<Bound<'py, PyAny>> {
    let memory = array.py().import("hcsflow._memory")?;
    memory.call_method1("as_numpy", (array,)).map_err(|e| ArrayError::new_err(format!("importing the array through DLPack: {e}")))
}

/// A 3D array as a stack: a numpy array, or another library's CPU array
/// through DLPack ([`as_numpy`]); shared without a copy when it is
/// C-contiguous and aligned ([`shared_stack`]), else copied; its dtype must
/// be one hcsflow has.
pub fn stack_of(array: &Bound<'_, PyAny>) -> PyResult<Stack> {
    let array = &as_numpy(array)?;
    let shape: Vec<usize> = array.getattr("shape")?.extract()?;
    let not_3d = || ArrayError::new_err(format!("expected a 3D array [Z, Y, X], got shape {shape:?}"));
    if shape.len() != 3 {
        return Err(not_3d());
    }
    if let Some(stack) = shared_stack(array) {
        return Ok(stack);
    }
    host_array_of(array)?.into_stack().map_err(|_| not_3d())
}

/// The pixels of a numpy array, shared: the array object is kept, so its
/// buffer stays allocated for as long as the stack holds it. The engine
/// never writes them (a stack copies shared pixels before a write); Python
/// code must not write them while a call runs, as with any extension that
/// releases the GIL.
struct NumpyPixels<T> {
    _array: Py<PyAny>,
    data: *const T,
    len: usize,
}

// SAFETY: the pointer is into the buffer of `_array`, which lives as long as
// this value (the reference is counted) and which the engine only reads.
unsafe impl<T: Sync> Send for NumpyPixels<T> {}
unsafe impl<T: Sync> Sync for NumpyPixels<T> {}

impl<T: Pixel> SharedPixels<T> for NumpyPixels<T> {
    fn pixels(&self) -> &[T] {
        // SAFETY: `data` points at `len` initialised, aligned values of T
        // (checked when the value was made) kept alive by `_array`.
        unsafe { std::slice::from_raw_parts(self.data, self.len) }
    }
}

/// `array` as a stack sharing its pixels, if it is a 3D C-contiguous,
/// aligned, native-order numpy array of a dtype hcsflow has.
pub fn shared_stack(array: &Bound<'_, PyAny>) -> Option<Stack> {
    fn typed<T: Pixel + Element>(array: &Bound<'_, PyAny>) -> Option<Stack> {
        let a = array.cast::<PyArray3<T>>().ok()?;
        if !a.is_c_contiguous() {
            return None;
        }
        let readonly = a.try_readonly().ok()?;
        let pixels = readonly.as_slice().ok()?;
        let shape = a.shape();
        let shared = NumpyPixels { _array: array.clone().unbind(), data: pixels.as_ptr(), len: pixels.len() };
        let stack = StackArray::shared([shape[0], shape[1], shape[2]], Arc::new(shared)).ok()?;
        Some(Stack::from(stack))
    }
    typed::<u8>(array).or_else(|| typed::<u16>(array)).or_else(|| typed::<f32>(array))
}

/// An array of any number of axes (numpy, or another library's through
/// DLPack) as a host array (copied).
pub fn host_array_of(array: &Bound<'_, PyAny>) -> PyResult<HostArray> {
    let array = &as_numpy(array)?;
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
