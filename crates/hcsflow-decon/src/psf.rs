//! Point spread functions: validated arrays, TIFF files, and a widefield
//! Gaussian model from the optics.
//!
//! A [`Psf`] always has odd sizes along z, y and x, its centre is the middle
//! voxel (`(k − 1) / 2` along each axis, scipy's "same" centre), its values
//! are finite and non-negative and they sum to 1. A 2D PSF is a one-plane PSF
//! (`[1, ky, kx]`): each plane of a stack is then deconvolved on its own.

use std::path::Path;

use ndarray::{Array3, ArrayView3};

use crate::DeconError;

/// A validated, normalised PSF (see the module documentation).
#[derive(Debug, Clone, PartialEq)]
pub struct Psf {
    data: Array3<f32>,
    origin: String,
}

impl Psf {
    /// Validates `data` (`[z, y, x]`) and normalises it to sum 1. `origin`
    /// names it in errors (a file path, or a model).
    ///
    /// Errors: an empty array or an even size (the centre voxel would be
    /// ambiguous: crop or pad the PSF to an odd size around its peak),
    /// non-finite or negative values, a zero sum, and a peak more than
    /// `max(1, k/8)` voxels from the centre along an axis (a PSF stored
    /// with its peak at a corner, as some FFT code keeps it, or not centred
    /// on its bead).
    pub fn new(data: Array3<f32>, origin: &str) -> Result<Psf, DeconError> {
        let bad = |reason: String| DeconError::Psf { origin: origin.to_string(), reason };
        let (kz, ky, kx) = data.dim();
        if data.is_empty() {
            return Err(bad(format!("is empty ({kz}×{ky}×{kx})")));
        }
        if let Some((axis, k)) = [("z", kz), ("y", ky), ("x", kx)].into_iter().find(|&(_, k)| k % 2 == 0) {
            return Err(bad(format!(
                "is {kz}×{ky}×{kx} (z, y, x): the size along {axis} ({k}) is even, so it has no centre voxel; \
                 crop or pad it to an odd size with the peak in the middle"
            )));
        }
        let mut sum = 0.0f64;
        let mut peak = (f32::MIN, [0usize; 3]);
        for ((z, y, x), &v) in data.indexed_iter() {
            if !v.is_finite() {
                return Err(bad(format!("has a non-finite value ({v}) at (z, y, x) = ({z}, {y}, {x})")));
            }
            if v < 0.0 {
                return Err(bad(format!(
                    "has a negative value ({v}) at (z, y, x) = ({z}, {y}, {x}); a PSF is an intensity (≥ 0): subtract its \
                     background and clip it at 0 before using it"
                )));
            }
            sum += f64::from(v);
            if v > peak.0 {
                peak = (v, [z, y, x]);
            }
        }
        if sum <= 0.0 || !sum.is_finite() {
            return Err(bad(format!("sums to {sum}: it must have a positive, finite sum")));
        }
        for (axis, (&p, k)) in ["z", "y", "x"].iter().zip(peak.1.iter().zip([kz, ky, kx])) {
            let centre = (k - 1) / 2;
            let tolerance = (k / 8).max(1);
            if p.abs_diff(centre) > tolerance {
                return Err(bad(format!(
                    "is not centred: its peak is at index {p} along {axis}, the centre voxel is {centre} (of {k}); shift it \
                     so that the peak is in the middle voxel"
                )));
            }
        }
        let scale = (1.0 / sum) as f32;
        let data = data.mapv(|v| v * scale);
        Ok(Psf { data, origin: origin.to_string() })
    }

    /// Reads a PSF from a TIFF file: one page (a 2D PSF) or one page per z
    /// plane; any pixel type; then [`Psf::new`]. Errors name the file.
    pub fn from_tiff(path: &Path) -> Result<Psf, DeconError> {
        let stack = hcsflow_tiff::read_stack(path).map_err(|source| DeconError::PsfFile { path: path.to_path_buf(), source })?;
        Psf::new(stack.to_f32(), &path.display().to_string())
    }

    /// A separable Gaussian PSF with standard deviations `sigma_zyx` in
    /// voxels, sampled at voxel centres over ±3σ (at least the centre voxel:
    /// σ = 0 along z gives a one-plane PSF), normalised to sum 1.
    pub fn gaussian(sigma_zyx: [f64; 3]) -> Result<Psf, DeconError> {
        if let Some(s) = sigma_zyx.iter().find(|s| !s.is_finite() || **s < 0.0) {
            return Err(DeconError::Params(format!("Gaussian PSF: sigma {s} must be finite and ≥ 0")));
        }
        if sigma_zyx[1] == 0.0 || sigma_zyx[2] == 0.0 {
            return Err(DeconError::Params(format!(
                "Gaussian PSF: the lateral sigmas must be > 0, got (y, x) = ({}, {})",
                sigma_zyx[1], sigma_zyx[2]
            )));
        }
        let half = |s: f64| (3.0 * s).ceil() as usize;
        let profile = |s: f64| -> Vec<f32> {
            let h = half(s) as isize;
            (-h..=h).map(|i| if s == 0.0 { 1.0 } else { (-(i * i) as f64 / (2.0 * s * s)).exp() as f32 }).collect()
        };
        let (pz, py, px) = (profile(sigma_zyx[0]), profile(sigma_zyx[1]), profile(sigma_zyx[2]));
        if pz.len() * py.len() * px.len() > 1 << 26 {
            return Err(DeconError::Params(format!("Gaussian PSF: sigmas {sigma_zyx:?} voxels give a PSF larger than 2^26 voxels")));
        }
        let data = Array3::from_shape_fn((pz.len(), py.len(), px.len()), |(z, y, x)| pz[z] * py[y] * px[x]);
        Psf::new(data, &format!("Gaussian σ (z, y, x) = ({:.3}, {:.3}, {:.3}) voxels", sigma_zyx[0], sigma_zyx[1], sigma_zyx[2]))
    }

    /// The widefield Gaussian approximation of [`Optics`] ([`Optics::sigmas_voxels`]).
    pub fn widefield(optics: &Optics) -> Result<Psf, DeconError> {
        Psf::gaussian(optics.sigmas_voxels()?)
    }

    /// `[z, y, x]` sizes (all odd).
    pub fn shape(&self) -> [usize; 3] {
        let (z, y, x) = self.data.dim();
        [z, y, x]
    }

    /// The values (sum 1).
    pub fn view(&self) -> ArrayView3<'_, f32> {
        self.data.view()
    }

    /// Where it came from (a file path or a model), for messages.
    pub fn origin(&self) -> &str {
        &self.origin
    }
}

/// A widefield microscope's optics, for a Gaussian PSF model.
///
/// The model is the paraxial widefield Gaussian approximation of Zhang,
/// Zerubia & Olivo-Marin (Appl. Opt. 46:1819, 2007): lateral
/// `σ_xy = 0.21 λ / NA`, axial `σ_z = 0.66 λ n / NA²` (λ the emission
/// wavelength, n the immersion refractive index), converted to voxels by the
/// pixel size and the z step. It has no rings and no aberrations: good enough
/// to sharpen, not a measured PSF.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct Optics {
    /// Numerical aperture, in (0, n].
    pub na: f64,
    /// Emission wavelength, nm.
    pub wavelength_nm: f64,
    /// Refractive index of the immersion medium (1.0 air, 1.33 water, 1.515 oil).
    pub refractive_index: f64,
    /// Pixel size in the sample plane, µm.
    pub pixel_size_um: f64,
    /// Distance between z planes, µm; `None` for a 2D (one-plane) PSF.
    pub z_step_um: Option<f64>,
}

impl Optics {
    /// `(σ_z, σ_xy)` in µm (the module's formulas).
    pub fn sigmas_um(&self) -> Result<(f64, f64), DeconError> {
        let positive = |name: &str, v: f64| {
            if v.is_finite() && v > 0.0 {
                Ok(())
            } else {
                Err(DeconError::Params(format!("optics: {name} must be finite and > 0, got {v}")))
            }
        };
        positive("na", self.na)?;
        positive("wavelength_nm", self.wavelength_nm)?;
        positive("refractive_index", self.refractive_index)?;
        positive("pixel_size_um", self.pixel_size_um)?;
        if let Some(dz) = self.z_step_um {
            positive("z_step_um", dz)?;
        }
        if self.na > self.refractive_index {
            return Err(DeconError::Params(format!(
                "optics: the numerical aperture ({}) cannot exceed the refractive index ({})",
                self.na, self.refractive_index
            )));
        }
        let lambda_um = self.wavelength_nm / 1000.0;
        Ok((0.66 * lambda_um * self.refractive_index / (self.na * self.na), 0.21 * lambda_um / self.na))
    }

    /// `[σ_z, σ_y, σ_x]` in voxels (σ_z = 0 without a z step).
    pub fn sigmas_voxels(&self) -> Result<[f64; 3], DeconError> {
        let (sz, sxy) = self.sigmas_um()?;
        let lateral = sxy / self.pixel_size_um;
        Ok([self.z_step_um.map_or(0.0, |dz| sz / dz), lateral, lateral])
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn gaussian_is_normalised_centred_and_odd() {
        let psf = Psf::gaussian([2.0, 1.2, 1.2]).unwrap();
        assert_eq!(psf.shape(), [13, 9, 9]);
        let sum: f64 = psf.view().iter().map(|&v| f64::from(v)).sum();
        assert!((sum - 1.0).abs() < 1e-5);
        assert_eq!(psf.view().iter().cloned().fold(0.0, f32::max), psf.view()[[6, 4, 4]]);
        assert_eq!(Psf::gaussian([0.0, 1.0, 1.0]).unwrap().shape(), [1, 7, 7]);
    }

    #[test]
    fn widefield_sigmas_follow_the_formulas() {
        let o = Optics { na: 1.4, wavelength_nm: 520.0, refractive_index: 1.515, pixel_size_um: 0.065, z_step_um: Some(0.2) };
        let [sz, sy, sx] = o.sigmas_voxels().unwrap();
        assert!((sy - 0.21 * 0.52 / 1.4 / 0.065).abs() < 1e-12 && sx == sy);
        assert!((sz - 0.66 * 0.52 * 1.515 / (1.4 * 1.4) / 0.2).abs() < 1e-12);
        let bad = Optics { na: 1.6, ..o };
        assert!(bad.sigmas_voxels().unwrap_err().to_string().contains("cannot exceed"));
    }
}
