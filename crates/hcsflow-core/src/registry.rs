//! The function registry: one logical function (e.g. `max_projection`) with
//! implementations per memory type, a contract, and typed arguments.
//!
//! Using a function is two phases, like the pipeline compiler: [`Registry::plan_call`]
//! validates everything that can be checked without pixels (function name,
//! arguments, device, implementation, conversion route) and returns a
//! [`CallPlan`]; [`Registry::execute`] runs it.
//!
//! - [`args`]: argument declarations, values, validation, the typed
//!   [`FunctionArgs`] struct of a function and its checks;
//! - [`implementation`]: [`Implementation`] (untyped, run-time registered
//!   functions; a [`FunctionDecl`] makes typed ones);
//! - [`catalogue`]: [`FunctionDecl`] (a function declared as a Rust value),
//!   [`Function`] and the [`Registry`];
//! - [`call`]: planning and running one call.

use std::fmt;
use std::str::FromStr;

use serde::Serialize;

use crate::convert::ConversionError;
use crate::memory::MemoryType;

pub mod args;
pub mod call;
pub mod catalogue;
pub mod implementation;

pub use args::{
    blamed, closest, one_plane, same_shape, ArgCheck, ArgDecl, ArgError, ArgKind, ArgProblem, ArgSpec, ArgType, ArgValue, Args,
    FunctionArgs, NoArgs, ShapeRule, StackShape,
};
pub use call::{CallPlan, PlanError};
pub use catalogue::{
    Binding, DeclaredCheck, DeclaredReduction, DeclaredShapeRule, Function, FunctionDecl, FunctionSpec, PlaneReduction, ReductionRule,
    Registry,
};
pub use implementation::{ArrayKernel, HostKernel, HostWork, Implementation, ScratchRule};

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

/// How a call may run on its stack cut along Z into chunks of planes, when
/// the whole stack does not fit the device's memory budget (the executor
/// chooses the chunks; see `hcsflow-pipeline`). A function that cannot is
/// run whole or not at all.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize)]
#[serde(rename_all = "snake_case")]
pub enum ZSplit {
    /// Each plane is computed on its own (`pure_2d`, flexible with
    /// `slice_by_slice`): the chunks' outputs concatenated in order are the
    /// whole stack's output.
    Planes,
    /// A reduction N → 1 declared with
    /// [`FunctionDecl::with_chunk_combine`]: the function run again on its
    /// chunks' results (one plane each, concatenated in order) gives the
    /// whole stack's result (max, min).
    Combine,
}

impl fmt::Display for ZSplit {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(match self {
            ZSplit::Planes => "planes",
            ZSplit::Combine => "combine",
        })
    }
}

/// The name of the argument every [`Contract::Flexible`] function gets.
pub const SLICE_BY_SLICE: &str = "slice_by_slice";

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
