//! Thresholds, labelling and cell counting against scikit-image / scipy.
//!
//! Tolerances: Otsu on integer images exact; Li on integer images 1e-9 relative
//! (numpy's and Rust's `log` may differ by an ulp); f32 Otsu within one of the 256
//! bins, f32 Li 1e-4 of the range. Labels: the same partition as skimage and scipy
//! (compared canonically: a bijection between label values). regionprops: area
//! exact, centroid and mean intensity 1e-9 relative. blob_log: the same
//! detections (y, x exact, σ exact) as skimage.

use crate::common;

use std::collections::HashMap;

use common::{blobs_stack, random_stack, values, Oracle, Rng};
use hcsflow_core::{DType, Stack};
use hcsflow_ops::count::{as_float_image, blob_log, count_cells, BlobLogParams, CountMethod};
use hcsflow_ops::label::{label_plane, Connectivity};
use hcsflow_ops::threshold::{threshold_li, threshold_mask, threshold_otsu, ThresholdMethod};
use ndarray::Array3;
use serde_json::json;

fn plane<T: hcsflow_core::Pixel>(a: &hcsflow_core::StackArray<T>, z: usize) -> Vec<T> {
    a.plane(z).to_vec()
}

fn thresholds_of(s: &Stack, f: &str) -> Vec<f64> {
    let n = s.depth();
    hcsflow_core::with_pixels!(Stack, s, a, T => (0..n).map(|z| {
        let p = plane(a, z);
        if f == "otsu" { threshold_otsu(&p).unwrap() } else { threshold_li(&p).unwrap() }
    }).collect())
}

#[test]
fn otsu_and_li_match_skimage() {
    let Some(mut oracle) = Oracle::tophat_focus_count() else { return };
    let mut cases = Vec::new();
    for (i, dtype) in DType::ALL.into_iter().enumerate() {
        let top = if dtype == DType::U8 { 250.0 } else { 40000.0 };
        cases.push(blobs_stack(dtype, [2, 64, 57], 20, top, 0.05, 80 + i as u64).0);
        cases.push(random_stack(dtype, [1, 31, 29], 90 + i as u64));
    }
    cases.push(Stack::from(Array3::<u16>::from_shape_fn((1, 8, 8), |(_, y, _)| if y < 4 { 100 } else { 5000 }))); // two values
    cases.push(Stack::from(Array3::from_shape_fn((1, 3, 5), |(_, y, x)| (y * 5 + x) as u8 + 7)));
    let jobs: Vec<(usize, usize)> =
        cases.iter().map(|s| (oracle.add("otsu", &[s], json!({})), oracle.add("li", &[s], json!({})))).collect();
    let refs = oracle.run();
    for (s, (jo, jl)) in cases.iter().zip(jobs) {
        let what = format!("{} {:?}", s.dtype(), s.shape());
        let (otsu, li) = (thresholds_of(s, "otsu"), thresholds_of(s, "li"));
        let range = values(s).iter().cloned().fold(0.0f64, f64::max) - values(s).iter().cloned().fold(f64::INFINITY, f64::min);
        for (k, (&o, &r)) in otsu.iter().zip(refs[jo].iter()).enumerate() {
            if s.dtype() == DType::F32 {
                assert!((o - r).abs() <= range / 256.0 * 1.0001, "{what} plane {k}: otsu {o} vs {r}");
            } else {
                assert_eq!(o, r, "{what} plane {k}: otsu");
            }
        }
        for (k, (&o, &r)) in li.iter().zip(refs[jl].iter()).enumerate() {
            let tol = if s.dtype() == DType::F32 { 1e-4 * range } else { 1e-9 * r.abs().max(1.0) };
            assert!((o - r).abs() <= tol, "{what} plane {k}: li {o} vs {r}");
        }
    }
}

#[test]
fn threshold_edge_cases() {
    let c = Stack::from(Array3::<u16>::from_elem((1, 4, 4), 42));
    assert_eq!(thresholds_of(&c, "otsu"), vec![42.0]);
    assert_eq!(thresholds_of(&c, "li"), vec![42.0]);
    let (mask, t) = threshold_mask(&c, ThresholdMethod::Otsu).unwrap();
    assert_eq!(t, vec![42.0]);
    assert_eq!(mask, Stack::from(Array3::<u8>::zeros((1, 4, 4))));
    let (mask, _) = threshold_mask(&c, ThresholdMethod::Manual(41.5)).unwrap();
    assert_eq!(mask, Stack::from(Array3::<u8>::ones((1, 4, 4))));
    assert!(threshold_otsu::<f32>(&[]).is_err());
    assert!(threshold_li(&[1.0f32, f32::NAN]).is_err());
}

/// Canonical comparison: labels equal up to a bijection of nonzero values.
fn same_partition(ours: &[f64], reference: &[f64]) -> bool {
    let mut fwd: HashMap<u64, u64> = HashMap::new();
    let mut back: HashMap<u64, u64> = HashMap::new();
    ours.iter().zip(reference).all(|(&a, &b)| {
        if (a == 0.0) != (b == 0.0) {
            return false;
        }
        let (a, b) = (a as u64, b as u64);
        *fwd.entry(a).or_insert(b) == b && *back.entry(b).or_insert(a) == a
    })
}

#[test]
fn labels_match_skimage_and_scipy() {
    let Some(mut oracle) = Oracle::tophat_focus_count() else { return };
    let mut cases = Vec::new();
    for (k, density) in [0.3, 0.5, 0.6].iter().enumerate() {
        let mut r = Rng::new(7 + k as u64);
        for &(h, w) in &[(64usize, 64usize), (37, 91), (1, 50), (50, 1)] {
            cases.push(Stack::from(Array3::from_shape_fn((1, h, w), |_| u8::from(r.unit() < *density))));
        }
    }
    cases.push(Stack::from(Array3::<u16>::zeros((1, 5, 5))));
    cases.push(Stack::from(Array3::<u16>::from_elem((1, 5, 5), 3)));
    let mut jobs = Vec::new();
    for s in &cases {
        for c in [1, 2] {
            jobs.push((
                oracle.add("label", &[s], json!({"connectivity": c})),
                oracle.add("ndi_label", &[s], json!({"connectivity": c})),
                c,
            ));
        }
    }
    let refs = oracle.run();
    let mut k = 0;
    for s in &cases {
        let [_, h, w] = s.shape();
        for _ in 0..2 {
            let (js, jn, c) = jobs[k];
            k += 1;
            let conn = if c == 1 { Connectivity::Four } else { Connectivity::Eight };
            let Stack::U8(a) = s.clone().cast(DType::U8, Default::default()) else { unreachable!() };
            let l = label_plane(&plane(&a, 0), h, w, conn);
            let ours: Vec<f64> = l.labels.iter().map(|&v| v as f64).collect();
            let sk: Vec<f64> = refs[js].iter().copied().collect();
            let nd: Vec<f64> = refs[jn].iter().copied().collect();
            assert!(same_partition(&ours, &sk), "{h}x{w} conn {c}: differs from skimage");
            assert!(same_partition(&ours, &nd), "{h}x{w} conn {c}: differs from scipy");
            assert_eq!(l.count as f64, sk.iter().cloned().fold(0.0, f64::max));
            // Raster-order numbering is the same as skimage's, not only the partition.
            assert_eq!(ours, sk, "{h}x{w} conn {c}: numbering");
        }
    }
}

#[test]
fn threshold_count_matches_regionprops() {
    let Some(mut oracle) = Oracle::tophat_focus_count() else { return };
    let (s, _) = blobs_stack(DType::U16, [1, 128, 120], 30, 30000.0, 0.02, 123);
    let t = thresholds_of(&s, "otsu")[0];
    let j = oracle.add("regionprops", &[&s], json!({"threshold": t}));
    let refs = oracle.run();
    let method =
        CountMethod::Threshold { method: ThresholdMethod::Otsu, connectivity: Connectivity::Eight, min_area: 0, max_area: u64::MAX };
    let res = count_cells(&s, &method).unwrap();
    let r = &refs[j];
    assert_eq!(res.objects.rows.len(), r.shape()[0]);
    assert_eq!(res.counts.rows[0].count, r.shape()[0]);
    for (row, k) in res.objects.rows.iter().zip(0..) {
        let rr = |c: usize| r[[k, c]];
        assert_eq!(row.label as f64, rr(0));
        assert_eq!(row.area as f64, rr(1));
        for (a, b) in [(row.y, rr(2)), (row.x, rr(3)), (row.mean_intensity, rr(4))] {
            assert!((a - b).abs() <= 1e-9 * b.abs().max(1.0), "object {k}: {a} vs {b}");
        }
    }
    // Area filter drops small objects and renumbers.
    let big = CountMethod::Threshold { method: ThresholdMethod::Otsu, connectivity: Connectivity::Eight, min_area: 30, max_area: u64::MAX };
    let res2 = count_cells(&s, &big).unwrap();
    let want = res.objects.rows.iter().filter(|r| r.area >= 30).count();
    assert_eq!(res2.counts.rows[0].count, want);
    assert!(res2.objects.rows.iter().enumerate().all(|(i, r)| r.label == i as u32 + 1 && r.area >= 30));
    assert!(res2.objects.to_csv().starts_with("image,label,y,x,area,mean_intensity,sigma\n"));
    assert_eq!(res2.counts.to_csv().lines().count(), 2);
}

#[test]
fn blob_log_same_detections_as_skimage() {
    let Some(mut oracle) = Oracle::tophat_focus_count() else { return };
    let p = BlobLogParams::default();
    let mut cases = Vec::new();
    for (i, dtype) in DType::ALL.into_iter().enumerate() {
        let top = match dtype {
            DType::U8 => 255.0,
            DType::U16 => 65535.0,
            DType::F32 => 1.0,
        };
        cases.push(blobs_stack(dtype, [1, 96, 110], 25, top, 0.05, 200 + i as u64).0);
    }
    cases.push(blobs_stack(DType::F32, [1, 200, 180], 60, 1.0, 0.1, 210).0); // crowded, noisy
    cases.push(blobs_stack(DType::F32, [1, 5, 7], 1, 1.0, 0.0, 211).0); // tiny image, kernels wider than it
                                                                        // Tall enough for the 64-row tasks of the separable correlation (several row
                                                                        // blocks and 32-column strips, an odd width), crowded as a real field.
    cases.push(blobs_stack(DType::U16, [1, 300, 263], 220, 50000.0, 0.05, 212).0);
    cases.push(Stack::from(Array3::<f32>::from_elem((1, 12, 12), 0.5))); // constant: no blobs
    let args = json!({"min_sigma": p.min_sigma, "max_sigma": p.max_sigma, "num_sigma": p.num_sigma, "threshold": p.threshold, "overlap": p.overlap});
    let jobs: Vec<usize> = cases.iter().map(|s| oracle.add("blob_log", &[s], args.clone())).collect();
    let refs = oracle.run();
    for (s, j) in cases.iter().zip(jobs) {
        let [_, h, w] = s.shape();
        let img: Vec<f32> = hcsflow_core::with_pixels!(Stack, s, a, T => as_float_image(&plane(a, 0)));
        let ours = blob_log(&img, h, w, &p).unwrap();
        let reference: Vec<(f64, f64, f64)> = refs[j].rows().into_iter().map(|r| (r[0], r[1], r[2])).collect();
        let ours_t: Vec<(f64, f64, f64)> = ours.iter().map(|b| (b.y, b.x, b.sigma)).collect();
        let mut a = ours_t.clone();
        let mut b = reference.clone();
        let key = |v: &(f64, f64, f64)| (v.0 as i64, v.1 as i64, (v.2 * 1000.0) as i64);
        a.sort_by_key(key);
        b.sort_by_key(key);
        assert_eq!(a, b, "{} {:?}: detections differ ({} vs {})", s.dtype(), s.shape(), a.len(), b.len());
    }
}

#[test]
fn blob_count_finds_the_nuclei() {
    // Few blobs on a large field, so that nearly all are isolated.
    let (s, truth) = blobs_stack(DType::U16, [1, 160, 160], 12, 65535.0, 0.02, 321);
    let res = count_cells(&s, &CountMethod::BlobLog { params: BlobLogParams::default(), normalize: false }).unwrap();
    let normalised = count_cells(&s, &CountMethod::BlobLog { params: BlobLogParams::default(), normalize: true }).unwrap();
    assert!(normalised.counts.rows[0].count > 0);
    let found = &res.objects.rows;
    let hit = truth.iter().filter(|(ty, tx)| found.iter().any(|r| (r.y - ty).hypot(r.x - tx) <= 3.0)).count();
    assert!(hit as f64 >= 0.8 * truth.len() as f64, "{hit} of {}", truth.len());
    assert_eq!(res.labels.dtype(), DType::U16);
    assert_eq!(res.counts.rows[0].count, found.len());
    // Every object is painted with its label.
    let Stack::U16(l) = &res.labels else { unreachable!() };
    for r in found {
        assert!(r.area > 0);
        assert_eq!(l[[0, r.y as usize, r.x as usize]] as u32, r.label);
    }
}

#[test]
fn count_cells_is_registered() {
    let mut reg = hcsflow_core::Registry::new();
    hcsflow_ops::register(&mut reg);
    for name in ["count_cells", "threshold", "label"] {
        assert_eq!(reg.get(name).unwrap().spec.contract, hcsflow_core::Contract::Pure2d, "{name}");
    }
    let f = reg.get("count_cells").unwrap();
    let a = <hcsflow_ops::count::CountCellsArgs as hcsflow_core::FunctionArgs>::from_args(&f.validate_args(vec![]).unwrap());
    assert_eq!((a.min_sigma, a.max_sigma, a.num_sigma, a.threshold, a.overlap), (1.0, 10.0, 10, 0.1, 0.5));
    assert!(blob_log(&[0.0; 4], 2, 2, &BlobLogParams { min_sigma: 0.0, ..Default::default() }).is_err());
}
