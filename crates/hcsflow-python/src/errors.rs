//! The exceptions of the package, one base class and a subclass per kind
//! of problem, chosen from an error's type, never from its text.

use hcsflow::core::{ConversionError, SliceError};
use hcsflow::{Error, ErrorKind};
use pyo3::exceptions::PyException;
use pyo3::prelude::*;

pyo3::create_exception!(_hcsflow, HcsflowError, PyException, "Base class of every error hcsflow raises.");
pyo3::create_exception!(
    _hcsflow,
    CompileError,
    HcsflowError,
    "The request is wrong (pipeline, function, arguments, options): found before any pixel is read."
);
pyo3::create_exception!(_hcsflow, DeviceUnavailableError, HcsflowError, "The device asked for is not available on this machine.");
pyo3::create_exception!(_hcsflow, PlateError, HcsflowError, "The plate cannot be opened or read.");
pyo3::create_exception!(_hcsflow, FunctionError, HcsflowError, "A function failed on its input.");
pyo3::create_exception!(
    _hcsflow,
    MemoryConversionError,
    CompileError,
    "No conversion the policy allows brings the data between two memory types; see its source_type, target_type, method and reason."
);
pyo3::create_exception!(_hcsflow, ArrayError, HcsflowError, "An array given to hcsflow is not a stack it can take (shape, dtype).");

/// The Python exception for an engine error, chosen by the error's type.
pub fn to_py(py: Python<'_>, error: Error) -> PyErr {
    let text = error.to_string();
    if let Some(c) = conversion_of(&error) {
        return conversion_error(py, text, c);
    }
    match &error {
        Error::Plate { .. } => PlateError::new_err(text),
        Error::Function(_) => FunctionError::new_err(text),
        _ => match error.kind() {
            ErrorKind::Usage => CompileError::new_err(text),
            ErrorKind::DeviceUnavailable => DeviceUnavailableError::new_err(text),
            _ => HcsflowError::new_err(text),
        },
    }
}

/// The conversion an engine error is about, if it is one.
fn conversion_of(error: &Error) -> Option<&ConversionError> {
    match error {
        Error::Route(c) | Error::ToHost { error: c, .. } => Some(c),
        Error::Pipeline(e) => e.conversion(),
        _ => None,
    }
}

/// A `MemoryConversionError` with the conversion's `source_type`,
/// `target_type`, `method` and `reason` as attributes.
pub fn conversion_error(py: Python<'_>, text: String, c: &ConversionError) -> PyErr {
    let e = MemoryConversionError::new_err(text);
    let value = e.value(py);
    for (name, v) in
        [("source_type", c.from.to_string()), ("target_type", c.to.to_string()), ("method", c.method.clone()), ("reason", c.reason.clone())]
    {
        // Setting attributes on a fresh exception instance cannot fail in practice; if it did, the message still says it all.
        let _ = value.setattr(name, v);
    }
    e
}

/// A `SliceError` as the Python exception for its kind.
pub fn slice_error(py: Python<'_>, e: SliceError) -> PyErr {
    match &e {
        SliceError::Conversion(c) => conversion_error(py, e.to_string(), c),
        SliceError::BadDevice { .. } => DeviceUnavailableError::new_err(e.to_string()),
        _ => ArrayError::new_err(e.to_string()),
    }
}
