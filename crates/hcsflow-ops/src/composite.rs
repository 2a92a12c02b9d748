//! Channel composite (weighted mean over the stack axis) and apply-mask.

use hcsflow_core::StackArray;
use hcsflow_core::{
    with_pixels, ArgProblem, ArgSpec, Args, Contract, FunctionError, FunctionSpec, Implementation, Pixel, Registry, Stack, StackShape,
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
    let idx = if mask_index < 0 { n as i64 + mask_index } else { mask_index };
    if n < 2 || idx < 0 || idx >= n as i64 {
        return Err(FunctionError::invalid(
            "apply_mask",
            format!("needs a stack of images plus a mask plane; mask_index {mask_index} is not a plane of this {n}-plane stack"),
        ));
    }
    let idx = idx as usize;
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
fn check_composite(args: &Args, shape: &StackShape) -> Result<(), ArgProblem> {
    let weights = args.float_list("weights");
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
fn check_apply_mask(args: &Args, shape: &StackShape) -> Result<(), ArgProblem> {
    let n = shape.depth;
    let mask_index = args.int("mask_index");
    let idx = if mask_index < 0 { (n as i64).checked_add(mask_index) } else { Some(mask_index) };
    if n < 2 {
        return Err(ArgProblem::new(
            "mask_index",
            format!("needs a stack of images plus a mask plane, but the stack has {n} plane"),
            "make the step's stacks hold the mask and its images, e.g. variable_components = [\"channel\"] and group_by = \"none\"",
        ));
    }
    if !idx.is_some_and(|i| (0..n as i64).contains(&i)) {
        return Err(ArgProblem::new(
            "mask_index",
            format!("mask_index {mask_index} is not a plane of this {n}-plane stack"),
            format!("use 0..{} (or -1..-{n} counted from the end)", n - 1),
        ));
    }
    Ok(())
}

/// `apply_mask` returns the stack without its mask plane.
fn apply_mask_shape(_: &Args, input: &StackShape) -> Option<StackShape> {
    (input.depth >= 2).then(|| input.with_depth(input.depth - 1))
}

pub(crate) fn register(registry: &mut Registry) {
    registry.register(
        FunctionSpec {
            name: "composite",
            doc: "Weighted mean over the stack axis (weights normalised to sum 1; empty = equal); f32 result, N → 1.",
            contract: Contract::VolumetricToSlice,
            args: vec![ArgSpec::float_list(
                "weights",
                Vec::new(),
                Some(0.0),
                None,
                0,
                "one weight per plane, e.g. 0.5,0.3,0.2 (empty: equal weights)",
            )],
        },
        Implementation::host(|s, a| composite(s, a.float_list("weights"))),
    );
    registry.register(
        FunctionSpec {
            name: "apply_mask",
            doc: "Keeps pixels where the mask plane is non-zero, sets the rest to fill (np.where); N → N-1, keeps the dtype.",
            contract: Contract::Pure3d,
            args: vec![
                ArgSpec::int("mask_index", -1, None, None, "which plane is the mask (-1: the last)"),
                ArgSpec::float("fill", 0.0, None, None, "value outside the mask"),
            ],
        },
        Implementation::host(|s, a| apply_mask(s, a.int("mask_index"), a.float("fill"))),
    );
    registry.set_check("composite", check_composite);
    registry.set_output_shape("composite", hcsflow_core::one_plane);
    registry.set_check("apply_mask", check_apply_mask);
    registry.set_output_shape("apply_mask", apply_mask_shape);
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
