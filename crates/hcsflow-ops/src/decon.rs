//! `richardson_lucy`: Richardson–Lucy deconvolution of the whole stack
//! (`[z, y, x]`, the algorithm is `hcsflow-decon`), f32 result (the dtype
//! policy brings it back to the input dtype unless the step asks for f32).
//!
//! The PSF comes from exactly one of:
//! - `psf`: a TIFF file (one page per z plane; odd sizes, peak in the middle
//!   voxel, non-negative; normalised to sum 1 when read);
//! - `sigma_xy` (pixels) and `sigma_z` (planes): a Gaussian; `sigma_z = 0`
//!   gives a one-plane PSF, which deconvolves every plane on its own;
//! - `na`, `wavelength_nm`, `refractive_index`: the widefield Gaussian model
//!   of [`hcsflow_decon::Optics`], with `pixel_size_um` (0: the plate's pixel
//!   size, which the pipeline passes on) and `z_step_um` (0: a one-plane PSF;
//!   plates do not record the z step, so give it for 3D).
//!
//! `boundary = "same"` is scikit-image's zero-padded model, `"circular"` the
//! periodic one; `acceleration` turns on Biggs–Andrews; `epsilon` floors the
//! blurred estimate before dividing; `method` chooses FFTs or direct
//! separable convolution (the same result; `auto` picks the faster). The
//! image must be non-negative: nothing is subtracted, and values below 0 are
//! an error unless `negative = "clip"` asks to set them to 0 first (the
//! step's notes then say how many there were and the lowest); NaN and
//! infinities are an error either way.

use std::path::Path;

use hcsflow_core::{ArgProblem, CallContext, Contract, FunctionDecl, FunctionError, Registry, Stack, StackShape};
use hcsflow_decon::{Boundary, Method, Optics, Plan, Psf, RlParams};

hcsflow_core::function_args! {
    /// The arguments of [`RICHARDSON_LUCY`].
    pub struct RichardsonLucyArgs {
        iterations: i64 = int(10, Some(1), Some(10_000), "Richardson–Lucy iterations (the regularisation: fewer = smoother)"),
        psf: String = text("", "PSF TIFF (one page per z plane, odd sizes, peak in the middle); or give sigma_xy, or the optics (na, ...)"),
        sigma_xy: f64 = float(0.0, Some(0.0), None, "Gaussian PSF: lateral sigma in pixels"),
        sigma_z: f64 = float(0.0, Some(0.0), None, "Gaussian PSF: axial sigma in planes; 0: a one-plane PSF (each plane on its own)"),
        na: f64 = float(0.0, Some(0.0), None, "widefield Gaussian PSF model: numerical aperture"),
        wavelength_nm: f64 = float(0.0, Some(0.0), None, "widefield model: emission wavelength, nm"),
        refractive_index: f64 = float(0.0, Some(0.0), None, "widefield model: immersion refractive index (1.0 air, 1.33 water, 1.515 oil)"),
        pixel_size_um: f64 = float(0.0, Some(0.0), None, "widefield model: pixel size, µm; 0: the plate's"),
        z_step_um: f64 = float(0.0, Some(0.0), None, "widefield model: z step, µm; 0: a one-plane PSF (each plane on its own)"),
        boundary: String = choice("same", &["same", "circular"], "same: zero outside the image (scikit-image's); circular: periodic"),
        acceleration: bool = bool(false, "Biggs–Andrews acceleration (two more volume buffers)"),
        epsilon: f64 = float(1e-12, Some(0.0), None, "floor of the blurred estimate before dividing"),
        method: String = choice("auto", &["auto", "fft", "separable"], "auto: direct 1D convolutions for a separable PSF (any Gaussian), else FFTs"),
        negative: String = choice("error", &["error", "clip"], "values below 0: error (refused, the first named), or clip (set to 0 first, and counted in the step's notes: a denoiser's output can dip below 0 where the background is near 0)"),
    }
}

pub static RICHARDSON_LUCY: FunctionDecl<RichardsonLucyArgs> = FunctionDecl::new(
    "richardson_lucy",
    Contract::Pure3d,
    "Richardson–Lucy deconvolution of the stack by FFTs (PSF from a TIFF, a Gaussian sigma or widefield optics); f32; input must be ≥ 0.",
)
.with_check(check)
.with_output_shape(hcsflow_core::same_shape);

/// Where the PSF comes from.
enum Source<'a> {
    File(&'a Path),
    Sigma([f64; 3]),
    Optics,
}

fn source(args: &RichardsonLucyArgs) -> Result<Source<'_>, ArgProblem> {
    let given = [!args.psf.is_empty(), args.sigma_xy > 0.0, args.na > 0.0];
    let fix = "give exactly one of: psf=<file.tif>, sigma_xy=<pixels> (and sigma_z=<planes>), or na=, wavelength_nm=, refractive_index= \
               (and z_step_um=)";
    match given.iter().filter(|g| **g).count() {
        0 => return Err(ArgProblem::new("psf", "no PSF: neither a psf file, a sigma_xy nor the optics (na) were given", fix)),
        1 => {}
        _ => return Err(ArgProblem::new("psf", "more than one PSF source given (psf file, sigma_xy, na)", fix)),
    }
    if args.sigma_z > 0.0 && args.sigma_xy == 0.0 {
        return Err(ArgProblem::new("sigma_z", "sigma_z needs sigma_xy (a Gaussian PSF)", "give sigma_xy too"));
    }
    Ok(if given[0] {
        Source::File(Path::new(&args.psf))
    } else if given[1] {
        Source::Sigma([args.sigma_z, args.sigma_xy, args.sigma_xy])
    } else {
        Source::Optics
    })
}

impl RichardsonLucyArgs {
    /// The algorithm's parameters.
    pub fn params(&self) -> RlParams {
        RlParams {
            iterations: usize::try_from(self.iterations).unwrap_or(1),
            boundary: if self.boundary == "circular" { Boundary::Circular } else { Boundary::Same },
            acceleration: self.acceleration,
            epsilon: self.epsilon as f32,
            method: match self.method.as_str() {
                "fft" => Method::Fft,
                "separable" => Method::Separable,
                _ => Method::Auto,
            },
        }
    }

    /// The optics of the widefield model, with the plate's pixel size when
    /// `pixel_size_um` is 0.
    fn optics(&self, plate_pixel_size_um: Option<f64>) -> Result<Optics, ArgProblem> {
        if self.wavelength_nm <= 0.0 || self.refractive_index <= 0.0 {
            return Err(ArgProblem::new(
                if self.wavelength_nm <= 0.0 { "wavelength_nm" } else { "refractive_index" },
                "the widefield PSF model needs na, wavelength_nm and refractive_index",
                "give wavelength_nm=<emission nm> and refractive_index=<1.0 air, 1.33 water, 1.515 oil>",
            ));
        }
        let pixel_size_um = if self.pixel_size_um > 0.0 { Some(self.pixel_size_um) } else { plate_pixel_size_um };
        let Some(pixel_size_um) = pixel_size_um else {
            return Err(ArgProblem::new(
                "pixel_size_um",
                "the widefield PSF model needs the pixel size and the stack carries none (no plate metadata)",
                "give pixel_size_um=<µm>",
            ));
        };
        Ok(Optics {
            na: self.na,
            wavelength_nm: self.wavelength_nm,
            refractive_index: self.refractive_index,
            pixel_size_um,
            z_step_um: (self.z_step_um > 0.0).then_some(self.z_step_um),
        })
    }

    /// The PSF these arguments describe (`plate_pixel_size_um`: the stack's
    /// pixel size, if known). A bad PSF is an [`ArgProblem`] on the argument
    /// that named it.
    pub fn psf(&self, plate_pixel_size_um: Option<f64>) -> Result<Psf, ArgProblem> {
        match source(self)? {
            Source::File(path) => Psf::from_tiff(path).map_err(|e| {
                ArgProblem::new("psf", e.to_string(), "give a TIFF with odd sizes, its peak in the middle voxel and values ≥ 0")
            }),
            Source::Sigma(sigma) => Psf::gaussian(sigma).map_err(|e| ArgProblem::new("sigma_xy", e.to_string(), "give sigmas > 0")),
            Source::Optics => {
                let optics = self.optics(plate_pixel_size_um)?;
                Psf::widefield(&optics).map_err(|e| ArgProblem::new("na", e.to_string(), "check the optics (na ≤ refractive_index)"))
            }
        }
    }
}

/// Before any pixel is read: one PSF source, a readable and valid PSF (for
/// the optics model only when the pixel size is an argument: the plate's is
/// known at run time), not larger than the stack.
fn check(args: &RichardsonLucyArgs, shape: &StackShape) -> Result<(), ArgProblem> {
    let source = source(args)?;
    if matches!(source, Source::Optics) && args.pixel_size_um == 0.0 {
        // The plate's pixel size is only known when the call runs.
        return args.optics(Some(1.0)).map(|_| ());
    }
    let psf = args.psf(None)?;
    if args.method == "separable" {
        let shape = [shape.depth, shape.height, shape.width];
        if let Err(e @ hcsflow_decon::DeconError::Params(_)) = Plan::new(shape, &psf, &RlParams { iterations: 1, ..args.params() }) {
            return Err(ArgProblem::new("method", e.to_string(), "use method = \"auto\" or \"fft\""));
        }
    }
    let [kz, ky, kx] = psf.shape();
    let image = [shape.depth, shape.height, shape.width];
    if let Some((axis, k, n)) = [("z", kz, image[0]), ("y", ky, image[1]), ("x", kx, image[2])].into_iter().find(|(_, k, n)| k > n) {
        return Err(ArgProblem::new(
            "psf",
            format!("the PSF ({}) is {kz}×{ky}×{kx} (z, y, x), larger than the stack ({n} along {axis}, PSF {k})", psf.origin()),
            "crop the PSF, use a smaller sigma, or deconvolve a larger stack",
        ));
    }
    Ok(())
}

/// `richardson_lucy` on a host stack; notes the FFT grid and buffers.
pub fn richardson_lucy(stack: &Stack, args: &RichardsonLucyArgs, context: &mut CallContext) -> Result<Stack, FunctionError> {
    let name = RICHARDSON_LUCY.name;
    let psf = args
        .psf(context.stack.pixel_size_um)
        .map_err(|p| FunctionError::invalid(name, format!("{}: {}; {}", hcsflow_core::blamed(p.arg), p.problem, p.fix)))?;
    let mut image = stack.to_f32();
    if args.negative == "clip" {
        let (mut count, mut lowest) = (0usize, 0.0f32);
        for v in image.iter_mut().filter(|v| **v < 0.0) {
            (count, lowest) = (count + 1, lowest.min(*v));
            *v = 0.0;
        }
        if count > 0 {
            context.note(format!("negative = \"clip\": {count} values below 0 set to 0 (the lowest {lowest})"));
        }
    }
    let plan = Plan::new(stack.shape(), &psf, &args.params()).map_err(|e| FunctionError::invalid(name, e.to_string()))?;
    context.note(format!("{} (PSF {}, {:?})", plan.describe(), psf.origin(), psf.shape()));
    let out = plan.run(image.view()).map_err(|e| FunctionError::invalid(name, e.to_string()))?;
    Ok(Stack::from(out))
}

pub(crate) fn register(registry: &mut Registry) {
    registry.add(RICHARDSON_LUCY.host(richardson_lucy));
}
