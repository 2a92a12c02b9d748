//! Geometry per plane: binning (k × k mean or sum) and crop.

use hcsflow_core::{with_pixels, ArgProblem, Contract, FunctionDecl, FunctionError, Pixel, Registry, Stack, StackArray, StackShape};
use ndarray::{s, Axis};
use rayon::prelude::*;

/// k × k binning of every plane: output `[N, H / k, W / k]` (integer division;
/// trailing rows/columns that do not fill a bin are dropped), each pixel the
/// sum or the mean of its bin: numpy
/// `x[:, :H//k*k, :W//k*k].reshape(N, H//k, k, W//k, k).sum/mean(axis=(2, 4))`.
/// Sums accumulate in f64 per bin and are returned as f32 (exact for u8/u16
/// bins below 2^24); `mean` divides the f64 sum by k², then rounds once to f32.
pub fn bin(stack: &Stack, k: usize, mean: bool) -> Result<Stack, FunctionError> {
    if k == 0 {
        return Err(FunctionError::invalid("bin", "factor must be >= 1"));
    }
    let [n, h, w] = stack.shape();
    let (oh, ow) = (h / k, w / k);
    if (oh == 0 || ow == 0) && n > 0 {
        return Err(FunctionError::invalid("bin", format!("factor {k} is larger than the {h}x{w} plane")));
    }
    let divisor = if mean { (k * k) as f64 } else { 1.0 };
    let mut out = StackArray::<f32>::zeros([n, oh, ow]);
    with_pixels!(Stack, stack, a, T => {
        out.pixels_mut().par_chunks_mut(ow.max(1)).enumerate().for_each(|(i, o)| {
            let (z, by) = (i / oh.max(1), i % oh.max(1));
            let plane = a.view().index_axis_move(Axis(0), z);
            let mut acc = vec![0f64; ow];
            for dy in 0..k {
                let row = plane.row(by * k + dy);
                for (bx, acc) in acc.iter_mut().enumerate() {
                    let mut s = 0f64;
                    for dx in 0..k {
                        s += row[bx * k + dx].to_f32() as f64;
                    }
                    *acc += s;
                }
            }
            o.iter_mut().zip(&acc).for_each(|(o, &s)| *o = (s / divisor) as f32);
        });
    });
    Ok(Stack::from(out))
}

/// The rectangle `[y, y + height) × [x, x + width)` of every plane, same dtype
/// (numpy slicing `x[:, y:y+height, x:x+width]`). The rectangle must lie inside
/// the plane; `height`/`width` = 0 mean "to the edge".
pub fn crop(stack: &Stack, y: usize, x: usize, height: usize, width: usize) -> Result<Stack, FunctionError> {
    let [_, h, w] = stack.shape();
    let (height, width) = crop_rectangle(y, x, height, width, h, w)
        .map_err(|(height, width)| FunctionError::invalid("crop", crop_misfit(y, x, height, width, h, w)))?;
    Ok(with_pixels!(Stack, stack, a, T => Stack::from(a.view().slice(s![.., y..y + height, x..x + width]).to_owned())))
}

/// The crop's `(height, width)` with 0 ("to the edge") resolved, if the
/// rectangle lies inside an `h × w` plane (overflow-safe: `y` may be near 2⁶³);
/// else `Err` with the resolved sizes, for the message.
fn crop_rectangle(y: usize, x: usize, height: usize, width: usize, h: usize, w: usize) -> Result<(usize, usize), (usize, usize)> {
    let height = if height == 0 { h.saturating_sub(y) } else { height };
    let width = if width == 0 { w.saturating_sub(x) } else { width };
    let fits = |start: usize, len: usize, side: usize| len > 0 && start.checked_add(len).is_some_and(|end| end <= side);
    if fits(y, height, h) && fits(x, width, w) {
        Ok((height, width))
    } else {
        Err((height, width))
    }
}

fn crop_misfit(y: usize, x: usize, height: usize, width: usize, h: usize, w: usize) -> String {
    format!("the rectangle y={y}, x={x}, height={height}, width={width} does not fit inside the {h}x{w} plane")
}

/// The crop's arguments as sizes (`Int` ranges are >= 0).
fn crop_args(args: &CropArgs) -> [usize; 4] {
    [args.y, args.x, args.height, args.width].map(|v| usize::try_from(v).unwrap_or(usize::MAX))
}

/// `crop`'s check: the rectangle lies inside the plane.
fn check_crop(args: &CropArgs, shape: &StackShape) -> Result<(), ArgProblem> {
    let [y, x, height, width] = crop_args(args);
    let (h, w) = (shape.height, shape.width);
    crop_rectangle(y, x, height, width, h, w).map(|_| ()).map_err(|(rh, rw)| {
        // The first side that does not fit names the argument: its start, else its length.
        let rows_fit = rh > 0 && y.checked_add(rh).is_some_and(|end| end <= h);
        let arg = match (rows_fit, y >= h, x >= w) {
            (false, true, _) => "y",
            (false, false, _) => "height",
            (true, _, true) => "x",
            (true, _, false) => "width",
        };
        ArgProblem::new(
            arg,
            crop_misfit(y, x, rh, rw, h, w),
            format!("keep y + height <= {h} and x + width <= {w} (y < {h}, x < {w}; height/width 0 = to the edge)"),
        )
    })
}

fn crop_shape(args: &CropArgs, input: &StackShape) -> Option<StackShape> {
    let [y, x, height, width] = crop_args(args);
    let (height, width) = crop_rectangle(y, x, height, width, input.height, input.width).ok()?;
    Some(StackShape::new(input.depth, height, width))
}

/// `bin`'s check: at least one k × k block fits in the plane.
fn check_bin(args: &BinArgs, shape: &StackShape) -> Result<(), ArgProblem> {
    let k = args.factor;
    let (h, w) = (shape.height, shape.width);
    let side = h.min(w);
    if usize::try_from(k).map_or(true, |k| k > side) {
        return Err(ArgProblem::new(
            "factor",
            format!("factor {k} is larger than the {h}x{w} plane (no {k}×{k} block fits)"),
            format!("use a factor of at most {side}"),
        ));
    }
    Ok(())
}

fn bin_shape(args: &BinArgs, input: &StackShape) -> Option<StackShape> {
    let k = usize::try_from(args.factor).ok().filter(|&k| k > 0)?;
    Some(StackShape::new(input.depth, input.height / k, input.width / k))
}

hcsflow_core::function_args! {
    /// The arguments of [`BIN`].
    pub struct BinArgs {
        factor: i64 = int(2, Some(1), Some(1024), "bin side k in pixels"),
        mode: String = choice("mean", &["mean", "sum"], "mean or sum of the k×k pixels"),
    }
}

hcsflow_core::function_args! {
    /// The arguments of [`CROP`].
    pub struct CropArgs {
        y: i64 = int(0, Some(0), None, "first row"),
        x: i64 = int(0, Some(0), None, "first column"),
        height: i64 = int(0, Some(0), None, "rows to keep (0: to the bottom edge)"),
        width: i64 = int(0, Some(0), None, "columns to keep (0: to the right edge)"),
    }
}

pub static BIN: FunctionDecl<BinArgs> = FunctionDecl::new(
    "bin",
    Contract::Pure2d,
    "k×k binning per plane (mean or sum of each block, numpy reshape semantics; partial blocks dropped); f32 result.",
)
.with_check(check_bin)
.with_output_shape(bin_shape);

pub static CROP: FunctionDecl<CropArgs> =
    FunctionDecl::new("crop", Contract::Pure2d, "Crops every plane to [y, y+height) × [x, x+width) (numpy slicing); keeps the dtype.")
        .with_check(check_crop)
        .with_output_shape(crop_shape);

pub(crate) fn register(registry: &mut Registry) {
    registry.add(BIN.host(|s, a, _| bin(s, a.factor as usize, a.mode == "mean")));
    registry.add(CROP.host(|s, a, _| {
        let [y, x, height, width] = crop_args(a);
        crop(s, y, x, height, width)
    }));
}
