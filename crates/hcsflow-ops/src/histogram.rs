//! Exact order statistics from histograms: the one percentile helper shared by
//! percentile normalisation and histogram equalisation (and by the GPU
//! kernels, which build the same histograms with atomics).
//!
//! - u8 / u16: one pass into 256 / 65,536 bins gives every order statistic exactly.
//!   Large inputs that need only a few order statistics (percentiles) take a
//!   cheaper exact route first: a strided sample brackets each wanted rank in
//!   a narrow window of values, and one vectorised pass counts the pixels
//!   below each window and histograms only the pixels inside it. If a rank
//!   falls outside its window (the sample misled), the full histogram decides.
//! - f32: two passes of 65,536 bins over an order-preserving 32-bit key
//!   (high 16 bits, then the low 16 bits inside the buckets that hold the
//!   wanted ranks) give exact order statistics without sorting. NaN is ignored.
//!
//! Percentiles follow numpy's default (`method='linear'`, Hyndman & Fan type 7)
//! operation for operation, so results are bit-identical to `np.percentile`
//! (integers) and `np.nanpercentile` (f32).

use rayon::prelude::*;

mod windows;

/// Pixels per parallel histogram task.
const CHUNK: usize = 1 << 20;

/// A pixel type whose values are histogram bins (u8: 256, u16: 65,536).
pub trait Binned: Copy + Send + Sync + PartialOrd {
    const BINS: usize;
    fn bin(self) -> usize;
    /// The value of bin `b` (`b < BINS`).
    fn from_bin(b: usize) -> Self;
    /// `self - other`, wrapping: the position of `self` in a window starting at `other`.
    fn wrapping_sub(self, other: Self) -> Self;
    /// The data as u16 when the type is u16 (for the u16-only vector paths).
    fn as_u16(data: &[Self]) -> Option<&[u16]>;
    /// [`Binned::as_u16`], mutable.
    fn as_u16_mut(data: &mut [Self]) -> Option<&mut [u16]>;
}
impl Binned for u8 {
    const BINS: usize = 256;
    #[inline]
    fn bin(self) -> usize {
        self as usize
    }
    #[inline]
    fn from_bin(b: usize) -> Self {
        b as u8
    }
    #[inline]
    fn wrapping_sub(self, other: Self) -> Self {
        u8::wrapping_sub(self, other)
    }
    fn as_u16(_: &[Self]) -> Option<&[u16]> {
        None
    }
    fn as_u16_mut(_: &mut [Self]) -> Option<&mut [u16]> {
        None
    }
}
impl Binned for u16 {
    const BINS: usize = 65_536;
    #[inline]
    fn bin(self) -> usize {
        self as usize
    }
    #[inline]
    fn from_bin(b: usize) -> Self {
        b as u16
    }
    #[inline]
    fn wrapping_sub(self, other: Self) -> Self {
        u16::wrapping_sub(self, other)
    }
    fn as_u16(data: &[Self]) -> Option<&[u16]> {
        Some(data)
    }
    fn as_u16_mut(data: &mut [Self]) -> Option<&mut [u16]> {
        Some(data)
    }
}

/// Counts of every value in `data`, in parallel. Two interleaved sub-histograms
/// per task keep runs of equal values (a masked background, saturation) from
/// chaining every increment on the one before; more did not pay on the machines
/// we measured (four were 10–25 % slower on real and on constant data).
///
/// One u32 accumulator per rayon fold (about one per thread), not per chunk:
/// zeroing, merging and allocating a 65,536-bin histogram costs about as much
/// as counting a 2048² plane, so it is done as rarely as possible. Data of
/// 2³² values or more takes the same path in slices below that (no u32 overflow).
///
/// The sub-histograms have the dtype's constant length and every value is a
/// valid bin, so the counting loop carries no bounds checks.
pub fn histogram<T: Binned>(data: &[T]) -> Vec<u64> {
    const MAX_PER_PASS: usize = u32::MAX as usize;
    let mut total = vec![0u64; T::BINS];
    for part in data.chunks(MAX_PER_PASS) {
        // Few folds: about two per thread (each fold zeroes and merges a histogram).
        let pieces = part.len().div_ceil(CHUNK / 4);
        let folded = part
            .par_chunks(CHUNK / 4)
            .with_min_len(pieces.div_ceil(2 * rayon::current_num_threads().max(1)).max(1))
            .fold(
                || vec![0u32; SUB * T::BINS],
                |mut h, chunk| {
                    count_into::<T>(&mut h, chunk);
                    h
                },
            )
            .map(|mut h| {
                // Merge the sub-histograms into the first.
                let (first, rest) = h.split_at_mut(T::BINS);
                for sub in rest.chunks(T::BINS) {
                    first.iter_mut().zip(sub).for_each(|(a, &b)| *a += b);
                }
                h.truncate(T::BINS);
                h
            })
            .reduce_with(|mut a, b| {
                a.iter_mut().zip(&b).for_each(|(x, &y)| *x += y);
                a
            });
        if let Some(h) = folded {
            total.iter_mut().zip(&h).for_each(|(t, &c)| *t += u64::from(c));
        }
    }
    total
}

/// Adds the values of `chunk` to the [`SUB`] interleaved sub-histograms in `h`.
#[inline]
fn count_into<T: Binned>(h: &mut [u32], chunk: &[T]) {
    let (h0, h1) = h.split_at_mut(T::BINS);
    let (h0, h1) = (&mut h0[..T::BINS], &mut h1[..T::BINS]);
    let mut pairs = chunk.chunks_exact(2);
    for q in &mut pairs {
        h0[q[0].bin()] += 1;
        h1[q[1].bin()] += 1;
    }
    for &v in pairs.remainder() {
        h0[v.bin()] += 1;
    }
}

/// Interleaved sub-histograms per task in [`histogram`].
const SUB: usize = 2;

/// Counts `bin(v)` over `data` into `bins` bins; `None` skips the value.
pub fn histogram_by<T: Copy + Send + Sync>(data: &[T], bins: usize, bin: impl Fn(T) -> Option<usize> + Sync) -> Vec<u64> {
    // About four tasks per thread: each task's private histogram is zeroed and
    // merged once, so tasks must be much larger than the histogram.
    let chunk = CHUNK.max(data.len().div_ceil(4 * rayon::current_num_threads().max(1)));
    data.par_chunks(chunk)
        .map(|chunk| {
            let mut h = vec![0u32; 4 * bins];
            let (a, b) = h.split_at_mut(2 * bins);
            let (h0, h1) = a.split_at_mut(bins);
            let (h2, h3) = b.split_at_mut(bins);
            let mut quads = chunk.chunks_exact(4);
            for q in &mut quads {
                if let Some(i) = bin(q[0]) {
                    h0[i] += 1;
                }
                if let Some(i) = bin(q[1]) {
                    h1[i] += 1;
                }
                if let Some(i) = bin(q[2]) {
                    h2[i] += 1;
                }
                if let Some(i) = bin(q[3]) {
                    h3[i] += 1;
                }
            }
            for &v in quads.remainder() {
                if let Some(i) = bin(v) {
                    h0[i] += 1;
                }
            }
            (0..bins).map(|i| u64::from(h0[i]) + u64::from(h1[i]) + u64::from(h2[i]) + u64::from(h3[i])).collect::<Vec<u64>>()
        })
        .reduce(
            || vec![0u64; bins],
            |mut a, b| {
                a.iter_mut().zip(&b).for_each(|(x, y)| *x += y);
                a
            },
        )
}

/// Cumulative counts: `cdf[i]` = number of values ≤ bin i.
pub fn cumulative(hist: &[u64]) -> Vec<u64> {
    let mut acc = 0u64;
    hist.iter()
        .map(|&c| {
            acc += c;
            acc
        })
        .collect()
}

/// The bin holding the `k`-th smallest value (0-based) given a cumulative
/// histogram, or `None` if `k` is not below the total.
pub fn bin_of_rank(cdf: &[u64], k: u64) -> Option<usize> {
    let i = cdf.partition_point(|&c| c <= k);
    (i < cdf.len()).then_some(i)
}

/// Where numpy's `'linear'` percentile `p` (0..=100) of `n` sorted values
/// falls: the two ranks to interpolate between and the weight of the second.
/// Mirrors numpy: `virtual = (n - 1) * (p / 100)`, `prev = floor(virtual)`,
/// both ranks `n - 1` when `virtual >= n - 1`. `n` must be ≥ 1.
pub fn percentile_ranks(n: u64, p: f64) -> (u64, u64, f64) {
    let virtual_index = (n - 1) as f64 * (p / 100.0);
    if virtual_index >= (n - 1) as f64 {
        return (n - 1, n - 1, 0.0);
    }
    let prev = virtual_index.floor();
    let gamma = virtual_index - prev;
    let prev = prev.max(0.0) as u64;
    (prev, prev + 1, gamma)
}

/// numpy's `_lerp(a, b, t)`: `a + (b - a)·t`, or `b - (b - a)·(1 - t)` when
/// `t ≥ 0.5`. `b - a` is taken in the data's precision (exact for u8/u16,
/// f32-rounded for f32 data), the rest in f64.
pub fn numpy_lerp(a: f32, b: f32, t: f64) -> f64 {
    let diff = f64::from(b - a);
    if t >= 0.5 {
        f64::from(b) - diff * (1.0 - t)
    } else {
        f64::from(a) + diff * t
    }
}

/// Percentiles of integer data from its histogram (bins are the values).
/// `None` for an empty histogram.
pub fn percentiles_from_histogram(hist: &[u64], ps: &[f64]) -> Option<Vec<f64>> {
    let cdf = cumulative(hist);
    let n = *cdf.last()?;
    percentiles_by_rank(n, ps, |ranks| ranks.iter().map(|&k| bin_of_rank(&cdf, k).map(|b| b as f32)).collect())
}

/// Percentiles (numpy `'linear'`) of u8/u16 data, exactly: by sampled windows
/// for large data (see [`order_statistics_int`]), else by one histogram pass.
pub fn percentiles_int<T: Binned>(data: &[T], ps: &[f64]) -> Option<Vec<f64>> {
    percentiles_by_rank(data.len() as u64, ps, |ranks| Some(order_statistics_int(data, ranks)?.into_iter().map(|v| v as f32).collect()))
}

/// The values at the 0-based `ranks` of u8/u16 `data`, exactly (`None` if a
/// rank is not below `data.len()`).
///
/// Large data first tries the windows of a strided sample, which avoid the
/// full histogram (module `windows`); the full histogram answers whenever
/// that route does not apply or misses a rank, so the result never depends
/// on the route.
pub fn order_statistics_int<T: Binned>(data: &[T], ranks: &[u64]) -> Option<Vec<usize>> {
    if let Some(values) = windows::select(data, ranks) {
        return Some(values);
    }
    order_statistics_by_histogram(data, ranks)
}

/// [`order_statistics_int`] by the full histogram only (the reference the
/// windowed route is tested against).
pub fn order_statistics_by_histogram<T: Binned>(data: &[T], ranks: &[u64]) -> Option<Vec<usize>> {
    let cdf = cumulative(&histogram(data));
    ranks.iter().map(|&k| bin_of_rank(&cdf, k)).collect()
}

/// Order-preserving key of an f32 (total order; -0 < +0). NaN has no key.
#[inline]
pub fn f32_key(v: f32) -> Option<u32> {
    if v.is_nan() {
        return None;
    }
    let b = v.to_bits();
    Some(if b & 0x8000_0000 != 0 { !b } else { b | 0x8000_0000 })
}

/// Inverse of [`f32_key`].
#[inline]
pub fn f32_from_key(k: u32) -> f32 {
    f32::from_bits(if k & 0x8000_0000 != 0 { k & 0x7FFF_FFFF } else { !k })
}

/// Exact order statistics of f32 data, phase one: which high-16-bit key
/// buckets hold the wanted 0-based ranks (among non-NaN values), given the
/// histogram of the high key bits. Phase two ([`F32Selection::finish`]) needs
/// the histogram of the low 16 key bits inside each of [`F32Selection::buckets`].
/// The GPU builds both histograms with its own kernels and reuses this.
#[derive(Debug, Clone)]
pub struct F32Selection {
    buckets: Vec<u32>,
    /// (slot in `buckets`, rank inside that bucket) per wanted rank.
    located: Vec<(usize, u64)>,
}

impl F32Selection {
    /// `None` if a rank is not below the number of values.
    pub fn locate(hist_hi: &[u64], ranks: &[u64]) -> Option<F32Selection> {
        let cdf_hi = cumulative(hist_hi);
        let mut buckets: Vec<u32> = Vec::new();
        let mut located = Vec::with_capacity(ranks.len());
        for &k in ranks {
            let b = bin_of_rank(&cdf_hi, k)?;
            let below = if b == 0 { 0 } else { cdf_hi[b - 1] };
            let slot = match buckets.iter().position(|&x| x == b as u32) {
                Some(s) => s,
                None => {
                    buckets.push(b as u32);
                    buckets.len() - 1
                }
            };
            located.push((slot, k - below));
        }
        Some(F32Selection { buckets, located })
    }

    /// The distinct high-bit buckets (at most one per rank).
    pub fn buckets(&self) -> &[u32] {
        &self.buckets
    }

    /// The values at the wanted ranks; `lows[s]` is the 65,536-bin histogram
    /// of the low key bits of the values in bucket `buckets()[s]`.
    pub fn finish(&self, lows: &[&[u64]]) -> Option<Vec<f32>> {
        self.located
            .iter()
            .map(|&(slot, k)| {
                let lo = bin_of_rank(&cumulative(lows.get(slot)?), k)?;
                Some(f32_from_key((self.buckets[slot] << 16) | lo as u32))
            })
            .collect()
    }
}

/// The ranks [`percentiles_by_rank`] asks for: two per percentile, in order.
pub fn percentile_rank_list(n: u64, ps: &[f64]) -> Vec<u64> {
    if n == 0 {
        return Vec::new();
    }
    ps.iter()
        .flat_map(|&p| {
            let (a, b, _) = percentile_ranks(n, p);
            [a, b]
        })
        .collect()
}

/// numpy `'linear'` percentiles from exact order statistics: `n` values,
/// `value_at(ranks)` returns the values at the requested 0-based ranks.
pub fn percentiles_by_rank(n: u64, ps: &[f64], value_at: impl FnOnce(&[u64]) -> Option<Vec<f32>>) -> Option<Vec<f64>> {
    if n == 0 {
        return None;
    }
    let plan: Vec<(u64, u64, f64)> = ps.iter().map(|&p| percentile_ranks(n, p)).collect();
    let values = value_at(&percentile_rank_list(n, ps))?;
    Some(plan.iter().zip(values.chunks(2)).map(|(&(_, _, t), v)| numpy_lerp(v[0], v[1], t)).collect())
}

/// Percentiles (numpy `nanpercentile`, `'linear'`) of f32 data, ignoring NaN;
/// `None` if every value is NaN or `data` is empty.
pub fn percentiles_f32(data: &[f32], ps: &[f64]) -> Option<Vec<f64>> {
    let hist_hi = histogram_by(data, 65_536, |v| f32_key(v).map(|k| (k >> 16) as usize));
    let n: u64 = hist_hi.iter().sum();
    percentiles_by_rank(n, ps, |ranks| {
        let sel = F32Selection::locate(&hist_hi, ranks)?;
        let buckets = sel.buckets();
        let joint = histogram_by(data, buckets.len() * 65_536, |v| {
            let k = f32_key(v)?;
            let slot = buckets.iter().position(|&b| b == k >> 16)?;
            Some(slot * 65_536 + (k & 0xFFFF) as usize)
        });
        let lows: Vec<&[u64]> = joint.chunks(65_536).collect();
        sel.finish(&lows)
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn keys_preserve_order() {
        let vals = [f32::NEG_INFINITY, -3.5, -1e-30, -0.0, 0.0, 1e-30, 2.0, f32::INFINITY];
        let keys: Vec<u32> = vals.iter().map(|&v| f32_key(v).unwrap()).collect();
        assert!(keys.windows(2).all(|w| w[0] < w[1]));
        for v in vals {
            assert_eq!(f32_from_key(f32_key(v).unwrap()).to_bits(), v.to_bits());
        }
        assert_eq!(f32_key(f32::NAN), None);
    }

    #[test]
    fn ranks_at_the_ends() {
        assert_eq!(percentile_ranks(1, 50.0), (0, 0, 0.0));
        assert_eq!(percentile_ranks(5, 100.0), (4, 4, 0.0));
        assert_eq!(percentile_ranks(5, 0.0), (0, 1, 0.0));
        assert_eq!(percentile_ranks(5, 50.0), (2, 3, 0.0));
    }
}
