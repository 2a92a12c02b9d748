//! Direct 3 × 3 convolutions on AVX-512, for [`super::conv_same`] and [`super::weight_grad`]:
//! the same sums as their nine tap gemms, computed in register blocks rather than as matrix
//! products. Used where the CPU has AVX-512F; the gemms run otherwise.
//!
//! **Convolution** ([`convolve`]). The gemm formulation reduces over only `Ci` (32–192) per tap,
//! so every tap reloads and stores the whole output: on the U-Net's full-resolution layers it ran
//! at about half the machine's peak. Here a block of [`C`] output channels × [`P`]·16 consecutive
//! wide positions (see [`super::Padded`]) stays in `C·P` registers while the kernel runs over
//! every input channel and tap: per (channel, tap), `P` unaligned loads of the padded input at the
//! tap's flat shift, `C` broadcast weights and `C·P` fused multiply-adds. The block is then
//! written once through the [`super::Epilogue`] (bias; batch norm and ReLU in inference), its
//! extra wide columns dropped. Blocks go position-major (each position block through every channel
//! block), so the input under a block is read from L1. Weights are first packed as
//! `[⌈O/C⌉][R][9][C]` (zero past `O`), the order the kernel reads them; the transposed and flipped
//! layout of the input gradient ([`super::Taps`]) is only a different packing.
//!
//! **Weight gradient** ([`weight_grad`]): a reduction over positions rather than channels, so the
//! registers hold [`WEIGHT_CO`] output channels × 9 taps of one input channel, as 16-lane partial
//! sums.
//!
//! Measured on the U-Net's layer shapes (one thread, this repository's 2-core AVX-512 machine):
//! 135–175 GFLOP/s for the convolution and 110–145 for the weight gradient, against 60–140 and
//! 80–130 for the tap gemms.

use std::arch::x86_64::{__m512, _mm512_fmadd_ps, _mm512_loadu_ps, _mm512_set1_ps, _mm512_setzero_ps, _mm512_storeu_ps};

use std::mem::MaybeUninit;

use rayon::prelude::*;

use super::{Epilogue, Map, Padded, Taps};

/// Output channels per register block.
pub(super) const C: usize = 4;
/// 16-lane vectors of wide positions per register block.
pub(super) const P: usize = 6;
/// Wide positions per register block.
pub(super) const SPAN: usize = 16 * P;

/// Elements the padded input needs past its last plane: a block starting at the last wide
/// position reads up to `SPAN` further.
pub(super) const SLACK: usize = SPAN;

/// Whether this CPU runs the kernel (AVX-512F, checked once).
pub(super) fn available() -> bool {
    static AVX512: std::sync::OnceLock<bool> = std::sync::OnceLock::new();
    *AVX512.get_or_init(|| std::arch::is_x86_feature_detected!("avx512f"))
}

/// The weights of `o` output × `r` input channels in the kernel's order, `[⌈o/C⌉][r][9][C]`,
/// zero for the channels past `o` of the last block.
pub(super) struct Packed {
    values: Vec<f32>,
    o: usize,
    r: usize,
}

impl Packed {
    /// Packs `weights` as `taps` reads them (see [`super::conv_same`]).
    pub(super) fn new(weights: &[f32], o: usize, r: usize, taps: Taps) -> Self {
        let blocks = o.div_ceil(C);
        let mut values = vec![0.0f32; blocks * r * 9 * C];
        values.par_chunks_exact_mut(r * 9 * C).enumerate().for_each(|(block, packed)| {
            for (i, v) in packed.iter_mut().enumerate() {
                let (k, t, c) = (i % C, (i / C) % 9, i / (9 * C));
                let out = block * C + k;
                if out < o {
                    let tap = if taps.flip { 8 - t } else { t };
                    *v = weights[tap + out * taps.row_stride + c * taps.red_stride];
                }
            }
        });
        Self { values, o, r }
    }

    fn block(&self, index: usize) -> &[f32] {
        let len = self.r * 9 * C;
        &self.values[index * len..(index + 1) * len]
    }
}

/// One image: `dst` `[o, h, w]` = `epilogue` applied to the convolution of `padded` (`r` planes
/// of `geo.plane`, then at least [`SLACK`] elements) with `weights`; every element of `dst` is
/// written. With `parallel`, channel blocks are shared out among rayon's threads (for batches
/// smaller than the thread count).
///
/// # Panics
/// If the sizes are inconsistent or [`available`] is false.
pub(super) fn convolve(padded: &[f32], geo: Padded, weights: &Packed, epilogue: &Epilogue, dst: &mut [MaybeUninit<f32>], parallel: bool) {
    let (o, r) = (weights.o, weights.r);
    let plane_out = geo.h * geo.w;
    assert!(available(), "direct convolution without AVX-512");
    assert!(padded.len() >= r * geo.plane + SLACK && dst.len() == o * plane_out, "conv3x3: inconsistent sizes");
    if dst.is_empty() {
        return;
    }
    let blocks = o.div_ceil(C);
    // Channel blocks per task: all of them on one thread, else enough tasks for every thread.
    let per_task = if parallel { blocks.div_ceil(rayon::current_num_threads().max(1)).max(1) } else { blocks };
    let task = |(first_block, out): (usize, &mut [MaybeUninit<f32>])| {
        let mut acc = [0.0f32; C * SPAN];
        let channels = out.len() / plane_out;
        let mut start = 0;
        while start < geo.wide {
            for b in 0..channels.div_ceil(C) {
                // SAFETY: `available()` is asserted; the block reads `padded` at `c·plane +
                // start + shift(t) + l` for c < r, t < 9, l < SPAN, at most `(r − 1)·plane +
                // wide − 1 + 2·row + 2 + SPAN − 1 < r·plane + SPAN` (`wide + 2·row + 2 ≤ plane`),
                // within `padded`; the packed block holds `r·9·C` weights.
                unsafe { block(padded.as_ptr().add(start), geo, r, weights.block(first_block + b).as_ptr(), &mut acc) };
                let ks = C.min(channels - b * C);
                for (k, values) in acc.chunks_exact(SPAN).take(ks).enumerate() {
                    let ch = b * C + k;
                    let map = epilogue.of(first_block * C + ch);
                    store(geo, start, values, map, &mut out[ch * plane_out..(ch + 1) * plane_out]);
                }
            }
            start += SPAN;
        }
    };
    let chunk = per_task * C * plane_out;
    if parallel {
        dst.par_chunks_mut(chunk).enumerate().map(|(i, out)| (i * per_task, out)).for_each(task);
    } else {
        dst.chunks_mut(chunk).enumerate().map(|(i, out)| (i * per_task, out)).for_each(task);
    }
}

/// Writes the wide positions `start..start + SPAN` of one channel (`values`) into its plane `out`
/// `[h, w]` through `map`: the positions on the two extra columns of a row and past the last row
/// are dropped.
fn store(geo: Padded, start: usize, values: &[f32], map: Map, out: &mut [MaybeUninit<f32>]) {
    let end = (start + SPAN).min(geo.wide);
    let mut pos = start;
    while pos < end {
        let (y, x) = (pos / geo.row, pos % geo.row);
        if x >= geo.w {
            pos = (y + 1) * geo.row;
            continue;
        }
        let n = (geo.w - x).min(end - pos);
        map.apply(&values[pos - start..pos - start + n], &mut out[y * geo.w + x..y * geo.w + x + n]);
        pos += n;
    }
}

/// Output channels per register block of the weight gradient (3 × 9 taps = 27 accumulators).
const WEIGHT_CO: usize = 3;
/// Vectors of wide positions per pass of the weight gradient's blocks: the gradient's and the
/// input's rows under a pass stay in L1 across input channels.
const WEIGHT_PASS: usize = 128;

/// The weight gradient of the images `images` of `x` `[B, ci, h, w]` and `g` `[B, co, h, w]`:
/// `dw[o, r, t] = Σ_image Σ_(y, x) g[o, y, x] · x_pad[r, y + ky − 1, x + kx − 1]`, as `[co, ci, 9]`.
///
/// Per image, `g` is laid out on the wide positions (zero on the extra columns) and each block of
/// [`WEIGHT_CO`] output channels × 9 taps of one input channel accumulates in registers over
/// [`WEIGHT_PASS`] vectors of positions, into 16-lane partial sums that are added up at the end.
/// With `parallel`, the channel blocks are shared out among rayon's threads.
///
/// # Panics
/// If the sizes are inconsistent or [`available`] is false.
pub(super) fn weight_grad(
    x: &[f32],
    g: &[f32],
    images: std::ops::Range<usize>,
    [ci, h, w]: [usize; 3],
    co: usize,
    parallel: bool,
) -> Vec<f32> {
    assert!(available(), "direct convolution without AVX-512");
    assert!(x.len() >= images.end * ci * h * w && g.len() >= images.end * co * h * w, "conv3x3: inconsistent sizes");
    let geo = Padded::new(h, w);
    let vectors = geo.wide.div_ceil(16);
    let stride = vectors * 16;
    let blocks = co.div_ceil(WEIGHT_CO);
    // Partial sums of one block: [ci][WEIGHT_CO][9][16].
    let block_len = ci * WEIGHT_CO * 9 * 16;
    let mut parts = vec![0.0f32; blocks * block_len];
    if parts.is_empty() || geo.wide == 0 {
        return vec![0.0; co * ci * 9];
    }
    let per_task = if parallel { blocks.div_ceil(rayon::current_num_threads().max(1)).max(1) } else { blocks };
    let shifts: [usize; 9] = std::array::from_fn(|t| geo.shift(t));
    super::with_scratch(ci * geo.plane + SLACK, blocks * WEIGHT_CO * stride, |padded, wide| {
        // Zero once: the copies below only write the interior of each row of the first `co` rows.
        wide.fill(0.0);
        for image in images {
            geo.fill(&x[image * ci * h * w..(image + 1) * ci * h * w], ci, padded, parallel);
            geo.widen(&g[image * co * h * w..(image + 1) * co * h * w], stride, wide);
            let (padded, wide) = (&*padded, &*wide);
            let task = |(first, part): (usize, &mut [f32])| {
                let mut v0 = 0;
                while v0 < vectors {
                    let n = WEIGHT_PASS.min(vectors - v0);
                    for (b, sums) in part.chunks_exact_mut(block_len).enumerate() {
                        let rows = wide[(first + b) * WEIGHT_CO * stride + 16 * v0..].as_ptr();
                        for (c, acc) in sums.chunks_exact_mut(WEIGHT_CO * 9 * 16).enumerate() {
                            // SAFETY: `available()` is asserted. The block reads `wide` at
                            // `k·stride + 16·v` for k < WEIGHT_CO and v < n past `rows`, within
                            // the `blocks·WEIGHT_CO` rows of `stride`; `padded` at `c·plane +
                            // 16·v + shift(t) + l` (l < 16, v < vectors), at most
                            // `(ci − 1)·plane + wide + 15 + 2·row + 2 < ci·plane + SLACK`.
                            unsafe { weight_block(rows, stride, padded[c * geo.plane + 16 * v0..].as_ptr(), &shifts, n, acc) };
                        }
                    }
                    v0 += n;
                }
            };
            if parallel {
                parts.par_chunks_mut(per_task * block_len).enumerate().map(|(i, p)| (i * per_task, p)).for_each(task);
            } else {
                parts.chunks_mut(per_task * block_len).enumerate().map(|(i, p)| (i * per_task, p)).for_each(task);
            }
        }
    });
    let mut dw = vec![0.0f32; co * ci * 9];
    for (i, d) in dw.iter_mut().enumerate() {
        let (t, c, o) = (i % 9, (i / 9) % ci, i / (9 * ci));
        let at = (o / WEIGHT_CO) * block_len + ((c * WEIGHT_CO + o % WEIGHT_CO) * 9 + t) * 16;
        *d = parts[at..at + 16].iter().sum();
    }
    dw
}

/// `acc[(k·9 + t)·16 + l] += Σ_(v < n) g[k·stride + 16v + l] · x[16v + shift(t) + l]` for one
/// block of [`WEIGHT_CO`] output channels.
///
/// # Safety
/// AVX-512F must be available; `g` and `x` must be readable at every offset the sum names.
#[target_feature(enable = "avx512f")]
unsafe fn weight_block(g: *const f32, stride: usize, x: *const f32, shifts: &[usize; 9], n: usize, acc: &mut [f32]) {
    assert!(acc.len() >= WEIGHT_CO * 9 * 16);
    // Plain loops rather than `array::from_fn`, whose closures were not always inlined here.
    let mut sums = [[_mm512_setzero_ps(); 9]; WEIGHT_CO];
    for (k, row) in sums.iter_mut().enumerate() {
        for (t, s) in row.iter_mut().enumerate() {
            *s = _mm512_loadu_ps(acc[(k * 9 + t) * 16..].as_ptr());
        }
    }
    let mut gv = [_mm512_setzero_ps(); WEIGHT_CO];
    for v in 0..n {
        for (k, gk) in gv.iter_mut().enumerate() {
            *gk = _mm512_loadu_ps(g.add(k * stride + 16 * v));
        }
        for (t, &shift) in shifts.iter().enumerate() {
            let xv = _mm512_loadu_ps(x.add(shift + 16 * v));
            for (row, &gk) in sums.iter_mut().zip(&gv) {
                row[t] = _mm512_fmadd_ps(gk, xv, row[t]);
            }
        }
    }
    for (k, row) in sums.iter().enumerate() {
        for (t, &s) in row.iter().enumerate() {
            _mm512_storeu_ps(acc[(k * 9 + t) * 16..].as_mut_ptr(), s);
        }
    }
}

/// `acc[k·SPAN + l] = Σ_c Σ_t w[c][t][k] · src[c·plane + shift(t) + l]` for one register block.
///
/// # Safety
/// AVX-512F must be available; `src` must be readable at every offset the sum names and `w` at
/// `r·9·C` elements.
#[target_feature(enable = "avx512f")]
unsafe fn block(src: *const f32, geo: Padded, r: usize, w: *const f32, acc: &mut [f32; C * SPAN]) {
    let shifts: [usize; 9] = std::array::from_fn(|t| geo.shift(t));
    let mut sums: [[__m512; P]; C] = [[_mm512_setzero_ps(); P]; C];
    for c in 0..r {
        let base = src.add(c * geo.plane);
        let wc = w.add(c * 9 * C);
        for (t, &shift) in shifts.iter().enumerate() {
            accumulate(&mut sums, base.add(shift), wc.add(t * C));
        }
    }
    store_sums(&sums, acc.as_mut_ptr());
}

/// One step of a `C × N` register block (also the Winograd kernel's):
/// `sums[k][p] += w[k] · x[16p … 16p + 15]`, `N` vector loads, `C` broadcasts, `C·N` fused
/// multiply-adds.
///
/// # Safety
/// AVX-512F must be available; `x` readable at `16·N` elements, `w` at `C`.
#[target_feature(enable = "avx512f")]
#[inline]
pub(super) unsafe fn accumulate<const N: usize>(sums: &mut [[__m512; N]; C], x: *const f32, w: *const f32) {
    let mut v = [_mm512_setzero_ps(); N];
    for (p, x_p) in v.iter_mut().enumerate() {
        *x_p = _mm512_loadu_ps(x.add(16 * p));
    }
    for (k, row) in sums.iter_mut().enumerate() {
        let weight = _mm512_set1_ps(*w.add(k));
        for (s, &x_p) in row.iter_mut().zip(&v) {
            *s = _mm512_fmadd_ps(weight, x_p, *s);
        }
    }
}

/// Stores a `C × N` register block: row `k`, vector `p` to `out[k·SPAN + 16p …]`.
///
/// # Safety
/// AVX-512F must be available; `out` writable at `(C − 1)·SPAN + 16·N` elements.
#[target_feature(enable = "avx512f")]
#[inline]
pub(super) unsafe fn store_sums<const N: usize>(sums: &[[__m512; N]; C], out: *mut f32) {
    for (k, row) in sums.iter().enumerate() {
        for (p, &s) in row.iter().enumerate() {
            _mm512_storeu_ps(out.add(k * SPAN + 16 * p), s);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::super::{conv_image_gemm, weight_grad_gemm, Epilogue, Padded, Taps};
    use super::*;
    use crate::rng::SplitMix64;

    fn random(n: usize, rng: &mut SplitMix64) -> Vec<f32> {
        (0..n).map(|_| (rng.next_f64() * 2.0 - 1.0) as f32).collect()
    }

    /// What `conv_same` runs for one image without AVX-512.
    fn reference(input: &[f32], geo: Padded, [r, o]: [usize; 2], weights: &[f32], taps: Taps, epilogue: &Epilogue) -> Vec<f32> {
        let mut out = vec![MaybeUninit::new(f32::NAN); o * geo.h * geo.w];
        conv_image_gemm(input, geo, [r, o], weights, taps, epilogue, gemm::Parallelism::None, &mut out);
        // SAFETY: initialised (to NaN, which the comparison would catch) above.
        out.into_iter().map(|v| unsafe { v.assume_init() }).collect()
    }

    #[test]
    fn the_kernel_equals_the_tap_gemms_for_every_layout_epilogue_and_odd_size() {
        if !available() {
            return;
        }
        // (input channels, output channels, h, w): single pixels, rows shorter than a vector,
        // channel counts that are not a multiple of the block's, planes of several blocks.
        for (r, o, h, w) in [(1, 1, 1, 1), (3, 5, 2, 3), (7, 8, 5, 17), (4, 13, 9, 6), (16, 4, 3, 40), (2, 3, 31, 33)] {
            let mut rng = SplitMix64::new((r * 1000 + o * 100 + h * 10 + w) as u64);
            let geo = Padded::new(h, w);
            let input = random(r * h * w, &mut rng);
            let weights = random(o * r * 9, &mut rng);
            let (bias, scale, shift) = (random(o, &mut rng), random(o, &mut rng), random(o, &mut rng));
            let mut padded = vec![f32::NAN; r * geo.plane + SLACK];
            geo.fill(&input, r, &mut padded, false);
            let forward = Taps { row_stride: 9 * r, red_stride: 9, flip: false };
            let transposed = Taps { row_stride: 9, red_stride: 9 * o, flip: true };
            let plain = Epilogue { bias: Some(&bias), affine: None };
            let fused = Epilogue { bias: Some(&bias), affine: Some((&scale, &shift)) };
            let none = Epilogue { bias: None, affine: None };
            for (taps, epilogue, what) in [(forward, &plain, "bias"), (forward, &fused, "affine + relu"), (transposed, &none, "flipped")] {
                let want = reference(&input, geo, [r, o], &weights, taps, epilogue);
                let packed = Packed::new(&weights, o, r, taps);
                for parallel in [false, true] {
                    let mut out = vec![MaybeUninit::new(f32::NAN); o * h * w];
                    convolve(&padded, geo, &packed, epilogue, &mut out, parallel);
                    for (i, (v, &want)) in out.iter().zip(&want).enumerate() {
                        // SAFETY: initialised (to NaN, which the comparison would catch) above.
                        let got = unsafe { v.assume_init() };
                        let tol = 1e-5 * want.abs().max(1.0);
                        assert!((got - want).abs() <= tol, "{r}→{o} {h}×{w} {what} parallel {parallel}: element {i} {got} vs {want}");
                    }
                }
            }
        }
    }

    #[test]
    fn the_weight_gradients_equal_their_sum_in_f64_direct_winograd_and_gemms() {
        // (images, input channels, output channels, h, w): output channels that are not a
        // multiple of the block's, rows shorter than a vector, planes longer than a pass, odd
        // heights and widths of several 16-tile units.
        for (b, ci, co, h, w) in [(1, 1, 1, 1, 1), (2, 3, 4, 2, 3), (3, 5, 7, 6, 17), (2, 2, 3, 50, 47), (2, 9, 8, 7, 65)] {
            let mut rng = SplitMix64::new((b * 10_000 + ci * 1000 + co * 100 + h * 10 + w) as u64);
            let x = random(b * ci * h * w, &mut rng);
            let g = random(b * co * h * w, &mut rng);
            let at = |image: usize, c: usize, y: isize, xx: isize| -> f64 {
                if y < 0 || xx < 0 || y >= h as isize || xx >= w as isize {
                    return 0.0;
                }
                x[((image * ci + c) * h + y as usize) * w + xx as usize] as f64
            };
            // The kernels where this CPU has them (direct on one thread and several, Winograd),
            // then the gemms.
            let runs: Vec<(String, Vec<f32>)> = match available() {
                true => [false, true]
                    .map(|parallel| (format!("parallel {parallel}"), weight_grad(&x, &g, 0..b, [ci, h, w], co, parallel)))
                    .into_iter()
                    .chain([("winograd".to_string(), super::super::winograd::weight_grad(&x, &g, 0..b, [ci, h, w], co))])
                    .collect(),
                false => Vec::new(),
            };
            let gemms = ("gemms".to_string(), weight_grad_gemm(&x, &g, 0..b, [ci, h, w], co, gemm::Parallelism::None));
            for (what, got) in runs.into_iter().chain([gemms]) {
                for (i, &got) in got.iter().enumerate() {
                    let (t, c, o) = (i % 9, (i / 9) % ci, i / (9 * ci));
                    let (ky, kx) = ((t / 3) as isize - 1, (t % 3) as isize - 1);
                    let mut want = 0.0f64;
                    for image in 0..b {
                        for y in 0..h {
                            for xx in 0..w {
                                let gv = g[((image * co + o) * h + y) * w + xx] as f64;
                                want += gv * at(image, c, y as isize + ky, xx as isize + kx);
                            }
                        }
                    }
                    let tol = 1e-5 * (b * h * w) as f64;
                    assert!((got as f64 - want).abs() <= tol, "{b}×{ci}→{co} {h}×{w} {what}: dw[{o}, {c}, {t}] {got} vs {want}");
                }
            }
        }
    }
}
