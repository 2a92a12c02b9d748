//! Calling a function: [`Registry::plan_call`] validates everything that can
//! be checked without pixels and returns a [`CallPlan`]; [`Registry::execute`]
//! runs it.

use rayon::prelude::*;

use super::args::{ArgError, Args, StackShape};
use super::implementation::{HostKernel, Implementation};
use super::{Contract, FunctionError, ZSplit, SLICE_BY_SLICE};
use crate::artifact::{Artifacts, CallContext, Table};
use crate::convert::{ConversionError, ConversionPolicy, Conversions, Route, RouteKind};
use crate::dtype::DType;
use crate::memory::{check_device, Array, Device, MemoryType};
use crate::registry::Registry;
use crate::stack::Stack;

/// A problem found while planning a call.
#[derive(Debug, Clone, PartialEq, thiserror::Error)]
pub enum PlanError {
    #[error("unknown function '{name}'{}; `hcsflow functions` lists them", suggestion.as_ref().map(|s| format!(" (did you mean '{s}'?)")).unwrap_or_default())]
    UnknownFunction { name: String, suggestion: Option<String> },
    /// No implementation runs on `device`; `reason` says why for the first
    /// one it has ([`check_device`]).
    #[error("{function} has no implementation for {device} (it has: {}): {reason}", available.iter().map(|m| m.name()).collect::<Vec<_>>().join(", "))]
    NoImplementation { function: String, device: Device, available: Vec<MemoryType>, reason: String },
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
    /// The function's output is a label image ([`crate::FunctionDecl::with_label_output`]).
    pub output_labels: bool,
    /// How the call may run on its stack in chunks of planes ([`crate::registry::Function::z_split`]).
    pub z_split: Option<ZSplit>,
    /// Stacks calling it run one after another ([`crate::FunctionDecl::with_one_stack_at_a_time`]).
    pub one_stack_at_a_time: bool,
}

impl CallPlan {
    /// True when the call runs one plane at a time.
    pub fn per_plane(&self) -> bool {
        self.contract == Contract::Pure2d || (self.contract == Contract::Flexible && self.args.flag(SLICE_BY_SLICE))
    }

    /// An estimate of the device memory the call holds at once on an input
    /// of shape `input` and `dtype` giving an output of shape `output`: the
    /// input as a device stores it (planes of 32-bit words: u8/u16 packed),
    /// the output counted at 4 bytes a pixel (f32, the widest dtype), and the
    /// implementation's declared scratch ([`crate::ScratchRule`]).
    pub fn working_set(&self, input: &StackShape, dtype: DType, output: &StackShape) -> u64 {
        let words = |pixels: usize, bytes: usize| ((pixels * bytes).div_ceil(4) * 4) as u64;
        let input_bytes = input.depth as u64 * words(input.height * input.width, dtype.size_bytes());
        let output_bytes = output.depth as u64 * words(output.height * output.width, 4);
        let scratch = self.implementation.scratch.map_or(0, |rule| rule(input, dtype));
        input_bytes + output_bytes + scratch
    }
}

impl Registry {
    /// Plans a call of `name` on `device` for input arriving as `input_memory`:
    /// the implementation is the one of the device's runtime (host memory for
    /// the CPU, wgpu buffers for a wgpu adapter).
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
        let implementation = function.implementations.iter().find(|i| device.runtime().runs(i.memory_in)).cloned().ok_or_else(|| {
            let available = function.memory_types();
            let reason =
                available.first().and_then(|m| check_device(*m, device).err()).unwrap_or_else(|| "it has no implementation".into());
            PlanError::NoImplementation { function: function.spec.name.to_string(), device, available, reason }
        })?;
        let route_in = conversions
            .plan(input_memory, implementation.memory_in, device.runtime(), policy)
            .map_err(|error| PlanError::Conversion { function: function.spec.name.to_string(), error })?;
        Ok(CallPlan {
            function: function.spec.name,
            contract: function.spec.contract,
            device,
            implementation,
            route_in,
            artifacts: function.artifacts.clone(),
            output_labels: function.output_labels,
            z_split: function.z_split(&args),
            one_stack_at_a_time: function.one_stack_at_a_time,
            args,
        })
    }

    /// Runs the function's [`ArgCheck`](crate::ArgCheck) for `plan` on a stack of shape
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
        let before = context.outputs().len();
        let output = match (&plan.implementation.per_plane_host, plan.per_plane()) {
            (Some(kernel), true) => run_per_plane(plan, kernel, input, context)?,
            _ => (plan.implementation.kernel)(input, &plan.args, context).map_err(|e| label(name, e))?,
        };
        check_output(plan, n_in, &output)?;
        check_produced(plan, &context.outputs()[before..])?;
        Ok(output)
    }
}

/// An error of an implementation with the function's name filled in.
fn label(name: &str, error: FunctionError) -> FunctionError {
    match error {
        FunctionError::NotAStack { shape, .. } => FunctionError::NotAStack { function: name.into(), shape },
        FunctionError::WrongMemory { expected, got, .. } => FunctionError::WrongMemory { function: name.into(), expected, got },
        other => other,
    }
}

/// Runs a host kernel on every plane of `input` in parallel, each with its
/// plane's context, and merges the planes and what they produced (artifact
/// rows in plane order, notes) into one stack and `context`.
fn run_per_plane(plan: &CallPlan, kernel: &HostKernel, input: Array, context: &mut CallContext) -> Result<Array, FunctionError> {
    let name = plan.function;
    let stack = input.into_host_stack().ok_or_else(|| FunctionError::WrongMemory {
        function: name.into(),
        expected: MemoryType::Host,
        got: plan.implementation.memory_in,
    })?;
    let n_in = stack.depth();
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
    Ok(Array::from(out))
}

/// The output is a stack with the plane count the contract promises.
fn check_output(plan: &CallPlan, n_in: usize, output: &Array) -> Result<(), FunctionError> {
    let name = plan.function;
    if output.shape().len() != 3 {
        return Err(FunctionError::NotAStack { function: name.into(), shape: output.shape().to_vec() });
    }
    let expected = match plan.contract {
        Contract::Pure2d => Some(n_in),
        Contract::VolumetricToSlice => Some(1),
        Contract::Flexible if plan.per_plane() => Some(n_in),
        _ => None,
    };
    let got = output.shape()[0];
    if let Some(expected) = expected.filter(|&e| e != got) {
        return Err(FunctionError::ContractViolation { function: name.into(), contract: plan.contract, input: n_in, got, expected });
    }
    Ok(())
}

/// The call produced exactly the artifacts its function declares.
fn check_produced(plan: &CallPlan, outputs: &[(String, Table)]) -> Result<(), FunctionError> {
    let produced: Vec<&str> = outputs.iter().map(|(n, _)| n.as_str()).collect();
    for p in &produced {
        if !plan.artifacts.produces.iter().any(|d| d.name == *p) {
            return Err(FunctionError::failed(plan.function, format!("produced the undeclared artifact '{p}'")));
        }
    }
    // A planes artifact is the call's result itself, not a recorded table.
    for d in plan.artifacts.produces.iter().filter(|d| d.kind == crate::ArtifactKind::Table) {
        if !produced.contains(&d.name) {
            return Err(FunctionError::failed(plan.function, format!("did not produce its artifact '{}'", d.name)));
        }
    }
    Ok(())
}
