//! The image model: nuclei as Gaussian blobs in a well frame, seen through a
//! tile window at a fractional position, blurred by defocus, vignetted by the
//! flat-field, plus dark offset, Poisson and read noise.
//!
//! Tiles are rendered analytically (each blob is evaluated at the tile's pixel
//! coordinates), so a fractional tile position is exact, not interpolated, and
//! the well image never has to be held in memory. A Gaussian blurred by a
//! Gaussian is a Gaussian: defocus widens σ to √(σ² + b²) and scales the
//! amplitude by σ²/σ_b² (the blob's integral is conserved).

use crate::rng::Rng;

/// One nucleus of the ground truth, in well-frame pixels.
#[derive(Debug, Clone, PartialEq)]
pub struct Nucleus {
    pub x: f64,
    pub y: f64,
    pub radius: f64,
    /// Per channel (index 0 = channel 1): blob sigma in pixels and peak amplitude.
    pub sigma: Vec<f64>,
    pub amplitude: Vec<f64>,
}

/// Draws the nuclei of one well frame of `width` × `height` pixels.
pub fn draw_nuclei(rng: &mut Rng, width: f64, height: f64, density_per_mpx: f64, radius: (f64, f64), channels: u32) -> Vec<Nucleus> {
    let expected = density_per_mpx * width * height / 1e6;
    // Count varies a little (±10 %) around the expectation; positions uniform.
    let n = (expected * rng.range(0.9, 1.1)).round().max(0.0) as usize;
    (0..n)
        .map(|_| {
            let r = rng.range(radius.0, radius.1.max(radius.0));
            let x = rng.range(0.0, width);
            let y = rng.range(0.0, height);
            let mut sigma = Vec::new();
            let mut amplitude = Vec::new();
            for c in 0..channels {
                if c == 0 {
                    sigma.push(r / 1.6);
                    amplitude.push(rng.range(600.0, 1500.0));
                } else {
                    // other channels: a wider, dimmer "cell body"; some cells negative
                    sigma.push(r * (1.4 + 0.3 * f64::from(c - 1)) / 1.6);
                    let on = rng.uniform() >= 0.2;
                    let a = rng.range(150.0, 600.0);
                    amplitude.push(if on { a } else { 0.0 });
                }
            }
            Nucleus { x, y, radius: r, sigma, amplitude }
        })
        .collect()
}

/// Keeps the nuclei, in order, whose centre is at least `separation` × (r₁ +
/// r₂) from every nucleus kept before them (sequential hard-core thinning);
/// `separation ≤ 0` keeps all of them.
pub fn separate(nuclei: Vec<Nucleus>, separation: f64) -> Vec<Nucleus> {
    if separation <= 0.0 || nuclei.is_empty() {
        return nuclei;
    }
    // Kept nuclei bucketed on a grid of cells at least as wide as the largest reach.
    let reach = 2.0 * separation * nuclei.iter().map(|n| n.radius).fold(0.0, f64::max);
    let cell = reach.max(1.0);
    let key = |n: &Nucleus| ((n.x / cell).floor() as i64, (n.y / cell).floor() as i64);
    let mut grid: std::collections::HashMap<(i64, i64), Vec<usize>> = std::collections::HashMap::new();
    let mut kept: Vec<Nucleus> = Vec::new();
    for n in nuclei {
        let (cx, cy) = key(&n);
        let clear = (cx - 1..=cx + 1).all(|gx| {
            (cy - 1..=cy + 1).all(|gy| {
                grid.get(&(gx, gy)).is_none_or(|ids| {
                    ids.iter().all(|&i| {
                        let k = &kept[i];
                        (k.x - n.x).hypot(k.y - n.y) >= separation * (k.radius + n.radius)
                    })
                })
            })
        });
        if clear {
            grid.entry((cx, cy)).or_default().push(kept.len());
            kept.push(n);
        }
    }
    kept
}

/// Nuclei bucketed on a coarse grid for fast lookup by tile window.
pub struct NucleusIndex {
    pub nuclei: Vec<Nucleus>,
    cell: f64,
    cols: usize,
    rows: usize,
    buckets: Vec<Vec<u32>>,
}

impl NucleusIndex {
    pub fn new(nuclei: Vec<Nucleus>, width: f64, height: f64) -> NucleusIndex {
        let cell = 64.0;
        let cols = (width / cell).ceil().max(1.0) as usize;
        let rows = (height / cell).ceil().max(1.0) as usize;
        let mut buckets = vec![Vec::new(); cols * rows];
        for (i, n) in nuclei.iter().enumerate() {
            let c = ((n.x / cell) as usize).min(cols - 1);
            let r = ((n.y / cell) as usize).min(rows - 1);
            buckets[r * cols + c].push(i as u32);
        }
        NucleusIndex { nuclei, cell, cols, rows, buckets }
    }

    /// Nuclei whose centre lies in [x0, x1) × [y0, y1) (clamped to the frame).
    fn within(&self, x0: f64, y0: f64, x1: f64, y1: f64) -> impl Iterator<Item = &Nucleus> {
        let c0 = ((x0 / self.cell).floor().max(0.0) as usize).min(self.cols - 1);
        let c1 = ((x1 / self.cell).floor().max(0.0) as usize).min(self.cols - 1);
        let r0 = ((y0 / self.cell).floor().max(0.0) as usize).min(self.rows - 1);
        let r1 = ((y1 / self.cell).floor().max(0.0) as usize).min(self.rows - 1);
        (r0..=r1)
            .flat_map(move |r| (c0..=c1).map(move |c| r * self.cols + c))
            .flat_map(move |b| self.buckets[b].iter().map(move |&i| &self.nuclei[i as usize]))
    }
}

/// The known flat-field (vignetting), `size` × `size`, row-major: 1 at a
/// slightly off-centre point, falling quadratically to about 1 − strength in
/// the corners. Off-centre so that a correction that assumes symmetry fails.
pub fn flatfield(size: usize, strength: f64) -> Vec<f32> {
    let s = size as f64;
    let (cx, cy) = (0.55 * s, 0.47 * s);
    let half = s / 2.0;
    let mut out = Vec::with_capacity(size * size);
    for y in 0..size {
        for x in 0..size {
            let dx = (x as f64 - cx) / half;
            let dy = (y as f64 - cy) / half;
            out.push((1.0 - strength * (dx * dx + dy * dy) / 2.0).max(0.05) as f32);
        }
    }
    out
}

/// What to render for one tile plane.
pub struct TileSpec<'a> {
    /// True top-left corner of the tile in the well frame (fractional).
    pub x0: f64,
    pub y0: f64,
    pub width: usize,
    pub height: usize,
    /// 0-based channel index.
    pub channel: usize,
    /// Extra blur sigma from defocus, pixels.
    pub defocus: f64,
    pub background: f64,
    pub dark_offset: f64,
    pub read_noise: f64,
    pub flatfield: &'a [f32],
    pub seed: u64,
}

/// The noise-free signal (before flat-field, offset and noise).
pub fn render_signal(index: &NucleusIndex, spec: &TileSpec) -> Vec<f32> {
    let mut sig = Vec::new();
    render_signal_into(index, spec, &mut sig);
    sig
}

/// [`render_signal`] into a reused buffer (resized to width × height).
pub fn render_signal_into(index: &NucleusIndex, spec: &TileSpec, sig: &mut Vec<f32>) {
    let (w, h) = (spec.width, spec.height);
    sig.clear();
    sig.resize(w * h, spec.background as f32);
    let reach_pad = 4.0
        * (index.nuclei.iter().map(|n| n.sigma.get(spec.channel).copied().unwrap_or(0.0)).fold(0.0, f64::max).powi(2)
            + spec.defocus.powi(2))
        .sqrt();
    let (x0, y0) = (spec.x0, spec.y0);
    let (x1, y1) = (x0 + w as f64, y0 + h as f64);
    let mut gx = Vec::new();
    let mut gy = Vec::new();
    for nuc in index.within(x0 - reach_pad, y0 - reach_pad, x1 + reach_pad, y1 + reach_pad) {
        let amp0 = nuc.amplitude.get(spec.channel).copied().unwrap_or(0.0);
        let s0 = nuc.sigma.get(spec.channel).copied().unwrap_or(1.0);
        if amp0 <= 0.0 {
            continue;
        }
        let se2 = s0 * s0 + spec.defocus * spec.defocus;
        let amp = amp0 * s0 * s0 / se2;
        let reach = 4.0 * se2.sqrt();
        // pixel (i, j) of the tile sits at well coordinates (x0 + i, y0 + j)
        let i0 = ((nuc.x - reach - x0).floor().max(0.0)) as usize;
        let i1 = ((nuc.x + reach - x0).ceil().min(w as f64 - 1.0)).max(-1.0);
        let j0 = ((nuc.y - reach - y0).floor().max(0.0)) as usize;
        let j1 = ((nuc.y + reach - y0).ceil().min(h as f64 - 1.0)).max(-1.0);
        if i1 < 0.0 || j1 < 0.0 || i0 > i1 as usize || j0 > j1 as usize {
            continue;
        }
        let (i1, j1) = (i1 as usize, j1 as usize);
        let k = -0.5 / se2;
        gx.clear();
        gx.extend((i0..=i1).map(|i| {
            let d = x0 + i as f64 - nuc.x;
            (k * d * d).exp() as f32
        }));
        gy.clear();
        gy.extend((j0..=j1).map(|j| {
            let d = y0 + j as f64 - nuc.y;
            (amp * (k * d * d).exp()) as f32
        }));
        for (j, &wy) in (j0..=j1).zip(gy.iter()) {
            let row = &mut sig[j * w + i0..=j * w + i1];
            for (p, &wx) in row.iter_mut().zip(gx.iter()) {
                *p += wy * wx;
            }
        }
    }
}

/// A full tile plane as u16: flat-field × signal, Poisson, + dark offset + read noise.
pub fn render_tile(index: &NucleusIndex, spec: &TileSpec) -> Vec<u16> {
    let mut sig = Vec::new();
    let mut out = vec![0u16; spec.width * spec.height];
    render_tile_into(index, spec, &mut sig, &mut out);
    out
}

/// [`render_tile`] with reused buffers: `sig` is scratch, `out` must hold
/// width × height pixels. Per-tile allocations of several MB cost more in page
/// faults than the rendering itself on large plates.
pub fn render_tile_into(index: &NucleusIndex, spec: &TileSpec, sig: &mut Vec<f32>, out: &mut [u16]) {
    render_signal_into(index, spec, sig);
    let mut rng = Rng::new(spec.seed);
    let table = crate::rng::normal_table();
    let read2 = (spec.read_noise * spec.read_noise) as f32;
    let read = spec.read_noise as f32;
    let dark = spec.dark_offset as f32;
    let mut bits = 0u64;
    let mut left = 0u32;
    let mut normal = |rng: &mut Rng| -> f32 {
        if left == 0 {
            bits = rng.next_u64();
            left = 4;
        }
        left -= 1;
        let v = table[(bits & 0xFFFF) as usize];
        bits >>= 16;
        v
    };
    for ((&s, &f), o) in sig.iter().zip(spec.flatfield.iter()).zip(out.iter_mut()) {
        let lam = s * f;
        let v = if lam >= 30.0 {
            // Poisson(λ) + N(0, read²) ≈ N(λ, λ + read²) at these counts
            lam + (lam + read2).sqrt() * normal(&mut rng)
        } else {
            rng.poisson(f64::from(lam)) as f32 + read * normal(&mut rng)
        };
        // round half up after clamping: `as` truncates, and avoids a libm call
        *o = ((v + dark).clamp(0.0, 65535.0) + 0.5) as u16;
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn separation_drops_overlapping_nuclei_in_order() {
        let n = |x: f64, r: f64| Nucleus { x, y: 5.0, radius: r, sigma: vec![1.0], amplitude: vec![1.0] };
        // 0 and 10 touch (r 5 + 5), 13 overlaps 10 and is dropped, 30 is free.
        let kept = separate(vec![n(0.0, 5.0), n(10.0, 5.0), n(13.0, 5.0), n(30.0, 5.0)], 1.0);
        assert_eq!(kept.iter().map(|k| k.x).collect::<Vec<_>>(), vec![0.0, 10.0, 30.0]);
        assert_eq!(separate(vec![n(0.0, 5.0), n(1.0, 5.0)], 0.0).len(), 2);
    }

    fn one(x: f64, y: f64) -> NucleusIndex {
        NucleusIndex::new(vec![Nucleus { x, y, radius: 8.0, sigma: vec![4.0], amplitude: vec![1000.0] }], 200.0, 200.0)
    }

    fn spec(ff: &[f32], x0: f64, y0: f64, defocus: f64) -> TileSpec<'_> {
        TileSpec {
            x0,
            y0,
            width: 64,
            height: 64,
            channel: 0,
            defocus,
            background: 0.0,
            dark_offset: 0.0,
            read_noise: 0.0,
            flatfield: ff,
            seed: 1,
        }
    }

    #[test]
    fn blob_peak_lands_at_the_fractional_position() {
        let ff = vec![1.0; 64 * 64];
        let idx = one(100.0, 80.0);
        let s = render_signal(&idx, &spec(&ff, 70.5, 50.0, 0.0));
        let (argmax, _) = s.iter().enumerate().fold((0, f32::MIN), |a, (i, &v)| if v > a.1 { (i, v) } else { a });
        // x = 100 - 70.5 = 29.5 → pixels 29 and 30 tie; y = 30
        assert_eq!(argmax / 64, 30);
        assert!(argmax % 64 == 29 || argmax % 64 == 30);
        assert!((s[30 * 64 + 29] - s[30 * 64 + 30]).abs() < 1e-3);
    }

    #[test]
    fn defocus_lowers_the_peak_and_conserves_the_integral() {
        let ff = vec![1.0; 64 * 64];
        let idx = one(100.0, 100.0);
        let sharp = render_signal(&idx, &spec(&ff, 68.0, 68.0, 0.0));
        let blur = render_signal(&idx, &spec(&ff, 68.0, 68.0, 3.0));
        let max = |v: &[f32]| v.iter().cloned().fold(f32::MIN, f32::max);
        assert!(max(&blur) < 0.7 * max(&sharp));
        let sum = |v: &[f32]| v.iter().map(|&x| f64::from(x)).sum::<f64>();
        assert!((sum(&sharp) - sum(&blur)).abs() / sum(&sharp) < 0.01);
    }

    #[test]
    fn pixels_saturate_and_clip_instead_of_wrapping() {
        let ff = vec![1.0; 64 * 64];
        let idx = NucleusIndex::new(vec![Nucleus { x: 32.0, y: 32.0, radius: 8.0, sigma: vec![4.0], amplitude: vec![1e6] }], 64.0, 64.0);
        let mut s = spec(&ff, 0.0, 0.0, 0.0);
        s.read_noise = 50.0; // noise around 0 must clip at 0, not wrap to 65535
        let t = render_tile(&idx, &s);
        assert_eq!(t[32 * 64 + 32], 65535);
        assert_eq!(t[0], 0);
        let zeros = t.iter().filter(|&&v| v == 0).count();
        assert!(zeros > 1000, "{zeros}");
    }

    #[test]
    fn flatfield_is_one_near_centre_and_darker_in_corners() {
        let ff = flatfield(100, 0.3);
        let max = ff.iter().cloned().fold(0.0f32, f32::max);
        assert!((max - 1.0).abs() < 1e-3);
        assert!(ff[0] < 0.8 && ff[99 * 100 + 99] < 0.8);
    }
}
