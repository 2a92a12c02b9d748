//! The correction: `(I − camera_offset − D) / F`, in f32.

use hcsflow_core::{with_pixels, Pixel, Stack, StackArray};

use crate::{BasicError, Profiles};

/// The correction folded into two per-pixel factors, as [`correct`] applies
/// them: a corrected pixel is `I · inverse − shift` (two f32 operations), with
/// `inverse = 1/F` and `shift = (D + camera_offset) · (1/F)`. A GPU
/// implementation uploads these and computes the same two operations.
#[derive(Debug, Clone, PartialEq)]
pub struct Folded {
    pub inverse: Vec<f32>,
    pub shift: Vec<f32>,
}

/// Folds `profiles` and `camera_offset` for images of `shape` (`(height, width)`),
/// refusing profiles of another size.
pub fn fold(profiles: &Profiles, camera_offset: f32, shape: (usize, usize)) -> Result<Folded, BasicError> {
    let (h, w) = shape;
    if profiles.shape() != (h, w) || profiles.darkfield.dim() != (h, w) {
        let (ph, pw) = profiles.shape();
        return Err(BasicError::Shape { reason: format!("the profiles are {ph}x{pw}, the images are {h}x{w}") });
    }
    let (Some(flat), Some(dark)) = (profiles.flatfield.as_slice(), profiles.darkfield.as_slice()) else {
        return Err(BasicError::Shape { reason: "the profiles are not in standard layout".into() });
    };
    // Dark and offset folded once: I·(1/F) − (D + offset)/F.
    let inverse: Vec<f32> = flat.iter().map(|&f| 1.0 / f).collect();
    let shift: Vec<f32> = dark.iter().zip(&inverse).map(|(&d, &i)| (d + camera_offset) * i).collect();
    Ok(Folded { inverse, shift })
}

/// Corrects every plane of `stack` (`[N, Y, X]`, any dtype) with `profiles`
/// (`Y × X`): `(I − camera_offset − D) / F`, then `− baseline[i]` for plane `i`
/// when a baseline is given (BaSiCPy's time-lapse form; one value per plane).
/// The result is f32 (the caller's dtype policy may bring it back: values
/// below 0 clip there). `camera_offset` is a constant the user knows (the
/// camera's bias), separate from the estimated dark-field.
pub fn correct(stack: &Stack, profiles: &Profiles, camera_offset: f32, baseline: Option<&[f32]>) -> Result<Stack, BasicError> {
    let [n, h, w] = stack.shape();
    let Folded { inverse, shift } = fold(profiles, camera_offset, (h, w))?;
    if let Some(b) = baseline.filter(|b| b.len() != n) {
        return Err(BasicError::Shape { reason: format!("{} baseline values for {n} planes", b.len()) });
    }
    let out = with_pixels!(Stack, stack, a, T => {
        StackArray::<f32>::from_planes([n, h, w], |z| {
            let b = baseline.map_or(0.0, |b| b[z]);
            a.plane(z).iter().zip(&inverse).zip(&shift).map(move |((&v, &i), &s)| v.to_f32() * i - s - b)
        })
    });
    Ok(Stack::from(out))
}
