//! Winograd F(2 × 2, 3 × 3) and F(4 × 4, 3 × 3) convolutions on AVX-512, for
//! [`super::conv_same`] and [`super::weight_grad`]: the same "same" 3 × 3 convolution as the
//! [`super::direct`] kernel, with 16 multiplies per 2 × 2 output pixels and input channel instead
//! of 36, or 36 per 4 × 4 instead of 144 (Lavin & Gray, "Fast Algorithms for Convolutional Neural
//! Networks", 2016). F(2 × 2) is described below; F(4 × 4) ([`Winograd::F4`], inference) is the
//! same with 6 × 6 input tiles, the transforms of points 0, ±1, ±2 and ∞ ([`Winograd::g`],
//! `bt6`, `at6`), 36 products and units of 16 tiles over 64 columns.
//!
//! With `d` a 4 × 4 tile of the zero-padded input and `g` the 3 × 3 weights of one (output, input)
//! channel pair, the 2 × 2 outputs of the tile are `Aᵀ [(G g Gᵀ) ⊙ (Bᵀ d B)] A`, where
//!
//! ```text
//!      ⎡1  0 −1  0⎤        ⎡1    0    0 ⎤
//! Bᵀ = ⎢0  1  1  0⎥    G = ⎢½    ½    ½ ⎥    Aᵀ = ⎡1  1  1  0⎤
//!      ⎢0 −1  1  0⎥        ⎢½   −½    ½ ⎥         ⎣0  1 −1 −1⎦
//!      ⎣0  1  0 −1⎦        ⎣0    0    1 ⎦
//! ```
//!
//! Summed over input channels, the element-wise product becomes 16 independent matrix products
//! (one per element `ξ` of the 4 × 4 transformed tile): `M_ξ[o, tile] = Σ_c U_ξ[o, c] ·
//! V_ξ[c, tile]`, with `U = G g Gᵀ` (the weights, transformed once per call, [`Transformed`]) and
//! `V = Bᵀ d B` (the input, transformed per tile). Then `Aᵀ M A` gives each tile's outputs.
//!
//! **Layout.** A *unit* is 16 consecutive tiles of one tile row ([`Tiles`]): the four columns of
//! its tiles in one input row are the even and odd lanes of two 32-column loads (masked at the
//! plane's edges, which gives the zero padding), picked apart by permutes; a block of [`P`] units
//! (up to 96 tiles, possibly from several tile rows) is transformed into `V` `[16][r][96]` (in
//! L2), then for each block of [`C`] output channels and each `ξ` the `C × P` vector accumulators
//! run over the input channels (6 loads, 4 broadcasts, 24 fused multiply-adds per channel, as in
//! the direct kernel), and the block's `M` (in L1) is transformed back and written through the
//! [`super::Epilogue`]. Tiles past the right edge of a row are computed (on zeros) but not written, so
//! [`suits`] keeps narrow planes, where a unit would be mostly such tiles, on the direct kernel.
//!
//! **Weight gradient** ([`weight_grad`]): the derivative of the same transformed sum with respect
//! to the weights, `Gᵀ [Σ_tile (A G_y Aᵀ) ⊙ (Bᵀ d B)] G` with `G_y` a 2 × 2 tile of the output
//! gradient: the same input transform, 16 products reduced over an image's tiles rather than over
//! channels, and one transform back per (output, input) channel pair at the end.
//!
//! Rounding differs from the direct sums (the transforms add and subtract values of different
//! magnitudes before the products, F(4 × 4)'s scaled by up to 8 and 1/24): the tests hold both to
//! `1e-5` of the sum of absolute products.

use std::arch::x86_64::{
    __m512, __m512i, _mm512_add_ps, _mm512_castps_si512, _mm512_castsi512_ps, _mm512_fmadd_ps, _mm512_fnmadd_ps, _mm512_loadu_ps,
    _mm512_loadu_si512, _mm512_mask_storeu_ps, _mm512_maskz_loadu_ps, _mm512_max_ps, _mm512_mul_ps, _mm512_permutex2var_epi32,
    _mm512_permutex2var_ps, _mm512_set1_ps, _mm512_set_epi32, _mm512_setzero_ps, _mm512_storeu_ps, _mm512_sub_ps,
};
use std::mem::MaybeUninit;

use rayon::prelude::*;

use super::{Epilogue, Map, Taps, Winograd};

// The direct kernel's register block: `C` output channels × `P` vectors, here `P` units of 16
// tiles (`SPAN` tiles per block).
use super::direct::{accumulate, store_sums, C, P, SPAN};

impl Winograd {
    /// The side `m` of the output tiles of F(m × m, 3 × 3).
    const fn m(self) -> usize {
        match self {
            Winograd::F2 => 2,
            Winograd::F4 => 4,
        }
    }

    /// The elements `ξ` of a transformed tile, `(m + 2)²`.
    const fn xi(self) -> usize {
        (self.m() + 2) * (self.m() + 2)
    }

    /// The weight transform `G` (`(m + 2) × 3`): `U = G g Gᵀ`.
    fn g(self) -> &'static [[f64; 3]] {
        match self {
            Winograd::F2 => &[[1.0, 0.0, 0.0], [0.5, 0.5, 0.5], [0.5, -0.5, 0.5], [0.0, 0.0, 1.0]],
            Winograd::F4 => &[
                [1.0 / 4.0, 0.0, 0.0],
                [-1.0 / 6.0, -1.0 / 6.0, -1.0 / 6.0],
                [-1.0 / 6.0, 1.0 / 6.0, -1.0 / 6.0],
                [1.0 / 24.0, 1.0 / 12.0, 1.0 / 6.0],
                [1.0 / 24.0, -1.0 / 12.0, 1.0 / 6.0],
                [0.0, 0.0, 1.0],
            ],
        }
    }
}

/// Whether the `variant` kernel should run a convolution of `r` input channels over `h × w`
/// planes: enough input channels for the transforms to be a small share of the work (the
/// U-Net's first layer has one), at least one tile row of outputs, and rows of tiles that fill
/// most of their 16-tile units.
pub(super) fn suits(variant: Winograd, r: usize, h: usize, w: usize) -> bool {
    let tiles = w.div_ceil(variant.m());
    let units = tiles.div_ceil(16);
    r >= 8 && h >= variant.m() && 4 * (16 * units - tiles) <= 16 * units
}

/// The transformed weights `U = G g Gᵀ` of `o` output × `r` input channels in the kernel's order,
/// `[⌈o/C⌉][ξ][r][C]`, zero for the channels past `o` of the last block.
pub(super) struct Transformed {
    values: Vec<f32>,
    variant: Winograd,
    o: usize,
    r: usize,
}

impl Transformed {
    /// Transforms `weights` as `taps` reads them (see [`super::conv_same`]) for `variant`.
    pub(super) fn new(weights: &[f32], o: usize, r: usize, taps: Taps, variant: Winograd) -> Self {
        let (g, xi) = (variant.g(), variant.xi());
        let n = g.len();
        let mut values = vec![0.0f32; o.div_ceil(C) * xi * r * C];
        // One output-channel block per task: `[ξ][r][C]`.
        values.par_chunks_exact_mut(xi * r * C).enumerate().for_each(|(block, values)| {
            for k in 0..C.min(o - block * C) {
                let out = block * C + k;
                for c in 0..r {
                    let tap = |t: usize| weights[if taps.flip { 8 - t } else { t } + out * taps.row_stride + c * taps.red_stride] as f64;
                    // G g (n × 3), then (G g) Gᵀ (n × n), in f64.
                    let mut gg = [[0.0f64; 3]; 6];
                    for (row, left) in g.iter().zip(gg.iter_mut()) {
                        *left = std::array::from_fn(|kx| (0..3).map(|ky| row[ky] * tap(3 * ky + kx)).sum());
                    }
                    for (i, left) in gg[..n].iter().enumerate() {
                        for (j, right) in g.iter().enumerate() {
                            let u: f64 = (0..3).map(|kx| left[kx] * right[kx]).sum();
                            values[((i * n + j) * r + c) * C + k] = u as f32;
                        }
                    }
                }
            }
        });
        Self { values, variant, o, r }
    }

    /// `U_ξ` of output-channel block `block`: `[r][C]`.
    fn of(&self, block: usize, xi: usize) -> &[f32] {
        let len = self.r * C;
        &self.values[(block * self.variant.xi() + xi) * len..][..len]
    }
}

/// The geometry of an `h × w` plane cut into `m × m` output tiles (`m` of the `variant`): `th ×
/// tw` tiles, each tile row in `units` units of 16 tiles. Tile `(ty, tx)` reads the input rows
/// `m·ty − 1 … m·ty + m` and columns `m·tx − 1 … m·tx + m`, zero outside the plane (the
/// convolution's zero padding, and more rows and columns where `h` or `w` is not a multiple of
/// `m`).
#[derive(Clone, Copy)]
struct Tiles {
    h: usize,
    w: usize,
    units: usize,
    /// Units of the whole plane (`th · units`).
    count: usize,
}

impl Tiles {
    fn new(variant: Winograd, h: usize, w: usize) -> Self {
        let m = variant.m();
        let units = w.div_ceil(m).div_ceil(16);
        Self { h, w, units, count: h.div_ceil(m) * units }
    }
}

/// The output `[o, h, w]` of one image, written from several threads: each writes the rows of
/// its own tiles, of every channel.
#[derive(Clone, Copy)]
struct Output(*mut f32);

// SAFETY: the threads write disjoint elements (the tiles of disjoint units), see `convolve`.
unsafe impl Send for Output {}
unsafe impl Sync for Output {}

/// One image: `dst` `[o, h, w]` = `epilogue` applied to the zero-padded convolution of `input`
/// `[r, h, w]` with `weights` (in the tiles of their variant); every element of `dst` is written.
/// With `parallel`, the blocks of units are shared out among rayon's threads.
///
/// # Panics
/// If the sizes are inconsistent or [`super::direct::available`] is false.
pub(super) fn convolve(
    input: &[f32],
    [h, w]: [usize; 2],
    weights: &Transformed,
    epilogue: &Epilogue,
    dst: &mut [MaybeUninit<f32>],
    parallel: bool,
) {
    let (o, r, variant) = (weights.o, weights.r, weights.variant);
    assert!(super::direct::available(), "Winograd convolution without AVX-512");
    let tiles = Tiles::new(variant, h, w);
    let plane = h * w;
    assert!(input.len() == r * plane && dst.len() == o * plane, "conv3x3: inconsistent sizes");
    let xis = variant.xi();
    if dst.is_empty() {
        return;
    }
    let blocks = tiles.count.div_ceil(P);
    let out = Output(dst.as_mut_ptr().cast());
    let run = |range: std::ops::Range<usize>| {
        let (v_len, m_len) = (xis * r * SPAN, xis * C * SPAN);
        // `V` and `M` in the calling thread's scratch of the convolution kernels.
        super::with_scratch(v_len + m_len, 0, |scratch, _| {
            let (v, m) = scratch.split_at_mut(v_len);
            for block in range {
                let first = block * P;
                let n = P.min(tiles.count - first);
                // SAFETY: AVX-512F is available (asserted). The input transform reads `input`
                // within the `r` planes (see `transform_input`, `transform_input4`) and writes
                // `v` at `ξ·r·SPAN + c·SPAN + 16p + l` < `xis·r·SPAN`; `products` reads `v`
                // there and `weights` at `r·C` per (block, ξ), and writes `m` at `ξ·C·SPAN +
                // k·SPAN + 16p + l` < `xis·C·SPAN`; `store` (`store4`) writes `dst` at the
                // outputs of the block's units only, which no other block writes.
                unsafe {
                    for c in 0..r {
                        for p in 0..n {
                            let (src, to) = (input[c * plane..(c + 1) * plane].as_ptr(), v[c * SPAN + 16 * p..].as_mut_ptr());
                            match variant {
                                Winograd::F2 => transform_input(src, tiles, first + p, to, r * SPAN),
                                Winograd::F4 => transform_input4(src, tiles, first + p, to, r * SPAN),
                            }
                        }
                    }
                    for b in 0..o.div_ceil(C) {
                        for xi in 0..xis {
                            let (u, vx, mx) = (weights.of(b, xi).as_ptr(), v[xi * r * SPAN..].as_ptr(), m[xi * C * SPAN..].as_mut_ptr());
                            match n {
                                6 => products::<6>(vx, u, r, mx),
                                5 => products::<5>(vx, u, r, mx),
                                4 => products::<4>(vx, u, r, mx),
                                3 => products::<3>(vx, u, r, mx),
                                2 => products::<2>(vx, u, r, mx),
                                _ => products::<1>(vx, u, r, mx),
                            }
                        }
                        for k in 0..C.min(o - b * C) {
                            let ch = b * C + k;
                            for p in 0..n {
                                let (at, map) = (m[k * SPAN + 16 * p..].as_ptr(), epilogue.of(ch));
                                match variant {
                                    Winograd::F2 => store(at, tiles, first + p, map, out, ch),
                                    Winograd::F4 => store4(at, tiles, first + p, map, out, ch),
                                }
                            }
                        }
                    }
                }
            }
        })
    };
    if parallel {
        let tasks = (4 * rayon::current_num_threads()).min(blocks).max(1);
        let chunk = blocks.div_ceil(tasks);
        (0..blocks.div_ceil(chunk)).into_par_iter().for_each(|t| run(t * chunk..((t + 1) * chunk).min(blocks)));
    } else {
        run(0..blocks);
    }
}

/// The weight gradient of the images `images` of `x` `[B, ci, h, w]` and `g` `[B, co, h, w]`:
/// `dw[o, c, t] = Σ_image Σ_(y, x) g[o, y, x] · x_pad[c, y + ky − 1, x + kx − 1]`, as `[co, ci, 9]`
/// (the same sum as [`super::direct::weight_grad`], up to rounding).
///
/// It is the derivative of the forward transform's `Σ_ξ Z_ξ U_ξ V_ξ` (with `Z = A G_y Aᵀ` of each
/// 2 × 2 tile `G_y` of the output gradient) with respect to the weights: per tile,
/// `dw = Gᵀ (Z ⊙ V) G`. Summed over tiles, `S_ξ[o, c] = Σ_tile Z_ξ[o, tile] · V_ξ[c, tile]` is
/// 16 matrix products over all of an image's tiles, in register blocks of 4 × 4 channels that keep
/// 16-lane partial sums over the tiles ([`block_sums`]), and `dw = Gᵀ S G` at the end. Tiles past
/// the plane's edges have `Z = 0`.
///
/// # Panics
/// If the sizes are inconsistent or [`super::direct::available`] is false.
pub(super) fn weight_grad(x: &[f32], g: &[f32], images: std::ops::Range<usize>, [ci, h, w]: [usize; 3], co: usize) -> Vec<f32> {
    assert!(super::direct::available(), "Winograd convolution without AVX-512");
    let plane = h * w;
    assert!(x.len() >= images.end * ci * plane && g.len() >= images.end * co * plane, "conv3x3: inconsistent sizes");
    let tiles = Tiles::new(Winograd::F2, h, w);
    let n = 16 * tiles.count;
    // Channels in blocks of 4 (rows past `ci` and `co` are padding); S as [16][⌈co/4⌉][⌈ci/4⌉][4 × 4].
    let (ob, cb) = (co.div_ceil(4), ci.div_ceil(4));
    let mut sums = vec![0.0f32; 16 * ob * cb * 16];
    if n == 0 || co * ci == 0 {
        return vec![0.0; co * ci * 9];
    }
    let (cp, op) = (4 * cb, 4 * ob);
    super::with_scratch(16 * (cp + op) * n, 0, |scratch, _| {
        let (v, z) = scratch.split_at_mut(16 * cp * n);
        // The padding rows (past `ci`, `co`) keep whatever the scratch held: they reach only the
        // sums of padded channel pairs, which are never read.
        for image in images {
            let (xs, gs) = (&x[image * ci * plane..][..ci * plane], &g[image * co * plane..][..co * plane]);
            // SAFETY: AVX-512F is available (asserted). The transforms read one plane of `xs`
            // (`gs`) each and write `v` (`z`) at `ξ·cp·n + c·n + 16·unit + l` < `16·cp·n`
            // (`op` for `z`). `block_sums` reads 4 rows of `n` of each from `ξ·cp·n + 4b·n`,
            // within `v` (`z`), and writes 16 sums within `sums`.
            unsafe {
                for c in 0..ci {
                    for unit in 0..tiles.count {
                        transform_input(xs[c * plane..].as_ptr(), tiles, unit, v[c * n + 16 * unit..].as_mut_ptr(), cp * n);
                    }
                }
                for o in 0..co {
                    for unit in 0..tiles.count {
                        transform_gradient(gs[o * plane..].as_ptr(), tiles, unit, z[o * n + 16 * unit..].as_mut_ptr(), op * n);
                    }
                }
                for xi in 0..16 {
                    for bo in 0..ob {
                        for bc in 0..cb {
                            let zs = z[(xi * op + 4 * bo) * n..].as_ptr();
                            let vs = v[(xi * cp + 4 * bc) * n..].as_ptr();
                            block_sums(zs, vs, n, sums[((xi * ob + bo) * cb + bc) * 16..].as_mut_ptr());
                        }
                    }
                }
            }
        }
    });
    // dw = Gᵀ S G.
    let g = Winograd::F2.g();
    let mut dw = vec![0.0f32; co * ci * 9];
    for (pair, out) in dw.chunks_exact_mut(9).enumerate() {
        let (o, c) = (pair / ci, pair % ci);
        let s = |xi: usize| sums[((xi * ob + o / 4) * cb + c / 4) * 16 + (o % 4) * 4 + c % 4];
        for (t, d) in out.iter_mut().enumerate() {
            let (ky, kx) = (t / 3, t % 3);
            *d = (0..16).map(|xi| (g[xi / 4][ky] * g[xi % 4][kx]) as f32 * s(xi)).sum();
        }
    }
    dw
}

/// `out[4·a + b] += Σ_(t < n) z[a·n + t] · v[b·n + t]` for `a, b < 4` (`n` a multiple of 16):
/// sixteen 16-lane partial sums, then added across their lanes in one transposing tree.
///
/// # Safety
/// AVX-512F must be available; `z` and `v` readable at `4·n`, `out` at 16 elements.
#[target_feature(enable = "avx512f")]
unsafe fn block_sums(z: *const f32, v: *const f32, n: usize, out: *mut f32) {
    let mut acc = [_mm512_setzero_ps(); 16];
    for t in (0..n).step_by(16) {
        let mut zs = [_mm512_setzero_ps(); 4];
        let mut vs = [_mm512_setzero_ps(); 4];
        for (k, (zk, vk)) in zs.iter_mut().zip(vs.iter_mut()).enumerate() {
            *zk = _mm512_loadu_ps(z.add(k * n + t));
            *vk = _mm512_loadu_ps(v.add(k * n + t));
        }
        for (a, &zk) in zs.iter().enumerate() {
            for (b, &vk) in vs.iter().enumerate() {
                acc[4 * a + b] = _mm512_fmadd_ps(zk, vk, acc[4 * a + b]);
            }
        }
    }
    // Each round adds the two halves of every lane group of two vectors into one: 16 vectors of
    // 16 lanes, 8 of 2 × 8, 4 of 4 × 4, 2 of 8 × 2, 1 of 16 × 1, in the accumulators' order.
    let mut count = 16;
    for [low, high] in &HALVES {
        let (low, high) = (_mm512_loadu_si512(low.as_ptr().cast()), _mm512_loadu_si512(high.as_ptr().cast()));
        for i in 0..count / 2 {
            let (p, q) = (acc[2 * i], acc[2 * i + 1]);
            acc[i] = _mm512_add_ps(_mm512_permutex2var_ps(p, low, q), _mm512_permutex2var_ps(p, high, q));
        }
        count /= 2;
    }
    _mm512_storeu_ps(out, _mm512_add_ps(_mm512_loadu_ps(out), acc[0]));
}

/// The permutations of [`block_sums`]' tree, `[round][half]` for groups of 8, 4, 2 and 1 lanes:
/// `p` and `q` (lanes `0 … 15` and `16 … 31`) each hold sources of `2·group` consecutive lanes;
/// the result holds `p`'s sources then `q`'s, each in `group` lanes: the first halves of their
/// lanes (half 0) or the second (half 1).
const HALVES: [[[i32; 16]; 2]; 4] = {
    let mut table = [[[0i32; 16]; 2]; 4];
    let mut round = 0;
    while round < 4 {
        let group = 8 >> round;
        let mut l = 0;
        while l < 16 {
            let (from, k) = (l / 8, l % 8);
            let at = 16 * from + (k / group) * 2 * group + k % group;
            table[round][0][l] = at as i32;
            table[round][1][l] = (at + group) as i32;
            l += 1;
        }
        round += 1;
    }
    table
};

/// `Z = A G_y Aᵀ` of the 16 tiles of unit `unit`, output-gradient channel `src` (its plane `[h,
/// w]`; zero outside it): element `ξ = 4i + j` of tile `l` to `dst[ξ·stride + l]`. `A` is `Aᵀ`
/// of the forward transform transposed, rows `[1, 0]`, `[1, 1]`, `[1, −1]`, `[0, −1]`.
///
/// # Safety
/// AVX-512F must be available; `src` must hold a plane of `tiles`, `dst` 16 rows of `stride`.
#[target_feature(enable = "avx512f")]
unsafe fn transform_gradient(src: *const f32, tiles: Tiles, unit: usize, dst: *mut f32, stride: usize) {
    let (ty, v) = (unit / tiles.units, unit % tiles.units);
    let [evens, odds] = even_odd();
    let first = 32 * v;
    let masks = [first, first + 16].map(|at| within(at as isize, tiles.w));
    // The tiles' 2 × 2 values: rows 2·ty, 2·ty + 1 (zero below the plane), columns even, odd.
    let mut gy = [[_mm512_setzero_ps(); 2]; 2];
    for (i, row) in gy.iter_mut().enumerate() {
        let y = 2 * ty + i;
        if y >= tiles.h {
            continue;
        }
        let at = src.add(y * tiles.w);
        let (a, b) =
            (_mm512_maskz_loadu_ps(masks[0], at.wrapping_add(first)), _mm512_maskz_loadu_ps(masks[1], at.wrapping_add(first + 16)));
        *row = [pick(a, evens, b), pick(a, odds, b)];
    }
    // A down the columns, then along the rows.
    let columns = [a(gy[0][0], gy[1][0]), a(gy[0][1], gy[1][1])];
    for (i, (&p, &q)) in columns[0].iter().zip(&columns[1]).enumerate() {
        for (j, value) in a(p, q).into_iter().enumerate() {
            _mm512_storeu_ps(dst.add((4 * i + j) * stride), value);
        }
    }
}

/// `V = Bᵀ d B` of the 16 tiles of unit `unit`, input channel `src` (its plane `[h, w]`, read
/// with zero padding): element `ξ = 4i + j` of tile `l` to `dst[ξ·stride + l]`.
///
/// # Safety
/// AVX-512F must be available; `src` must hold a plane of `tiles`, `dst` 16 rows of `stride`.
#[target_feature(enable = "avx512f")]
unsafe fn transform_input(src: *const f32, tiles: Tiles, unit: usize, dst: *mut f32, stride: usize) {
    let (ty, v) = (unit / tiles.units, unit % tiles.units);
    // Column j of tile l is input column 32v − 1 + 2l + j: the even (j = 0) and odd (j = 1)
    // lanes of the 32 columns from 32v − 1, and those of the 32 from 32v + 1 (j = 2, 3).
    let [evens, odds] = even_odd();
    let first = 32 * v as isize - 1;
    let masks = [first, first + 16, first + 2, first + 18].map(|at| within(at, tiles.w));
    let mut d = [[_mm512_setzero_ps(); 4]; 4];
    for (i, row) in d.iter_mut().enumerate() {
        // Input row 2·ty − 1 + i; zero above and below the plane.
        let Some(y) = (2 * ty + i).checked_sub(1).filter(|&y| y < tiles.h) else {
            continue;
        };
        let at = |k: usize, offset: isize| _mm512_maskz_loadu_ps(masks[k], src.wrapping_offset((y * tiles.w) as isize + offset));
        let (a, b, c, e) = (at(0, first), at(1, first + 16), at(2, first + 2), at(3, first + 18));
        *row = [pick(a, evens, b), pick(a, odds, b), pick(c, evens, e), pick(c, odds, e)];
    }
    // Bᵀ d down the columns (`t[i][j]`), then along the rows: V = (Bᵀ d) B.
    let mut t = [[_mm512_setzero_ps(); 4]; 4];
    for j in 0..4 {
        for (row, value) in t.iter_mut().zip(bt([d[0][j], d[1][j], d[2][j], d[3][j]])) {
            row[j] = value;
        }
    }
    for (i, &row) in t.iter().enumerate() {
        for (j, value) in bt(row).into_iter().enumerate() {
            _mm512_storeu_ps(dst.add((4 * i + j) * stride), value);
        }
    }
}

/// `V = Bᵀ d B` of F(4 × 4, 3 × 3) for the 16 tiles of unit `unit`, input channel `src` (its
/// plane `[h, w]`, read with zero padding): element `ξ = 6i + j` of tile `l` to `dst[ξ·stride +
/// l]`.
///
/// # Safety
/// AVX-512F must be available; `src` must hold a plane of `tiles`, `dst` 36 rows of `stride`.
#[target_feature(enable = "avx512f")]
unsafe fn transform_input4(src: *const f32, tiles: Tiles, unit: usize, dst: *mut f32, stride: usize) {
    let (ty, v) = (unit / tiles.units, unit % tiles.units);
    // Column j of tile l is input column 64v − 1 + 4l + j. Of the 64 columns from 64v − 1 (four
    // loads), two rounds of even/odd picks give the lanes 4l + j for j < 4; j = 4, 5 are j = 0, 1
    // of the next tile, the last lane's from a fifth load (of 2 columns).
    let [evens, odds] = even_odd();
    let next = [
        _mm512_set_epi32(16, 15, 14, 13, 12, 11, 10, 9, 8, 7, 6, 5, 4, 3, 2, 1),
        _mm512_set_epi32(17, 15, 14, 13, 12, 11, 10, 9, 8, 7, 6, 5, 4, 3, 2, 1),
    ];
    let first = 64 * v as isize - 1;
    let masks = [0, 16, 32, 48, 64].map(|k| within(first + k, tiles.w) & if k == 64 { 0b11 } else { u16::MAX });
    // Bᵀ along each input row (`e[i][j]`), then down the columns: V = Bᵀ (d B).
    let mut e = [[_mm512_setzero_ps(); 6]; 6];
    for (i, row) in e.iter_mut().enumerate() {
        // Input row 4·ty − 1 + i; zero above and below the plane.
        let Some(y) = (4 * ty + i).checked_sub(1).filter(|&y| y < tiles.h) else {
            continue;
        };
        let load = |k: usize| _mm512_maskz_loadu_ps(masks[k], src.wrapping_offset((y * tiles.w) as isize + first + 16 * k as isize));
        let (l0, l1, l2, l3, tail) = (load(0), load(1), load(2), load(3), load(4));
        let (even0, odd0, even1, odd1) = (pick(l0, evens, l1), pick(l0, odds, l1), pick(l2, evens, l3), pick(l2, odds, l3));
        let (c0, c1) = (pick(even0, evens, even1), pick(odd0, evens, odd1));
        let (c2, c3) = (pick(even0, odds, even1), pick(odd0, odds, odd1));
        *row = bt6([c0, c1, c2, c3, pick(c0, next[0], tail), pick(c1, next[1], tail)]);
    }
    for j in 0..6 {
        for (i, value) in bt6(e.map(|row| row[j])).into_iter().enumerate() {
            _mm512_storeu_ps(dst.add((6 * i + j) * stride), value);
        }
    }
}

/// `Bᵀ a` of F(4 × 4, 3 × 3) for the six rows (or columns) `a`: `[4a0 − 5a2 + a4, −4a1 − 4a2 + a3
/// + a4, 4a1 − 4a2 − a3 + a4, −2a1 − a2 + 2a3 + a4, 2a1 − a2 − 2a3 + a4, 4a1 − 5a3 + a5]`.
///
/// # Safety
/// AVX-512F must be available.
#[target_feature(enable = "avx512f")]
#[inline]
unsafe fn bt6(a: [__m512; 6]) -> [__m512; 6] {
    let (two, four, five) = (_mm512_set1_ps(2.0), _mm512_set1_ps(4.0), _mm512_set1_ps(5.0));
    let (p, q) = (_mm512_fnmadd_ps(four, a[2], a[4]), _mm512_fnmadd_ps(four, a[1], a[3]));
    let (s, t) = (_mm512_sub_ps(a[4], a[2]), _mm512_mul_ps(two, _mm512_sub_ps(a[3], a[1])));
    [
        _mm512_fmadd_ps(four, a[0], _mm512_fnmadd_ps(five, a[2], a[4])),
        _mm512_add_ps(p, q),
        _mm512_sub_ps(p, q),
        _mm512_add_ps(s, t),
        _mm512_sub_ps(s, t),
        _mm512_fmadd_ps(four, a[1], _mm512_fnmadd_ps(five, a[3], a[5])),
    ]
}

/// `Aᵀ a` of F(4 × 4, 3 × 3) for the six rows (or columns) `a`: `[a0 + a1 + a2 + a3 + a4, a1 − a2
/// + 2(a3 − a4), a1 + a2 + 4(a3 + a4), a1 − a2 + 8(a3 − a4) + a5]`.
///
/// # Safety
/// AVX-512F must be available.
#[target_feature(enable = "avx512f")]
#[inline]
unsafe fn at6(a: [__m512; 6]) -> [__m512; 4] {
    let (sum12, diff12) = (_mm512_add_ps(a[1], a[2]), _mm512_sub_ps(a[1], a[2]));
    let (sum34, diff34) = (_mm512_add_ps(a[3], a[4]), _mm512_sub_ps(a[3], a[4]));
    [
        _mm512_add_ps(_mm512_add_ps(a[0], sum12), sum34),
        _mm512_fmadd_ps(_mm512_set1_ps(2.0), diff34, diff12),
        _mm512_fmadd_ps(_mm512_set1_ps(4.0), sum34, sum12),
        _mm512_add_ps(_mm512_fmadd_ps(_mm512_set1_ps(8.0), diff34, diff12), a[5]),
    ]
}

/// `A [p, q]`: `[p, p + q, p − q, −q]`.
///
/// # Safety
/// AVX-512F must be available.
#[target_feature(enable = "avx512f")]
#[inline]
unsafe fn a(p: __m512, q: __m512) -> [__m512; 4] {
    [p, _mm512_add_ps(p, q), _mm512_sub_ps(p, q), _mm512_sub_ps(_mm512_setzero_ps(), q)]
}

/// The lanes `l` of a 16-lane load from column `start` whose columns `start + l` are within
/// `0 … w − 1`.
fn within(start: isize, w: usize) -> u16 {
    let low = (-start).clamp(0, 16);
    let high = (w as isize - start).clamp(0, 16);
    if high <= low {
        0
    } else {
        mask(high as usize) & !mask(low as usize)
    }
}

/// The permutations that pick the even and the odd lanes of two vectors seen as one of 32 lanes
/// (for [`pick`]).
///
/// # Safety
/// AVX-512F must be available.
#[target_feature(enable = "avx512f")]
#[inline]
unsafe fn even_odd() -> [__m512i; 2] {
    [
        _mm512_set_epi32(30, 28, 26, 24, 22, 20, 18, 16, 14, 12, 10, 8, 6, 4, 2, 0),
        _mm512_set_epi32(31, 29, 27, 25, 23, 21, 19, 17, 15, 13, 11, 9, 7, 5, 3, 1),
    ]
}

/// The lanes of `a` and `b` (as one 32-lane vector) that `idx` picks.
///
/// # Safety
/// AVX-512F must be available.
#[target_feature(enable = "avx512f")]
#[inline]
unsafe fn pick(a: __m512, idx: __m512i, b: __m512) -> __m512 {
    _mm512_castsi512_ps(_mm512_permutex2var_epi32(_mm512_castps_si512(a), idx, _mm512_castps_si512(b)))
}

/// `Bᵀ a` for the four rows (or columns) `a`: `[a0 − a2, a1 + a2, a2 − a1, a1 − a3]`.
///
/// # Safety
/// AVX-512F must be available.
#[target_feature(enable = "avx512f")]
#[inline]
unsafe fn bt(a: [__m512; 4]) -> [__m512; 4] {
    [_mm512_sub_ps(a[0], a[2]), _mm512_add_ps(a[1], a[2]), _mm512_sub_ps(a[2], a[1]), _mm512_sub_ps(a[1], a[3])]
}

/// `Aᵀ a` for the four rows (or columns) `a`: `[a0 + a1 + a2, a1 − a2 − a3]`.
///
/// # Safety
/// AVX-512F must be available.
#[target_feature(enable = "avx512f")]
#[inline]
unsafe fn at(a: [__m512; 4]) -> [__m512; 2] {
    [_mm512_add_ps(_mm512_add_ps(a[0], a[1]), a[2]), _mm512_sub_ps(_mm512_sub_ps(a[1], a[2]), a[3])]
}

/// `m[k·SPAN + 16p + l] = Σ_c u[c·C + k] · v[c·SPAN + 16p + l]` for `p < N`: one `ξ` of one
/// block of output channels.
///
/// # Safety
/// AVX-512F must be available; `v` readable at `r·SPAN`, `u` at `r·C`, `m` writable at
/// `C·SPAN` elements.
#[target_feature(enable = "avx512f")]
unsafe fn products<const N: usize>(v: *const f32, u: *const f32, r: usize, m: *mut f32) {
    let mut sums = [[_mm512_setzero_ps(); N]; C];
    for c in 0..r {
        accumulate(&mut sums, v.add(c * SPAN), u.add(c * C));
    }
    store_sums(&sums, m);
}

/// Writes the outputs `Aᵀ M A` of unit `unit`'s 16 tiles, channel `ch`, through `map`: `m` holds
/// `M_ξ` of tile `l` at `ξ·C·SPAN + l`. Output rows `2·ty`, `2·ty + 1` (the second only if it is
/// within `h`), columns `32v …` up to `w`.
///
/// # Safety
/// AVX-512F must be available; `m` readable as described; `out` must be the image's output `[o,
/// h, w]` with `ch < o`, the elements written not accessed by any other thread.
#[target_feature(enable = "avx512f")]
unsafe fn store(m: *const f32, tiles: Tiles, unit: usize, map: Map, out: Output, ch: usize) {
    let (ty, v) = (unit / tiles.units, unit % tiles.units);
    // Aᵀ M: rows 0 and 1 of the four columns.
    let mut rows = [[_mm512_setzero_ps(); 4]; 2];
    for j in 0..4 {
        let column = [0, 1, 2, 3].map(|i| _mm512_loadu_ps(m.add((4 * i + j) * C * SPAN)));
        for (row, value) in rows.iter_mut().zip(at(column)) {
            row[j] = value;
        }
    }
    // Even and odd columns interleaved.
    let [low, high] = interleave();
    let x0 = 32 * v;
    let n = 32.min(tiles.w - x0);
    let masks = [mask(n), mask(n.saturating_sub(16))];
    for (i, row) in rows.iter().enumerate() {
        let y = 2 * ty + i;
        if y >= tiles.h {
            break;
        }
        // (Aᵀ M) A: columns 0 and 1.
        let [even, odd] = at(*row).map(|s| apply(map, s));
        let at = out.0.add((ch * tiles.h + y) * tiles.w + x0);
        _mm512_mask_storeu_ps(at, masks[0], pick(even, low, odd));
        _mm512_mask_storeu_ps(at.add(16), masks[1], pick(even, high, odd));
    }
}

/// Writes the outputs `Aᵀ M A` of F(4 × 4, 3 × 3) of unit `unit`'s 16 tiles, channel `ch`,
/// through `map`: `m` holds `M_ξ` of tile `l` at `ξ·C·SPAN + l`. Output rows `4·ty … 4·ty + 3`
/// (those within `h`), columns `64v …` up to `w`.
///
/// # Safety
/// AVX-512F must be available; `m` readable as described; `out` must be the image's output `[o,
/// h, w]` with `ch < o`, the elements written not accessed by any other thread.
#[target_feature(enable = "avx512f")]
unsafe fn store4(m: *const f32, tiles: Tiles, unit: usize, map: Map, out: Output, ch: usize) {
    let (ty, v) = (unit / tiles.units, unit % tiles.units);
    // Aᵀ M down the columns: rows 0 … 3 of the six columns.
    let mut rows = [[_mm512_setzero_ps(); 6]; 4];
    for j in 0..6 {
        let column = [0, 1, 2, 3, 4, 5].map(|i| _mm512_loadu_ps(m.add((6 * i + j) * C * SPAN)));
        for (row, value) in rows.iter_mut().zip(at6(column)) {
            row[j] = value;
        }
    }
    let [low, high] = interleave();
    let x0 = 64 * v;
    let n = 64.min(tiles.w - x0);
    let masks = [0, 16, 32, 48].map(|k| mask(n.saturating_sub(k)));
    for (i, row) in rows.iter().enumerate() {
        let y = 4 * ty + i;
        if y >= tiles.h {
            break;
        }
        // (Aᵀ M) A: columns 4l … 4l + 3 of the tiles l, interleaved twice into 64 columns.
        let [c0, c1, c2, c3] = at6(*row).map(|s| apply(map, s));
        let (even_low, even_high) = (pick(c0, low, c2), pick(c0, high, c2));
        let (odd_low, odd_high) = (pick(c1, low, c3), pick(c1, high, c3));
        let at = out.0.add((ch * tiles.h + y) * tiles.w + x0);
        for (k, (p, q)) in [(even_low, odd_low), (even_high, odd_high)].into_iter().enumerate() {
            _mm512_mask_storeu_ps(at.add(32 * k), masks[2 * k], pick(p, low, q));
            _mm512_mask_storeu_ps(at.add(32 * k + 16), masks[2 * k + 1], pick(p, high, q));
        }
    }
}

/// `map` applied to 16 values: `(s + add)·scale + shift`, then `max(·, 0)` if `relu`.
///
/// # Safety
/// AVX-512F must be available.
#[target_feature(enable = "avx512f")]
#[inline]
unsafe fn apply(map: Map, s: __m512) -> __m512 {
    let value =
        _mm512_add_ps(_mm512_mul_ps(_mm512_add_ps(s, _mm512_set1_ps(map.add)), _mm512_set1_ps(map.scale)), _mm512_set1_ps(map.shift));
    if map.relu {
        _mm512_max_ps(value, _mm512_setzero_ps())
    } else {
        value
    }
}

/// The permutations that interleave two vectors `a`, `b` (as one of 32 lanes): lanes 0–15 of
/// `a0 b0 a1 b1 …` (for [`pick`]), then lanes 16–31.
///
/// # Safety
/// AVX-512F must be available.
#[target_feature(enable = "avx512f")]
#[inline]
unsafe fn interleave() -> [__m512i; 2] {
    [
        _mm512_set_epi32(23, 7, 22, 6, 21, 5, 20, 4, 19, 3, 18, 2, 17, 1, 16, 0),
        _mm512_set_epi32(31, 15, 30, 14, 29, 13, 28, 12, 27, 11, 26, 10, 25, 9, 24, 8),
    ]
}

/// The mask of the first `n` (at most 16) lanes.
fn mask(n: usize) -> u16 {
    if n >= 16 {
        u16::MAX
    } else {
        (1u16 << n) - 1
    }
}

#[cfg(test)]
mod tests {
    use super::super::{conv_image_gemm, direct, Epilogue, Padded, Taps};
    use super::*;
    use crate::rng::SplitMix64;

    fn random(n: usize, rng: &mut SplitMix64) -> Vec<f32> {
        (0..n).map(|_| (rng.next_f64() * 2.0 - 1.0) as f32).collect()
    }

    #[test]
    fn winograd_equals_the_tap_gemms_for_every_layout_epilogue_and_odd_size() {
        if !direct::available() {
            return;
        }
        // (input channels, output channels, h, w): odd heights and widths, a single tile, rows of
        // one unit and of several (32 columns for F2, 64 for F4; 65 and 130 one column past),
        // channel counts that are not a multiple of the block's, more units than a block and a
        // last block that is not full, many input channels.
        for (r, o, h, w) in [
            (1, 1, 1, 1),
            (3, 5, 2, 3),
            (8, 8, 5, 17),
            (9, 13, 9, 6),
            (16, 4, 3, 40),
            (2, 3, 31, 33),
            (12, 7, 30, 64),
            (5, 6, 21, 97),
            (4, 5, 7, 65),
            (3, 9, 14, 130),
            (64, 6, 10, 36),
        ] {
            let mut rng = SplitMix64::new((r * 1000 + o * 100 + h * 10 + w) as u64);
            let geo = Padded::new(h, w);
            let input = random(r * h * w, &mut rng);
            let weights = random(o * r * 9, &mut rng);
            let (bias, scale, shift) = (random(o, &mut rng), random(o, &mut rng), random(o, &mut rng));
            let forward = Taps { row_stride: 9 * r, red_stride: 9, flip: false };
            let transposed = Taps { row_stride: 9, red_stride: 9 * o, flip: true };
            let plain = Epilogue { bias: Some(&bias), affine: None };
            let fused = Epilogue { bias: Some(&bias), affine: Some((&scale, &shift)) };
            let none = Epilogue { bias: None, affine: None };
            for (taps, epilogue, what) in [(forward, &plain, "bias"), (forward, &fused, "affine + relu"), (transposed, &none, "flipped")] {
                let mut want = vec![MaybeUninit::new(f32::NAN); o * h * w];
                conv_image_gemm(&input, geo, [r, o], &weights, taps, epilogue, gemm::Parallelism::None, &mut want);
                for (variant, parallel) in [(Winograd::F2, false), (Winograd::F2, true), (Winograd::F4, false), (Winograd::F4, true)] {
                    let transformed = Transformed::new(&weights, o, r, taps, variant);
                    let mut out = vec![MaybeUninit::new(f32::NAN); o * h * w];
                    convolve(&input, [h, w], &transformed, epilogue, &mut out, parallel);
                    for (i, (v, want)) in out.iter().zip(&want).enumerate() {
                        // SAFETY: initialised (to NaN, which the comparison would catch) above.
                        let (got, want) = unsafe { (v.assume_init(), want.assume_init()) };
                        // Inputs and weights are within ±1: 9r products of at most 1, then the
                        // epilogue's scale and shift within ±1.
                        let tol = 1e-5 * (9 * r) as f32 * 2.0;
                        assert!(
                            (got - want).abs() <= tol,
                            "{variant:?} {r}→{o} {h}×{w} {what} parallel {parallel}: element {i} {got} vs {want}"
                        );
                    }
                }
            }
        }
    }

    #[test]
    fn suits_only_planes_whose_tile_rows_fill_their_units() {
        use Winograd::{F2, F4};
        // F2, 64 columns: 32 tiles, two full units; 34 columns: 17 tiles in two units (47 % empty).
        assert!(suits(F2, 32, 64, 64));
        assert!(!suits(F2, 32, 64, 34));
        // 16 columns: 8 tiles, half a unit.
        assert!(!suits(F2, 64, 16, 16));
        assert!(suits(F2, 64, 373, 373));
        // F4: 94 columns are 24 tiles in two units (25 % empty), 66 are 17 in two.
        assert!(suits(F4, 64, 94, 94));
        assert!(!suits(F4, 64, 94, 66));
        // The first layer (one input channel) and planes shorter than a tile stay on the direct
        // kernel.
        assert!(!suits(F2, 1, 64, 64));
        assert!(!suits(F2, 32, 1, 64));
        assert!(!suits(F4, 32, 3, 64));
    }
}
