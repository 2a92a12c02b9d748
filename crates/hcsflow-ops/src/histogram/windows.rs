//! Exact order statistics of large u8/u16 data without a full histogram.
//!
//! A full 65,536-bin histogram costs about one store per pixel, which is what
//! percentile normalisation of one 2048² plane spends most of its time on. A
//! percentile needs only two neighbouring ranks, so:
//!
//! 1. a strided sample of about [`SAMPLE`] pixels estimates, for each wanted
//!    rank, a window of values that holds it with a wide margin (four standard
//!    deviations of the sample quantile, windows at the ends reach the end of
//!    the value range);
//! 2. one pass counts, per window, the pixels below it and histograms the
//!    pixels inside it (about 1 % of them for percentiles 1 and 99). The
//!    comparisons run on 16 or 32 pixels at a time; only the in-window pixels
//!    (u16 with AVX2) or the blocks holding one (otherwise) are then handled
//!    one by one;
//! 3. a rank is found if it lies between "below" and "below + inside" of a
//!    window; its value is read from that window's histogram. Otherwise the
//!    sample misled (an image that aliases with the stride) and
//!    [`select`] returns `None`: the caller counts the full histogram instead.
//!
//! The answer never depends on the sample, only the time does.

use rayon::prelude::*;

use super::{bin_of_rank, cumulative, Binned};

/// Inputs below this length take the full histogram (the sample and the
/// windows' bookkeeping would cost as much as the histogram itself).
pub(super) const MIN_LEN: usize = 1 << 18;

/// Pixels in the sample.
const SAMPLE: usize = 1 << 15;

/// A window reaches this many standard deviations of the sample quantile (as
/// if the sample were random), plus [`MARGIN_MIN`] sample ranks, each side of
/// the wanted rank.
const MARGIN_SD: f64 = 4.0;
const MARGIN_MIN: f64 = 4.0;

/// At most this many disjoint windows (two per percentile when they do not merge).
const MAX_WINDOWS: usize = 4;

/// If the sample puts more than this share of pixels inside the windows (many
/// equal values: a constant or few-valued image), the per-pixel work on the
/// in-window pixels (a few ns each) would cost more than the full histogram
/// (about 0.35 ns per pixel). A median's window alone holds about 2.2 %.
const MAX_INSIDE: f64 = 0.04;

/// Pixels per block whose comparisons are done together.
const BLOCK: usize = 32;

/// Pixels per parallel task: at most `u16::MAX` blocks, so the per-lane u16
/// counters of the vectorised comparison cannot overflow within a task.
const TASK: usize = 1 << 16;

/// One window of values `[start, start + span]` and where its histogram lives
/// in the shared histogram buffer.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
struct Window {
    start: usize,
    span: usize,
    offset: usize,
}

/// The values at the given 0-based `ranks` of `data` (each below
/// `data.len()`), exactly, or `None` when this route does not apply or the
/// sample's windows missed a rank (the caller then counts the full histogram).
pub(super) fn select<T: Binned>(data: &[T], ranks: &[u64]) -> Option<Vec<usize>> {
    // The windows' histograms count in u32: 2³² pixels or more take the
    // histogram, which counts in slices.
    if data.len() < MIN_LEN || data.len() > u32::MAX as usize || ranks.iter().any(|&k| k >= data.len() as u64) {
        return None;
    }
    if ranks.is_empty() {
        return Some(Vec::new());
    }
    let windows = plan::<T>(data, ranks)?;
    let (below, hist) = count(data, &windows);
    ranks
        .iter()
        .map(|&k| {
            windows.iter().zip(&below).find_map(|(w, &b)| {
                let h = &hist[w.offset..w.offset + w.span + 1];
                let inside: u64 = h.iter().sum();
                (b <= k && k < b + inside).then(|| bin_of_rank(&cumulative(h), k - b).map(|i| w.start + i))?
            })
        })
        .collect()
}

/// The windows for `ranks`, from a strided sample of `data`; `None` if the
/// windows would hold too many pixels to be worth it.
fn plan<T: Binned>(data: &[T], ranks: &[u64]) -> Option<Vec<Window>> {
    let n = data.len();
    // Odd, so the sample does not walk down the same few columns of an image
    // whose width is a power of two.
    let stride = (n / SAMPLE).max(1) | 1;
    let mut hist = vec![0u32; T::BINS];
    let hist_fixed = &mut hist[..T::BINS];
    let mut m = 0u64;
    for v in data.iter().step_by(stride) {
        hist_fixed[v.bin()] += 1;
        m += 1;
    }
    if m == 0 {
        return None;
    }
    // Per wanted rank, the sample ranks at the window's two ends.
    let mut ends: Vec<u64> = Vec::with_capacity(2 * ranks.len());
    for &k in ranks {
        let q = (k as f64 + 0.5) / n as f64;
        let centre = q * m as f64;
        let margin = MARGIN_SD * (m as f64 * q * (1.0 - q)).sqrt() + MARGIN_MIN;
        // A window reaching past the sample's ends extends to the end of the
        // value range: the extremes of the data need not be in the sample.
        ends.push(if centre - margin <= 0.0 { u64::MAX } else { (centre - margin).floor() as u64 });
        ends.push(if centre + margin >= (m - 1) as f64 { u64::MAX } else { (centre + margin).ceil() as u64 });
    }
    let at = bins_of_ranks(&hist, &ends);
    let mut bounds: Vec<(usize, usize)> = at
        .chunks(2)
        .zip(ends.chunks(2))
        .map(|(b, e)| (if e[0] == u64::MAX { 0 } else { b[0] }, if e[1] == u64::MAX { T::BINS - 1 } else { b[1] }))
        .collect();
    bounds.sort_unstable();
    let mut merged: Vec<(usize, usize)> = Vec::with_capacity(bounds.len());
    for (s, e) in bounds {
        match merged.last_mut() {
            Some(last) if s <= last.1 + 1 => last.1 = last.1.max(e),
            _ => merged.push((s, e)),
        }
    }
    let in_sample: u64 = merged.iter().map(|&(s, e)| hist[s..=e].iter().map(|&c| u64::from(c)).sum::<u64>()).sum();
    if merged.len() > MAX_WINDOWS || in_sample as f64 > MAX_INSIDE * m as f64 {
        return None;
    }
    let mut offset = 0;
    Some(
        merged
            .into_iter()
            .map(|(start, end)| {
                let w = Window { start, span: end - start, offset };
                offset += w.span + 1;
                w
            })
            .collect(),
    )
}

/// The bins holding the given 0-based ranks of a histogram, in one walk that
/// stops at the largest; a rank not below the total (or `u64::MAX`) gets the last bin.
fn bins_of_ranks(hist: &[u32], ranks: &[u64]) -> Vec<usize> {
    let mut order: Vec<usize> = (0..ranks.len()).collect();
    order.sort_unstable_by_key(|&i| ranks[i]);
    let mut bins = vec![hist.len().saturating_sub(1); ranks.len()];
    let mut pending = order.iter().peekable();
    let mut below = 0u64;
    for (b, &c) in hist.iter().enumerate() {
        below += u64::from(c);
        while let Some(&&i) = pending.peek() {
            if ranks[i] >= below {
                break;
            }
            bins[i] = b;
            pending.next();
        }
        if pending.peek().is_none() {
            break;
        }
    }
    bins
}

/// Per window: the number of pixels below it, and the histogram of the pixels
/// inside it (all windows' histograms end to end, at their offsets).
fn count<T: Binned>(data: &[T], windows: &[Window]) -> (Vec<u64>, Vec<u64>) {
    match windows.len() {
        1 => count_n::<T, 1>(data, windows),
        2 => count_n::<T, 2>(data, windows),
        3 => count_n::<T, 3>(data, windows),
        _ => count_n::<T, MAX_WINDOWS>(data, windows),
    }
}

/// [`count`] for exactly `W` windows (a constant, so the per-block loops
/// unroll and vectorise); `windows` holds `W` of them.
fn count_n<T: Binned, const W: usize>(data: &[T], windows: &[Window]) -> (Vec<u64>, Vec<u64>) {
    debug_assert_eq!(windows.len(), W);
    let hist_len = windows.last().map_or(0, |w| w.offset + w.span + 1);
    let mut plan = Plan { starts: [0; W], spans: [0; W], offsets: [0; W] };
    for (i, w) in windows.iter().enumerate().take(W) {
        plan.starts[i] = w.start;
        plan.spans[i] = w.span;
        plan.offsets[i] = w.offset;
    }
    let zero = || ([0u64; W], vec![0u32; hist_len]);
    let (below, hist) = data
        .par_chunks(TASK)
        .fold(zero, |(mut below, mut hist), chunk| {
            count_task(&plan, chunk, &mut below, &mut hist);
            (below, hist)
        })
        .reduce(zero, |(mut b0, mut h0), (b1, h1)| {
            b0.iter_mut().zip(b1).for_each(|(a, b)| *a += b);
            h0.iter_mut().zip(h1).for_each(|(a, b)| *a += b);
            (b0, h0)
        });
    (below.to_vec(), hist.iter().map(|&c| u64::from(c)).collect())
}

/// The windows of [`count_n`]: values `starts[w] ..= starts[w] + spans[w]`,
/// histogrammed at `offsets[w]`.
struct Plan<const W: usize> {
    starts: [usize; W],
    spans: [usize; W],
    offsets: [usize; W],
}

impl<const W: usize> Plan<W> {
    /// Counts one pixel: below each window it is under, and inside the one holding it.
    #[inline]
    fn count_one(&self, v: usize, below: &mut [u64; W], hist: &mut [u32]) {
        for (b, &s) in below.iter_mut().zip(&self.starts) {
            *b += u64::from(v < s);
        }
        self.add(hist, v);
    }

    /// Adds `v` to the histogram of the window holding it, if any.
    #[inline]
    fn add(&self, hist: &mut [u32], v: usize) {
        for w in 0..W {
            let d = v.wrapping_sub(self.starts[w]);
            if d <= self.spans[w] {
                if let Some(c) = hist.get_mut(self.offsets[w] + d) {
                    *c += 1;
                }
            }
        }
    }
}

/// Counts one task's chunk (at most [`TASK`] pixels): u16 with AVX-512 or
/// AVX2 where the CPU has them, else the portable loop.
fn count_task<T: Binned, const W: usize>(plan: &Plan<W>, chunk: &[T], below: &mut [u64; W], hist: &mut [u32]) {
    debug_assert!(chunk.len() <= TASK);
    #[cfg(target_arch = "x86_64")]
    {
        if let Some(chunk) = T::as_u16(chunk) {
            let avx512 = std::arch::is_x86_feature_detected!("avx512f")
                && std::arch::is_x86_feature_detected!("avx512bw")
                && std::arch::is_x86_feature_detected!("avx512vbmi2")
                && std::arch::is_x86_feature_detected!("popcnt");
            if avx512 {
                // SAFETY: the CPU supports AVX-512 F, BW and VBMI2 and POPCNT, checked just above.
                unsafe { count_u16_avx512(plan, chunk, below, hist) };
                return;
            }
            if std::arch::is_x86_feature_detected!("avx2") {
                // SAFETY: the CPU supports AVX2, checked just above.
                unsafe { count_u16_avx2(plan, chunk, below, hist) };
                return;
            }
        }
    }
    count_portable(plan, chunk, below, hist)
}

/// The portable counting loop: the comparisons of a block vectorise; a block
/// holding an in-window pixel is then walked pixel by pixel.
fn count_portable<T: Binned, const W: usize>(plan: &Plan<W>, chunk: &[T], below: &mut [u64; W], hist: &mut [u32]) {
    let starts = plan.starts.map(T::from_bin);
    let spans = plan.spans.map(T::from_bin);
    // Per-lane counts of pixels below each window (a task has < 2¹⁶ blocks).
    let mut lanes = [[0u16; BLOCK]; W];
    let mut blocks = chunk.chunks_exact(BLOCK);
    for block in &mut blocks {
        let Ok(block) = <&[T; BLOCK]>::try_from(block) else { continue };
        let mut hit = 0u8;
        for w in 0..W {
            for i in 0..BLOCK {
                lanes[w][i] += u16::from(block[i] < starts[w]);
                hit |= u8::from(block[i].wrapping_sub(starts[w]) <= spans[w]);
            }
        }
        if hit != 0 {
            for &v in block {
                plan.add(hist, v.bin());
            }
        }
    }
    for &v in blocks.remainder() {
        plan.count_one(v.bin(), below, hist);
    }
    for w in 0..W {
        below[w] += lanes[w].iter().map(|&c| u64::from(c)).sum::<u64>();
    }
}

/// The counting loop for u16 with AVX2: 16 pixels per step, and a bit mask
/// of the in-window pixels so that only those are handled one by one.
#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx2")]
unsafe fn count_u16_avx2<const W: usize>(plan: &Plan<W>, chunk: &[u16], below: &mut [u64; W], hist: &mut [u32]) {
    use std::arch::x86_64::*;
    // Unsigned "v < start" as a signed compare of both sides with the sign bit flipped.
    let sign = _mm256_set1_epi16(i16::MIN);
    let zero = _mm256_setzero_si256();
    let start = plan.starts.map(|s| _mm256_set1_epi16(s as u16 as i16));
    let start_signed = start.map(|s| _mm256_xor_si256(s, sign));
    let span = plan.spans.map(|s| _mm256_set1_epi16(s as u16 as i16));
    // Lane counts of pixels below each window: at most TASK / 16 per lane.
    let mut lanes = [zero; W];
    let mut blocks = chunk.chunks_exact(16);
    for block in &mut blocks {
        // SAFETY: `block` holds 16 u16 (32 bytes); unaligned load.
        let v = unsafe { _mm256_loadu_si256(block.as_ptr().cast()) };
        let v_signed = _mm256_xor_si256(v, sign);
        let mut inside = zero;
        for w in 0..W {
            lanes[w] = _mm256_sub_epi16(lanes[w], _mm256_cmpgt_epi16(start_signed[w], v_signed));
            // v - start <= span (unsigned) ⇔ the saturating difference to span is 0.
            let past = _mm256_subs_epu16(_mm256_sub_epi16(v, start[w]), span[w]);
            inside = _mm256_or_si256(inside, _mm256_cmpeq_epi16(past, zero));
        }
        // Two mask bits per pixel.
        let mut mask = _mm256_movemask_epi8(inside) as u32;
        while mask != 0 {
            let i = (mask.trailing_zeros() / 2) as usize;
            plan.add(hist, usize::from(block[i]));
            mask &= !(3u32 << (2 * i));
        }
    }
    for &v in blocks.remainder() {
        plan.count_one(usize::from(v), below, hist);
    }
    for w in 0..W {
        let mut counts = [0u16; 16];
        // SAFETY: `counts` is 32 bytes; unaligned store.
        unsafe { _mm256_storeu_si256(counts.as_mut_ptr().cast(), lanes[w]) };
        below[w] += counts.iter().map(|&c| u64::from(c)).sum::<u64>();
    }
}

/// The counting loop for u16 with AVX-512: 32 pixels per step. Each window's
/// in-window pixels are compressed to the front of a vector and appended to a
/// small buffer as offsets into the window, and the buffer is histogrammed
/// when it fills: no branch depends on the pixel values.
#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx512f,avx512bw,avx512vbmi2,popcnt")]
unsafe fn count_u16_avx512<const W: usize>(plan: &Plan<W>, chunk: &[u16], below: &mut [u64; W], hist: &mut [u32]) {
    use std::arch::x86_64::*;
    /// Offsets a buffer holds before it is histogrammed (plus room for one more vector).
    const CAP: usize = 1024;
    let flush = |hist: &mut [u32], offsets: &[u16], w: usize| {
        for &d in offsets {
            if let Some(c) = hist.get_mut(plan.offsets[w] + usize::from(d)) {
                *c += 1;
            }
        }
    };
    let start = plan.starts.map(|s| _mm512_set1_epi16(s as u16 as i16));
    let span = plan.spans.map(|s| _mm512_set1_epi16(s as u16 as i16));
    let one = _mm512_set1_epi16(1);
    // Lane counts of pixels below each window: at most TASK / 32 per lane.
    let mut lanes = [_mm512_setzero_si512(); W];
    let mut buffers = [[0u16; CAP + 32]; W];
    let mut filled = [0usize; W];
    let mut blocks = chunk.chunks_exact(32);
    for block in &mut blocks {
        // SAFETY: `block` holds 32 u16 (64 bytes); unaligned load.
        let v = unsafe { _mm512_loadu_si512(block.as_ptr().cast()) };
        for w in 0..W {
            let below_mask = _mm512_cmplt_epu16_mask(v, start[w]);
            lanes[w] = _mm512_mask_add_epi16(lanes[w], below_mask, lanes[w], one);
            let offsets = _mm512_sub_epi16(v, start[w]);
            let inside = _mm512_cmple_epu16_mask(offsets, span[w]);
            let packed = _mm512_maskz_compress_epi16(inside, offsets);
            // SAFETY: `filled[w] <= CAP` here, and the buffer has CAP + 32 slots.
            unsafe { _mm512_storeu_si512(buffers[w].as_mut_ptr().add(filled[w]).cast(), packed) };
            filled[w] += inside.count_ones() as usize;
            if filled[w] > CAP {
                flush(hist, &buffers[w][..filled[w]], w);
                filled[w] = 0;
            }
        }
    }
    for w in 0..W {
        flush(hist, &buffers[w][..filled[w]], w);
    }
    for &v in blocks.remainder() {
        plan.count_one(usize::from(v), below, hist);
    }
    for w in 0..W {
        let mut counts = [0u16; 32];
        // SAFETY: `counts` is 64 bytes; unaligned store.
        unsafe { _mm512_storeu_si512(counts.as_mut_ptr().cast(), lanes[w]) };
        below[w] += counts.iter().map(|&c| u64::from(c)).sum::<u64>();
    }
}

#[cfg(test)]
mod tests {
    use hcsflow_testkit::random_values as values;

    use super::super::{order_statistics_by_histogram, percentile_rank_list};
    use super::*;

    /// A camera-like plane: a dark background with shot noise, brighter blobs.
    fn camera(h: usize, w: usize, seed: u64) -> Vec<u16> {
        let noise = values(h * w, seed, |r| (r % 401) as u16);
        (0..h * w)
            .map(|i| {
                let (y, x) = ((i / w) as f32, (i % w) as f32);
                let blob = ((y * 0.05).sin() * (x * 0.043).cos()).max(0.0).powi(3);
                180 + noise[i] + (3800.0 * blob) as u16
            })
            .collect()
    }

    fn ranks_for(n: usize, ps: &[f64]) -> Vec<u64> {
        percentile_rank_list(n as u64, ps)
    }

    #[test]
    fn windows_give_the_histogram_answer() {
        let n = MIN_LEN + 12_345; // not a multiple of the block or task size
        let cases: Vec<(&str, Vec<u16>)> = vec![
            ("camera", camera(613, n / 613 + 1, 7)),
            ("full range", values(n, 11, |r| r as u16)),
            ("narrow", values(n, 13, |r| 1000 + (r % 300) as u16)),
            ("saturated top", values(n, 17, |r| if r % 50 == 0 { u16::MAX } else { (r % 5000) as u16 })),
        ];
        let percentile_sets: [&[f64]; 4] = [&[1.0, 99.0], &[0.0, 100.0], &[0.1, 50.0, 99.9], &[5.0, 95.0]];
        for (name, data) in &cases {
            for ps in percentile_sets {
                let ranks = ranks_for(data.len(), ps);
                let want = order_statistics_by_histogram(data.as_slice(), &ranks);
                match select(data.as_slice(), &ranks) {
                    Some(got) => assert_eq!(Some(got), want, "{name} {ps:?}"),
                    // Only where the windows would hold too many pixels: here, a
                    // median next to the 2 % of saturated pixels.
                    None => assert_eq!((*name, ps), ("saturated top", &[0.1, 50.0, 99.9][..]), "the windows should apply"),
                }
            }
        }
    }

    #[test]
    fn a_misleading_sample_falls_back_and_the_answer_stays_exact() {
        // Every pixel the stride sample reads is 0, every other pixel 60000:
        // the sample puts the median at 0, the data at 60000.
        let n = MIN_LEN * 2;
        let stride = (n / SAMPLE).max(1) | 1;
        let data: Vec<u16> = (0..n).map(|i| if i % stride == 0 { 0 } else { 60_000 }).collect();
        let ranks = ranks_for(n, &[50.0]);
        assert_eq!(select(&data, &ranks), None);
        assert_eq!(super::super::order_statistics_int(&data, &ranks), Some(vec![60_000, 60_000]));
    }

    #[test]
    fn few_distinct_values_and_small_inputs_take_the_histogram() {
        // A constant image puts every pixel inside the window.
        let constant = vec![77u16; MIN_LEN];
        assert_eq!(select(&constant, &ranks_for(MIN_LEN, &[1.0, 99.0])), None);
        let small = values(MIN_LEN - 1, 3, |r| r as u16);
        assert_eq!(select(&small, &ranks_for(small.len(), &[1.0, 99.0])), None);
        // No ranks asked: nothing to count.
        assert_eq!(select(&values(MIN_LEN, 3, |r| r as u16), &[]), Some(Vec::new()));
    }

    #[test]
    fn u8_data_takes_the_portable_loop() {
        let n = MIN_LEN + 77;
        let data: Vec<u8> = values(n, 5, |r| (r % 256) as u16).into_iter().map(|v| v as u8).collect();
        // Uniform u8: a 1 % window is a few values, each 0.4 % of the pixels.
        let ranks = ranks_for(n, &[0.5]);
        let want = order_statistics_by_histogram(&data, &ranks);
        assert_eq!(select(&data, &ranks), want);
        assert!(select(&data, &ranks).is_some());
    }

    /// Every counting loop against one pixel at a time, for `W` windows.
    fn loops_agree<const W: usize>(data: &[u16], windows: &[(usize, usize)]) {
        let mut plan = Plan { starts: [0; W], spans: [0; W], offsets: [0; W] };
        let mut offset = 0;
        for (i, &(s, span)) in windows.iter().take(W).enumerate() {
            (plan.starts[i], plan.spans[i], plan.offsets[i]) = (s, span, offset);
            offset += span + 1;
        }
        let (mut below_want, mut hist_want) = ([0u64; W], vec![0u32; offset]);
        for &v in data {
            let v = usize::from(v);
            for w in 0..W {
                below_want[w] += u64::from(v < plan.starts[w]);
                if (plan.starts[w]..=plan.starts[w] + plan.spans[w]).contains(&v) {
                    hist_want[plan.offsets[w] + v - plan.starts[w]] += 1;
                }
            }
        }
        let mut runs: Vec<(&str, [u64; W], Vec<u32>)> = Vec::new();
        let (mut below, mut hist) = ([0u64; W], vec![0u32; offset]);
        count_task(&plan, data, &mut below, &mut hist);
        runs.push(("the CPU's loop", below, hist));
        let (mut below, mut hist) = ([0u64; W], vec![0u32; offset]);
        count_portable(&plan, data, &mut below, &mut hist);
        runs.push(("portable loop", below, hist));
        // The AVX2 loop too, which count_task passes over on CPUs with AVX-512.
        #[cfg(target_arch = "x86_64")]
        if std::arch::is_x86_feature_detected!("avx2") {
            let (mut below, mut hist) = ([0u64; W], vec![0u32; offset]);
            // SAFETY: the CPU supports AVX2, checked just above.
            unsafe { count_u16_avx2(&plan, data, &mut below, &mut hist) };
            runs.push(("AVX2 loop", below, hist));
        }
        for (name, below, hist) in runs {
            assert_eq!((below, &hist), (below_want, &hist_want), "{name}, {W} windows");
        }
    }

    #[test]
    fn vector_and_portable_loops_count_alike() {
        let data = camera(256, 256, 9);
        // A length that is no multiple of the vector widths, so the remainders count too.
        let data = &data[..TASK - 5];
        let windows = [(150usize, 40usize), (191, 0), (2000, 900), (65_000, 535)];
        loops_agree::<1>(data, &windows);
        loops_agree::<2>(data, &windows);
        loops_agree::<3>(data, &windows);
        loops_agree::<4>(data, &windows);
    }

    #[test]
    fn bins_of_ranks_walks_like_bin_of_rank() {
        let hist: Vec<u32> = (0..300u32).map(|i| (i * 7919) % 13).collect();
        let cdf = cumulative(&hist.iter().map(|&c| u64::from(c)).collect::<Vec<_>>());
        let total = *cdf.last().unwrap_or(&0);
        let ranks = [total - 1, 0, 5, total / 2, 5, u64::MAX, total];
        let want: Vec<usize> = ranks.iter().map(|&k| bin_of_rank(&cdf, k).unwrap_or(hist.len() - 1)).collect();
        assert_eq!(bins_of_ranks(&hist, &ranks), want);
    }
}
