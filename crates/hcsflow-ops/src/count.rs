//! Cell counting: scale-space LoG blob detection ([`blob_log`], scikit-image
//! `feature.blob_log` semantics) and threshold + label + area filter
//! ([`count_cells`] with `CountMethod::Threshold`); per-image counts and per-object tables.
//!
//! # blob_log
//! Same definition as skimage 0.26 `blob_log(image, min_sigma, max_sigma,
//! num_sigma, threshold, overlap)` (linear σ scale, `threshold_rel=None`,
//! `exclude_border=False`):
//! 1. σ_i = linspace(min_sigma, max_sigma, num_sigma) (f32);
//! 2. cube_i = −σ_i² · gaussian_laplace(image, σ_i) (scipy: order-2 Gaussian along Y
//!    then order-0 along X, plus order-0 along Y then order-2 along X; truncate 4,
//!    `mode="reflect"`), f32;
//! 3. peaks: points of the (Y, X, σ) cube equal to the maximum of their 3×3×3
//!    neighbourhood (clipped at the cube's borders) and `> threshold`; none if the
//!    cube is constant; sorted by decreasing value (ties in raster (y, x, σ) order);
//! 4. pruning: for every pair of blobs closer than 2·√2·max σ whose disk overlap
//!    (radius σ√2) exceeds `overlap`, the smaller σ is dropped (on equal σ, the
//!    first of the pair). skimage visits the pairs in Python-set order, which is not
//!    reproducible; we visit them in (i, j) order — the kept set can differ only in
//!    chains of three or more mutually overlapping blobs.
//!
//! The image is scaled as skimage's `img_as_float`: u8 / 255, u16 / 65535, f32 as is
//! (skimage computes integer input in float64, we in f32: the LoG values agree to
//! ~1e-6 relative, so detections agree except for peaks within that of the
//! threshold or of a neighbour — checked by the oracle tests).
//!
//! # Artifacts
//! [`count_cells`] returns typed tables ([`CountTable`], [`ObjectTable`], serde
//! `Serialize` and `to_csv()`) and a u16 label image. The registered function
//! `count_cells` (`pure_2d`) returns the label image; once the pipeline engine
//! carries special outputs, its registration will declare `cell_counts` and
//! `objects` outputs filled from [`CellCounts::counts`] / [`CellCounts::objects`]
//! and written as CSV beside the images.

use std::fmt::Write as _;

use hcsflow_core::StackArray;
use hcsflow_core::{
    with_pixels, ArgProblem, ArtifactDecl, Cell, Contract, DType, FunctionDecl, FunctionError, Pixel, Registry, Stack, StackShape, Table,
};
use rayon::prelude::*;
use serde::Serialize;

use crate::convolve::{correlate_separable_pair_into, Boundary, Kernel1d};
use crate::label::{label_mask, Connectivity, Labels};
use crate::segment::keep_sizes;
use crate::threshold::{threshold_value, ThresholdMethod};

/// One detected blob: centre (row, column) and scale σ.
#[derive(Debug, Clone, Copy, PartialEq, Serialize)]
pub struct Blob {
    pub y: f64,
    pub x: f64,
    pub sigma: f64,
}

/// Parameters of [`blob_log`] (defaults: OpenHCS / benchmark values).
#[derive(Debug, Clone, Copy, PartialEq, Serialize)]
pub struct BlobLogParams {
    pub min_sigma: f64,
    pub max_sigma: f64,
    pub num_sigma: usize,
    pub threshold: f64,
    pub overlap: f64,
}

impl Default for BlobLogParams {
    fn default() -> Self {
        BlobLogParams { min_sigma: 1.0, max_sigma: 10.0, num_sigma: 10, threshold: 0.1, overlap: 0.5 }
    }
}

/// One row of a per-image count table.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct CountRow {
    /// Plane index in the stack.
    pub image: usize,
    pub count: usize,
}

/// Per-image counts.
#[derive(Debug, Clone, PartialEq, Default, Serialize)]
pub struct CountTable {
    pub rows: Vec<CountRow>,
}

impl CountTable {
    /// `image,count` lines with a header.
    pub fn to_csv(&self) -> String {
        let mut s = String::from("image,count\n");
        for r in &self.rows {
            let _ = writeln!(s, "{},{}", r.image, r.count);
        }
        s
    }
}

/// One object: its label in the label image, centroid, area and mean intensity.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct ObjectRow {
    pub image: usize,
    pub label: u32,
    /// Centroid row (pixels). For blobs: the detected centre.
    pub y: f64,
    /// Centroid column (pixels).
    pub x: f64,
    /// Pixel count of the object in the label image.
    pub area: u64,
    /// Mean input value over the object's pixels (input units).
    pub mean_intensity: f64,
    /// Blob scale σ (blob_log only).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub sigma: Option<f64>,
}

/// Per-object measurements.
#[derive(Debug, Clone, PartialEq, Default, Serialize)]
pub struct ObjectTable {
    pub rows: Vec<ObjectRow>,
}

impl ObjectTable {
    /// CSV with a header: `image,label,y,x,area,mean_intensity,sigma` (sigma empty when absent).
    pub fn to_csv(&self) -> String {
        let mut s = String::from("image,label,y,x,area,mean_intensity,sigma\n");
        for r in &self.rows {
            let sigma = r.sigma.map(|v| v.to_string()).unwrap_or_default();
            let _ = writeln!(s, "{},{},{},{},{},{},{}", r.image, r.label, r.y, r.x, r.area, r.mean_intensity, sigma);
        }
        s
    }
}

/// Result of [`count_cells`].
#[derive(Debug, Clone, PartialEq)]
pub struct CellCounts {
    /// u16 label image per plane (0 = background).
    pub labels: Stack,
    pub counts: CountTable,
    pub objects: ObjectTable,
}

/// The artifact of per-image counts `count_cells` produces in a pipeline.
pub const COUNTS: &str = "counts";
/// The artifact of per-object measurements `count_cells` produces in a pipeline.
pub const OBJECTS: &str = "objects";

impl CellCounts {
    /// The counts and objects as artifact tables, rows tagged with their plane.
    pub fn tables(&self) -> Result<(Table, Table), FunctionError> {
        let fail = |e: hcsflow_core::artifact::RowLengthError| FunctionError::failed("count_cells", e);
        let mut counts = Table::new(["count"]);
        for r in &self.counts.rows {
            counts.push(Some(r.image), vec![Cell::from(r.count)]).map_err(fail)?;
        }
        let mut objects = Table::new(["label", "y", "x", "area", "mean_intensity", "sigma"]);
        for r in &self.objects.rows {
            objects
                .push(
                    Some(r.image),
                    vec![
                        Cell::from(r.label),
                        Cell::from(r.y),
                        Cell::from(r.x),
                        Cell::Int(r.area as i64),
                        Cell::from(r.mean_intensity),
                        Cell::from(r.sigma),
                    ],
                )
                .map_err(fail)?;
        }
        Ok((counts, objects))
    }
}

/// `−σ² · gaussian_laplace(image, σ)` of one plane into `out` (f32, scipy's
/// operation order: order-2 Gaussian along Y then order-0 along X, plus order-0
/// along Y then order-2 along X, then `−(a + b)·σ²`), both terms in one sweep of
/// the shared separable correlation. `out` is reused across scales.
fn scaled_log_into(image: &[f32], h: usize, w: usize, sigma: f32, out: &mut Vec<f32>) {
    let s = sigma as f64;
    let k0 = Kernel1d::gaussian(s, 4.0);
    let k2 = Kernel1d::new(gaussian_d2_weights(s, k0.radius()));
    let s2 = sigma * sigma;
    out.resize(h * w, 0.0);
    correlate_separable_pair_into(image, h, w, (&k2, &k0), (&k0, &k2), Boundary::Reflect, out, move |a, b| -(a + b) * s2);
}

/// scipy.ndimage `_gaussian_kernel1d(sigma, order=2, radius)`: `(x²/σ⁴ − 1/σ²) · φ(x)/Σφ`,
/// computed in f64 and rounded to f32.
fn gaussian_d2_weights(sigma: f64, radius: usize) -> Vec<f32> {
    let r = radius as i64;
    let s2 = sigma * sigma;
    let phi: Vec<f64> = (-r..=r).map(|x| (-0.5 / s2 * (x * x) as f64).exp()).collect();
    let sum: f64 = phi.iter().sum();
    (-r..=r).zip(&phi).map(|(x, p)| (((x * x) as f64 / (s2 * s2) - 1.0 / s2) * (p / sum)) as f32).collect()
}

/// skimage's `_blob_overlap` for 2D blobs (f64): overlap area over the smaller disk's area.
fn blob_overlap(a: &Blob, b: &Blob) -> f64 {
    let root = std::f64::consts::SQRT_2;
    if a.sigma == 0.0 && b.sigma == 0.0 {
        return 0.0;
    }
    let (max_sigma, r1, r2) = if a.sigma > b.sigma { (a.sigma, 1.0, b.sigma / a.sigma) } else { (b.sigma, a.sigma / b.sigma, 1.0) };
    let d = (((a.y - b.y) / (max_sigma * root)).powi(2) + ((a.x - b.x) / (max_sigma * root)).powi(2)).sqrt();
    if d > r1 + r2 {
        return 0.0;
    }
    if d <= (r1 - r2).abs() {
        return 1.0;
    }
    let ratio1 = ((d * d + r1 * r1 - r2 * r2) / (2.0 * d * r1)).clamp(-1.0, 1.0);
    let ratio2 = ((d * d + r2 * r2 - r1 * r1) / (2.0 * d * r2)).clamp(-1.0, 1.0);
    let (acos1, acos2) = (ratio1.acos(), ratio2.acos());
    let a_ = -d + r2 + r1;
    let b_ = d - r2 + r1;
    let c_ = d + r2 - r1;
    let d_ = d + r2 + r1;
    let area = r1 * r1 * acos1 + r2 * r2 * acos2 - 0.5 * (a_ * b_ * c_ * d_).abs().sqrt();
    area / (std::f64::consts::PI * r1.min(r2).powi(2))
}

fn validate_blob_params(p: &BlobLogParams) -> Result<(), FunctionError> {
    const NAME: &str = "blob_log";
    let ok = p.min_sigma.is_finite()
        && p.max_sigma.is_finite()
        && p.min_sigma > 0.0
        && p.max_sigma >= p.min_sigma
        && p.max_sigma <= 200.0
        && p.num_sigma >= 1
        && p.num_sigma <= 100
        && p.threshold.is_finite()
        && (0.0..=1.0).contains(&p.overlap);
    if ok {
        Ok(())
    } else {
        Err(FunctionError::invalid(
            NAME,
            format!("invalid parameters {p:?}: need 0 < min_sigma ≤ max_sigma ≤ 200, 1 ≤ num_sigma ≤ 100, 0 ≤ overlap ≤ 1"),
        ))
    }
}

/// Detects blobs in one `h × w` plane (already scaled like `img_as_float`), in
/// skimage's output order. See the module docs for the exact definition.
pub fn blob_log(image: &[f32], h: usize, w: usize, params: &BlobLogParams) -> Result<Vec<Blob>, FunctionError> {
    validate_blob_params(params)?;
    if image.len() != h * w {
        return Err(FunctionError::invalid("blob_log", format!("{} pixels for a {h}×{w} image", image.len())));
    }
    if image.iter().any(|v| v.is_nan()) {
        return Err(FunctionError::invalid("blob_log", "the image contains NaN"));
    }
    if h == 0 || w == 0 {
        return Ok(Vec::new());
    }
    let n = params.num_sigma;
    let sigmas: Vec<f32> = (0..n)
        .map(|i| {
            if n == 1 {
                params.min_sigma as f32
            } else {
                (params.min_sigma + (params.max_sigma - params.min_sigma) * i as f64 / (n - 1) as f64) as f32
            }
        })
        .collect();
    let thr = params.threshold as f32;
    // Sliding window of three scales; peaks at scale i need scales i-1..=i+1.
    let mut cube: Vec<Option<Vec<f32>>> = vec![None; n];
    // Scale buffers leaving the window are recycled (no fresh 4·h·w-byte pages per scale).
    let mut spare: Vec<Vec<f32>> = Vec::new();
    // skimage reports no peak when every cube value equals its neighbourhood
    // maximum, i.e. when the cube is constant.
    let mut first: Option<f32> = None;
    let mut constant = true;
    let mut peaks: Vec<(f32, usize, usize, usize)> = Vec::new(); // (value, y, x, s)
    for i in 0..n {
        for j in i..(i + 2).min(n) {
            if cube[j].is_none() {
                let mut c = spare.pop().unwrap_or_default();
                scaled_log_into(image, h, w, sigmas[j], &mut c);
                let f0 = *first.get_or_insert(c[0]);
                constant = constant && c.iter().all(|&v| v == f0);
                cube[j] = Some(c);
            }
        }
        if i >= 2 {
            spare.extend(cube[i - 2].take());
        }
        let cur = cube[i].as_deref().unwrap_or(&[]);
        let lo = i.saturating_sub(1);
        let hi = (i + 1).min(n - 1);
        let found: Vec<(f32, usize, usize, usize)> = (0..h)
            .into_par_iter()
            .flat_map_iter(|y| {
                let cube = &cube;
                // Columns above the threshold, gathered without branches (most
                // pixels are below it); only those get the neighbourhood test.
                let row = &cur[y * w..(y + 1) * w];
                let mut above = vec![0u32; w];
                let mut n_above = 0;
                for (x, &v) in row.iter().enumerate() {
                    above[n_above] = x as u32;
                    n_above += usize::from(v > thr); // (no NaN: the input was checked)
                }
                above.truncate(n_above);
                above.into_iter().filter_map(move |x| {
                    let x = x as usize;
                    let v = cur[y * w + x];
                    for c in &cube[lo..=hi] {
                        let c = c.as_deref().unwrap_or(&[]);
                        for yy in y.saturating_sub(1)..=(y + 1).min(h - 1) {
                            for xx in x.saturating_sub(1)..=(x + 1).min(w - 1) {
                                if c[yy * w + xx] > v {
                                    return None;
                                }
                            }
                        }
                    }
                    Some((v, y, x, i))
                })
            })
            .collect();
        peaks.extend(found);
    }
    if constant {
        return Ok(Vec::new());
    }
    // Decreasing value; ties in raster (y, x, s) order (numpy's stable argsort of nonzero()).
    peaks.sort_by(|a, b| b.0.total_cmp(&a.0).then((a.1, a.2, a.3).cmp(&(b.1, b.2, b.3))));
    let mut blobs: Vec<Blob> = peaks.iter().map(|&(_, y, x, s)| Blob { y: y as f64, x: x as f64, sigma: sigmas[s] as f64 }).collect();
    prune(&mut blobs, params.overlap);
    Ok(blobs.into_iter().filter(|b| b.sigma > 0.0).collect())
}

/// skimage `_prune_blobs` with pairs visited in (i, j) order; zeroes σ of dropped blobs.
fn prune(blobs: &mut [Blob], overlap: f64) {
    let Some(max_sigma) = blobs.iter().map(|b| b.sigma).reduce(f64::max) else { return };
    let dist = 2.0 * max_sigma * std::f64::consts::SQRT_2;
    // Grid of cell size `dist` for the neighbour search (query_pairs: distance ≤ dist).
    let cell = dist.max(1.0);
    let mut grid: std::collections::HashMap<(i64, i64), Vec<usize>> = std::collections::HashMap::new();
    for (i, b) in blobs.iter().enumerate() {
        grid.entry(((b.y / cell).floor() as i64, (b.x / cell).floor() as i64)).or_default().push(i);
    }
    let mut pairs: Vec<(usize, usize)> = Vec::new();
    for (i, b) in blobs.iter().enumerate() {
        let (cy, cx) = ((b.y / cell).floor() as i64, (b.x / cell).floor() as i64);
        for dy in -1..=1 {
            for dx in -1..=1 {
                if let Some(list) = grid.get(&(cy + dy, cx + dx)) {
                    for &j in list {
                        if j > i {
                            let o = &blobs[j];
                            if ((b.y - o.y).powi(2) + (b.x - o.x).powi(2)).sqrt() <= dist {
                                pairs.push((i, j));
                            }
                        }
                    }
                }
            }
        }
    }
    pairs.sort_unstable();
    for (i, j) in pairs {
        let (a, b) = (blobs[i], blobs[j]);
        if blob_overlap(&a, &b) > overlap {
            if a.sigma > b.sigma {
                blobs[j].sigma = 0.0;
            } else {
                blobs[i].sigma = 0.0;
            }
        }
    }
}

/// A plane as f32 scaled like skimage's `img_as_float` (u8/255, u16/65535, f32 as is).
pub fn as_float_image<T: Pixel>(plane: &[T]) -> Vec<f32> {
    let scale = match T::DTYPE {
        DType::U8 => 1.0 / 255.0,
        DType::U16 => 1.0 / 65535.0,
        DType::F32 => 1.0,
    };
    plane.iter().map(|v| if T::DTYPE == DType::F32 { v.to_f32() } else { (v.to_f32() as f64 * scale) as f32 }).collect()
}

/// A plane rescaled to [0, 1] by its min and max (f64 arithmetic, rounded to f32);
/// a constant plane becomes zeros.
pub fn min_max_image<T: Pixel>(plane: &[T]) -> Vec<f32> {
    let (lo, hi) = plane.iter().fold((f64::INFINITY, f64::NEG_INFINITY), |(l, h), v| {
        let v = v.to_f32() as f64;
        (l.min(v), h.max(v))
    });
    let span = hi - lo;
    plane.iter().map(|v| if span > 0.0 { ((v.to_f32() as f64 - lo) / span) as f32 } else { 0.0 }).collect()
}

/// How [`count_cells`] finds objects.
#[derive(Debug, Clone, Copy, PartialEq)]
pub enum CountMethod {
    /// [`blob_log`] on each plane; `normalize`: rescale the plane to [0, 1] by its own
    /// min and max first (what the peer benchmark and typical OpenHCS pipelines do, so
    /// `threshold` is relative to the plane's dynamic range); otherwise scale like
    /// skimage's `img_as_float` ([`as_float_image`]).
    BlobLog {
        params: BlobLogParams,
        normalize: bool,
    },
    Threshold {
        method: ThresholdMethod,
        connectivity: Connectivity,
        min_area: u64,
        max_area: u64,
    },
}

/// Measures labelled objects: area, centroid, mean intensity (skimage regionprops
/// `area`, `centroid`, `intensity_mean`), in label order.
fn measure<T: Pixel>(image: usize, labels: &Labels, plane: &[T]) -> Vec<ObjectRow> {
    let n = labels.count as usize;
    let mut acc = vec![(0u64, 0f64, 0f64, 0f64); n + 1];
    for (i, &l) in labels.labels.iter().enumerate() {
        if l == 0 {
            continue;
        }
        let a = &mut acc[l as usize];
        a.0 += 1;
        a.1 += (i / labels.width) as f64;
        a.2 += (i % labels.width) as f64;
        a.3 += plane[i].to_f32() as f64;
    }
    acc.iter()
        .enumerate()
        .skip(1)
        .map(|(l, &(c, sy, sx, si))| {
            let cf = c.max(1) as f64;
            ObjectRow { image, label: l as u32, y: sy / cf, x: sx / cf, area: c, mean_intensity: si / cf, sigma: None }
        })
        .collect()
}

/// Counts objects in every plane.
///
/// - `BlobLog`: [`blob_log`] on the plane (min–max normalised or `img_as_float`-scaled,
///   see [`CountMethod::BlobLog`]); each blob is painted
///   into the label image as the disk of radius σ√2 around its centre (pixels with
///   `dy² + dx² ≤ 2σ²`, not already taken by an earlier, brighter blob); the object
///   row has the blob's centre and σ, the painted area and the mean input value over it.
/// - `Threshold`: mask `value > threshold`, connected components, objects with
///   `min_area ≤ area ≤ max_area` kept and relabelled 1.. in raster order; rows as
///   skimage `regionprops` (`centroid`, `area`, `intensity_mean`).
///
/// Contract: `pure_2d` (u16 label image per plane, error above 65,535 objects).
pub fn count_cells(stack: &Stack, method: &CountMethod) -> Result<CellCounts, FunctionError> {
    const NAME: &str = "count_cells";
    let [n, h, w] = stack.shape();
    let mut labels_out = StackArray::<u16>::zeros([n, h, w]);
    let mut counts = CountTable::default();
    let mut objects = ObjectTable::default();
    with_pixels!(Stack, stack, a, T => {
        for z in 0..n {
            let plane = a.plane(z);
            let (labels, sigmas) = match method {
                CountMethod::BlobLog { params, normalize } => {
                    let img = if *normalize { min_max_image(plane) } else { as_float_image(plane) };
                    let blobs = blob_log(&img, h, w, params)?;
                    (paint_blobs(&blobs, h, w), Some(blobs))
                }
                CountMethod::Threshold { method, connectivity, min_area, max_area } => {
                    let t = threshold_value(plane, *method)?;
                    let mask: Vec<bool> = plane.iter().map(|v| v.to_f32() as f64 > t).collect();
                    let l = label_mask(&mask, h, w, *connectivity);
                    (keep_sizes(l.labels, h, w, *min_area, *max_area), None)
                }
            };
            let mut rows = measure(z, &labels, plane);
            if let Some(blobs) = sigmas {
                for (r, b) in rows.iter_mut().zip(&blobs) {
                    r.y = b.y;
                    r.x = b.x;
                    r.sigma = Some(b.sigma);
                }
            }
            counts.rows.push(CountRow { image: z, count: rows.len() });
            objects.rows.extend(rows);
            labels_out.plane_mut(z).copy_from_slice(&labels.to_u16(NAME)?);
        }
    });
    let labels = Stack::from(labels_out);
    Ok(CellCounts { labels, counts, objects })
}

fn paint_blobs(blobs: &[Blob], h: usize, w: usize) -> Labels {
    let mut labels = vec![0u32; h * w];
    for (k, b) in blobs.iter().enumerate() {
        let r2 = 2.0 * b.sigma * b.sigma;
        let r = r2.sqrt().floor() as i64;
        let (cy, cx) = (b.y as i64, b.x as i64);
        for y in (cy - r).max(0)..=(cy + r).min(h as i64 - 1) {
            for x in (cx - r).max(0)..=(cx + r).min(w as i64 - 1) {
                let d2 = ((y - cy).pow(2) + (x - cx).pow(2)) as f64;
                let i = y as usize * w + x as usize;
                if d2 <= r2 && labels[i] == 0 {
                    labels[i] = k as u32 + 1;
                }
            }
        }
    }
    Labels { height: h, width: w, labels, count: blobs.len() as u32 }
}

hcsflow_core::function_args! {
    /// The arguments of [`COUNT_CELLS`].
    pub struct CountCellsArgs {
        method: String = choice("blob_log", &["blob_log", "threshold"], "detector"),
        min_sigma: f64 = float(1.0, Some(0.1), Some(200.0), "blob_log: smallest σ (pixels)"),
        max_sigma: f64 = float(10.0, Some(0.1), Some(200.0), "blob_log: largest σ (pixels)"),
        num_sigma: i64 = int(10, Some(1), Some(100), "blob_log: number of σ between min and max (linear)"),
        threshold: f64 = float(0.1, None, None, "blob_log: absolute threshold on −σ²·LoG of the (normalised) image"),
        normalize: bool = bool(true, "blob_log: rescale each plane to [0, 1] by its min and max first (false: skimage img_as_float scaling)"),
        overlap: f64 = float(0.5, Some(0.0), Some(1.0), "blob_log: overlap fraction above which the smaller blob is dropped"),
        threshold_method: String = choice("otsu", &["otsu", "li", "manual"], "threshold: how the threshold is chosen"),
        threshold_value: f64 = float(0.0, None, None, "threshold: the value for threshold_method=manual (pixel units)"),
        min_area: i64 = int(10, Some(0), None, "threshold: smallest object kept (pixels)"),
        max_area: i64 = int(100_000, Some(0), None, "threshold: largest object kept (pixels)"),
    }
}

impl CountCellsArgs {
    /// The detector and its parameters these arguments choose.
    pub fn count_method(&self) -> Result<CountMethod, FunctionError> {
        match self.method.as_str() {
            "blob_log" => Ok(CountMethod::BlobLog {
                params: BlobLogParams {
                    min_sigma: self.min_sigma,
                    max_sigma: self.max_sigma,
                    num_sigma: self.num_sigma.max(1) as usize,
                    threshold: self.threshold,
                    overlap: self.overlap,
                },
                normalize: self.normalize,
            }),
            "threshold" => Ok(CountMethod::Threshold {
                method: ThresholdMethod::from_args(&self.threshold_method, self.threshold_value)
                    .ok_or_else(|| FunctionError::failed("count_cells", "unknown threshold_method"))?,
                connectivity: Connectivity::Eight,
                min_area: self.min_area.max(0) as u64,
                max_area: self.max_area.max(0) as u64,
            }),
            other => Err(FunctionError::failed("count_cells", format!("unknown method '{other}'"))),
        }
    }
}

/// `count_cells`' check: blob_log's σ range is not empty (the other
/// parameters of [`validate_blob_params`] are argument ranges).
fn check_count(args: &CountCellsArgs, _: &StackShape) -> Result<(), ArgProblem> {
    let (min, max) = (args.min_sigma, args.max_sigma);
    if args.method == "blob_log" && min > max {
        return Err(ArgProblem::new(
            "min_sigma",
            format!("min_sigma ({min}) is larger than max_sigma ({max})"),
            "make min_sigma <= max_sigma",
        ));
    }
    Ok(())
}

pub static COUNT_CELLS: FunctionDecl<CountCellsArgs> = FunctionDecl::new(
    "count_cells",
    Contract::Pure2d,
    "Cell counting per plane: skimage blob_log (scale-space LoG) or threshold + label + area filter; returns the u16 label image, counts and objects as artifacts.",
)
.with_produces(&[
    ArtifactDecl::table(COUNTS, "per image: count"),
    ArtifactDecl::table(OBJECTS, "per object: label, y, x (centroid or blob centre, px), area (px), mean_intensity, sigma (blob_log)"),
])
.with_check(check_count)
.with_label_output();

pub(crate) fn register(registry: &mut Registry) {
    registry.add(COUNT_CELLS.host(|s, args, ctx| {
        let result = count_cells(s, &args.count_method()?)?;
        let (counts, objects) = result.tables()?;
        ctx.produce(COUNTS, counts);
        ctx.produce(OBJECTS, objects);
        Ok(result.labels)
    }));
}
