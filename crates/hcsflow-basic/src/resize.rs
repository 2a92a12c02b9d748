//! Bilinear resizing as BaSiCPy 2.0 does it with `torch.nn.functional.interpolate`:
//!
//! - [`Interpolation::Antialiased`]: `mode="bilinear", align_corners=True,
//!   antialias=True`, how images go down to the working size. Separable; output
//!   index `i` is centred at `c = s·(i + ½)` input pixels with `s = (in − 1)/(out − 1)`
//!   (torch's antialiased kernel uses the align-corners scale but this centre),
//!   and averages the input pixels `j` with weights `tri((j + ½ − c)/max(s, 1))`,
//!   `tri(t) = max(0, 1 − |t|)`, normalised to sum 1 (a triangle widened by the
//!   downscaling factor: the antialiasing).
//! - [`Interpolation::AlignCorners`]: `mode="bilinear", align_corners=True`
//!   without antialiasing, how the fitted profiles go back up to the image size:
//!   output `i` samples input position `s·i` between its two neighbours.
//!
//! Weights are computed in f64 and applied in f32.

use hcsflow_core::{with_pixels, Pixel, Stack};
use rayon::prelude::*;

use crate::simd::{dispatched, Isa};

/// Which of torch's bilinear interpolations (see the module docs).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Interpolation {
    Antialiased,
    AlignCorners,
}

/// The input pixels and weights of every output pixel along one axis.
#[derive(Debug, Clone)]
struct AxisWeights {
    /// First input index of each output index.
    start: Vec<usize>,
    /// Taps per output index (the same for all; unused taps weigh 0).
    taps: usize,
    /// `start.len() × taps` weights.
    weights: Vec<f32>,
}

impl AxisWeights {
    fn new(input: usize, output: usize, mode: Interpolation) -> AxisWeights {
        let scale = if output > 1 { (input as f64 - 1.0) / (output as f64 - 1.0) } else { 0.0 };
        let per_output: Vec<(usize, Vec<f64>)> = (0..output)
            .map(|i| match mode {
                Interpolation::Antialiased => antialiased_taps(i, input, scale),
                Interpolation::AlignCorners => align_corners_taps(i, input, scale),
            })
            .collect();
        let taps = per_output.iter().map(|(_, w)| w.len()).max().unwrap_or(0);
        let mut weights = vec![0f32; output * taps];
        for (o, (_, w)) in per_output.iter().enumerate() {
            weights[o * taps..o * taps + w.len()].iter_mut().zip(w).for_each(|(d, &v)| *d = v as f32);
        }
        AxisWeights { start: per_output.iter().map(|(s, _)| *s).collect(), taps, weights }
    }

    fn of(&self, o: usize) -> (usize, &[f32]) {
        (self.start[o], &self.weights[o * self.taps..(o + 1) * self.taps])
    }
}

/// Torch's antialiased bilinear taps of output `i` (see the module docs).
fn antialiased_taps(i: usize, input: usize, scale: f64) -> (usize, Vec<f64>) {
    let support = scale.max(1.0);
    let inv = 1.0 / support;
    let center = scale * (i as f64 + 0.5);
    // Truncation towards zero, as the reference's integer conversion.
    let lo = ((center - support + 0.5).trunc().max(0.0) as usize).min(input.saturating_sub(1));
    let hi = ((center + support + 0.5).trunc().max(0.0) as usize).min(input).max(lo + 1);
    let mut w: Vec<f64> = (lo..hi).map(|j| (1.0 - ((j as f64 - center + 0.5) * inv).abs()).max(0.0)).collect();
    let total: f64 = w.iter().sum();
    if total != 0.0 {
        w.iter_mut().for_each(|v| *v /= total);
    }
    (lo, w)
}

/// Plain align-corners bilinear taps of output `i`.
fn align_corners_taps(i: usize, input: usize, scale: f64) -> (usize, Vec<f64>) {
    let position = scale * i as f64;
    let lo = (position.floor().max(0.0) as usize).min(input.saturating_sub(1));
    let lambda = (position - lo as f64).clamp(0.0, 1.0);
    if lo + 1 < input {
        (lo, vec![1.0 - lambda, lambda])
    } else {
        (lo, vec![1.0])
    }
}

/// A planned resize of `in_h × in_w` planes to `out_h × out_w`.
#[derive(Debug, Clone)]
pub struct Resampler {
    input: (usize, usize),
    output: (usize, usize),
    rows: AxisWeights,
    cols: AxisWeights,
    isa: Isa,
}

dispatched! {
    /// `dst += weight · src`, in f32.
    fn add_weighted<T: Pixel>(dst: &mut [f32], src: &[T], weight: f32) {
        dst.iter_mut().zip(src).for_each(|(d, &v)| *d += v.to_f32() * weight);
    }
}

impl Resampler {
    /// Plans a resize from `input` to `output` (`(height, width)`, all ≥ 1).
    pub fn new(input: (usize, usize), output: (usize, usize), mode: Interpolation) -> Resampler {
        Resampler {
            input,
            output,
            rows: AxisWeights::new(input.0, output.0, mode),
            cols: AxisWeights::new(input.1, output.1, mode),
            isa: Isa::detect(),
        }
    }

    /// Resizes one plane (`in_h × in_w` values, row-major) into `out`
    /// (`out_h × out_w`): rows first (each output row a weighted sum of whole
    /// input rows, which vectorises), then columns. `scratch` is reused between calls.
    pub fn resize_plane<T: Pixel>(&self, plane: &[T], out: &mut [f32], scratch: &mut Vec<f32>) {
        let ((ih, iw), (oh, ow)) = (self.input, self.output);
        debug_assert_eq!(plane.len(), ih * iw);
        debug_assert_eq!(out.len(), oh * ow);
        scratch.clear();
        scratch.resize(oh * iw, 0.0);
        for (o, dst) in scratch.chunks_exact_mut(iw.max(1)).enumerate() {
            let (start, w) = self.rows.of(o);
            for (k, &weight) in w.iter().enumerate().take(ih - start) {
                if weight == 0.0 {
                    continue;
                }
                add_weighted(self.isa, dst, &plane[(start + k) * iw..(start + k + 1) * iw], weight);
            }
        }
        for (src, dst) in scratch.chunks_exact(iw.max(1)).zip(out.chunks_exact_mut(ow.max(1))) {
            for (o, d) in dst.iter_mut().enumerate() {
                let (start, w) = self.cols.of(o);
                let taps = w.len().min(iw - start);
                *d = src[start..start + taps].iter().zip(&w[..taps]).map(|(&v, &w)| v * w).sum();
            }
        }
    }

    /// Every plane of `stack` resized, as `depth × out_h × out_w` f32 values
    /// (planes in parallel).
    pub fn resize_stack(&self, stack: &Stack) -> Vec<f32> {
        let (oh, ow) = self.output;
        let mut out = vec![0f32; stack.depth() * oh * ow];
        with_pixels!(Stack, stack, a, T => {
            out.par_chunks_mut((oh * ow).max(1)).enumerate().for_each_init(Vec::new, |scratch, (z, dst)| {
                self.resize_plane(a.plane(z), dst, scratch);
            });
        });
        out
    }
}
