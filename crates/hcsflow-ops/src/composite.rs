//! Channel composite (weighted mean over the stack axis) and apply-mask.

use hcsflow_core::{
    one_plane, with_pixels, ArgProblem, Contract, FunctionDecl, FunctionError, Pixel, Registry, Stack, StackArray, StackShape,
};
use rayon::prelude::*;

/// Rows per parallel task.
const ROWS_PER_TASK: usize = 16;

/// The normalised weights of a composite of `n` planes: `weights / Σ weights`,
/// equal weights when `weights` is empty. Errors name the problem.
pub fn composite_weights(weights: &[f64], n: usize) -> Result<Vec<f32>, FunctionError> {
    let name = "composite";
    if n == 0 {
        return Err(FunctionError::invalid(name, "the stack has no planes"));
    }
    if weights.is_empty() {
        return Ok(vec![(1.0 / n as f64) as f32; n]);
    }
    if weights.len() != n {
        return Err(FunctionError::invalid(name, format!("{} weights given for a stack of {n} planes", weights.len())));
    }
    if weights.iter().any(|&w| !w.is_finite() || w < 0.0) {
        return Err(FunctionError::invalid(name, "weights must be finite and >= 0"));
    }
    let sum: f64 = weights.iter().sum();
    if sum <= 0.0 {
        return Err(FunctionError::invalid(name, "the weights sum to 0"));
    }
    Ok(weights.iter().map(|&w| (w / sum) as f32).collect())
}

/// Weighted mean over the stack axis: `Σ_i w_i · x_i` with the normalised
/// weights of [`composite_weights`], accumulated in f32 in plane order (each
/// term `w_i · x_i` rounded to f32, then added). f32 output (N → 1); agrees
/// with numpy `np.tensordot(w / w.sum(), x, 1)` in float64 within 1e-6 relative.
pub fn composite(stack: &Stack, weights: &[f64]) -> Result<Stack, FunctionError> {
    let [n, h, w] = stack.shape();
    let wts = composite_weights(weights, n)?;
    let mut out = StackArray::<f32>::zeros([1, h, w]);
    with_pixels!(Stack, stack, a, T => {
        let planes: Vec<&[T]> = a.planes().collect();
        out.pixels_mut().par_chunks_mut(ROWS_PER_TASK * w.max(1)).enumerate().for_each(|(block, o)| {
            let start = block * ROWS_PER_TASK * w;
            for (z, (&wz, plane)) in wts.iter().zip(&planes).enumerate() {
                let src = &plane[start..start + o.len()];
                if z == 0 {
                    o.iter_mut().zip(src).for_each(|(o, &v)| *o = wz * v.to_f32());
                } else {
                    o.iter_mut().zip(src).for_each(|(o, &v)| *o += wz * v.to_f32());
                }
            }
        });
    });
    Ok(Stack::from(out))
}

/// Applies the mask plane to the other planes: the plane at `mask_index`
/// (negative counts from the end, -1 = last) is the mask; every other plane
/// keeps its pixels where the mask is non-zero and gets `fill` elsewhere
/// (`np.where(mask != 0, x, fill)`; `fill` rounded and clipped to the dtype).
/// N planes in → N - 1 out, same dtype.
pub fn apply_mask(stack: &Stack, mask_index: i64, fill: f64) -> Result<Stack, FunctionError> {
    let [n, h, w] = stack.shape();
    let args = ApplyMaskArgs { mask_index, fill };
    let idx = args.mask_plane(n).ok_or_else(|| args.no_mask_plane(n))?;
    Ok(with_pixels!(Stack, stack, a, T => {
        let fill = T::from_f32_clip(fill as f32);
        let keep: Vec<bool> = a.plane(idx).iter().map(|&m| m.to_f32() != 0.0).collect();
        let planes: Vec<usize> = (0..n).filter(|&z| z != idx).collect();
        let mut out = StackArray::<T>::zeros([planes.len(), h, w]);
        let mut dst: Vec<&mut [T]> = out.planes_mut().collect();
        dst.par_iter_mut().zip(planes.par_iter()).for_each(|(o, &z)| {
            o.iter_mut().zip(a.plane(z)).zip(&keep).for_each(|((o, &v), &k)| *o = if k { v } else { fill });
        });
        Stack::from(out)
    }))
}

/// `composite`'s check: one weight per plane of the stack (or none), not all zero.
fn check_composite(args: &CompositeArgs, shape: &StackShape) -> Result<(), ArgProblem> {
    let weights = &args.weights;
    let n = shape.depth;
    if !weights.is_empty() && weights.len() != n {
        return Err(ArgProblem::new(
            "weights",
            format!("{} weights given for a stack of {n} planes", weights.len()),
            format!("give {n} weights, one per plane in stack order, or weights = [] for equal weights"),
        ));
    }
    if !weights.is_empty() && weights.iter().sum::<f64>() <= 0.0 {
        return Err(ArgProblem::new(
            "weights",
            "the weights sum to 0",
            "give at least one plane a weight above 0, or weights = [] for equal weights",
        ));
    }
    Ok(())
}

/// `apply_mask`'s check: the stack has a mask plane and at least one image plane.
fn check_apply_mask(args: &ApplyMaskArgs, shape: &StackShape) -> Result<(), ArgProblem> {
    let n = shape.depth;
    let mask_index = args.mask_index;
    if n < 2 {
        return Err(ArgProblem::new(
            "mask_index",
            format!("needs a stack of images plus a mask plane, but the stack has {n} plane"),
            "make the step's stacks hold the mask and its images, e.g. variable_components = [\"channel\"] and group_by = \"none\"",
        ));
    }
    if args.mask_plane(n).is_none() {
        return Err(ArgProblem::new(
            "mask_index",
            format!("mask_index {mask_index} is not a plane of this {n}-plane stack"),
            format!("use 0..{} (or -1..-{n} counted from the end)", n - 1),
        ));
    }
    Ok(())
}

/// `apply_mask` returns the stack without its mask plane.
fn apply_mask_shape(_: &ApplyMaskArgs, input: &StackShape) -> Option<StackShape> {
    (input.depth >= 2).then(|| input.with_depth(input.depth - 1))
}

hcsflow_core::function_args! {
    /// The arguments of [`COMPOSITE`].
    pub struct CompositeArgs {
        weights: Vec<f64> = float_list(Vec::new(), Some(0.0), None, 0, "one weight per plane, e.g. 0.5,0.3,0.2 (empty: equal weights)"),
    }
}

hcsflow_core::function_args! {
    /// The arguments of [`APPLY_MASK`].
    pub struct ApplyMaskArgs {
        mask_index: i64 = int(-1, None, None, "which plane is the mask (-1: the last)"),
        fill: f64 = float(0.0, None, None, "value outside the mask"),
    }
}

impl ApplyMaskArgs {
    /// The mask plane of an `n`-plane stack: `mask_index`, negative counted
    /// from the end (-1 = last); `None` when that is not a plane or the stack
    /// has no image plane besides the mask.
    pub fn mask_plane(&self, n: usize) -> Option<usize> {
        let idx = if self.mask_index < 0 { (n as i64).checked_add(self.mask_index) } else { Some(self.mask_index) };
        idx.filter(|&i| n >= 2 && (0..n as i64).contains(&i)).map(|i| i as usize)
    }

    /// The error of a call whose `n`-plane stack has no [`mask_plane`](Self::mask_plane).
    pub fn no_mask_plane(&self, n: usize) -> FunctionError {
        FunctionError::invalid(
            "apply_mask",
            format!("needs a stack of images plus a mask plane; mask_index {} is not a plane of this {n}-plane stack", self.mask_index),
        )
    }
}

pub static COMPOSITE: FunctionDecl<CompositeArgs> = FunctionDecl::new(
    "composite",
    Contract::VolumetricToSlice,
    "Weighted mean over the stack axis (weights normalised to sum 1; empty = equal); f32 result, N → 1.",
)
.with_check(check_composite)
.with_output_shape(one_plane);

pub static APPLY_MASK: FunctionDecl<ApplyMaskArgs> = FunctionDecl::new(
    "apply_mask",
    Contract::Pure3d,
    "Keeps pixels where the mask plane is non-zero, sets the rest to fill (np.where); N → N-1, keeps the dtype.",
)
.with_check(check_apply_mask)
.with_output_shape(apply_mask_shape);

pub(crate) fn register(registry: &mut Registry) {
    registry.add(COMPOSITE.host(|s, a, _| composite(s, &a.weights)));
    registry.add(APPLY_MASK.host(|s, a, _| apply_mask(s, a.mask_index, a.fill)));
}

#[cfg(test)]
mod tests {
    use super::*;
    use ndarray::Array3;

    #[test]
    fn a_stack_not_in_standard_layout_composites_like_its_standard_copy() {
        let a = Array3::from_shape_fn((3, 5, 40), |(z, y, x)| (z * 1000 + y * 40 + x) as u16);
        // Y and X swapped in memory: the planes are not contiguous slices.
        let swapped = Stack::from(a.clone().permuted_axes([0, 2, 1]));
        let standard = Stack::from(a.permuted_axes([0, 2, 1]).as_standard_layout().into_owned());
        assert_eq!(composite(&swapped, &[1.0, 2.0, 3.0]).unwrap(), composite(&standard, &[1.0, 2.0, 3.0]).unwrap());
    }
}
