//! The set-up every pipeline test repeats: a synthetic plate on disk, the
//! compile configuration of a CPU run, compile a pipeline's text, run a plan.
//! The registry is the facade's `builtin()` unless a test brings its own.
#![allow(dead_code)]

use std::path::{Path, PathBuf};

use hcsflow::builtin;
use hcsflow_core::{ConversionPolicy, Conversions, Device, Registry};
use hcsflow_pipeline::{compile, execute, CompileConfig, MissingPolicy, PipelineError, PipelineSpec, Plan, RunOptions, RunSummary};
use hcsflow_plate::Plate;
use hcsflow_synth::{generate, SynthConfig};

/// A max projection over z, to TIFF.
pub const MAX_Z: &str = r#"
name = "t"
[[steps]]
name = "max_z"
func = "max_projection"
variable_components = ["z_index"]
materialize = ["tiff"]
"#;

/// A min projection over z, to TIFF.
pub const MIN_Z: &str = "name = \"min_z\"\n[[steps]]\nname = \"min_z\"\nfunc = \"min_projection\"\nvariable_components = [\"z_index\"]\nmaterialize = [\"tiff\"]\n";

/// Generates the synthetic plate `cfg` describes in folder `root`; returns `root`.
pub fn synth_plate(root: &Path, cfg: &SynthConfig) -> PathBuf {
    generate(cfg, root).expect("generate the synthetic plate");
    root.to_path_buf()
}

/// Opens the plate in `root`.
pub fn open(root: &Path) -> Plate {
    hcsflow_plate::open_plate(root, None).expect("open plate")
}

/// The compile configuration of a run on the CPU into `out`.
pub fn cpu_config(out: &Path, missing: MissingPolicy) -> CompileConfig {
    CompileConfig {
        device: Device::Cpu,
        device_reason: "test".into(),
        policy: ConversionPolicy::default(),
        out: out.to_path_buf(),
        missing,
        require_gpu: false,
    }
}

/// Compiles the pipeline text `toml` for `plate` with `functions` (e.g. `builtin()`).
pub fn compile_with(functions: &(Registry, Conversions), plate: &Plate, toml: &str, config: &CompileConfig) -> Result<Plan, PipelineError> {
    let spec = PipelineSpec::parse(toml, "test.toml")?;
    compile(plate, &spec, &functions.0, &functions.1, config)
}

/// Compiles `toml` for `plate` with the built-in functions, on the CPU into `out`.
pub fn compile_text(plate: &Plate, toml: &str, out: &Path) -> Result<Plan, PipelineError> {
    compile_with(&builtin(), plate, toml, &cpu_config(out, MissingPolicy::default()))
}

/// Runs `plan` with `functions` (e.g. `builtin()`), silently.
pub fn run_with(functions: &(Registry, Conversions), plan: &Plan, options: &RunOptions) -> Result<RunSummary, PipelineError> {
    execute(plan, &functions.0, &functions.1, options, &|_| {})
}
