//! Richardson–Lucy with a separable PSF (`h = a ⊗ b ⊗ c`, as every Gaussian
//! is) by direct 1D convolutions along x, y and z instead of FFTs: the same
//! operator (zero outside the image for [`Boundary::Same`], wrapped for
//! [`Boundary::Circular`]; the adjoint is the correlation with the same
//! kernels), so the same iterates to f32 rounding, in `kz + ky + kx` multiply-
//! adds per voxel and blur instead of an FFT's transform passes.
//!
//! Memory: the estimate, one volume-sized work buffer (with acceleration two
//! more), and per worker one plane and two small z blocks.

use rayon::prelude::*;

use crate::engine::{Boundary, RlParams};
use crate::Psf;

/// The three 1D kernels of a separable PSF and their centres (`(k − 1) / 2`).
#[derive(Debug, Clone)]
pub(crate) struct Kernels {
    /// z, y, x.
    k: [Vec<f32>; 3],
}

/// A PSF's 1D factors when it is separable: its marginals (each sums to 1
/// since the PSF does) reproduce every value to `1e-5` of its peak. `None`
/// otherwise.
pub(crate) fn factor(psf: &Psf) -> Option<Kernels> {
    let h = psf.view();
    let (kz, ky, kx) = h.dim();
    let (mut a, mut b, mut c) = (vec![0.0f64; kz], vec![0.0f64; ky], vec![0.0f64; kx]);
    for ((z, y, x), &v) in h.indexed_iter() {
        let v = f64::from(v);
        a[z] += v;
        b[y] += v;
        c[x] += v;
    }
    let peak = h.iter().fold(0.0f32, |m, &v| m.max(v)) as f64;
    let separable = h.indexed_iter().all(|((z, y, x), &v)| (f64::from(v) - a[z] * b[y] * c[x]).abs() <= 1e-5 * peak);
    let f32s = |v: Vec<f64>| v.into_iter().map(|x| x as f32).collect();
    separable.then(|| Kernels { k: [f32s(a), f32s(b), f32s(c)] })
}

impl Kernels {
    /// Multiply-adds per voxel for one blur.
    pub(crate) fn taps(&self) -> usize {
        self.k.iter().map(Vec::len).sum()
    }
}

/// `dst[i] = Σ_j k[j] · src[i + s_j]` over `n` vectors of `w` contiguous
/// values (`src`, `dst`: `[n][w]`), `s_j = c − j` (convolution) or `j − c`
/// (`adjoint`: correlation), `c = (k − 1) / 2` (odd `k ≤ n`); outside
/// `[0, n)` zero, or wrapped when `circular`. Uses AVX2 + FMA when the CPU
/// has them.
fn conv_axis(src: &[f32], dst: &mut [f32], n: usize, w: usize, k: &[f32], adjoint: bool, circular: bool) {
    #[cfg(target_arch = "x86_64")]
    {
        if std::arch::is_x86_feature_detected!("avx2") && std::arch::is_x86_feature_detected!("fma") {
            // SAFETY: the CPU has the features the function is compiled for.
            unsafe { conv_axis_avx2(src, dst, n, w, k, adjoint, circular) };
            return;
        }
    }
    conv_axis_impl::<false>(src, dst, n, w, k, adjoint, circular);
}

#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx2,fma")]
unsafe fn conv_axis_avx2(src: &[f32], dst: &mut [f32], n: usize, w: usize, k: &[f32], adjoint: bool, circular: bool) {
    conv_axis_impl::<true>(src, dst, n, w, k, adjoint, circular);
}

/// Outputs accumulated in registers at a time.
const LANES: usize = 32;

/// `a · b + c`, fused when `FMA` (the AVX2 + FMA build: one instruction; a
/// fused multiply-add without the hardware is a slow library call).
#[inline(always)]
fn madd<const FMA: bool>(a: f32, b: f32, c: f32) -> f32 {
    if FMA {
        a.mul_add(b, c)
    } else {
        a * b + c
    }
}

#[inline(always)]
fn conv_axis_impl<const FMA: bool>(src: &[f32], dst: &mut [f32], n: usize, w: usize, k: &[f32], adjoint: bool, circular: bool) {
    let c = (k.len() - 1) / 2;
    let shift = |j: usize| if adjoint { j as isize - c as isize } else { c as isize - j as isize };
    // Interior vectors i in [c, n − c): every tap inside, one flat range of
    // outputs, each the sum of k taps at fixed offsets.
    if n > 2 * c {
        let offsets: Vec<(isize, f32)> = k.iter().enumerate().map(|(j, &kj)| (shift(j) * w as isize, kj)).collect();
        let (start, end) = (c * w, (n - c) * w);
        let mut e = start;
        while e + LANES <= end {
            let mut acc = [0.0f32; LANES];
            for &(o, kj) in &offsets {
                let from = (e as isize + o) as usize;
                let s = &src[from..from + LANES];
                for t in 0..LANES {
                    acc[t] = madd::<FMA>(kj, s[t], acc[t]);
                }
            }
            dst[e..e + LANES].copy_from_slice(&acc);
            e += LANES;
        }
        for e in e..end {
            dst[e] = offsets.iter().fold(0.0, |a, &(o, kj)| madd::<FMA>(kj, src[(e as isize + o) as usize], a));
        }
    }
    // Edge vectors: the taps that fall inside (or wrap).
    let edges = (0..c.min(n)).chain(n.saturating_sub(c).max(c.min(n))..n);
    let mut taps: Vec<(usize, f32)> = Vec::with_capacity(k.len());
    for i in edges {
        taps.clear();
        for (j, &kj) in k.iter().enumerate() {
            let m = i as isize + shift(j);
            if (0..n as isize).contains(&m) {
                taps.push((m as usize, kj));
            } else if circular {
                taps.push((m.rem_euclid(n as isize) as usize, kj));
            }
        }
        let out = &mut dst[i * w..(i + 1) * w];
        let mut t0 = 0;
        while t0 + LANES <= w {
            let mut acc = [0.0f32; LANES];
            for &(m, kj) in &taps {
                let s = &src[m * w + t0..m * w + t0 + LANES];
                for t in 0..LANES {
                    acc[t] = madd::<FMA>(kj, s[t], acc[t]);
                }
            }
            out[t0..t0 + LANES].copy_from_slice(&acc);
            t0 += LANES;
        }
        for (t, o) in out.iter_mut().enumerate().skip(t0) {
            *o = taps.iter().fold(0.0, |a, &(m, kj)| madd::<FMA>(kj, src[m * w + t], a));
        }
    }
}

/// [`conv_axis`] along one contiguous row (`w = 1`) through a padded copy
/// (`pad`, `out`: scratch of at least `row_scratch_len(n, k)`), so every
/// output is computed in full-width chunks.
fn conv_row(src: &[f32], dst: &mut [f32], k: &[f32], adjoint: bool, circular: bool, pad: &mut [f32], out: &mut [f32]) {
    #[cfg(target_arch = "x86_64")]
    {
        if std::arch::is_x86_feature_detected!("avx2") && std::arch::is_x86_feature_detected!("fma") {
            // SAFETY: the CPU has the features the function is compiled for.
            unsafe { conv_row_avx2(src, dst, k, adjoint, circular, pad, out) };
            return;
        }
    }
    conv_row_impl::<false>(src, dst, k, adjoint, circular, pad, out);
}

#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx2,fma")]
unsafe fn conv_row_avx2(src: &[f32], dst: &mut [f32], k: &[f32], adjoint: bool, circular: bool, pad: &mut [f32], out: &mut [f32]) {
    conv_row_impl::<true>(src, dst, k, adjoint, circular, pad, out);
}

/// Scratch length of [`conv_row`] for rows of `n` and `k` taps.
fn row_scratch_len(n: usize, k: usize) -> usize {
    n.div_ceil(LANES) * LANES + k
}

#[inline(always)]
fn conv_row_impl<const FMA: bool>(
    src: &[f32],
    dst: &mut [f32],
    k: &[f32],
    adjoint: bool,
    circular: bool,
    pad: &mut [f32],
    out: &mut [f32],
) {
    let n = src.len();
    let c = (k.len() - 1) / 2;
    let m = n.div_ceil(LANES) * LANES;
    // pad[p] = the row's value at p − c (zero or wrapped outside), p < m + 2c
    let pad = &mut pad[..m + 2 * c];
    if circular {
        pad[..c].copy_from_slice(&src[n - c..]);
        pad[c + n..2 * c + n].copy_from_slice(&src[..c]);
    } else {
        pad[..c].fill(0.0);
        pad[c + n..2 * c + n].fill(0.0);
    }
    pad[c..c + n].copy_from_slice(src);
    pad[2 * c + n..].fill(0.0);
    for i0 in (0..m).step_by(LANES) {
        let mut acc = [0.0f32; LANES];
        for (j, &kj) in k.iter().enumerate() {
            // value at i + s_j = pad[i + c + s_j]
            let off = if adjoint { j } else { 2 * c - j };
            let s = &pad[i0 + off..i0 + off + LANES];
            for t in 0..LANES {
                acc[t] = madd::<FMA>(kj, s[t], acc[t]);
            }
        }
        if i0 + LANES <= n {
            dst[i0..i0 + LANES].copy_from_slice(&acc);
        } else {
            out[..LANES].copy_from_slice(&acc);
            dst[i0..].copy_from_slice(&out[..n - i0]);
        }
    }
}

/// Per-worker buffers.
struct Scratch {
    plane: Vec<f32>,
    row: Vec<f32>,
    pad: Vec<f32>,
    out: Vec<f32>,
    block_in: Vec<f32>,
    block_out: Vec<f32>,
}

/// Rows per z block: about 2048 values, so a block of all planes stays in L2.
fn block_rows(nx: usize) -> usize {
    (2048 / nx.max(1)).max(1)
}

/// Richardson–Lucy (the crate's update, ε and non-negativity policy) with a
/// separable PSF on `image` (`[nz][ny][nx]`, checked by the caller).
pub(crate) fn run(kernels: &Kernels, image: &[f32], n: [usize; 3], params: &RlParams) -> Vec<f32> {
    let [nz, ny, nx] = n;
    let plane = ny * nx;
    let circular = params.boundary == Boundary::Circular;
    let eps = params.epsilon;
    let [kz, ky, kx] = &kernels.k;
    let by = block_rows(nx);
    let scratch = || Scratch {
        plane: vec![0.0; plane],
        row: vec![0.0; nx],
        pad: vec![0.0; row_scratch_len(nx, kx.len())],
        out: vec![0.0; row_scratch_len(nx, kx.len())],
        block_in: vec![0.0; nz * by * nx],
        block_out: vec![0.0; nz * by * nx],
    };
    let mut x = vec![0.5f32; nz * plane];
    let mut work = vec![0.0f32; nz * plane];
    let (mut prev, mut g) = if params.acceleration { (x.clone(), vec![0.0f32; nz * plane]) } else { (Vec::new(), Vec::new()) };
    let mut alpha = 0.0f32;

    // In-plane x then y blur of `src` plane (rows given by `row_of`) into `dst`.
    // (the rows of `xs`, or with `extrapolate = (prev, α)` those of max(xs + α (xs − prev), 0))
    let blur_plane = |s: &mut Scratch, dst: &mut [f32], xs: &[f32], extrapolate: Option<(&[f32], f32)>| {
        for y in 0..ny {
            let r = y * nx..(y + 1) * nx;
            let row = match extrapolate {
                None => &xs[r.clone()],
                Some((prev, alpha)) => {
                    for ((o, &a), &b) in s.row.iter_mut().zip(&xs[r.clone()]).zip(&prev[r.clone()]) {
                        *o = (a + alpha * (a - b)).max(0.0);
                    }
                    &s.row[..]
                }
            };
            conv_row(row, &mut s.plane[r], kx, false, circular, &mut s.pad, &mut s.out);
        }
        conv_axis(&s.plane, dst, ny, nx, ky, false, circular);
    };

    for _ in 0..params.iterations {
        // 1. work = in-plane blur of the estimate (or the extrapolated point).
        {
            let (x, prev) = (&x, &prev);
            work.par_chunks_mut(plane).enumerate().for_each_init(scratch, |s, (z, dst)| {
                let xs = &x[z * plane..(z + 1) * plane];
                let extrapolate = params.acceleration.then(|| (&prev[z * plane..(z + 1) * plane], alpha));
                blur_plane(s, dst, xs, extrapolate);
            });
        }
        // 2. work = image / max(z blur of work, ε), block by block (a block:
        // the same rows of every plane, gathered before being overwritten).
        let bw = by * nx;
        blocks_mut(&mut work, plane, bw).into_par_iter().enumerate().for_each_init(scratch, |s, (b, mut parts)| {
            let w = parts[0].len();
            gather(s, &parts, w);
            conv_axis(&s.block_in, &mut s.block_out, nz, w, kz, false, circular);
            for (z, part) in parts.iter_mut().enumerate() {
                let img = &image[z * plane + b * bw..z * plane + b * bw + w];
                for ((o, &v), &d) in part.iter_mut().zip(&s.block_out[z * w..(z + 1) * w]).zip(img) {
                    *o = d / v.max(eps);
                }
            }
        });
        // 3. work = in-plane adjoint blur of the ratio (in place through the plane scratch).
        work.par_chunks_mut(plane).for_each_init(scratch, |s, dst| {
            for y in 0..ny {
                conv_row(&dst[y * nx..(y + 1) * nx], &mut s.plane[y * nx..(y + 1) * nx], kx, true, circular, &mut s.pad, &mut s.out);
            }
            conv_axis(&s.plane, dst, ny, nx, ky, true, circular);
        });
        // 4. the update with the z adjoint, block by block.
        let work_blocks = blocks_mut(&mut work, plane, bw);
        let x_blocks = blocks_mut(&mut x, plane, bw);
        if params.acceleration {
            let jobs: Vec<_> = work_blocks
                .into_iter()
                .zip(x_blocks)
                .zip(blocks_mut(&mut prev, plane, bw).into_iter().zip(blocks_mut(&mut g, plane, bw)))
                .collect();
            let (num, den) = jobs
                .into_par_iter()
                .map_init(scratch, |s, ((parts, mut xs), (mut ps, mut gs))| {
                    let w = parts[0].len();
                    gather(s, &parts, w);
                    conv_axis(&s.block_in, &mut s.block_out, nz, w, kz, true, circular);
                    let (mut num, mut den) = (0.0f64, 0.0f64);
                    for z in 0..nz {
                        let (mut nn, mut dd) = (0.0f32, 0.0f32);
                        let corr = &s.block_out[z * w..(z + 1) * w];
                        for (((xv, pv), gv), &c) in xs[z].iter_mut().zip(ps[z].iter_mut()).zip(gs[z].iter_mut()).zip(corr) {
                            let y = (*xv + alpha * (*xv - *pv)).max(0.0);
                            let new = y * c.max(0.0);
                            let step = new - y;
                            nn += step * *gv;
                            dd += *gv * *gv;
                            *gv = step;
                            *pv = *xv;
                            *xv = new;
                        }
                        num += f64::from(nn);
                        den += f64::from(dd);
                    }
                    (num, den)
                })
                .reduce(|| (0.0, 0.0), |a, b| (a.0 + b.0, a.1 + b.1));
            alpha = if den > 0.0 { (num / den).clamp(0.0, 1.0) as f32 } else { 0.0 };
        } else {
            let jobs: Vec<_> = work_blocks.into_iter().zip(x_blocks).collect();
            jobs.into_par_iter().for_each_init(scratch, |s, (parts, mut xs)| {
                let w = parts[0].len();
                gather(s, &parts, w);
                conv_axis(&s.block_in, &mut s.block_out, nz, w, kz, true, circular);
                for (z, xz) in xs.iter_mut().enumerate() {
                    for (v, &c) in xz.iter_mut().zip(&s.block_out[z * w..(z + 1) * w]) {
                        *v *= c.max(0.0);
                    }
                }
            });
        }
    }
    x
}

/// The volume's planes (`plane` values each) cut into blocks of `bw`
/// values: `result[b][z]` is block `b` of plane `z` (disjoint borrows).
fn blocks_mut(volume: &mut [f32], plane: usize, bw: usize) -> Vec<Vec<&mut [f32]>> {
    let mut blocks: Vec<Vec<&mut [f32]>> = Vec::new();
    for p in volume.chunks_mut(plane) {
        for (b, part) in p.chunks_mut(bw).enumerate() {
            if blocks.len() <= b {
                blocks.push(Vec::new());
            }
            blocks[b].push(part);
        }
    }
    blocks
}

/// `s.block_in[z][..w] = parts[z]`.
fn gather(s: &mut Scratch, parts: &[&mut [f32]], w: usize) {
    for (z, part) in parts.iter().enumerate() {
        s.block_in[z * w..(z + 1) * w].copy_from_slice(part);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// conv_axis against the definition, both boundaries, both directions.
    #[test]
    fn conv_axis_is_the_definition() {
        let n = 7;
        let src: Vec<f32> = (0..n).map(|i| (i * i % 5) as f32 + 1.0).collect();
        let k = [0.2f32, 0.5, 0.1, 0.15, 0.05];
        for circular in [false, true] {
            for adjoint in [false, true] {
                let mut dst = vec![0.0; n];
                conv_axis(&src, &mut dst, n, 1, &k, adjoint, circular);
                for (i, d) in dst.iter().enumerate() {
                    let mut want = 0.0;
                    for (j, kj) in k.iter().enumerate() {
                        let s = if adjoint { j as isize - 2 } else { 2 - j as isize };
                        let m = i as isize + s;
                        if (0..n as isize).contains(&m) {
                            want += kj * src[m as usize];
                        } else if circular {
                            want += kj * src[m.rem_euclid(n as isize) as usize];
                        }
                    }
                    assert!((d - want).abs() < 1e-6, "circular {circular} adjoint {adjoint} i {i}: {d} vs {want}");
                }
                let mut row = vec![0.0; n];
                let (mut pad, mut out) = (vec![0.0; row_scratch_len(n, k.len())], vec![0.0; row_scratch_len(n, k.len())]);
                conv_row(&src, &mut row, &k, adjoint, circular, &mut pad, &mut out);
                for (a, b) in row.iter().zip(&dst) {
                    assert!((a - b).abs() < 1e-6, "conv_row: {row:?} vs {dst:?}");
                }
            }
        }
    }
}
