//! `hcsflow._hcsflow`: the native half of the `hcsflow` Python package, a thin
//! front end over the engine facade ([`hcsflow::Engine`]), as the CLI is.
//!
//! Contract (first slice of the Python package):
//! - [`call`]: one registered function on a 3D numpy array (`uint8`,
//!   `uint16`, `float32`; `[Z, Y, X]`), arguments as keyword values, the
//!   result a new numpy array that owns the engine's output buffer (moved,
//!   not copied). The input is copied into a stack for now.
//! - [`run`]: plate + pipeline file + output folder, as `hcsflow run`;
//!   `dry_run` returns the plan text; otherwise the run's summary as JSON
//!   text (the Python side parses it). The GIL is released while wells run.
//! - Every engine error is raised as a subclass of `HcsflowError` chosen from
//!   the error's type ([`hcsflow::Error`]), never from its text.

use std::path::PathBuf;
use std::sync::atomic::AtomicBool;
use std::sync::{Arc, OnceLock};

use hcsflow::core::{
    Array, ConversionPolicy, DTypePolicy, Device, DeviceRequest, HostArray, MemoryType, Runtime, SliceError, Stack, StackShape,
};
use hcsflow::pipeline::Progress;
use hcsflow::{DeviceOptions, Engine, Error, ErrorKind, RunOptions};
use numpy::{PyArrayDyn, PyArrayMethods};
use pyo3::exceptions::PyException;
use pyo3::prelude::*;
use pyo3::types::{PyBool, PyDict, PyList, PyTuple};

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

/// The engine of this process: the built-in functions and converters,
/// assembled on first use and shared by every call.
fn engine() -> &'static Engine {
    static ENGINE: OnceLock<Engine> = OnceLock::new();
    ENGINE.get_or_init(Engine::builtin)
}

/// The Python exception for an engine error, chosen by the error's type.
fn to_py(py: Python<'_>, error: Error) -> PyErr {
    let text = error.to_string();
    match &error {
        Error::Route(c) | Error::ToHost { error: c, .. } => conversion_error(py, text, c),
        Error::Plate { .. } => PlateError::new_err(text),
        Error::Function(_) => FunctionError::new_err(text),
        _ => match error.kind() {
            ErrorKind::Usage => CompileError::new_err(text),
            ErrorKind::DeviceUnavailable => DeviceUnavailableError::new_err(text),
            _ => HcsflowError::new_err(text),
        },
    }
}

/// A `MemoryConversionError` with the conversion's `source_type`,
/// `target_type`, `method` and `reason` as attributes.
fn conversion_error(py: Python<'_>, text: String, c: &hcsflow::core::ConversionError) -> PyErr {
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

/// The device options of a call or run from the keyword arguments.
fn device_options(device: &str, allow_software_gpu: bool, allow_host_round_trip: bool) -> PyResult<DeviceOptions> {
    let request: DeviceRequest = device.parse().map_err(|e: hcsflow::core::BadDevice| CompileError::new_err(e.to_string()))?;
    Ok(DeviceOptions { request, allow_software_gpu, allow_host_round_trip })
}

/// A keyword argument as the `name=value` text the registry parses (the
/// same grammar as `hcsflow apply --arg`): booleans `true`/`false`, lists
/// comma-separated, anything else its `str()`.
fn arg_text(name: &str, value: &Bound<'_, PyAny>) -> PyResult<String> {
    let text = if value.is_instance_of::<PyBool>() {
        if value.extract::<bool>()? {
            "true".to_string()
        } else {
            "false".to_string()
        }
    } else if value.is_instance_of::<PyList>() || value.is_instance_of::<PyTuple>() {
        let items: Vec<String> = value.try_iter()?.map(|v| v.and_then(|v| v.str().map(|s| s.to_string()))).collect::<PyResult<_>>()?;
        items.join(",")
    } else {
        value.str()?.to_string()
    };
    Ok(format!("{name}={text}"))
}

/// A 3D numpy array as a stack (copied); its dtype must be one hcsflow has.
fn stack_of(array: &Bound<'_, PyAny>) -> PyResult<Stack> {
    let shape: Vec<usize> = array.getattr("shape")?.extract()?;
    let not_3d = || ArrayError::new_err(format!("expected a 3D array [Z, Y, X], got shape {shape:?}"));
    if shape.len() != 3 {
        return Err(not_3d());
    }
    host_array_of(array)?.into_stack().map_err(|_| not_3d())
}

/// The names of every function this build has.
#[pyfunction]
fn function_names() -> Vec<&'static str> {
    engine().registry().functions().map(|f| f.spec.name).collect()
}

/// Every function with its doc, contract, memory types, arguments and
/// artifacts, as JSON text (the `hcsflow functions --json` format).
#[pyfunction]
fn catalogue_json() -> PyResult<String> {
    serde_json::to_string(&engine().catalogue()).map_err(|e| HcsflowError::new_err(format!("listing the functions: {e}")))
}

/// A run's progress event as the dict a Python callback receives.
fn event_dict<'py>(py: Python<'py>, event: &Progress<'_>) -> PyResult<Bound<'py, PyDict>> {
    let d = PyDict::new(py);
    match event {
        Progress::Skipped { well } => {
            d.set_item("event", "skipped")?;
            d.set_item("well", *well)?;
        }
        Progress::Started { well } => {
            d.set_item("event", "started")?;
            d.set_item("well", *well)?;
        }
        Progress::StepStarted { well, step, index, steps } => {
            d.set_item("event", "step")?;
            d.set_item("well", *well)?;
            d.set_item("step", *step)?;
            d.set_item("index", *index)?;
            d.set_item("steps", *steps)?;
        }
        Progress::Finished { well, done, total, seconds, error } => {
            d.set_item("event", "finished")?;
            d.set_item("well", *well)?;
            d.set_item("done", *done)?;
            d.set_item("total", *total)?;
            d.set_item("seconds", *seconds)?;
            d.set_item("error", *error)?;
        }
    }
    Ok(d)
}

/// Runs the registered function `name` on `array` (3D) with keyword
/// arguments, on `device` (`"cpu"` by default), and returns the result.
#[pyfunction]
#[pyo3(signature = (name, array, *, device = "cpu", allow_software_gpu = false, allow_host_round_trip = false, **kwargs))]
fn call<'py>(
    py: Python<'py>,
    name: &str,
    array: &Bound<'py, PyAny>,
    device: &str,
    allow_software_gpu: bool,
    allow_host_round_trip: bool,
    kwargs: Option<&Bound<'py, PyDict>>,
) -> PyResult<Bound<'py, PyAny>> {
    let engine = engine();
    let mut args = Vec::new();
    if let Some(kwargs) = kwargs {
        for (k, v) in kwargs.iter() {
            args.push(arg_text(&k.extract::<String>()?, &v)?);
        }
    }
    let options = device_options(device, allow_software_gpu, allow_host_round_trip)?;
    let prepared = engine.plan_call(name, &args, &options).map_err(|e| to_py(py, e))?;
    let stack = stack_of(array)?;
    let [z, y, x] = stack.shape();
    engine.check_call(&prepared, &StackShape::new(z, y, x)).map_err(|e| to_py(py, e))?;
    let out = py.detach(|| engine.run_call(&prepared, stack, DTypePolicy::default()).map_err(Box::new)).map_err(|e| to_py(py, *e))?;
    numpy_of(py, Array::from(out))
}

/// `hcsflow run PLATE PIPELINE OUT` from Python: the plan text with
/// `dry_run`, else the run summary as JSON text. Wells that fail are in the
/// summary (`failed`), not raised.
#[pyfunction]
#[pyo3(signature = (plate, pipeline, out, *, device = "auto", workers = None, resume = false, overwrite = false, dry_run = false, allow_software_gpu = false, allow_host_round_trip = false, progress = None))]
#[allow(clippy::too_many_arguments)] // one Python keyword each, as the CLI's flags
fn run(
    py: Python<'_>,
    plate: PathBuf,
    pipeline: PathBuf,
    out: PathBuf,
    device: &str,
    workers: Option<usize>,
    resume: bool,
    overwrite: bool,
    dry_run: bool,
    allow_software_gpu: bool,
    allow_host_round_trip: bool,
    progress: Option<Py<PyAny>>,
) -> PyResult<String> {
    let engine = engine();
    let mut options = RunOptions {
        device: device_options(device, allow_software_gpu, allow_host_round_trip)?,
        resume,
        overwrite,
        ..RunOptions::default()
    };
    if let Some(w) = workers {
        options.workers = w;
    }
    let plan = py.detach(|| engine.plan(&plate, &pipeline, &out, &options).map_err(Box::new)).map_err(|e| to_py(py, *e))?;
    if dry_run {
        return Ok(hcsflow::plan_text(&plan));
    }
    let cancel = Arc::new(AtomicBool::new(false));
    // Each event takes the GIL for the callback only; an exception it raises
    // is reported as unraisable (as Python does for callbacks) and the run goes on.
    let report = |event: Progress<'_>| {
        if let Some(callback) = &progress {
            Python::attach(|py| {
                if let Err(e) = event_dict(py, &event).and_then(|d| callback.call1(py, (d,))) {
                    e.write_unraisable(py, Some(callback.bind(py)));
                }
            });
        }
    };
    let summary = py.detach(|| engine.execute(&plan, &options, cancel, &report).map_err(Box::new)).map_err(|e| to_py(py, *e))?;
    let failed: Vec<serde_json::Value> =
        summary.failed.iter().map(|f| serde_json::json!({ "well": f.well, "error": f.error.to_string() })).collect();
    let json = serde_json::json!({
        "total": summary.total,
        "completed": summary.completed,
        "skipped": summary.skipped,
        "failed": failed,
        "not_started": summary.not_started,
        "out": plan.out,
        "report": summary.report,
    });
    Ok(json.to_string())
}

/// Writes a small synthetic plate (ImageXpress layout, ground truth beside
/// it) into `path`, for examples and tests.
#[pyfunction]
#[pyo3(signature = (path, *, wells = vec!["A01".to_string()], grid = (2, 2), channels = 1, z = 1, size = 64, seed = 1))]
fn synth_plate(path: PathBuf, wells: Vec<String>, grid: (u32, u32), channels: u32, z: u32, size: u32, seed: u64) -> PyResult<()> {
    let config = hcsflow_synth::SynthConfig {
        wells,
        grid_rows: grid.0,
        grid_cols: grid.1,
        channels,
        z_planes: z,
        size,
        seed,
        ..hcsflow_synth::SynthConfig::default()
    };
    hcsflow_synth::generate(&config, &path).map(|_| ()).map_err(|e| HcsflowError::new_err(format!("{}: {e}", path.display())))
}

/// The memory type and device of a `stack_slices`/`unstack_slices` call.
/// `"numpy"` arrays are host memory to the engine; other memory types are
/// planned as routes from the host (a type this build has no converter for
/// is a `MemoryConversionError`). `gpu_id` names the device of device memory.
fn slice_target(memory_type: &str, gpu_id: i64) -> PyResult<(MemoryType, Device)> {
    let memory: MemoryType = match memory_type {
        "numpy" => MemoryType::Host,
        other => other.parse().map_err(CompileError::new_err)?,
    };
    let id = usize::try_from(gpu_id).map_err(|_| ArrayError::new_err(format!("invalid device id {gpu_id}: must be 0 or more")))?;
    Ok((memory, if memory.on_host_in(Runtime::Host) { Device::Cpu } else { Device::Gpu(id) }))
}

/// A numpy array of any number of axes as a host array (copied).
fn host_array_of(array: &Bound<'_, PyAny>) -> PyResult<HostArray> {
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

/// An engine array in host memory as a numpy array owning its buffer.
fn numpy_of(py: Python<'_>, array: Array) -> PyResult<Bound<'_, PyAny>> {
    match array {
        Array::Host(HostArray::U8(a)) => Ok(PyArrayDyn::from_owned_array(py, a).into_any()),
        Array::Host(HostArray::U16(a)) => Ok(PyArrayDyn::from_owned_array(py, a).into_any()),
        Array::Host(HostArray::F32(a)) => Ok(PyArrayDyn::from_owned_array(py, a).into_any()),
        Array::Device(b) => {
            Err(MemoryConversionError::new_err(format!("the result is {} memory, which Python cannot hold yet", b.memory_type())))
        }
    }
}

/// A `SliceError` as the Python exception for its kind.
fn slice_error(py: Python<'_>, e: SliceError) -> PyErr {
    match &e {
        SliceError::Conversion(c) => conversion_error(py, e.to_string(), c),
        SliceError::BadDevice { .. } => DeviceUnavailableError::new_err(e.to_string()),
        _ => ArrayError::new_err(e.to_string()),
    }
}

/// Stacks 2D slices (all one shape and dtype) into one 3D array `[Z, Y, X]`
/// of `memory_type` on device `gpu_id`, as OpenHCS's `stack_slices` does.
#[pyfunction]
#[pyo3(signature = (slices, memory_type = "numpy", gpu_id = 0))]
fn stack_slices<'py>(py: Python<'py>, slices: Vec<Bound<'py, PyAny>>, memory_type: &str, gpu_id: i64) -> PyResult<Bound<'py, PyAny>> {
    let (memory, device) = slice_target(memory_type, gpu_id)?;
    let arrays: Vec<Array> = slices.iter().map(|s| host_array_of(s).map(Array::Host)).collect::<PyResult<_>>()?;
    let engine = engine();
    let stacked = hcsflow::core::stack_slices(arrays, memory, device, engine.conversions(), ConversionPolicy::default())
        .map_err(|e| slice_error(py, e))?;
    numpy_of(py, stacked)
}

/// Splits a 3D array `[Z, Y, X]` into its Z slices (2D arrays of
/// `memory_type` on device `gpu_id`), as OpenHCS's `unstack_slices` does.
#[pyfunction]
#[pyo3(signature = (array, memory_type = "numpy", gpu_id = 0))]
fn unstack_slices<'py>(py: Python<'py>, array: &Bound<'py, PyAny>, memory_type: &str, gpu_id: i64) -> PyResult<Vec<Bound<'py, PyAny>>> {
    let (memory, device) = slice_target(memory_type, gpu_id)?;
    let input = Array::Host(host_array_of(array)?);
    let engine = engine();
    let slices = hcsflow::core::unstack_slices(input, memory, device, engine.conversions(), ConversionPolicy::default())
        .map_err(|e| slice_error(py, e))?;
    slices.into_iter().map(|s| numpy_of(py, s)).collect()
}

/// The native module.
#[pymodule]
fn _hcsflow(m: &Bound<'_, PyModule>) -> PyResult<()> {
    let py = m.py();
    m.add("__version__", env!("CARGO_PKG_VERSION"))?;
    m.add("HcsflowError", py.get_type::<HcsflowError>())?;
    m.add("CompileError", py.get_type::<CompileError>())?;
    m.add("DeviceUnavailableError", py.get_type::<DeviceUnavailableError>())?;
    m.add("PlateError", py.get_type::<PlateError>())?;
    m.add("FunctionError", py.get_type::<FunctionError>())?;
    m.add("MemoryConversionError", py.get_type::<MemoryConversionError>())?;
    m.add("ArrayError", py.get_type::<ArrayError>())?;
    m.add_function(wrap_pyfunction!(function_names, m)?)?;
    m.add_function(wrap_pyfunction!(catalogue_json, m)?)?;
    m.add_function(wrap_pyfunction!(call, m)?)?;
    m.add_function(wrap_pyfunction!(run, m)?)?;
    m.add_function(wrap_pyfunction!(synth_plate, m)?)?;
    m.add_function(wrap_pyfunction!(stack_slices, m)?)?;
    m.add_function(wrap_pyfunction!(unstack_slices, m)?)?;
    Ok(())
}
