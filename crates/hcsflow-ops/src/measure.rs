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
use rayon::prelude::*;

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

/// A label image's pixel type (u16 or u32).
pub trait Label: Copy + Into<u32> + Sync {}
impl Label for u16 {}
impl Label for u32 {}

/// Measures every object of `labels` (`h × w`, row-major; values up to
/// `max_label`, larger values are an error) on `plane`; rows in label order.
///
/// The plane is read once, in parallel bands of rows, as runs of equal nonzero
/// label; the runs are grouped by label (raster order kept) and each object is
/// measured from its own runs, the objects in parallel. An object's pixels are
/// visited in raster order, as a raster scan of the whole plane would, so its
/// sums (and their rounding) do not depend on the other objects or threads;
/// the work is that of the objects' pixels, not of the plane's.
pub fn measure_objects<T: Pixel, L: Label>(
    labels: &[L],
    max_label: u32,
    plane: &[T],
    h: usize,
    w: usize,
) -> Result<Vec<ObjectMeasurements>, FunctionError> {
    const NAME: &str = "measure_objects";
    if labels.len() != h * w || plane.len() != h * w {
        return Err(FunctionError::invalid(NAME, format!("labels and plane must both have {h}×{w} pixels")));
    }
    if h == 0 || w == 0 {
        return Ok(Vec::new());
    }
    let bands: Vec<(Vec<LabelRun>, Option<u32>)> =
        labels.par_chunks(w * RUN_BAND).enumerate().map(|(b, chunk)| label_runs(chunk, w, b * RUN_BAND, max_label)).collect();
    if let Some(l) = bands.iter().find_map(|b| b.1) {
        return Err(FunctionError::invalid(NAME, format!("label {l} is above the count {max_label}")));
    }
    // Counting sort of the runs by label (stable: raster order within a label).
    let n = max_label as usize + 1;
    let mut start = vec![0u32; n + 1];
    for r in bands.iter().flat_map(|b| &b.0) {
        start[r.label as usize + 1] += 1;
    }
    for l in 0..n {
        start[l + 1] += start[l];
    }
    let mut next = start.clone();
    let mut runs = vec![LabelRun { label: 0, y: 0, x0: 0, x1: 0 }; start[n] as usize];
    for r in bands.iter().flat_map(|b| &b.0) {
        let at = &mut next[r.label as usize];
        runs[*at as usize] = *r;
        *at += 1;
    }
    drop(bands);
    let image = Image { labels, plane, h, w };
    Ok((1..n)
        .into_par_iter()
        .filter(|&l| start[l] < start[l + 1])
        .map_init(Scratch::default, |scratch, l| measure_one(&image, l as u32, &runs[start[l] as usize..start[l + 1] as usize], scratch))
        .collect())
}

/// Rows per task of [`measure_objects`]'s pass over the labels.
const RUN_BAND: usize = 16;

/// A run of pixels of one label on a row: `x0..x1` on row `y`.
#[derive(Clone, Copy)]
struct LabelRun {
    label: u32,
    y: u32,
    x0: u32,
    x1: u32,
}

/// The runs of equal nonzero label in `chunk` (whole rows of width `w`, the
/// first being row `y0`), raster order, and the first label above `max_label`.
fn label_runs<L: Label>(chunk: &[L], w: usize, y0: usize, max_label: u32) -> (Vec<LabelRun>, Option<u32>) {
    let mut runs = Vec::new();
    let mut too_large = None;
    for (dy, row) in chunk.chunks_exact(w).enumerate() {
        let y = (y0 + dy) as u32;
        let mut x = 0;
        while x < w {
            // Background: skipped 8 pixels at a time where it can.
            while x + 8 <= w && row[x..x + 8].iter().all(|&l| l.into() == 0) {
                x += 8;
            }
            while x < w && row[x].into() == 0 {
                x += 1;
            }
            if x == w {
                break;
            }
            let (l, x0) = (row[x].into(), x);
            while x < w && row[x].into() == l {
                x += 1;
            }
            if l > max_label {
                too_large.get_or_insert(l);
            }
            runs.push(LabelRun { label: l, y, x0: x0 as u32, x1: x as u32 });
        }
    }
    (runs, too_large)
}

/// A label plane and its intensity plane, `h × w`.
struct Image<'a, T, L> {
    labels: &'a [L],
    plane: &'a [T],
    h: usize,
    w: usize,
}

impl<T, L: Label> Image<'_, T, L> {
    /// The label at `(y, x)`, 0 outside the plane.
    #[inline]
    fn at(&self, y: isize, x: isize) -> u32 {
        if y < 0 || x < 0 || y >= self.h as isize || x >= self.w as isize {
            0
        } else {
            self.labels[y as usize * self.w + x as usize].into()
        }
    }

    /// Whether `(y, x)` is a border pixel of object `l`: one of its pixels
    /// with a 4-neighbour of another value (or outside the plane).
    #[inline]
    fn is_border(&self, y: isize, x: isize, l: u32) -> bool {
        self.at(y, x) == l && (self.at(y - 1, x) != l || self.at(y + 1, x) != l || self.at(y, x - 1) != l || self.at(y, x + 1) != l)
    }
}

/// Work buffers of [`measure_one`], kept from one object to the next.
#[derive(Default)]
struct Scratch {
    /// Each row's leftmost and rightmost column within the bounding box.
    rows: Vec<(u32, u32)>,
    /// Over the bounding box with a one-pixel frame: 1 where a pixel is a
    /// border pixel of the object ([`Image::is_border`]), 0 elsewhere.
    border: Vec<u8>,
}

/// The measurements of object `l` from its runs (raster order, at least one).
fn measure_one<T: Pixel, L: Label>(image: &Image<'_, T, L>, l: u32, runs: &[LabelRun], scratch: &mut Scratch) -> ObjectMeasurements {
    let (mut area, mut sy, mut sx, mut sum, mut perimeter) = (0u64, 0f64, 0f64, 0f64, 0f64);
    let (mut min, mut max) = (f64::INFINITY, f64::NEG_INFINITY);
    let mut bbox = [usize::MAX, usize::MAX, 0, 0];
    for r in runs {
        let y = r.y as usize;
        bbox = [bbox[0].min(y), bbox[1].min(r.x0 as usize), bbox[2].max(y + 1), bbox[3].max(r.x1 as usize)];
    }
    // Border pixels first (each tested once), then each one's weight from its
    // 8 neighbours' flags: the pixels are visited in raster order either way,
    // so the perimeter's sum is rounded as a raster scan rounds it.
    let gw = bbox[3] - bbox[1] + 2;
    let border = &mut scratch.border;
    border.clear();
    border.resize(gw * (bbox[2] - bbox[0] + 2), 0);
    let at = |y: usize, x: usize| (y - bbox[0] + 1) * gw + x - bbox[1] + 1;
    for r in runs {
        let y = r.y as usize;
        for x in r.x0 as usize..r.x1 as usize {
            border[at(y, x)] = u8::from(image.is_border(y as isize, x as isize, l));
        }
    }
    for r in runs {
        let y = r.y as usize;
        for x in r.x0 as usize..r.x1 as usize {
            area += 1;
            sy += y as f64;
            sx += x as f64;
            let v = f64::from(image.plane[y * image.w + x].to_f32());
            sum += v;
            min = min.min(v);
            max = max.max(v);
            let i = at(y, x);
            if border[i] == 1 {
                let edges = border[i - gw] + border[i + gw] + border[i - 1] + border[i + 1];
                let corners = border[i - gw - 1] + border[i - gw + 1] + border[i + gw - 1] + border[i + gw + 1];
                perimeter += perimeter_weight(1 + 2 * usize::from(edges) + 10 * usize::from(corners));
            }
        }
    }
    // Central second moments (about the centroid) and each row's leftmost and
    // rightmost column within the bounding box (EMPTY_ROW where it has none).
    let c = area as f64;
    let mut m = [0f64; 3];
    let rows = &mut scratch.rows;
    rows.clear();
    rows.resize(bbox[2] - bbox[0], EMPTY_ROW);
    for r in runs {
        let y = r.y as usize;
        for x in r.x0 as usize..r.x1 as usize {
            let (dy, dx) = (y as f64 - sy / c, x as f64 - sx / c);
            m[0] += dy * dy;
            m[1] += dy * dx;
            m[2] += dx * dx;
        }
        let e = &mut rows[y - bbox[0]];
        *e = (e.0.min(r.x0 - bbox[1] as u32), e.1.max(r.x1 - 1 - bbox[1] as u32));
    }
    // inertia tensor [[mu_xx, -mu_xy], [-mu_xy, mu_yy]] / area (skimage's layout)
    let (p, q, r) = (m[2] / c, -m[1] / c, m[0] / c);
    let mid = (p + r) / 2.0;
    let rad = (((p - r) / 2.0).powi(2) + q * q).sqrt();
    let (l1, l2) = ((mid + rad).max(0.0), (mid - rad).max(0.0));
    let eccentricity = if l1 == 0.0 { 0.0 } else { (1.0 - l2 / l1).sqrt() };
    let convex_area = convex_area(rows);
    ObjectMeasurements {
        label: l,
        area,
        center_y: sy / c,
        center_x: sx / c,
        bbox,
        perimeter,
        eccentricity,
        major_axis_length: 4.0 * l1.sqrt(),
        minor_axis_length: 4.0 * l2.sqrt(),
        convex_area,
        solidity: area as f64 / convex_area as f64,
        mean_intensity: sum / c,
        integrated_intensity: sum,
        min_intensity: min,
        max_intensity: max,
    }
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
