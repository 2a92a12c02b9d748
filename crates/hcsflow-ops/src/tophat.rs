//! White top-hat background subtraction with a disk structuring element.
//!
//! - [`white_tophat`] (`white_tophat`): `image − opening(image, disk(r))`, equal to
//!   scikit-image's `white_tophat(image, disk(r))` exactly (every dtype: min, max and
//!   the final subtraction are exact in the input dtype). `disk(r)` is skimage's
//!   footprint `dy² + dx² ≤ r²`. Borders: skimage uses `mode="reflect"`; for a
//!   symmetric convex footprint a reflected pixel always lies inside the same
//!   footprint window, so that equals ignoring out-of-image pixels (skimage
//!   `mode="ignore"`), which is what this implementation does. Exception: when the
//!   disk is much larger than the image, scipy's reflect padding runs out and skimage's
//!   default mode returns values that are not in the image (an opening above the
//!   image); there we equal skimage's `mode="ignore"`.
//! - [`tophat`] (`tophat`): OpenHCS's fast variant (`radius=50, downsample=4`):
//!   background estimated on a downsampled image, see [`tophat`] for the exact definition.
//!
//! Algorithm: the disk is the union of horizontal chords; erosion (dilation) by it
//! is, per output row, the min (max) over the 2r+1 rows `y+dy` of a horizontal
//! running min over the chord half-width `h(dy) = ⌊√(r²−dy²)⌋`. Running mins for
//! every distinct half-width are read off a per-row sparse table of power-of-two
//! windows (two lookups per window), kept for the 2r+1 rows in flight in a ring.
//! Cost per pixel: ~log2(2r+1) + (#distinct widths) + (2r+1) vectorised min/max,
//! independent of the footprint area; rows are split over threads in chunks.

use hcsflow_core::{with_pixels, Contract, FunctionDecl, FunctionError, Pixel, Registry, Stack, StackArray};
use rayon::prelude::*;

/// Min/max on a pixel type, with the identity elements used for padding.
pub(crate) trait Lattice: Pixel {
    /// Identity of `min` (no pixel is larger).
    const TOP: Self;
    /// Identity of `max` (no pixel is smaller).
    const BOTTOM: Self;
    fn min2(a: Self, b: Self) -> Self;
    fn max2(a: Self, b: Self) -> Self;
    /// `a − b` where `b ≤ a` (exact for integers; IEEE subtraction for f32).
    fn sub(a: Self, b: Self) -> Self;
    fn is_nan(self) -> bool {
        false
    }
}

macro_rules! int_lattice {
    ($t:ty) => {
        impl Lattice for $t {
            const TOP: Self = <$t>::MAX;
            const BOTTOM: Self = <$t>::MIN;
            #[inline(always)]
            fn min2(a: Self, b: Self) -> Self {
                a.min(b)
            }
            #[inline(always)]
            fn max2(a: Self, b: Self) -> Self {
                a.max(b)
            }
            #[inline(always)]
            fn sub(a: Self, b: Self) -> Self {
                a.saturating_sub(b)
            }
        }
    };
}
int_lattice!(u8);
int_lattice!(u16);

impl Lattice for f32 {
    const TOP: Self = f32::INFINITY;
    const BOTTOM: Self = f32::NEG_INFINITY;
    #[inline(always)]
    fn min2(a: Self, b: Self) -> Self {
        if b < a {
            b
        } else {
            a
        }
    }
    #[inline(always)]
    fn max2(a: Self, b: Self) -> Self {
        if b > a {
            b
        } else {
            a
        }
    }
    #[inline(always)]
    fn sub(a: Self, b: Self) -> Self {
        a - b
    }
    fn is_nan(self) -> bool {
        f32::is_nan(self)
    }
}

/// Largest radius accepted (a 2001-pixel-wide disk); larger values are almost
/// certainly unit mistakes.
pub const MAX_RADIUS: usize = 1000;

/// Half-width of skimage's `disk(r)` chord at row offset `dy`: the largest `x`
/// with `x² + dy² ≤ r²` (exact integer arithmetic). The GPU top-hat decomposes
/// the disk with it too.
pub fn chord_half_width(r: usize, dy: usize) -> usize {
    let rem = r * r - dy * dy;
    let mut x = (rem as f64).sqrt() as usize;
    while x * x > rem {
        x -= 1;
    }
    while (x + 1) * (x + 1) <= rem {
        x += 1;
    }
    x
}

/// Erosion (`erode = true`, min) or dilation (max) of an `h × w` image by `disk(r)`,
/// ignoring out-of-image pixels.
pub(crate) fn morph_disk<T: Lattice>(src: &[T], h: usize, w: usize, r: usize, erode: bool) -> Vec<T> {
    let mut out = vec![T::default(); h * w];
    if h == 0 || w == 0 {
        return out;
    }
    if r == 0 {
        out.copy_from_slice(src);
        return out;
    }
    if erode {
        morph_into(src, h, w, r, T::TOP, T::min2, &mut out);
    } else {
        morph_into(src, h, w, r, T::BOTTOM, T::max2, &mut out);
    }
    out
}

fn morph_into<T: Lattice, F: Fn(T, T) -> T + Sync + Copy>(src: &[T], h: usize, w: usize, r: usize, identity: T, op: F, out: &mut [T]) {
    // Distinct chord half-widths and, per |dy|, which one it uses.
    let widths_per_dy: Vec<usize> = (0..=r).map(|dy| chord_half_width(r, dy)).collect();
    let mut distinct: Vec<usize> = widths_per_dy.clone();
    distinct.sort_unstable();
    distinct.dedup();
    let width_index: Vec<usize> = widths_per_dy.iter().map(|hw| distinct.binary_search(hw).unwrap_or(0)).collect();
    let threads = rayon::current_num_threads().max(1);
    let chunk = (h.div_ceil(2 * threads)).max(4 * r).max(16);
    let geometry = Geometry { h, w, r, chunk, distinct: &distinct, width_index: &width_index };
    out.par_chunks_mut(chunk * w).enumerate().for_each(|(ci, out_chunk)| {
        #[cfg(target_arch = "x86_64")]
        {
            if std::arch::is_x86_feature_detected!("avx2") {
                // SAFETY: the CPU supports AVX2, checked just above.
                unsafe { morph_chunk_avx2(src, &geometry, identity, op, ci, out_chunk) };
                return;
            }
        }
        morph_chunk(src, &geometry, identity, op, ci, out_chunk)
    });
}

/// Shape of one morphology call, shared by its row chunks.
struct Geometry<'a> {
    h: usize,
    w: usize,
    r: usize,
    chunk: usize,
    distinct: &'a [usize],
    width_index: &'a [usize],
}

#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx2")]
unsafe fn morph_chunk_avx2<T: Lattice, F: Fn(T, T) -> T + Copy>(
    src: &[T],
    g: &Geometry<'_>,
    identity: T,
    op: F,
    ci: usize,
    out_chunk: &mut [T],
) {
    morph_chunk(src, g, identity, op, ci, out_chunk)
}

/// Output rows `ci·chunk..` of one erosion/dilation (see [`morph_disk`]). Compiled
/// for AVX2 when available (min/max are exact, so both paths agree).
#[inline(always)]
fn morph_chunk<T: Lattice, F: Fn(T, T) -> T + Copy>(src: &[T], g: &Geometry<'_>, identity: T, op: F, ci: usize, out_chunk: &mut [T]) {
    let Geometry { h, w, r, chunk, distinct, width_index } = *g;
    let nw = distinct.len();
    let ring = 2 * r + 1;
    let y0 = ci * chunk;
    let y1 = (y0 + out_chunk.len() / w).min(h);
    let padded = w + 2 * r;
    // Sparse table levels of one padded row, level k = windows of 2^k pixels.
    let max_len = 2 * r + 1;
    let levels = usize::BITS as usize - max_len.leading_zeros() as usize; // floor(log2)+1
    let mut table: Vec<Vec<T>> = (0..levels).map(|_| vec![identity; padded]).collect();
    let mut rows: Vec<T> = vec![identity; ring * nw * w];
    let mut acc: Vec<T> = vec![identity; w];
    let fill_row = |yi: usize, table: &mut Vec<Vec<T>>, rows: &mut Vec<T>| {
        let base = &mut table[0];
        base[r..r + w].copy_from_slice(&src[yi * w..(yi + 1) * w]);
        for k in 1..levels {
            let step = 1usize << (k - 1);
            let (lo, hi) = table.split_at_mut(k);
            let prev = &lo[k - 1];
            let cur = &mut hi[0];
            let n = padded + 1 - (1 << k);
            for x in 0..n {
                cur[x] = op(prev[x], prev[x + step]);
            }
        }
        let slot = yi % ring;
        for (wi, &hw) in distinct.iter().enumerate() {
            let len = 2 * hw + 1;
            let k = (usize::BITS - 1 - len.leading_zeros()) as usize;
            let p2 = 1usize << k;
            let lvl = &table[k];
            let a = &lvl[r - hw..r - hw + w];
            let b = &lvl[r + hw + 1 - p2..r + hw + 1 - p2 + w];
            let dst = &mut rows[(slot * nw + wi) * w..(slot * nw + wi + 1) * w];
            for ((d, &u), &v) in dst.iter_mut().zip(a).zip(b) {
                *d = op(u, v);
            }
        }
    };
    let first = y0.saturating_sub(r);
    let mut filled = first; // rows first..filled are in the ring
    for y in y0..y1 {
        let need = (y + r + 1).min(h);
        while filled < need {
            fill_row(filled, &mut table, &mut rows);
            filled += 1;
        }
        acc.iter_mut().for_each(|a| *a = identity);
        let lo = y.saturating_sub(r);
        let hi = (y + r).min(h - 1);
        for yi in lo..=hi {
            let dy = yi.abs_diff(y);
            let wi = width_index[dy];
            let slot = yi % ring;
            let row = &rows[(slot * nw + wi) * w..(slot * nw + wi + 1) * w];
            for (a, &v) in acc.iter_mut().zip(row) {
                *a = op(*a, v);
            }
        }
        out_chunk[(y - y0) * w..(y - y0 + 1) * w].copy_from_slice(&acc);
    }
}

/// Opening (erosion then dilation) of one plane by `disk(r)`.
pub(crate) fn opening_disk<T: Lattice>(src: &[T], h: usize, w: usize, r: usize) -> Vec<T> {
    let eroded = morph_disk(src, h, w, r, true);
    morph_disk(&eroded, h, w, r, false)
}

fn check_radius(function: &str, radius: usize) -> Result<(), FunctionError> {
    if radius > MAX_RADIUS {
        return Err(FunctionError::invalid(function, format!("radius {radius} is larger than {MAX_RADIUS}")));
    }
    Ok(())
}

fn check_nan<T: Lattice>(function: &str, plane: &[T]) -> Result<(), FunctionError> {
    if plane.iter().any(|v| v.is_nan()) {
        return Err(FunctionError::invalid(function, "the image contains NaN; morphology on NaN is undefined"));
    }
    Ok(())
}

/// White top-hat of every plane: `image − opening(image, disk(radius))`.
///
/// Contract: per plane (`pure_2d`), same shape and dtype as the input; equals
/// `skimage.morphology.white_tophat(plane, skimage.morphology.disk(radius))`
/// exactly for u8, u16 and f32. `radius = 0` gives zeros. Errors: radius above
/// [`MAX_RADIUS`], NaN in an f32 image.
pub fn white_tophat(stack: &Stack, radius: usize) -> Result<Stack, FunctionError> {
    const NAME: &str = "white_tophat";
    check_radius(NAME, radius)?;
    let [n, h, w] = stack.shape();
    Ok(with_pixels!(Stack, stack, a, T => {
        let mut out = StackArray::<T>::zeros([n, h, w]);
        for (p, dst) in a.planes().zip(out.planes_mut()) {
            check_nan(NAME, p)?;
            let opened = opening_disk(p, h, w, radius);
            dst.iter_mut().zip(p.iter().zip(&opened)).for_each(|(d, (&v, &o))| *d = T::sub(v, o));
        }
        Stack::from(out)
    }))
}

/// OpenHCS's fast top-hat (`tophat(selem_radius=50, downsample_factor=4)`), defined here as:
///
/// 1. `f = downsample`; the small image has `⌈H/f⌉ × ⌈W/f⌉` pixels, each the mean
///    (f64 sum, rounded to f32) of its `f × f` block (edge blocks: of the pixels present).
/// 2. `bg_small = opening(small, disk(radius / f))` (integer division, as OpenHCS),
///    exact in f32.
/// 3. `bg` = bilinear upsampling of `bg_small`: full-resolution pixel `y` samples the
///    small image at `(y + 0.5)/f − 0.5`, clamped to `[0, ⌈H/f⌉−1]` (pixel centres
///    aligned), same for `x`; computed in f32.
/// 4. result = `max(image − bg, 0)` in f32, rounded (ties to even) and saturated to the input dtype.
///
/// OpenHCS instead downsamples with `skimage.transform.resize(anti_aliasing=True)`
/// (Gaussian pre-filter + bilinear) and upsamples with `resize` again; the block mean
/// is the exact area average, so backgrounds differ slightly near edges of bright
/// structures. `downsample = 1` gives exactly [`white_tophat`].
pub fn tophat(stack: &Stack, radius: usize, downsample: usize) -> Result<Stack, FunctionError> {
    const NAME: &str = "tophat";
    check_radius(NAME, radius)?;
    if downsample == 0 {
        return Err(FunctionError::invalid(NAME, "downsample must be at least 1"));
    }
    if downsample == 1 {
        return white_tophat(stack, radius);
    }
    let f = downsample;
    let rs = radius / f;
    let [n, h, w] = stack.shape();
    let (hs, ws) = (h.div_ceil(f), w.div_ceil(f));
    Ok(with_pixels!(Stack, stack, a, T => {
        let mut result = StackArray::<T>::zeros([n, h, w]);
        for (p, out) in a.planes().zip(result.planes_mut()) {
            check_nan(NAME, p)?;
            // 1. block means
            let mut small = vec![0f32; hs * ws];
            small.par_chunks_mut(ws.max(1)).enumerate().for_each(|(by, row)| {
                let ya = by * f;
                let yb = (ya + f).min(h);
                for (bx, out) in row.iter_mut().enumerate() {
                    let xa = bx * f;
                    let xb = (xa + f).min(w);
                    let mut s = 0f64;
                    for y in ya..yb {
                        for &v in &p[y * w + xa..y * w + xb] {
                            s += v.to_f32() as f64;
                        }
                    }
                    *out = (s / ((yb - ya) * (xb - xa)) as f64) as f32;
                }
            });
            // 2. opening
            let bg = opening_disk(&small, hs, ws, rs);
            // 3. + 4. bilinear upsampling and subtraction
            let coords = |len: usize, small_len: usize| -> Vec<(usize, usize, f32)> {
                (0..len)
                    .map(|i| {
                        let s = ((i as f32 + 0.5) / f as f32 - 0.5).clamp(0.0, (small_len - 1) as f32);
                        let i0 = s.floor() as usize;
                        let i1 = (i0 + 1).min(small_len - 1);
                        (i0, i1, s - i0 as f32)
                    })
                    .collect()
            };
            let cy = coords(h, hs);
            let cx = coords(w, ws);
            out.par_chunks_mut(w.max(1)).enumerate().for_each(|(y, row)| {
                let (y0, y1, fy) = cy[y];
                let r0 = &bg[y0 * ws..(y0 + 1) * ws];
                let r1 = &bg[y1 * ws..(y1 + 1) * ws];
                for (x, o) in row.iter_mut().enumerate() {
                    let (x0, x1, fx) = cx[x];
                    let top = (1.0 - fx) * r0[x0] + fx * r0[x1];
                    let bot = (1.0 - fx) * r1[x0] + fx * r1[x1];
                    let b = (1.0 - fy) * top + fy * bot;
                    let v = (p[y * w + x].to_f32() - b).max(0.0);
                    *o = T::from_f32_clip(v);
                }
            });
        }
        Stack::from(result)
    }))
}

hcsflow_core::function_args! {
    /// The arguments of [`WHITE_TOPHAT`].
    pub struct WhiteTophatArgs {
        radius: i64 = int(50, Some(0), Some(MAX_RADIUS as i64), "disk radius in pixels (skimage disk(radius): dy²+dx² ≤ radius²)"),
    }
}

hcsflow_core::function_args! {
    /// The arguments of [`TOPHAT`].
    pub struct TophatArgs {
        radius: i64 = int(50, Some(0), Some(MAX_RADIUS as i64), "disk radius at full resolution (pixels)"),
        downsample: i64 = int(4, Some(1), Some(64), "downsampling factor (1 = exact white_tophat)"),
    }
}

pub static WHITE_TOPHAT: FunctionDecl<WhiteTophatArgs> = FunctionDecl::new(
    "white_tophat",
    Contract::Pure2d,
    "White top-hat with an exact disk (image − opening); equals skimage.morphology.white_tophat(img, disk(radius)).",
);

pub static TOPHAT: FunctionDecl<TophatArgs> = FunctionDecl::new(
    "tophat",
    Contract::Pure2d,
    "OpenHCS's fast top-hat: disk(radius/downsample) opening of the block-mean downsampled image, bilinear upsampled background subtracted, clipped at 0.",
);

pub(crate) fn register(registry: &mut Registry) {
    registry.add(WHITE_TOPHAT.host(|s, a, _| white_tophat(s, a.radius.max(0) as usize)));
    registry.add(TOPHAT.host(|s, a, _| tophat(s, a.radius.max(0) as usize, a.downsample.max(1) as usize)));
}

#[cfg(test)]
mod tests {
    use hcsflow_testkit::random_values;

    use super::*;

    /// Brute-force opening over the literal footprint (the definition).
    fn brute_morph(src: &[u16], h: usize, w: usize, r: usize, erode: bool) -> Vec<u16> {
        let ri = r as isize;
        let mut out = vec![0u16; h * w];
        for y in 0..h as isize {
            for x in 0..w as isize {
                let mut m = if erode { u16::MAX } else { 0 };
                for dy in -ri..=ri {
                    for dx in -ri..=ri {
                        if dy * dy + dx * dx > ri * ri {
                            continue;
                        }
                        let (yy, xx) = (y + dy, x + dx);
                        if yy < 0 || xx < 0 || yy >= h as isize || xx >= w as isize {
                            continue;
                        }
                        let v = src[(yy as usize) * w + xx as usize];
                        m = if erode { m.min(v) } else { m.max(v) };
                    }
                }
                out[y as usize * w + x as usize] = m;
            }
        }
        out
    }

    #[test]
    fn chord_widths_are_exact() {
        assert_eq!(chord_half_width(5, 0), 5);
        assert_eq!(chord_half_width(5, 3), 4);
        assert_eq!(chord_half_width(5, 4), 3);
        assert_eq!(chord_half_width(5, 5), 0);
    }

    #[test]
    fn morphology_matches_brute_force() {
        for (seed, &(h, w)) in (0u64..).zip(&[(1usize, 1usize), (7, 3), (13, 29), (40, 33)]) {
            let src: Vec<u16> = random_values(h * w, seed, |r| (r % 1000) as u16);
            for r in [1usize, 2, 3, 5, 8, 20, 50] {
                for erode in [true, false] {
                    assert_eq!(morph_disk(&src, h, w, r, erode), brute_morph(&src, h, w, r, erode), "{h}x{w} r={r} erode={erode}");
                }
            }
        }
    }
}
