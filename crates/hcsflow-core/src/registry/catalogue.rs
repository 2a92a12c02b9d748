//! The catalogue: what a function is ([`FunctionSpec`], [`Function`]), its
//! declaration as a Rust value ([`FunctionDecl`]), and the [`Registry`] of
//! every function with its implementations.

use std::collections::BTreeMap;
use std::fmt;
use std::sync::Arc;

use serde::Serialize;

use super::args::{closest, ArgCheck, ArgError, ArgProblem, ArgSpec, ArgValue, Args, FunctionArgs, ShapeRule, StackShape};
use super::call::PlanError;
use super::implementation::{HostWork, Implementation, ScratchRule};
use super::FunctionError;
use super::{Contract, ZSplit, SLICE_BY_SLICE};
use crate::artifact::CallContext;
use crate::artifact::{ArtifactDecl, Artifacts};
use crate::memory::{Array, MemoryType};
use crate::stack::Stack;

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
#[derive(Clone)]
pub struct Function {
    pub spec: FunctionSpec,
    /// Tables it produces and consumes besides its stack.
    pub artifacts: Artifacts,
    pub implementations: Vec<Implementation>,
    /// Checks of the arguments against the stack a call gets ([`FunctionDecl::check`]).
    pub check: Option<ArgCheck>,
    /// The output shape, when it differs from the contract's default ([`FunctionDecl::output_shape`]).
    pub shape_rule: Option<ShapeRule>,
    /// How each plane may be reduced as it is read when the function runs on
    /// a plate-wide sample ([`FunctionDecl::with_plane_reduction`]).
    pub reduction: Option<ReductionRule>,
    /// Its output stack is a label image ([`FunctionDecl::with_label_output`]).
    pub output_labels: bool,
    /// Run again on its chunks' results, it gives the whole stack's result
    /// ([`FunctionDecl::with_chunk_combine`]).
    pub chunk_combine: bool,
    /// A step runs its stacks that call it one after another
    /// ([`FunctionDecl::with_one_stack_at_a_time`]).
    pub one_stack_at_a_time: bool,
}

/// A reduction of every plane as it is read, declared by a function that runs
/// on a plate-wide sample and needs less than the full planes (BaSiC fits at a
/// working size): the pipeline never holds the sample at full size, only one
/// full plane per reading thread. The function receives the reduced planes and
/// [`CallContext::reduced_from`] (the full size its result must have).
#[derive(Clone)]
pub struct PlaneReduction {
    /// `(height, width)` of a reduced plane.
    pub size: (usize, usize),
    /// What it does, for the plan (e.g. "resized to 128×128, BaSiC's working size").
    pub what: String,
    /// One plane `[1, H, W]` in, one plane `[1, size.0, size.1]` out.
    pub reduce: ReducePlane,
}

/// The function of a [`PlaneReduction`]: one plane in, its reduction out.
pub type ReducePlane = Arc<dyn Fn(&Stack) -> Result<Stack, FunctionError> + Send + Sync>;

impl fmt::Debug for PlaneReduction {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("PlaneReduction").field("size", &self.size).field("what", &self.what).finish()
    }
}

/// A function's [`PlaneReduction`] for its arguments and the full plane
/// `(height, width)`; `None`: the planes are used as they are.
pub type ReductionRule = Arc<dyn Fn(&Args, (usize, usize)) -> Option<PlaneReduction> + Send + Sync>;
/// A declared function's [`ReductionRule`] on its typed arguments.
pub type DeclaredReduction<A> = fn(&A, (usize, usize)) -> Option<PlaneReduction>;

impl Function {
    /// The reduction of planes of `plane` = `(height, width)` this call
    /// wants when it runs on a plate-wide sample, if any.
    pub fn plane_reduction(&self, args: &Args, plane: (usize, usize)) -> Option<PlaneReduction> {
        self.reduction.as_ref().and_then(|rule| rule(args, plane))
    }

    /// True when a call with these arguments receives one plane at a time.
    pub fn per_plane(&self, args: &Args) -> bool {
        self.spec.contract == Contract::Pure2d || (self.spec.contract == Contract::Flexible && args.flag(SLICE_BY_SLICE))
    }

    /// How a call with these arguments may run on its stack in chunks of
    /// planes ([`ZSplit`]); `None`: only whole. Per-plane calls split by
    /// planes, reductions declared [`FunctionDecl::with_chunk_combine`] by
    /// combining; a function with artifacts (tables produced or consumed) is
    /// never split, since its tables are not merged chunk by chunk.
    pub fn z_split(&self, args: &Args) -> Option<ZSplit> {
        if !self.artifacts.produces.is_empty() || !self.artifacts.consumes.is_empty() {
            return None;
        }
        if self.per_plane(args) {
            Some(ZSplit::Planes)
        } else if self.chunk_combine && self.spec.contract == Contract::VolumetricToSlice {
            Some(ZSplit::Combine)
        } else {
            None
        }
    }

    /// Runs the function's [`ArgCheck`] for a call on a stack of shape `stack`
    /// (the whole stack; per-plane calls are checked with depth 1).
    pub fn check_args(&self, args: &Args, stack: &StackShape) -> Result<(), ArgError> {
        let Some(check) = &self.check else { return Ok(()) };
        let shape = if self.per_plane(args) { stack.with_depth(1) } else { *stack };
        check(args, &shape).map_err(|p| ArgError::Invalid {
            function: self.spec.name.to_string(),
            name: p.arg.map(str::to_string),
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
        match &self.shape_rule {
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
        Ok(Args::new(values))
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

impl fmt::Debug for Function {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Function")
            .field("spec", &self.spec)
            .field("artifacts", &self.artifacts)
            .field("implementations", &self.implementations)
            .field("check", &self.check.is_some())
            .field("shape_rule", &self.shape_rule.is_some())
            .field("reduction", &self.reduction.is_some())
            .field("output_labels", &self.output_labels)
            .field("chunk_combine", &self.chunk_combine)
            .field("one_stack_at_a_time", &self.one_stack_at_a_time)
            .finish()
    }
}

/// A declared function's [`ArgCheck`] on its typed arguments.
pub type DeclaredCheck<A> = fn(&A, &StackShape) -> Result<(), ArgProblem>;
/// A declared function's [`ShapeRule`] on its typed arguments.
pub type DeclaredShapeRule<A> = fn(&A, &StackShape) -> Option<StackShape>;

/// The declaration of a function implemented in Rust, as a value: its name
/// (written once, here), doc, contract, artifacts, argument checks and output
/// shape; its arguments are the typed struct `A` ([`FunctionArgs`]). Host and
/// GPU crates attach implementations by referring to it
/// ([`FunctionDecl::host`], [`FunctionDecl::device`]), so a function's name is
/// never repeated as a string and a kernel reads the arguments of the function
/// it implements (its closure receives `&A`).
///
/// ```
/// use hcsflow_core::{function_args, Contract, FunctionDecl, Registry};
/// function_args! {
///     pub struct ScaleArgs {
///         factor: f64 = float(2.0, Some(0.0), Some(10.0), "multiplier"),
///     }
/// }
/// pub static SCALE: FunctionDecl<ScaleArgs> = FunctionDecl::new("scale", Contract::Pure2d, "Multiplies every pixel.")
///     .with_output_shape(hcsflow_core::same_shape);
///
/// let mut registry = Registry::new();
/// registry.add(SCALE.host(|stack, args, _| {
///     let factor = args.factor as f32;
///     Ok(hcsflow_core::Stack::from(stack.to_f32().mapv(|v| v * factor)))
/// }));
/// let function = registry.get(SCALE.name).unwrap();
/// assert_eq!(function.spec.args[0].name, "factor");
/// ```
pub struct FunctionDecl<A> {
    pub name: &'static str,
    /// One line: what it does (and the reference it matches).
    pub doc: &'static str,
    pub contract: Contract,
    /// Tables it produces besides its stack.
    pub produces: &'static [ArtifactDecl],
    /// Tables of earlier steps it reads.
    pub consumes: &'static [ArtifactDecl],
    /// Refuses arguments that cannot work for the stack a call gets (see [`ArgCheck`]).
    pub check: Option<DeclaredCheck<A>>,
    /// The output shape, when it differs from the contract's default (see [`ShapeRule`]).
    pub output_shape: Option<DeclaredShapeRule<A>>,
    /// The reduction of each plane as it is read for a plate-wide sample (see [`PlaneReduction`]).
    pub reduction: Option<DeclaredReduction<A>>,
    /// The output stack is a label image: integer object numbers, 0 the
    /// background (a segmentation). Outputs that keep images apart from
    /// labels (OME-Zarr's NGFF `labels`) store it as one.
    pub output_labels: bool,
    /// A reduction (N → 1) whose result on a stack equals its result on the
    /// concatenated results of the stack's chunks ([`Self::with_chunk_combine`]).
    pub chunk_combine: bool,
    /// A step runs its stacks that call it one after another, not side by
    /// side ([`Self::with_one_stack_at_a_time`]).
    pub one_stack_at_a_time: bool,
}

impl<A> FunctionDecl<A> {
    /// A declaration without artifacts, checks or shape rule.
    pub const fn new(name: &'static str, contract: Contract, doc: &'static str) -> Self {
        FunctionDecl {
            name,
            doc,
            contract,
            produces: &[],
            consumes: &[],
            check: None,
            output_shape: None,
            reduction: None,
            output_labels: false,
            chunk_combine: false,
            one_stack_at_a_time: false,
        }
    }

    /// With the artifacts it produces.
    pub const fn with_produces(self, produces: &'static [ArtifactDecl]) -> Self {
        FunctionDecl { produces, ..self }
    }

    /// With the artifacts it consumes.
    pub const fn with_consumes(self, consumes: &'static [ArtifactDecl]) -> Self {
        FunctionDecl { consumes, ..self }
    }

    /// With its argument check.
    pub const fn with_check(self, check: DeclaredCheck<A>) -> Self {
        FunctionDecl { check: Some(check), ..self }
    }

    /// With its output-shape rule.
    pub const fn with_output_shape(self, rule: DeclaredShapeRule<A>) -> Self {
        FunctionDecl { output_shape: Some(rule), ..self }
    }

    /// With the reduction of each plane read for a plate-wide sample.
    pub const fn with_plane_reduction(self, rule: DeclaredReduction<A>) -> Self {
        FunctionDecl { reduction: Some(rule), ..self }
    }

    /// Declares that its output stack is a label image (see [`FunctionDecl::output_labels`]).
    pub const fn with_label_output(self) -> Self {
        FunctionDecl { output_labels: true, ..self }
    }

    /// Declares a reduction (N → 1, [`Contract::VolumetricToSlice`]) that
    /// combines: run on the concatenated results of the stack's chunks, it
    /// returns its result on the whole stack, bit for bit (max, min; not a
    /// mean of unequal chunks, nor an f32 sum whose rounding depends on the
    /// order; a declaration's comment states any exception, such as NaN). A stack too large for the device's memory budget then runs in
    /// chunks of planes, and the function once more on the chunks' results
    /// ([`ZSplit::Combine`]).
    pub const fn with_chunk_combine(self) -> Self {
        FunctionDecl { chunk_combine: true, ..self }
    }

    /// Declares a function that uses every core on one stack and holds a
    /// large working set while it runs (N2V2 trains a network per stack): a
    /// step whose chains call it runs its stacks (e.g. one per channel) one
    /// after another instead of side by side, so a well holds one such
    /// working set at a time and the function's own parallelism is not
    /// shared with a sibling's. Results are the same either way.
    pub const fn with_one_stack_at_a_time(self) -> Self {
        FunctionDecl { one_stack_at_a_time: true, ..self }
    }
}

impl<A: FunctionArgs> FunctionDecl<A> {
    /// The spec `hcsflow functions` shows.
    pub fn spec(&self) -> FunctionSpec {
        FunctionSpec { name: self.name, doc: self.doc, contract: self.contract, args: A::arg_specs() }
    }

    /// A host implementation on a borrowed stack with typed arguments, as a
    /// [`Binding`] for [`Registry::add`]: [`Implementation::host`] (per-plane
    /// contracts get one plane per call).
    pub fn host(&self, kernel: impl Fn(&Stack, &A, &mut CallContext) -> Result<Stack, FunctionError> + Send + Sync + 'static) -> Binding {
        self.bind(Implementation::host(move |stack, args, context| kernel(stack, &A::from_args(args), context)))
    }

    /// A host implementation on the whole stack by value with typed
    /// arguments: [`Implementation::host_owned`].
    pub fn host_owned(
        &self,
        kernel: impl Fn(Stack, &A, &mut CallContext) -> Result<Stack, FunctionError> + Send + Sync + 'static,
    ) -> Binding {
        self.bind(Implementation::host_owned(move |stack, args, context| kernel(stack, &A::from_args(args), context)))
    }

    /// An implementation on arrays of a device memory type (in and out) with
    /// typed arguments: [`Implementation::array`].
    pub fn device(
        &self,
        memory: MemoryType,
        kernel: impl Fn(Array, &A, &mut CallContext) -> Result<Array, FunctionError> + Send + Sync + 'static,
    ) -> Binding {
        self.bind(Implementation::array(memory, memory, move |array, args, context| kernel(array, &A::from_args(args), context)))
    }

    /// This declaration with `implementation` (which reads `A`'s arguments).
    fn bind(&self, implementation: Implementation) -> Binding {
        let check =
            self.check.map(|check| -> ArgCheck { Arc::new(move |args: &Args, shape: &StackShape| check(&A::from_args(args), shape)) });
        let shape_rule = self
            .output_shape
            .map(|rule| -> ShapeRule { Arc::new(move |args: &Args, shape: &StackShape| rule(&A::from_args(args), shape)) });
        let reduction = self
            .reduction
            .map(|rule| -> ReductionRule { Arc::new(move |args: &Args, plane: (usize, usize)| rule(&A::from_args(args), plane)) });
        Binding {
            declaration: Function {
                spec: self.spec(),
                artifacts: Artifacts { produces: self.produces.to_vec(), consumes: self.consumes.to_vec() },
                implementations: Vec::new(),
                check,
                shape_rule,
                reduction,
                output_labels: self.output_labels,
                chunk_combine: self.chunk_combine,
                one_stack_at_a_time: self.one_stack_at_a_time,
            },
            implementation,
        }
    }
}

/// A function's declaration with one implementation of it: what
/// [`FunctionDecl::host`] (and `host_owned`, `device`) make and [`Registry::add`] takes.
#[derive(Debug)]
pub struct Binding {
    declaration: Function,
    implementation: Implementation,
}

impl Binding {
    /// The function it implements.
    pub fn function(&self) -> &'static str {
        self.declaration.spec.name
    }

    /// The memory type the implementation takes.
    pub fn memory_in(&self) -> MemoryType {
        self.implementation.memory_in
    }

    /// Declares that without the `without` artifact this implementation
    /// brings its input to the host and does `work` there ([`HostWork`]).
    pub fn with_host_work(mut self, without: &'static str, work: &'static str) -> Binding {
        self.implementation.host_work = Some(HostWork { without, work });
        self
    }

    /// Declares the device memory the implementation allocates besides its
    /// input and output ([`ScratchRule`]), for the executor's memory budget.
    pub fn with_scratch(mut self, scratch: ScratchRule) -> Binding {
        self.implementation.scratch = Some(scratch);
        self
    }
}

/// All registered functions.
#[derive(Debug, Clone, Default)]
pub struct Registry {
    pub(super) functions: BTreeMap<&'static str, Function>,
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
            reduction: None,
            output_labels: false,
            chunk_combine: false,
            one_stack_at_a_time: false,
        });
        entry.implementations.retain(|i| i.memory_in != implementation.memory_in);
        entry.implementations.push(implementation);
    }

    /// Adds the implementation of `binding` to its function, declaring the
    /// function first if this registry does not know it yet (the host crate
    /// usually declares it; a GPU crate's binding refers to the same
    /// declaration, so it cannot name a function that does not exist). An
    /// implementation for the same input memory type is replaced.
    pub fn add(&mut self, binding: Binding) {
        let Binding { declaration, implementation } = binding;
        let entry = self.functions.entry(declaration.spec.name).or_insert(declaration);
        entry.implementations.retain(|i| i.memory_in != implementation.memory_in);
        entry.implementations.push(implementation);
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
}
