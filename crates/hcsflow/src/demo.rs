//! The demo pipeline (`hcsflow demo`): normalise, composite, max-Z, tile
//! positions, assemble and count nuclei, on a plate like `hcsflow-synth`'s
//! default (3×3 sites, 2 channels, a few z planes).

use hcsflow_pipeline::{PipelineError, PipelineSpec};

/// The demo pipeline's text, the file `examples/demo.toml` (embedded).
pub const DEMO_PIPELINE: &str = include_str!("../../../examples/demo.toml");

/// Where the demo pipeline comes from, as its errors and front ends name it.
pub const DEMO_PIPELINE_ORIGIN: &str = "examples/demo.toml (built in)";

/// The demo pipeline, parsed. An error here is a bug of this build (the text
/// is built in and tested), not the user's.
pub fn demo_pipeline() -> Result<PipelineSpec, PipelineError> {
    PipelineSpec::parse(DEMO_PIPELINE, DEMO_PIPELINE_ORIGIN)
}
