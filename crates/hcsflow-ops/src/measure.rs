//! Per-object measurements of a label image and an intensity plane, named as
//! CellProfiler's MeasureObjectSizeShape / MeasureObjectIntensity columns.
//!
//! Each value is skimage 0.26 `regionprops(labels, intensity_image)`'s
//! counterpart, computed in f64:
//! - `AreaShape_Area`: `area` (pixel count);
//! - `AreaShape_Center_X` / `_Y`: `centroid` (column / row, pixels);
//! - `AreaShape_BoundingBoxMinimum_X/_Y`, `AreaShape_BoundingBoxMaximum_X/_Y`:
//!   `bbox` (minimum inclusive, maximum exclusive, as skimage and CellProfiler);
//! - `AreaShape_Perimeter`: `perimeter` — skimage's `perimeter(image, 4)`: the
//!   object pixels with a 4-neighbour outside the object, each weighted by the
//!   configuration of its border neighbours (1, √2 or (1 + √2)/2);
//! - `AreaShape_Eccentricity`, `AreaShape_MajorAxisLength`,
//!   `AreaShape_MinorAxisLength`: from the eigenvalues λ₁ ≥ λ₂ of the inertia
//!   tensor (central second moments / area): `√(1 − λ₂/λ₁)` (0 when λ₁ = 0),
//!   `4√λ₁`, `4√λ₂`;
//! - `Intensity_MeanIntensity`, `Intensity_IntegratedIntensity` (sum),
//!   `Intensity_MinIntensity`, `Intensity_MaxIntensity`: `intensity_mean`, the
//!   sum, `intensity_min`, `intensity_max` of the input plane over the object.
//!
//! Differences from CellProfiler: intensities are in the plane's own units
//! (CellProfiler divides integer images by their dtype's maximum first, so its
//! values are ours / 255 or / 65535); centres and boxes are 0-based pixel
//! indices as in skimage (CellProfiler's too). Label values with no pixel give
//! no row.

use hcsflow_core::{
    with_pixels, ArgProblem, ArtifactDecl, Cell, Contract, FunctionDecl, FunctionError, NoArgs, Pixel, Registry, Stack, StackShape, Table,
};

/// The measurements of one object.
#[derive(Debug, Clone, PartialEq)]
pub struct ObjectMeasurements {
    pub label: u32,
    pub area: u64,
    pub center_y: f64,
    pub center_x: f64,
    /// Bounding box: min row, min column (inclusive), max row, max column (exclusive).
    pub bbox: [usize; 4],
    pub perimeter: f64,
    pub eccentricity: f64,
    pub major_axis_length: f64,
    pub minor_axis_length: f64,
    pub mean_intensity: f64,
    pub integrated_intensity: f64,
    pub min_intensity: f64,
    pub max_intensity: f64,
}

/// skimage's perimeter weights, indexed by `1 + 2·(border 4-neighbours) + 10·(border corner neighbours)`.
fn perimeter_weight(code: usize) -> f64 {
    match code {
        5 | 7 | 15 | 17 | 25 | 27 => 1.0,
        21 | 33 => std::f64::consts::SQRT_2,
        13 | 23 => (1.0 + std::f64::consts::SQRT_2) / 2.0,
        _ => 0.0,
    }
}

/// Measures every object of `labels` (`h × w`, row-major; values up to
/// `max_label`, larger values are an error) on `plane`; rows in label order.
pub fn measure_objects<T: Pixel>(
    labels: &[u32],
    max_label: u32,
    plane: &[T],
    h: usize,
    w: usize,
) -> Result<Vec<ObjectMeasurements>, FunctionError> {
    const NAME: &str = "measure_objects";
    if labels.len() != h * w || plane.len() != h * w {
        return Err(FunctionError::invalid(NAME, format!("labels and plane must both have {h}×{w} pixels")));
    }
    if let Some(&l) = labels.iter().find(|&&l| l > max_label) {
        return Err(FunctionError::invalid(NAME, format!("label {l} is above the count {max_label}")));
    }
    let n = max_label as usize + 1;
    #[derive(Clone)]
    struct Acc {
        area: u64,
        sy: f64,
        sx: f64,
        bbox: [usize; 4],
        sum: f64,
        min: f64,
        max: f64,
        perimeter: f64,
        m: [f64; 3],
    }
    let mut acc = vec![
        Acc {
            area: 0,
            sy: 0.0,
            sx: 0.0,
            bbox: [usize::MAX, usize::MAX, 0, 0],
            sum: 0.0,
            min: f64::INFINITY,
            max: f64::NEG_INFINITY,
            perimeter: 0.0,
            m: [0.0; 3]
        };
        n
    ];
    let at = |y: isize, x: isize| -> u32 {
        if y < 0 || x < 0 || y >= h as isize || x >= w as isize {
            0
        } else {
            labels[y as usize * w + x as usize]
        }
    };
    // Border pixels: object pixels with a 4-neighbour of another value (or outside).
    let border: Vec<bool> = (0..h * w)
        .map(|i| {
            let l = labels[i];
            let (y, x) = ((i / w) as isize, (i % w) as isize);
            l != 0 && (at(y - 1, x) != l || at(y + 1, x) != l || at(y, x - 1) != l || at(y, x + 1) != l)
        })
        .collect();
    let is_border = |y: isize, x: isize, l: u32| at(y, x) == l && border[y as usize * w + x as usize];
    for (i, &l) in labels.iter().enumerate() {
        if l == 0 {
            continue;
        }
        let (y, x) = (i / w, i % w);
        let a = &mut acc[l as usize];
        a.area += 1;
        a.sy += y as f64;
        a.sx += x as f64;
        a.bbox = [a.bbox[0].min(y), a.bbox[1].min(x), a.bbox[2].max(y + 1), a.bbox[3].max(x + 1)];
        let v = f64::from(plane[i].to_f32());
        a.sum += v;
        a.min = a.min.min(v);
        a.max = a.max.max(v);
        if border[i] {
            let (yi, xi) = (y as isize, x as isize);
            let edges = [(-1, 0), (1, 0), (0, -1), (0, 1)].iter().filter(|(dy, dx)| is_border(yi + dy, xi + dx, l)).count();
            let corners = [(-1, -1), (-1, 1), (1, -1), (1, 1)].iter().filter(|(dy, dx)| is_border(yi + dy, xi + dx, l)).count();
            a.perimeter += perimeter_weight(1 + 2 * edges + 10 * corners);
        }
    }
    // Central second moments (second pass, about the centroid).
    for (i, &l) in labels.iter().enumerate() {
        if l == 0 {
            continue;
        }
        let a = &mut acc[l as usize];
        let c = a.area as f64;
        let (dy, dx) = ((i / w) as f64 - a.sy / c, (i % w) as f64 - a.sx / c);
        a.m[0] += dy * dy;
        a.m[1] += dy * dx;
        a.m[2] += dx * dx;
    }
    Ok(acc
        .iter()
        .enumerate()
        .skip(1)
        .filter(|(_, a)| a.area > 0)
        .map(|(l, a)| {
            let c = a.area as f64;
            // inertia tensor [[mu_xx, -mu_xy], [-mu_xy, mu_yy]] / area (skimage's layout)
            let (p, q, r) = (a.m[2] / c, -a.m[1] / c, a.m[0] / c);
            let mid = (p + r) / 2.0;
            let rad = (((p - r) / 2.0).powi(2) + q * q).sqrt();
            let (l1, l2) = ((mid + rad).max(0.0), (mid - rad).max(0.0));
            let eccentricity = if l1 == 0.0 { 0.0 } else { (1.0 - l2 / l1).sqrt() };
            ObjectMeasurements {
                label: l as u32,
                area: a.area,
                center_y: a.sy / c,
                center_x: a.sx / c,
                bbox: a.bbox,
                perimeter: a.perimeter,
                eccentricity,
                major_axis_length: 4.0 * l1.sqrt(),
                minor_axis_length: 4.0 * l2.sqrt(),
                mean_intensity: a.sum / c,
                integrated_intensity: a.sum,
                min_intensity: a.min,
                max_intensity: a.max,
            }
        })
        .collect())
}

/// The column names of [`objects_table`] (after the plane column the table adds).
pub const OBJECT_COLUMNS: [&str; 16] = [
    "ObjectNumber",
    "AreaShape_Area",
    "AreaShape_Center_X",
    "AreaShape_Center_Y",
    "AreaShape_BoundingBoxMinimum_X",
    "AreaShape_BoundingBoxMinimum_Y",
    "AreaShape_BoundingBoxMaximum_X",
    "AreaShape_BoundingBoxMaximum_Y",
    "AreaShape_Perimeter",
    "AreaShape_Eccentricity",
    "AreaShape_MajorAxisLength",
    "AreaShape_MinorAxisLength",
    "Intensity_MeanIntensity",
    "Intensity_IntegratedIntensity",
    "Intensity_MinIntensity",
    "Intensity_MaxIntensity",
];

/// The measurements of each plane as one artifact table (rows tagged with their plane).
pub fn objects_table(planes: &[(usize, Vec<ObjectMeasurements>)], function: &str) -> Result<Table, FunctionError> {
    let mut t = Table::new(OBJECT_COLUMNS);
    for (z, rows) in planes {
        for m in rows {
            t.push(
                Some(*z),
                vec![
                    Cell::from(m.label),
                    Cell::Int(m.area as i64),
                    Cell::from(m.center_x),
                    Cell::from(m.center_y),
                    Cell::from(m.bbox[1]),
                    Cell::from(m.bbox[0]),
                    Cell::from(m.bbox[3]),
                    Cell::from(m.bbox[2]),
                    Cell::from(m.perimeter),
                    Cell::from(m.eccentricity),
                    Cell::from(m.major_axis_length),
                    Cell::from(m.minor_axis_length),
                    Cell::from(m.mean_intensity),
                    Cell::from(m.integrated_intensity),
                    Cell::from(m.min_intensity),
                    Cell::from(m.max_intensity),
                ],
            )
            .map_err(|e| FunctionError::failed(function, e))?;
        }
    }
    Ok(t)
}

/// The artifact [`MEASURE_OBJECTS`] produces.
pub const MEASURE_TABLE: &str = "objects";

pub static MEASURE_OBJECTS: FunctionDecl<NoArgs> = FunctionDecl::new(
    "measure_objects",
    Contract::Pure3d,
    "Per-object measurements (skimage regionprops counterparts, CellProfiler names) of a label image (plane 0) on the intensity planes after it (1..): one objects table, rows tagged by intensity plane; returns its input unchanged.",
)
.with_produces(&[ArtifactDecl::table(
    MEASURE_TABLE,
    "per object and intensity plane: ObjectNumber, AreaShape_* (area, centre, bounding box, perimeter, eccentricity, axes) and Intensity_* (mean, integrated, min, max)",
)])
.with_check(check_measure);

fn check_measure(_: &NoArgs, shape: &StackShape) -> Result<(), ArgProblem> {
    if shape.depth < 2 {
        return Err(ArgProblem::input(
            format!("needs a label image and at least one intensity plane, but the stack has {} plane", shape.depth),
            "make the step's stacks hold the labels first, then the channels to measure, e.g. variable_components = [\"channel\"] and group_by = \"none\"",
        ));
    }
    Ok(())
}

/// Runs [`measure_objects`] with plane 0 of `stack` as the labels (integer
/// values; f32 truncated, negative = 0) on each later plane; the table's rows
/// carry the intensity plane's index (1..). Errors: fewer than 2 planes.
pub fn measure_objects_stack(stack: &Stack) -> Result<Table, FunctionError> {
    const NAME: &str = "measure_objects";
    let [n, h, w] = stack.shape();
    if n < 2 {
        return Err(FunctionError::invalid(NAME, format!("needs a label plane and an intensity plane, got {n} plane(s)")));
    }
    let rows = with_pixels!(Stack, stack, a, T => {
        let labels: Vec<u32> = a.plane(0).iter().map(|v| v.to_f32().max(0.0) as u32).collect();
        let max = labels.iter().copied().max().unwrap_or(0);
        (1..n).map(|z| Ok((z, measure_objects(&labels, max, a.plane(z), h, w)?))).collect::<Result<Vec<_>, FunctionError>>()?
    });
    objects_table(&rows, NAME)
}

pub(crate) fn register(registry: &mut Registry) {
    registry.add(MEASURE_OBJECTS.host(|s, _, ctx| {
        ctx.produce(MEASURE_TABLE, measure_objects_stack(s)?);
        Ok(s.clone())
    }));
}
