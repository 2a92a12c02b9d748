//! BaSiC flat-field and dark-field correction (the algorithm is `hcsflow-basic`):
//!
//! - `basic_fit`: the tiles `[N, Y, X]` (N ≥ 2) of **one** channel →
//!   `[2, Y, X]` f32: plane 0 the flat-field (mean 1), plane 1 the dark-field
//!   (zeros unless `darkfield = true`). Artifacts are tables today, so the
//!   profiles travel as the output planes; the step must keep f32
//!   (`dtype = "f32"`) or the dtype policy rounds the flat-field to integers.
//!   It produces the `basic_baseline` table (one row per input plane) and
//!   notes the fit's smoothness, iterations and convergence.
//!   In a pipeline step with `scope = "plate"` it fits a sample of the whole
//!   plate: each tile is resized to `working_size` as it is read
//!   ([`working_size_reduction`]), so the sample is held at the working size
//!   only, and the profiles come back at the tiles' size. Its result is the
//!   `basic_profiles` planes artifact.
//! - `basic_correct`: `(I − camera_offset − D) / F` per plane, with the
//!   profiles either from a plate-wide `basic_fit` step (the `basic_profiles`
//!   artifact of the tile's channel) or read from TIFF files named by its
//!   arguments (relative paths from the working directory), never both; f32,
//!   brought back to the input dtype by the dtype policy (negative values
//!   clip to 0 there).

use std::path::Path;
use std::sync::Arc;

use hcsflow_basic::{profiles, BasicParams};
use hcsflow_core::{
    ArgProblem, ArtifactDecl, CallContext, Cell, Contract, FunctionDecl, FunctionError, PlaneReduction, Registry, Stack, StackShape, Table,
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
        camera_offset: f64 = float(0.0, None, None, "constant subtracted before fitting (the camera's bias); correct with the same camera_offset"),
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
pub const BASELINE: ArtifactDecl =
    ArtifactDecl::table("basic_baseline", "one row per input plane: baseline (BaSiC's per-image B · mean(S), the images' units)");

/// `basic_fit`'s result as an artifact: a plate-wide step's `[flat-field,
/// dark-field]` of one channel, given to each `basic_correct` of that channel.
pub const PROFILES: ArtifactDecl = ArtifactDecl::planes(
    "basic_profiles",
    "[flat-field, dark-field] f32 planes of one channel, from a basic_fit step with scope = \"plate\"",
);

static FIT_PRODUCES: [ArtifactDecl; 2] = [BASELINE, PROFILES];
static CORRECT_CONSUMES: [ArtifactDecl; 1] = [PROFILES.or_argument("flatfield")];

pub static BASIC_FIT: FunctionDecl<BasicFitArgs> = FunctionDecl::new(
    "basic_fit",
    Contract::Pure3d,
    "BaSiC (BaSiCPy 2.0, approximate mode) on the tiles of one channel: [flat-field (mean 1), dark-field] as 2 f32 planes; keep the step in f32.",
)
.with_produces(&FIT_PRODUCES)
.with_check(check_tile_count)
.with_output_shape(two_planes)
.with_plane_reduction(working_size_reduction);

pub static BASIC_CORRECT: FunctionDecl<BasicCorrectArgs> = FunctionDecl::new(
    "basic_correct",
    Contract::Pure2d,
    "(I − camera_offset − dark-field) / flat-field with profiles from a plate-wide basic_fit step or from TIFF files (BaSiC, MCMICRO -ffp/-dfp); f32.",
)
.with_consumes(&CORRECT_CONSUMES)
.with_check(check_profiles)
.with_output_shape(hcsflow_core::same_shape);

fn two_planes(_: &BasicFitArgs, input: &StackShape) -> Option<StackShape> {
    Some(input.with_depth(2))
}

/// `basic_fit` needs at least 2 tiles (BaSiC separates shading from content
/// by comparing tiles).
fn check_tile_count(_: &BasicFitArgs, shape: &StackShape) -> Result<(), ArgProblem> {
    if shape.depth < 2 {
        return Err(ArgProblem::input(
            format!("BaSiC needs at least 2 images of one channel to fit, the stack has {}", shape.depth),
            "fit on more tiles: vary more components (variable_components = [\"site\", \"z_index\"]) or fit across the plate (scope = \"plate\")",
        ));
    }
    Ok(())
}

/// The reduction of a plate-wide `basic_fit`: every tile resized to
/// `working_size`² as it is read, exactly as the fit resizes it
/// ([`hcsflow_basic::to_working_size`]), so the sample is held at the
/// working size only (`sample × working_size² × 4` bytes).
pub fn working_size_reduction(args: &BasicFitArgs, _plane: (usize, usize)) -> Option<PlaneReduction> {
    let ws = usize::try_from(args.working_size).ok()?;
    Some(PlaneReduction {
        size: (ws, ws),
        what: format!("each plane resized to {ws}×{ws} as it is read (BaSiC's working size, antialiased bilinear)"),
        reduce: Arc::new(move |plane: &Stack| {
            let small = hcsflow_basic::to_working_size(plane, ws);
            Stack::from_vec([plane.depth(), ws, ws], small).map_err(|e| FunctionError::failed(BASIC_FIT.name, e))
        }),
    })
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
            camera_offset: self.camera_offset,
            ..BasicParams::default()
        }
    }
}

/// `basic_fit` on a host stack: the two profile planes; the baseline table
/// and notes go to `context`. When the planes were reduced as they were read
/// ([`CallContext::reduced_from`]) they are the tiles at the working size, and
/// the profiles are returned at the size they were reduced from.
pub fn basic_fit(stack: &Stack, args: &BasicFitArgs, context: &mut CallContext) -> Result<Stack, FunctionError> {
    let name = BASIC_FIT.name;
    let params = args.params();
    let fit = match context.reduced_from {
        None => hcsflow_basic::fit(stack, &params),
        Some(full) => {
            let [n, h, w] = stack.shape();
            if (h, w) != (params.working_size, params.working_size) {
                return Err(FunctionError::invalid(
                    name,
                    format!("reduced tiles are {h}x{w}, the working size is {}", params.working_size),
                ));
            }
            let small: Vec<f32> = stack.to_f32().iter().copied().collect();
            hcsflow_basic::fit_downsampled(&small, n, full, &params)
        }
    }
    .map_err(|e| FunctionError::invalid(name, e.to_string()))?;
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

/// `basic_correct`'s check: the profile files, when named, exist, fit the
/// plane and hold a positive flat-field. Without a file the profiles must come
/// from a plate-wide `basic_fit` (the pipeline compiler requires one of the
/// two; [`profiles_for`] refuses a call with neither).
fn check_profiles(args: &BasicCorrectArgs, shape: &StackShape) -> Result<(), ArgProblem> {
    if args.flatfield.is_empty() {
        return Ok(());
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

/// The profiles of a `basic_correct` call on planes of `shape` (`(height,
/// width)`): the plate-wide fit's `basic_profiles` in `context` (plane 0 the
/// flat-field, plane 1 the dark-field), else the files its arguments name.
/// Every implementation (host or device) reads them through this.
pub fn profiles_for(
    args: &BasicCorrectArgs,
    context: &CallContext,
    shape: (usize, usize),
) -> Result<hcsflow_basic::Profiles, FunctionError> {
    let name = BASIC_CORRECT.name;
    let Some(fitted) = context.planes.get(PROFILES.name) else {
        if args.flatfield.is_empty() {
            return Err(FunctionError::invalid(
                name,
                "no flat-field: pass flatfield=<path to the flat-field TIFF>, or (in a pipeline) consume the basic_profiles of a \
                 basic_fit step with scope = \"plate\"",
            ));
        }
        return load_profiles(args, shape).map_err(|e| FunctionError::invalid(name, e.to_string()));
    };
    if !args.flatfield.is_empty() {
        return Err(FunctionError::invalid(name, "both a flat-field file and a plate-wide fit were given: use one"));
    }
    let [depth, h, w] = fitted.shape();
    if depth != 2 || (h, w) != shape {
        return Err(FunctionError::invalid(
            name,
            format!("the plate-wide fit is {depth}×{h}×{w}; expected [flat-field, dark-field] of {}×{}", shape.0, shape.1),
        ));
    }
    let planes = fitted.to_f32();
    Ok(hcsflow_basic::Profiles {
        flatfield: planes.index_axis(ndarray::Axis(0), 0).to_owned(),
        darkfield: planes.index_axis(ndarray::Axis(0), 1).to_owned(),
    })
}

/// `basic_correct` on a host stack (every plane), with the profiles its arguments name.
pub fn basic_correct(stack: &Stack, args: &BasicCorrectArgs) -> Result<Stack, FunctionError> {
    basic_correct_in(stack, args, &CallContext::default())
}

/// `basic_correct` on a host stack (every plane) in a call's `context` ([`profiles_for`]).
pub fn basic_correct_in(stack: &Stack, args: &BasicCorrectArgs, context: &CallContext) -> Result<Stack, FunctionError> {
    let name = BASIC_CORRECT.name;
    let [_, h, w] = stack.shape();
    let profiles = profiles_for(args, context, (h, w))?;
    hcsflow_basic::correct(stack, &profiles, args.camera_offset as f32, None).map_err(|e| FunctionError::invalid(name, e.to_string()))
}

pub(crate) fn register(registry: &mut Registry) {
    registry.add(BASIC_FIT.host(basic_fit));
    registry.add(BASIC_CORRECT.host_owned(|stack, args, context| basic_correct_in(&stack, args, context)));
}
