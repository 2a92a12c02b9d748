//! Colocalisation of two channels, per image and per object: Pearson's
//! correlation, Manders' coefficients M1/M2 with thresholds, Manders' overlap
//! coefficient and the intersection coefficients.
//!
//! Each value is scikit-image 0.26 `skimage.measure`'s counterpart on the
//! pixels of a region (the whole image, or one object of a label image), in
//! f64. With A and B the two channels, `tA`, `tB` their thresholds:
//! - `Correlation_Correlation`: `pearson_corr_coeff(A, B, mask)[0]` —
//!   Σ(A − Ā)(B − B̄) / √(Σ(A − Ā)² Σ(B − B̄)²); NaN when either channel is
//!   constant over the region (scipy returns NaN there too) or the region has
//!   fewer than 2 pixels. The p-value is not computed.
//! - `Correlation_Manders_M1`: `manders_coloc_coeff(A, B > tB, mask)` — the
//!   fraction of A's intensity where B is above its threshold, `Σ A·[B > tB] / ΣA`
//!   (0 when ΣA = 0); `Correlation_Manders_M2` the same with A and B swapped.
//! - `Correlation_Overlap`: `manders_overlap_coeff(A, B, mask)` —
//!   ΣAB / √(ΣA² ΣB²) (NaN when either channel is 0 over the region, as numpy's 0/0).
//! - `Correlation_Intersection_AB`: `intersection_coeff(A > tA, B > tB, mask)` —
//!   the fraction of A's above-threshold pixels where B is above its threshold
//!   (0 when A has none); `Correlation_Intersection_BA` the reverse.
//!
//! u8/u16 planes are summed exactly in integers (in parallel, so the result
//! does not depend on the thread count) and Pearson's terms formed exactly;
//! f32 planes in f64, sequentially, Pearson's about a shift.
//!
//! Manders' coefficients and the overlap need non-negative intensities:
//! a negative pixel in a measured region is an error, as in skimage.
//! The column names follow CellProfiler's MeasureColocalization
//! (`Correlation_Correlation_A_B`, `Correlation_Manders_A_B`, …) without the
//! channel names, which a function does not know: A is the stack's first plane,
//! B its second.

use hcsflow_core::{
    with_pixels, ArgProblem, ArtifactDecl, Cell, Contract, FunctionDecl, FunctionError, Pixel, Registry, Stack, StackShape, Table,
};

use hcsflow_core::DType;
use rayon::prelude::*;

use crate::threshold::{threshold_value, ThresholdMethod};

/// The colocalisation of two channels over one region.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct Colocalization {
    /// The object's label, 0 for the whole image.
    pub label: u32,
    /// Pixels in the region.
    pub pixels: u64,
    pub pearson: f64,
    pub manders_m1: f64,
    pub manders_m2: f64,
    pub overlap: f64,
    pub intersection_ab: f64,
    pub intersection_ba: f64,
}

/// Sums over one region; the Pearson terms are accumulated about a shift (the
/// region's first pixel) so that large offsets do not cancel catastrophically.
#[derive(Clone, Copy, Default)]
struct Sums {
    n: u64,
    shift: Option<(f64, f64)>,
    sa: f64,
    sb: f64,
    saa: f64,
    sbb: f64,
    sab: f64,
    // raw (unshifted) sums for Manders and overlap
    ra: f64,
    rb: f64,
    raa: f64,
    rbb: f64,
    rab: f64,
    a_where_b: f64,
    b_where_a: f64,
    above_a: u64,
    above_b: u64,
    above_both: u64,
    negative: bool,
}

impl Sums {
    #[inline]
    fn add(&mut self, a: f64, b: f64, ta: f64, tb: f64) {
        let (ka, kb) = *self.shift.get_or_insert((a, b));
        let (da, db) = (a - ka, b - kb);
        self.n += 1;
        self.sa += da;
        self.sb += db;
        self.saa += da * da;
        self.sbb += db * db;
        self.sab += da * db;
        self.ra += a;
        self.rb += b;
        self.raa += a * a;
        self.rbb += b * b;
        self.rab += a * b;
        let (pa, pb) = (a > ta, b > tb);
        if pb {
            self.a_where_b += a;
        }
        if pa {
            self.b_where_a += b;
        }
        self.above_a += u64::from(pa);
        self.above_b += u64::from(pb);
        self.above_both += u64::from(pa && pb);
        self.negative |= a < 0.0 || b < 0.0;
    }

    fn finish(&self, label: u32) -> Colocalization {
        let n = self.n as f64;
        let cov = self.sab - self.sa * self.sb / n;
        let va = self.saa - self.sa * self.sa / n;
        let vb = self.sbb - self.sb * self.sb / n;
        let pearson = if self.n < 2 || va <= 0.0 || vb <= 0.0 { f64::NAN } else { (cov / (va * vb).sqrt()).clamp(-1.0, 1.0) };
        let frac = |num: f64, den: f64| if den == 0.0 { 0.0 } else { num / den };
        Colocalization {
            label,
            pixels: self.n,
            pearson,
            manders_m1: frac(self.a_where_b, self.ra),
            manders_m2: frac(self.b_where_a, self.rb),
            overlap: self.rab / (self.raa * self.rbb).sqrt(),
            intersection_ab: frac(self.above_both as f64, self.above_a as f64),
            intersection_ba: frac(self.above_both as f64, self.above_b as f64),
        }
    }
}

/// Exact sums over one region of an integer (u8/u16) image pair: every sum
/// fits a u64 for planes below 2³² pixels, so they merge across threads in any
/// order with the same result, and Pearson's terms are formed exactly in i128.
#[derive(Clone, Copy, Default)]
struct IntSums {
    n: u64,
    sa: u64,
    sb: u64,
    saa: u64,
    sbb: u64,
    sab: u64,
    a_where_b: u64,
    b_where_a: u64,
    above_a: u64,
    above_b: u64,
    above_both: u64,
}

impl IntSums {
    #[inline]
    fn add(&mut self, a: u64, b: u64, pa: bool, pb: bool) {
        self.n += 1;
        self.sa += a;
        self.sb += b;
        self.saa += a * a;
        self.sbb += b * b;
        self.sab += a * b;
        self.a_where_b += a * u64::from(pb);
        self.b_where_a += b * u64::from(pa);
        self.above_a += u64::from(pa);
        self.above_b += u64::from(pb);
        self.above_both += u64::from(pa & pb);
    }

    fn merge(&mut self, o: &IntSums) {
        self.n += o.n;
        self.sa += o.sa;
        self.sb += o.sb;
        self.saa += o.saa;
        self.sbb += o.sbb;
        self.sab += o.sab;
        self.a_where_b += o.a_where_b;
        self.b_where_a += o.b_where_a;
        self.above_a += o.above_a;
        self.above_b += o.above_b;
        self.above_both += o.above_both;
    }

    fn finish(&self, label: u32) -> Colocalization {
        let (n, sa, sb) = (i128::from(self.n), i128::from(self.sa), i128::from(self.sb));
        // n² × covariance and variances, exact.
        let cov = n * i128::from(self.sab) - sa * sb;
        let va = n * i128::from(self.saa) - sa * sa;
        let vb = n * i128::from(self.sbb) - sb * sb;
        let pearson = if self.n < 2 || va <= 0 || vb <= 0 {
            f64::NAN
        } else {
            (cov as f64 / ((va as f64).sqrt() * (vb as f64).sqrt())).clamp(-1.0, 1.0)
        };
        let frac = |num: u64, den: u64| if den == 0 { 0.0 } else { num as f64 / den as f64 };
        Colocalization {
            label,
            pixels: self.n,
            pearson,
            manders_m1: frac(self.a_where_b, self.sa),
            manders_m2: frac(self.b_where_a, self.sb),
            overlap: self.sab as f64 / ((self.saa as f64).sqrt() * (self.sbb as f64).sqrt()),
            intersection_ab: frac(self.above_both, self.above_a),
            intersection_ba: frac(self.above_both, self.above_b),
        }
    }
}

/// The smallest integer pixel value greater than `t` (`u64::MAX`, above
/// every pixel, when `t` is NaN or beyond any pixel value).
fn smallest_above(t: f64) -> u64 {
    if t < 0.0 {
        0
    } else if t < 4_294_967_296.0 {
        t.floor() as u64 + 1
    } else {
        u64::MAX
    }
}

/// Pixels converted per batch by [`colocalization_int`] (a batch's sums of
/// products of u16 values fit a u64 many times over).
const COLOC_BATCH: usize = 1024;

/// Adds `x`, `y` (integer pixel values below 2³²) to `s`: the sums of one
/// batch in local accumulators, a loop the compiler vectorises (u32 × u32 →
/// u64 products).
#[inline]
fn add_batch(s: &mut IntSums, x: &[u32], y: &[u32], above_a: u64, above_b: u64) {
    // The same loop compiled for wider vectors where the CPU has them: the
    // products are u32 × u32 → u64 (four lanes with AVX2, eight with AVX-512
    // DQ's 64-bit multiply); baseline x86-64 has two.
    #[cfg(target_arch = "x86_64")]
    {
        if std::arch::is_x86_feature_detected!("avx512f") && std::arch::is_x86_feature_detected!("avx512dq") {
            // SAFETY: the CPU supports AVX-512 F and DQ, checked just above.
            return unsafe { add_batch_avx512(s, x, y, above_a, above_b) };
        }
        if std::arch::is_x86_feature_detected!("avx2") {
            // SAFETY: the CPU supports AVX2, checked just above.
            return unsafe { add_batch_avx2(s, x, y, above_a, above_b) };
        }
    }
    add_batch_impl(s, x, y, above_a, above_b)
}

#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx512f,avx512dq")]
fn add_batch_avx512(s: &mut IntSums, x: &[u32], y: &[u32], above_a: u64, above_b: u64) {
    add_batch_impl(s, x, y, above_a, above_b)
}

#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx2")]
fn add_batch_avx2(s: &mut IntSums, x: &[u32], y: &[u32], above_a: u64, above_b: u64) {
    add_batch_impl(s, x, y, above_a, above_b)
}

#[inline(always)]
fn add_batch_impl(s: &mut IntSums, x: &[u32], y: &[u32], above_a: u64, above_b: u64) {
    let (mut sa, mut sb, mut saa, mut sbb, mut sab) = (0u64, 0u64, 0u64, 0u64, 0u64);
    let (mut awb, mut bwa, mut na, mut nb, mut nab) = (0u64, 0u64, 0u64, 0u64, 0u64);
    for (&x, &y) in x.iter().zip(y) {
        let (x, y) = (u64::from(x), u64::from(y));
        let (pa, pb) = (u64::from(x >= above_a), u64::from(y >= above_b));
        sa += x;
        sb += y;
        saa += x * x;
        sbb += y * y;
        sab += x * y;
        awb += x * pb;
        bwa += y * pa;
        na += pa;
        nb += pb;
        nab += pa & pb;
    }
    s.n += x.len() as u64;
    s.sa += sa;
    s.sb += sb;
    s.saa += saa;
    s.sbb += sbb;
    s.sab += sab;
    s.a_where_b += awb;
    s.b_where_a += bwa;
    s.above_a += na;
    s.above_b += nb;
    s.above_both += nab;
}

/// [`colocalization`] of integer planes: exact sums over blocks of pixels in
/// parallel (with labels, one block per thread, each with its per-object sums).
fn colocalization_int<T: Pixel>(a: &[T], b: &[T], labels: Option<&[u32]>, max_label: u32, ta: f64, tb: f64) -> Vec<Colocalization> {
    let n_obj = if labels.is_some() { max_label as usize + 1 } else { 0 };
    let threads = rayon::current_num_threads().clamp(1, 8);
    let block = if labels.is_some() { a.len().div_ceil(threads) } else { 1 << 18 }.max(1);
    let (above_a, above_b) = (smallest_above(ta), smallest_above(tb));
    let partial: Vec<(IntSums, Vec<IntSums>)> = a
        .par_chunks(block)
        .zip(b.par_chunks(block))
        .enumerate()
        .map(|(k, (ca, cb))| {
            let mut image = IntSums::default();
            let mut objects = vec![IntSums::default(); n_obj];
            let (mut xa, mut xb) = ([0u32; COLOC_BATCH], [0u32; COLOC_BATCH]);
            for (i, (ba, bb)) in ca.chunks(COLOC_BATCH).zip(cb.chunks(COLOC_BATCH)).enumerate() {
                let n = ba.len();
                // u8/u16 values are exact in f32 and in u32.
                xa[..n].iter_mut().zip(ba).for_each(|(o, v)| *o = v.to_f32() as u32);
                xb[..n].iter_mut().zip(bb).for_each(|(o, v)| *o = v.to_f32() as u32);
                add_batch(&mut image, &xa[..n], &xb[..n], above_a, above_b);
                if let Some(l) = labels {
                    let start = k * block + i * COLOC_BATCH;
                    for ((&x, &y), &l) in xa[..n].iter().zip(&xb[..n]).zip(&l[start..start + n]) {
                        if l != 0 {
                            let (x, y) = (u64::from(x), u64::from(y));
                            objects[l as usize].add(x, y, x >= above_a, y >= above_b);
                        }
                    }
                }
            }
            (image, objects)
        })
        .collect();
    let mut image = IntSums::default();
    let mut objects = vec![IntSums::default(); n_obj];
    for (im, obj) in &partial {
        image.merge(im);
        objects.iter_mut().zip(obj).for_each(|(o, p)| o.merge(p));
    }
    let mut out = vec![image.finish(0)];
    out.extend(objects.iter().enumerate().skip(1).filter(|(_, s)| s.n > 0).map(|(l, s)| s.finish(l as u32)));
    out
}

/// Colocalisation of planes `a` and `b` (`h × w` pixels each, row-major) over
/// the whole image (first row, label 0) and, when `labels` is given, over each
/// object (one row per label present, in label order), with thresholds `ta`,
/// `tb` (pixel units; a pixel is above when its value is greater). See the
/// module docs for the definitions. Errors: sizes that differ, NaN, a negative
/// intensity.
pub fn colocalization<T: Pixel>(a: &[T], b: &[T], labels: Option<&[u32]>, ta: f64, tb: f64) -> Result<Vec<Colocalization>, FunctionError> {
    const NAME: &str = "colocalization";
    if a.len() != b.len() || labels.is_some_and(|l| l.len() != a.len()) {
        return Err(FunctionError::invalid(NAME, "the two channels (and the label image) must have the same size"));
    }
    // Integer pixels: exact sums in parallel (u16² × 2³² pixels fits a u64), per-object
    // sums kept per thread, so only for label counts that keep that small.
    let max_label = labels.map_or(0, |l| l.iter().copied().max().unwrap_or(0));
    if T::DTYPE != DType::F32 && a.len() < (1 << 32) && max_label <= 1 << 16 {
        return Ok(colocalization_int(a, b, labels, max_label, ta, tb));
    }
    let max = max_label as usize;
    let mut image = Sums::default();
    let mut objects = vec![Sums::default(); if labels.is_some() { max + 1 } else { 0 }];
    for (i, (&va, &vb)) in a.iter().zip(b).enumerate() {
        let (x, y) = (f64::from(va.to_f32()), f64::from(vb.to_f32()));
        if x.is_nan() || y.is_nan() {
            return Err(FunctionError::invalid(NAME, "the image contains NaN"));
        }
        image.add(x, y, ta, tb);
        if let Some(l) = labels {
            let l = l[i] as usize;
            if l != 0 {
                objects[l].add(x, y, ta, tb);
            }
        }
    }
    if image.negative {
        return Err(FunctionError::invalid(NAME, "an intensity is negative (Manders' coefficients need intensities >= 0)"));
    }
    let mut out = vec![image.finish(0)];
    out.extend(objects.iter().enumerate().skip(1).filter(|(_, s)| s.n > 0).map(|(l, s)| s.finish(l as u32)));
    Ok(out)
}

/// The column names of the `colocalization` table (after the plane column the table adds).
pub const COLOC_COLUMNS: [&str; 11] = [
    "ObjectNumber",
    "Pixels",
    "Threshold_A",
    "Threshold_B",
    "Correlation_Correlation",
    "Correlation_Manders_M1",
    "Correlation_Manders_M2",
    "Correlation_Overlap",
    "Correlation_Intersection_AB",
    "Correlation_Intersection_BA",
    "Region",
];

hcsflow_core::function_args! {
    /// The arguments of [`COLOCALIZATION`].
    pub struct ColocalizationArgs {
        threshold_method: String = choice("otsu", &["otsu", "li", "manual"], "how each channel's threshold for Manders' M1/M2 and the intersection is chosen (per image)"),
        threshold_a: f64 = float(0.0, None, None, "channel A's threshold for threshold_method=manual (pixel units)"),
        threshold_b: f64 = float(0.0, None, None, "channel B's threshold for threshold_method=manual (pixel units)"),
    }
}

/// The artifact the function produces.
pub const COLOC_TABLE: &str = "colocalization";

fn check_coloc(_: &ColocalizationArgs, shape: &StackShape) -> Result<(), ArgProblem> {
    if !(2..=3).contains(&shape.depth) {
        return Err(ArgProblem::input(
            format!("needs 2 planes (channels A and B) or 3 (A, B and a label image), but the stack has {}", shape.depth),
            "make the step's stacks hold the two channels, e.g. variable_components = [\"channel\"] and group_by = \"none\"",
        ));
    }
    Ok(())
}

pub static COLOCALIZATION: FunctionDecl<ColocalizationArgs> = FunctionDecl::new(
    "colocalization",
    Contract::Pure3d,
    "Colocalisation of plane 0 (A) and plane 1 (B) per image and, with a label image as plane 2, per object: Pearson, Manders M1/M2 (thresholded), overlap, intersection (skimage.measure); returns its input unchanged.",
)
.with_produces(&[ArtifactDecl::table(
    COLOC_TABLE,
    "one row for the image (ObjectNumber 0) and one per object: Correlation_Correlation, _Manders_M1, _Manders_M2, _Overlap, _Intersection_AB/_BA and the thresholds used",
)])
.with_check(check_coloc);

/// Runs [`colocalization`] on a 2- or 3-plane stack (A, B, optional labels):
/// thresholds from `method` computed on each whole channel plane; the table.
pub fn colocalization_stack(stack: &Stack, method_a: ThresholdMethod, method_b: ThresholdMethod) -> Result<Table, FunctionError> {
    const NAME: &str = "colocalization";
    let [n, _, _] = stack.shape();
    if !(2..=3).contains(&n) {
        return Err(FunctionError::invalid(NAME, format!("needs 2 or 3 planes, got {n}")));
    }
    let rows = with_pixels!(Stack, stack, arr, T => {
        let (a, b) = (arr.plane(0), arr.plane(1));
        let labels: Option<Vec<u32>> = (n == 3).then(|| arr.plane(2).iter().map(|v| v.to_f32().max(0.0) as u32).collect());
        let ta = threshold_value(a, method_a)?;
        let tb = threshold_value(b, method_b)?;
        (ta, tb, colocalization(a, b, labels.as_deref(), ta, tb)?)
    });
    let (ta, tb, rows) = rows;
    let mut t = Table::new(COLOC_COLUMNS);
    for r in rows {
        t.push(
            None,
            vec![
                Cell::from(r.label),
                Cell::Int(r.pixels as i64),
                Cell::from(ta),
                Cell::from(tb),
                Cell::from(r.pearson),
                Cell::from(r.manders_m1),
                Cell::from(r.manders_m2),
                Cell::from(r.overlap),
                Cell::from(r.intersection_ab),
                Cell::from(r.intersection_ba),
                Cell::Text(if r.label == 0 { "image" } else { "object" }.into()),
            ],
        )
        .map_err(|e| FunctionError::failed(NAME, e))?;
    }
    Ok(t)
}

pub(crate) fn register(registry: &mut Registry) {
    registry.add(COLOCALIZATION.host(|s, a, ctx| {
        let method = |v: f64| {
            ThresholdMethod::from_args(&a.threshold_method, v)
                .ok_or_else(|| FunctionError::failed("colocalization", format!("unknown threshold_method '{}'", a.threshold_method)))
        };
        let table = colocalization_stack(s, method(a.threshold_a)?, method(a.threshold_b)?)?;
        ctx.produce(COLOC_TABLE, table);
        Ok(s.clone())
    }));
}
