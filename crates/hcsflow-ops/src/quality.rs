//! Image-quality measures per plane, the kind users screen plates with
//! (CellProfiler's MeasureImageQuality; ours are defined here, not copied
//! from it): intensity statistics, a focus measure, and the fractions of
//! saturated and zero pixels, so out-of-focus fields, saturated wells and
//! edge effects stand out in a plate's table and heatmaps.
//!
//! The registered function `image_quality` returns its input unchanged and
//! produces the table [`QUALITY_TABLE`], one row per plane (the row's plane
//! index is the plane of the step's stack), with the columns of
//! [`QUALITY_COLUMNS`]. The QC report draws its image-quality heatmaps with
//! the same [`quality`].

use hcsflow_core::artifact::{ArtifactDecl, Cell, Table};
use hcsflow_core::{with_pixels, Contract, DType, FunctionDecl, FunctionError, NoArgs, Pixel, Registry, Stack};
use serde::Serialize;

/// Image-quality measures of one plane.
#[derive(Debug, Clone, Copy, PartialEq, Serialize)]
pub struct Quality {
    /// Mean, population standard deviation, minimum and maximum of the values.
    pub mean: f64,
    pub std: f64,
    pub min: f64,
    pub max: f64,
    /// Variance of the 4-neighbour Laplacian (`[1, −2, 1]` along each axis,
    /// scipy's `ndimage.laplace`) of the plane divided by its mean, over the
    /// interior pixels (the border rows and columns left out). Dividing by the
    /// mean keeps a brighter field from looking sharper; blur lowers it. 0 for
    /// a plane smaller than 3×3 or with mean 0.
    pub focus: f64,
    /// Fraction of pixels at the saturation level (the dtype's largest value
    /// for u8/u16 planes; 0 for f32 planes, which have none).
    pub saturated: f64,
    /// Fraction of pixels equal to 0.
    pub zero: f64,
}

/// The quality measures of a `height × width` plane (row-major `values`);
/// `saturation` is the value a saturated pixel holds, if the data has one.
pub fn quality<T: Pixel>(values: &[T], height: usize, width: usize, saturation: Option<T>) -> Quality {
    let n = values.len().max(1) as f64;
    let (mut sum, mut sum2, mut min, mut max, mut saturated, mut zero) = (0.0, 0.0, f64::INFINITY, f64::NEG_INFINITY, 0usize, 0usize);
    for &v in values {
        let v64 = f64::from(v.to_f32());
        sum += v64;
        sum2 += v64 * v64;
        min = min.min(v64);
        max = max.max(v64);
        saturated += usize::from(saturation == Some(v));
        zero += usize::from(v64 == 0.0);
    }
    let mean = sum / n;
    let std = (sum2 / n - mean * mean).max(0.0).sqrt();
    Quality {
        mean,
        std,
        min: if values.is_empty() { 0.0 } else { min },
        max: if values.is_empty() { 0.0 } else { max },
        focus: laplacian_variance(values, height, width, mean),
        saturated: saturated as f64 / n,
        zero: zero as f64 / n,
    }
}

/// The saturation level of integer dtypes: their largest value.
pub fn saturation_level(dtype: DType) -> Option<f32> {
    match dtype {
        DType::U8 => Some(f32::from(u8::MAX)),
        DType::U16 => Some(f32::from(u16::MAX)),
        DType::F32 => None,
    }
}

fn laplacian_variance<T: Pixel>(values: &[T], h: usize, w: usize, mean: f64) -> f64 {
    if h < 3 || w < 3 || mean == 0.0 || values.len() != h * w {
        return 0.0;
    }
    let at = |y: usize, x: usize| f64::from(values[y * w + x].to_f32()) / mean;
    let (mut sum, mut sum2) = (0.0, 0.0);
    for y in 1..h - 1 {
        for x in 1..w - 1 {
            let l = at(y - 1, x) + at(y + 1, x) + at(y, x - 1) + at(y, x + 1) - 4.0 * at(y, x);
            sum += l;
            sum2 += l * l;
        }
    }
    let n = ((h - 2) * (w - 2)) as f64;
    (sum2 / n - (sum / n).powi(2)).max(0.0)
}

/// The artifact `image_quality` produces.
pub const QUALITY_TABLE: &str = "image_quality";

/// The columns of [`QUALITY_TABLE`], in order (percentages in 0–100).
pub const QUALITY_COLUMNS: [&str; 7] = [
    "ImageQuality_MeanIntensity",
    "ImageQuality_StdIntensity",
    "ImageQuality_MinIntensity",
    "ImageQuality_MaxIntensity",
    "ImageQuality_LaplacianVariance",
    "ImageQuality_PercentSaturated",
    "ImageQuality_PercentZero",
];

pub static IMAGE_QUALITY: FunctionDecl<NoArgs> = FunctionDecl::new(
    "image_quality",
    Contract::Pure3d,
    "Image-quality measures per plane (mean, std, min, max, variance of the Laplacian / mean as a focus measure, % saturated at the dtype's maximum, % zero) as the table 'image_quality'; returns its input unchanged.",
)
.with_produces(&[ArtifactDecl::table(
    QUALITY_TABLE,
    "per plane: ImageQuality_MeanIntensity, _StdIntensity, _MinIntensity, _MaxIntensity, _LaplacianVariance (focus), _PercentSaturated, _PercentZero",
)]);

/// The [`QUALITY_TABLE`] of every plane of `stack`.
pub fn quality_table(stack: &Stack) -> Result<Table, FunctionError> {
    let [n, h, w] = stack.shape();
    let mut table = Table::new(QUALITY_COLUMNS);
    with_pixels!(Stack, stack, a, T => {
        let saturation = saturation_level(T::DTYPE).map(T::from_f32_clip);
        for z in 0..n {
            let q = quality(a.plane(z), h, w, saturation);
            let row = [q.mean, q.std, q.min, q.max, q.focus, q.saturated * 100.0, q.zero * 100.0];
            table.push(Some(z), row.into_iter().map(Cell::from).collect()).map_err(|e| FunctionError::failed(IMAGE_QUALITY.name, e))?;
        }
    });
    Ok(table)
}

pub(crate) fn register(registry: &mut Registry) {
    registry.add(IMAGE_QUALITY.host(|s, _, ctx| {
        ctx.produce(QUALITY_TABLE, quality_table(s)?);
        Ok(s.clone())
    }));
}
