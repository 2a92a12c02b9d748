//! Registration of one pair of overlapping tiles from their overlap strips.
//!
//! Steps, per edge:
//! 1. [`EdgeGeometry`]: from the predicted offset, a window of each tile that
//!    covers the predicted overlap plus the search margin (clipped to the
//!    tile), cropped to a length the FFT likes (2^a 3^b 5^c).
//! 2. [`prepare_into`]: the window as f32 minus its mean; [`bandpass`] (3×3 mean
//!    minus a wider box mean) for correlation and score, so vignetting and
//!    background ramps, which differ between the two tiles, neither bias the
//!    correlation nor inflate the score.
//! 3. FFT cross-correlation (real-to-complex FFTs of the periodic components
//!    of the band-passed strips) searched only inside the allowed shift range
//!    (prediction ± max shift): the integer peak, then a parabolic fit.
//! 4. Sub-pixel refinement by Gauss–Newton (Lucas–Kanade) on the overlap,
//!    translation plus gain and offset. We refine in the image domain rather
//!    than with an upsampled DFT because it costs one pass over the overlap per
//!    iteration instead of `O(strip × upsampled points)` complex products, and it
//!    is not limited to a grid of 1/upsample px: it converges to ~0.01 px on
//!    textured overlaps in 2–4 iterations.
//! 5. Score: the normalised cross-correlation (Pearson r) of the high-passed
//!    overlap at the final shift — 1 for identical content, ~0 for unrelated.

// Numeric kernels index several arrays with one loop variable.
#![allow(clippy::needless_range_loop)]

use rustfft::num_complex::Complex32;

use crate::fft::{smooth_floor, Fft2d, Scratch};

/// A rectangle of a tile, in pixels (top-left, size).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct Window {
    pub y0: usize,
    pub x0: usize,
    pub h: usize,
    pub w: usize,
}

/// Where to cut the two strips of one edge and what shift to expect.
#[derive(Debug, Clone, Copy, PartialEq)]
pub(crate) struct EdgeGeometry {
    pub a: Window,
    pub b: Window,
    /// Expected shift `(x, y)` of window B's origin relative to window A's,
    /// in the common frame, for the predicted offset. The measured offset of
    /// the tiles is `predicted + (s - s0)`.
    pub s0: (f64, f64),
}

/// One axis of [`EdgeGeometry::new`]: `(start_a, start_b, len, s0)`.
fn axis(n: usize, d: f64, m: f64) -> Option<(usize, usize, usize, f64)> {
    let nf = n as f64;
    let o0 = d.max(0.0);
    let o1 = (d + nf).min(nf);
    let ov = o1 - o0;
    if ov <= 0.0 {
        return None;
    }
    // Margin so the search range (2m + 1 candidates) fits in the window
    // without wrapping onto itself.
    let e = m.max(2.0 * m + 1.0 - ov).ceil();
    let clip = |v: f64| v.clamp(0.0, nf) as usize;
    let (a0, a1) = (clip(o0.floor() - e), clip(o1.ceil() + e));
    let (b0, b1) = (clip((o0 - d).floor() - e), clip((o1 - d).ceil() + e));
    let len = smooth_floor((a1 - a0).min(b1 - b0));
    if len < 4 {
        return None;
    }
    // Anchor each window at the side facing the other tile, where the overlap is.
    let (sa, sb) = if d >= 0.0 { (a1 - len, b0) } else { (a0, b1 - len) };
    let s0 = (sb as f64 + d) - sa as f64;
    Some((sa, sb, len, s0))
}

impl EdgeGeometry {
    /// Geometry for tiles of `h × w` whose predicted offset (B minus A) is
    /// `(dx, dy)`, searching ± `max_shift` px around it. `None` if the
    /// predicted rectangles do not overlap.
    pub fn new(h: usize, w: usize, dx: f64, dy: f64, max_shift: f64) -> Option<EdgeGeometry> {
        let (xa, xb, lw, s0x) = axis(w, dx, max_shift)?;
        let (ya, yb, lh, s0y) = axis(h, dy, max_shift)?;
        Some(EdgeGeometry { a: Window { y0: ya, x0: xa, h: lh, w: lw }, b: Window { y0: yb, x0: xb, h: lh, w: lw }, s0: (s0x, s0y) })
    }
}

/// Copies `win` of one tile plane (row-major, `tile_w` wide) into `out` as
/// f32 minus its mean.
pub(crate) fn prepare_into<T: Copy>(plane: &[T], tile_w: usize, win: Window, conv: impl Fn(T) -> f32, out: &mut [f32]) {
    let (h, w) = (win.h, win.w);
    let mut sum = 0f64;
    for y in 0..h {
        let src = &plane[(win.y0 + y) * tile_w + win.x0..][..w];
        let row = &mut out[y * w..(y + 1) * w];
        for (o, &v) in row.iter_mut().zip(src) {
            *o = conv(v);
        }
        sum += lane_sums(row, |v: f32| [v])[0];
    }
    let mean = (sum / (h * w).max(1) as f64) as f32;
    out[..h * w].iter_mut().for_each(|v| *v -= mean);
}

/// `Σ f(v)` over `values`, component-wise, in f64. Eight interleaved f32
/// partial sums per component (so the adds vectorise instead of forming one
/// serial chain), each flushed to f64 every `FLUSH` values, so the f32 partial
/// sums stay short.
#[inline(always)]
fn lane_sums<T: Copy, const K: usize>(values: &[T], f: impl Fn(T) -> [f32; K]) -> [f64; K] {
    const LANES: usize = 8;
    const FLUSH: usize = 4096;
    let mut total = [0f64; K];
    for block in values.chunks(FLUSH) {
        let mut acc = [[0f32; LANES]; K];
        let mut chunks = block.chunks_exact(LANES);
        for chunk in chunks.by_ref() {
            for (l, &v) in chunk.iter().enumerate() {
                let t = f(v);
                for k in 0..K {
                    acc[k][l] += t[k];
                }
            }
        }
        for &v in chunks.remainder() {
            let t = f(v);
            for k in 0..K {
                acc[k][0] += t[k];
            }
        }
        for k in 0..K {
            total[k] += acc[k].iter().map(|&v| f64::from(v)).sum::<f64>();
        }
    }
    total
}

/// Box mean of radius `r` (clipped, edge-normalised at the borders), one
/// running-sum pass per axis. f32 sums are exact enough: strips are
/// mean-subtracted and at most a few thousand pixels long.
fn box_mean(buf: &[f32], h: usize, w: usize, r: usize, hm: &mut [f32], out: &mut [f32]) {
    let inv = |n: usize| -> Vec<f32> { (0..n).map(|i| 1.0 / ((i + r + 1).min(n) - i.saturating_sub(r)) as f32).collect() };
    let (invx, invy) = (inv(w), inv(h));
    // A running sum along a row is one serial chain of dependent adds. Eight
    // rows at a time are interleaved (`lanes[x][k]` = row k, column x), so one
    // 8-wide vector add advances all eight chains; the arithmetic per row is
    // exactly the scalar loop's below.
    const ROWS: usize = 8;
    let mut lanes = vec![[0f32; ROWS]; w];
    let mut sums = vec![[0f32; ROWS]; w];
    let mut rows = buf.chunks_exact(w * ROWS).zip(hm.chunks_exact_mut(w * ROWS));
    for (block, out) in rows.by_ref() {
        for (x, lane) in lanes.iter_mut().enumerate() {
            for (k, v) in lane.iter_mut().enumerate() {
                *v = block[k * w + x];
            }
        }
        let mut acc = [0f32; ROWS];
        for lane in &lanes[..r.min(w)] {
            for k in 0..ROWS {
                acc[k] += lane[k];
            }
        }
        for x in 0..w {
            if x + r < w {
                let lane = lanes[x + r];
                for k in 0..ROWS {
                    acc[k] += lane[k];
                }
            }
            if x > r {
                let lane = lanes[x - r - 1];
                for k in 0..ROWS {
                    acc[k] -= lane[k];
                }
            }
            let scale = invx[x];
            for k in 0..ROWS {
                sums[x][k] = acc[k] * scale;
            }
        }
        for (k, out) in out.chunks_exact_mut(w).enumerate() {
            for (o, s) in out.iter_mut().zip(&sums) {
                *o = s[k];
            }
        }
    }
    let done = h / ROWS * ROWS;
    for (row, out) in buf[done * w..h * w].chunks_exact(w).zip(hm[done * w..h * w].chunks_exact_mut(w)) {
        let mut acc: f32 = row[..r.min(w)].iter().sum();
        for x in 0..w {
            if x + r < w {
                acc += row[x + r];
            }
            if x > r {
                acc -= row[x - r - 1];
            }
            out[x] = acc * invx[x];
        }
    }
    let mut acc = vec![0f32; w];
    for row in hm.chunks_exact(w).take(r.min(h)) {
        for (a, &v) in acc.iter_mut().zip(row) {
            *a += v;
        }
    }
    for y in 0..h {
        if y + r < h {
            for (a, &v) in acc.iter_mut().zip(&hm[(y + r) * w..(y + r + 1) * w]) {
                *a += v;
            }
        }
        if y > r {
            for (a, &v) in acc.iter_mut().zip(&hm[(y - r - 1) * w..(y - r) * w]) {
                *a -= v;
            }
        }
        let k = invy[y];
        for (o, &a) in out[y * w..(y + 1) * w].iter_mut().zip(&acc) {
            *o = a * k;
        }
    }
}

/// 3×3 box mean (edge-normalised), separable.
fn box3(buf: &[f32], h: usize, w: usize, t: &mut [f32], out: &mut [f32]) {
    for (row, out) in buf.chunks_exact(w).zip(t.chunks_exact_mut(w)) {
        if w == 1 {
            out[0] = row[0];
            continue;
        }
        out[0] = (row[0] + row[1]) * 0.5;
        for x in 1..w - 1 {
            out[x] = (row[x - 1] + row[x] + row[x + 1]) * (1.0 / 3.0);
        }
        out[w - 1] = (row[w - 2] + row[w - 1]) * 0.5;
    }
    for y in 0..h {
        let (lo, hi) = (y.saturating_sub(1), (y + 1).min(h - 1));
        let k = 1.0 / (hi - lo + 1) as f32;
        let o = &mut out[y * w..(y + 1) * w];
        o.fill(0.0);
        for yy in lo..=hi {
            for (a, &v) in o.iter_mut().zip(&t[yy * w..(yy + 1) * w]) {
                *a += v;
            }
        }
        o.iter_mut().for_each(|a| *a *= k);
    }
}

/// Band-pass `box_3×3(x) − box_R(x)` (`R ≤ 1`: `box_3×3(x)` minus its mean):
/// removes shading (vignetting, background ramps: blank overlaps then score ~0)
/// and the pixel-level noise that would dominate a plain high-pass.
/// Writes into `out`; `t1`, `t2` are scratch of the same size.
pub(crate) fn bandpass(buf: &[f32], h: usize, w: usize, r: usize, out: &mut [f32], t1: &mut [f32], t2: &mut [f32]) {
    box3(buf, h, w, t1, out);
    if r > 1 {
        box_mean(buf, h, w, r, t1, t2);
        out.iter_mut().zip(t2.iter()).for_each(|(f, c)| *f -= c);
    } else {
        let mean = out.iter().map(|&v| f64::from(v)).sum::<f64>() / out.len().max(1) as f64;
        out.iter_mut().for_each(|v| *v -= mean as f32);
    }
}

/// Result of registering one pair of strips.
#[derive(Debug, Clone, Copy, PartialEq)]
pub(crate) struct PairResult {
    /// Measured shift `(x, y)` of B relative to A (compare with `EdgeGeometry::s0`).
    pub s: (f64, f64),
    /// Pearson correlation of the aligned, high-passed overlap.
    pub score: f64,
    /// The correlation peak sat on the border of the allowed search range and
    /// rose beyond it.
    pub at_limit: bool,
    /// Pixels of the aligned overlap.
    pub overlap_px: usize,
}

/// Reusable per-worker buffers, fitted to each edge's strip size by
/// [`Work::fit`]. Buffers are reused across the edges a worker registers:
/// fresh multi-megabyte allocations cost more in page faults than the arithmetic.
#[derive(Default)]
pub(crate) struct Work {
    pub fft: Scratch,
    /// Raw strips, filled by [`prepare_into`] before [`register`].
    pub a: Vec<f32>,
    pub b: Vec<f32>,
    fa: Vec<f32>,
    fb: Vec<f32>,
    t1: Vec<f32>,
    t2: Vec<f32>,
    spec_a: Vec<Complex32>,
    spec_b: Vec<Complex32>,
    corr: Vec<f32>,
}

impl Work {
    /// Sizes every buffer for `plan`'s strips (contents unspecified), keeping
    /// the allocations of earlier, larger strips.
    pub fn fit(&mut self, plan: &Fft2d) {
        let n = plan.h * plan.w;
        for v in [&mut self.a, &mut self.b, &mut self.fa, &mut self.fb, &mut self.t1, &mut self.t2, &mut self.corr] {
            v.resize(n, 0.0);
        }
        for v in [&mut self.spec_a, &mut self.spec_b] {
            v.resize(plan.wh * plan.h, Complex32::default());
        }
        plan.fit_scratch(&mut self.fft);
    }
}

/// Correlation peaks refined per edge (see [`register`]).
const MAX_CANDIDATES: usize = 3;

/// Registration settings used per pair.
#[derive(Debug, Clone, Copy)]
pub(crate) struct PairSettings {
    pub max_shift: f64,
    pub refine_iterations: usize,
    pub refine_samples: usize,
    /// Radius of the band-pass's coarse box (shading removal), px.
    pub highpass_radius: usize,
}

/// Registers strip `work.a` against strip `work.b` (both `plan.h × plan.w`,
/// from [`prepare_into`]), searching shifts within `s0 ± max_shift`.
///
/// The phase correlation and the score use band-passed strips (shading-free);
/// the refinement uses the raw strips with a gain and offset, because the
/// band-pass is computed per strip and differs between the two strips within
/// its radius of their borders, which would bias a sub-pixel fit on narrow
/// overlaps, while the shading difference between two tiles is smooth and
/// close to a gain.
pub(crate) fn register(s0: (f64, f64), plan: &Fft2d, work: &mut Work, set: &PairSettings) -> PairResult {
    let (h, w) = (plan.h, plan.w);
    bandpass(&work.a, h, w, set.highpass_radius, &mut work.fa, &mut work.t1, &mut work.t2);
    bandpass(&work.b, h, w, set.highpass_radius, &mut work.fb, &mut work.t1, &mut work.t2);
    let (a, b, fa, fb) = (&work.a, &work.b, &work.fa, &work.fb);
    // Periodic component only (Moisan's periodic + smooth decomposition):
    // the strips are not periodic, and the wrap-around steps at their
    // borders would correlate at zero shift and can beat the true peak on
    // narrow overlaps. Unlike a taper, this keeps the overlap, which always
    // touches a strip border, at full weight.
    periodic_spectrum(fa, plan, &mut work.spec_a, &mut work.fft);
    periodic_spectrum(fb, plan, &mut work.spec_b, &mut work.fft);
    // Plain cross-correlation of the band-passed strips, not whitened phase
    // correlation: whitening gives noise-dominated high frequencies the same
    // weight as the signal and loses narrow, noisy overlaps; the band-pass
    // already removes the shading that plain correlation would lock onto.
    // The broader peak only needs to be right to a pixel or two: the
    // refinement below converges from there.
    for (x, y) in work.spec_a.iter_mut().zip(&work.spec_b) {
        *x *= y.conj();
    }
    plan.inverse(&mut work.spec_a, &mut work.corr, &mut work.fft);
    let corr = &work.corr;

    // Integer peak inside the allowed range.
    let m = set.max_shift;
    let (xlo, xhi) = ((s0.0 - m).ceil() as i64, (s0.0 + m).floor() as i64);
    let (ylo, yhi) = ((s0.1 - m).ceil() as i64, (s0.1 + m).floor() as i64);
    // Wrapped indices of the searched shifts and their neighbours, computed
    // once: the 3×3 maximum test reads ~9 values per candidate shift, and an
    // integer remainder per read cost more than the FFTs on wide searches.
    let wrap = |lo: i64, hi: i64, n: usize| -> Vec<usize> { (lo - 1..=hi + 1).map(|v| v.rem_euclid(n as i64) as usize).collect() };
    let (wx, wy) = (wrap(xlo, xhi, w), wrap(ylo, yhi, h));
    let at = |sx: i64, sy: i64| -> f32 {
        let ix = match usize::try_from(sx - (xlo - 1)).ok().and_then(|i| wx.get(i)) {
            Some(&i) => i,
            None => sx.rem_euclid(w as i64) as usize,
        };
        let iy = match usize::try_from(sy - (ylo - 1)).ok().and_then(|i| wy.get(i)) {
            Some(&i) => i,
            None => sy.rem_euclid(h as i64) as usize,
        };
        corr[iy * w + ix]
    };
    // Candidate peaks: local maxima (3×3) inside the range, best first; the
    // runners-up only when within half of the best. Real tissue has repeated
    // texture and uneven brightness, and the highest correlation of a wide
    // strip is not always the right one: each candidate is refined and the
    // one whose aligned overlap correlates best wins.
    let mut peaks: Vec<(f32, i64, i64)> = Vec::new();
    for sy in ylo..=yhi {
        for sx in xlo..=xhi {
            let v = at(sx, sy);
            let is_max = (-1..=1).all(|dy| (-1..=1).all(|dx| (dx == 0 && dy == 0) || at(sx + dx, sy + dy) <= v));
            if is_max {
                peaks.push((v, sx, sy));
            }
        }
    }
    peaks.sort_by(|p, q| {
        q.0.total_cmp(&p.0).then(
            ((p.1 as f64 - s0.0).abs() + (p.2 as f64 - s0.1).abs()).total_cmp(&((q.1 as f64 - s0.0).abs() + (q.2 as f64 - s0.1).abs())),
        )
    });
    let top = peaks.first().map_or(0.0, |p| p.0);
    peaks.retain(|p| p.0 >= 0.5 * top);
    peaks.truncate(MAX_CANDIDATES);
    if peaks.is_empty() {
        peaks.push((0.0, s0.0.round() as i64, s0.1.round() as i64));
    }
    let parabola = |l: f32, c: f32, r: f32| -> f64 {
        let den = f64::from(l) - 2.0 * f64::from(c) + f64::from(r);
        if den < 0.0 {
            (0.5 * f64::from(l - r) / den).clamp(-0.5, 0.5)
        } else {
            0.0
        }
    };
    let margin = set.highpass_radius.min(2);
    let mut best: Option<PairResult> = None;
    for &(_, px, py) in &peaks {
        // On the border of the range with a higher value just outside: the
        // true peak is probably beyond max_shift.
        let c = at(px, py);
        let at_limit = (px == xlo && at(px - 1, py) > c)
            || (px == xhi && at(px + 1, py) > c)
            || (py == ylo && at(px, py - 1) > c)
            || (py == yhi && at(px, py + 1) > c);
        let fx = parabola(at(px - 1, py), c, at(px + 1, py));
        let fy = parabola(at(px, py - 1), c, at(px, py + 1));
        let coarse = (px as f64 + fx, py as f64 + fy);
        // Keep the refinement unless it failed or left the search range. (The
        // band-passed score is not a fair judge between two shifts a pixel
        // apart: within its radius of the strip borders the band-pass differs
        // between strips. It is between distinct peaks.)
        let s = match refine(a, b, h, w, coarse, set) {
            Some(r) if (r.0 - s0.0).abs() <= m + 1.0 && (r.1 - s0.1).abs() <= m + 1.0 => r,
            _ => coarse,
        };
        let (score, overlap_px) = ncc(fa, fb, h, w, s, margin);
        if best.is_none_or(|b| score > b.score) {
            best = Some(PairResult { s, score, at_limit, overlap_px });
        }
    }
    best.unwrap_or(PairResult { s: s0, score: 0.0, at_limit: false, overlap_px: 0 })
}

/// Spectrum of the periodic component of `u` (`h × w`): `û − v̂ / λ` with
/// `v` the wrap-around differences at the borders and `λ` the eigenvalues of
/// the periodic discrete Laplacian (L. Moisan, "Periodic plus smooth image
/// decomposition", JMIV 2011).
///
/// `v` is non-zero only on the border, so its spectrum is separable and needs
/// two 1-D FFTs instead of a 2-D one: with `d_y = u(y, w−1) − u(y, 0)` and
/// `e_x = u(h−1, x) − u(0, x)`,
/// `v̂(q, r) = D̂(r)·(1 − e^{2πiq/w}) + Ê(q)·(1 − e^{2πir/h})`.
fn periodic_spectrum(u: &[f32], plan: &Fft2d, spec: &mut [Complex32], s: &mut Scratch) {
    let (h, w) = (plan.h, plan.w);
    plan.forward(u, spec, s);
    let d: Vec<f32> = (0..h).map(|y| u[y * w + w - 1] - u[y * w]).collect();
    let e: Vec<f32> = (0..w).map(|x| u[(h - 1) * w + x] - u[x]).collect();
    let (dh, eh) = plan.spectra_1d(&d, &e, s);
    let tau = std::f32::consts::TAU;
    let cy: Vec<f32> = (0..h).map(|r| 2.0 * (tau * r as f32 / h as f32).cos()).collect();
    let ry: Vec<Complex32> = (0..h).map(|r| Complex32::new(1.0, 0.0) - Complex32::from_polar(1.0, tau * r as f32 / h as f32)).collect();
    for q in 0..plan.wh {
        let cx = 2.0 * (tau * q as f32 / w as f32).cos() - 4.0;
        let rx = Complex32::new(1.0, 0.0) - Complex32::from_polar(1.0, tau * q as f32 / w as f32);
        let e = eh[q];
        // (0, 0) is the mean, which the periodic component keeps (λ = 0 there).
        let first = usize::from(q == 0);
        let col = &mut spec[q * h..(q + 1) * h];
        for ((c, (&d, &y)), &cyr) in col.iter_mut().zip(dh.iter().zip(&ry)).zip(&cy).skip(first) {
            let v = d * rx + e * y;
            *c -= v / (cx + cyr);
        }
    }
}

/// Range of integer B coordinates `v` along one axis with `v` in
/// `[k, n-1-k]` and `v + s` in `[k, n-1-k)` (bilinear needs the next pixel),
/// `k = max(1, margin)`: central differences need one neighbour, and pixels
/// closer than the high-pass radius to a strip border were filtered with a
/// clipped box that differs between the two strips. `None` if empty.
fn valid_range(n: usize, s: f64, margin: usize) -> Option<(usize, usize)> {
    let k = margin.max(1) as f64;
    let lo = (k - s).ceil().max(k);
    let hi = ((n as f64 - 1.0 - k - s) - 1e-9).floor().min(n as f64 - 1.0 - k);
    (hi >= lo).then_some((lo as usize, hi as usize))
}

/// Gauss–Newton refinement of `s` minimising
/// `Σ (A(v + s) − g·B(v) − o − cx·x − cy·y)²` over the overlap (`A` bilinear,
/// `∇A(v+s) ≈ g ∇B(v)`, `x, y` the strip coordinates scaled to ±1).
///
/// The ramp terms absorb the shading difference: the overlap sits at
/// opposite sides of the two tiles, so vignetting slopes the background in
/// opposite directions, which a gain alone cannot match and which would pull
/// the shift on sparse overlaps. `None` if the overlap is too small or flat.
fn refine(a: &[f32], b: &[f32], h: usize, w: usize, mut s: (f64, f64), set: &PairSettings) -> Option<(f64, f64)> {
    const P: usize = 6;
    let mut g = 1.0f64;
    let (sx, sy) = (2.0 / w.max(2) as f32, 2.0 / h.max(2) as f32);
    let mut lin = [0f64; 3]; // o, cx, cy
                             // Far from the optimum a quarter of the samples gives the step just as
                             // well; the full sample count is used once steps are below `FINE_STEP`,
                             // so the converged shift is the full-sample one.
    const FINE_STEP: f64 = 0.05;
    let mut coarse = true;
    let mut last_step = (f64::NAN, f64::NAN);
    for _ in 0..set.refine_iterations {
        let (xlo, xhi) = valid_range(w, s.0, 1)?;
        let (ylo, yhi) = valid_range(h, s.1, 1)?;
        let n = (xhi - xlo + 1) * (yhi - ylo + 1);
        let samples = if coarse { set.refine_samples / 4 } else { set.refine_samples };
        let stride = ((n as f64 / samples.max(1) as f64).sqrt().ceil() as usize).max(1);
        let (ix, iy) = (s.0.floor() as i64, s.1.floor() as i64);
        let (fx, fy) = ((s.0 - ix as f64) as f32, (s.1 - iy as f64) as f32);
        let c = [(1.0 - fx) * (1.0 - fy), fx * (1.0 - fy), (1.0 - fx) * fy, fx * fy];
        let gf = g as f32;
        let (o, cx, cy) = (lin[0] as f32, lin[1] as f32, lin[2] as f32);
        let mut hm = [[0f64; P]; P];
        let mut gv = [0f64; P];
        for vy in (ylo..=yhi).step_by(stride) {
            let ay = (vy as i64 + iy) as usize;
            let a0 = &a[ay * w..(ay + 1) * w];
            let a1 = &a[(ay + 1) * w..(ay + 2) * w];
            let bc = &b[vy * w..(vy + 1) * w];
            let bu = &b[(vy - 1) * w..vy * w];
            let bd = &b[(vy + 1) * w..(vy + 2) * w];
            let yn = vy as f32 * sy - 1.0;
            let mut rh = [[0f32; P]; P];
            let mut rg = [0f32; P];
            for vx in (xlo..=xhi).step_by(stride) {
                let ax = (vx as i64 + ix) as usize;
                let av = c[0] * a0[ax] + c[1] * a0[ax + 1] + c[2] * a1[ax] + c[3] * a1[ax + 1];
                let bv = bc[vx];
                let xn = vx as f32 * sx - 1.0;
                let j = [gf * 0.5 * (bc[vx + 1] - bc[vx - 1]), gf * 0.5 * (bd[vx] - bu[vx]), -bv, -1.0, -xn, -yn];
                let r = av - gf * bv - o - cx * xn - cy * yn;
                for p in 0..P {
                    for q in p..P {
                        rh[p][q] += j[p] * j[q];
                    }
                    rg[p] += j[p] * r;
                }
            }
            for p in 0..P {
                for q in p..P {
                    hm[p][q] += f64::from(rh[p][q]);
                }
                gv[p] += f64::from(rg[p]);
            }
        }
        for p in 0..P {
            for q in 0..p {
                hm[p][q] = hm[q][p];
            }
        }
        let d = solve(hm, gv.map(|v| -v))?;
        let step = (d[0].clamp(-1.0, 1.0), d[1].clamp(-1.0, 1.0));
        s = (s.0 + step.0, s.1 + step.1);
        g += d[2];
        lin[0] += d[3];
        lin[1] += d[4];
        lin[2] += d[5];
        if !(g.is_finite() && g > 0.05) {
            return None;
        }
        if step.0.abs() < 1e-3 && step.1.abs() < 1e-3 {
            if coarse {
                coarse = false;
                continue;
            }
            break;
        }
        // A shift on the edge of a pixel can alternate between two sample
        // grids (the overlap's integer range changes with `floor(s)`), each
        // step undoing the last: the optimum is between them.
        if !coarse && (step.0 + last_step.0).abs() < 1e-3 && (step.1 + last_step.1).abs() < 1e-3 {
            s = (s.0 - 0.5 * step.0, s.1 - 0.5 * step.1);
            break;
        }
        if step.0.abs() < FINE_STEP && step.1.abs() < FINE_STEP {
            coarse = false;
        }
        last_step = step;
    }
    Some(s)
}

/// Solves a small dense system by Gaussian elimination with partial pivoting.
fn solve<const N: usize>(mut m: [[f64; N]; N], mut r: [f64; N]) -> Option<[f64; N]> {
    let scale = m.iter().flatten().fold(0f64, |a, &v| a.max(v.abs()));
    if !(scale > 0.0 && scale.is_finite()) {
        return None;
    }
    for col in 0..N {
        let p = (col..N).max_by(|&i, &j| m[i][col].abs().total_cmp(&m[j][col].abs()))?;
        if m[p][col].abs() < 1e-12 * scale {
            return None;
        }
        m.swap(col, p);
        r.swap(col, p);
        for row in col + 1..N {
            let f = m[row][col] / m[col][col];
            for k in col..N {
                m[row][k] -= f * m[col][k];
            }
            r[row] -= f * r[col];
        }
    }
    let mut x = [0f64; N];
    for row in (0..N).rev() {
        let mut v = r[row];
        for k in row + 1..N {
            v -= m[row][k] * x[k];
        }
        x[row] = v / m[row][row];
    }
    x.iter().all(|v| v.is_finite()).then_some(x)
}

/// Pearson correlation of `A(v + s)` (bilinear) and `B(v)` over their
/// overlap, and the overlap size in pixels. 0 when undefined.
pub(crate) fn ncc(a: &[f32], b: &[f32], h: usize, w: usize, s: (f64, f64), margin: usize) -> (f64, usize) {
    let (Some((xlo, xhi)), Some((ylo, yhi))) = (valid_range(w, s.0, margin), valid_range(h, s.1, margin)) else {
        return (0.0, 0);
    };
    let (ix, iy) = (s.0.floor() as i64, s.1.floor() as i64);
    let (fx, fy) = ((s.0 - ix as f64) as f32, (s.1 - iy as f64) as f32);
    let c = [(1.0 - fx) * (1.0 - fy), fx * (1.0 - fy), (1.0 - fx) * fy, fx * fy];
    let mut t = [0f64; 5];
    let len = xhi - xlo + 1;
    // One row of A resampled at the shift next to B's row, then the five sums.
    let mut row = vec![(0f32, 0f32); len];
    for vy in ylo..=yhi {
        let ay = (vy as i64 + iy) as usize;
        let ax = (xlo as i64 + ix) as usize;
        let a0 = &a[ay * w + ax..][..len + 1];
        let a1 = &a[(ay + 1) * w + ax..][..len + 1];
        let bc = &b[vy * w + xlo..][..len];
        for (k, (o, &bv)) in row.iter_mut().zip(bc).enumerate() {
            *o = (c[0] * a0[k] + c[1] * a0[k + 1] + c[2] * a1[k] + c[3] * a1[k + 1], bv);
        }
        let r = lane_sums(&row, |(av, bv)| [av, bv, av * av, bv * bv, av * bv]);
        for k in 0..5 {
            t[k] += r[k];
        }
    }
    let n = ((xhi - xlo + 1) * (yhi - ylo + 1)) as f64;
    let va = t[2] - t[0] * t[0] / n;
    let vb = t[3] - t[1] * t[1] / n;
    let cov = t[4] - t[0] * t[1] / n;
    let den = (va * vb).sqrt();
    let r = if den > 0.0 && den.is_finite() { (cov / den).clamp(-1.0, 1.0) } else { 0.0 };
    (r, n as usize)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn geometry_horizontal_neighbour() {
        // 100 px tiles, 20 px overlap, ±5 px search.
        let g = EdgeGeometry::new(100, 100, 80.0, 0.0, 5.0).unwrap();
        assert_eq!(g.a.x0 + g.a.w, 100);
        assert_eq!(g.b.x0, 0);
        assert!(g.a.w >= 25 && g.a.h == 100);
        assert!((g.s0.0 - (80.0 - g.a.x0 as f64)).abs() < 1e-12);
        assert!(EdgeGeometry::new(100, 100, 120.0, 0.0, 5.0).is_none());
    }

    #[test]
    fn periodic_spectrum_matches_the_2d_boundary_transform() {
        use crate::fft::PlanCache;
        let (h, w) = (12, 10);
        let u: Vec<f32> = (0..h * w).map(|i| ((i * 7919) % 97) as f32 * 0.1 + (i / w) as f32).collect();
        let mut cache = PlanCache::default();
        let plan = cache.get_or_plan(h, w);
        let mut sc = crate::fft::Scratch::default();
        plan.fit_scratch(&mut sc);
        let mut fast = vec![Complex32::default(); plan.wh * h];
        periodic_spectrum(&u, &plan, &mut fast, &mut sc);
        // Reference: v built explicitly and transformed in 2-D.
        let mut v = vec![0f32; h * w];
        for x in 0..w {
            let d = u[(h - 1) * w + x] - u[x];
            v[x] += d;
            v[(h - 1) * w + x] -= d;
        }
        for y in 0..h {
            let d = u[y * w + w - 1] - u[y * w];
            v[y * w] += d;
            v[y * w + w - 1] -= d;
        }
        let mut su = vec![Complex32::default(); plan.wh * h];
        let mut sv = vec![Complex32::default(); plan.wh * h];
        plan.forward(&u, &mut su, &mut sc);
        plan.forward(&v, &mut sv, &mut sc);
        for q in 0..plan.wh {
            for r in 0..h {
                let lambda = 2.0 * (std::f32::consts::TAU * q as f32 / w as f32).cos()
                    + 2.0 * (std::f32::consts::TAU * r as f32 / h as f32).cos()
                    - 4.0;
                let want = if q == 0 && r == 0 { su[0] } else { su[q * h + r] - sv[q * h + r] / lambda };
                assert!((want - fast[q * h + r]).norm() < 1e-2 * (1.0 + want.norm()), "{q},{r}");
            }
        }
    }

    #[test]
    fn solve_identity() {
        let m = [[2.0, 0.0, 0.0, 0.0], [0.0, 3.0, 0.0, 0.0], [0.0, 0.0, 4.0, 0.0], [0.0, 0.0, 0.0, 5.0]];
        let x = solve(m, [2.0, 3.0, 4.0, 5.0]).unwrap();
        assert_eq!(x, [1.0; 4]);
    }
}
