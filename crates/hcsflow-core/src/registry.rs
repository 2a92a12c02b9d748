//! The function registry: one logical function (e.g. `max_projection`) with
//! implementations per memory type, a contract, and typed arguments.
//!
//! Using a function is two phases, like the pipeline compiler: [`Registry::plan_call`]
//! validates everything that can be checked without pixels (function name,
//! arguments, device, implementation, conversion route) and returns a
//! [`CallPlan`]; [`Registry::execute`] runs it.

use std::collections::BTreeMap;
use std::fmt;
use std::str::FromStr;
use std::sync::Arc;

use rayon::prelude::*;
use serde::Serialize;

use crate::artifact::{Artifacts, CallContext, Table};
use crate::convert::{ConversionError, ConversionPolicy, Conversions, Route, RouteKind};
use crate::memory::{Array, Device, MemoryType};
use crate::stack::Stack;

/// How a function treats the stack axis.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize)]
#[serde(rename_all = "snake_case")]
pub enum Contract {
    /// Works on one 2D image; applied to every plane automatically (N → N).
    Pure2d,
    /// Works on the whole stack at once (N → M).
    Pure3d,
    /// Works on the whole stack, or per plane when `slice_by_slice = true`
    /// (an argument every flexible function gets automatically).
    Flexible,
    /// Reduces the stack to one plane (projections, composites): N → 1.
    VolumetricToSlice,
}

impl fmt::Display for Contract {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(match self {
            Contract::Pure2d => "pure_2d",
            Contract::Pure3d => "pure_3d",
            Contract::Flexible => "flexible",
            Contract::VolumetricToSlice => "volumetric_to_slice",
        })
    }
}

/// The name of the argument every [`Contract::Flexible`] function gets.
pub const SLICE_BY_SLICE: &str = "slice_by_slice";

/// The type of an argument, with its valid range.
#[derive(Debug, Clone, PartialEq, Serialize)]
#[serde(tag = "type", rename_all = "snake_case")]
pub enum ArgKind {
    Int {
        #[serde(skip_serializing_if = "Option::is_none")]
        min: Option<i64>,
        #[serde(skip_serializing_if = "Option::is_none")]
        max: Option<i64>,
    },
    Float {
        #[serde(skip_serializing_if = "Option::is_none")]
        min: Option<f64>,
        #[serde(skip_serializing_if = "Option::is_none")]
        max: Option<f64>,
    },
    Bool,
    /// One of a fixed set of strings.
    Choice {
        choices: Vec<&'static str>,
    },
    /// A list of numbers, each in the range; on the command line comma-separated
    /// (`0.5,0.3,0.2`, optionally in brackets). The empty list is allowed when
    /// `min_len` is 0.
    FloatList {
        #[serde(skip_serializing_if = "Option::is_none")]
        min: Option<f64>,
        #[serde(skip_serializing_if = "Option::is_none")]
        max: Option<f64>,
        min_len: usize,
    },
}

impl ArgKind {
    fn type_name(&self) -> &'static str {
        match self {
            ArgKind::Int { .. } => "an integer",
            ArgKind::Float { .. } => "a number",
            ArgKind::Bool => "true or false",
            ArgKind::Choice { .. } => "one of the listed choices",
            ArgKind::FloatList { .. } => "a comma-separated list of numbers",
        }
    }
}

/// A value of an argument.
#[derive(Debug, Clone, PartialEq, Serialize)]
#[serde(untagged)]
pub enum ArgValue {
    Int(i64),
    Float(f64),
    Bool(bool),
    Str(String),
    FloatList(Vec<f64>),
}

impl fmt::Display for ArgValue {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            ArgValue::Int(v) => write!(f, "{v}"),
            ArgValue::Float(v) => write!(f, "{v}"),
            ArgValue::Bool(v) => write!(f, "{v}"),
            ArgValue::Str(v) => write!(f, "'{v}'"),
            ArgValue::FloatList(v) => {
                let items: Vec<String> = v.iter().map(|x| x.to_string()).collect();
                write!(f, "[{}]", items.join(", "))
            }
        }
    }
}

/// One argument of a function: name, type and range, default, one-line doc.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct ArgSpec {
    pub name: &'static str,
    #[serde(flatten)]
    pub kind: ArgKind,
    pub default: ArgValue,
    pub doc: &'static str,
}

impl ArgSpec {
    pub fn int(name: &'static str, default: i64, min: Option<i64>, max: Option<i64>, doc: &'static str) -> Self {
        ArgSpec { name, kind: ArgKind::Int { min, max }, default: ArgValue::Int(default), doc }
    }
    pub fn float(name: &'static str, default: f64, min: Option<f64>, max: Option<f64>, doc: &'static str) -> Self {
        ArgSpec { name, kind: ArgKind::Float { min, max }, default: ArgValue::Float(default), doc }
    }
    pub fn bool(name: &'static str, default: bool, doc: &'static str) -> Self {
        ArgSpec { name, kind: ArgKind::Bool, default: ArgValue::Bool(default), doc }
    }
    pub fn choice(name: &'static str, default: &'static str, choices: &[&'static str], doc: &'static str) -> Self {
        ArgSpec { name, kind: ArgKind::Choice { choices: choices.to_vec() }, default: ArgValue::Str(default.to_string()), doc }
    }

    pub fn float_list(
        name: &'static str,
        default: Vec<f64>,
        min: Option<f64>,
        max: Option<f64>,
        min_len: usize,
        doc: &'static str,
    ) -> Self {
        ArgSpec { name, kind: ArgKind::FloatList { min, max, min_len }, default: ArgValue::FloatList(default), doc }
    }

    /// Checks a value against type and range; coerces integers given for floats
    /// (and a single number given for a list).
    fn validate(&self, function: &str, value: ArgValue) -> Result<ArgValue, ArgError> {
        let wrong = |got: &ArgValue| ArgError::WrongType {
            function: function.to_string(),
            name: self.name.to_string(),
            expected: self.kind.type_name().to_string(),
            got: got.to_string(),
        };
        let out_of_range = |value: String, range: String| ArgError::OutOfRange {
            function: function.to_string(),
            name: self.name.to_string(),
            value,
            range,
        };
        match (&self.kind, value) {
            (ArgKind::Int { min, max }, ArgValue::Int(v)) => {
                if min.is_some_and(|m| v < m) || max.is_some_and(|m| v > m) {
                    return Err(out_of_range(v.to_string(), range_text(*min, *max)));
                }
                Ok(ArgValue::Int(v))
            }
            (ArgKind::Float { min, max }, v @ (ArgValue::Int(_) | ArgValue::Float(_))) => {
                let x = match v {
                    ArgValue::Int(i) => i as f64,
                    ArgValue::Float(f) => f,
                    _ => unreachable!(),
                };
                if !x.is_finite() {
                    return Err(wrong(&ArgValue::Float(x)));
                }
                if min.is_some_and(|m| x < m) || max.is_some_and(|m| x > m) {
                    return Err(out_of_range(x.to_string(), range_text(*min, *max)));
                }
                Ok(ArgValue::Float(x))
            }
            (ArgKind::FloatList { min, max, min_len }, v @ (ArgValue::FloatList(_) | ArgValue::Float(_) | ArgValue::Int(_))) => {
                let list = match v {
                    ArgValue::FloatList(l) => l,
                    ArgValue::Float(f) => vec![f],
                    ArgValue::Int(i) => vec![i as f64],
                    _ => unreachable!(),
                };
                if let Some(bad) = list.iter().find(|x| !x.is_finite()) {
                    return Err(wrong(&ArgValue::Float(*bad)));
                }
                if let Some(bad) = list.iter().find(|&&x| min.is_some_and(|m| x < m) || max.is_some_and(|m| x > m)) {
                    return Err(out_of_range(
                        format!("{} (element {bad})", ArgValue::FloatList(list.clone())),
                        format!("every element {}", range_text(*min, *max)),
                    ));
                }
                if list.len() < *min_len {
                    return Err(out_of_range(ArgValue::FloatList(list).to_string(), format!("a list of at least {min_len} numbers")));
                }
                Ok(ArgValue::FloatList(list))
            }
            (ArgKind::Bool, ArgValue::Bool(b)) => Ok(ArgValue::Bool(b)),
            (ArgKind::Choice { choices }, ArgValue::Str(s)) => {
                if choices.contains(&s.as_str()) {
                    Ok(ArgValue::Str(s))
                } else {
                    Err(out_of_range(format!("'{s}'"), format!("one of {}", choices.join(", "))))
                }
            }
            (_, other) => Err(wrong(&other)),
        }
    }

    /// Parses a command-line string (`--arg name=text`) as this argument's type.
    pub fn parse_text(&self, function: &str, text: &str) -> Result<ArgValue, ArgError> {
        let value = match &self.kind {
            ArgKind::Int { .. } => text.trim().parse::<i64>().map(ArgValue::Int).ok(),
            ArgKind::Float { .. } => text.trim().parse::<f64>().map(ArgValue::Float).ok(),
            ArgKind::Bool => match text.trim() {
                "true" | "yes" | "1" => Some(ArgValue::Bool(true)),
                "false" | "no" | "0" => Some(ArgValue::Bool(false)),
                _ => None,
            },
            ArgKind::Choice { .. } => Some(ArgValue::Str(text.to_string())),
            ArgKind::FloatList { .. } => {
                let t = text.trim();
                let t = t.strip_prefix('[').and_then(|t| t.strip_suffix(']')).unwrap_or(t).trim();
                if t.is_empty() {
                    Some(ArgValue::FloatList(Vec::new()))
                } else {
                    t.split(',').map(|x| x.trim().parse::<f64>().ok()).collect::<Option<Vec<f64>>>().map(ArgValue::FloatList)
                }
            }
        };
        let value = value.ok_or_else(|| ArgError::WrongType {
            function: function.to_string(),
            name: self.name.to_string(),
            expected: self.kind.type_name().to_string(),
            got: format!("'{text}'"),
        })?;
        self.validate(function, value)
    }
}

fn range_text<T: fmt::Display>(min: Option<T>, max: Option<T>) -> String {
    match (min, max) {
        (Some(a), Some(b)) => format!("[{a}, {b}]"),
        (Some(a), None) => format!(">= {a}"),
        (None, Some(b)) => format!("<= {b}"),
        (None, None) => "any value".into(),
    }
}

/// An argument problem, found before any pixel is read.
#[derive(Debug, Clone, PartialEq, thiserror::Error)]
pub enum ArgError {
    #[error("{function}: unknown argument '{name}'{}; its arguments are: {}", suggestion.as_ref().map(|s| format!(" (did you mean '{s}'?)")).unwrap_or_default(), if known.is_empty() { "(none)".to_string() } else { known.join(", ") })]
    Unknown { function: String, name: String, known: Vec<String>, suggestion: Option<String> },
    #[error("{function}: argument '{name}' expects {expected}, got {got}")]
    WrongType { function: String, name: String, expected: String, got: String },
    #[error("{function}: argument '{name}' = {value} is out of range: must be {range}")]
    OutOfRange { function: String, name: String, value: String, range: String },
    #[error("malformed argument '{0}': expected name=value")]
    Malformed(String),
    /// A function's [`ArgCheck`] refused the arguments for the stack the call gets.
    #[error("{function}: argument '{name}': {problem} (checked against a stack of {shape}); {fix}")]
    Invalid { function: String, name: String, problem: String, fix: String, shape: StackShape },
}

/// The shape of the stack one call receives: `depth` planes of `height` ×
/// `width` pixels. A per-plane call (a [`Contract::Pure2d`] function, or a
/// flexible one with `slice_by_slice`) receives one plane at a time: depth 1.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize)]
pub struct StackShape {
    pub depth: usize,
    pub height: usize,
    pub width: usize,
}

impl StackShape {
    pub fn new(depth: usize, height: usize, width: usize) -> Self {
        StackShape { depth, height, width }
    }

    /// The same planes, `depth` of them.
    pub fn with_depth(self, depth: usize) -> Self {
        StackShape { depth, ..self }
    }
}

impl fmt::Display for StackShape {
    /// "2 planes of 64×64 pixels" (rows × columns).
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let s = if self.depth == 1 { "" } else { "s" };
        write!(f, "{} plane{s} of {}×{} pixels", self.depth, self.height, self.width)
    }
}

/// What an [`ArgCheck`] found wrong: the argument, the problem and its fix
/// (e.g. `size`, "size must be odd, got 4", "use 3 or 5").
#[derive(Debug, Clone, PartialEq)]
pub struct ArgProblem {
    pub arg: &'static str,
    pub problem: String,
    pub fix: String,
}

impl ArgProblem {
    pub fn new(arg: &'static str, problem: impl Into<String>, fix: impl Into<String>) -> Self {
        ArgProblem { arg, problem: problem.into(), fix: fix.into() }
    }
}

/// A function's declaration-level check: refuses arguments that cannot work
/// for a stack of this shape (or for any stack), before any pixel is read.
/// The shape is the one the *call* receives (depth 1 for per-plane calls).
/// Compile runs it for every call of every chain with the shape the call will
/// get; [`Registry::execute_in`] runs it again on the real stack as a defence.
pub type ArgCheck = fn(&Args, &StackShape) -> Result<(), ArgProblem>;

/// The shape a function returns for an input stack of a shape (the whole
/// stack, not the per-plane call), when arguments and shape decide it; `None`
/// when only the run knows it. See [`Function::output_shape`] for the default.
pub type ShapeRule = fn(&Args, &StackShape) -> Option<StackShape>;

/// A [`ShapeRule`] for functions that keep the stack's shape.
pub fn same_shape(_: &Args, input: &StackShape) -> Option<StackShape> {
    Some(*input)
}

/// A [`ShapeRule`] for N → 1 reductions that keep the plane size (projections, composites).
pub fn one_plane(_: &Args, input: &StackShape) -> Option<StackShape> {
    Some(input.with_depth(1))
}

/// Validated arguments of one call: every declared argument has a value.
#[derive(Debug, Clone, PartialEq, Default, Serialize)]
pub struct Args {
    values: BTreeMap<String, ArgValue>,
}

impl Args {
    pub fn get(&self, name: &str) -> Option<&ArgValue> {
        self.values.get(name)
    }
    /// The value of a declared integer argument (0 if absent: only reachable by a registry bug).
    pub fn int(&self, name: &str) -> i64 {
        match self.values.get(name) {
            Some(ArgValue::Int(v)) => *v,
            _ => 0,
        }
    }
    pub fn float(&self, name: &str) -> f64 {
        match self.values.get(name) {
            Some(ArgValue::Float(v)) => *v,
            Some(ArgValue::Int(v)) => *v as f64,
            _ => 0.0,
        }
    }
    pub fn bool(&self, name: &str) -> bool {
        matches!(self.values.get(name), Some(ArgValue::Bool(true)))
    }
    /// The value of a declared list argument (empty if absent: only reachable by a registry bug).
    pub fn float_list(&self, name: &str) -> &[f64] {
        match self.values.get(name) {
            Some(ArgValue::FloatList(v)) => v,
            _ => &[],
        }
    }
    pub fn str(&self, name: &str) -> &str {
        match self.values.get(name) {
            Some(ArgValue::Str(v)) => v,
            _ => "",
        }
    }
}

/// The error of any type behind a [`FunctionError`]: kept whole, so a caller
/// can reach it through [`std::error::Error::source`] and downcast it.
pub type BoxError = Box<dyn std::error::Error + Send + Sync + 'static>;

/// A function failed while running.
///
/// The kinds a caller may act on have their own variants: [`FunctionError::InvalidInput`]
/// (the stack or its arguments are not ones the function accepts: the user's
/// to fix), [`FunctionError::TooLarge`] (a buffer over the device's limit for
/// one buffer or binding: a smaller stack, or the host, would do) and
/// [`FunctionError::DeviceOutOfMemory`] (the device had no memory left at that
/// moment: retry, or split). The message shown is `function: reason`, the
/// reason being the source's own message.
#[derive(Debug, thiserror::Error)]
pub enum FunctionError {
    /// The input (stack contents or shape, arguments, artifacts) is not one
    /// the function accepts.
    #[error("{function}: {reason}")]
    InvalidInput { function: String, reason: String },
    /// A buffer the function needs is larger than the device allows in one
    /// buffer or binding (e.g. 128 MiB per binding on lavapipe).
    #[error("{function}: {source}")]
    TooLarge { function: String, source: BoxError },
    /// The device ran out of memory allocating what the function needs.
    #[error("{function}: {source}")]
    DeviceOutOfMemory { function: String, source: BoxError },
    /// Any other failure, with the error that caused it.
    #[error("{function}: {source}")]
    Failed { function: String, source: BoxError },
    #[error("{function} ({contract}) returned {got} planes for {input} input planes; expected {expected}")]
    ContractViolation { function: String, contract: Contract, input: usize, got: usize, expected: usize },
    #[error("{function}: implementation for {expected} received a {got} array")]
    WrongMemory { function: String, expected: MemoryType, got: MemoryType },
    #[error("{function}: expected a 3D [Z, Y, X] stack, got shape {shape:?}")]
    NotAStack { function: String, shape: Vec<usize> },
    #[error(transparent)]
    Conversion(#[from] ConversionError),
    /// The function's [`ArgCheck`] refused the arguments for the real stack.
    #[error(transparent)]
    Args(#[from] ArgError),
}

impl FunctionError {
    /// A failure of `function` caused by `source` (an error of any type; a
    /// message alone also converts).
    pub fn failed(function: &str, source: impl Into<BoxError>) -> Self {
        FunctionError::Failed { function: function.to_string(), source: source.into() }
    }

    /// `function` does not accept its input, for `reason`.
    pub fn invalid(function: &str, reason: impl Into<String>) -> Self {
        FunctionError::InvalidInput { function: function.to_string(), reason: reason.into() }
    }

    /// A buffer of `function` exceeds the device's limit, as `source` says.
    pub fn too_large(function: &str, source: impl Into<BoxError>) -> Self {
        FunctionError::TooLarge { function: function.to_string(), source: source.into() }
    }

    /// The device ran out of memory running `function`, as `source` says.
    pub fn out_of_memory(function: &str, source: impl Into<BoxError>) -> Self {
        FunctionError::DeviceOutOfMemory { function: function.to_string(), source: source.into() }
    }
}

/// A host kernel: one stack in, one stack out.
pub type HostKernel = Arc<dyn Fn(&Stack, &Args) -> Result<Stack, FunctionError> + Send + Sync>;
/// A kernel on any memory type: receives an array of the implementation's
/// input memory type, returns one of its output memory type.
pub type ArrayKernel = Arc<dyn Fn(Array, &Args) -> Result<Array, FunctionError> + Send + Sync>;
/// A host kernel that also receives the call's [`CallContext`] (injected
/// metadata, consumed artifacts) and records what it produces there.
pub type HostContextKernel = Arc<dyn Fn(&Stack, &Args, &mut CallContext) -> Result<Stack, FunctionError> + Send + Sync>;
/// An [`ArrayKernel`] with the call's [`CallContext`].
pub type ArrayContextKernel = Arc<dyn Fn(Array, &Args, &mut CallContext) -> Result<Array, FunctionError> + Send + Sync>;

/// One implementation of a logical function.
#[derive(Clone)]
pub struct Implementation {
    pub memory_in: MemoryType,
    pub memory_out: MemoryType,
    kernel: ArrayContextKernel,
    /// For host kernels of per-plane contracts: the registry splits planes.
    per_plane_host: Option<HostContextKernel>,
}

impl fmt::Debug for Implementation {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "Implementation({} → {})", self.memory_in, self.memory_out)
    }
}

impl Implementation {
    /// A host implementation on whole stacks. For [`Contract::Pure2d`] (and
    /// flexible functions called with `slice_by_slice`) the registry calls it
    /// once per plane with a one-plane stack, in parallel.
    pub fn host(kernel: impl Fn(&Stack, &Args) -> Result<Stack, FunctionError> + Send + Sync + 'static) -> Self {
        Implementation::host_in_context(move |stack, args, _| kernel(stack, args))
    }

    /// [`Implementation::host`] for functions that use the call context
    /// (metadata, artifacts). Per-plane calls get a context holding their
    /// plane's metadata and artifact rows; what they produce is merged in plane order.
    pub fn host_in_context(
        kernel: impl Fn(&Stack, &Args, &mut CallContext) -> Result<Stack, FunctionError> + Send + Sync + 'static,
    ) -> Self {
        let kernel: HostContextKernel = Arc::new(kernel);
        let whole = kernel.clone();
        Implementation {
            memory_in: MemoryType::Host,
            memory_out: MemoryType::Host,
            kernel: Arc::new(move |array, args, context| Ok(Array::from(whole(&host_input(array)?, args, context)?))),
            per_plane_host: Some(kernel),
        }
    }

    /// A host implementation that receives the whole stack *by value*, whatever
    /// the contract: for functions that treat every plane on their own already
    /// (the registry then makes no per-plane copies) and for functions whose
    /// result has the input's dtype and shape, which may overwrite the input
    /// instead of allocating a second stack. The registry still checks the
    /// contract's plane count.
    pub fn host_owned(kernel: impl Fn(Stack, &Args) -> Result<Stack, FunctionError> + Send + Sync + 'static) -> Self {
        Implementation::array(
            MemoryType::Host,
            MemoryType::Host,
            Arc::new(move |array, args| Ok(Array::from(kernel(host_input(array)?, args)?))),
        )
    }

    /// An implementation on arrays of `memory_in` returning `memory_out`
    /// (GPU runtimes). It receives the whole stack whatever the contract.
    pub fn array(memory_in: MemoryType, memory_out: MemoryType, kernel: ArrayKernel) -> Self {
        Implementation::array_in_context(memory_in, memory_out, Arc::new(move |array, args, _| kernel(array, args)))
    }

    /// [`Implementation::array`] for functions that use the call context.
    pub fn array_in_context(memory_in: MemoryType, memory_out: MemoryType, kernel: ArrayContextKernel) -> Self {
        Implementation { memory_in, memory_out, kernel, per_plane_host: None }
    }
}

/// The host stack a host kernel receives; a clear error for anything else.
fn host_input(array: Array) -> Result<Stack, FunctionError> {
    let got = array.memory_type();
    let shape = array.shape().to_vec();
    array.into_host_stack().ok_or_else(|| {
        if got == MemoryType::Host {
            FunctionError::NotAStack { function: String::new(), shape }
        } else {
            FunctionError::WrongMemory { function: String::new(), expected: MemoryType::Host, got }
        }
    })
}

/// Static description of a logical function.
#[derive(Debug, Clone, Serialize)]
pub struct FunctionSpec {
    pub name: &'static str,
    /// One line: what it does (and the reference it matches).
    pub doc: &'static str,
    pub contract: Contract,
    pub args: Vec<ArgSpec>,
}

/// A registered function: its spec and implementations.
#[derive(Debug, Clone)]
pub struct Function {
    pub spec: FunctionSpec,
    /// Tables it produces and consumes besides its stack.
    pub artifacts: Artifacts,
    pub implementations: Vec<Implementation>,
    /// Checks of the arguments against the stack a call gets ([`Registry::set_check`]).
    pub check: Option<ArgCheck>,
    /// The output shape, when it differs from the contract's default ([`Registry::set_output_shape`]).
    pub shape_rule: Option<ShapeRule>,
}

impl Function {
    /// True when a call with these arguments receives one plane at a time.
    pub fn per_plane(&self, args: &Args) -> bool {
        self.spec.contract == Contract::Pure2d || (self.spec.contract == Contract::Flexible && args.bool(SLICE_BY_SLICE))
    }

    /// Runs the function's [`ArgCheck`] for a call on a stack of shape `stack`
    /// (the whole stack; per-plane calls are checked with depth 1).
    pub fn check_args(&self, args: &Args, stack: &StackShape) -> Result<(), ArgError> {
        let Some(check) = self.check else { return Ok(()) };
        let shape = if self.per_plane(args) { stack.with_depth(1) } else { *stack };
        check(args, &shape).map_err(|p| ArgError::Invalid {
            function: self.spec.name.to_string(),
            name: p.arg.to_string(),
            problem: p.problem,
            fix: p.fix,
            shape,
        })
    }

    /// The shape of the stack a call returns for an input stack of shape
    /// `input`, or `None` when only the run knows it. A declared
    /// [`ShapeRule`] decides; otherwise per-plane calls keep the shape (a
    /// per-plane function that changes the plane size must declare its rule)
    /// and whole-stack functions are unknown.
    pub fn output_shape(&self, args: &Args, input: &StackShape) -> Option<StackShape> {
        match self.shape_rule {
            Some(rule) => rule(args, input),
            None if self.per_plane(args) => Some(*input),
            None => None,
        }
    }

    /// Every argument, including the automatic `slice_by_slice` of flexible functions.
    pub fn all_args(&self) -> Vec<ArgSpec> {
        let mut args = self.spec.args.clone();
        if self.spec.contract == Contract::Flexible {
            args.push(ArgSpec::bool(SLICE_BY_SLICE, false, "apply the function to each plane separately"));
        }
        args
    }

    /// The memory types this function has implementations for.
    pub fn memory_types(&self) -> Vec<MemoryType> {
        let mut v: Vec<_> = self.implementations.iter().map(|i| i.memory_in).collect();
        v.sort();
        v.dedup();
        v
    }

    /// Validates user-given arguments and fills defaults.
    pub fn validate_args(&self, given: Vec<(String, ArgValue)>) -> Result<Args, ArgError> {
        let all = self.all_args();
        let mut values: BTreeMap<String, ArgValue> = all.iter().map(|a| (a.name.to_string(), a.default.clone())).collect();
        for (name, value) in given {
            let spec = self.arg_spec(&all, &name)?;
            values.insert(name, spec.validate(self.spec.name, value)?);
        }
        Ok(Args { values })
    }

    /// Parses and validates `name=value` texts (from `--arg`).
    pub fn parse_args(&self, texts: &[String]) -> Result<Args, ArgError> {
        let all = self.all_args();
        let mut given = Vec::new();
        for t in texts {
            let (name, value) = t.split_once('=').ok_or_else(|| ArgError::Malformed(t.clone()))?;
            let name = name.trim();
            let spec = self.arg_spec(&all, name)?;
            given.push((name.to_string(), spec.parse_text(self.spec.name, value)?));
        }
        self.validate_args(given)
    }

    fn arg_spec<'a>(&self, all: &'a [ArgSpec], name: &str) -> Result<&'a ArgSpec, ArgError> {
        all.iter().find(|a| a.name == name).ok_or_else(|| {
            let known: Vec<String> = all.iter().map(|a| a.name.to_string()).collect();
            ArgError::Unknown {
                function: self.spec.name.to_string(),
                name: name.to_string(),
                suggestion: closest(name, known.iter().map(String::as_str)),
                known,
            }
        })
    }
}

/// The closest candidate by edit distance, if it is plausibly a typo.
pub fn closest<'a>(word: &str, candidates: impl Iterator<Item = &'a str>) -> Option<String> {
    candidates
        .map(|c| (edit_distance(word, c), c))
        .filter(|(d, c)| *d <= 2.max(c.len() / 3))
        .min_by_key(|(d, _)| *d)
        .map(|(_, c)| c.to_string())
}

fn edit_distance(a: &str, b: &str) -> usize {
    let b: Vec<char> = b.chars().collect();
    let mut prev: Vec<usize> = (0..=b.len()).collect();
    for (i, ca) in a.chars().enumerate() {
        let mut cur = vec![i + 1; b.len() + 1];
        for (j, cb) in b.iter().enumerate() {
            cur[j + 1] = (prev[j] + usize::from(ca != *cb)).min(prev[j + 1] + 1).min(cur[j] + 1);
        }
        prev = cur;
    }
    prev[b.len()]
}

/// A problem found while planning a call.
#[derive(Debug, Clone, PartialEq, thiserror::Error)]
pub enum PlanError {
    #[error("unknown function '{name}'{}; `hcsflow functions` lists them", suggestion.as_ref().map(|s| format!(" (did you mean '{s}'?)")).unwrap_or_default())]
    UnknownFunction { name: String, suggestion: Option<String> },
    #[error("{function} has no implementation for {device} (it has: {}); run it with --device cpu{}", available.iter().map(|m| m.name()).collect::<Vec<_>>().join(", "), if *device == Device::Cpu { " or add a host implementation" } else { "" })]
    NoImplementation { function: String, device: Device, available: Vec<MemoryType> },
    #[error(transparent)]
    Args(#[from] ArgError),
    #[error("{function}: {error}")]
    Conversion { function: String, error: ConversionError },
}

/// A validated call: what runs where, and how the input gets there.
#[derive(Debug, Clone)]
pub struct CallPlan {
    pub function: &'static str,
    pub contract: Contract,
    pub device: Device,
    pub args: Args,
    pub implementation: Implementation,
    /// Input memory type → implementation input.
    pub route_in: Route,
    /// The function's artifacts (copied from its registration).
    pub artifacts: Artifacts,
}

/// All registered functions.
#[derive(Debug, Clone, Default)]
pub struct Registry {
    functions: BTreeMap<&'static str, Function>,
}

impl Registry {
    pub fn new() -> Self {
        Self::default()
    }

    /// Registers a function, or adds implementations to one already registered
    /// under the same name (the host crate registers the spec; GPU crates add theirs).
    pub fn register(&mut self, spec: FunctionSpec, implementation: Implementation) {
        self.register_with_artifacts(spec, Artifacts::default(), implementation);
    }

    /// [`Registry::register`] for a function that produces or consumes
    /// artifacts (tables besides its stack, see [`crate::artifact`]).
    pub fn register_with_artifacts(&mut self, spec: FunctionSpec, artifacts: Artifacts, implementation: Implementation) {
        let entry = self.functions.entry(spec.name).or_insert_with(|| Function {
            spec,
            artifacts,
            implementations: Vec::new(),
            check: None,
            shape_rule: None,
        });
        entry.implementations.retain(|i| i.memory_in != implementation.memory_in);
        entry.implementations.push(implementation);
    }

    /// Adds an implementation to an already-registered function. Returns false if unknown.
    pub fn add_implementation(&mut self, name: &str, implementation: Implementation) -> bool {
        match self.functions.get_mut(name) {
            Some(f) => {
                f.implementations.retain(|i| i.memory_in != implementation.memory_in);
                f.implementations.push(implementation);
                true
            }
            None => false,
        }
    }

    /// Declares the [`ArgCheck`] of a registered function (it lives with the
    /// function, so every implementation gets it). Returns false if unknown.
    pub fn set_check(&mut self, name: &str, check: ArgCheck) -> bool {
        self.functions.get_mut(name).map(|f| f.check = Some(check)).is_some()
    }

    /// Declares the [`ShapeRule`] of a registered function. Returns false if unknown.
    pub fn set_output_shape(&mut self, name: &str, rule: ShapeRule) -> bool {
        self.functions.get_mut(name).map(|f| f.shape_rule = Some(rule)).is_some()
    }

    pub fn get(&self, name: &str) -> Result<&Function, PlanError> {
        self.functions
            .get(name)
            .ok_or_else(|| PlanError::UnknownFunction { name: name.to_string(), suggestion: closest(name, self.functions.keys().copied()) })
    }

    /// All functions in name order.
    pub fn functions(&self) -> impl Iterator<Item = &Function> {
        self.functions.values()
    }

    /// Plans a call of `name` on `device` for input arriving as `input_memory`.
    pub fn plan_call(
        &self,
        name: &str,
        args: Args,
        input_memory: MemoryType,
        device: Device,
        conversions: &Conversions,
        policy: ConversionPolicy,
    ) -> Result<CallPlan, PlanError> {
        let function = self.get(name)?;
        let implementation = function
            .implementations
            .iter()
            .find(|i| i.memory_in.is_device_memory() == matches!(device, Device::Gpu(_)))
            .cloned()
            .ok_or_else(|| PlanError::NoImplementation {
                function: function.spec.name.to_string(),
                device,
                available: function.memory_types(),
            })?;
        let route_in = conversions
            .plan(input_memory, implementation.memory_in, policy)
            .map_err(|error| PlanError::Conversion { function: function.spec.name.to_string(), error })?;
        Ok(CallPlan {
            function: function.spec.name,
            contract: function.spec.contract,
            device,
            args,
            implementation,
            route_in,
            artifacts: function.artifacts.clone(),
        })
    }

    /// Runs the function's [`ArgCheck`] for `plan` on a stack of shape
    /// `stack` (the whole stack the call gets): what a front end calls once it
    /// knows the input's shape and before it reads pixels (`hcsflow apply`
    /// with the input file's shape; compile with the plate's).
    pub fn check_call(&self, plan: &CallPlan, stack: &StackShape) -> Result<(), ArgError> {
        match self.functions.get(plan.function) {
            Some(f) => f.check_args(&plan.args, stack),
            None => Ok(()),
        }
    }

    /// Runs a planned call without pipeline context (no metadata, no consumed
    /// artifacts; produced artifacts are dropped). The result is in the
    /// implementation's output memory type.
    pub fn execute(&self, plan: &CallPlan, input: Array, conversions: &Conversions) -> Result<Array, FunctionError> {
        self.execute_in(plan, input, conversions, &mut CallContext::default())
    }

    /// Runs a planned call in `context`: the function reads the injected
    /// metadata and consumed artifacts there and leaves its artifacts and notes
    /// there. Every artifact it declares must be produced, and only those.
    pub fn execute_in(
        &self,
        plan: &CallPlan,
        input: Array,
        conversions: &Conversions,
        context: &mut CallContext,
    ) -> Result<Array, FunctionError> {
        let name = plan.function;
        if input.shape().len() != 3 {
            return Err(FunctionError::NotAStack { function: name.into(), shape: input.shape().to_vec() });
        }
        let n_in = input.shape()[0];
        // The check compile ran, again on the real stack: a defence for
        // callers that did not run it (and for shapes compile could not know).
        let shape = StackShape::new(n_in, input.shape()[1], input.shape()[2]);
        self.check_call(plan, &shape)?;
        // A conversion into the call (an upload) is its own span in traces.
        let input = if plan.route_in.kind == RouteKind::Identity {
            input
        } else {
            tracing::info_span!("conversion", route = %plan.route_in)
                .in_scope(|| conversions.execute(&plan.route_in, input, plan.device))?
        };
        let per_plane = plan.contract == Contract::Pure2d || (plan.contract == Contract::Flexible && plan.args.bool(SLICE_BY_SLICE));
        let label = |e: FunctionError| match e {
            FunctionError::NotAStack { shape, .. } => FunctionError::NotAStack { function: name.into(), shape },
            FunctionError::WrongMemory { expected, got, .. } => FunctionError::WrongMemory { function: name.into(), expected, got },
            other => other,
        };
        let before = context.outputs().len();
        let output = match (&plan.implementation.per_plane_host, per_plane) {
            (Some(kernel), true) => {
                let stack = input.into_host_stack().ok_or_else(|| FunctionError::WrongMemory {
                    function: name.into(),
                    expected: MemoryType::Host,
                    got: plan.implementation.memory_in,
                })?;
                let results: Vec<(Stack, CallContext)> = stack
                    .into_planes()
                    .into_par_iter()
                    .enumerate()
                    .map(|(z, plane)| {
                        let mut plane_context = context.for_plane(z);
                        let out = kernel(&plane, &plan.args, &mut plane_context)?;
                        Ok((out, plane_context))
                    })
                    .collect::<Result<_, FunctionError>>()?;
                let mut planes = Vec::with_capacity(results.len());
                let mut merged: Vec<(String, Table)> = Vec::new();
                for (z, (plane, mut plane_context)) in results.into_iter().enumerate() {
                    planes.push(plane);
                    let (outputs, notes) = plane_context.take_results();
                    for note in notes {
                        context.note(note);
                    }
                    for (artifact, table) in outputs {
                        let slot = match merged.iter().position(|(n, _)| *n == artifact) {
                            Some(i) => i,
                            None => {
                                merged.push((artifact.clone(), Table::default()));
                                merged.len() - 1
                            }
                        };
                        merged[slot].1.append(table, z).map_err(|e| FunctionError::failed(name, format!("artifact '{artifact}': {e}")))?;
                    }
                }
                for (artifact, table) in merged {
                    context.produce(&artifact, table);
                }
                let got: usize = planes.iter().map(Stack::depth).sum();
                let out = Stack::concat_owned(planes).filter(|_| got == n_in).ok_or(FunctionError::ContractViolation {
                    function: name.into(),
                    contract: plan.contract,
                    input: n_in,
                    got,
                    expected: n_in,
                })?;
                Array::from(out)
            }
            _ => (plan.implementation.kernel)(input, &plan.args, context).map_err(label)?,
        };
        if output.shape().len() != 3 {
            return Err(FunctionError::NotAStack { function: name.into(), shape: output.shape().to_vec() });
        }
        let expected = match plan.contract {
            Contract::Pure2d => Some(n_in),
            Contract::VolumetricToSlice => Some(1),
            Contract::Flexible if per_plane => Some(n_in),
            _ => None,
        };
        let got = output.shape()[0];
        if let Some(expected) = expected.filter(|&e| e != got) {
            return Err(FunctionError::ContractViolation { function: name.into(), contract: plan.contract, input: n_in, got, expected });
        }
        let produced: Vec<&str> = context.outputs()[before..].iter().map(|(n, _)| n.as_str()).collect();
        for p in &produced {
            if !plan.artifacts.produces.iter().any(|d| d.name == *p) {
                return Err(FunctionError::failed(name, format!("produced the undeclared artifact '{p}'")));
            }
        }
        for d in &plan.artifacts.produces {
            if !produced.contains(&d.name) {
                return Err(FunctionError::failed(name, format!("did not produce its artifact '{}'", d.name)));
            }
        }
        Ok(output)
    }
}

impl FromStr for Contract {
    type Err = String;
    fn from_str(s: &str) -> Result<Self, Self::Err> {
        match s {
            "pure_2d" => Ok(Contract::Pure2d),
            "pure_3d" => Ok(Contract::Pure3d),
            "flexible" => Ok(Contract::Flexible),
            "volumetric_to_slice" => Ok(Contract::VolumetricToSlice),
            _ => Err(format!("unknown contract '{s}'")),
        }
    }
}
