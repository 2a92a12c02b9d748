//! The fit: BaSiCPy 2.0's "approximate" mode on images at the working size.
//!
//! Model: image `i`, pixel `p`: `I[i,p] = B[i]·S[p] + D[p] + R[i,p]`, with
//! `S` smooth (L1 on its DCT coefficients), `R` sparse (weighted L1), `B ≥ 0`
//! per image. An inexact augmented-Lagrangian (ADMM) loop
//! (`Admm::solve`) solves it for fixed weights; an outer loop re-weights the
//! sparse term (`W = 1/(|R / mean(I_B)| + ε)`) and refits from scratch until the
//! flat-field stops changing.
//!
//! Arrays of `images × pixels` are f32 (as BaSiCPy's torch tensors), laid
//! out by pixel chunks (see the private `passes` module); every reduction (means, norms, the
//! dark-field's closed form) accumulates in f64. Each ADMM iteration makes one
//! pass over them (two with the dark-field) that updates the sparse part and
//! the multipliers and sums what the baselines, the residual's norm and the
//! next flat-field step need. The multipliers are stored without a rank-one
//! term (`B·S`) that only the end of the pass knows, and corrected when next
//! read. Results do not depend on the thread count.

use rayon::prelude::*;

use crate::dct::Dct2d;
use crate::passes::{self, shrink, ChunkPixels, Chunked, IterationData, PIXEL_CHUNK};
use crate::simd::Isa;
use crate::{BasicError, BasicParams};

/// The entropy-like step constants of BaSiCPy's approximate fit (`_ent1`, `_ent2`).
const ENT1: f64 = 1.0;
const ENT2: f64 = 10.0;

/// The result of a fit at the working size.
#[derive(Debug, Clone, PartialEq)]
pub struct WorkingFit {
    pub height: usize,
    pub width: usize,
    /// Flat-field, mean 1 (`height × width`, row-major).
    pub flatfield: Vec<f32>,
    /// Dark-field in the images' units (zeros without `get_darkfield`).
    pub darkfield: Vec<f32>,
    /// Per-image baseline (BaSiCPy's `baseline`: `B · mean(S)` before normalisation).
    pub baseline: Vec<f32>,
    /// The smoothness weights used (after the automatic choice).
    pub smoothness_flatfield: f64,
    pub smoothness_darkfield: f64,
    /// Re-weighting rounds run (each one an ADMM solve).
    pub reweight_iterations: usize,
    /// ADMM iterations over all rounds.
    pub admm_iterations: usize,
    /// The last ADMM solve reached `optimization_tol` before `max_iterations`.
    pub admm_converged: bool,
    /// The flat-field changed by at most `reweighting_tol` in the last round.
    pub reweight_converged: bool,
    /// `‖residual‖₂ / ‖images‖_F` of the last ADMM solve.
    pub residual_ratio: f64,
}

/// The fixed data of one fit: images (possibly sorted per pixel) and the
/// constants derived from them.
struct Admm<'a> {
    n: usize,
    p: usize,
    layout: Chunked,
    isa: Isa,
    /// The images, by pixel chunks.
    im: &'a [f32],
    darkfield: bool,
    lambda_flat: f64,
    lambda_dark: f64,
    init_mu: f64,
    max_mu: f64,
    rho: f64,
    tol: f64,
    max_iterations: usize,
    image_norm: f64,
    dz_max: f64,
}

/// The variables of one ADMM solve. `ir` and `y` are `n × p` by pixel chunks; the rest `p` or `n`.
struct State {
    s: Vec<f32>,
    s_hat: Vec<f32>,
    dr: Vec<f32>,
    /// `dr` at the start of the last iteration (the residual and `I_B` use it).
    dr_prev: Vec<f32>,
    dz: f64,
    b: Vec<f32>,
    ir: Vec<f32>,
    /// The multipliers without `corr·S_prev·B_i`: `Y = y − corr·S_prev·B_i`.
    y: Vec<f32>,
    /// The flat-field of the iteration before.
    s_prev: Vec<f32>,
    /// μ of the iteration before (0 after a reset, when `y` is `Y`).
    corr: f64,
    /// `p` values: the flat-field's next step between iterations, scratch
    /// of the dark-field's offset within one.
    temp: Vec<f32>,
}

/// Per-image sums of an iteration's pass: `Σ R` (`[0]`), `Σ R` over the
/// pixels where `S ≥ mean(S)` (`[1]`, dark-field only), `Σ E²` and `Σ E·S`
/// (`[2]`, `[3]`) with the residual at the old baselines
/// `E = I − I_R − D_R − S·B_i` ([`passes::iteration`]).
type RowSums = [f64; 4];

/// The `p`-long pixel vectors sliced to chunk `c`.
fn chunk_pixels<'a>(c: usize, s: &'a [f32], dr: &'a [f32], s_prev: &'a [f32], b: &'a [f32]) -> ChunkPixels<'a> {
    let range = c * PIXEL_CHUNK..(c * PIXEL_CHUNK + PIXEL_CHUNK).min(s.len());
    ChunkPixels { s: &s[range.clone()], dr: &dr[range.clone()], s_prev: &s_prev[range], b }
}

fn mean(x: &[f32]) -> f64 {
    x.iter().map(|&v| f64::from(v)).sum::<f64>() / x.len().max(1) as f64
}

impl Admm<'_> {
    /// One ADMM solve from BaSiCPy's initial point (`S = 1`, `D = 0`, `R = 0`,
    /// `Y = 0`, `B` = each image's mean over the global mean), with sparse
    /// weights `w`. Returns iterations, the final residual ratio and whether it converged.
    fn solve(&self, st: &mut State, w: &[f32], dct: &mut Dct2d, b0: &[f32]) -> (usize, f64, bool) {
        st.s.fill(1.0);
        st.s_hat.copy_from_slice(&st.s);
        dct.forward(&mut st.s_hat);
        st.dr.fill(0.0);
        st.dr_prev.fill(0.0);
        st.dz = 0.0;
        st.b.copy_from_slice(b0);
        st.ir.fill(0.0);
        st.y.fill(0.0);
        st.corr = 0.0;
        let mut mu = self.init_mu;
        self.first_flatfield_step(st);
        let mut k = 0;
        let mut ratio = f64::INFINITY;
        while ratio > self.tol && k < self.max_iterations {
            let next_mu = (mu * self.rho).min(self.max_mu);
            ratio = self.step(st, w, dct, mu, next_mu);
            mu = next_mu;
            k += 1;
        }
        (k, ratio, ratio <= self.tol)
    }

    /// `temp = mean_i(I − S·B_i − D_R) / ENT1`: the flat-field's step before
    /// its DCT at the start of a solve (`I_R = 0`, `Y = 0`); each iteration
    /// leaves the next one in `temp`.
    fn first_flatfield_step(&self, st: &mut State) {
        let (isa, chunk) = (self.isa, self.layout.chunk_values());
        let (s, dr, b) = (&st.s, &st.dr, &st.b);
        st.temp.par_chunks_mut(PIXEL_CHUNK).zip(self.im.par_chunks(chunk)).enumerate().for_each(|(c, (out, im))| {
            passes::first_flatfield_step(isa, chunk_pixels(c, s, dr, s, b), im, out);
            out.iter_mut().for_each(|o| *o /= ENT1 as f32);
        });
    }

    /// One iteration (`ApproximateFit._step`); returns `‖residual‖₂ / ‖images‖_F`.
    /// Expects `st.temp` to hold the flat-field's step at `mu` and leaves
    /// it there at `next_mu` for the next iteration.
    fn step(&self, st: &mut State, w: &[f32], dct: &mut Dct2d, mu: f64, next_mu: f64) -> f64 {
        let (n, p, isa, chunk) = (self.n, self.p, self.isa, self.layout.chunk_values());
        // Flat-field: S_hat += DCT(mean_i(I − I_R − S·B_i − D_R + Y/μ)), soft-threshold, back.
        dct.forward(&mut st.temp);
        let t_flat = (self.lambda_flat / (ENT1 * mu)) as f32;
        st.s_hat.iter_mut().zip(&st.temp).for_each(|(h, &d)| *h = shrink(*h + d, t_flat));
        std::mem::swap(&mut st.s, &mut st.s_prev);
        st.s.copy_from_slice(&st.s_hat);
        dct.inverse(&mut st.s);

        // Sparse part: I_R = shrink(I − S·B_i − D_R + Y/μ, W/μ); B_i = mean(R_i)/mean(R), R = I − I_R;
        // multipliers: Y += μ·(I − S·B_i − D_R − I_R), with the new B_i (see `State::y`).
        let mean_s = mean(&st.s) as f32;
        let data = |im, w| IterationData {
            im,
            w,
            mu: mu as f32,
            inv_mu: (1.0 / mu) as f32,
            corr: st.corr as f32,
            next_inv_mu: (1.0 / next_mu) as f32,
            mean_s: self.darkfield.then_some(mean_s),
        };
        let per_chunk: Vec<(Vec<RowSums>, Vec<f32>)> = {
            let (s, dr, s_prev, b) = (&st.s, &st.dr, &st.s_prev, &st.b);
            st.ir
                .par_chunks_mut(chunk)
                .zip(st.y.par_chunks_mut(chunk))
                .zip(self.im.par_chunks(chunk))
                .zip(w.par_chunks(chunk))
                .enumerate()
                .map(|(c, (((ir, y), im), w))| {
                    let px = chunk_pixels(c, s, dr, s_prev, b);
                    let (mut sums, mut next) = (vec![[0f64; 4]; n], vec![0f32; px.s.len()]);
                    passes::iteration(isa, px, data(im, w), ir, y, &mut sums, &mut next);
                    (sums, next)
                })
                .collect()
        };
        // Summed in chunk order: the same result for any thread count.
        let mut sums = vec![[0f64; 4]; n];
        for (chunk_sums, _) in &per_chunk {
            for (total, add) in sums.iter_mut().zip(chunk_sums) {
                total.iter_mut().zip(add).for_each(|(t, a)| *t += a);
            }
        }
        let mean_r = sums.iter().map(|s| s[0]).sum::<f64>() / (n * p) as f64;
        // δ_i: how much each baseline moved.
        let delta: Vec<f64> =
            st.b.iter_mut()
                .zip(&sums)
                .map(|(b, s)| {
                    let old = f64::from(*b);
                    *b = ((s[0] / p as f64) / mean_r).max(0.0) as f32;
                    f64::from(*b) - old
                })
                .collect();
        st.dr_prev.copy_from_slice(&st.dr);
        if self.darkfield {
            self.update_darkfield(st, dct, &sums, mean_r, mean_s, mu);
        }
        st.corr = mu;

        // The residual at the new baselines is E − δ_i·S: its squares are
        // Σ_i (Σ E² − 2·δ_i·Σ E·S + δ_i²·Σ S²).
        let s2: f64 = st.s.iter().map(|&v| f64::from(v) * f64::from(v)).sum();
        let squares: f64 = delta.iter().zip(&sums).map(|(&d, s)| s[2] - 2.0 * d * s[3] + d * d * s2).sum();
        // The next flat-field step: the pass's, at the new baselines
        // (−S·mean(δ)·(1 + μ/μ')) and dark-field (−(D_R − D_R,old)).
        let shift = delta.iter().sum::<f64>() / n as f64 * (1.0 + mu / next_mu);
        let scale = 1.0 / (n as f64 * ENT1);
        for (c, (_, next)) in per_chunk.iter().enumerate() {
            let p0 = c * PIXEL_CHUNK;
            for (q, &g) in next.iter().enumerate() {
                let at = p0 + q;
                let (s, moved) = (f64::from(st.s[at]), f64::from(st.dr[at]) - f64::from(st.dr_prev[at]));
                st.temp[at] = (f64::from(g) * scale - (s * shift + moved) / ENT1) as f32;
            }
        }
        squares.max(0.0).sqrt() / self.image_norm
    }

    /// The dark-field of one iteration (the `get_darkfield` branch of
    /// `ApproximateFit._step`): a constant `D_Z` in closed form from the images
    /// with `B < 1`, and a smooth, sparse remainder `D_R`.
    fn update_darkfield(&self, st: &mut State, dct: &mut Dct2d, sums: &[RowSums], mean_r: f64, mean_s: f32, mu: f64) {
        let (n, p) = (self.n, self.p);
        let inside = st.s.iter().filter(|&&v| v >= mean_s).count();
        let outside = p - inside;
        let valid: Vec<bool> = st.b.iter().map(|&b| b < 1.0).collect();
        let count = valid.iter().filter(|&&v| v).count() as f64;
        let (mut t1, mut t2, mut t3, mut t4) = (0f64, 0f64, 0f64, 0f64);
        for i in (0..n).filter(|&i| valid[i]) {
            let b = f64::from(st.b[i]);
            t1 += b * b;
            t2 += b;
            if inside > 0 && outside > 0 {
                let [all, within, ..] = sums[i];
                let b1 = (within / inside as f64 - (all - within) / outside as f64) / (mean_r + 1e-6);
                t3 += b1;
                t4 += b * b1;
            }
        }
        let t5 = t2 * t3 - count * t4;
        let dz = if t5 == 0.0 { 0.0 } else { (t1 * t3 - t2 * t4) / t5 };
        let mean_s = f64::from(mean_s);
        st.dz = dz.max(0.0).min(self.dz_max / mean_s);

        // A1_offset[p] = mean over valid images of R − mean(valid B)·S, centred.
        let mean_b_valid = if count > 0.0 { t2 / count } else { 0.0 };
        {
            let (s, chunk) = (&st.s, self.layout.chunk_values());
            st.temp.par_chunks_mut(PIXEL_CHUNK).zip(self.im.par_chunks(chunk)).zip(st.ir.par_chunks(chunk)).enumerate().for_each(
                |(c, ((out, im), ir))| {
                    let (p0, len) = (c * PIXEL_CHUNK, out.len());
                    out.fill(0.0);
                    for i in (0..n).filter(|&i| valid[i]) {
                        let row = i * len..(i + 1) * len;
                        out.iter_mut().zip(&im[row.clone()]).zip(&ir[row]).for_each(|((o, &a), &r)| *o += a - r);
                    }
                    for (o, &sv) in out.iter_mut().zip(&s[p0..]) {
                        *o = if count > 0.0 { (f64::from(*o) / count - mean_b_valid * f64::from(sv)) as f32 } else { 0.0 };
                    }
                },
            );
        }
        let centre = mean(&st.temp) as f32;
        st.temp.iter_mut().for_each(|v| *v -= centre);
        // D_R = A1 − mean(A1) − Z, Z = D_Z·(mean(S) − S); smoothed in the DCT domain, thresholded, Z added back.
        let centre = mean(&st.temp) as f32;
        let dz = st.dz as f32;
        let mean_s = mean_s as f32;
        for (t, &sv) in st.temp.iter_mut().zip(&st.s) {
            *t -= centre + dz * (mean_s - sv);
        }
        let threshold = (self.lambda_dark / (ENT2 * mu)) as f32;
        dct.forward(&mut st.temp);
        st.temp.iter_mut().for_each(|v| *v = shrink(*v, threshold));
        dct.inverse(&mut st.temp);
        for ((d, &t), &sv) in st.dr.iter_mut().zip(&st.temp).zip(&st.s) {
            *d = shrink(t, threshold) + dz * (mean_s - sv);
        }
    }
}

/// Sorts every pixel's values across the images (BaSiCPy's `sort_intensity`).
fn sort_per_pixel(im: &mut [f32], n: usize, p: usize) {
    let sorted: Vec<Vec<f32>> = (0..p)
        .into_par_iter()
        .with_min_len(PIXEL_CHUNK)
        .map(|q| {
            let mut column: Vec<f32> = (0..n).map(|i| im[i * p + q]).collect();
            column.sort_by(f32::total_cmp);
            column
        })
        .collect();
    for (q, column) in sorted.iter().enumerate() {
        for (i, &v) in column.iter().enumerate() {
            im[i * p + q] = v;
        }
    }
}

/// The largest singular value of the `n × p` matrix `im`, by power iteration
/// on `im·imᵀ` in f64 (BaSiCPy takes it from a full SVD).
fn spectral_norm(im: &[f32], n: usize, p: usize) -> f64 {
    let mut x = vec![1.0 / (n as f64).sqrt(); n];
    let mut z = vec![0f64; p];
    let mut sigma2 = 0f64;
    for _ in 0..1000 {
        // z = imᵀ x, then x' = im z.
        z.par_chunks_mut(PIXEL_CHUNK).enumerate().for_each(|(c, out)| {
            let p0 = c * PIXEL_CHUNK;
            out.fill(0.0);
            for (i, &xi) in x.iter().enumerate() {
                out.iter_mut().zip(&im[i * p + p0..]).for_each(|(o, &v)| *o += f64::from(v) * xi);
            }
        });
        let next: Vec<f64> = im.par_chunks(p).map(|row| row.iter().zip(&z).map(|(&v, &zq)| f64::from(v) * zq).sum()).collect();
        let norm = next.iter().map(|v| v * v).sum::<f64>().sqrt();
        if norm == 0.0 {
            return 0.0;
        }
        let converged = ((norm - sigma2) / norm).abs() < 1e-12;
        sigma2 = norm;
        x.iter_mut().zip(&next).for_each(|(x, &v)| *x = v / norm);
        if converged {
            break;
        }
    }
    sigma2.sqrt()
}

/// BaSiCPy's automatic flat-field smoothness: `Σ|DCT(m / mean(m))| / 400 · 0.5`,
/// `m` the mean image.
fn auto_smoothness(im: &[f32], n: usize, p: usize, dct: &mut Dct2d) -> f64 {
    let mut m = vec![0f32; p];
    m.par_chunks_mut(PIXEL_CHUNK).enumerate().for_each(|(c, out)| {
        let p0 = c * PIXEL_CHUNK;
        let mut acc = [0f64; PIXEL_CHUNK];
        for i in 0..n {
            acc.iter_mut().zip(&im[i * p + p0..i * p + p0 + out.len()]).for_each(|(a, &v)| *a += f64::from(v));
        }
        out.iter_mut().zip(&acc).for_each(|(o, &a)| *o = (a / n as f64) as f32);
    });
    let centre = mean(&m);
    m.iter_mut().for_each(|v| *v = (f64::from(*v) / centre) as f32);
    dct.forward(&mut m);
    m.iter().map(|&v| f64::from(v.abs())).sum::<f64>() / 400.0 * 0.5
}

/// Fits flat-field (and dark-field) to `n` images already at the working size
/// `height × width` (`im`: `n × height × width` values, row-major). BaSiCPy 2.0's
/// `BaSiC.fit` in approximate mode after its resize; see [`crate::fit()`] for the
/// checks on the input.
pub fn fit_working(im: &[f32], n: usize, height: usize, width: usize, params: &BasicParams) -> Result<WorkingFit, BasicError> {
    let p = height * width;
    if n < 2 {
        return Err(BasicError::TooFewImages { got: n });
    }
    if im.len() != n * p {
        return Err(BasicError::Shape { reason: format!("{} values for {n} images of {height}x{width}", im.len()) });
    }
    if let Some(bad) = im.iter().position(|v| !v.is_finite()) {
        return Err(BasicError::NotFinite { image: bad / p });
    }
    let mut dct = Dct2d::new(height, width);
    let lambda_flat = match params.smoothness_flatfield {
        Some(v) => v,
        None => auto_smoothness(im, n, p, &mut dct),
    };
    let lambda_dark = params.smoothness_darkfield.unwrap_or(0.1 * lambda_flat);
    let mut sorted;
    let im2: &[f32] = if params.sort_intensity {
        sorted = im.to_vec();
        sort_per_pixel(&mut sorted, n, p);
        &sorted
    } else {
        im
    };
    let spectral = spectral_norm(im2, n, p);
    let image_norm = im2.iter().map(|&v| f64::from(v) * f64::from(v)).sum::<f64>().sqrt();
    if spectral == 0.0 || image_norm == 0.0 {
        return Err(BasicError::AllZero);
    }
    let init_mu = params.mu_coef / spectral;
    let layout = Chunked { n, p };
    let chunked = layout.chunked(im2);
    let problem = Admm {
        n,
        p,
        layout,
        isa: Isa::detect(),
        im: &chunked,
        darkfield: params.get_darkfield,
        lambda_flat,
        lambda_dark,
        init_mu,
        max_mu: init_mu * params.max_mu_coef,
        rho: params.rho,
        tol: params.optimization_tol,
        max_iterations: params.max_iterations,
        image_norm,
        dz_max: im2.iter().copied().fold(f32::INFINITY, f32::min).into(),
    };
    // B's starting point: each image's mean over the mean of all.
    let global = mean(im2);
    let b0: Vec<f32> = im2.chunks_exact(p).map(|row| (mean(row) / global) as f32).collect();
    let mut st = State {
        s: vec![1.0; p],
        s_hat: vec![0.0; p],
        dr: vec![0.0; p],
        dr_prev: vec![0.0; p],
        dz: 0.0,
        b: b0.clone(),
        ir: vec![0.0; n * p],
        y: vec![0.0; n * p],
        s_prev: vec![1.0; p],
        corr: 0.0,
        temp: vec![0.0; p],
    };
    let mut w = vec![1f32; n * p];
    let mut last: Option<Vec<f32>> = None;
    let mut out = WorkingFit {
        height,
        width,
        flatfield: Vec::new(),
        darkfield: Vec::new(),
        baseline: Vec::new(),
        smoothness_flatfield: lambda_flat,
        smoothness_darkfield: lambda_dark,
        reweight_iterations: 0,
        admm_iterations: 0,
        admm_converged: false,
        reweight_converged: false,
        residual_ratio: f64::INFINITY,
    };
    for _ in 0..params.max_reweight_iterations.max(1) {
        let (k, ratio, converged) = problem.solve(&mut st, &w, &mut dct, &b0);
        out.reweight_iterations += 1;
        out.admm_iterations += k;
        out.admm_converged = converged;
        out.residual_ratio = ratio;
        // Profiles of this round: D = D_R + D_Z·S; flat = mean_i(I_B) − D, normalised to mean 1.
        let mean_b = mean(&st.b) as f32;
        let dz = st.dz as f32;
        let dark: Vec<f32> = st.dr.iter().zip(&st.s).map(|(&d, &s)| d + dz * s).collect();
        let mut flat: Vec<f32> = st.s.iter().zip(&st.dr_prev).zip(&dark).map(|((&s, &dp), &d)| s * mean_b + dp - d).collect();
        let mean_flat = mean(&flat);
        if !(mean_flat.is_finite() && flat.iter().any(|&v| v != 0.0)) || mean_flat == 0.0 {
            return Err(BasicError::FlatfieldZero);
        }
        flat.iter_mut().for_each(|v| *v = (f64::from(*v) / mean_flat) as f32);
        out.baseline = st.b.iter().map(|&b| (f64::from(b) * mean_flat) as f32).collect();
        out.darkfield = dark;
        update_weights(&problem, &mut w, &st, params.epsilon);
        let change = last.as_ref().map(|prev| {
            let diff: f64 = flat.iter().zip(prev).map(|(&a, &b)| f64::from((a - b).abs())).sum();
            diff / prev.iter().map(|&v| f64::from(v.abs())).sum::<f64>()
        });
        out.flatfield = flat.clone();
        last = Some(flat);
        if change.is_some_and(|c| c <= params.reweighting_tol) {
            out.reweight_converged = true;
            break;
        }
    }
    Ok(out)
}

/// The sparse term's weights for the next round (`ApproximateFit.calc_weights`):
/// `W = 1/(|I_R / (mean(I_B,i) + 1e-6)| + ε)`, scaled to mean 1.
fn update_weights(problem: &Admm<'_>, w: &mut [f32], st: &State, epsilon: f64) {
    let mean_s = mean(&st.s);
    let mean_dr = mean(&st.dr_prev);
    let scales: Vec<f32> = st.b.iter().map(|&b| (1.0 / (f64::from(b) * mean_s + mean_dr + 1e-6)) as f32).collect();
    let (isa, chunk) = (problem.isa, problem.layout.chunk_values());
    let totals: Vec<f64> =
        w.par_chunks_mut(chunk).zip(st.ir.par_chunks(chunk)).map(|(w, ir)| passes::weights(isa, ir, &scales, epsilon as f32, w)).collect();
    let factor = ((problem.n * problem.p) as f64 / totals.iter().sum::<f64>()) as f32;
    w.par_iter_mut().for_each(|v| *v *= factor);
}
