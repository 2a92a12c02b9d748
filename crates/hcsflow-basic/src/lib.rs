//! BaSiC flat-field and dark-field estimation and correction.
//!
//! BaSiC (Peng et al., *Nat Commun* 8:14836, 2017) models every tile of one
//! channel as `I = B·S + D + R`: a per-image baseline `B` times the flat-field
//! `S`, plus a dark-field `D`, plus a sparse residual `R` (the sample). This
//! crate ports the semantics of BaSiCPy 2.0 (MIT; `fitting_mode="approximate"`,
//! its default), not the MATLAB original:
//!
//! 1. [`fit()`]: resize every tile to the working size (torch's antialiased
//!    bilinear, [`resize`]), fit there ([`fit::fit_working`]: ADMM with L1 on
//!    the flat-field's DCT coefficients, [`dct`], re-weighted), upsample the
//!    profiles back (align-corners bilinear). The flat-field has mean 1; the
//!    dark-field is in the images' units.
//! 2. [`correct()`](correct::correct): `(I − camera_offset − D) / F` in f32.
//! 3. [`profiles`]: profiles as f32 TIFFs, and the `<name>-ffp.tiff` /
//!    `<name>-dfp.tiff` pair MCMICRO and ASHLAR read.
//!
//! One fit per channel: the tiles of different channels have different shading.
//!
//! # Where we differ from BaSiCPy, and why
//!
//! - **Iteration count with the dark-field.** BaSiCPy's approximate step
//!   overwrites its iteration counter with the number of images whose
//!   baseline is below 1 (`k = validA1coeff_idx.sum()`), so with
//!   `get_darkfield=True` `max_iterations` never stops the ADMM loop. We count
//!   iterations; in practice the loop stops on `optimization_tol` long before
//!   500 (μ grows 1.5× per iteration).
//! - **Spectral norm** (for μ₀ = 12.5/‖D‖₂): power iteration in f64 to a
//!   relative 1e-12 instead of a full SVD: the same number, without an
//!   `images × pixels` SVD's memory and time.
//! - **Precision.** Arrays are f32 as BaSiCPy's torch tensors; every sum,
//!   mean and norm accumulates in f64 (torch sums in f32), and the DCT runs in
//!   f64 internally. Results agree with a float64 transcription to ~1e-5.
//! - **Convergence checks** read a norm computed inside the multiplier update
//!   (no extra pass, no allocation); on a GPU it stays a device value until
//!   read (slice 2).
//! - **Not ported:** the LADMAP mode, autotune, `fitting_weight` (segmentation
//!   masks), `sparse_cost_darkfield` (only LADMAP uses it), the time-lapse
//!   baseline re-fit of `transform(is_timelapse=True)`. The baseline of the
//!   fit is returned and [`correct()`](correct::correct) can subtract a given one.
//! - **A zero flat-field** (`S.max() == 0`, BaSiCPy's `RuntimeError`) is
//!   [`BasicError::FlatfieldZero`]; NaN or infinite input is refused up front
//!   ([`BasicError::NotFinite`]) instead of propagating.
//! - **Camera offset.** [`correct()`](correct::correct) subtracts an explicit
//!   `camera_offset` besides the estimated dark-field (users expect the
//!   dark-field to be the camera offset and it is not: peng-lab/BaSiCPy#146).

pub mod correct;
pub mod dct;
pub mod fit;
mod passes;
pub mod profiles;
pub mod resize;
mod simd;

use std::path::PathBuf;

use hcsflow_core::Stack;

pub use correct::correct;
pub use fit::{fit_working, WorkingFit};
pub use profiles::{read_ffp_dfp, read_profile, write_ffp_dfp, write_profile, Profiles};
pub use resize::{Interpolation, Resampler};

/// The parameters of a fit, with BaSiCPy 2.0's defaults ([`BasicParams::default`]).
#[derive(Debug, Clone, PartialEq)]
pub struct BasicParams {
    /// Side of the square the tiles are resized to before fitting (BaSiCPy
    /// `working_size`, default 128). At least 2.
    pub working_size: usize,
    /// Also estimate a dark-field (default false; BaSiCPy warns that it "may
    /// lead to unstable results", and so does [`BasicFit::warnings`]).
    pub get_darkfield: bool,
    /// Weight of the L1 norm of the flat-field's DCT coefficients; `None`
    /// (default): `Σ|DCT(mean image / its mean)| / 400 · 0.5`, BaSiCPy's automatic choice.
    pub smoothness_flatfield: Option<f64>,
    /// The same for the dark-field; `None` (default): 0.1 × the flat-field's (BaSiCPy 2.0; MATLAB used 0.4×).
    pub smoothness_darkfield: Option<f64>,
    /// Sort every pixel's values across the images before fitting (default false).
    pub sort_intensity: bool,
    /// ε of the re-weighting `W = 1/(|R/mean(I_B)| + ε)` (default 0.1).
    pub epsilon: f64,
    /// ADMM iterations per solve, at most (default 500).
    pub max_iterations: usize,
    /// Re-weighting rounds, at most (default 10).
    pub max_reweight_iterations: usize,
    /// An ADMM solve stops when `‖residual‖₂ / ‖images‖_F` ≤ this (default 1e-3).
    pub optimization_tol: f64,
    /// Re-weighting stops when the flat-field's relative L1 change ≤ this (default 1e-2).
    pub reweighting_tol: f64,
    /// μ grows by this factor per ADMM iteration (default 1.5).
    pub rho: f64,
    /// μ₀ = `mu_coef` / ‖images‖₂ (largest singular value) (default 12.5).
    pub mu_coef: f64,
    /// μ stops growing at μ₀ × this (default 1e7).
    pub max_mu_coef: f64,
    /// A constant subtracted from every pixel before the fit (default 0):
    /// the camera's bias. BaSiC models a tile as `baseline · flat-field (+
    /// dark-field)`; a bias fitted without a dark-field flattens the fitted
    /// shading (BaSiCPy has no such option: its users subtract it first).
    /// Correct with the same offset (`correct`'s `camera_offset`).
    pub camera_offset: f64,
}

impl Default for BasicParams {
    fn default() -> Self {
        BasicParams {
            working_size: 128,
            get_darkfield: false,
            smoothness_flatfield: None,
            smoothness_darkfield: None,
            sort_intensity: false,
            epsilon: 0.1,
            max_iterations: 500,
            max_reweight_iterations: 10,
            optimization_tol: 1e-3,
            reweighting_tol: 1e-2,
            rho: 1.5,
            mu_coef: 12.5,
            max_mu_coef: 1e7,
            camera_offset: 0.0,
        }
    }
}

/// What went wrong, for a fit, a correction or a profile file.
#[derive(Debug, thiserror::Error)]
pub enum BasicError {
    #[error("BaSiC needs at least 2 images of one channel to fit, got {got}")]
    TooFewImages { got: usize },
    #[error("the working size must be at least 2, got {0}")]
    WorkingSize(usize),
    #[error("bad shape: {reason}")]
    Shape { reason: String },
    #[error("image {image} holds NaN or infinite values")]
    NotFinite { image: usize },
    #[error("every image is zero: there is no shading to fit")]
    AllZero,
    #[error("the estimated flat-field is zero (try a smaller smoothness_darkfield)")]
    FlatfieldZero,
    #[error("{}: the profile is {}x{}, the images are {}x{}", path.display(), profile.0, profile.1, image.0, image.1)]
    ProfileSize { path: PathBuf, profile: (usize, usize), image: (usize, usize) },
    #[error("{}: {reason}", path.display())]
    ProfileContent { path: PathBuf, reason: String },
    #[error("profile file: {0}")]
    Tiff(#[from] hcsflow_tiff::TiffError),
    #[error("{}: {source}", path.display())]
    Io { path: PathBuf, source: std::io::Error },
}

/// A fit at full size: the profiles and what the fit did.
#[derive(Debug, Clone, PartialEq)]
pub struct BasicFit {
    pub profiles: Profiles,
    /// The fit at the working size (profiles there, baseline, convergence).
    pub working: WorkingFit,
    /// Things the user should know (the dark-field's instability, no convergence).
    pub warnings: Vec<String>,
}

/// The warning BaSiCPy gives for `get_darkfield=True`, in our words.
pub const DARKFIELD_WARNING: &str =
    "dark-field estimation is less stable than the flat-field (BaSiCPy warns the same); check the dark-field, or pass a measured camera offset instead";

/// Fits BaSiC profiles to `stack`: `N ≥ 2` tiles `[N, Y, X]` of one channel
/// (u8, u16 or f32, finite). Returns flat-field and dark-field at `Y × X`
/// (the flat-field has mean 1 at the working size, as BaSiCPy's; bilinear
/// upsampling moves the mean by well under 1 %); see the crate docs for the method and [`BasicParams`] for the defaults.
/// The same as [`to_working_size`] on every tile, then [`fit_downsampled`].
pub fn fit(stack: &Stack, params: &BasicParams) -> Result<BasicFit, BasicError> {
    let [n, h, w] = stack.shape();
    check_inputs(n, (h, w), params)?;
    let small = to_working_size(stack, params.working_size);
    fit_downsampled(&small, n, (h, w), params)
}

/// What [`fit()`] and [`fit_downsampled`] refuse before any work: fewer than
/// two tiles, a working size below 2, empty tiles.
fn check_inputs(n: usize, (h, w): (usize, usize), params: &BasicParams) -> Result<(), BasicError> {
    if n < 2 {
        return Err(BasicError::TooFewImages { got: n });
    }
    if params.working_size < 2 {
        return Err(BasicError::WorkingSize(params.working_size));
    }
    if h == 0 || w == 0 {
        return Err(BasicError::Shape { reason: format!("the images are {h}x{w}") });
    }
    Ok(())
}

/// Every plane of `stack` resized to `working_size`² as [`fit()`] does it
/// (torch's antialiased bilinear), `depth × working_size²` f32 values. Applied
/// one tile at a time as tiles are read, it lets a fit over many tiles hold
/// only the small copies ([`fit_downsampled`]).
pub fn to_working_size(stack: &Stack, working_size: usize) -> Vec<f32> {
    let [_, h, w] = stack.shape();
    Resampler::new((h, w), (working_size, working_size), Interpolation::Antialiased).resize_stack(stack)
}

/// [`fit()`] on tiles already at the working size: `small` holds `n` planes of
/// `params.working_size`² values ([`to_working_size`] of each tile); the
/// profiles are returned at `full = (height, width)`, the tiles' size. Equal
/// to [`fit()`] on the full tiles.
pub fn fit_downsampled(small: &[f32], n: usize, full: (usize, usize), params: &BasicParams) -> Result<BasicFit, BasicError> {
    let (h, w) = full;
    check_inputs(n, full, params)?;
    let ws = params.working_size;
    // Resizing is linear, so subtracting the offset after it equals subtracting it first.
    let unbiased: Vec<f32>;
    let small = if params.camera_offset == 0.0 {
        small
    } else {
        let offset = params.camera_offset as f32;
        unbiased = small.iter().map(|&v| v - offset).collect();
        &unbiased
    };
    let working = fit_working(small, n, ws, ws, params)?;
    let up = Resampler::new((ws, ws), (h, w), Interpolation::AlignCorners);
    let upsample = |v: &[f32]| {
        let mut out = vec![0f32; h * w];
        up.resize_plane(v, &mut out, &mut Vec::new());
        ndarray::Array2::from_shape_vec((h, w), out)
    };
    let shape_error = |e: ndarray::ShapeError| BasicError::Shape { reason: e.to_string() };
    let profiles = Profiles {
        flatfield: upsample(&working.flatfield).map_err(shape_error)?,
        darkfield: upsample(&working.darkfield).map_err(shape_error)?,
    };
    let mut warnings = Vec::new();
    if params.get_darkfield {
        warnings.push(DARKFIELD_WARNING.to_string());
    }
    if !working.reweight_converged {
        warnings.push(format!(
            "BaSiC re-weighting did not converge in {} rounds (last ADMM solve {})",
            working.reweight_iterations,
            if working.admm_converged { "converged" } else { "did not converge" }
        ));
    }
    Ok(BasicFit { profiles, working, warnings })
}
