//! Errors of parsing, compiling and running a pipeline.

use std::path::PathBuf;

use hcsflow_plate::PlateError;

/// What went wrong. Compile-time problems ([`PipelineError::Step`],
/// [`PipelineError::Invalid`]) are the user's to fix and name the step and the
/// fix; the CLI maps them to exit code 2.
#[derive(Debug, thiserror::Error)]
pub enum PipelineError {
    #[error("{origin}: not a valid pipeline file: {message}")]
    Parse { origin: String, message: String },
    /// The operating system refused an operation on `path`.
    #[error("{path}: {source}")]
    Io { path: PathBuf, source: std::io::Error },
    /// An image of the plate could not be read (compile reads one for the plane size).
    #[error("{path}: {source}")]
    Image { path: PathBuf, source: Box<hcsflow_tiff::TiffError> },
    /// `OUT/run_manifest.json` is not a run manifest.
    #[error("{path}: not a run manifest: {source}")]
    Manifest { path: PathBuf, source: serde_json::Error },
    /// An OME-Zarr plate's metadata could not be written, or an input
    /// plate's array read (compile reads one for the plane size).
    #[error("{path}: {source}")]
    Zarr { path: PathBuf, source: Box<hcsflow_zarr::ZarrError> },
    #[error("step '{step}': {message}\n    fix: {fix}")]
    Step { step: String, message: String, fix: String },
    /// A step needs a conversion between memory types that cannot be planned
    /// (refused by the policy, or this build or environment lacks it): the
    /// conversion error is kept whole for front ends that report its parts.
    #[error("step '{step}': {function}: {error}\n    fix: {fix}")]
    Route { step: String, function: String, error: Box<hcsflow_core::ConversionError>, fix: String },
    /// Several problems found at compile time, all reported at once.
    #[error("{} problem(s) in the pipeline:\n{}", .0.len(), .0.iter().map(|e| format!("  {e}")).collect::<Vec<_>>().join("\n"))]
    Invalid(Vec<PipelineError>),
    /// A configuration problem not tied to a step (output folder inside the plate, …).
    #[error("{message}\n    fix: {fix}")]
    Config { message: String, fix: String },
    /// `--require-gpu` ([`CompileConfig::require_gpu`](crate::CompileConfig::require_gpu)):
    /// these calls would run on the host. A usage error, found at compile time.
    #[error(
        "--require-gpu: {} call(s) would run on the host, not on {device}:\n{}\n    fix: {fix}",
        calls.len(),
        calls.iter().map(|c| format!("  {c}")).collect::<Vec<_>>().join("\n")
    )]
    HostCalls { device: hcsflow_core::Device, calls: Vec<crate::compile::HostCall>, fix: String },
    /// A plate-wide step failed (an image of its sample could not be read,
    /// its function failed…); no well was started, since their consumers need
    /// its result. `--resume` runs it again.
    #[error("plate-wide step '{step}' failed, so no well was run: {message}")]
    PlateStep { step: String, message: String },
    #[error(transparent)]
    Plate(#[from] PlateError),
}

impl PipelineError {
    pub(crate) fn io(path: impl Into<PathBuf>, source: std::io::Error) -> Self {
        PipelineError::Io { path: path.into(), source }
    }

    pub(crate) fn step(step: &str, message: impl Into<String>, fix: impl Into<String>) -> Self {
        PipelineError::Step { step: step.to_string(), message: message.into(), fix: fix.into() }
    }

    /// True for problems the user fixes in the pipeline file or the command
    /// line (exit code 2 in the CLI), false for I/O and plate-reading failures.
    pub fn is_usage(&self) -> bool {
        matches!(
            self,
            PipelineError::Parse { .. }
                | PipelineError::Step { .. }
                | PipelineError::Route { .. }
                | PipelineError::Invalid(_)
                | PipelineError::Config { .. }
                | PipelineError::HostCalls { .. }
        )
    }

    /// The conversion that could not be planned, if this error (or the first
    /// of several found together) is one.
    pub fn conversion(&self) -> Option<&hcsflow_core::ConversionError> {
        match self {
            PipelineError::Route { error, .. } => Some(error),
            PipelineError::Invalid(all) => all.iter().find_map(PipelineError::conversion),
            _ => None,
        }
    }
}
