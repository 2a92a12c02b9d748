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
//! - `AreaShape_ConvexArea`: `area_convex` — the pixels of skimage's
//!   `convex_hull_image(image)`: the centres inside or on the convex hull of the
//!   midpoints of the object pixels' edges (each pixel `(y, x)` gives
//!   `(y ± ½, x)` and `(y, x ± ½)`), counted exactly, row by row, from the hull's two chains;
//! - `AreaShape_Solidity`: `solidity` = area / convex area (≤ 1; 1 for a
//!   convex object). Neither is ever degenerate: a single pixel's hull is its
//!   own diamond (convex area 1, solidity 1), a one-pixel-wide line's a thin
//!   hexagon (its own pixels); skimage agrees (its qhull call cannot fail on
//!   these offset points in 2-D, and an object of no pixel gives no row here);
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
    /// Pixels inside the convex hull (skimage's `area_convex`).
    pub convex_area: u64,
    /// `area / convex_area`.
    pub solidity: f64,
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
    // Each object's rows within its bounding box, one after the other: the
    // leftmost and rightmost column of each row (EMPTY_ROW where it has none).
    let mut row_start = vec![0usize; n + 1];
    for (l, a) in acc.iter().enumerate() {
        row_start[l + 1] = row_start[l] + if a.area > 0 { a.bbox[2] - a.bbox[0] } else { 0 };
    }
    let mut rows = vec![EMPTY_ROW; row_start[n]];
    // Second pass: central second moments (about the centroid) and the row extents.
    for (i, &l) in labels.iter().enumerate() {
        if l == 0 {
            continue;
        }
        let a = &mut acc[l as usize];
        let (y, x) = (i / w, i % w);
        let c = a.area as f64;
        let (dy, dx) = (y as f64 - a.sy / c, x as f64 - a.sx / c);
        a.m[0] += dy * dy;
        a.m[1] += dy * dx;
        a.m[2] += dx * dx;
        let r = &mut rows[row_start[l as usize] + y - a.bbox[0]];
        let x = (x - a.bbox[1]) as u32;
        *r = (r.0.min(x), r.1.max(x));
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
            let convex_area = convex_area(&rows[row_start[l]..row_start[l + 1]]);
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
                convex_area,
                solidity: a.area as f64 / convex_area as f64,
                mean_intensity: a.sum / c,
                integrated_intensity: a.sum,
                min_intensity: a.min,
                max_intensity: a.max,
            }
        })
        .collect())
}

/// A row of an object's bounding box that holds none of its pixels.
const EMPTY_ROW: (u32, u32) = (u32::MAX, 0);

/// skimage's `convex_hull_image(image).sum()` in 2-D, exactly: the number of
/// pixel centres inside or on the convex hull of the midpoints of the object
/// pixels' edges. `rows[r]` is the leftmost and rightmost column of the
/// object's pixels in row `r` ([`EMPTY_ROW`] if none; the first and last row
/// hold pixels), so every row spans `rows[r].0 ..= rows[r].1` for the hull.
///
/// In doubled coordinates every edge midpoint is an integer point: the hull's
/// points at height `Y` are, for the even `Y = 2r`, `2·left − 1` and
/// `2·right + 1` of row `r`, and for the odd `Y = 2r ± 1` the `2·left`,
/// `2·right` of the rows above and below; only the extremes of each height
/// can be hull vertices. Its left and right chains (a monotone-chain scan over
/// increasing `Y`) give each row's boundary abscissae as exact fractions, so
/// the columns of the row inside the hull are `⌈x_left⌉ ..= ⌊x_right⌋` with no
/// rounding. skimage tests each centre with O'Rourke's point-in-polygon on
/// qhull's vertices, counting those on an edge or a vertex as inside: on these
/// half-integer coordinates its arithmetic is exact, so the two agree (the
/// oracle test checks it on about 2,000 objects, 900 of them not convex).
fn convex_area(rows: &[(u32, u32)]) -> u64 {
    let n = rows.len();
    let Some(&last) = rows.last() else { return 0 };
    if rows[0] == EMPTY_ROW || last == EMPTY_ROW {
        return 0;
    }
    // The hull's leftmost and rightmost point at each height Y = -1 ..= 2n - 1 (doubled).
    let level = |y: i64| -> Option<(i64, i64)> {
        let row = |r: i64| {
            usize::try_from(r).ok().and_then(|r| rows.get(r)).filter(|&&v| v != EMPTY_ROW).map(|&(a, b)| (i64::from(a), i64::from(b)))
        };
        if y % 2 == 0 {
            row(y / 2).map(|(a, b)| (2 * a - 1, 2 * b + 1))
        } else {
            match (row((y - 1).div_euclid(2)), row((y + 1) / 2)) {
                (Some((a, b)), Some((c, d))) => Some((2 * a.min(c), 2 * b.max(d))),
                (Some((a, b)), None) | (None, Some((a, b))) => Some((2 * a, 2 * b)),
                (None, None) => None,
            }
        }
    };
    // (Y, x) points; cross > 0 is a counter-clockwise turn with Y as the abscissa.
    let cross = |o: (i64, i64), a: (i64, i64), b: (i64, i64)| (a.0 - o.0) * (b.1 - o.1) - (a.1 - o.1) * (b.0 - o.0);
    let mut left: Vec<(i64, i64)> = Vec::with_capacity(2 * n + 1);
    let mut right: Vec<(i64, i64)> = Vec::with_capacity(2 * n + 1);
    for y in -1..2 * n as i64 {
        let Some((l, r)) = level(y) else { continue };
        // The left boundary is convex in Y (a lower chain), the right one concave (an upper chain).
        while left.len() >= 2 && cross(left[left.len() - 2], left[left.len() - 1], (y, l)) <= 0 {
            left.pop();
        }
        left.push((y, l));
        while right.len() >= 2 && cross(right[right.len() - 2], right[right.len() - 1], (y, r)) >= 0 {
            right.pop();
        }
        right.push((y, r));
    }
    // Each chain's abscissa at the even height y as a fraction num / den (den > 0).
    let at = |chain: &[(i64, i64)], k: &mut usize, y: i64| -> (i64, i64) {
        while chain[*k + 1].0 < y {
            *k += 1;
        }
        let ((y0, x0), (y1, x1)) = (chain[*k], chain[*k + 1]);
        (x0 * (y1 - y0) + (x1 - x0) * (y - y0), y1 - y0)
    };
    let (mut kl, mut kr) = (0, 0);
    let mut count = 0u64;
    for r in 0..n as i64 {
        // Columns c with 2c inside [x_left, x_right] (doubled): ⌈x_left / 2⌉ ..= ⌊x_right / 2⌋.
        let (nl, dl) = at(&left, &mut kl, 2 * r);
        let (nr, dr) = at(&right, &mut kr, 2 * r);
        let lo = -(-nl).div_euclid(2 * dl);
        let hi = nr.div_euclid(2 * dr);
        count += u64::try_from(hi - lo + 1).unwrap_or(0);
    }
    count
}

/// The column names of [`objects_table`] (after the plane column the table adds).
pub const OBJECT_COLUMNS: [&str; 18] = [
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
    "AreaShape_ConvexArea",
    "AreaShape_Solidity",
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
                    Cell::Int(m.convex_area as i64),
                    Cell::from(m.solidity),
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
    "per object and intensity plane: ObjectNumber, AreaShape_* (area, centre, bounding box, perimeter, eccentricity, axes, convex area, solidity) and Intensity_* (mean, integrated, min, max)",
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
