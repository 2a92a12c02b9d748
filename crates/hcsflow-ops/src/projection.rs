//! Projections over the stack axis.

use hcsflow_core::{
    with_pixels, Contract, FunctionError, FunctionSpec, Implementation, Pixel, Registry, Stack,
};
use ndarray::{Array3, ArrayView3, Axis};
use rayon::prelude::*;

/// Rows per parallel task: large enough to amortise scheduling, small enough
/// to spread a 2048-row plane over the cores.
const ROWS_PER_TASK: usize = 64;

/// Applies `fold(acc_row, plane_row)` over planes 1.. into a copy of plane 0,
/// in parallel over row blocks. Planes are visited in order for every pixel.
fn fold_planes<T: Pixel, A: Copy + Send + Sync>(
    a: ArrayView3<T>,
    init: impl Fn(T) -> A + Sync,
    fold: impl Fn(&mut A, T) + Sync,
) -> Vec<A> {
    let (n, h, w) = a.dim();
    let mut acc = vec![init(T::default()); h * w];
    if n == 0 {
        return acc;
    }
    acc.par_chunks_mut(ROWS_PER_TASK * w.max(1)).enumerate().for_each(|(block, out)| {
        let y0 = block * ROWS_PER_TASK;
        let rows = out.len() / w.max(1);
        for z in 0..n {
            let plane = a.index_axis(Axis(0), z);
            for r in 0..rows {
                let src = plane.row(y0 + r);
                let dst = &mut out[r * w..(r + 1) * w];
                match src.as_slice() {
                    Some(s) if z == 0 => dst.iter_mut().zip(s).for_each(|(d, &v)| *d = init(v)),
                    Some(s) => dst.iter_mut().zip(s).for_each(|(d, &v)| fold(d, v)),
                    None if z == 0 => dst.iter_mut().zip(src.iter()).for_each(|(d, &v)| *d = init(v)),
                    None => dst.iter_mut().zip(src.iter()).for_each(|(d, &v)| fold(d, v)),
                }
            }
        }
    });
    acc
}

fn empty_stack_error(function: &str) -> FunctionError {
    FunctionError::failed(function, "the stack has no planes")
}

/// Per-pixel maximum over the stack axis, in the input dtype (u16 stays u16).
/// For f32, NaN never replaces a number (a pixel is replaced only by a strictly greater value).
pub fn max_projection(stack: &Stack) -> Result<Stack, FunctionError> {
    if stack.depth() == 0 {
        return Err(empty_stack_error("max_projection"));
    }
    let [_, h, w] = stack.shape();
    Ok(with_pixels!(Stack, stack, a, T => {
        let v = fold_planes(a.view(), |v: T| v, |m, v| if v > *m { *m = v });
        Stack::from(Array3::from_shape_vec((1, h, w), v).unwrap_or_else(|_| unreachable!("h*w values")))
    }))
}

/// Per-pixel arithmetic mean over the stack axis, as f32: values are summed in
/// f32 in plane order and divided by the number of planes (sums of u16 pixels
/// are exact up to 256 planes). The dtype policy brings the result back to
/// the input dtype unless the step asks for f32.
pub fn mean_projection(stack: &Stack) -> Result<Stack, FunctionError> {
    if stack.depth() == 0 {
        return Err(empty_stack_error("mean_projection"));
    }
    let [n, h, w] = stack.shape();
    let sums = with_pixels!(Stack, stack, a, T => fold_planes(a.view(), |v: T| v.to_f32(), |s, v| *s += v.to_f32()));
    let inv = n as f32;
    let mean: Vec<f32> = sums.into_iter().map(|s| s / inv).collect();
    Ok(Stack::F32(Array3::from_shape_vec((1, h, w), mean).unwrap_or_else(|_| unreachable!("h*w values"))))
}

pub(crate) fn register(registry: &mut Registry) {
    registry.register(
        FunctionSpec {
            name: "max_projection",
            doc: "Per-pixel maximum over the stack axis (numpy.max(axis=0)); keeps the dtype.",
            contract: Contract::VolumetricToSlice,
            args: vec![],
        },
        Implementation::host(|s, _| max_projection(s)),
    );
    registry.register(
        FunctionSpec {
            name: "mean_projection",
            doc: "Per-pixel mean over the stack axis (numpy.mean(axis=0)), computed in f32.",
            contract: Contract::VolumetricToSlice,
            args: vec![],
        },
        Implementation::host(|s, _| mean_projection(s)),
    );
}
