//! Richardson–Lucy deconvolution of 3D stacks (and of 2D planes, as
//! one-plane volumes or with a one-plane PSF) by real FFTs.
//!
//! # The iteration
//!
//! With `A` the convolution by the PSF `h` (sum 1) and `Aᵀ` its adjoint,
//! starting from a constant estimate `x₀ = 0.5` (scikit-image's; any positive
//! constant gives the same iterates, because `x₁ = Aᵀ(y / A1)` does not
//! depend on it):
//!
//! ```text
//! x_{k+1} = x_k · max(Aᵀ( y / max(A x_k, ε) ), 0)
//! ```
//!
//! - **Adjoint**: the conjugate OTF, never a flipped array, so a centred point
//!   source stays centred (flipping a PSF that was already shifted for FFTs
//!   moves the result by ≈0.3 voxel). PSFs have odd sizes and their centre is
//!   the middle voxel ([`Psf`]), where scikit-image's flip is the same adjoint.
//! - **Boundary** ([`Boundary`]): `Same` (default) is scikit-image's
//!   `richardson_lucy`: `scipy.signal.convolve(mode="same")`, i.e. the volume
//!   is zero outside the image, the blur of the estimate is only compared with
//!   the image inside it; done by zero-padding every axis by at least half the
//!   PSF to a fast FFT size. `Circular` is the periodic model of a plain FFT
//!   (no padding).
//! - **ε policy**: the blurred estimate is floored at `epsilon` (default
//!   `1e-12`, absolute, as scikit-image's `+ 1e-12`) before dividing, so the
//!   ratio is finite and non-negative for a non-negative image. Where the blur
//!   is above ε (everywhere, for an image with a positive background) this is
//!   scikit-image's update exactly.
//! - **Non-negativity**: the image must be non-negative and finite (an error
//!   otherwise, never clipped); the multiplicative correction is floored at 0,
//!   which only removes FFT round-off (≈1e-7 of the maximum) where the exact
//!   correction is ≥ 0 anyway. So results are ≥ 0. No background is
//!   subtracted, nothing is clipped above.
//! - **Acceleration** (optional): Biggs & Andrews (Appl. Opt. 36:1766, 1997),
//!   `y_k = max(x_k + α_k (x_k − x_{k−1}), 0)`, `x_{k+1} = RL(y_k)`,
//!   `α_{k+1} = Σ g_k g_{k−1} / Σ g_{k−1}²` clamped to [0, 1] with
//!   `g_k = x_{k+1} − y_k` (α = 0 for the first two iterations).
//!
//! - **Method** ([`Method`]): the blur is done by real FFTs (any size, padded
//!   to a fast one), or, for a separable PSF (every Gaussian, up to
//!   [`SEPARABLE_MAX_TAPS`] taps), by direct 1D convolutions along x, y and
//!   z, the same operator with the same boundaries, which is several times
//!   faster at microscopy PSF sizes.
//!
//! Memory is described on [`richardson_lucy`].

mod engine;
mod fast;
pub mod psf;
mod separable;

use std::path::PathBuf;

pub use engine::{richardson_lucy, Boundary, Method, Plan, RlParams, SEPARABLE_MAX_TAPS};
pub use fast::next_fast_len;
pub use psf::{Optics, Psf};

/// What can go wrong in deconvolution. Every message names what was wrong
/// (the PSF's origin: its file or its model) and what to change.
#[derive(Debug, thiserror::Error)]
pub enum DeconError {
    /// A PSF that cannot be used (even size, negative or non-finite values,
    /// zero sum, off-centre peak).
    #[error("PSF {origin}: {reason}")]
    Psf { origin: String, reason: String },
    /// A PSF file that could not be read as a TIFF.
    #[error("PSF file {path}: {source}")]
    PsfFile {
        path: PathBuf,
        #[source]
        source: hcsflow_tiff::TiffError,
    },
    /// A PSF larger than the image along an axis.
    #[error(
        "the PSF ({psf_origin}) is {psf:?} (z, y, x) but the image is {image:?}: it is larger along {axis}; crop the PSF \
         (its far tails carry little weight) or deconvolve a larger stack"
    )]
    PsfTooLarge { psf_origin: String, psf: [usize; 3], image: [usize; 3], axis: &'static str },
    /// An image Richardson–Lucy cannot take (empty, negative or non-finite values).
    #[error("image: {0}")]
    Image(String),
    /// Parameters out of range (iterations, epsilon, optics).
    #[error("parameters: {0}")]
    Params(String),
}
