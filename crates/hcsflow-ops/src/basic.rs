//! BaSiC flat-field and dark-field correction (the algorithm is `hcsflow-basic`):
//!
//! - `basic_fit`: the tiles `[N, Y, X]` (N ≥ 2) of **one** channel →
//!   `[2, Y, X]` f32: plane 0 the flat-field (mean 1), plane 1 the dark-field
//!   (zeros unless `darkfield = true`). Artifacts are tables today, so the
//!   profiles travel as the output planes; the step must keep f32
//!   (`dtype = "f32"`) or the dtype policy rounds the flat-field to integers.
//!   It produces the `basic_baseline` table (one row per input plane) and
//!   notes the fit's smoothness, iterations and convergence.
//! - `basic_correct`: `(I − camera_offset − D) / F` per plane, with the
//!   profiles read from TIFF files named by its arguments (relative paths from
//!   the working directory); f32, brought back to the input dtype by the dtype
//!   policy (negative values clip to 0 there).

use std::path::Path;

use hcsflow_basic::{profiles, BasicParams};
use hcsflow_core::{
    ArgProblem, ArtifactDecl, CallContext, Cell, Contract, FunctionDecl, FunctionError, Registry, Stack, StackShape, Table,
};

hcsflow_core::function_args! {
    /// The arguments of [`BASIC_FIT`] (BaSiCPy 2.0's defaults).
    pub struct BasicFitArgs {
        working_size: i64 = int(128, Some(2), Some(1024), "side the tiles are resized to before fitting"),
        darkfield: bool = bool(false, "also estimate a dark-field (less stable than the flat-field)"),
        smoothness_flatfield: f64 = float(0.0, Some(0.0), None, "L1 weight on the flat-field's DCT; 0: automatic (BaSiCPy's rule)"),
        smoothness_darkfield: f64 = float(0.0, Some(0.0), None, "L1 weight on the dark-field's DCT; 0: 0.1 × the flat-field's"),
        sort_intensity: bool = bool(false, "sort each pixel's values across the tiles before fitting"),
        max_iterations: i64 = int(500, Some(1), Some(100_000), "ADMM iterations per solve, at most"),
        max_reweight_iterations: i64 = int(10, Some(1), Some(1000), "re-weighting rounds, at most"),
        optimization_tol: f64 = float(1e-3, Some(0.0), None, "ADMM stops at |residual| / |images| <= this"),
        reweighting_tol: f64 = float(1e-2, Some(0.0), None, "re-weighting stops when the flat-field changes by <= this (relative L1)"),
        epsilon: f64 = float(0.1, Some(0.0), None, "epsilon of the re-weighting 1/(|R/I_B| + epsilon)"),
    }
}

hcsflow_core::function_args! {
    /// The arguments of [`BASIC_CORRECT`].
    pub struct BasicCorrectArgs {
        flatfield: String = text("", "flat-field TIFF (one page, or an -ffp.tiff with one page per channel)"),
        darkfield: String = text("", "dark-field TIFF in raw counts (or a -dfp.tiff); empty: none"),
        channel: i64 = int(0, Some(0), None, "page of a multi-channel -ffp/-dfp file (0-based)"),
        camera_offset: f64 = float(0.0, None, None, "constant subtracted besides the dark-field (the camera's bias)"),
    }
}

/// The per-plane baseline table of `basic_fit`.
pub const BASELINE: ArtifactDecl = ArtifactDecl {
    name: "basic_baseline",
    doc: "one row per input plane: baseline (BaSiC's per-image B · mean(S), the images' units)",
    optional: false,
};

pub static BASIC_FIT: FunctionDecl<BasicFitArgs> = FunctionDecl::new(
    "basic_fit",
    Contract::Pure3d,
    "BaSiC (BaSiCPy 2.0, approximate mode) on the tiles of one channel: [flat-field (mean 1), dark-field] as 2 f32 planes; keep the step in f32.",
)
.with_produces(&[BASELINE])
.with_output_shape(two_planes);

pub static BASIC_CORRECT: FunctionDecl<BasicCorrectArgs> = FunctionDecl::new(
    "basic_correct",
    Contract::Pure2d,
    "(I − camera_offset − dark-field) / flat-field with profiles from TIFF files (BaSiC, MCMICRO -ffp/-dfp); f32.",
)
.with_check(check_profiles)
.with_output_shape(hcsflow_core::same_shape);

fn two_planes(_: &BasicFitArgs, input: &StackShape) -> Option<StackShape> {
    Some(input.with_depth(2))
}

impl BasicFitArgs {
    /// The fit's parameters (0 smoothness = automatic).
    pub fn params(&self) -> BasicParams {
        let positive = |v: f64| (v > 0.0).then_some(v);
        BasicParams {
            working_size: usize::try_from(self.working_size).unwrap_or(128),
            get_darkfield: self.darkfield,
            smoothness_flatfield: positive(self.smoothness_flatfield),
            smoothness_darkfield: positive(self.smoothness_darkfield),
            sort_intensity: self.sort_intensity,
            max_iterations: usize::try_from(self.max_iterations).unwrap_or(500),
            max_reweight_iterations: usize::try_from(self.max_reweight_iterations).unwrap_or(10),
            optimization_tol: self.optimization_tol,
            reweighting_tol: self.reweighting_tol,
            epsilon: self.epsilon,
            ..BasicParams::default()
        }
    }
}

/// `basic_fit` on a host stack: the two profile planes; the baseline table and notes go to `context`.
pub fn basic_fit(stack: &Stack, args: &BasicFitArgs, context: &mut CallContext) -> Result<Stack, FunctionError> {
    let name = BASIC_FIT.name;
    let fit = hcsflow_basic::fit(stack, &args.params()).map_err(|e| FunctionError::invalid(name, e.to_string()))?;
    let mut table = Table::new(["baseline"]);
    for (i, &b) in fit.working.baseline.iter().enumerate() {
        table.push(Some(i), vec![Cell::from(f64::from(b))]).map_err(|e| FunctionError::failed(name, e))?;
    }
    context.produce(BASELINE.name, table);
    let w = &fit.working;
    context.note(format!(
        "BaSiC fit of {} tiles: smoothness flat {:.4}, dark {:.4}; {} re-weighting rounds, {} ADMM iterations, residual {:.2e}",
        stack.depth(),
        w.smoothness_flatfield,
        w.smoothness_darkfield,
        w.reweight_iterations,
        w.admm_iterations,
        w.residual_ratio
    ));
    fit.warnings.into_iter().for_each(|warning| context.note(warning));
    let planes = [fit.profiles.flatfield.view(), fit.profiles.darkfield.view()];
    ndarray::stack(ndarray::Axis(0), &planes).map(Stack::from).map_err(|e| FunctionError::failed(name, e))
}

/// The profiles `args` name, for images of `shape` (`(height, width)`): what
/// every implementation of `basic_correct` (host and GPU) reads.
pub fn load_profiles(args: &BasicCorrectArgs, shape: (usize, usize)) -> Result<hcsflow_basic::Profiles, hcsflow_basic::BasicError> {
    let dark = (!args.darkfield.is_empty()).then(|| Path::new(&args.darkfield));
    profiles::read_ffp_dfp(Path::new(&args.flatfield), dark, usize::try_from(args.channel).unwrap_or(usize::MAX), shape)
}

/// `basic_correct`'s check: the profile files exist, fit the plane and hold a positive flat-field.
fn check_profiles(args: &BasicCorrectArgs, shape: &StackShape) -> Result<(), ArgProblem> {
    if args.flatfield.is_empty() {
        return Err(ArgProblem::new("flatfield", "no flat-field file given", "pass flatfield=<path to the flat-field TIFF>"));
    }
    load_profiles(args, (shape.height, shape.width)).map(|_| ()).map_err(|e| {
        let arg = match &e {
            hcsflow_basic::BasicError::ProfileSize { path, .. } | hcsflow_basic::BasicError::ProfileContent { path, .. }
                if !args.darkfield.is_empty() && path == Path::new(&args.darkfield) =>
            {
                "darkfield"
            }
            _ => "flatfield",
        };
        ArgProblem::new(arg, e.to_string(), "give profiles fitted on tiles of this size and channel (basic_fit)")
    })
}

/// `basic_correct` on a host stack (every plane).
pub fn basic_correct(stack: &Stack, args: &BasicCorrectArgs) -> Result<Stack, FunctionError> {
    let name = BASIC_CORRECT.name;
    let [_, h, w] = stack.shape();
    let profiles = load_profiles(args, (h, w)).map_err(|e| FunctionError::invalid(name, e.to_string()))?;
    hcsflow_basic::correct(stack, &profiles, args.camera_offset as f32, None).map_err(|e| FunctionError::invalid(name, e.to_string()))
}

pub(crate) fn register(registry: &mut Registry) {
    registry.add(BASIC_FIT.host(basic_fit));
    registry.add(crate::host_all_planes(&BASIC_CORRECT, basic_correct));
}
