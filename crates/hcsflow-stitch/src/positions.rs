//! Tile positions: pairwise registration of overlaps, edge rejection, global
//! weighted least squares.

use std::fmt;
use std::fmt::Write as _;

use hcsflow_core::{with_pixels, Pixel, Stack};
use rayon::prelude::*;

use crate::fft::PlanCache;
use crate::layout::TileLayout;

use crate::pairwise::{prepare_into, register, EdgeGeometry, PairResult, PairSettings, Window, Work};
use crate::StitchError;

/// Parameters of [`tile_positions`]. `Default` suits fluorescence HCS tiles.
#[derive(Debug, Clone, PartialEq)]
pub struct PositionParams {
    /// Largest deviation (px, per axis) of a measured pairwise offset from the
    /// offset the stage predicts. `None` = 5 % of the larger tile side (at least
    /// 8 px): stage errors of HCS instruments are a few µm. Edges measured beyond
    /// it are rejected. Larger values cost wider strips.
    pub max_shift_px: Option<f64>,
    /// Absolute floor of the edge score (Pearson r of the high-passed, aligned
    /// overlap). Unrelated content scores ~0 ± a few /√(pixels); 0.15 rejects
    /// noise-only and blank overlaps with a wide margin while keeping sparse
    /// but real overlaps (a few nuclei score > 0.5).
    pub min_score: f64,
    /// Number of random pairs of strips from tiles that do *not* overlap,
    /// registered exactly like real edges to measure the score of unrelated
    /// content on this data. The threshold becomes
    /// `max(min_score, max(null scores) + 0.1)`. 0 disables it (absolute threshold
    /// only). A handful of registrations instead of ASHLAR's thousand.
    pub null_pairs: usize,
    /// Radius (px) of the coarse box of the band-pass applied before the
    /// phase correlation and the score (strip smoothed over 3×3 minus its
    /// local mean over this radius): removes vignetting and background ramps,
    /// so blank overlaps score ~0. 0 = subtract the global mean only.
    pub highpass_radius: usize,
    /// Gauss–Newton iterations of the sub-pixel refinement (stops earlier at
    /// 0.001 px steps; 0 = phase correlation with a parabolic peak fit only).
    pub refine_iterations: usize,
    /// Pixels of the overlap sampled per refinement iteration (a regular
    /// subgrid above this): accuracy saturates long before a 2048² strip's 400 k pixels.
    pub refine_samples: usize,
    /// Edges whose residual after the global fit exceeds this (px) are
    /// rejected one at a time, worst first, and the fit repeated.
    pub max_residual_px: f64,
    /// Minimum overlap (pixels) of the aligned strips for an edge to count.
    pub min_overlap_px: usize,
}

impl Default for PositionParams {
    fn default() -> Self {
        PositionParams {
            max_shift_px: None,
            min_score: 0.15,
            null_pairs: 4,
            highpass_radius: 8,
            refine_iterations: 10,
            refine_samples: 1 << 17,
            max_residual_px: 1.5,
            min_overlap_px: 200,
        }
    }
}

impl PositionParams {
    /// Sets `max_shift_px` from a stage tolerance in µm.
    pub fn with_max_shift_um(mut self, max_shift_um: f64, pixel_size_um: f64) -> Self {
        self.max_shift_px = Some(max_shift_um / pixel_size_um);
        self
    }

    fn validate(&self) -> Result<(), StitchError> {
        let bad = |m: String| Err(StitchError::InvalidParameter(m));
        if let Some(m) = self.max_shift_px {
            if !(m.is_finite() && m >= 0.0) {
                return bad(format!("max_shift_px must be finite and >= 0, got {m}"));
            }
        }
        if !self.min_score.is_finite() || self.min_score > 1.0 {
            return bad(format!("min_score must be a number <= 1, got {}", self.min_score));
        }
        if !(self.max_residual_px.is_finite() && self.max_residual_px > 0.0) {
            return bad(format!("max_residual_px must be > 0, got {}", self.max_residual_px));
        }
        Ok(())
    }
}

/// What happened to one edge.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum EdgeStatus {
    /// Used in the global fit.
    Accepted,
    /// Score below the threshold (blank or featureless overlap, or no match).
    LowScore,
    /// Measured offset further than `max_shift_px` from the stage prediction.
    BeyondMaxShift,
    /// Correlation peak on the border of the search range: the true offset
    /// is probably outside it.
    AtSearchLimit,
    /// The aligned overlap is smaller than `min_overlap_px`.
    SmallOverlap,
    /// Disagreed with the other edges by more than `max_residual_px` after the global fit.
    Inconsistent,
}

impl fmt::Display for EdgeStatus {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(match self {
            EdgeStatus::Accepted => "accepted",
            EdgeStatus::LowScore => "low_score",
            EdgeStatus::BeyondMaxShift => "beyond_max_shift",
            EdgeStatus::AtSearchLimit => "at_search_limit",
            EdgeStatus::SmallOverlap => "small_overlap",
            EdgeStatus::Inconsistent => "inconsistent",
        })
    }
}

/// One pair of overlapping tiles (indices into the stack), `a < b`.
#[derive(Debug, Clone, PartialEq)]
pub struct Edge {
    pub a: usize,
    pub b: usize,
    /// Stage-predicted offset of `b` relative to `a`, `(x, y)` px.
    pub predicted: (f64, f64),
    /// Measured offset of `b` relative to `a`, `(x, y)` px.
    pub measured: (f64, f64),
    /// Pearson r of the aligned, high-passed overlap.
    pub score: f64,
    pub status: EdgeStatus,
    /// `|final offset − measured|` after the global fit (px); NaN until fitted.
    pub residual: f64,
}

impl Edge {
    pub fn accepted(&self) -> bool {
        self.status == EdgeStatus::Accepted
    }
}

/// Result of [`tile_positions`].
#[derive(Debug, Clone, PartialEq)]
pub struct TilePositions {
    /// Top-left corner `(x, y)` of every tile, px, in the frame of the layout's
    /// stage positions (each group of registered tiles keeps the mean stage
    /// position of its members).
    pub positions: Vec<(f64, f64)>,
    pub edges: Vec<Edge>,
    /// The score threshold used (`min_score` or raised by the null pairs).
    pub score_threshold: f64,
    /// Scores of the null pairs (unrelated strips).
    pub null_scores: Vec<f64>,
    /// Tiles that had no accepted edge and sit at their stage position.
    pub stage_only: Vec<usize>,
    /// True when no overlap could be registered and every tile sits at its
    /// stage position: alignment was impossible. Run reports must show it.
    pub fell_back_to_stage: bool,
    /// Human-readable account of fallbacks (whole or partial), tiles numbered
    /// from 1 in stack order; [`TilePositions::describe`] names them otherwise.
    pub message: Option<String>,
}

impl TilePositions {
    /// The account of fallbacks that [`TilePositions::message`] holds, with
    /// tiles named by `label` (from their 0-based index): `tile 4` by default,
    /// the site in a pipeline's run report. `None` when every tile has an edge.
    pub fn describe(&self, label: impl Fn(usize) -> String) -> Option<String> {
        let n = self.positions.len();
        if self.fell_back_to_stage {
            let mut counts: Vec<(String, usize)> = Vec::new();
            for e in &self.edges {
                let s = e.status.to_string();
                match counts.iter_mut().find(|(k, _)| *k == s) {
                    Some((_, c)) => *c += 1,
                    None => counts.push((s, 1)),
                }
            }
            let why = if self.edges.is_empty() {
                "the layout predicts no overlapping neighbours".to_string()
            } else {
                format!(
                    "none of the {} overlaps could be registered ({})",
                    self.edges.len(),
                    counts.iter().map(|(k, c)| format!("{c} {k}")).collect::<Vec<_>>().join(", ")
                )
            };
            Some(format!("alignment impossible: {why}; all {n} tiles placed at their stage positions"))
        } else if !self.stage_only.is_empty() {
            Some(format!(
                "{} of {n} tiles had no accepted overlap and were placed at their stage positions: {}",
                self.stage_only.len(),
                self.stage_only.iter().map(|&k| label(k)).collect::<Vec<_>>().join(", ")
            ))
        } else {
            None
        }
    }

    /// The edge table as CSV: `a,b,predicted_dx,predicted_dy,measured_dx,measured_dy,score,accepted,status,residual`.
    pub fn to_csv(&self) -> String {
        let mut s = String::from("a,b,predicted_dx,predicted_dy,measured_dx,measured_dy,score,accepted,status,residual\n");
        for e in &self.edges {
            let _ = writeln!(
                s,
                "{},{},{:.4},{:.4},{:.4},{:.4},{:.4},{},{},{:.4}",
                e.a,
                e.b,
                e.predicted.0,
                e.predicted.1,
                e.measured.0,
                e.measured.1,
                e.score,
                e.accepted(),
                e.status,
                e.residual
            );
        }
        s
    }

    /// The positions as CSV: `tile,x_px,y_px,stage_only`.
    pub fn positions_csv(&self) -> String {
        let mut s = String::from("tile,x_px,y_px,stage_only\n");
        for (i, p) in self.positions.iter().enumerate() {
            let _ = writeln!(s, "{i},{:.4},{:.4},{}", p.0, p.1, self.stage_only.contains(&i));
        }
        s
    }
}

/// Reweighting rounds of the global fit and the Cauchy scale (px): edges
/// measure to ~0.1 px, so a residual of a few px marks a wrong edge.
const IRLS_ITERATIONS: usize = 10;
const IRLS_SCALE_PX: f64 = 0.5;

/// Window `win` of tile `k`, prepared into `out`.
fn prepare_window(tiles: &Stack, k: usize, win: Window, out: &mut [f32]) {
    with_pixels!(Stack, tiles, a, T => prepare_into(a.plane(k), a.dim().2, win, <T as Pixel>::to_f32, out))
}

struct Candidate {
    a: usize,
    b: usize,
    predicted: (f64, f64),
    geom: EdgeGeometry,
}

/// Computes the position of every tile.
///
/// `tiles` is `[N, Y, X]`, one plane per tile in `layout` order (all tiles
/// share one size, as the stack guarantees). Steps: neighbour pairs from the
/// expected rectangles; for each pair, FFT correlation of the overlap
/// strips only, sub-pixel refinement and a score (see the crate docs);
/// rejection of low-score, out-of-range and
/// inconsistent edges; weighted least squares over the accepted edges
/// (weight = score) per connected group of tiles, each group placed at the
/// mean stage position of its tiles — so a tile without any good edge (blank,
/// or all its neighbours missing) keeps its stage position, and says so in
/// [`TilePositions::stage_only`] and [`TilePositions::message`].
pub fn tile_positions(tiles: &Stack, layout: &TileLayout, params: &PositionParams) -> Result<TilePositions, StitchError> {
    params.validate()?;
    let [n, th, tw] = tiles.shape();
    if n == 0 {
        return Err(StitchError::Empty);
    }
    if layout.len() != n {
        return Err(StitchError::LayoutMismatch { tiles: n, layout: layout.len() });
    }
    if let Some(t) = layout.tiles.iter().position(|t| !(t.stage_x_px.is_finite() && t.stage_y_px.is_finite())) {
        return Err(StitchError::InvalidParameter(format!("stage position of tile {t} is not finite")));
    }
    let max_shift = params.max_shift_px.unwrap_or_else(|| (0.05 * th.max(tw) as f64).max(8.0));
    let stage: Vec<(f64, f64)> = layout.tiles.iter().map(|t| (t.stage_x_px, t.stage_y_px)).collect();

    let cands = neighbour_pairs(&stage, th, tw, max_shift);

    // FFT plans, once per strip size.
    let mut cache = PlanCache::default();
    for c in &cands {
        cache.get_or_plan(c.geom.a.h, c.geom.a.w);
    }
    let set = PairSettings {
        max_shift,
        refine_iterations: params.refine_iterations,
        refine_samples: params.refine_samples,
        highpass_radius: params.highpass_radius,
    };
    let run = |work: &mut Work, a: usize, b: usize, geom: &EdgeGeometry| -> Option<PairResult> {
        let plan = cache.get(geom.a.h, geom.a.w)?;
        work.fit(&plan);
        prepare_window(tiles, a, geom.a, &mut work.a);
        prepare_window(tiles, b, geom.b, &mut work.b);
        Some(register(geom.s0, &plan, work, &set))
    };

    let null_jobs = null_pairs(&cands, &stage, (th, tw), max_shift, params.null_pairs);
    // Real edges and null pairs in one parallel pass, in contiguous runs of
    // jobs per thread: each run allocates its strip buffers once (tens of MB
    // for 2048² tiles, whose page faults cost more than the FFTs).
    let jobs: Vec<(usize, usize, EdgeGeometry)> = cands.iter().map(|c| (c.a, c.b, c.geom)).chain(null_jobs.iter().copied()).collect();
    let per_thread = jobs.len().div_ceil(rayon::current_num_threads().max(1)).max(1);
    let mut results: Vec<Option<PairResult>> =
        jobs.par_iter().with_min_len(per_thread).map_init(Work::default, |work, (a, b, g)| run(work, *a, *b, g)).collect();
    let null_scores: Vec<f64> =
        results.split_off(cands.len()).into_iter().flatten().filter(|p| p.overlap_px >= params.min_overlap_px).map(|p| p.score).collect();
    let null_max = null_scores.iter().copied().fold(f64::NEG_INFINITY, f64::max);
    let score_threshold = if null_max.is_finite() { params.min_score.max(null_max + 0.1) } else { params.min_score };

    let mut edges = classify_edges(&cands, &results, params, score_threshold, max_shift);

    let positions = global_fit(&stage, &mut edges, params.max_residual_px);

    let mut has_edge = vec![false; n];
    for e in edges.iter().filter(|e| e.accepted()) {
        has_edge[e.a] = true;
        has_edge[e.b] = true;
    }
    let stage_only: Vec<usize> = if n > 1 { (0..n).filter(|&k| !has_edge[k]).collect() } else { Vec::new() };
    let accepted = edges.iter().filter(|e| e.accepted()).count();
    let fell_back_to_stage = n > 1 && accepted == 0;
    let mut result = TilePositions { positions, edges, score_threshold, null_scores, stage_only, fell_back_to_stage, message: None };
    result.message = result.describe(|k| format!("tile {}", k + 1));
    Ok(result)
}

/// Pairs of tiles whose expected rectangles (`th × tw` at their stage
/// positions) overlap along a side, with the geometry of their strips.
fn neighbour_pairs(stage: &[(f64, f64)], th: usize, tw: usize, max_shift: f64) -> Vec<Candidate> {
    let n = stage.len();
    let mut cands = Vec::new();
    for i in 0..n {
        for j in i + 1..n {
            let (dx, dy) = (stage[j].0 - stage[i].0, stage[j].1 - stage[i].1);
            let ox = tw as f64 - dx.abs();
            let oy = th as f64 - dy.abs();
            if ox <= 0.0 || oy <= 0.0 || (ox < 0.5 * tw as f64 && oy < 0.5 * th as f64) {
                continue;
            }
            if let Some(geom) = EdgeGeometry::new(th, tw, dx, dy, max_shift) {
                cands.push(Candidate { a: i, b: j, predicted: (dx, dy), geom });
            }
        }
    }
    cands
}

/// Up to `wanted` null pairs: the geometry of a real edge, the B strip from a
/// tile that does not overlap A (their scores calibrate the score threshold).
/// Deterministic choice (fixed-seed generator).
fn null_pairs(
    cands: &[Candidate],
    stage: &[(f64, f64)],
    (th, tw): (usize, usize),
    max_shift: f64,
    wanted: usize,
) -> Vec<(usize, usize, EdgeGeometry)> {
    let n = stage.len();
    let mut null_jobs = Vec::new();
    if wanted == 0 || cands.is_empty() || n < 3 {
        return null_jobs;
    }
    let overlaps = |i: usize, k: usize| {
        let (dx, dy) = (stage[k].0 - stage[i].0, stage[k].1 - stage[i].1);
        dx.abs() < tw as f64 + max_shift && dy.abs() < th as f64 + max_shift
    };
    let mut rng = 0x9E37_79B9_7F4A_7C15u64;
    let mut next = move || {
        rng ^= rng << 13;
        rng ^= rng >> 7;
        rng ^= rng << 17;
        rng
    };
    for _ in 0..wanted * 8 {
        if null_jobs.len() == wanted {
            break;
        }
        let c = &cands[(next() % cands.len() as u64) as usize];
        let k = (next() % n as u64) as usize;
        if k != c.a && !overlaps(c.a, k) {
            null_jobs.push((c.a, k, c.geom));
        }
    }
    null_jobs
}

/// Each candidate's edge: its measured offset and status (too small an
/// overlap, a score under `score_threshold`, a peak at the search limit or
/// beyond `max_shift`, else accepted). Residuals are filled by the fit.
fn classify_edges(
    cands: &[Candidate],
    results: &[Option<PairResult>],
    params: &PositionParams,
    score_threshold: f64,
    max_shift: f64,
) -> Vec<Edge> {
    cands
        .iter()
        .zip(results)
        .map(|(c, r)| {
            let Some(r) = r else {
                return Edge {
                    a: c.a,
                    b: c.b,
                    predicted: c.predicted,
                    measured: c.predicted,
                    score: 0.0,
                    status: EdgeStatus::SmallOverlap,
                    residual: f64::NAN,
                };
            };
            let dev = (r.s.0 - c.geom.s0.0, r.s.1 - c.geom.s0.1);
            let measured = (c.predicted.0 + dev.0, c.predicted.1 + dev.1);
            let status = if r.overlap_px < params.min_overlap_px {
                EdgeStatus::SmallOverlap
            } else if r.score < score_threshold {
                EdgeStatus::LowScore
            } else if r.at_limit {
                EdgeStatus::AtSearchLimit
            } else if dev.0.abs() > max_shift || dev.1.abs() > max_shift {
                EdgeStatus::BeyondMaxShift
            } else {
                EdgeStatus::Accepted
            };
            Edge { a: c.a, b: c.b, predicted: c.predicted, measured, score: r.score, status, residual: f64::NAN }
        })
        .collect()
}

/// The global fit of the tile positions to the accepted edges. First
/// iteratively reweighted least squares with Cauchy weights (scale 0.5 px):
/// a wrong edge that passed the score test is down-weighted instead of
/// spreading its error over its loops, so its residual shows its true size.
/// Then the worst edge beyond `max_residual_px` is marked inconsistent and the
/// fit repeated until all agree; last, a fit of the agreeing edges with their
/// plain weights. Every edge's residual is that of the final positions.
fn global_fit(stage: &[(f64, f64)], edges: &mut [Edge], max_residual_px: f64) -> Vec<(f64, f64)> {
    let residuals = |positions: &[(f64, f64)], edges: &mut [Edge]| {
        for e in edges.iter_mut() {
            let fx = positions[e.b].0 - positions[e.a].0;
            let fy = positions[e.b].1 - positions[e.a].1;
            e.residual = ((fx - e.measured.0).powi(2) + (fy - e.measured.1).powi(2)).sqrt();
        }
    };
    let mut robust = vec![1.0f64; edges.len()];
    let mut positions = solve(stage, edges, &robust);
    for _ in 0..IRLS_ITERATIONS {
        residuals(&positions, edges);
        for (w, e) in robust.iter_mut().zip(edges.iter()) {
            *w = 1.0 / (1.0 + (e.residual / IRLS_SCALE_PX).powi(2));
        }
        positions = solve(stage, edges, &robust);
    }
    loop {
        residuals(&positions, edges);
        let worst = edges
            .iter()
            .enumerate()
            .filter(|(_, e)| e.accepted() && e.residual > max_residual_px)
            .max_by(|a, b| a.1.residual.total_cmp(&b.1.residual))
            .map(|(k, _)| k);
        match worst {
            Some(k) => edges[k].status = EdgeStatus::Inconsistent,
            None => break,
        }
        positions = solve(stage, edges, &robust);
    }
    let ones = vec![1.0f64; edges.len()];
    positions = solve(stage, edges, &ones);
    residuals(&positions, edges);
    positions
}

/// Weighted least squares of the accepted edges, per connected component,
/// each component translated to the mean stage position of its tiles (the
/// limit of weak stage priors). Isolated tiles keep their stage position.
fn solve(stage: &[(f64, f64)], edges: &[Edge], robust: &[f64]) -> Vec<(f64, f64)> {
    let n = stage.len();
    // Components (union-find).
    let mut parent: Vec<usize> = (0..n).collect();
    fn find(p: &mut [usize], mut x: usize) -> usize {
        while p[x] != x {
            p[x] = p[p[x]];
            x = p[x];
        }
        x
    }
    let good: Vec<(&Edge, f64)> = edges.iter().zip(robust).filter(|(e, _)| e.accepted()).map(|(e, &r)| (e, r)).collect();
    for (e, _) in &good {
        let (ra, rb) = (find(&mut parent, e.a), find(&mut parent, e.b));
        if ra != rb {
            parent[ra] = rb;
        }
    }
    let roots: Vec<usize> = (0..n).map(|k| find(&mut parent, k)).collect();
    let mut out = stage.to_vec();
    let mut members: Vec<Vec<usize>> = vec![Vec::new(); n];
    for k in 0..n {
        members[roots[k]].push(k);
    }
    for comp in members.iter().filter(|m| m.len() > 1) {
        let m = comp.len();
        let mut local = vec![usize::MAX; n];
        for (li, &k) in comp.iter().enumerate() {
            local[k] = li;
        }
        let cedges: Vec<(usize, usize, f64, (f64, f64))> = good
            .iter()
            .filter(|(e, _)| local[e.a] != usize::MAX)
            .map(|(e, r)| (local[e.a], local[e.b], e.score.max(1e-3) * r.max(1e-6), e.measured))
            .collect();
        let mean = |f: &dyn Fn(usize) -> f64| comp.iter().map(|&k| f(k)).sum::<f64>() / m as f64;
        for axis in 0..2 {
            let get = |p: (f64, f64)| if axis == 0 { p.0 } else { p.1 };
            let mut b = vec![0f64; m];
            for &(i, j, w, d) in &cedges {
                b[j] += w * get(d);
                b[i] -= w * get(d);
            }
            let smean = mean(&|k| get(stage[k]));
            let x0: Vec<f64> = comp.iter().map(|&k| get(stage[k]) - smean).collect();
            let x = cg_laplacian(&cedges, b, x0);
            let xm = x.iter().sum::<f64>() / m as f64;
            for (li, &k) in comp.iter().enumerate() {
                let v = x[li] - xm + smean;
                if axis == 0 {
                    out[k].0 = v;
                } else {
                    out[k].1 = v;
                }
            }
        }
    }
    out
}

/// Conjugate gradients on `(L + 11ᵀ/m) x = b` for the weighted graph
/// Laplacian `L` of a connected component (`b` sums to zero, so the solution
/// is the zero-mean least-squares solution).
fn cg_laplacian(edges: &[(usize, usize, f64, (f64, f64))], b: Vec<f64>, x0: Vec<f64>) -> Vec<f64> {
    let m = b.len();
    let apply = |x: &[f64]| -> Vec<f64> {
        let mean = x.iter().sum::<f64>() / m as f64;
        let mut y = vec![mean; m];
        for &(i, j, w, _) in edges {
            let d = w * (x[j] - x[i]);
            y[j] += d;
            y[i] -= d;
        }
        y
    };
    let mut x = x0;
    let ax = apply(&x);
    let mut r: Vec<f64> = b.iter().zip(&ax).map(|(b, a)| b - a).collect();
    let mut p = r.clone();
    let mut rr: f64 = r.iter().map(|v| v * v).sum();
    let bnorm: f64 = b.iter().map(|v| v * v).sum::<f64>().sqrt().max(1e-300);
    for _ in 0..(10 * m + 50) {
        if rr.sqrt() <= 1e-13 * bnorm.max(1.0) {
            break;
        }
        let ap = apply(&p);
        let pap: f64 = p.iter().zip(&ap).map(|(a, b)| a * b).sum();
        if pap <= 0.0 {
            break;
        }
        let alpha = rr / pap;
        for k in 0..m {
            x[k] += alpha * p[k];
            r[k] -= alpha * ap[k];
        }
        let rr_new: f64 = r.iter().map(|v| v * v).sum();
        let beta = rr_new / rr;
        rr = rr_new;
        for k in 0..m {
            p[k] = r[k] + beta * p[k];
        }
    }
    x
}
