//! Segmentation that separates touching nuclei: exact Euclidean distance
//! transform, seeded watershed, hole filling, border-object removal, size
//! filter, and the one-call [`segment_nuclei`] built from them (CellProfiler's
//! IdentifyPrimaryObjects with "shape" declumping).
//!
//! # Distance transform ([`distance_transform_edt`])
//! scipy.ndimage `distance_transform_edt(mask, sampling)`: for every foreground
//! pixel the Euclidean distance to the nearest background pixel, 0 on the
//! background. Exact (Felzenszwalb–Huttenlocher lower envelope of parabolas, one
//! pass per axis, squared distances in f64), returned as f32. Differs from scipy
//! only on a plane with no background at all: scipy returns distances to a
//! point outside the image that depend on its internals, we return `+∞`.
//!
//! # Watershed ([`watershed`])
//! skimage.segmentation `watershed(image, markers, connectivity, mask)` with
//! `compactness=0`, `watershed_line=False`: a priority flood from the marker
//! pixels, each pixel labelled when first pushed, the queue ordered by (cost,
//! push age), a pixel's cost being the larger of its value and the cost of the
//! pixel it was reached from; neighbours visited in skimage's order (edge
//! neighbours N, W, E, S, then corners NW, NE, SW, SE). Values are compared in
//! f64 as skimage does (our input is f32, so where skimage is given a float64
//! image that is not representable in f32 the orders can differ). Mask pixels
//! not connected to any marker stay 0. Only pixels inside the mask are read:
//! the cost of a flood is that of the mask, not of the plane.
//!
//! The one place we differ: all marker pixels have age 0, and skimage leaves
//! the order of markers of *equal value* to the positions they happen to have
//! in its binary heap; we take them in raster order. With markers of distinct
//! values the labels are identical to skimage's (tested); with equal values
//! they can differ where the two floods meet at equal cost (on the
//! 2048² benchmark image 24 of 327,133 flooded pixels, one pair of nuclei). In
//! exchange the queue can be a radix heap with first-in-first-out buckets
//! (pushes never go below the last cost popped), which needs no comparisons
//! between equal costs: a few times faster than a binary heap on large floods.
//!
//! # Hole filling, border clearing, size filter
//! - [`fill_holes`]: scipy `binary_fill_holes(mask)` (default structure: a hole
//!   is a background component, 4-connected, not touching the image border).
//! - [`clear_border`]: skimage `clear_border(labels)` (buffer 0) by label
//!   value. skimage relabels equal-valued 8-connected regions first, so for a
//!   label split into several pieces it removes only the pieces touching the
//!   border; we remove the whole label. Identical for connected objects.
//! - [`filter_size`]: keeps objects with `min_area ≤ area ≤ max_area` and
//!   relabels them 1.. in label order (skimage `remove_small_objects(labels,
//!   max_size=min_area − 1)` keeps the same objects but does not relabel).

use hcsflow_core::{
    with_pixels, ArgProblem, ArtifactDecl, Contract, DType, FunctionDecl, FunctionError, NoArgs, Pixel, Registry, Stack, StackArray,
    StackShape,
};
use rayon::prelude::*;

use crate::convolve::{correlate_separable, correlate_separable_into, Boundary, Kernel1d};
use crate::label::{find, label_mask, union, Connectivity, Labels};
use crate::measure::{measure_objects, objects_table};
use crate::threshold::{threshold_value, ThresholdMethod};

/// Exact Euclidean distance transform of `mask` (`h × w`, row-major, `true` =
/// foreground) with pixel spacing `sampling = (dy, dx)`: the distance from each
/// foreground pixel to the nearest background pixel, 0 on the background,
/// `+∞` when the plane has no background. See the module docs.
pub fn distance_transform_edt(mask: &[bool], h: usize, w: usize, sampling: (f64, f64)) -> Vec<f32> {
    let mut out = vec![0f32; h * w];
    if h == 0 || w == 0 {
        return out;
    }
    // Pass 1, along Y: distance in rows to the nearest background pixel of
    // the column, per strip of columns (in parallel), stored strip by strip.
    let strips: Vec<Vec<u32>> = (0..w.div_ceil(EDT_STRIP)).into_par_iter().map(|s| column_distances(mask, h, w, s * EDT_STRIP)).collect();
    // Pass 2, along X: lower envelope of the parabolas sx²(x − q)² + g(q) of
    // each row, g(q) = sy²·(column distance)², written as the square root.
    let (sy2, sx2) = (sampling.0 * sampling.0, sampling.1 * sampling.1);
    out.par_chunks_mut(w).enumerate().for_each_init(
        || (vec![0usize; w], vec![0f64; w + 1], vec![0f64; w], vec![0f64; w]),
        |(v, z, f, a), (y, row)| {
            let g = |x: usize| {
                let sw = EDT_STRIP.min(w - x / EDT_STRIP * EDT_STRIP);
                let d = strips[x / EDT_STRIP][y * sw + x % EDT_STRIP];
                if d == u32::MAX {
                    f64::INFINITY
                } else {
                    (d as f64) * (d as f64) * sy2
                }
            };
            // A background pixel (g = 0) is 0, and no parabola beyond one
            // reaches past it (it is lower there, by at least half a pixel in
            // where envelopes cross), so each run of foreground pixels with the
            // background pixels bounding it is an envelope of its own: the
            // same parabolas, crossings and values as over the whole row. The
            // background stays as `out` starts, 0.
            let mut run = |x0: usize, x1: usize| {
                let (lo, hi) = (x0.saturating_sub(1), x1.min(w - 1));
                for (q, f) in f.iter_mut().enumerate().take(hi + 1).skip(lo) {
                    *f = g(q);
                }
                lower_envelope_sqrt(&f[..=hi], lo, sx2, v, z, a, row);
            };
            if sy2 > 0.0 {
                // g(q) ≥ sy² > 0 on the foreground: its runs are the mask's.
                let mut x = 0;
                while let Some((x0, x1)) = next_run(&mask[y * w..(y + 1) * w], &mut x, |m| m) {
                    run(x0, x1);
                }
            } else {
                // sy = 0 (or NaN): the runs of nonzero g.
                let mut x = 0;
                while x < w {
                    if g(x) == 0.0 {
                        x += 1;
                        continue;
                    }
                    let start = x;
                    while x < w && g(x) != 0.0 {
                        x += 1;
                    }
                    run(start, x);
                }
            }
        },
    );
    out
}

/// Columns per strip of the distance transform's first pass.
const EDT_STRIP: usize = 128;

/// Pass 1 of [`distance_transform_edt`] on the columns `x0..x0 + 128` (fewer
/// at the right edge): for each pixel the distance in rows to the nearest
/// background pixel of its column (`u32::MAX`: none), `h × strip width`,
/// row-major. Forward then backward scan, whole strip rows at a time.
fn column_distances(mask: &[bool], h: usize, w: usize, x0: usize) -> Vec<u32> {
    let sw = EDT_STRIP.min(w - x0);
    let mut up = vec![0u32; h * sw];
    for (o, &m) in up[..sw].iter_mut().zip(&mask[x0..x0 + sw]) {
        *o = if m { u32::MAX } else { 0 };
    }
    for y in 1..h {
        let (done, rest) = up.split_at_mut(y * sw);
        let prev = &done[(y - 1) * sw..];
        for ((o, &p), &m) in rest[..sw].iter_mut().zip(prev).zip(&mask[y * w + x0..y * w + x0 + sw]) {
            *o = if m { p.saturating_add(1) } else { 0 };
        }
    }
    for y in (0..h - 1).rev() {
        let (head, below) = up.split_at_mut((y + 1) * sw);
        for (o, &b) in head[y * sw..].iter_mut().zip(&below[..sw]) {
            *o = (*o).min(b.saturating_add(1));
        }
    }
    up
}

/// Pass 2 of [`distance_transform_edt`] on pixels `lo..f.len()` of a row:
/// `row[x] = √min_q(sx2·(x − q)² + f[q])` over `q` in the same range
/// (Felzenszwalb–Huttenlocher; `+∞` when every `f` there is infinite),
/// indices absolute. `v`, `z`, `a`: work buffers of at least `f.len()`,
/// `f.len() + 1`, `f.len()`.
fn lower_envelope_sqrt(f: &[f64], lo: usize, sx2: f64, v: &mut [usize], z: &mut [f64], a: &mut [f64], row: &mut [f32]) {
    let w = f.len();
    for q in lo..w {
        a[q] = f[q] + sx2 * (q * q) as f64;
    }
    let mut k: isize = -1;
    for q in lo..w {
        if f[q].is_infinite() {
            continue;
        }
        loop {
            if k < 0 {
                k = 0;
                v[0] = q;
                z[0] = f64::NEG_INFINITY;
                z[1] = f64::INFINITY;
                break;
            }
            let p = v[k as usize];
            let s = (a[q] - a[p]) / (2.0 * sx2 * (q - p) as f64);
            if s <= z[k as usize] {
                k -= 1;
                continue;
            }
            k += 1;
            v[k as usize] = q;
            z[k as usize] = s;
            z[k as usize + 1] = f64::INFINITY;
            break;
        }
    }
    if k < 0 {
        row[lo..w].fill(f32::INFINITY);
        return;
    }
    let mut j = 0usize;
    for (x, o) in row.iter_mut().enumerate().take(w).skip(lo) {
        while z[j + 1] < x as f64 {
            j += 1;
        }
        let d = x as f64 - v[j] as f64;
        *o = (sx2 * d * d + f[v[j]]).sqrt() as f32;
    }
}

/// An f32 as a u32 of the same order (−0 and +0 equal, as they compare in f64).
#[inline]
fn ordered_bits(v: f32) -> u32 {
    let b = (v + 0.0).to_bits();
    // Negative: all bits flipped; otherwise the sign bit set (no branch, so
    // the loops that call it vectorise).
    b ^ (((b as i32) >> 31) as u32 | 0x8000_0000)
}

/// Seeded watershed of `image` (`h × w`, row-major) from `markers` (0 = no
/// marker), flooding only where `mask` is true (everywhere when `None`);
/// skimage `watershed(image, markers, connectivity, mask=mask)` — see the module
/// docs. Markers outside the mask are dropped (as skimage does). Errors: sizes
/// that do not match, NaN in the image where the flood may go (inside the mask;
/// a value outside it is never read), a marker label of `u32::MAX`.
pub fn watershed(
    image: &[f32],
    markers: &[u32],
    mask: Option<&[bool]>,
    h: usize,
    w: usize,
    connectivity: Connectivity,
) -> Result<Vec<u32>, FunctionError> {
    const NAME: &str = "watershed";
    let n = h * w;
    if image.len() != n || markers.len() != n || mask.is_some_and(|m| m.len() != n) {
        return Err(FunctionError::invalid(NAME, format!("image, markers and mask must all have {h}×{w} pixels")));
    }
    let too_large = |l: u32| FunctionError::invalid(NAME, format!("marker label {l} is too large (at most {})", UNREACHED - 1));
    Ok(flood(h, w, connectivity, &WatershedPlanes { w, image, markers, mask }, (UNREACHED - 1, too_large))?.labels(h, |l| l))
}

/// [`watershed`]'s planes as the flood reads them.
struct WatershedPlanes<'a> {
    w: usize,
    image: &'a [f32],
    markers: &'a [u32],
    mask: Option<&'a [bool]>,
}

impl FloodPlane for WatershedPlanes<'_> {
    fn inside_runs(&self, y: usize, runs: &mut Vec<(usize, usize)>) {
        match self.mask {
            Some(m) => runs_where(&m[y * self.w..(y + 1) * self.w], |m| m, runs),
            None => runs.push((0, self.w)),
        }
    }

    fn values_run(&self, y: usize, x0: usize, out: &mut [f32]) {
        let at = y * self.w + x0;
        out.copy_from_slice(&self.image[at..at + out.len()]);
    }

    fn markers_run(&self, y: usize, x0: usize, out: &mut [u32]) {
        let at = y * self.w + x0;
        out.copy_from_slice(&self.markers[at..at + out.len()]);
    }

    fn marker_span(&self, y: usize, x0: usize, x1: usize) -> Option<(u32, u32)> {
        let row = &self.markers[y * self.w + x0..y * self.w + x1];
        // 0 wraps to the largest u32, so one minimum skips it.
        let lo = row.iter().fold(u32::MAX, |a, &l| a.min(l.wrapping_sub(1))).wrapping_add(1);
        let hi = row.iter().fold(0, |a, &l| a.max(l));
        (hi != 0).then_some((lo, hi))
    }

    fn nan_in(&self, y: usize, x0: usize, x1: usize) -> bool {
        self.image[y * self.w + x0..y * self.w + x1].iter().fold(false, |a, v| a | v.is_nan())
    }

    fn touch_markers(&self, y: usize, runs: &[(usize, usize)]) {
        touch_runs(&self.markers[y * self.w..(y + 1) * self.w], runs, |l| l);
    }
}

/// What [`flood`] reads of a plane of `w` columns, row by row and run by run.
/// The value and marker of a pixel outside the mask are never asked for.
trait FloodPlane: Sync {
    /// Pushes the runs `x0..x1` of row `y`'s pixels the flood may enter (the
    /// mask) onto `runs`, in x order and not touching.
    fn inside_runs(&self, y: usize, runs: &mut Vec<(usize, usize)>);
    /// Sets `out[k]` to the value of pixel `(y, x0 + k)`.
    fn values_run(&self, y: usize, x0: usize, out: &mut [f32]);
    /// Sets `out[k]` to the marker label of pixel `(y, x0 + k)` (0 = none).
    fn markers_run(&self, y: usize, x0: usize, out: &mut [u32]);
    /// The smallest and the largest nonzero marker label of pixels `x0..x1`
    /// of row `y` (`None`: none), as [`FloodPlane::markers_run`] would give
    /// them, without writing them.
    fn marker_span(&self, y: usize, x0: usize, x1: usize) -> Option<(u32, u32)>;
    /// Whether the value of a pixel `x0..x1` of row `y` is NaN.
    fn nan_in(&self, y: usize, x0: usize, x1: usize) -> bool;
    /// A hint before [`FloodPlane::marker_span`] is asked of each of row
    /// `y`'s `runs`: load a pixel of each, so that their cache lines come in
    /// together rather than one run after another.
    fn touch_markers(&self, _y: usize, _runs: &[(usize, usize)]) {}
}

/// Loads the first and last element of each run `x0..x1` of `row`, one after
/// another with nothing depending on them (see [`FloodPlane::touch_markers`]).
fn touch_runs<T: Copy>(row: &[T], runs: &[(usize, usize)], bits: impl Fn(T) -> u32) {
    let any = runs.iter().fold(0u32, |a, &(x0, x1)| a ^ bits(row[x0]) ^ bits(row[x1 - 1]));
    std::hint::black_box(any);
}

/// The flood's priority queue: a radix heap (Ahuja, Mehlhorn, Orlin, Tarjan
/// 1990) on 32-bit costs, first in first out among equal costs. The flood only
/// pushes costs at least the last one popped (a pixel costs at least as much as
/// the one it is reached from), which is what a radix heap needs; in exchange a
/// push is O(1) and a pop amortised O(1) per bit of the cost, with no
/// comparisons between items of one cost. Equal costs leave in the order they
/// came in, i.e. by push age, which is skimage's (cost, age) order.
struct Queue {
    /// `buckets[0]`: items of cost `last` (read from `head`); `buckets[b]`:
    /// items whose cost first differs from `last` at bit `b − 1`.
    buckets: [Vec<(u32, u32)>; 33],
    /// Bit `b` set: `buckets[b]` may hold items (bit 0 unused), so a pop
    /// finds the lowest non-empty bucket with one instruction, not a scan.
    filled: u64,
    head: usize,
    last: u32,
    len: usize,
}

impl Queue {
    fn new() -> Self {
        Queue { buckets: std::array::from_fn(|_| Vec::new()), filled: 0, head: 0, last: 0, len: 0 }
    }

    /// Empties the queue (keeping its allocations) for a new flood.
    fn reset(&mut self) {
        self.buckets.iter_mut().for_each(Vec::clear);
        self.filled = 0;
        self.head = 0;
        self.last = 0;
        self.len = 0;
    }

    #[inline]
    fn bucket(&self, cost: u32) -> usize {
        (32 - (cost ^ self.last).leading_zeros()) as usize
    }

    /// Queues `index` at `cost`, which must not be below the last cost popped.
    #[inline]
    fn push(&mut self, cost: u32, index: u32) {
        debug_assert!(cost >= self.last);
        let b = self.bucket(cost);
        self.buckets[b].push((cost, index));
        self.filled |= 1 << b;
        self.len += 1;
    }

    /// The oldest item of the lowest cost, as (cost, index).
    fn pop(&mut self) -> Option<(u32, u32)> {
        if self.len == 0 {
            return None;
        }
        if self.head == self.buckets[0].len() {
            self.buckets[0].clear();
            self.head = 0;
            // The lowest non-empty bucket holds the next cost: it becomes
            // `last` and the bucket's items move down, keeping their order
            // (every lower bucket is empty, so order by age is kept).
            let b = (self.filled & !1).trailing_zeros() as usize;
            self.filled &= !(1 << b);
            let items = std::mem::take(self.buckets.get_mut(b)?);
            self.last = items.iter().map(|&(c, _)| c).min()?;
            for &(c, i) in &items {
                let to = self.bucket(c);
                self.buckets[to].push((c, i));
                self.filled |= 1 << to;
            }
            // Keep the allocation for the next time this bucket fills.
            let mut items = items;
            items.clear();
            self.buckets[b] = items;
        }
        let item = self.buckets[0][self.head];
        self.head += 1;
        self.len -= 1;
        Some(item)
    }
}

/// A pixel of a component's flood grid: its cost (the order key of its value,
/// [`ordered_bits`]) in the high half and its label in the low half, so a
/// neighbour's visit reads one place. Label 0 is a pixel the flood may not
/// enter — outside the mask, or the one-pixel frame around the grid — so the
/// grid starts zeroed and only pixels inside the mask are written.
type Cell = u64;
/// The label of a pixel inside the mask that the flood has not reached yet.
const UNREACHED: u32 = u32::MAX;

#[inline]
fn cell(cost: u32, label: u32) -> Cell {
    (u64::from(cost) << 32) | u64::from(label)
}

#[inline]
fn cell_label(c: Cell) -> u32 {
    c as u32
}

#[inline]
fn cell_cost(c: Cell) -> u32 {
    (c >> 32) as u32
}

/// A run of pixels inside the mask on row `y`, `x0..x1`.
#[derive(Clone, Copy)]
struct Run {
    y: u32,
    x0: u32,
    x1: u32,
    /// The marker labels it holds ([`Run::marks_of`]; 0 outside a flood).
    marks: u32,
}

/// [`Run::marks`] of a run holding markers of more than one label.
const MIXED: u32 = u32::MAX;

impl Run {
    /// What a run's `marks` say of labels `lo..=hi` (the smallest and largest
    /// marker label it holds; `None`: none): 0, the one label, or [`MIXED`].
    fn marks_of(span: Option<(u32, u32)>) -> u32 {
        match span {
            None => 0,
            Some((lo, hi)) if lo == hi => lo,
            Some(_) => MIXED,
        }
    }

    /// The `marks` of two runs' pixels together.
    fn join_marks(a: u32, b: u32) -> u32 {
        match (a, b) {
            (0, m) | (m, 0) => m,
            (a, b) if a == b => a,
            _ => MIXED,
        }
    }
}

/// Rows per task of the flood's first pass.
const FLOOD_BAND: usize = 32;

/// The runs of a band of rows, in raster order.
#[derive(Default)]
struct Band {
    runs: Vec<Run>,
    /// The first marker label above the largest allowed, in raster order.
    too_large: Option<u32>,
}

/// The seeded flood behind [`watershed`], [`watershed_stack`] and
/// [`segment_nuclei`], on an `h × w` plane read row by row and run by run
/// ([`FloodPlane`]). The labels of the pixels it reaches (markers included)
/// come back as a [`Flooded`], which counts them ([`Flooded::areas`]) and
/// writes them ([`Flooded::write`]). The value of a pixel outside the mask is
/// never asked for, so it may be anything (NaN too). Errors: a NaN value
/// inside the mask, a marker label above `max_label` (`too_large(label)` says
/// why; the first in raster order), more than 2³² pixels.
///
/// Two floods that cannot touch do not change each other's order: the
/// pixels of one connected component of the mask are pushed and popped in the
/// same relative (cost, age) order whatever happens in the others. So each
/// component is flooded on its own, in a grid the size of its bounding box
/// (which stays in cache, where one grid over the plane made every visit a
/// cache miss), the components in parallel. The mask is read once, as runs of
/// a row; components are unions of runs that touch (union–find on runs). A
/// run's markers are first asked only for the span of their labels: a
/// component whose markers all have one label is that label whole, with no
/// flood and no marker read again. The values are read once, into the
/// grid of a flooded component (the NaN check of the others reads them
/// without building a grid).
fn flood(
    h: usize,
    w: usize,
    connectivity: Connectivity,
    plane: &impl FloodPlane,
    (max_label, too_large): (u32, impl Fn(u32) -> FunctionError),
) -> Result<Flooded, FunctionError> {
    const NAME: &str = "watershed";
    if (h + 2).saturating_mul(w + 2) >= u32::MAX as usize {
        return Err(FunctionError::invalid(NAME, format!("{h}×{w} is too large (at most 2³² pixels)")));
    }
    if h == 0 || w == 0 {
        return Ok(Flooded { w, runs: Vec::new(), parts: run_components(&[], h, connectivity), labelled: Vec::new() });
    }
    // Pass 1, bands of rows in parallel: the runs of pixels inside the mask,
    // and which hold a marker.
    let bands: Vec<Band> = (0..h.div_ceil(FLOOD_BAND))
        .into_par_iter()
        .map_init(
            || (Vec::new(), vec![0u32; w]),
            |(row_runs, marks), b| {
                let mut band = Band::default();
                for y in b * FLOOD_BAND..((b + 1) * FLOOD_BAND).min(h) {
                    row_runs.clear();
                    plane.inside_runs(y, row_runs);
                    plane.touch_markers(y, row_runs);
                    for &(x0, x1) in row_runs.iter() {
                        let span = plane.marker_span(y, x0, x1);
                        if span.is_some_and(|(_, hi)| hi > max_label) && band.too_large.is_none() {
                            let marks = &mut marks[..x1 - x0];
                            plane.markers_run(y, x0, marks);
                            band.too_large = marks.iter().copied().find(|&l| l > max_label);
                        }
                        band.runs.push(Run { y: y as u32, x0: x0 as u32, x1: x1 as u32, marks: Run::marks_of(span) });
                    }
                }
                band
            },
        )
        .collect();
    if let Some(l) = bands.iter().find_map(|b| b.too_large) {
        return Err(too_large(l));
    }
    let runs: Vec<Run> = bands.iter().flat_map(|b| b.runs.iter().copied()).collect();
    let parts = run_components(&runs, h, connectivity);
    // Pass 2, components in parallel: each component that holds markers of
    // more than one label is flooded in a grid of its bounding box; its labels
    // come back in the order of its runs' pixels. A component whose markers
    // all have one label is all that label, which any order of flooding gives
    // it (it is connected, as the flood moves); one with no marker is not
    // reached. Those two are only checked for NaN.
    let nan = std::sync::atomic::AtomicBool::new(false);
    let labelled: Vec<Reached> = parts
        .components
        .par_iter()
        .map_init(
            || (Vec::<Cell>::new(), Queue::new(), vec![0u32; w], vec![0f32; w]),
            |(grid, queue, marks, values), c| {
                let members = || parts.order[c.runs.clone()].iter().map(|&r| &runs[r as usize]);
                // The values of run `r` into the start of `values`.
                let values_of = |r: &Run, values: &mut [f32]| {
                    let values = &mut values[..(r.x1 - r.x0) as usize];
                    plane.values_run(r.y as usize, r.x0 as usize, values);
                };
                let marks_held = members().fold(0, |m, r| Run::join_marks(m, r.marks));
                if marks_held != MIXED {
                    if members().any(|r| plane.nan_in(r.y as usize, r.x0 as usize, r.x1 as usize)) {
                        nan.store(true, std::sync::atomic::Ordering::Relaxed);
                    }
                    return if marks_held == 0 { Reached::Nothing } else { Reached::All(marks_held) };
                }
                let mut cells = |r: &Run, out: &mut [Cell]| {
                    let n = out.len();
                    let marks = &mut marks[..n];
                    if r.marks != 0 {
                        plane.markers_run(r.y as usize, r.x0 as usize, marks);
                    } else {
                        marks.fill(0);
                    }
                    values_of(r, values);
                    let values = &values[..n];
                    // Indexed over one length, so the loop vectorises.
                    let mut has_nan = false;
                    for k in 0..n {
                        has_nan |= values[k].is_nan();
                        let label = marks[k];
                        out[k] = cell(ordered_bits(values[k]), if label == 0 { UNREACHED } else { label });
                    }
                    if has_nan {
                        nan.store(true, std::sync::atomic::Ordering::Relaxed);
                    }
                };
                let mut labels = Vec::with_capacity(c.pixels);
                flood_component(c, members(), &mut cells, connectivity, grid, queue, &mut labels);
                Reached::Each(labels)
            },
        )
        .collect();
    if nan.into_inner() {
        return Err(FunctionError::invalid(NAME, "the image contains NaN inside the mask"));
    }
    Ok(Flooded { w, runs, parts, labelled })
}

/// The labels a [`flood`] gave one connected component of the mask.
enum Reached {
    /// It holds no marker: the flood did not go there.
    Nothing,
    /// It holds markers of this label only: all of it has the label.
    All(u32),
    /// The label of each of its pixels, in the order of its runs (UNREACHED
    /// where the flood did not go).
    Each(Vec<u32>),
}

/// The labels a [`flood`] gave: per component of the mask, what it reached.
struct Flooded {
    w: usize,
    runs: Vec<Run>,
    parts: RunComponents,
    labelled: Vec<Reached>,
}

impl Flooded {
    /// The pixel count of each label `0..=max_label` (labels are at most `max_label`).
    fn areas(&self, max_label: u32) -> Vec<u64> {
        let n = max_label as usize + 1;
        self.labelled
            .par_iter()
            .zip(&self.parts.components)
            .fold(
                || vec![0u64; n],
                |mut area, (reached, c)| {
                    match reached {
                        Reached::Nothing => {}
                        Reached::All(l) => area[*l as usize] += c.pixels as u64,
                        Reached::Each(labels) => labels.iter().filter(|&&l| l != UNREACHED).for_each(|&l| area[l as usize] += 1),
                    }
                    area
                },
            )
            .reduce(
                || vec![0u64; n],
                |mut a, b| {
                    a.iter_mut().zip(&b).for_each(|(a, b)| *a += b);
                    a
                },
            )
    }

    /// A new `h × w` plane with `label_of(label)` at every pixel the flood
    /// reached and the default (0) elsewhere. Zeroed in parallel: a fresh
    /// plane zeroed by one thread costs more than the flood's whole write.
    fn labels<L: Copy + Default + Send + Sync>(&self, h: usize, label_of: impl Fn(u32) -> L + Sync) -> Vec<L> {
        let mut out = Vec::new();
        (0..h * self.w).into_par_iter().with_min_len(1 << 16).map(|_| L::default()).collect_into_vec(&mut out);
        self.write(&mut out, label_of);
        out
    }

    /// Writes `label_of(label)` to `out[i]` (`h × w`) for every pixel the
    /// flood reached and nothing elsewhere; rows in parallel.
    fn write<L: Copy + Send>(&self, out: &mut [L], label_of: impl Fn(u32) -> L + Sync) {
        let (runs, parts) = (&self.runs, &self.parts);
        if self.w == 0 {
            return;
        }
        out.par_chunks_mut(self.w).enumerate().for_each(|(y, row)| {
            for (r, &(c, at)) in runs[parts.row_start[y]..parts.row_start[y + 1]].iter().zip(&parts.slot[parts.row_start[y]..]) {
                let (out, len) = (&mut row[r.x0 as usize..r.x1 as usize], (r.x1 - r.x0) as usize);
                match &self.labelled[c as usize] {
                    Reached::Nothing => {}
                    Reached::All(l) => out.fill(label_of(*l)),
                    Reached::Each(labels) => {
                        for (o, &l) in out.iter_mut().zip(&labels[at as usize..at as usize + len]) {
                            if l != UNREACHED {
                                *o = label_of(l);
                            }
                        }
                    }
                }
            }
        });
    }
}

/// The priority flood of a grid from the queued markers, neighbours at
/// `offsets` (in skimage's order; a fixed count, so the loop unrolls).
fn flood_grid<const N: usize>(grid: &mut [Cell], queue: &mut Queue, offsets: [isize; N]) {
    while let Some((reached, index)) = queue.pop() {
        let label = cell_label(grid[index as usize]);
        for o in offsets {
            let at = (index as isize + o) as usize;
            let q = grid[at];
            // Inside the mask and not reached yet.
            if cell_label(q) != UNREACHED {
                continue;
            }
            grid[at] = cell(cell_cost(q), label);
            // A pixel costs at least as much as the one it is reached from.
            queue.push(cell_cost(q).max(reached), at as u32);
        }
    }
}

/// A connected component of the mask: its runs (a range of
/// [`RunComponents::order`]), pixel count and bounding box (`y0..y1`, `x0..x1`).
struct Component {
    runs: std::ops::Range<usize>,
    pixels: usize,
    y0: u32,
    y1: u32,
    x0: u32,
    x1: u32,
}

/// The connected components of a mask given as runs (raster order).
struct RunComponents {
    /// Components in raster order of their first pixel.
    components: Vec<Component>,
    /// Run indices grouped by component, raster order within each.
    order: Vec<u32>,
    /// Per run: its component and the position of its first pixel among the
    /// component's pixels (in the order of its runs).
    slot: Vec<(u32, u32)>,
    /// The runs of row `y` are `row_start[y]..row_start[y + 1]`.
    row_start: Vec<usize>,
}

/// Connected components of the runs `runs` (raster order, `h` rows): runs on
/// adjacent rows touch when they overlap (4-connectivity) or overlap or meet
/// at a corner (8); union–find, the root the earliest run.
fn run_components(runs: &[Run], h: usize, connectivity: Connectivity) -> RunComponents {
    let mut row_start = vec![0usize; h + 1];
    for r in runs {
        row_start[r.y as usize + 1] += 1;
    }
    for y in 0..h {
        row_start[y + 1] += row_start[y];
    }
    let reach = u32::from(connectivity == Connectivity::Eight);
    let mut parent: Vec<u32> = (0..runs.len() as u32).collect();
    for y in 1..h {
        let (mut i, mut j) = (row_start[y - 1], row_start[y]);
        while i < row_start[y] && j < row_start[y + 1] {
            let (a, b) = (&runs[i], &runs[j]);
            if a.x0 < b.x1 + reach && b.x0 < a.x1 + reach {
                union(&mut parent, i as u32, j as u32);
            }
            // The run that ends first touches nothing further on the other row.
            if a.x1 < b.x1 {
                i += 1;
            } else {
                j += 1;
            }
        }
    }
    // Components numbered in order of their first run; roots are first runs.
    let mut comp_of = vec![0u32; runs.len()];
    let mut components: Vec<Component> = Vec::new();
    for (k, r) in runs.iter().enumerate() {
        let root = find(&mut parent, k as u32) as usize;
        let c = if root == k {
            components.push(Component { runs: 0..0, pixels: 0, y0: r.y, y1: r.y + 1, x0: r.x0, x1: r.x1 });
            components.len() as u32 - 1
        } else {
            comp_of[root]
        };
        comp_of[k] = c;
        let comp = &mut components[c as usize];
        comp.runs.end += 1;
        comp.y1 = r.y + 1;
        comp.x0 = comp.x0.min(r.x0);
        comp.x1 = comp.x1.max(r.x1);
    }
    // Counting sort of the runs by component (stable: raster order within).
    let mut start = 0;
    for c in &mut components {
        let n = c.runs.end;
        c.runs = start..start;
        start += n;
    }
    let mut order = vec![0u32; runs.len()];
    let mut slot = vec![(0u32, 0u32); runs.len()];
    for (k, r) in runs.iter().enumerate() {
        let c = &mut components[comp_of[k] as usize];
        order[c.runs.end] = k as u32;
        c.runs.end += 1;
        slot[k] = (comp_of[k], c.pixels as u32);
        c.pixels += (r.x1 - r.x0) as usize;
    }
    RunComponents { components, order, slot, row_start }
}

/// The flood of one component: its runs (`members`, raster order), whose
/// cells `cells(run, out)` writes, into a zeroed grid of its bounding box with
/// a one-pixel frame, the markers queued in raster order, then the priority
/// flood; `labels` gets the label of each of its pixels in the order of its
/// runs (UNREACHED where the flood did not go).
fn flood_component<'a>(
    c: &Component,
    members: impl Iterator<Item = &'a Run> + Clone,
    cells: &mut impl FnMut(&Run, &mut [Cell]),
    connectivity: Connectivity,
    grid: &mut Vec<Cell>,
    queue: &mut Queue,
    labels: &mut Vec<u32>,
) {
    let gw = (c.x1 - c.x0) as usize + 2;
    let gh = (c.y1 - c.y0) as usize + 2;
    grid.clear();
    grid.resize(gw * gh, 0);
    let at = |r: &Run| (r.y - c.y0 + 1) as usize * gw + (r.x0 - c.x0 + 1) as usize;
    queue.reset();
    for r in members.clone() {
        let base = at(r);
        let run = &mut grid[base..base + (r.x1 - r.x0) as usize];
        cells(r, run);
        if r.marks != 0 {
            for (k, &q) in run.iter().enumerate() {
                if cell_label(q) != UNREACHED {
                    queue.push(cell_cost(q), (base + k) as u32);
                }
            }
        }
    }
    let gw_i = gw as isize;
    let edge = [-gw_i, -1, 1, gw_i];
    match connectivity {
        Connectivity::Four => flood_grid(grid, queue, edge),
        Connectivity::Eight => flood_grid(grid, queue, [edge[0], edge[1], edge[2], edge[3], -gw_i - 1, -gw_i + 1, gw_i - 1, gw_i + 1]),
    }
    for r in members {
        let base = at(r);
        labels.extend(grid[base..base + (r.x1 - r.x0) as usize].iter().map(|&q| cell_label(q)));
    }
}

/// The next run of pixels of `row` that `inside` takes, from `*x` on, as
/// `x0..x1`, leaving `*x` at its end; `None` when there is none. Other pixels
/// are skipped 16 at a time (a vector compare), then one by one.
#[inline]
fn next_run<T: Copy>(row: &[T], x: &mut usize, inside: impl Fn(T) -> bool) -> Option<(usize, usize)> {
    let w = row.len();
    let mut i = *x;
    while i + 16 <= w && !row[i..i + 16].iter().fold(false, |a, &v| a | inside(v)) {
        i += 16;
    }
    while i < w && !inside(row[i]) {
        i += 1;
    }
    if i == w {
        *x = w;
        return None;
    }
    let x0 = i;
    while i < w && inside(row[i]) {
        i += 1;
    }
    *x = i;
    Some((x0, i))
}

/// Pushes the runs `x0..x1` of `row`'s pixels that `inside` takes onto
/// `runs`, in x order ([`next_run`]).
fn runs_where<T: Copy>(row: &[T], inside: impl Fn(T) -> bool + Copy, runs: &mut Vec<(usize, usize)>) {
    let mut x = 0;
    while let Some(run) = next_run(row, &mut x, inside) {
        runs.push(run);
    }
}

/// scipy `binary_fill_holes(mask)`: background components (4-connected) that do
/// not touch the image border become foreground. The background is read as
/// runs of a row (bands of rows in parallel), its components are unions of
/// overlapping runs (as for the watershed's components), and the runs of the
/// components that do not reach the border are filled.
pub fn fill_holes(mask: &[bool], h: usize, w: usize) -> Vec<bool> {
    let mut filled = mask.to_vec();
    if h == 0 || w == 0 {
        return filled;
    }
    let bands: Vec<Vec<Run>> = (0..h.div_ceil(FLOOD_BAND))
        .into_par_iter()
        .map(|b| {
            let mut runs = Vec::new();
            for y in b * FLOOD_BAND..((b + 1) * FLOOD_BAND).min(h) {
                let mut x = 0;
                while let Some((x0, x1)) = next_run(&mask[y * w..(y + 1) * w], &mut x, |m: bool| !m) {
                    runs.push(Run { y: y as u32, x0: x0 as u32, x1: x1 as u32, marks: 0 });
                }
            }
            runs
        })
        .collect();
    let runs = bands.concat();
    let parts = run_components(&runs, h, Connectivity::Four);
    for c in &parts.components {
        if c.y0 == 0 || c.y1 as usize == h || c.x0 == 0 || c.x1 as usize == w {
            continue;
        }
        for &r in &parts.order[c.runs.clone()] {
            let r = &runs[r as usize];
            let row = r.y as usize * w;
            filled[row + r.x0 as usize..row + r.x1 as usize].fill(true);
        }
    }
    filled
}

/// The scanline flood fill [`fill_holes`] used before its run version (kept
/// for the test that compares the two).
#[cfg(test)]
fn fill_holes_scanline(mask: &[bool], h: usize, w: usize) -> Vec<bool> {
    // Flood the background from the border (4-connected): what it does not
    // reach is a hole, and becomes foreground. The flood goes by runs of a row
    // (a scanline fill): each run is marked at once and seeds at most one run
    // per run of background in the rows above and below, so every pixel is
    // looked at a few times in tight loops instead of pushed one by one.
    let mut filled = vec![true; h * w];
    if h == 0 || w == 0 {
        return filled;
    }
    // Background not reached yet.
    let open = |filled: &[bool], i: usize| !mask[i] && filled[i];
    let mut seeds: Vec<(usize, usize)> = Vec::new();
    for_border(h, w, |i| {
        if open(&filled, i) {
            seeds.push((i / w, i % w));
        }
    });
    while let Some((y, x)) = seeds.pop() {
        let row = y * w;
        if !open(&filled, row + x) {
            continue;
        }
        let (mut l, mut r) = (x, x);
        while l > 0 && open(&filled, row + l - 1) {
            l -= 1;
        }
        while r + 1 < w && open(&filled, row + r + 1) {
            r += 1;
        }
        filled[row + l..=row + r].fill(false);
        for ny in [y.wrapping_sub(1), y + 1] {
            if ny >= h {
                continue;
            }
            let near = ny * w;
            let mut x = l;
            while x <= r {
                if open(&filled, near + x) {
                    seeds.push((ny, x));
                    // One seed per run: skip to the run's end.
                    while x <= r && open(&filled, near + x) {
                        x += 1;
                    }
                } else {
                    x += 1;
                }
            }
        }
    }
    filled
}

fn for_border(h: usize, w: usize, mut f: impl FnMut(usize)) {
    if h == 0 || w == 0 {
        return;
    }
    for x in 0..w {
        f(x);
        f((h - 1) * w + x);
    }
    for y in 0..h {
        f(y * w);
        f(y * w + w - 1);
    }
}

/// Sets to 0 every label that has a pixel on the image border (values of the
/// others kept; skimage `clear_border(labels)`, see the module docs).
pub fn clear_border(labels: &mut [u32], h: usize, w: usize) {
    let max = labels.iter().copied().max().unwrap_or(0) as usize;
    let mut touching = vec![false; max + 1];
    for_border(h, w, |i| touching[labels[i] as usize] = true);
    touching[0] = false;
    labels.iter_mut().for_each(|l| {
        if touching[*l as usize] {
            *l = 0
        }
    });
}

/// Relabels the nonzero values of `labels` 1.. in increasing value order
/// (skimage `relabel_sequential`).
pub fn relabel_sequential(labels: &[u32], h: usize, w: usize) -> Labels {
    let max = labels.iter().copied().max().unwrap_or(0) as usize;
    let mut present = vec![false; max + 1];
    labels.iter().for_each(|&l| present[l as usize] = true);
    let mut new_id = vec![0u32; max + 1];
    let mut count = 0;
    for (l, &p) in present.iter().enumerate().skip(1) {
        if p {
            count += 1;
            new_id[l] = count;
        }
    }
    Labels { height: h, width: w, labels: labels.iter().map(|&l| new_id[l as usize]).collect(), count }
}

/// Keeps the objects with `min_area ≤ area ≤ max_area`, relabelled 1.. in label order.
pub fn filter_size(labels: &[u32], h: usize, w: usize, min_area: u64, max_area: u64) -> Labels {
    keep_sizes(labels.to_vec(), h, w, min_area, max_area)
}

/// [`filter_size`] in place: the areas of every label value in one parallel
/// pass, then one pass renumbering the kept ones (a value with no pixel is
/// never kept, whatever `min_area`).
pub(crate) fn keep_sizes(mut labels: Vec<u32>, h: usize, w: usize, min_area: u64, max_area: u64) -> Labels {
    let max = labels.par_iter().copied().max().unwrap_or(0) as usize;
    let area = labels
        .par_chunks(w.max(1) * 64)
        .fold(
            || vec![0u64; max + 1],
            |mut a, chunk| {
                // Most pixels are background: not counted (one counter
                // incremented millions of times serialises on its store).
                chunk.iter().filter(|&&l| l != 0).for_each(|&l| a[l as usize] += 1);
                a
            },
        )
        .reduce(
            || vec![0u64; max + 1],
            |mut a, b| {
                a.iter_mut().zip(&b).for_each(|(a, b)| *a += b);
                a
            },
        );
    let mut new_id = vec![0u32; max + 1];
    let mut count = 0;
    for (l, &a) in area.iter().enumerate().skip(1) {
        if a > 0 && a >= min_area && a <= max_area {
            count += 1;
            new_id[l] = count;
        }
    }
    labels.par_iter_mut().for_each(|l| *l = new_id[*l as usize]);
    Labels { height: h, width: w, labels, count }
}

/// Markers at the maxima of `dist` (`h × w`): pixels with `dist > 0` equal to
/// the maximum of the `(2·radius + 1)²` square around them (clipped at the
/// border); touching maximum pixels (8-connected, e.g. a plateau or a ridge)
/// form one marker. This is CellProfiler's maxima with a suppression square of
/// side 2·radius + 1 (CellProfiler uses a disk), and like skimage
/// `peak_local_max(min_distance=radius, exclude_border=False)` followed by
/// `label`, except that two separate equal maxima closer than `radius` both
/// stay (peak_local_max keeps one).
pub fn maxima_markers(dist: &[f32], h: usize, w: usize, radius: usize) -> Labels {
    if h == 0 || w == 0 {
        return label_mask(&[], h, w, Connectivity::Eight);
    }
    let maxima = maxima_runs(dist, h, w, radius, &mut vec![0f32; h * w]);
    let mut labels = vec![0u32; h * w];
    for y in 0..h {
        maxima.write_row(y, &mut labels[y * w..(y + 1) * w]);
    }
    Labels { height: h, width: w, labels, count: maxima.parts.components.len() as u32 }
}

/// [`segment_nuclei`]'s watershed of −distance from the seeds, inside the mask.
struct NucleiPlanes<'a> {
    w: usize,
    mask: &'a [bool],
    dist: &'a [f32],
    seeds: &'a Maxima,
}

impl FloodPlane for NucleiPlanes<'_> {
    fn inside_runs(&self, y: usize, runs: &mut Vec<(usize, usize)>) {
        runs_where(&self.mask[y * self.w..(y + 1) * self.w], |m| m, runs);
    }

    fn values_run(&self, y: usize, x0: usize, out: &mut [f32]) {
        out.iter_mut().zip(&self.dist[y * self.w + x0..]).for_each(|(v, &d)| *v = -d);
    }

    fn markers_run(&self, y: usize, x0: usize, out: &mut [u32]) {
        self.seeds.run(y, x0, out);
    }

    fn marker_span(&self, y: usize, x0: usize, x1: usize) -> Option<(u32, u32)> {
        self.seeds.span(y, x0, x1)
    }

    fn nan_in(&self, _: usize, _: usize, _: usize) -> bool {
        // A distance (smoothed or not) of a mask.
        false
    }
}

/// [`maxima_markers`]' markers as runs: the label of run `k` is its
/// component's number + 1.
struct Maxima {
    runs: Vec<Run>,
    parts: RunComponents,
}

impl Maxima {
    /// Writes the labels of row `y`'s markers into `row` (other pixels untouched).
    fn write_row(&self, y: usize, row: &mut [u32]) {
        let k = self.parts.row_start[y]..self.parts.row_start[y + 1];
        for (r, &(c, _)) in self.runs[k.clone()].iter().zip(&self.parts.slot[k]) {
            row[r.x0 as usize..r.x1 as usize].fill(c + 1);
        }
    }

    /// The marker labels (0 = none) of pixels `x0..x0 + out.len()` of row `y` into `out`.
    fn run(&self, y: usize, x0: usize, out: &mut [u32]) {
        out.fill(0);
        self.each_in(y, x0, x0 + out.len(), |a, b, label| out[a - x0..b - x0].fill(label));
    }

    /// The smallest and largest marker label of pixels `x0..x1` of row `y`
    /// (`None`: none there).
    fn span(&self, y: usize, x0: usize, x1: usize) -> Option<(u32, u32)> {
        let mut span: Option<(u32, u32)> = None;
        self.each_in(y, x0, x1, |_, _, l| span = Some(span.map_or((l, l), |(lo, hi)| (lo.min(l), hi.max(l)))));
        span
    }

    /// Calls `f(a, b, label)` for each piece `a..b` of a maximum's run on row
    /// `y` within `x0..x1`, in x order.
    fn each_in(&self, y: usize, x0: usize, x1: usize, mut f: impl FnMut(usize, usize, u32)) {
        let k = self.parts.row_start[y]..self.parts.row_start[y + 1];
        let (runs, slots) = (&self.runs[k.clone()], &self.parts.slot[k]);
        // The row's runs are in x order: from the first one ending after x0.
        let first = runs.partition_point(|r| (r.x1 as usize) <= x0);
        for (r, &(c, _)) in runs[first..].iter().zip(&slots[first..]) {
            if r.x0 as usize >= x1 {
                break;
            }
            f((r.x0 as usize).max(x0), (r.x1 as usize).min(x1), c + 1);
        }
    }
}

/// The maxima of [`maxima_markers`] as runs (`h`, `w` > 0); `rowmax`: a work
/// plane (`h × w`, any values).
fn maxima_runs(dist: &[f32], h: usize, w: usize, radius: usize, rowmax: &mut [f32]) -> Maxima {
    // Separable maximum over the clipped square: along each row, then along
    // each column (bands of rows in parallel).
    rowmax
        .par_chunks_mut(w)
        .zip(dist.par_chunks(w))
        .for_each_init(|| (vec![0f32; w], vec![0f32; w]), |(a, b), (out, row)| row_window_max(row, radius, out, a, b));
    // The maximum pixels, as runs of a row: they are few, so they are
    // labelled as runs (the components of touching runs, numbered in raster
    // order as `label_mask` numbers them).
    let bands: Vec<Vec<Run>> = (0..h.div_ceil(FLOOD_BAND))
        .into_par_iter()
        .map_init(
            || (ColumnMax::default(), vec![false; w]),
            |(columns, peak), b| {
                let mut runs = Vec::new();
                let rows = b * FLOOD_BAND..((b + 1) * FLOOD_BAND).min(h);
                columns.each_row(rowmax, h, w, radius, rows, |y, m| {
                    let row = &dist[y * w..(y + 1) * w];
                    for ((p, &v), &m) in peak.iter_mut().zip(row).zip(m) {
                        *p = v > 0.0 && m <= v;
                    }
                    let mut x = 0;
                    while let Some((x0, x1)) = next_run(peak, &mut x, |p| p) {
                        runs.push(Run { y: y as u32, x0: x0 as u32, x1: x1 as u32, marks: 0 });
                    }
                });
                runs
            },
        )
        .collect();
    let runs = bands.concat();
    let parts = run_components(&runs, h, Connectivity::Eight);
    Maxima { runs, parts }
}

/// `out[i] = max(out[i], v[i])` (the values have no NaN); vectorises.
#[inline]
fn max_assign(out: &mut [f32], v: &[f32]) {
    for (o, &v) in out.iter_mut().zip(v) {
        *o = max2(*o, v);
    }
}

/// `out[i] = max(a[i], b[i])` (the values have no NaN); vectorises.
#[inline]
fn max_into(out: &mut [f32], a: &[f32], b: &[f32]) {
    for ((o, &a), &b) in out.iter_mut().zip(a).zip(b) {
        *o = max2(a, b);
    }
}

/// The larger of two values without NaN.
#[inline]
fn max2(a: f32, b: f32) -> f32 {
    if b > a {
        b
    } else {
        a
    }
}

/// `out[x]` = the largest of `v[x − r ..= x + r]`, the window clipped to the
/// row (values without NaN). Maxima over windows of 1, 2, 4, …, p ≤ 2r + 1
/// pixels by doubling (each level an element-wise maximum of two shifted
/// slices, so it vectorises), then each whole window as two overlapping
/// windows of p; the windows the row clips, at its two ends, as running
/// maxima. `a`, `b`: work rows as long as `v`. Cost: ⌊log₂(2r + 1)⌋ + 2
/// passes over the row, where shifting the row by each offset took 2r.
fn row_window_max(v: &[f32], r: usize, out: &mut [f32], a: &mut [f32], b: &mut [f32]) {
    let n = v.len();
    let k = 2 * r + 1;
    if n < k {
        // Every window is clipped (few pixels, or a radius wider than the row).
        for (x, o) in out.iter_mut().enumerate() {
            *o = v[x.saturating_sub(r)..=(x + r).min(n - 1)].iter().fold(f32::NEG_INFINITY, |m, &v| max2(m, v));
        }
        return;
    }
    let (mut level, mut next) = (a, b);
    level.copy_from_slice(v);
    // level[i] = max(v[i .. i + p]) for i + p ≤ n.
    let mut p = 1;
    while 2 * p <= k {
        let m = n - 2 * p + 1;
        max_into(&mut next[..m], &level[..m], &level[p..p + m]);
        std::mem::swap(&mut level, &mut next);
        p *= 2;
    }
    // The whole windows, x in r..n − r: [x − r, x − r + p) ∪ [x + r + 1 − p, x + r].
    let m = n - 2 * r;
    max_into(&mut out[r..n - r], &level[..m], &level[k - p..k - p + m]);
    // The clipped ones: [0, x + r] for x < r and [x − r, n) for x ≥ n − r.
    let mut run = v[..r].iter().fold(f32::NEG_INFINITY, |m, &v| max2(m, v));
    for x in 0..r {
        run = max2(run, v[x + r]);
        out[x] = run;
    }
    let mut run = v[n - r..].iter().fold(f32::NEG_INFINITY, |m, &v| max2(m, v));
    for x in (n - r..n).rev() {
        run = max2(run, v[x - r]);
        out[x] = run;
    }
}

/// The column pass of [`maxima_runs`]' square maximum, a band of rows at a
/// time: van Herk / Gil–Werman over blocks of `k = 2r + 1` rows. Within each
/// block, running maxima down (`down`) and up (`up`); a whole window of rows
/// `[y − r, y + r]` spans at most two blocks, so its maximum is
/// `max(up[y − r], down[y + r])`: three passes over a row whatever the radius,
/// where taking each of the window's rows took 2r + 1. Windows the plane
/// clips (the first and last `r` rows) are taken row by row.
#[derive(Default)]
struct ColumnMax {
    down: Vec<f32>,
    up: Vec<f32>,
    row: Vec<f32>,
}

impl ColumnMax {
    /// Calls `f(y, maxima)` for each row `y` of `rows` in order, `maxima` the
    /// maximum of `rowmax` (`h × w`) over rows `y − r ..= y + r` (clipped), per column.
    fn each_row(&mut self, rowmax: &[f32], h: usize, w: usize, r: usize, rows: std::ops::Range<usize>, mut f: impl FnMut(usize, &[f32])) {
        let k = 2 * r + 1;
        let row = |y: usize| &rowmax[y * w..(y + 1) * w];
        // Rows whose window is whole, and the rows those windows cover.
        let (y0, y1) = (rows.start.max(r), rows.end.min(h.saturating_sub(r)));
        let lo = y0.saturating_sub(r);
        if y0 < y1 {
            let n = y1 + r - lo;
            self.down.resize(n * w, 0.0);
            self.up.resize(n * w, 0.0);
            for j in 0..n {
                let (done, rest) = self.down.split_at_mut(j * w);
                if j % k == 0 {
                    rest[..w].copy_from_slice(row(lo + j));
                } else {
                    max_into(&mut rest[..w], &done[(j - 1) * w..], row(lo + j));
                }
            }
            for j in (0..n).rev() {
                let (head, below) = self.up.split_at_mut((j + 1) * w);
                if j % k == k - 1 || j == n - 1 {
                    head[j * w..].copy_from_slice(row(lo + j));
                } else {
                    max_into(&mut head[j * w..], &below[..w], row(lo + j));
                }
            }
        }
        self.row.resize(w, 0.0);
        for y in rows {
            if (y0..y1).contains(&y) {
                let (a, b) = ((y - r - lo) * w, (y + r - lo) * w);
                max_into(&mut self.row, &self.up[a..a + w], &self.down[b..b + w]);
            } else {
                let first = y.saturating_sub(r);
                self.row.copy_from_slice(row(first));
                for yy in first + 1..=(y + r).min(h - 1) {
                    max_assign(&mut self.row, row(yy));
                }
            }
            f(y, &self.row);
        }
    }
}

/// Parameters of [`segment_nuclei`].
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct NucleiParams {
    /// σ of the Gaussian smoothing before the threshold (pixels; 0 = none).
    pub smoothing_sigma: f64,
    pub threshold: ThresholdMethod,
    /// Multiplies the threshold (CellProfiler's "threshold correction factor").
    pub threshold_factor: f64,
    /// σ of the Gaussian smoothing of the distance transform before the maxima (0 = none).
    pub distance_sigma: f64,
    /// Half-side of the maxima suppression square (pixels): seeds closer than this merge.
    pub min_distance: usize,
    pub min_area: u64,
    pub max_area: u64,
    /// Remove objects touching the image border.
    pub clear_border: bool,
    pub connectivity: Connectivity,
}

impl Default for NucleiParams {
    fn default() -> Self {
        NucleiParams {
            smoothing_sigma: 1.5,
            threshold: ThresholdMethod::Otsu,
            threshold_factor: 1.0,
            distance_sigma: 1.0,
            min_distance: 4,
            min_area: 30,
            max_area: 100_000,
            clear_border: false,
            connectivity: Connectivity::Eight,
        }
    }
}

/// Segments the nuclei of one plane (`h × w`, row-major):
/// 1. Gaussian smoothing (scipy `gaussian_filter`, reflect, truncate 4, f32);
/// 2. foreground = smoothed > threshold (Otsu/Li of the smoothed plane, or a
///    manual value) × `threshold_factor`;
/// 3. holes filled ([`fill_holes`]);
/// 4. distance transform ([`distance_transform_edt`]), smoothed by `distance_sigma`;
/// 5. seeds at its maxima ([`maxima_markers`] with `min_distance`);
/// 6. [`watershed`] of −distance from the seeds within the foreground;
/// 7. size filter, then (optionally) border clearing; labels 1.. in seed raster order.
///
/// Errors: NaN in the plane.
pub fn segment_nuclei<T: Pixel>(plane: &[T], h: usize, w: usize, p: &NucleiParams) -> Result<Labels, FunctionError> {
    let mut labels = vec![0u32; if plane.len() == h * w { h * w } else { 0 }];
    let count = segment_nuclei_into(plane, h, w, p, &mut labels, UNREACHED - 1, |l| l)?;
    Ok(Labels { height: h, width: w, labels, count })
}

/// [`segment_nuclei`] writing `label_of(label)` into `out` (`h × w`, zeros)
/// for its objects' pixels; returns the object count. The size filter is
/// applied as the flood's labels are written (their areas counted from the
/// flood itself), so the labels are written once. Errors: those of
/// [`segment_nuclei`], more than `max_count` objects.
fn segment_nuclei_into<T: Pixel, L: Copy + Send>(
    plane: &[T],
    h: usize,
    w: usize,
    p: &NucleiParams,
    out: &mut [L],
    max_count: u32,
    label_of: impl Fn(u32) -> L + Sync,
) -> Result<u32, FunctionError> {
    const NAME: &str = "segment_nuclei";
    if plane.len() != h * w || out.len() != h * w {
        return Err(FunctionError::invalid(NAME, format!("{} pixels for a {h}×{w} image", plane.len())));
    }
    if h == 0 || w == 0 {
        return Ok(0);
    }
    let gaussian = |sigma: f64| Kernel1d::gaussian(sigma, 4.0);
    let k = gaussian(p.smoothing_sigma);
    let smoothed = correlate_separable(plane, h, w, &k, &k, Boundary::Reflect);
    // Smoothing integer pixels gives no NaN: only a float plane is checked.
    if T::DTYPE == DType::F32 && smoothed.iter().any(|v| v.is_nan()) {
        return Err(FunctionError::invalid(NAME, "the image contains NaN"));
    }
    let t = threshold_value(&smoothed, p.threshold)? * p.threshold_factor;
    let mask: Vec<bool> = smoothed.par_iter().map(|&v| f64::from(v) > t).collect();
    let mask = fill_holes(&mask, h, w);
    let mut dist = distance_transform_edt(&mask, h, w, (1.0, 1.0));
    // The smoothed plane is done with: its buffer takes the smoothed distance,
    // and the distance's then takes the maxima's row pass (each overwritten
    // whole), rather than two fresh planes to zero.
    let mut spare = smoothed;
    if p.distance_sigma > 0.0 {
        let k = gaussian(p.distance_sigma);
        correlate_separable_into(&dist, h, w, &k, &k, Boundary::Reflect, &mut spare);
        std::mem::swap(&mut dist, &mut spare);
    }
    // Smoothing spreads distance outside the mask: seeds only inside it.
    dist.par_chunks_mut(w).zip(mask.par_chunks(w)).for_each(|(d, m)| {
        d.iter_mut().zip(m).for_each(|(d, &m)| *d = if m { *d } else { 0.0 });
    });
    let seeds = maxima_runs(&dist, h, w, p.min_distance, &mut spare);
    drop(spare);
    // The watershed of −distance (the flood reads it a run at a time).
    let too_large = |l: u32| FunctionError::invalid(NAME, format!("seed label {l} is too large"));
    let planes = NucleiPlanes { w, mask: &mask, dist: &dist, seeds: &seeds };
    let flooded = flood(h, w, p.connectivity, &planes, (UNREACHED - 1, too_large))?;
    drop((dist, mask));
    // Size filter (keep_sizes' rule): the seeds' areas, the kept ones renumbered 1.. in seed order.
    let area = flooded.areas(seeds.parts.components.len() as u32);
    drop(seeds);
    let mut new_id = vec![0u32; area.len()];
    let mut count = 0;
    for (l, &a) in area.iter().enumerate().skip(1) {
        if a > 0 && a >= p.min_area && a <= p.max_area {
            count += 1;
            new_id[l] = count;
        }
    }
    let too_many = |count: u32| FunctionError::invalid(NAME, format!("{count} objects do not fit a u16 label image (at most {max_count})"));
    if p.clear_border {
        let mut labels = flooded.labels(h, |l| new_id[l as usize]);
        clear_border(&mut labels, h, w);
        let kept = relabel_sequential(&labels, h, w);
        if kept.count > max_count {
            return Err(too_many(kept.count));
        }
        out.par_iter_mut().zip(&kept.labels).for_each(|(o, &l)| {
            if l != 0 {
                *o = label_of(l);
            }
        });
        return Ok(kept.count);
    }
    if count > max_count {
        return Err(too_many(count));
    }
    flooded.write(out, |l| label_of(new_id[l as usize]));
    Ok(count)
}

/// Nonzero pixels of a plane as a mask.
fn plane_mask<T: Pixel>(plane: &[T]) -> Vec<bool> {
    let zero = T::default();
    plane.iter().map(|&v| v != zero).collect()
}

/// A plane's values as labels (integer pixel values; f32 values are truncated).
fn plane_labels<T: Pixel>(plane: &[T]) -> Vec<u32> {
    plane.iter().map(|v| v.to_f32().max(0.0) as u32).collect()
}

/// Label stack from per-plane labels (u16; error above 65,535).
fn labels_stack(
    n: usize,
    h: usize,
    w: usize,
    name: &str,
    mut f: impl FnMut(usize) -> Result<Labels, FunctionError>,
) -> Result<Stack, FunctionError> {
    let mut out = StackArray::<u16>::zeros([n, h, w]);
    for z in 0..n {
        let l = f(z)?;
        out.plane_mut(z).copy_from_slice(&l.to_u16(name)?);
    }
    Ok(Stack::from(out))
}

hcsflow_core::function_args! {
    /// The arguments of [`DISTANCE_TRANSFORM`].
    pub struct DistanceArgs {
        sampling_y: f64 = float(1.0, Some(1e-6), None, "pixel spacing along Y (distance units per pixel)"),
        sampling_x: f64 = float(1.0, Some(1e-6), None, "pixel spacing along X"),
    }
}

pub static DISTANCE_TRANSFORM: FunctionDecl<DistanceArgs> = FunctionDecl::new(
    "distance_transform",
    Contract::Pure2d,
    "Exact Euclidean distance of each nonzero pixel to the nearest zero pixel (scipy.ndimage.distance_transform_edt), f32.",
);

pub static FILL_HOLES: FunctionDecl<NoArgs> =
    FunctionDecl::new("fill_holes", Contract::Pure2d, "Fills the holes of the nonzero pixels (scipy.ndimage.binary_fill_holes), u8 0/1.");

pub static CLEAR_BORDER: FunctionDecl<NoArgs> = FunctionDecl::new(
    "clear_border",
    Contract::Pure2d,
    "Removes the labels touching the image border (skimage.segmentation.clear_border), other values kept.",
)
.with_label_output();

hcsflow_core::function_args! {
    /// The arguments of [`FILTER_SIZE`].
    pub struct FilterSizeArgs {
        min_area: i64 = int(0, Some(0), None, "smallest object kept (pixels)"),
        max_area: i64 = int(i64::MAX, Some(0), None, "largest object kept (pixels)"),
    }
}

pub static FILTER_SIZE: FunctionDecl<FilterSizeArgs> = FunctionDecl::new(
    "filter_size",
    Contract::Pure2d,
    "Keeps the labelled objects with min_area <= area <= max_area, relabelled 1.. in label order (u16).",
)
.with_label_output();

hcsflow_core::function_args! {
    /// The arguments of [`SEGMENT_NUCLEI`].
    pub struct SegmentNucleiArgs {
        smoothing_sigma: f64 = float(1.5, Some(0.0), Some(100.0), "σ of the Gaussian smoothing before the threshold (pixels)"),
        threshold_method: String = choice("otsu", &["otsu", "li", "manual"], "how the threshold of the smoothed plane is chosen"),
        threshold_value: f64 = float(0.0, None, None, "the threshold for threshold_method=manual (pixel units)"),
        threshold_factor: f64 = float(1.0, Some(0.0), None, "multiplies the threshold (CellProfiler's correction factor)"),
        distance_sigma: f64 = float(1.0, Some(0.0), Some(100.0), "σ of the smoothing of the distance transform before the seeds"),
        min_distance: i64 = int(4, Some(1), Some(1000), "seeds closer than this (pixels, square) merge"),
        min_area: i64 = int(30, Some(0), None, "smallest object kept (pixels)"),
        max_area: i64 = int(100_000, Some(0), None, "largest object kept (pixels)"),
        clear_border: bool = bool(false, "remove objects touching the image border"),
        connectivity: String = choice("8", &["4", "8"], "watershed neighbourhood"),
    }
}

impl SegmentNucleiArgs {
    /// The parameters these arguments choose.
    pub fn params(&self) -> Result<NucleiParams, FunctionError> {
        let threshold = ThresholdMethod::from_args(&self.threshold_method, self.threshold_value)
            .ok_or_else(|| FunctionError::failed("segment_nuclei", format!("unknown threshold_method '{}'", self.threshold_method)))?;
        Ok(NucleiParams {
            smoothing_sigma: self.smoothing_sigma,
            threshold,
            threshold_factor: self.threshold_factor,
            distance_sigma: self.distance_sigma,
            min_distance: self.min_distance.max(1) as usize,
            min_area: self.min_area.max(0) as u64,
            max_area: self.max_area.max(0) as u64,
            clear_border: self.clear_border,
            connectivity: if self.connectivity == "4" { Connectivity::Four } else { Connectivity::Eight },
        })
    }
}

fn check_segment(args: &SegmentNucleiArgs, _: &StackShape) -> Result<(), ArgProblem> {
    if args.min_area > args.max_area {
        return Err(ArgProblem::new(
            "min_area",
            format!("min_area ({}) is larger than max_area ({})", args.min_area, args.max_area),
            "make min_area <= max_area",
        ));
    }
    Ok(())
}

hcsflow_core::function_args! {
    /// The arguments of [`WATERSHED`].
    pub struct WatershedArgs {
        connectivity: String = choice("8", &["4", "8"], "neighbourhood of the flood"),
    }
}

fn check_watershed(_: &WatershedArgs, shape: &StackShape) -> Result<(), ArgProblem> {
    if !(2..=3).contains(&shape.depth) {
        return Err(ArgProblem::input(
            format!("needs 2 planes (image, markers) or 3 (image, markers, mask), but the stack has {}", shape.depth),
            "make the step's stacks hold the image, its markers and optionally a mask, e.g. variable_components = [\"channel\"] and group_by = \"none\"",
        ));
    }
    Ok(())
}

fn one_plane_u16(_: &WatershedArgs, input: &StackShape) -> Option<StackShape> {
    Some(input.with_depth(1))
}

pub static WATERSHED: FunctionDecl<WatershedArgs> = FunctionDecl::new(
    "watershed",
    Contract::Pure3d,
    "Seeded watershed (skimage.segmentation.watershed; markers of equal value taken in raster order): plane 0 the image, plane 1 the markers (0 = none), optional plane 2 the mask (nonzero = flood); one u16 label plane.",
)
.with_check(check_watershed)
.with_output_shape(one_plane_u16)
.with_label_output();

/// [`watershed`] of a 2- or 3-plane stack (image, markers, optional mask) as
/// one u16 label plane. Errors: other plane counts, NaN, labels above 65,535.
pub fn watershed_stack(stack: &Stack, connectivity: Connectivity) -> Result<Stack, FunctionError> {
    const NAME: &str = "watershed";
    let [n, h, w] = stack.shape();
    if !(2..=3).contains(&n) {
        return Err(FunctionError::invalid(NAME, format!("needs 2 or 3 planes, got {n}")));
    }
    let labels = with_pixels!(Stack, stack, a, T => {
        let planes = StackPlanes { w, image: a.plane(0), markers: a.plane(1), mask: (n == 3).then(|| a.plane(2)) };
        let too_large = |l: u32| FunctionError::invalid(NAME, format!("marker label {l} does not fit a u16 label image (at most 65535)"));
        flood(h, w, connectivity, &planes, (u32::from(u16::MAX), too_large))?.labels(h, |l| l as u16)
    });
    Ok(Stack::from(StackArray::from_vec([1, h, w], labels).map_err(|e| FunctionError::failed(NAME, e.to_string()))?))
}

/// [`watershed_stack`]'s planes of one pixel type: a marker label is the
/// pixel's value truncated (below 1: none), inside the mask is not zero (NaN
/// is not zero).
struct StackPlanes<'a, T> {
    w: usize,
    image: &'a [T],
    markers: &'a [T],
    mask: Option<&'a [T]>,
}

impl<T: Pixel> FloodPlane for StackPlanes<'_, T> {
    fn inside_runs(&self, y: usize, runs: &mut Vec<(usize, usize)>) {
        let zero = T::default();
        match self.mask {
            Some(m) => runs_where(&m[y * self.w..(y + 1) * self.w], |v| v != zero, runs),
            None => runs.push((0, self.w)),
        }
    }

    fn values_run(&self, y: usize, x0: usize, out: &mut [f32]) {
        out.iter_mut().zip(&self.image[y * self.w + x0..]).for_each(|(v, p)| *v = p.to_f32());
    }

    fn markers_run(&self, y: usize, x0: usize, out: &mut [u32]) {
        out.iter_mut().zip(&self.markers[y * self.w + x0..]).for_each(|(m, v)| *m = v.to_f32().max(0.0) as u32);
    }

    fn marker_span(&self, y: usize, x0: usize, x1: usize) -> Option<(u32, u32)> {
        // Truncating is monotone, so the labels' span is that of the values
        // of at least 1 (NaN compares false: skipped, as its label is 0).
        // Eight lanes of minima and maxima, so the loops vectorise.
        let row = &self.markers[y * self.w + x0..y * self.w + x1];
        let (mut lo, mut hi) = ([f32::INFINITY; 8], [0f32; 8]);
        let mut chunks = row.chunks_exact(8);
        for c in &mut chunks {
            for k in 0..8 {
                let v = c[k].to_f32();
                lo[k] = if v >= 1.0 && v < lo[k] { v } else { lo[k] };
                hi[k] = if v > hi[k] { v } else { hi[k] };
            }
        }
        for (k, v) in chunks.remainder().iter().enumerate() {
            let v = v.to_f32();
            lo[k] = if v >= 1.0 && v < lo[k] { v } else { lo[k] };
            hi[k] = if v > hi[k] { v } else { hi[k] };
        }
        let hi = hi.iter().fold(0f32, |a, &v| a.max(v));
        let lo = lo.iter().fold(f32::INFINITY, |a, &v| a.min(v));
        (hi >= 1.0).then_some((lo as u32, hi as u32))
    }

    fn nan_in(&self, y: usize, x0: usize, x1: usize) -> bool {
        T::DTYPE == DType::F32 && self.image[y * self.w + x0..y * self.w + x1].iter().fold(false, |a, v| a | v.to_f32().is_nan())
    }

    fn touch_markers(&self, y: usize, runs: &[(usize, usize)]) {
        touch_runs(&self.markers[y * self.w..(y + 1) * self.w], runs, |v| v.to_f32().to_bits());
    }
}

/// The artifact of per-object measurements `segment_nuclei` produces.
pub const OBJECTS: &str = "objects";

pub static SEGMENT_NUCLEI: FunctionDecl<SegmentNucleiArgs> = FunctionDecl::new(
    "segment_nuclei",
    Contract::Pure2d,
    "Nuclei segmentation that splits touching nuclei: smoothing, threshold, hole filling, distance-transform seeds, watershed, size filter; u16 labels and an objects table.",
)
.with_produces(&[ArtifactDecl::table(
    OBJECTS,
    "per object: ObjectNumber, AreaShape_* (area, centre, bounding box, perimeter, eccentricity, axes, convex area, solidity) and Intensity_* (mean, integrated, min, max) of the input plane",
)])
.with_check(check_segment)
.with_label_output();

/// Runs [`segment_nuclei`] on every plane: the u16 label stack and the per-object table.
pub fn segment_nuclei_stack(stack: &Stack, p: &NucleiParams) -> Result<(Stack, hcsflow_core::Table), FunctionError> {
    const NAME: &str = "segment_nuclei";
    let [n, h, w] = stack.shape();
    let mut rows = Vec::new();
    // The labels go straight into the u16 output, and are measured there.
    let mut labels = StackArray::<u16>::zeros([n, h, w]);
    with_pixels!(Stack, stack, a, T => {
        for z in 0..n {
            let (plane, out) = (a.plane(z), labels.plane_mut(z));
            let count = segment_nuclei_into(plane, h, w, p, out, u32::from(u16::MAX), |l| l as u16)?;
            rows.push((z, measure_objects(out, count, plane, h, w)?));
        }
    });
    Ok((Stack::from(labels), objects_table(&rows, NAME)?))
}

pub(crate) fn register(registry: &mut Registry) {
    registry.add(DISTANCE_TRANSFORM.host(|s, a, _| {
        let [n, h, w] = s.shape();
        let mut out = StackArray::<f32>::zeros([n, h, w]);
        with_pixels!(Stack, s, arr, T => {
            for (src, dst) in arr.planes().zip(out.planes_mut()) {
                dst.copy_from_slice(&distance_transform_edt(&plane_mask(src), h, w, (a.sampling_y, a.sampling_x)));
            }
        });
        Ok(Stack::from(out))
    }));
    registry.add(FILL_HOLES.host(|s, _, _| {
        let [n, h, w] = s.shape();
        let mut out = StackArray::<u8>::zeros([n, h, w]);
        with_pixels!(Stack, s, arr, T => {
            for (src, dst) in arr.planes().zip(out.planes_mut()) {
                for (o, f) in dst.iter_mut().zip(fill_holes(&plane_mask(src), h, w)) {
                    *o = u8::from(f);
                }
            }
        });
        Ok(Stack::from(out))
    }));
    registry.add(CLEAR_BORDER.host(|s, _, _| {
        let [_, h, w] = s.shape();
        Ok(with_pixels!(Stack, s, arr, T => {
            let mut out = arr.clone();
            for dst in out.planes_mut() {
                let mut l = plane_labels(dst);
                clear_border(&mut l, h, w);
                for (d, v) in dst.iter_mut().zip(l) {
                    if v == 0 {
                        *d = T::default();
                    }
                }
            }
            Stack::from(out)
        }))
    }));
    registry.add(FILTER_SIZE.host(|s, a, _| {
        let [n, h, w] = s.shape();
        let (lo, hi) = (a.min_area.max(0) as u64, a.max_area.max(0) as u64);
        with_pixels!(Stack, s, arr, T => labels_stack(n, h, w, "filter_size", |z| Ok(filter_size(&plane_labels(arr.plane(z)), h, w, lo, hi))))
    }));
    registry
        .add(WATERSHED.host(|s, a, _| watershed_stack(s, if a.connectivity == "4" { Connectivity::Four } else { Connectivity::Eight })));
    registry.add(SEGMENT_NUCLEI.host(|s, a, ctx| {
        let (labels, table) = segment_nuclei_stack(s, &a.params()?)?;
        ctx.produce(OBJECTS, table);
        Ok(labels)
    }));
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn queue_pops_by_cost_then_first_in() {
        // Pushes never below the last cost popped, as in the flood; equal costs
        // leave in the order they came, also across the radix heap's buckets.
        let mut q = Queue::new();
        for (i, c) in [9u32, 1, 5, 1, 9, 0x8000_0001, 5].into_iter().enumerate() {
            q.push(c, i as u32);
        }
        let mut order = Vec::new();
        while let Some((c, i)) = q.pop() {
            if i == 1 {
                q.push(1, 10);
                q.push(5, 11);
                q.push(0x8000_0001, 12);
            }
            order.push((c, i));
        }
        let expected = [(1, 1), (1, 3), (1, 10), (5, 2), (5, 6), (5, 11), (9, 0), (9, 4), (0x8000_0001, 5), (0x8000_0001, 12)];
        assert_eq!(order, expected);
        assert!(q.pop().is_none());
    }

    #[test]
    fn ordered_bits_keep_the_order_of_floats() {
        let v = [f32::NEG_INFINITY, -3.5, -1e-30, -0.0, 0.0, 1e-30, 2.0, f32::INFINITY];
        for w in v.windows(2) {
            assert!(ordered_bits(w[0]) <= ordered_bits(w[1]), "{} {}", w[0], w[1]);
            assert_eq!(ordered_bits(w[0]) == ordered_bits(w[1]), w[0] == w[1], "{} {}", w[0], w[1]);
        }
    }

    #[test]
    fn fill_holes_by_runs_equals_the_scanline_fill() {
        // Random masks of several densities and shapes (holes of every size,
        // nested, touching the border or not).
        let mut rng = hcsflow_testkit::Rng::from_state(0x2545_f491_4f6c_dd1d);
        let mut unit = || rng.unit();
        for &(h, w) in &[(1usize, 1usize), (1, 37), (29, 1), (40, 40), (33, 70), (64, 17)] {
            for density in [0.2, 0.45, 0.6, 0.8] {
                let mask: Vec<bool> = (0..h * w).map(|_| unit() < density).collect();
                assert_eq!(fill_holes(&mask, h, w), fill_holes_scanline(&mask, h, w), "{h}x{w} density {density}");
            }
        }
    }

    /// The smallest and largest nonzero label `markers_run` gives for pixels
    /// `x0..x1` of row `y`: what `marker_span` must say without writing them.
    fn span_of_run(plane: &impl FloodPlane, y: usize, x0: usize, x1: usize) -> Option<(u32, u32)> {
        let mut marks = vec![0u32; x1 - x0];
        plane.markers_run(y, x0, &mut marks);
        let nonzero = marks.iter().copied().filter(|&l| l != 0);
        Some((nonzero.clone().min()?, nonzero.max()?))
    }

    #[test]
    fn marker_span_is_the_span_of_the_run_markers() {
        let mut rng = hcsflow_testkit::Rng::from_state(0x5851_f42d_4c95_7f2d);
        let (h, w) = (6usize, 45usize);
        // Labels mostly 0, a few of a handful of values, some large.
        let mut label = || match rng.below(10) {
            0..=5 => 0u32,
            6 => u32::MAX - 1,
            k => k as u32 - 6,
        };
        let labels: Vec<u32> = (0..h * w).map(|_| label()).collect();
        // The same as f32 pixels, with what truncates to them or to 0: NaN,
        // negatives, fractions.
        let floats: Vec<f32> = labels
            .iter()
            .enumerate()
            .map(|(i, &l)| match (l, i % 4) {
                (0, 0) => f32::NAN,
                (0, 1) => -3.5,
                (0, 2) => 0.75,
                (l, 3) if l < 10 => l as f32 + 0.5,
                (l, _) => l as f32,
            })
            .collect();
        let words: Vec<u16> = labels.iter().map(|&l| l.min(65535) as u16).collect();
        let (image, mask) = (vec![0f32; h * w], vec![true; h * w]);
        let exact = WatershedPlanes { w, image: &image, markers: &labels, mask: Some(&mask) };
        let f32s = StackPlanes { w, image: &floats, markers: &floats, mask: None };
        let u16s = StackPlanes { w, image: &words, markers: &words, mask: None };
        for y in 0..h {
            for x0 in 0..w {
                for x1 in x0 + 1..=w {
                    assert_eq!(exact.marker_span(y, x0, x1), span_of_run(&exact, y, x0, x1), "u32 row {y}, {x0}..{x1}");
                    assert_eq!(f32s.marker_span(y, x0, x1), span_of_run(&f32s, y, x0, x1), "f32 row {y}, {x0}..{x1}");
                    assert_eq!(u16s.marker_span(y, x0, x1), span_of_run(&u16s, y, x0, x1), "u16 row {y}, {x0}..{x1}");
                }
            }
        }
        // The seeds of segment_nuclei: maxima of a random plane.
        let dist: Vec<f32> = (0..h * w).map(|_| rng.below(5) as f32).collect();
        let mut rowmax = vec![0f32; h * w];
        let seeds = maxima_runs(&dist, h, w, 1, &mut rowmax);
        let nuclei = NucleiPlanes { w, mask: &mask, dist: &dist, seeds: &seeds };
        for y in 0..h {
            for x0 in 0..w {
                for x1 in x0 + 1..=w {
                    assert_eq!(nuclei.marker_span(y, x0, x1), span_of_run(&nuclei, y, x0, x1), "seeds row {y}, {x0}..{x1}");
                }
            }
        }
    }

    #[test]
    fn components_of_one_label_are_that_label_whole() {
        // A component holding markers of one label (in two places) is all of
        // it; one holding two labels is flooded; one holding none is not
        // reached. The flood's labels equal a pixel-by-pixel transcription's
        // (skimage's algorithm, which the oracle test checks).
        let (h, w) = (5usize, 9usize);
        #[rustfmt::skip]
        let mask = [
            1, 1, 1, 0, 1, 1, 1, 0, 1,
            1, 0, 1, 0, 1, 1, 1, 0, 1,
            1, 1, 1, 0, 0, 0, 0, 0, 0,
            0, 0, 0, 0, 1, 1, 1, 1, 1,
            1, 1, 0, 0, 1, 1, 1, 1, 1,
        ].map(|m| m == 1);
        let mut markers = vec![0u32; h * w];
        markers[0] = 7; // first component: label 7 twice
        markers[2 * w + 2] = 7;
        markers[4] = 2; // second: labels 2 and 3
        markers[w + 6] = 3;
        markers[3 * w + 4] = 5; // fourth: label 5 (third and fifth: none)
        let image: Vec<f32> = (0..h * w).map(|i| ((i * 7) % 5) as f32).collect();
        let labels = watershed(&image, &markers, Some(&mask), h, w, Connectivity::Four).unwrap();
        for y in 0..h {
            for x in 0..w {
                let expected = match (mask[y * w + x], y, x) {
                    (false, _, _) => 0,
                    (true, 0..=2, 0..=2) => 7,
                    (true, 0..=1, 4..=6) => labels[y * w + x], // flooded: 2 or 3
                    (true, 3..=4, 4..=8) => 5,
                    _ => 0,
                };
                assert_eq!(labels[y * w + x], expected, "({y}, {x})");
            }
        }
        let split: Vec<u32> = [4, 5, 6, w + 4, w + 5, w + 6].iter().map(|&i| labels[i]).collect();
        assert!(split.contains(&2) && split.contains(&3), "{split:?}");
        // A NaN in a component of one label is still refused, also in a stack.
        let mut nan = image.clone();
        nan[w] = f32::NAN;
        assert!(watershed(&nan, &markers, Some(&mask), h, w, Connectivity::Four).is_err());
        let planes: Vec<f32> =
            nan.iter().copied().chain(markers.iter().map(|&l| l as f32)).chain(mask.iter().map(|&m| f32::from(u8::from(m)))).collect();
        let stack = Stack::from(StackArray::from_vec([3, h, w], planes.clone()).unwrap());
        let e = watershed_stack(&stack, Connectivity::Four).unwrap_err();
        assert!(e.to_string().contains("NaN"), "{e}");
        // Without it the stack's labels are the plane's.
        let mut planes = planes;
        planes[w] = 0.0;
        let stack = Stack::from(StackArray::from_vec([3, h, w], planes).unwrap());
        let mut fixed = image.clone();
        fixed[w] = 0.0;
        let expected = watershed(&fixed, &markers, Some(&mask), h, w, Connectivity::Four).unwrap();
        let got = watershed_stack(&stack, Connectivity::Four).unwrap();
        let got: Vec<u32> = with_pixels!(Stack, &got, a, T => a.plane(0).iter().map(|v| v.to_f32() as u32).collect());
        assert_eq!(got, expected);
    }

    /// The largest value of `v` (`h × w`) over the square of half-side `r`
    /// around `(y, x)`, clipped to the plane, pixel by pixel.
    fn square_max(v: &[f32], h: usize, w: usize, r: usize, y: usize, x: usize) -> f32 {
        let mut m = f32::NEG_INFINITY;
        for yy in y.saturating_sub(r)..=(y + r).min(h - 1) {
            for xx in x.saturating_sub(r)..=(x + r).min(w - 1) {
                m = m.max(v[yy * w + xx]);
            }
        }
        m
    }

    #[test]
    fn square_maximum_equals_the_window_scan() {
        // Sizes below, at and above the window (2r + 1), radii whose windows are
        // and are not a power of two long, values with ties.
        let mut rng = hcsflow_testkit::Rng::from_state(0x9e37_79b9_7f4a_7c15);
        let mut next = || (rng.next_u64() >> 40) % 7;
        for &(h, w) in &[(1usize, 1usize), (1, 23), (17, 1), (5, 9), (31, 40), (70, 33)] {
            let v: Vec<f32> = (0..h * w).map(|_| next() as f32 * 0.5).collect();
            for r in [1usize, 2, 3, 4, 7, 8, 40] {
                let (mut out, mut a, mut b) = (vec![0f32; w], vec![0f32; w], vec![0f32; w]);
                let mut rowmax = vec![0f32; h * w];
                for y in 0..h {
                    row_window_max(&v[y * w..(y + 1) * w], r, &mut out, &mut a, &mut b);
                    let expected: Vec<f32> = (0..w).map(|x| square_max(&v[y * w..(y + 1) * w], 1, w, r, 0, x)).collect();
                    assert_eq!(out, expected, "row {y} of {h}x{w}, r {r}");
                    rowmax[y * w..(y + 1) * w].copy_from_slice(&out);
                }
                // Bands of rows as maxima_runs takes them, and one band of every row.
                for band in [3usize, FLOOD_BAND, h] {
                    let mut columns = ColumnMax::default();
                    for b in 0..h.div_ceil(band) {
                        columns.each_row(&rowmax, h, w, r, b * band..((b + 1) * band).min(h), |y, m| {
                            let expected: Vec<f32> = (0..w).map(|x| square_max(&v, h, w, r, y, x)).collect();
                            assert_eq!(m, expected, "row {y} of {h}x{w}, r {r}, bands of {band}");
                        });
                    }
                }
            }
        }
    }

    #[test]
    fn maxima_markers_are_the_labelled_square_maxima() {
        // Pixels > 0 that equal their square's maximum, 8-connected pieces
        // numbered in raster order: label_mask of that mask.
        let mut rng = hcsflow_testkit::Rng::from_state(0x2545_f491_4f6c_dd1d);
        let mut next = || (rng.next_u64() >> 40) % 5;
        for &(h, w) in &[(1usize, 9usize), (12, 1), (40, 37), (65, 80)] {
            let v: Vec<f32> = (0..h * w).map(|_| next() as f32).collect();
            for r in [1usize, 2, 4, 9] {
                let peaks: Vec<bool> = (0..h * w).map(|i| v[i] > 0.0 && square_max(&v, h, w, r, i / w, i % w) <= v[i]).collect();
                let expected = label_mask(&peaks, h, w, Connectivity::Eight);
                let got = maxima_markers(&v, h, w, r);
                assert_eq!((got.count, &got.labels), (expected.count, &expected.labels), "{h}x{w}, r {r}");
            }
        }
    }

    #[test]
    fn fill_holes_keeps_border_background() {
        #[rustfmt::skip]
        let m = [
            0, 1, 1, 1, 0,
            0, 1, 0, 1, 0,
            0, 1, 1, 1, 0,
            0, 0, 0, 0, 0,
        ];
        let mask: Vec<bool> = m.iter().map(|&v| v == 1).collect();
        let f = fill_holes(&mask, 4, 5);
        assert!(f[7]);
        assert_eq!(f.iter().filter(|&&v| v).count(), 9);
    }
}
