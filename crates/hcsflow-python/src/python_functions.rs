//! Users' Python functions as registry functions, and the converters that
//! bring stacks to the array libraries they declare.
//!
//! A Python function is registered under its name (`module:qualname`, chosen
//! by the Python side) with the memory types its decorator declares
//! (`@numpy`, `@torch`, `@jax`, ...). It becomes one [`Implementation`] taking
//! and returning those memory types, so the pipeline compiler plans the
//! conversions into and out of it with the same route planner as every
//! built-in: a plan shows each one, and one the build cannot make is refused
//! before anything runs.
//!
//! Arrays of Python libraries travel through the engine as a
//! [`PythonArray`] (a [`DeviceBuffer`] holding the Python object). The
//! library-specific steps of each conversion (`torch.from_dlpack`,
//! `np.from_dlpack`, `cle.push`) are in `hcsflow/_memory.py`; this module
//! decides which edges exist and what each returns.

use std::any::Any;
use std::collections::BTreeMap;
use std::fmt;
use std::sync::{Arc, Mutex, PoisonError};

use hcsflow::core::convert::Converter;
use hcsflow::core::{
    Array, Contract, ConversionError, Conversions, DType, Device, DeviceBuffer, FunctionError, FunctionSpec, Implementation, MemoryType,
    Registry,
};
use pyo3::prelude::*;

use crate::arrays::{host_array_of, numpy_of};

/// The Python array libraries a function may declare, with the module that
/// must be importable for each.
pub const LIBRARIES: [(MemoryType, &str); 6] = [
    (MemoryType::Numpy, "numpy"),
    (MemoryType::Torch, "torch"),
    (MemoryType::Jax, "jax"),
    (MemoryType::Tensorflow, "tensorflow"),
    (MemoryType::Cupy, "cupy"),
    (MemoryType::Pyclesperanto, "pyclesperanto"),
];

/// An array of a Python library (numpy, torch, jax, ...) in the engine.
pub struct PythonArray {
    memory: MemoryType,
    object: Py<PyAny>,
    shape: Vec<usize>,
    dtype: DType,
}

impl fmt::Debug for PythonArray {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "PythonArray({} {:?} {})", self.memory, self.shape, self.dtype)
    }
}

impl DeviceBuffer for PythonArray {
    fn memory_type(&self) -> MemoryType {
        self.memory
    }
    fn device(&self) -> Device {
        Device::Cpu
    }
    fn shape(&self) -> &[usize] {
        &self.shape
    }
    fn dtype(&self) -> DType {
        self.dtype
    }
    fn as_any(&self) -> &dyn Any {
        self
    }
}

/// `hcsflow._memory`, where the library-specific steps live.
fn memory_module(py: Python<'_>) -> PyResult<Bound<'_, PyModule>> {
    py.import("hcsflow._memory")
}

impl PythonArray {
    /// `object` as an array of `memory`: its type, shape and dtype are
    /// checked (`_memory.describe`); the message says what is wrong.
    fn new(py: Python<'_>, memory: MemoryType, object: Bound<'_, PyAny>) -> Result<PythonArray, String> {
        let described = memory_module(py).and_then(|m| m.call_method1("describe", (&object, memory.name())));
        let (shape, dtype): (Vec<usize>, String) = described.and_then(|d| d.extract()).map_err(|e| exception_text(py, &e))?;
        let dtype = match dtype.as_str() {
            "uint8" => DType::U8,
            "uint16" => DType::U16,
            "float32" => DType::F32,
            other => {
                return Err(format!(
                    "returned a {other} array; hcsflow stacks are uint8, uint16 or float32 (cast the result, e.g. .astype(np.float32))"
                ))
            }
        };
        Ok(PythonArray { memory, object: object.unbind(), shape, dtype })
    }

    /// The Python object of `buffer`, if it is a Python library's array.
    pub fn object<'py>(py: Python<'py>, buffer: &dyn DeviceBuffer) -> Option<Bound<'py, PyAny>> {
        buffer.as_any().downcast_ref::<PythonArray>().map(|a| a.object.clone_ref(py).into_bound(py))
    }

    /// The Python object inside `array`, if it is an array of `memory`.
    fn object_of(py: Python<'_>, array: &Array, memory: MemoryType) -> Option<Py<PyAny>> {
        match array {
            Array::Device(b) if b.memory_type() == memory => b.as_any().downcast_ref::<PythonArray>().map(|a| a.object.clone_ref(py)),
            _ => None,
        }
    }
}

/// A Python exception raised by a user's function: its type, message and
/// traceback, kept for the well's error in the report and manifest.
#[derive(Debug, thiserror::Error)]
#[error("{text}")]
pub struct PythonException {
    text: String,
}

impl PythonException {
    fn new(py: Python<'_>, error: &PyErr) -> Self {
        PythonException { text: exception_text(py, error) }
    }
}

/// `type: message` and the traceback of `error`, as Python prints them: the
/// error's own traceback, from the call into Python to the raise (the
/// exception object's `__traceback__` may hold only the frames below the
/// last `except` that re-raised it).
fn exception_text(py: Python<'_>, error: &PyErr) -> String {
    let formatted = py
        .import("traceback")
        .and_then(|t| t.call_method1("format_exception", (error.get_type(py), error.value(py), error.traceback(py))))
        .and_then(|lines| lines.extract::<Vec<String>>())
        .map(|lines| lines.concat());
    match formatted {
        Ok(text) => text.trim_end().to_string(),
        Err(_) => error.to_string(),
    }
}

/// A user's function as registered from Python.
struct PythonFunction {
    name: &'static str,
    doc: &'static str,
    contract: Contract,
    memory_in: MemoryType,
    memory_out: MemoryType,
    callable: Arc<Py<PyAny>>,
}

/// Every Python function registered in this process, by name.
fn registered() -> &'static Mutex<BTreeMap<String, PythonFunction>> {
    static FUNCTIONS: Mutex<BTreeMap<String, PythonFunction>> = Mutex::new(BTreeMap::new());
    &FUNCTIONS
}

/// Registers `func` under `name` (replacing a function of that name) taking
/// `input_type` and returning `output_type` arrays, with `contract`
/// (`pure_3d`, `pure_2d` — the Python side applies it per plane — or
/// `volumetric_to_slice`).
pub fn register(name: &str, func: Py<PyAny>, input_type: &str, output_type: &str, contract: &str, doc: &str) -> Result<(), String> {
    let memory = |text: &str| -> Result<MemoryType, String> {
        let m: MemoryType = text.parse()?;
        if LIBRARIES.iter().any(|(l, _)| *l == m) {
            Ok(m)
        } else {
            let names: Vec<_> = LIBRARIES.iter().map(|(_, n)| *n).collect();
            Err(format!("'{text}' is not a memory type of Python functions: expected one of {}", names.join(", ")))
        }
    };
    let contract: Contract = contract.parse()?;
    if contract == Contract::Flexible {
        return Err("a Python function's contract is pure_3d, pure_2d or volumetric_to_slice".into());
    }
    if !name.contains(':') {
        // Built-ins have no ':' in their names: a Python function never shadows one.
        return Err(format!("a Python function's name is 'module:function', not '{name}'"));
    }
    let (memory_in, memory_out) = (memory(input_type)?, memory(output_type)?);
    let mut functions = registered().lock().unwrap_or_else(PoisonError::into_inner);
    // Names and docs live as long as the process, as the built-ins' do: each
    // is leaked once, and registering the same name again reuses them.
    let keep = |text: &str, old: Option<&'static str>| -> &'static str {
        match old {
            Some(old) if old == text => old,
            _ => Box::leak(text.to_string().into_boxed_str()),
        }
    };
    let old = functions.get(name);
    let function = PythonFunction {
        name: keep(name, old.map(|f| f.name)),
        doc: keep(doc, old.map(|f| f.doc)),
        contract,
        memory_in,
        memory_out,
        callable: Arc::new(func),
    };
    functions.insert(name.to_string(), function);
    Ok(())
}

/// `registry` with every registered Python function added.
pub fn with_python_functions(mut registry: Registry) -> Registry {
    let functions = registered().lock().unwrap_or_else(PoisonError::into_inner);
    for f in functions.values() {
        let spec = FunctionSpec { name: f.name, doc: f.doc, contract: f.contract, args: Vec::new() };
        registry.register(spec, implementation(f));
    }
    registry
}

/// The implementation calling a Python function: the GIL is taken for the
/// call only; what it returns must be a 3D array of its output memory type
/// and a dtype hcsflow has, else the well fails naming the function.
fn implementation(f: &PythonFunction) -> Implementation {
    let (name, memory_in, memory_out, callable) = (f.name, f.memory_in, f.memory_out, f.callable.clone());
    Implementation::array(memory_in, memory_out, move |array, _args, _context| {
        Python::attach(|py| {
            let input = PythonArray::object_of(py, &array, memory_in).ok_or(FunctionError::WrongMemory {
                function: name.into(),
                expected: memory_in,
                got: array.memory_type(),
            })?;
            drop(array);
            let result = callable.call1(py, (input,)).map_err(|e| FunctionError::failed(name, PythonException::new(py, &e)))?;
            let output = PythonArray::new(py, memory_out, result.into_bound(py)).map_err(|e| FunctionError::invalid(name, e))?;
            Ok(Array::Device(Arc::new(output)))
        })
    })
}

/// The converters between host stacks and the Python libraries installed
/// here, added to `conversions`; the edges of a library that is not
/// installed are refused with that reason, so a plan needing one fails
/// before anything runs.
pub fn add_python_converters(py: Python<'_>, conversions: &mut Conversions) {
    let installed = |module: &str| {
        py.import("importlib.util").and_then(|u| u.call_method1("find_spec", (module,))).map(|spec| !spec.is_none()).unwrap_or(false)
    };
    // Why each memory type's arrays cannot be made here, if they cannot.
    let mut unusable: Vec<(MemoryType, Option<String>)> = vec![(MemoryType::Host, None)];
    for (m, module) in LIBRARIES {
        let why = if m == MemoryType::Cupy {
            Some("cupy has no CPU device and this build has no CUDA runtime".to_string())
        } else if installed(module) {
            None
        } else {
            Some(format!("{module} is not installed in this Python environment (pip install {module})"))
        };
        unusable.push((m, why));
    }
    for (a, why_a) in &unusable {
        for (b, why_b) in &unusable {
            if a == b {
                continue;
            }
            match why_a.as_ref().or(why_b.as_ref()) {
                None => conversions.register(*a, *b, Arc::new(PythonConverter { source: *a, target: *b })),
                Some(reason) => conversions.refuse(*a, *b, reason.clone()),
            }
        }
    }
}

/// One direct edge between a host stack and a Python library, or between
/// two Python libraries.
struct PythonConverter {
    source: MemoryType,
    target: MemoryType,
}

impl Converter for PythonConverter {
    fn convert(&self, array: Array, _device: Device) -> Result<Array, ConversionError> {
        let (source, target) = (self.source, self.target);
        let fail = |reason: String| ConversionError { from: source, to: target, method: "python".into(), reason };
        Python::attach(|py| {
            let object = match array {
                // A host stack reaches Python as a numpy array over its buffer (moved, not copied).
                host @ Array::Host(_) => numpy_of(py, host).map_err(|e| fail(exception_text(py, &e)))?,
                other => {
                    PythonArray::object_of(py, &other, source).ok_or_else(|| fail(format!("expected a {source} array")))?.into_bound(py)
                }
            };
            let name = |m: MemoryType| if m == MemoryType::Host { "numpy" } else { m.name() };
            let converted = memory_module(py)
                .and_then(|m| m.call_method1("convert", (object, name(source), name(target))))
                .map_err(|e| fail(exception_text(py, &e)))?;
            if target == MemoryType::Host {
                host_array_of(&converted).map(Array::Host).map_err(|e| fail(exception_text(py, &e)))
            } else {
                PythonArray::new(py, target, converted).map(|a| Array::Device(Arc::new(a))).map_err(fail)
            }
        })
    }
}
