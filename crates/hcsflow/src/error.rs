//! The facade's one error type: every engine error keeps its own type (as a
//! variant or a source), and [`Error::kind`] sorts them into what a front end
//! does with them.

use std::path::PathBuf;

use hcsflow_core::{ArgError, CallError, ConversionError, DeviceError, FunctionError, PlanError};
use hcsflow_pipeline::PipelineError;
use hcsflow_plate::PlateError;

/// What went wrong in a call to the engine. Every variant keeps the engine's
/// typed error: match on it, or ask [`Error::kind`] for the broad class.
/// More variants come with more runtimes and front ends (`non_exhaustive`).
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum Error {
    /// The pipeline file is missing, unreadable or not a valid pipeline.
    /// Always the user's to fix, whatever went wrong reading it.
    #[error(transparent)]
    Spec(PipelineError),
    /// Run options that cannot work together (e.g. zero workers).
    #[error(transparent)]
    Options(#[from] OptionsError),
    /// The plate could not be opened (unreadable, not a plate, corrupt metadata).
    #[error("opening plate {}", path.display())]
    Plate {
        path: PathBuf,
        #[source]
        source: PlateError,
    },
    /// The device asked for does not exist or may not be used.
    #[error(transparent)]
    Device(#[from] DeviceError),
    /// Compiling or executing a pipeline failed; [`PipelineError::is_usage`]
    /// says whether the user fixes it in the pipeline or the options.
    #[error(transparent)]
    Pipeline(#[from] PipelineError),
    /// A single call: no such function, or no implementation for the device.
    #[error(transparent)]
    Call(#[from] PlanError),
    /// A single call: an argument is unknown, malformed or out of range (for
    /// the input's shape, too).
    #[error(transparent)]
    Arg(#[from] ArgError),
    /// A single call: no conversion the policy allows brings the data in or out.
    #[error(transparent)]
    Route(ConversionError),
    /// A single call: the function failed on its input.
    #[error(transparent)]
    Function(#[from] FunctionError),
    /// A single call: the result could not be brought back to host memory as
    /// a 3D stack.
    #[error("{function}: bringing the result back to the host")]
    ToHost {
        function: String,
        #[source]
        error: ConversionError,
    },
}

impl From<CallError> for Error {
    fn from(e: CallError) -> Self {
        match e {
            CallError::Plan(e) => Error::Call(e),
            CallError::Function(e) => Error::Function(e),
            CallError::ToHost { function, error } => Error::ToHost { function, error },
        }
    }
}

/// Run options that cannot work together.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum OptionsError {
    #[error("--workers must be at least 1")]
    NoWorkers,
    /// The wells could not be spread over the adapters of `--device gpu:N,M`.
    #[error("--device: {0}")]
    Gpus(hcsflow_core::AssignError),
}

/// The broad class of an [`Error`]: what a front end does about it (the CLI's
/// exit codes 2, 1 and 3).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ErrorKind {
    /// The request is wrong (options, pipeline, function, arguments): found
    /// before any pixel is read; fix the request and retry.
    Usage,
    /// The request was fine but the work failed (I/O, a plate that cannot be
    /// read, a function that failed).
    Failure,
    /// The device asked for is not available on this machine.
    DeviceUnavailable,
}

impl Error {
    /// The class of this error, from its type alone.
    pub fn kind(&self) -> ErrorKind {
        match self {
            Error::Spec(_) | Error::Options(_) | Error::Call(_) | Error::Arg(_) | Error::Route(_) => ErrorKind::Usage,
            Error::Pipeline(e) if e.is_usage() => ErrorKind::Usage,
            Error::Device(_) => ErrorKind::DeviceUnavailable,
            Error::Pipeline(_) | Error::Plate { .. } | Error::Function(_) | Error::ToHost { .. } => ErrorKind::Failure,
        }
    }
}
