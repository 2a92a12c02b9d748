//! `hcsflow._hcsflow`: the native half of the `hcsflow` Python package, a thin
//! front end over the engine facade ([`hcsflow::Engine`]), as the CLI is.
//!
//! Contract:
//! - `call`: one registered function on a 3D numpy array (`uint8`,
//!   `uint16`, `float32`; `[Z, Y, X]`), arguments as keyword values, the
//!   result a new numpy array that owns the engine's output buffer (moved,
//!   not copied). A C-contiguous input is shared, not copied (the engine
//!   copies it only to write into it); another is copied into a stack.
//! - `run`: plate + pipeline (JSON from `hcsflow.Pipeline`) + output
//!   folder, as `hcsflow run`; `dry_run` returns the plan text; otherwise the
//!   run's summary as JSON text (the Python side parses it). The GIL is
//!   released while wells run; users' Python functions take it per call
//!   (the `python_functions` module).
//! - Every engine error is raised as a subclass of `HcsflowError` chosen from
//!   the error's type ([`hcsflow::Error`]), never from its text.

mod aligned;
mod arrays;
mod errors;
mod logging;
mod plate;
mod python_functions;

use std::path::PathBuf;
use std::sync::atomic::AtomicBool;
use std::sync::{Arc, OnceLock};

use hcsflow::core::{
    Array, ConversionPolicy, DTypeConversion, DTypePolicy, Device, DeviceRequest, MemoryType, OutputDType, Runtime, StackShape,
};
use hcsflow::pipeline::{PipelineSpec, Progress};
use hcsflow::{DeviceOptions, Engine, Error, RunOptions};
use pyo3::exceptions::{PyResourceWarning, PyValueError};
use pyo3::prelude::*;
use pyo3::types::{PyBool, PyDict, PyList, PyTuple};

use arrays::{host_array_of, numpy_of, stack_of};
use errors::{
    slice_error, to_py, ArrayError, CompileError, DeviceUnavailableError, FunctionError, HcsflowError, MemoryConversionError, PlateError,
};

/// The allocator of the module: buffers of 4 KiB or more are 64-byte
/// aligned, so every stack handed to Python can be shared with JAX.
#[global_allocator]
static ALLOCATOR: aligned::Aligned = aligned::Aligned;

/// The engine of this process: the built-in functions, the built-in
/// converters and those of the Python libraries installed here, assembled on
/// first use and shared by every call.
fn engine() -> &'static Engine {
    static ENGINE: OnceLock<Engine> = OnceLock::new();
    ENGINE.get_or_init(|| {
        let builtin = Engine::builtin();
        let mut conversions = builtin.conversions().clone();
        Python::attach(|py| python_functions::add_python_converters(py, &mut conversions));
        Engine::new(builtin.registry().clone(), conversions)
    })
}

/// The engine of a run: [`engine`] with the Python functions registered so far.
fn engine_with_python_functions() -> Engine {
    let base = engine();
    Engine::new(python_functions::with_python_functions(base.registry().clone()), base.conversions().clone())
}

/// The address of `array`'s pixels if the engine shares them without a copy
/// (a 3D C-contiguous numpy array of uint8, uint16 or float32), else `None`
/// (it is copied): what `call` and `hcsflow.functions` do with an input.
#[pyfunction]
fn shared_address(array: &Bound<'_, PyAny>) -> Option<usize> {
    arrays::shared_stack(&arrays::as_numpy(array).ok()?).map(|stack| stack.as_bytes().as_ptr() as usize)
}

/// Registers the Python function `func` under `name` for pipelines, taking
/// `input_type` and returning `output_type` arrays (`numpy`, `torch`, `jax`,
/// `tensorflow`, `cupy`, `pyclesperanto`), with `contract`. The decorators
/// of `hcsflow.memory` declare these; `hcsflow.Pipeline` registers.
#[pyfunction]
#[pyo3(signature = (name, func, input_type, output_type, contract = "pure_3d", doc = ""))]
fn register_function(name: &str, func: Py<PyAny>, input_type: &str, output_type: &str, contract: &str, doc: &str) -> PyResult<()> {
    python_functions::register(name, func, input_type, output_type, contract, doc).map_err(CompileError::new_err)
}

/// The pipeline file at `path` as JSON text (the structure `Pipeline`
/// builds): every problem with the file is a `CompileError` naming it.
#[pyfunction]
fn pipeline_json(py: Python<'_>, path: PathBuf) -> PyResult<String> {
    let spec = PipelineSpec::read(&path).map_err(|e| to_py(py, Error::Spec(e)))?;
    serde_json::to_string(&spec).map_err(|e| HcsflowError::new_err(format!("{}: {e}", path.display())))
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
        Progress::PlateStepStarted { step, groups, planes } => {
            d.set_item("event", "plate_step_started")?;
            d.set_item("step", *step)?;
            d.set_item("groups", *groups)?;
            d.set_item("planes", *planes)?;
        }
        Progress::PlateStepFinished { step, seconds, reused, error } => {
            d.set_item("event", "plate_step_finished")?;
            d.set_item("step", *step)?;
            d.set_item("seconds", *seconds)?;
            d.set_item("reused", *reused)?;
            d.set_item("error", *error)?;
        }
    }
    Ok(d)
}

/// Runs the registered function `name` on `array` (3D) with keyword
/// arguments, on `device` (`"cpu"` by default), and returns the result in
/// `dtype` (`"input"`: the input's; `u8`, `u16`, `f32`), floats clipped and
/// rounded into an integer dtype, or stretched over its range with
/// `stretch`, as `hcsflow apply --dtype/--stretch`.
#[pyfunction]
#[pyo3(signature = (name, array, *, device = "cpu", dtype = "input", stretch = false, allow_software_gpu = false, allow_host_round_trip = false, **kwargs))]
#[allow(clippy::too_many_arguments)] // one Python keyword each, as the CLI's flags
fn call<'py>(
    py: Python<'py>,
    name: &str,
    array: &Bound<'py, PyAny>,
    device: &str,
    dtype: &str,
    stretch: bool,
    allow_software_gpu: bool,
    allow_host_round_trip: bool,
    kwargs: Option<&Bound<'py, PyDict>>,
) -> PyResult<Bound<'py, PyAny>> {
    let output: OutputDType = dtype.parse().map_err(|e: hcsflow::core::dtype::UnknownDType| CompileError::new_err(e.to_string()))?;
    let policy = DTypePolicy { output, conversion: if stretch { DTypeConversion::Stretch } else { DTypeConversion::Clip } };
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
    let out = py.detach(|| engine.run_call(&prepared, stack, policy).map_err(Box::new)).map_err(|e| to_py(py, *e))?;
    numpy_of(py, Array::from(out))
}

/// `hcsflow run PLATE PIPELINE OUT` from Python, the pipeline given as
/// JSON text (what `Pipeline` builds; `origin` names it in errors): the plan
/// text with `dry_run`, else the run summary as JSON text. Wells that fail
/// are in the summary (`failed`), not raised. Python functions the pipeline
/// names must be registered first (`register_function`).
#[pyfunction]
#[pyo3(signature = (plate, pipeline, origin, out, *, device = "auto", workers = None, resume = false, overwrite = false, dry_run = false, allow_software_gpu = false, allow_host_round_trip = false, progress = None, max_memory = None, gpu_memory = None))]
#[allow(clippy::too_many_arguments)] // one Python keyword each, as the CLI's flags
fn run(
    py: Python<'_>,
    plate: PathBuf,
    pipeline: &str,
    origin: &str,
    out: PathBuf,
    device: &str,
    workers: Option<usize>,
    resume: bool,
    overwrite: bool,
    dry_run: bool,
    allow_software_gpu: bool,
    allow_host_round_trip: bool,
    progress: Option<Py<PyAny>>,
    max_memory: Option<&str>,
    gpu_memory: Option<&str>,
) -> PyResult<String> {
    let size = |name: &str, text: Option<&str>| {
        text.map(hcsflow::parse_size).transpose().map_err(|e| PyValueError::new_err(format!("{name}: {e}")))
    };
    let (max_memory, gpu_memory) = (size("max_memory", max_memory)?, size("gpu_memory", gpu_memory)?);
    let spec: PipelineSpec = serde_json::from_str(pipeline).map_err(|e| {
        to_py(py, Error::Spec(hcsflow::pipeline::PipelineError::Parse { origin: origin.to_string(), message: e.to_string() }))
    })?;
    let engine = engine_with_python_functions();
    let mut options = RunOptions {
        device: device_options(device, allow_software_gpu, allow_host_round_trip)?,
        resume,
        overwrite,
        max_memory,
        gpu_memory,
        ..RunOptions::default()
    };
    if let Some(w) = workers {
        options.workers = w;
    }
    let plan = py.detach(|| engine.plan_spec(&plate, &spec, &out, &options).map_err(Box::new)).map_err(|e| to_py(py, *e))?;
    if let Some(w) = hcsflow::budget_warning(&plan, options.max_memory) {
        let message = std::ffi::CString::new(w).unwrap_or_default();
        PyErr::warn(py, &py.get_type::<PyResourceWarning>(), &message, 1)?;
    }
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
    logging::install();
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
    m.add_function(wrap_pyfunction!(register_function, m)?)?;
    m.add_function(wrap_pyfunction!(pipeline_json, m)?)?;
    m.add_function(wrap_pyfunction!(shared_address, m)?)?;
    m.add_function(wrap_pyfunction!(plate::plate_json, m)?)?;
    m.add_function(wrap_pyfunction!(plate::read_stack, m)?)?;
    m.add_function(wrap_pyfunction!(synth_plate, m)?)?;
    m.add_function(wrap_pyfunction!(stack_slices, m)?)?;
    m.add_function(wrap_pyfunction!(unstack_slices, m)?)?;
    Ok(())
}
