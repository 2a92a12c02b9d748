//! 2-D filters applied plane by plane: Gaussian blur, unsharp mask (sharpen),
//! median, Sobel edge magnitude.
//!
//! Linear filters compute in f32 on the pixel values (no rescaling to
//! [0, 1]: scikit-image's `preserve_range=True`) and return f32; the dtype
//! policy rounds and clips back to the input dtype. The median keeps the dtype.

use hcsflow_core::{
    with_pixels, ArgProblem, Contract, FunctionDecl, FunctionError, NoArgs, Pixel, Registry, Stack, StackArray, StackShape,
};
use rayon::prelude::*;

use crate::convolve::{correlate_separable_into, Boundary, Kernel1d};

/// Runs `f(plane, h, w, dst)` on every plane (row-major slices); `f` fills
/// `dst` (`h · w` values of the one f32 result, allocated once).
fn map_planes_f32(stack: &Stack, f: impl Fn(&dyn PlaneRef, usize, usize, &mut [f32]) + Sync) -> Stack {
    let [n, h, w] = stack.shape();
    let mut out = StackArray::<f32>::zeros([n, h, w]);
    if h * w > 0 {
        with_pixels!(Stack, stack, a, T => {
            for (src, dst) in a.planes().zip(out.planes_mut()) {
                f(&Plane(src), h, w, dst);
            }
        });
    }
    Stack::from(out)
}

/// A plane of any pixel type, for the filters that take every dtype.
trait PlaneRef: Sync {
    fn correlate(&self, h: usize, w: usize, ky: &Kernel1d, kx: &Kernel1d, b: Boundary, dst: &mut [f32]);
    /// `dst[i] = x[i] + (x[i] - dst[i]) · amount`: the unsharp mask from the blur in `dst`.
    fn unsharp_from_blur(&self, dst: &mut [f32], amount: f32);
}

struct Plane<'a, T>(&'a [T]);

impl<T: Pixel> PlaneRef for Plane<'_, T> {
    fn correlate(&self, h: usize, w: usize, ky: &Kernel1d, kx: &Kernel1d, b: Boundary, dst: &mut [f32]) {
        correlate_separable_into(self.0, h, w, ky, kx, b, dst)
    }
    fn unsharp_from_blur(&self, dst: &mut [f32], amount: f32) {
        dst.par_chunks_mut(1 << 16).zip(self.0.par_chunks(1 << 16)).for_each(|(d, x)| {
            d.iter_mut().zip(x).for_each(|(b, &v)| {
                let v = v.to_f32();
                *b = v + (v - *b) * amount;
            })
        });
    }
}

/// Gaussian blur of each plane with σ per axis: scipy.ndimage.gaussian_filter
/// (`mode='reflect'`, `truncate`, radius `int(truncate·σ + 0.5)`) on the
/// pixel values as floats, Y pass then X pass. f32 output; agrees with scipy's
/// float64 result within 1e-5 of the image's value range (f32 arithmetic).
/// σ = 0 on an axis leaves that axis untouched.
pub fn gaussian_blur(stack: &Stack, sigma_y: f64, sigma_x: f64, truncate: f64) -> Stack {
    let ky = Kernel1d::gaussian(sigma_y, truncate);
    let kx = Kernel1d::gaussian(sigma_x, truncate);
    map_planes_f32(stack, |p, h, w, dst| p.correlate(h, w, &ky, &kx, Boundary::Reflect, dst))
}

/// Unsharp mask: `x + (x - gaussian(x, σ = radius)) · amount`, the blur as in
/// [`gaussian_blur`] (`mode='reflect'`, truncate 4): skimage.filters.unsharp_mask
/// with `preserve_range=True`. f32 output, not clipped (the dtype policy clips to
/// the integer range, which is what skimage's [0, 1] clip does for integer images).
pub fn unsharp_mask(stack: &Stack, radius: f64, amount: f64) -> Stack {
    let k = Kernel1d::gaussian(radius, 4.0);
    let amount = amount as f32;
    map_planes_f32(stack, |p, h, w, dst| {
        p.correlate(h, w, &k, &k, Boundary::Reflect, dst);
        p.unsharp_from_blur(dst, amount);
    })
}

/// Sobel edge magnitude `sqrt((gx² + gy²) / 2)` with skimage's kernels
/// (smoothing [1, 2, 1] / 4 across, [1, 0, -1] along, `mode='reflect'`):
/// skimage.filters.sobel on the pixel values as floats. f32 output.
pub fn sobel(stack: &Stack) -> Stack {
    let smooth = Kernel1d::new(vec![0.25, 0.5, 0.25]);
    let edge = Kernel1d::new(vec![-1.0, 0.0, 1.0]);
    map_planes_f32(stack, |p, h, w, gx| {
        p.correlate(h, w, &smooth, &edge, Boundary::Reflect, gx);
        let mut gy = vec![0f32; h * w];
        p.correlate(h, w, &edge, &smooth, Boundary::Reflect, &mut gy);
        let half = 0.5f32;
        gx.par_iter_mut().zip(gy.par_iter()).for_each(|(a, &b)| *a = ((*a * *a + b * b) * half).sqrt());
    })
}

/// Median over a `size × size` window of each plane (scipy.ndimage.median_filter,
/// `mode='reflect'`): exact, same dtype. 3×3 has a fused pass (`median3`);
/// other sizes up to [`NETWORK_MAX`] use a pruned comparator network applied
/// to runs of pixels at once ([`MedianNetwork`]); larger sizes select per pixel.
pub fn median_filter(stack: &Stack, size: usize) -> Result<Stack, FunctionError> {
    if size.is_multiple_of(2) {
        return Err(FunctionError::invalid("median_filter", format!("size must be odd, got {size}")));
    }
    let [n, h, w] = stack.shape();
    let network = (size != 3 && size <= NETWORK_MAX).then(|| MedianNetwork::new(size));
    Ok(with_pixels!(Stack, stack, a, T => {
        let mut out = StackArray::<T>::zeros([n, h, w]);
        for (data, dst) in a.planes().zip(out.planes_mut()) {
            let filtered = match &network {
                Some(net) => net.apply(data, h, w),
                None if size == 3 => median3(data, h, w),
                None => median_generic(data, h, w, size),
            };
            dst.copy_from_slice(&filtered);
        }
        Stack::from(out)
    }))
}

/// The largest window side filtered by [`MedianNetwork`].
pub const NETWORK_MAX: usize = 9;

#[inline(always)]
fn lo<T: Pixel>(a: T, b: T) -> T {
    if b < a {
        b
    } else {
        a
    }
}
#[inline(always)]
fn hi<T: Pixel>(a: T, b: T) -> T {
    if b > a {
        b
    } else {
        a
    }
}

/// One comparator of a pruned network on wires `a < b`: `a` receives the
/// minimum and `b` the maximum; pruned comparators write only the one used later.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Cmp {
    Both(usize, usize),
    Min(usize, usize),
    Max(usize, usize),
}

/// Batcher's odd–even merge sort on `n` wires (any `n`): comparators in order.
fn batcher(n: usize) -> Vec<(usize, usize)> {
    let mut ops = Vec::new();
    let mut p = 1;
    while p < n {
        let mut k = p;
        while k >= 1 {
            let mut j = k % p;
            while j + k < n {
                for i in 0..k.min(n - j - k) {
                    if (i + j) / (2 * p) == (i + j + k) / (2 * p) {
                        ops.push((i + j, i + j + k));
                    }
                }
                j += 2 * k;
            }
            k /= 2;
        }
        p *= 2;
    }
    ops
}

/// Keeps the comparators that influence the wires in `live` (updated to the
/// wires the pruned network reads), as [`Cmp`]s in order.
fn prune(ops: &[(usize, usize)], live: &mut [bool]) -> Vec<Cmp> {
    let mut kept = Vec::new();
    for &(a, b) in ops.iter().rev() {
        let op = match (live[a], live[b]) {
            (false, false) => continue,
            (true, true) => Cmp::Both(a, b),
            (true, false) => Cmp::Min(a, b),
            (false, true) => Cmp::Max(a, b),
        };
        kept.push(op);
        live[a] = true;
        live[b] = true;
    }
    kept.reverse();
    kept
}

/// Applies `op` lane-wise to the wires of `buf`, each `lanes` long.
#[inline(always)]
fn apply_cmp<T: Pixel>(buf: &mut [T], lanes: usize, op: Cmp) {
    let (a, b) = match op {
        Cmp::Both(a, b) | Cmp::Min(a, b) | Cmp::Max(a, b) => (a, b),
    };
    let (head, tail) = buf.split_at_mut(b * lanes);
    let (x, y) = (&mut head[a * lanes..][..lanes], &mut tail[..lanes]);
    match op {
        Cmp::Both(..) => x.iter_mut().zip(y.iter_mut()).for_each(|(p, q)| {
            let (l, h) = (lo(*p, *q), hi(*p, *q));
            *p = l;
            *q = h;
        }),
        Cmp::Min(..) => x.iter_mut().zip(y.iter()).for_each(|(p, &q)| *p = lo(*p, q)),
        Cmp::Max(..) => y.iter_mut().zip(x.iter()).for_each(|(q, &p)| *q = hi(p, *q)),
    }
}

/// Exact `k × k` median as a comparator network, evaluated for a run of
/// pixels at once (every comparator is a min/max over arrays, which vectorises).
///
/// 1. Each column of `k` window rows is sorted (shared by the `k` windows
///    containing that column).
/// 2. Per pixel, the `k` values of each rank across the window's `k` columns
///    are sorted: the `k × k` matrix is then sorted along rows and columns, so
///    entry `(i, j)` has at least `(i+1)(j+1) - 1` entries below it and
///    `(k-i)(k-j) - 1` above. Entries that must rank below (or above) the median
///    `m = k²/2` are dropped; the median is the `(m - #below)`-th of the
///    remaining candidates, found by sorting them.
///
/// Both networks are pruned to the comparators the median depends on.
#[derive(Debug, Clone)]
pub struct MedianNetwork {
    k: usize,
    /// On the `k` wires of a column (wire = window row).
    column: Vec<Cmp>,
    /// On `k²` wires, wire `i·k + j` = rank `i` of window column `j`.
    pixel: Vec<Cmp>,
    /// The pixel-network wires read from the sorted columns.
    inputs: Vec<usize>,
    output: usize,
}

impl MedianNetwork {
    /// The network for odd `k ≥ 1`.
    pub fn new(k: usize) -> MedianNetwork {
        let m = k * k / 2;
        let sort_k = batcher(k);
        let mut ops: Vec<(usize, usize)> = Vec::new();
        for i in 0..k {
            ops.extend(sort_k.iter().map(|&(a, b)| (i * k + a, i * k + b)));
        }
        let mut below = 0;
        let mut candidates = Vec::new();
        for i in 0..k {
            for j in 0..k {
                if k * k - (k - i) * (k - j) < m {
                    below += 1;
                } else if (i + 1) * (j + 1) - 1 <= m {
                    candidates.push(i * k + j);
                }
            }
        }
        ops.extend(batcher(candidates.len()).into_iter().map(|(a, b)| (candidates[a], candidates[b])));
        let output = candidates[m - below];
        let mut live = vec![false; k * k];
        live[output] = true;
        let pixel = prune(&ops, &mut live);
        let inputs: Vec<usize> = (0..k * k).filter(|&w| live[w]).collect();
        let mut ranks = vec![false; k];
        inputs.iter().for_each(|&w| ranks[w / k] = true);
        let column = prune(&sort_k, &mut ranks);
        MedianNetwork { k, column, pixel, inputs, output }
    }

    /// Comparators evaluated per pixel (for documentation and benchmarks).
    pub fn comparators_per_pixel(&self) -> usize {
        self.pixel.len()
    }

    /// The median-filtered `h × w` plane (`mode='reflect'`).
    pub fn apply<T: Pixel>(&self, src: &[T], h: usize, w: usize) -> Vec<T> {
        const ROWS: usize = 8;
        let mut out = vec![T::default(); h * w];
        if h == 0 || w == 0 {
            return out;
        }
        let (k, r) = (self.k, (self.k / 2) as isize);
        let padded = w + k - 1;
        let cols: Vec<usize> = (0..padded).map(|x| Boundary::Reflect.index(x as isize - r, w)).collect();
        out.par_chunks_mut(ROWS * w).enumerate().for_each(|(block, rows)| {
            let mut colbuf = vec![T::default(); k * padded];
            let mut wires = vec![T::default(); k * k * MEDIAN_LANES];
            for (dy, o) in rows.chunks_mut(w).enumerate() {
                let y = (block * ROWS + dy) as isize;
                #[cfg(target_arch = "x86_64")]
                if std::arch::is_x86_feature_detected!("avx2") {
                    // SAFETY: the CPU supports AVX2, checked just above.
                    unsafe { self.row_avx2(src, h, w, y, &cols, &mut colbuf, &mut wires, o) };
                    continue;
                }
                self.row(src, h, w, y, &cols, &mut colbuf, &mut wires, o);
            }
        });
        out
    }

    /// [`MedianNetwork::row`] compiled with AVX2 (16 u16 / 8 f32 lanes per min/max).
    #[cfg(target_arch = "x86_64")]
    #[target_feature(enable = "avx2")]
    #[allow(clippy::too_many_arguments)]
    fn row_avx2<T: Pixel>(&self, src: &[T], h: usize, w: usize, y: isize, cols: &[usize], colbuf: &mut [T], wires: &mut [T], o: &mut [T]) {
        self.row(src, h, w, y, cols, colbuf, wires, o)
    }

    /// Output row `y`: sort the window columns, then run the pixel network on
    /// runs of [`MEDIAN_LANES`] pixels.
    #[inline(always)]
    #[allow(clippy::too_many_arguments)]
    fn row<T: Pixel>(&self, src: &[T], h: usize, w: usize, y: isize, cols: &[usize], colbuf: &mut [T], wires: &mut [T], o: &mut [T]) {
        let (k, r) = (self.k, self.k / 2);
        let b = Boundary::Reflect;
        let padded = w + k - 1;
        for (d, dst) in colbuf.chunks_mut(padded).enumerate() {
            let row = &src[b.index(y + d as isize - r as isize, h) * w..][..w];
            dst[r..r + w].copy_from_slice(row);
            for x in (0..r).chain(r + w..padded) {
                dst[x] = row[cols[x]];
            }
        }
        for &op in &self.column {
            apply_cmp(colbuf, padded, op);
        }
        for x0 in (0..w).step_by(MEDIAN_LANES) {
            let n = MEDIAN_LANES.min(w - x0);
            for &wire in &self.inputs {
                let (i, j) = (wire / k, wire % k);
                wires[wire * MEDIAN_LANES..][..n].copy_from_slice(&colbuf[i * padded + x0 + j..][..n]);
            }
            for &op in &self.pixel {
                apply_cmp(wires, MEDIAN_LANES, op);
            }
            o[x0..x0 + n].copy_from_slice(&wires[self.output * MEDIAN_LANES..][..n]);
        }
    }
}

/// Pixels per run of the median pixel network (every wire holds this many).
const MEDIAN_LANES: usize = 128;

/// 3×3 median: [`MedianNetwork`] for k = 3 fused by hand into one pass over
/// registers (about 3× faster than evaluating the network wire by wire): sort
/// each column triple (rows y-1, y, y+1) into (low, mid, high), then the median
/// is med3(max of lows, med3 of mids, min of highs).
fn median3<T: Pixel>(src: &[T], h: usize, w: usize) -> Vec<T> {
    let mut out = vec![T::default(); h * w];
    if h == 0 || w == 0 {
        return out;
    }
    let b = Boundary::Reflect;
    out.par_chunks_mut(w).enumerate().for_each(|(y, o)| {
        let y = y as isize;
        let r0 = &src[b.index(y - 1, h) * w..][..w];
        let r1 = &src[b.index(y, h) * w..][..w];
        let r2 = &src[b.index(y + 1, h) * w..][..w];
        // Column-sorted triples, padded by one column each side (reflect = edge copy).
        let mut l = vec![T::default(); w + 2];
        let mut m = vec![T::default(); w + 2];
        let mut u = vec![T::default(); w + 2];
        for x in 0..w {
            let (a, bb, c) = (r0[x], r1[x], r2[x]);
            let (p, q) = (lo(a, bb), hi(a, bb));
            let (q2, r) = (lo(q, c), hi(q, c));
            let (p2, q3) = (lo(p, q2), hi(p, q2));
            l[x + 1] = p2;
            m[x + 1] = q3;
            u[x + 1] = r;
        }
        for v in [&mut l, &mut m, &mut u] {
            v[0] = v[1];
            v[w + 1] = v[w];
        }
        for x in 0..w {
            let maxlo = hi(hi(l[x], l[x + 1]), l[x + 2]);
            let minhi = lo(lo(u[x], u[x + 1]), u[x + 2]);
            let (a, bb, c) = (m[x], m[x + 1], m[x + 2]);
            let medmid = hi(lo(a, bb), lo(hi(a, bb), c));
            o[x] = hi(lo(maxlo, medmid), lo(hi(maxlo, medmid), minhi));
        }
    });
    out
}

/// Any odd size: gather the window per pixel into a reused buffer and select.
fn median_generic<T: Pixel>(src: &[T], h: usize, w: usize, size: usize) -> Vec<T> {
    let mut out = vec![T::default(); h * w];
    if h == 0 || w == 0 {
        return out;
    }
    let r = (size / 2) as isize;
    let b = Boundary::Reflect;
    let mid = size * size / 2;
    out.par_chunks_mut(w).enumerate().for_each(|(y, o)| {
        let rows: Vec<&[T]> = (-r..=r).map(|d| &src[b.index(y as isize + d, h) * w..][..w]).collect();
        let cols: Vec<Vec<usize>> = (0..w).map(|x| (-r..=r).map(|d| b.index(x as isize + d, w)).collect()).collect();
        let mut win: Vec<T> = Vec::with_capacity(size * size);
        for x in 0..w {
            win.clear();
            for row in &rows {
                win.extend(cols[x].iter().map(|&c| row[c]));
            }
            let (_, m, _) = win.select_nth_unstable_by(mid, |a, b| a.to_f32().total_cmp(&b.to_f32()));
            o[x] = *m;
        }
    });
    out
}

hcsflow_core::function_args! {
    /// The arguments of [`GAUSSIAN_BLUR`].
    pub struct GaussianBlurArgs {
        sigma: f64 = float(1.0, Some(0.0), Some(1000.0), "standard deviation in pixels (both axes)"),
        sigma_y: f64 = float(-1.0, Some(-1.0), Some(1000.0), "σ along Y (-1: use sigma)"),
        sigma_x: f64 = float(-1.0, Some(-1.0), Some(1000.0), "σ along X (-1: use sigma)"),
        truncate: f64 = float(4.0, Some(0.0), Some(100.0), "kernel radius in σ (radius = int(truncate·σ + 0.5))"),
    }
}

impl GaussianBlurArgs {
    /// σ along Y and X: each axis argument, or `sigma` where it is -1.
    pub fn axis_sigmas(&self) -> Result<(f64, f64), FunctionError> {
        let axis = |name: &str, v: f64| {
            if v == -1.0 {
                Ok(self.sigma)
            } else if v >= 0.0 {
                Ok(v)
            } else {
                Err(FunctionError::invalid("gaussian_blur", format!("{name} must be >= 0 (or -1 for sigma), got {v}")))
            }
        };
        Ok((axis("sigma_y", self.sigma_y)?, axis("sigma_x", self.sigma_x)?))
    }
}

hcsflow_core::function_args! {
    /// The arguments of [`SHARPEN`].
    pub struct SharpenArgs {
        radius: f64 = float(1.0, Some(0.0), Some(1000.0), "σ of the Gaussian blur in pixels"),
        amount: f64 = float(1.0, None, None, "strength of the added detail"),
    }
}

hcsflow_core::function_args! {
    /// The arguments of [`MEDIAN_FILTER`].
    pub struct MedianFilterArgs {
        size: i64 = int(3, Some(1), Some(99), "window side in pixels (odd)"),
    }
}

/// `median_filter`'s check: the window has a centre pixel.
fn check_median(args: &MedianFilterArgs, _: &StackShape) -> Result<(), ArgProblem> {
    let size = args.size;
    if size % 2 == 0 {
        return Err(ArgProblem::new("size", format!("size must be odd, got {size}"), format!("use {} or {}", size - 1, size + 1)));
    }
    Ok(())
}

/// `gaussian_blur`'s check: each axis σ is >= 0 or the -1 that means `sigma`
/// (the range admits the values between).
fn check_gaussian(args: &GaussianBlurArgs, _: &StackShape) -> Result<(), ArgProblem> {
    for (axis, v) in [("sigma_y", args.sigma_y), ("sigma_x", args.sigma_x)] {
        if v != -1.0 && v < 0.0 {
            return Err(ArgProblem::new(
                axis,
                format!("{axis} must be >= 0, or -1 to use sigma; got {v}"),
                format!("set {axis} = -1 (use sigma) or a σ >= 0"),
            ));
        }
    }
    Ok(())
}

pub static GAUSSIAN_BLUR: FunctionDecl<GaussianBlurArgs> = FunctionDecl::new(
    "gaussian_blur",
    Contract::Pure2d,
    "Gaussian blur per plane, σ per axis (scipy.ndimage.gaussian_filter, mode='reflect'); f32 result.",
)
.with_check(check_gaussian);

pub static SHARPEN: FunctionDecl<SharpenArgs> = FunctionDecl::new(
    "sharpen",
    Contract::Pure2d,
    "Unsharp mask x + (x - gaussian(x, radius))·amount (skimage.filters.unsharp_mask, preserve_range); f32 result.",
);

pub static MEDIAN_FILTER: FunctionDecl<MedianFilterArgs> = FunctionDecl::new(
    "median_filter",
    Contract::Pure2d,
    "Median over a size×size window per plane (scipy.ndimage.median_filter, mode='reflect'); exact, keeps the dtype.",
)
.with_check(check_median);

pub static SOBEL: FunctionDecl<NoArgs> = FunctionDecl::new(
    "sobel",
    Contract::Pure2d,
    "Sobel edge magnitude per plane (skimage.filters.sobel on the pixel values, mode='reflect'); f32 result.",
);

pub(crate) fn register(registry: &mut Registry) {
    registry.add(crate::host_all_planes(&GAUSSIAN_BLUR, |s, a| {
        let (sigma_y, sigma_x) = a.axis_sigmas()?;
        Ok(gaussian_blur(s, sigma_y, sigma_x, a.truncate))
    }));
    registry.add(crate::host_all_planes(&SHARPEN, |s, a| Ok(unsharp_mask(s, a.radius, a.amount))));
    registry.add(crate::host_all_planes(&MEDIAN_FILTER, |s, a| median_filter(s, a.size as usize)));
    registry.add(crate::host_all_planes(&SOBEL, |s, _| Ok(sobel(s))));
}
