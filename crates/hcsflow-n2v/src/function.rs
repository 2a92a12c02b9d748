//! `n2v_denoise`: N2V2 as a pipeline function (pure_3d, N → N, f32).
//!
//! Trains one network on the whole stack it receives (every plane; the planes are stacked one
//! below the other into one training image, normalised with the stack's mean and standard
//! deviation), then predicts every plane with it. With `model = "<dir>"` it loads a model saved
//! by [`Denoiser::save`] (or by an earlier run's `save`) and only predicts. With `save = "<dir>"`
//! the trained model is written there; `{well}` in the path is replaced by the stack's well
//! (so a plate run writes one model per well instead of overwriting one).
//!
//! **Contract**: the output has the input's shape and is f32 (the step's dtype policy converts it
//! back unless the step asks for f32). On the host (`flex`) a fixed `seed`, stack and settings
//! give bit-identical output on every run of the same build on the same machine (patch origins,
//! augmentations, masks and initial weights all come from the seed); the output of different
//! machines (other SIMD kernels) or of the `wgpu` backend agrees only to floating-point rounding.
//! A loaded model predicts exactly as the saved one did. Training patches are drawn from the
//! stacked planes, so a few of them straddle the border between two planes.

use std::path::{Path, PathBuf};

use burn::tensor::Device;
use hcsflow_core::{blamed, ArgProblem, CallContext, Contract, FunctionDecl, FunctionError, Registry, Stack, StackShape};
use ndarray::{s, Array2, Array3, ArrayView3, CowArray, Ix2, Ix3};

use crate::config::SIDE_MULTIPLE;
use crate::{train, Denoiser, N2vConfig, META_FILE};

hcsflow_core::function_args! {
    /// The arguments of [`N2V_DENOISE`].
    pub struct N2vDenoiseArgs {
        steps_per_epoch: i64 = int(100, Some(1), Some(1_000_000), "optimiser steps per epoch (CAREamics num_steps)"),
        epochs: i64 = int(2, Some(1), Some(100_000), "epochs; the training loss is read from the device once per epoch and drives the plateau schedule"),
        patch_size: i64 = int(64, Some(16), Some(1024), "side of the square training patches, a multiple of 4; every plane must be at least this large"),
        batch_size: i64 = int(16, Some(1), Some(4096), "patches per training step"),
        learning_rate: f64 = float(1e-3, Some(0.0), Some(1.0), "Adam's learning rate (> 0)"),
        seed: i64 = int(1, Some(0), None, "seed of patch origins, augmentations, masks and initial weights: the same seed gives the same output"),
        masked_pixel_percentage: f64 = float(0.2, Some(0.05), Some(10.0), "percentage of pixels masked per patch (CAREamics: 0.2)"),
        features: i64 = int(32, Some(1), Some(1024), "features of the first U-Net level (CAREamics: 32)"),
        augment: bool = bool(true, "random flips and 90° rotations of training patches"),
        norm_batches: i64 = int(8, Some(0), Some(10_000), "batches over which batch norm's running statistics are estimated again with the final weights (0: the training steps' exponential average, as CAREamics)"),
        tile_size: i64 = int(512, Some(16), Some(8192), "largest side of the prediction tiles, a multiple of 4 (an image is cut into the fewest tiles of at most this side)"),
        tile_overlap: i64 = int(48, Some(0), Some(4096), "overlap of neighbouring prediction tiles (even, at most half the tile), blended linearly"),
        tile_batch: i64 = int(1, Some(1), Some(1024), "tiles per forward pass in prediction"),
        model: String = text("", "directory of a saved model (model.bpk + n2v.json) to predict with, without training; the training arguments are then ignored"),
        save: String = text("", "directory to save the trained model in ({well} is replaced by the well); empty: not saved"),
    }
}

/// The declaration of `n2v_denoise`.
pub static N2V_DENOISE: FunctionDecl<N2vDenoiseArgs> = FunctionDecl::new(
    "n2v_denoise",
    Contract::Pure3d,
    "N2V2 self-supervised denoising: trains on the stack (or loads model=), then predicts every plane; f32; same seed, same output on the host.",
)
.with_check(check)
.with_output_shape(hcsflow_core::same_shape)
.with_one_stack_at_a_time();

/// An argument as a `usize` (the declared ranges keep them non-negative).
fn size(v: i64) -> usize {
    usize::try_from(v).unwrap_or(0)
}

impl N2vDenoiseArgs {
    /// The training and tiling settings these arguments give (CAREamics' defaults for the rest).
    pub fn config(&self) -> N2vConfig {
        N2vConfig {
            patch_size: size(self.patch_size),
            batch_size: size(self.batch_size),
            steps_per_epoch: size(self.steps_per_epoch),
            epochs: size(self.epochs),
            seed: u64::try_from(self.seed).unwrap_or(0),
            masked_pixel_percentage: self.masked_pixel_percentage,
            learning_rate: self.learning_rate,
            augment: self.augment,
            norm_batches: size(self.norm_batches),
            features: size(self.features),
            tile_size: size(self.tile_size),
            tile_overlap: size(self.tile_overlap),
            tile_batch: size(self.tile_batch),
            ..N2vConfig::default()
        }
    }

    /// The directory `save` names for a stack of well `well` (`{well}` replaced), if any.
    pub fn save_dir(&self, well: &str) -> Option<PathBuf> {
        (!self.save.is_empty()).then(|| PathBuf::from(self.save.replace("{well}", if well.is_empty() { "stack" } else { well })))
    }
}

/// The settings that the declared ranges do not cover; the problem names the argument.
fn check_settings(args: &N2vDenoiseArgs) -> Result<(), ArgProblem> {
    let m = SIDE_MULTIPLE as i64;
    if args.tile_size % m != 0 {
        return Err(ArgProblem::new(
            "tile_size",
            format!("tile_size must be a multiple of {m}, got {}", args.tile_size),
            "e.g. tile_size = 256",
        ));
    }
    if args.tile_overlap % 2 != 0 || args.tile_overlap > args.tile_size / 2 {
        return Err(ArgProblem::new(
            "tile_overlap",
            format!("tile_overlap must be even and at most half of tile_size ({}), got {}", args.tile_size, args.tile_overlap),
            "e.g. tile_overlap = 48 for tile_size = 256",
        ));
    }
    if !args.model.is_empty() {
        let meta = Path::new(&args.model).join(META_FILE);
        if !meta.is_file() {
            return Err(ArgProblem::new(
                "model",
                format!("{} is not a saved N2V2 model ({} is missing)", args.model, meta.display()),
                "give the directory an earlier n2v_denoise save= wrote, or leave model empty to train",
            ));
        }
        return Ok(());
    }
    if args.patch_size % m != 0 {
        return Err(ArgProblem::new(
            "patch_size",
            format!("patch_size must be a multiple of {m}, got {}", args.patch_size),
            "e.g. patch_size = 64",
        ));
    }
    if args.learning_rate <= 0.0 {
        return Err(ArgProblem::new(
            "learning_rate",
            format!("learning_rate must be positive, got {}", args.learning_rate),
            "e.g. learning_rate = 0.001",
        ));
    }
    if size(args.batch_size).saturating_mul(size(args.patch_size).pow(2)) >= 1 << 30 {
        return Err(ArgProblem::new(
            "batch_size",
            format!("batch_size × patch_size² ({} × {}²) must stay below 2^30", args.batch_size, args.patch_size),
            "use fewer or smaller patches",
        ));
    }
    Ok(())
}

/// Before any pixel is read: the settings, a saved model that exists, and (when training) planes
/// at least one patch large.
fn check(args: &N2vDenoiseArgs, shape: &StackShape) -> Result<(), ArgProblem> {
    check_settings(args)?;
    if shape.depth == 0 || shape.height == 0 || shape.width == 0 {
        return Err(ArgProblem::input(
            format!("the stack is empty ({}×{}×{})", shape.depth, shape.height, shape.width),
            "give a stack with pixels",
        ));
    }
    let patch = size(args.patch_size);
    if args.model.is_empty() && (shape.height < patch || shape.width < patch) {
        return Err(ArgProblem::input(
            format!(
                "the planes are {}×{} pixels, smaller than patch_size {patch}: N2V2 cannot draw training patches",
                shape.height, shape.width
            ),
            format!("use patch_size ≤ {} (a multiple of {SIDE_MULTIPLE}, at least 16), or larger images", shape.height.min(shape.width)),
        ));
    }
    Ok(())
}

/// The stack's pixels as f32: borrowed when they already are (an f32 step's stack), converted
/// otherwise.
fn f32_pixels(stack: &Stack) -> CowArray<'_, f32, Ix3> {
    match stack {
        Stack::F32(a) => CowArray::from(a.view()),
        other => CowArray::from(other.to_f32()),
    }
}

/// The planes of `stack` one below the other: a `(depth·height) × width` training image, a view
/// of the same pixels when they are in standard layout (a stack's always are), else a copy.
fn stacked_planes(stack: ArrayView3<'_, f32>) -> CowArray<'_, f32, Ix2> {
    let (d, h, w) = stack.dim();
    match stack.into_shape_with_order((d * h, w)) {
        Ok(view) => CowArray::from(view),
        Err(_) => {
            let mut out = Array2::zeros((d * h, w));
            for (z, plane) in stack.outer_iter().enumerate() {
                out.slice_mut(s![z * h..(z + 1) * h, ..]).assign(&plane);
            }
            CowArray::from(out)
        }
    }
}

/// `n2v_denoise` on a host stack, on burn's `flex` backend: trains (or loads `model`), optionally
/// saves, predicts every plane. Notes the device, the training summary and where the model went.
pub fn n2v_denoise(stack: &Stack, args: &N2vDenoiseArgs, context: &mut CallContext) -> Result<Stack, FunctionError> {
    n2v_denoise_on(stack, args, context, &Device::flex(), "flex (host)")
}

/// [`n2v_denoise`] with training and prediction on `device`, any burn device (`flex`, or the wgpu
/// device of a GPU implementation); `device_name` is how the notes name it. The stack and the
/// result are host arrays: moving them to and from the device is the caller's (and burn's).
pub fn n2v_denoise_on(
    stack: &Stack,
    args: &N2vDenoiseArgs,
    context: &mut CallContext,
    device: &Device,
    device_name: &str,
) -> Result<Stack, FunctionError> {
    let name = N2V_DENOISE.name;
    let [d, h, w] = stack.shape();
    check(args, &StackShape::new(d, h, w))
        .map_err(|p| FunctionError::invalid(name, format!("{}: {}; {}", blamed(p.arg), p.problem, p.fix)))?;
    let pixels = f32_pixels(stack);
    let image = pixels.view();
    let denoiser = if args.model.is_empty() {
        let cfg = args.config();
        let (denoiser, report) =
            train(stacked_planes(image).view(), &cfg, device).map_err(|e| FunctionError::invalid(name, e.to_string()))?;
        context.note(format!(
            "n2v_denoise: trained on {device_name}, {} steps ({} epochs) of {} patches of {}², {:.1} s, loss per epoch {:?}",
            report.steps,
            cfg.epochs,
            cfg.batch_size,
            cfg.patch_size,
            report.seconds,
            report.epoch_losses.iter().map(|l| (l * 1e4).round() / 1e4).collect::<Vec<_>>()
        ));
        if let Some(dir) = args.save_dir(&context.stack.well) {
            denoiser.save(&dir).map_err(|e| FunctionError::failed(name, e))?;
            context.note(format!("n2v_denoise: model saved in {}", dir.display()));
        }
        denoiser
    } else {
        let loaded =
            Denoiser::load(Path::new(&args.model), device).map_err(|e| FunctionError::invalid(name, format!("argument 'model': {e}")))?;
        context.note(format!("n2v_denoise: model loaded from {}, predicting on {device_name} without training", args.model));
        loaded
    };
    let denoiser = denoiser
        .with_tiling(size(args.tile_size), size(args.tile_overlap), size(args.tile_batch))
        .map_err(|e| FunctionError::invalid(name, e.to_string()))?;
    let mut out = Array3::<f32>::zeros(image.dim());
    for (z, plane) in image.outer_iter().enumerate() {
        let clean = denoiser.predict(plane).map_err(|e| FunctionError::failed(name, e))?;
        out.slice_mut(s![z, .., ..]).assign(&clean);
    }
    Ok(Stack::from(out))
}

/// [`n2v_denoise_on`] on `device`, a cubecl wgpu device: the one a GPU context's kernels already run
/// on, whose cubecl runtime (queue, memory pools) burn then shares rather than opening its own.
#[cfg(feature = "wgpu")]
pub fn n2v_denoise_wgpu(
    stack: &Stack,
    args: &N2vDenoiseArgs,
    context: &mut CallContext,
    device: burn::backend::WgpuDevice,
    device_name: &str,
) -> Result<Stack, FunctionError> {
    n2v_denoise_on(stack, args, context, &Device::new(device), device_name)
}

/// Registers `n2v_denoise` (host implementation on burn `flex`).
pub fn register(registry: &mut Registry) {
    registry.add(N2V_DENOISE.host(n2v_denoise));
}
