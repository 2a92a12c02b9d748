//! Applying a u16 percentile stretch as fixed-point arithmetic instead of a
//! table lookup, where that gives the table's values exactly.
//!
//! A lookup costs about one load and one store per pixel and cannot be
//! vectorised (gathers are no faster). Between the two percentiles the
//! stretch is affine, so `round(x(v))` equals `(B + A·(v − a)) >> 32` in
//! 64-bit integers for every value `v` unless `x(v)` lies within about 10⁻⁵
//! of a half-integer. [`AffineStretch::fit`] builds `A`, `B` and checks the
//! result against the table for every value between the percentiles; only if
//! all agree is it used (with AVX-512, 32 pixels per step), so the output is
//! always the table's.

use rayon::prelude::*;

/// Pixels per parallel task.
const CHUNK: usize = 1 << 18;

/// `lut[v]` for every u16 `v`, computed as: `low` below `a`, `high` above `b`,
/// `clamp((bias + slope·(v − a)) >> 32, 0, 65535)` in between.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct AffineStretch {
    a: u16,
    b: u16,
    low: u16,
    high: u16,
    slope: i64,
    bias: i64,
}

impl AffineStretch {
    /// The fixed-point form of `lut`, whose entries are `round(x(v))` clipped
    /// to u16 with `x` affine on `a..=b` (`x_a`, `x_b` its unrounded ends) and
    /// `lut` constant below `a` and above `b`. `None` if no form reproduces
    /// every entry (a value next to a rounding tie), or the numbers could
    /// overflow 64 bits.
    pub(crate) fn fit(lut: &[u16], a: usize, b: usize, x_a: f64, x_b: f64) -> Option<AffineStretch> {
        if a > b || b >= lut.len() || lut.len() != 1 << 16 || !x_a.is_finite() || !x_b.is_finite() {
            return None;
        }
        const ONE: f64 = 4_294_967_296.0; // 2³²
        let slope = if b > a { (x_b - x_a) / (b - a) as f64 } else { 0.0 };
        // The largest magnitude the sum reaches, with room to spare below 2⁶³.
        let reach = (x_a.abs() + 1.0 + slope.abs() * (b - a) as f64) * ONE;
        if reach >= 2f64.powi(62) {
            return None;
        }
        let fit = AffineStretch {
            a: a as u16,
            b: b as u16,
            low: if a > 0 { lut[a - 1] } else { lut[0] },
            high: if b < 65_535 { lut[b + 1] } else { lut[65_535] },
            slope: (slope * ONE).round() as i64,
            bias: ((x_a + 0.5) * ONE).floor() as i64,
        };
        let flat_below = lut[..a].iter().all(|&e| e == fit.low);
        let flat_above = lut[b + 1..].iter().all(|&e| e == fit.high);
        let exact = (a..=b).all(|v| fit.at(v as u16) == lut[v]);
        (flat_below && flat_above && exact).then_some(fit)
    }

    /// The value for one pixel (the arithmetic the vector loop does).
    #[inline]
    fn at(&self, v: u16) -> u16 {
        if v < self.a {
            self.low
        } else if v > self.b {
            self.high
        } else {
            ((self.bias + self.slope * i64::from(v - self.a)) >> 32).clamp(0, 65_535) as u16
        }
    }

    /// Whether [`AffineStretch::apply`] has a vector loop on this CPU (else it
    /// would be slower than the table and is not worth fitting).
    pub(crate) fn available() -> bool {
        #[cfg(target_arch = "x86_64")]
        {
            std::arch::is_x86_feature_detected!("avx512f")
                && std::arch::is_x86_feature_detected!("avx512bw")
                && std::arch::is_x86_feature_detected!("avx512dq")
        }
        #[cfg(not(target_arch = "x86_64"))]
        {
            false
        }
    }

    /// Replaces every pixel `v` by the table's value, in place and in parallel.
    pub(crate) fn apply(&self, data: &mut [u16]) {
        data.par_chunks_mut(CHUNK).for_each(|c| self.apply_chunk(c));
    }

    fn apply_chunk(&self, data: &mut [u16]) {
        #[cfg(target_arch = "x86_64")]
        {
            if Self::available() {
                // SAFETY: the CPU supports AVX-512 F, BW and DQ, checked just above.
                unsafe { self.apply_avx512(data) };
                return;
            }
        }
        data.iter_mut().for_each(|v| *v = self.at(*v));
    }

    #[cfg(target_arch = "x86_64")]
    #[target_feature(enable = "avx512f,avx512bw,avx512dq")]
    unsafe fn apply_avx512(&self, data: &mut [u16]) {
        use std::arch::x86_64::*;
        let (a, b) = (_mm512_set1_epi16(self.a as i16), _mm512_set1_epi16(self.b as i16));
        let (low, high) = (_mm512_set1_epi16(self.low as i16), _mm512_set1_epi16(self.high as i16));
        let (slope, bias) = (_mm512_set1_epi64(self.slope), _mm512_set1_epi64(self.bias));
        let zero = _mm512_setzero_si512();
        // Eight offsets v − a → eight u16 results.
        let eight = |d: __m128i| -> __m128i {
            let x = _mm512_add_epi64(bias, _mm512_mullo_epi64(_mm512_cvtepu16_epi64(d), slope));
            _mm512_cvtusepi64_epi16(_mm512_max_epi64(_mm512_srai_epi64::<32>(x), zero))
        };
        let mut blocks = data.chunks_exact_mut(32);
        for block in &mut blocks {
            // SAFETY: `block` holds 32 u16 (64 bytes); unaligned load.
            let v = unsafe { _mm512_loadu_si512(block.as_ptr().cast()) };
            let d = _mm512_sub_epi16(_mm512_min_epu16(_mm512_max_epu16(v, a), b), a);
            let mut r = _mm512_castsi128_si512(eight(_mm512_castsi512_si128(d)));
            r = _mm512_inserti32x4::<1>(r, eight(_mm512_extracti32x4_epi32::<1>(d)));
            r = _mm512_inserti32x4::<2>(r, eight(_mm512_extracti32x4_epi32::<2>(d)));
            r = _mm512_inserti32x4::<3>(r, eight(_mm512_extracti32x4_epi32::<3>(d)));
            r = _mm512_mask_blend_epi16(_mm512_cmplt_epu16_mask(v, a), r, low);
            r = _mm512_mask_blend_epi16(_mm512_cmpgt_epu16_mask(v, b), r, high);
            // SAFETY: as the load.
            unsafe { _mm512_storeu_si512(block.as_mut_ptr().cast(), r) };
        }
        blocks.into_remainder().iter_mut().for_each(|v| *v = self.at(*v));
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::normalize::{integer_lut_flat_outside, PercentileNormalize};

    /// The table and the fit of a stretch between `lo` and `hi`.
    fn stretch(lo: f64, hi: f64, target_min: f64, target_max: f64) -> (Vec<u16>, Option<AffineStretch>) {
        let p = PercentileNormalize { low_percentile: 1.0, high_percentile: 99.0, target_min, target_max };
        let lut = integer_lut_flat_outside::<u16>(lo.floor() as usize, hi.ceil() as usize, |v| p.map(v, lo, hi));
        let (a, b) = (lo.ceil() as usize, hi.floor() as usize);
        let fit = AffineStretch::fit(&lut, a, b, p.map(a as f64, lo, hi), p.map(b as f64, lo, hi));
        (lut, fit)
    }

    #[test]
    fn the_fixed_point_form_gives_the_table_for_every_value() {
        let every: Vec<u16> = (0..=u16::MAX).chain([7, 65_535, 0, 300]).collect();
        let cases = [
            (205.0, 4884.0, 0.0, 65_535.0),
            (205.37, 4883.9, 0.0, 65_535.0),
            (0.0, 65_535.0, 0.0, 65_535.0),
            (1000.0, 1003.0, 0.0, 255.0),
            (12.5, 60_000.25, 1000.0, 3.0),   // falling
            (100.0, 200.0, -500.0, 90_000.0), // clipped at both ends
            (3.0, 3.0, 0.0, 65_535.0),        // hi == lo: constant
        ];
        let mut fitted = 0;
        for (lo, hi, t0, t1) in cases {
            let (lut, fit) = stretch(lo, hi, t0, t1);
            let Some(fit) = fit else { continue };
            fitted += 1;
            let mut data = every.clone();
            fit.apply(&mut data);
            let want: Vec<u16> = every.iter().map(|&v| lut[usize::from(v)]).collect();
            assert_eq!(data, want, "stretch {lo}..{hi} to {t0}..{t1}");
        }
        assert!(fitted >= 5, "only {fitted} of the stretches had a fixed-point form");
    }

    #[test]
    fn a_value_on_a_rounding_tie_keeps_the_table() {
        // lo = 0, hi = 2, target 0..3: x(1) = 1.5 exactly, which rounds to 2
        // (ties to even) where the fixed-point form would floor 2.0 − ε.
        let (lut, fit) = stretch(0.0, 2.0, 0.0, 3.0);
        assert_eq!(&lut[..3], &[0, 2, 3]);
        if let Some(fit) = fit {
            assert!((0..=u16::MAX).all(|v| fit.at(v) == lut[usize::from(v)]));
        }
        // A tie that rounds down (2.5 → 2) cannot be produced by floor(x + 0.5).
        let (lut, fit) = stretch(0.0, 2.0, 0.0, 5.0);
        assert_eq!(&lut[..3], &[0, 2, 5]);
        assert_eq!(fit, None);
    }

    #[test]
    fn a_table_that_is_not_flat_outside_is_refused() {
        let (mut lut, _) = stretch(205.0, 4884.0, 0.0, 65_535.0);
        lut[10] = 1;
        assert_eq!(AffineStretch::fit(&lut, 205, 4884, 0.0, 65_535.0), None);
    }
}
