//! The passes of one ADMM iteration over the `images × pixels` arrays, as
//! kernels over one *pixel chunk* each.
//!
//! # Layout
//!
//! The fit's `n × p` arrays (images, sparse part, multipliers, weights) are
//! stored by pixel chunks ([`Chunked`]): chunk `c` covers pixels
//! `c·PIXEL_CHUNK ..` (`len` of them, `PIXEL_CHUNK` but for the last chunk)
//! and holds, image after image, those `len` pixels of every image,
//! contiguously from `c·PIXEL_CHUNK·n`. A pass then gives each parallel task one
//! contiguous block, and a per-pixel sum over the images (the flat-field's
//! step) and a per-image sum over the pixels (the baseline) come out of the same
//! pass.
//!
//! # Arithmetic
//!
//! Values are f32, as BaSiCPy's torch tensors. Sums over pixels accumulate in
//! `LANES` f32 partial sums per image and chunk (at most `PIXEL_CHUNK / LANES`
//! terms each), added up in f64: a single running f64 sum cannot vectorise.
//! The kernels are compiled for AVX-512 and AVX2 besides the portable build
//! and chosen at run time (`crate::simd`); every build computes the same values.

/// Pixels per chunk (see the module docs).
pub(crate) const PIXEL_CHUNK: usize = 512;
/// f32 partial sums per reduction.
const LANES: usize = 16;

use crate::simd::dispatched;

/// `n` images of `p` pixels laid out by pixel chunks (see the module docs).
#[derive(Debug, Clone, Copy)]
pub(crate) struct Chunked {
    pub n: usize,
    pub p: usize,
}

impl Chunked {
    /// Values per chunk (the last one may hold fewer).
    pub fn chunk_values(&self) -> usize {
        PIXEL_CHUNK * self.n
    }

    /// The chunked copy of image-major `x` (`n × p`).
    pub fn chunked(&self, x: &[f32]) -> Vec<f32> {
        let Chunked { n, p } = *self;
        let mut out = Vec::with_capacity(n * p);
        for p0 in (0..p).step_by(PIXEL_CHUNK) {
            let len = PIXEL_CHUNK.min(p - p0);
            for i in 0..n {
                out.extend_from_slice(&x[i * p + p0..i * p + p0 + len]);
            }
        }
        out
    }
}

/// The `LANES` f32 partial sums added up in f64.
#[inline(always)]
fn total(acc: &[f32; LANES]) -> f64 {
    acc.iter().map(|&v| f64::from(v)).sum()
}

/// BaSiCPy's soft threshold `sign(x)·max(|x| − t, 0)`.
#[inline(always)]
pub(crate) fn shrink(x: f32, t: f32) -> f32 {
    (x.abs() - t).max(0.0).copysign(x)
}

/// The per-pixel vectors of one chunk (each `len` long) and the per-image baselines.
#[derive(Clone, Copy)]
pub(crate) struct ChunkPixels<'a> {
    /// Flat-field `S`.
    pub s: &'a [f32],
    /// Dark-field remainder `D_R`.
    pub dr: &'a [f32],
    /// The flat-field of the iteration before (for the stored multipliers).
    pub s_prev: &'a [f32],
    /// Baseline `B_i` of every image.
    pub b: &'a [f32],
}

dispatched! {
    /// The flat-field's first step of a solve for one chunk, before its
    /// division by `ENT1`: `out[q] = mean_i(I − S·B_i − D_R)` (the general
    /// step with `I_R = 0` and `Y = 0`, as a solve starts).
    fn first_flatfield_step(px: ChunkPixels<'_>, im: &[f32], out: &mut [f32]) {
        let len = px.s.len();
        let (s, dr, out) = (px.s, &px.dr[..len], &mut out[..len]);
        out.fill(0.0);
        for (i, &bi) in px.b.iter().enumerate() {
            let im = &im[i * len..(i + 1) * len];
            for q in 0..len {
                out[q] += im[q] - (s[q] * bi + dr[q]);
            }
        }
        let inv_n = 1.0 / px.b.len().max(1) as f32;
        out.iter_mut().for_each(|o| *o *= inv_n);
    }
}

dispatched! {
    /// One ADMM iteration's pass over one chunk (see [`IterationData`]). With
    /// `Y = Y_s − corr·S_prev·B_i` (the multipliers, from their stored form):
    ///
    /// - the sparse part `I_R = shrink(I − S·B_i − D_R + Y/μ, W/μ)`, written to `ir`;
    /// - the stored multipliers `Y_s ← Y + μ·(I − D_R − I_R)`, written to `y`:
    ///   the new multipliers are that minus `μ·S·B'_i`, with the baselines `B'`
    ///   that `sums` gives;
    /// - per image (`sums[i]`, added to): `Σ (I − I_R)`; the same over the
    ///   pixels where `S ≥ mean_s`; `Σ E²` and `Σ E·S` with the residual at
    ///   the old baselines, `E = I − I_R − D_R − S·B_i`;
    /// - per pixel (`next`, added to): `Σ_i (E + (Y + μ·E)·next_inv_mu)`, the
    ///   next flat-field step at the old baselines and dark-field.
    ///
    /// Every sum is of small terms (residuals, not intensities), so f32
    /// partial sums keep their precision.
    fn iteration(px: ChunkPixels<'_>, data: IterationData<'_>, ir: &mut [f32], y: &mut [f32], sums: &mut [[f64; 4]], next: &mut [f32]) {
        let len = px.s.len();
        let (s, dr, s_prev, next) = (px.s, &px.dr[..len], &px.s_prev[..len], &mut next[..len]);
        let IterationData { im, w, mu, inv_mu, corr, next_inv_mu, mean_s } = data;
        // Without a split every pixel counts as inside; the caller ignores [1] then.
        let m = mean_s.unwrap_or(f32::NEG_INFINITY);
        // (I_R, I − I_R, E, Y_s, the next step's term) of one value.
        let element = |s: f32, dr: f32, s_prev: f32, im: f32, w: f32, ys: f32, bi: f32| -> [f32; 5] {
            let y = ys - corr * s_prev * bi;
            let r = shrink(im - (s * bi + dr) + y * inv_mu, w * inv_mu);
            let rest = im - r;
            let e = rest - dr - s * bi;
            let y_new = y + mu * e;
            [r, rest, e, y_new + mu * (s * bi), e + y_new * next_inv_mu]
        };
        let (s_blocks, s_tail) = s.as_chunks::<LANES>();
        let (dr_blocks, _) = dr.as_chunks::<LANES>();
        let (sp_blocks, _) = s_prev.as_chunks::<LANES>();
        let full = len - s_tail.len();
        for (i, &bi) in px.b.iter().enumerate() {
            let row = i * len..(i + 1) * len;
            let (im_blocks, _) = im[row.clone()].as_chunks::<LANES>();
            let (w_blocks, _) = w[row.clone()].as_chunks::<LANES>();
            let (ir_row, y_row) = (&mut ir[row.clone()], &mut y[row.clone()]);
            let (ir_blocks, _) = ir_row.as_chunks_mut::<LANES>();
            let (y_blocks, _) = y_row.as_chunks_mut::<LANES>();
            let (next_blocks, _) = next.as_chunks_mut::<LANES>();
            let mut acc = [[0f32; LANES]; 4];
            for (k, ((rk, yk), nk)) in ir_blocks.iter_mut().zip(y_blocks.iter_mut()).zip(next_blocks.iter_mut()).enumerate() {
                let (sk, dk, pk, ik, wk) = (&s_blocks[k], &dr_blocks[k], &sp_blocks[k], &im_blocks[k], &w_blocks[k]);
                for j in 0..LANES {
                    let [r, rest, e, ys, term] = element(sk[j], dk[j], pk[j], ik[j], wk[j], yk[j], bi);
                    rk[j] = r;
                    yk[j] = ys;
                    nk[j] += term;
                    acc[0][j] += rest;
                    acc[1][j] += if sk[j] >= m { rest } else { 0.0 };
                    acc[2][j] += e * e;
                    acc[3][j] += e * sk[j];
                }
            }
            for (total_k, lanes) in sums[i].iter_mut().zip(&acc) {
                *total_k += total(lanes);
            }
            for q in full..len {
                let at = row.start + q;
                let [r, rest, e, ys, term] = element(s[q], dr[q], s_prev[q], im[at], w[at], y[at], bi);
                ir[at] = r;
                y[at] = ys;
                next[q] += term;
                let inside = if s[q] >= m { rest } else { 0.0 };
                for (total_k, v) in sums[i].iter_mut().zip([rest, inside, e * e, e * s[q]]) {
                    *total_k += f64::from(v);
                }
            }
        }
    }
}

dispatched! {
    /// The sparse weights of one chunk, `W = 1/(|I_R·scale_i| + eps)`; returns `Σ W`.
    fn weights(ir: &[f32], scales: &[f32], eps: f32, w: &mut [f32]) -> f64 {
        let len = w.len() / scales.len().max(1);
        let mut sum = 0f64;
        for (i, &scale) in scales.iter().enumerate() {
            let row = i * len..(i + 1) * len;
            for (w, &r) in w[row.clone()].iter_mut().zip(&ir[row]) {
                *w = 1.0 / ((r * scale).abs() + eps);
            }
        }
        // A separate pass: the sum vectorises on its own.
        for row in w.chunks(len.max(1)) {
            let (blocks, tail) = row.as_chunks::<LANES>();
            let mut acc = [0f32; LANES];
            for block in blocks {
                for j in 0..LANES {
                    acc[j] += block[j];
                }
            }
            sum += total(&acc) + tail.iter().map(|&v| f64::from(v)).sum::<f64>();
        }
        sum
    }
}

/// The inputs of [`iteration`] besides the pixel vectors.
#[derive(Clone, Copy)]
pub(crate) struct IterationData<'a> {
    /// The chunk's images.
    pub im: &'a [f32],
    /// The chunk's sparse weights.
    pub w: &'a [f32],
    pub mu: f32,
    pub inv_mu: f32,
    /// The rank-one term the stored multipliers lack: the previous iteration's μ (0 after a reset).
    pub corr: f32,
    /// `1 / μ` of the next iteration.
    pub next_inv_mu: f32,
    /// `mean(S)` when the sums over `S ≥ mean(S)` are wanted (dark-field).
    pub mean_s: Option<f32>,
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::simd::Isa;

    /// Deterministic values in `[lo, lo + span)`.
    fn values(len: usize, seed: u32, lo: f32, span: f32) -> Vec<f32> {
        let mut x = seed.wrapping_mul(2654435761).max(1);
        (0..len)
            .map(|_| {
                x ^= x << 13;
                x ^= x >> 17;
                x ^= x << 5;
                lo + span * (x as f32 / u32::MAX as f32)
            })
            .collect()
    }

    /// Every instruction set computes the same bits, over a chunk that ends
    /// in a partial block (37 pixels: two blocks of 16 and 5).
    #[test]
    fn every_instruction_set_computes_the_same_values() {
        let (n, len) = (3, 37);
        let (s, dr, s_prev) = (values(len, 1, 0.5, 1.0), values(len, 2, -1.0, 2.0), values(len, 3, 0.5, 1.0));
        let (im, w) = (values(n * len, 4, 0.0, 100.0), values(n * len, 5, 0.1, 2.0));
        let (b, y0) = (vec![0.8, 1.0, 1.3], values(n * len, 6, -5.0, 10.0));
        let px = ChunkPixels { s: &s, dr: &dr, s_prev: &s_prev, b: &b };
        let data = IterationData { im: &im, w: &w, mu: 0.7, inv_mu: 1.0 / 0.7, corr: 0.5, next_inv_mu: 1.0 / 1.05, mean_s: Some(1.0) };
        let run = |isa| {
            let (mut ir, mut y, mut sums, mut next) = (vec![0f32; n * len], y0.clone(), vec![[0f64; 4]; n], vec![0f32; len]);
            iteration(isa, px, data, &mut ir, &mut y, &mut sums, &mut next);
            let mut w_out = vec![0f32; n * len];
            let total = weights(isa, &ir, &b, 0.1, &mut w_out);
            let mut step = vec![0f32; len];
            first_flatfield_step(isa, px, &im, &mut step);
            (ir, y, sums, next, w_out, total, step)
        };
        let want = run(Isa::Portable);
        // The sums are real: the residual's squares are positive.
        assert!(want.2.iter().all(|s| s[2] > 0.0), "{:?}", want.2);
        for isa in Isa::available() {
            let got = run(isa);
            assert!(got == want, "{isa:?} differs from the portable build");
        }
    }
}
