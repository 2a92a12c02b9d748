//! 2×2 mean downsampling of one plane, for the multiscale pyramid.
//!
//! Each level is the exact mean of the level-0 pixels it covers: block sums are
//! carried in f64 from level to level and divided once, so integer rounding
//! does not accumulate across levels. At odd edges a block covers fewer pixels
//! and is divided by the number it covers.

use hcsflow_core::Pixel;

/// Sums of 2×2 blocks of `src` (`h × w`, row-major). Returns `(sums, h2, w2)`
/// with `h2 = ceil(h/2)`, `w2 = ceil(w/2)`.
fn sum_blocks<S: Copy>(src: &[S], h: usize, w: usize, to: impl Fn(S) -> f64) -> (Vec<f64>, usize, usize) {
    let (h2, w2) = (h.div_ceil(2), w.div_ceil(2));
    let mut out = vec![0.0f64; h2 * w2];
    for (i, orow) in out.chunks_exact_mut(w2).enumerate() {
        for r in (2 * i)..(2 * i + 2).min(h) {
            let row = &src[r * w..(r + 1) * w];
            let mut pairs = row.chunks_exact(2);
            for (o, p) in orow.iter_mut().zip(&mut pairs) {
                *o += to(p[0]) + to(p[1]);
            }
            if let [last] = pairs.remainder() {
                orow[w2 - 1] += to(*last);
            }
        }
    }
    (out, h2, w2)
}

/// Levels 1..`levels` of a `h × w` plane, each as a row-major vec with its
/// `(height, width)`. Level 0 (the plane itself) is not included.
pub(crate) fn downsample<T: Pixel>(plane: &[T], h: usize, w: usize, levels: usize) -> Vec<(Vec<T>, usize, usize)> {
    let mut out = Vec::with_capacity(levels.saturating_sub(1));
    if levels < 2 {
        return out;
    }
    let (mut sums, mut lh, mut lw) = sum_blocks(plane, h, w, |v: T| v.to_f32() as f64);
    for k in 1..levels {
        if k > 1 {
            (sums, lh, lw) = sum_blocks(&sums, lh, lw, |v| v);
        }
        let step = 1usize << k;
        let count = |i: usize, n: usize| ((i + 1) * step).min(n) - i * step;
        let mut level = Vec::with_capacity(lh * lw);
        for i in 0..lh {
            let ch = count(i, h);
            for j in 0..lw {
                let n = (ch * count(j, w)) as f64;
                level.push(T::from_f32_clip((sums[i * lw + j] / n) as f32));
            }
        }
        out.push((level, lh, lw));
    }
    out
}

/// Levels 1..`levels` of a `h × w` label plane by nearest-neighbour
/// subsampling: level k keeps pixel `(2^k·i, 2^k·j)` (so `ceil(n / 2^k)` per
/// axis, the sizes of [`downsample`]); label values are never mixed.
pub(crate) fn subsample<T: Copy>(plane: &[T], h: usize, w: usize, levels: usize) -> Vec<(Vec<T>, usize, usize)> {
    (1..levels)
        .map(|k| {
            let step = 1usize << k;
            let (lh, lw) = (h.div_ceil(step), w.div_ceil(step));
            let level = (0..lh).flat_map(|i| plane[i * step * w..][..w].iter().step_by(step).copied()).collect();
            (level, lh, lw)
        })
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn label_levels_keep_every_other_pixel() {
        // 3 × 5 plane: level 1 rows 0, 2 and columns 0, 2, 4; level 2 row 0, columns 0, 4.
        let p: Vec<u16> = (0..15).collect();
        let l = subsample(&p, 3, 5, 3);
        assert_eq!(l[0], (vec![0, 2, 4, 10, 12, 14], 2, 3));
        assert_eq!(l[1], (vec![0, 4], 1, 2));
        assert!(subsample(&p, 3, 5, 1).is_empty());
    }

    #[test]
    fn mean_of_blocks_with_odd_edges() {
        // 3 × 5 plane.
        let p: Vec<u16> = (0..15).collect();
        let l = downsample(&p, 3, 5, 3);
        assert_eq!(l.len(), 2);
        let (l1, h1, w1) = &l[0];
        assert_eq!((*h1, *w1), (2, 3));
        // blocks: [0,1,5,6]=3, [2,3,7,8]=5, [4,9]=6.5→6 (ties to even), [10,11]=10.5→10, [12,13]=12.5→12, [14]=14
        assert_eq!(l1, &vec![3, 5, 6, 10, 12, 14]);
        let (l2, h2, w2) = &l[1];
        assert_eq!((*h2, *w2), (1, 2));
        // exact means of level-0 pixels: rows 0..3, cols 0..4 → mean of 12 values; col 4 → mean(4,9,14)
        let m0: f64 = [0, 1, 2, 3, 5, 6, 7, 8, 10, 11, 12, 13].iter().sum::<i32>() as f64 / 12.0;
        assert_eq!(l2[0], m0.round_ties_even() as u16);
        assert_eq!(l2[1], 9);
    }

    #[test]
    fn one_level_means_none() {
        assert!(downsample(&[1u8, 2, 3, 4], 2, 2, 1).is_empty());
    }

    #[test]
    fn f32_keeps_fractions() {
        let l = downsample(&[1.0f32, 2.0, 3.0, 5.0], 2, 2, 2);
        assert_eq!(l[0].0, vec![2.75]);
    }
}
