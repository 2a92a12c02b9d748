//! Segmentation and object measurements against scipy / scikit-image, and
//! nuclei segmentation against synthetic ground truth.
//!
//! Tolerances: distance transform 1e-5 (absolute, + 1e-6 relative: f32
//! output); watershed, hole filling and border clearing identical labels;
//! size filter the same partition as skimage's remove_small_objects;
//! regionprops: area, bounding box and convex area exact, solidity 1e-12,
//! every other value 1e-9 relative.

use crate::common;

use std::collections::HashMap;

use common::{blobs_stack, Oracle, Rng};
use hcsflow_core::{DType, Stack};
use hcsflow_ops::label::{label_mask, Connectivity};
use hcsflow_ops::measure::measure_objects;
use hcsflow_ops::segment::{
    clear_border, distance_transform_edt, fill_holes, filter_size, maxima_markers, segment_nuclei, watershed, NucleiParams,
};
use hcsflow_synth::render::{render_tile, Nucleus, NucleusIndex, TileSpec};
use ndarray::Array3;
use serde_json::json;

fn mask_stack(mask: &[bool], h: usize, w: usize) -> Stack {
    Stack::from(Array3::from_shape_vec((1, h, w), mask.iter().map(|&m| u8::from(m)).collect()).unwrap())
}

fn u16_stack(v: &[u32], h: usize, w: usize) -> Stack {
    Stack::from(Array3::from_shape_vec((1, h, w), v.iter().map(|&m| m as u16).collect()).unwrap())
}

fn f32_stack(v: &[f32], h: usize, w: usize) -> Stack {
    Stack::from(Array3::from_shape_vec((1, h, w), v.to_vec()).unwrap())
}

/// Random masks: white noise at several densities, and thresholded blobs.
fn masks() -> Vec<(Vec<bool>, usize, usize)> {
    let mut out = Vec::new();
    for (k, &(h, w, density)) in [(64usize, 64usize, 0.5), (37, 91, 0.8), (1, 40, 0.7), (40, 1, 0.7), (50, 50, 0.97)].iter().enumerate() {
        let mut r = Rng::new(11 + k as u64);
        out.push(((0..h * w).map(|_| r.unit() < density).collect(), h, w));
    }
    for seed in 0..3 {
        let (s, _) = blobs_stack(DType::F32, [1, 96, 80], 25, 1.0, 0.05, 40 + seed);
        let v = s.to_f32();
        out.push((v.iter().map(|&x| x > 0.3).collect(), 96, 80));
    }
    out
}

#[test]
fn distance_transform_matches_scipy() {
    let Some(mut oracle) = Oracle::for_script("objects_oracle.py") else { return };
    let cases = masks();
    let samplings = [(1.0, 1.0), (2.0, 0.65)];
    let mut jobs = Vec::new();
    for (m, h, w) in &cases {
        for &s in &samplings {
            jobs.push(oracle.add("edt", &[&mask_stack(m, *h, *w)], json!({"sampling": [s.0, s.1]})));
        }
    }
    let refs = oracle.run();
    let mut k = 0;
    let mut worst = 0f64;
    for (m, h, w) in &cases {
        for &s in &samplings {
            let ours = distance_transform_edt(m, *h, *w, s);
            for (i, (&a, &b)) in ours.iter().zip(refs[jobs[k]].iter()).enumerate() {
                let err = (a as f64 - b).abs();
                worst = worst.max(err);
                assert!(err <= 1e-5 + 1e-6 * b, "{h}x{w} sampling {s:?} pixel {i}: {a} vs scipy {b}");
            }
            k += 1;
        }
    }
    println!("distance transform: largest difference from scipy {worst:.2e}");
}

/// Whether the marker pixels inside the mask have pairwise different values:
/// then skimage's order is fully defined by (value, age) and ours must equal it.
fn marker_values_distinct(img: &[f32], markers: &[u32], mask: &[bool]) -> bool {
    let mut v: Vec<u32> = (0..img.len()).filter(|&i| markers[i] != 0 && mask[i]).map(|i| (img[i] + 0.0).to_bits()).collect();
    let n = v.len();
    v.sort_unstable();
    v.dedup();
    v.len() == n
}

#[test]
fn watershed_matches_skimage() {
    let Some(mut oracle) = Oracle::for_script("objects_oracle.py") else { return };
    /// One watershed case: image, markers, mask, height, width.
    type Case = (Vec<f32>, Vec<u32>, Vec<bool>, usize, usize);
    let mut cases: Vec<Case> = Vec::new();
    // −distance of blob masks with seeds at the distance maxima (the declumping case).
    for (m, h, w) in masks().into_iter().filter(|c| c.1 > 1 && c.2 > 1) {
        let d = distance_transform_edt(&m, h, w, (1.0, 1.0));
        let seeds = maxima_markers(&d, h, w, 2);
        cases.push((d.iter().map(|&v| -v).collect(), seeds.labels, m, h, w));
    }
    for seed in 0..8u64 {
        let mut r = Rng::new(100 + seed);
        let (h, w) = (48, 53);
        // Even seeds: coarsely quantised values, so ties decide (markers of
        // equal value among them); odd seeds: continuous values, no ties.
        let img: Vec<f32> = (0..h * w).map(|_| if seed % 2 == 0 { r.below(4) as f32 } else { r.unit() as f32 }).collect();
        let mut markers = vec![0u32; h * w];
        for l in 1..=12 {
            markers[r.below(h * w)] = l;
        }
        // A marker made of several pixels, and one with equal values around it.
        markers[5 * w + 5] = 3;
        markers[5 * w + 6] = 3;
        let mask: Vec<bool> = (0..h * w).map(|_| r.unit() < 0.85).collect();
        cases.push((img, markers, mask, h, w));
    }
    let mut jobs = Vec::new();
    for (img, mk, mask, h, w) in &cases {
        let (i, m, k) = (f32_stack(img, *h, *w), u16_stack(mk, *h, *w), mask_stack(mask, *h, *w));
        for c in [1, 2] {
            for op in ["watershed_masked", "watershed_fifo_masked"] {
                jobs.push(oracle.add(op, &[&i, &m, &k], json!({"connectivity": c})));
            }
            for op in ["watershed_nomask", "watershed_fifo_nomask"] {
                jobs.push(oracle.add(op, &[&i, &m], json!({"connectivity": c})));
            }
        }
    }
    let refs = oracle.run();
    let mut k = 0;
    let (mut pixels, mut like_skimage, mut tied_runs, mut tied_differ) = (0, 0, 0, 0);
    for (n, (img, mk, mask, h, w)) in cases.iter().enumerate() {
        for (c, conn) in [(1, Connectivity::Four), (2, Connectivity::Eight)] {
            for with_mask in [true, false] {
                let ours = watershed(img, mk, with_mask.then_some(&mask[..]), *h, *w, conn).unwrap();
                let labels = |job: usize| -> Vec<u32> { refs[jobs[job]].iter().map(|&v| v as u32).collect() };
                let (skimage, transcription) = (labels(k), labels(k + 1));
                k += 2;
                let diff = |theirs: &[u32]| ours.iter().zip(theirs).filter(|(a, b)| a != b).count();
                let what = format!("case {n} ({h}x{w}) connectivity {c} mask {with_mask}");
                assert_eq!(diff(&transcription), 0, "{what}: pixels differ from the definition's transcription");
                let all = vec![true; mask.len()];
                if marker_values_distinct(img, mk, if with_mask { mask } else { &all }) {
                    assert_eq!(diff(&skimage), 0, "{what}: markers of distinct values, yet pixels differ from skimage");
                    like_skimage += 1;
                } else {
                    tied_runs += 1;
                    tied_differ += usize::from(diff(&skimage) > 0);
                }
                pixels += ours.len();
            }
        }
    }
    assert!(like_skimage >= 16, "only {like_skimage} runs had markers of distinct values");
    println!(
        "watershed: {pixels} pixels over {} runs equal to the transcription; {like_skimage} runs with distinct marker values equal to skimage; {tied_runs} with equal marker values, {tied_differ} of them different from skimage (its heap orders those markers)",
        k / 2
    );
}

#[test]
fn watershed_rejects_bad_input() {
    let e = watershed(&[0.0, f32::NAN], &[1, 0], None, 1, 2, Connectivity::Eight).unwrap_err();
    assert!(e.to_string().contains("NaN"), "{e}");
    // Outside the mask a value is never read: NaN there is no error.
    let labels = watershed(&[0.0, 1.0, f32::NAN], &[1, 0, 0], Some(&[true, true, false]), 1, 3, Connectivity::Eight).unwrap();
    assert_eq!(labels, [1, 1, 0]);
    // Inside the mask it is, also in a piece of the mask no marker floods.
    let e = watershed(&[0.0, 1.0, 5.0, f32::NAN], &[1, 0, 0, 0], Some(&[true, false, true, true]), 1, 4, Connectivity::Eight).unwrap_err();
    assert!(e.to_string().contains("NaN"), "{e}");
    assert!(watershed(&[0.0; 3], &[1, 0], None, 1, 2, Connectivity::Eight).is_err());
    let e = watershed(&[0.0; 2], &[u32::MAX, 0], None, 1, 2, Connectivity::Eight).unwrap_err();
    assert!(e.to_string().contains("too large"), "{e}");
}

/// Labels equal up to a bijection of nonzero values.
fn same_partition(ours: &[u32], reference: &[u32]) -> bool {
    let mut fwd: HashMap<u32, u32> = HashMap::new();
    let mut back: HashMap<u32, u32> = HashMap::new();
    ours.iter().zip(reference).all(|(&a, &b)| {
        if (a == 0) != (b == 0) {
            return false;
        }
        *fwd.entry(a).or_insert(b) == b && *back.entry(b).or_insert(a) == a
    })
}

#[test]
fn fill_holes_clear_border_and_size_filter_match_references() {
    let Some(mut oracle) = Oracle::for_script("objects_oracle.py") else { return };
    let cases = masks();
    let mut jobs = Vec::new();
    let mut labelled = Vec::new();
    for (m, h, w) in &cases {
        let l = label_mask(m, *h, *w, Connectivity::Four);
        let ls = u16_stack(&l.labels, *h, *w);
        jobs.push((
            oracle.add("fill_holes", &[&mask_stack(m, *h, *w)], json!({})),
            oracle.add("clear_border", &[&ls], json!({})),
            oracle.add("remove_small", &[&ls], json!({"max_size": 3})),
        ));
        labelled.push(l);
    }
    let refs = oracle.run();
    for ((m, h, w), (l, (jf, jc, jr))) in cases.iter().zip(labelled.iter().zip(jobs)) {
        let filled = fill_holes(m, *h, *w);
        let theirs: Vec<bool> = refs[jf].iter().map(|&v| v != 0.0).collect();
        assert_eq!(filled, theirs, "{h}x{w}: fill_holes");
        let mut cleared = l.labels.clone();
        clear_border(&mut cleared, *h, *w);
        let theirs: Vec<u32> = refs[jc].iter().map(|&v| v as u32).collect();
        assert_eq!(cleared, theirs, "{h}x{w}: clear_border");
        let kept = filter_size(&l.labels, *h, *w, 4, u64::MAX);
        let theirs: Vec<u32> = refs[jr].iter().map(|&v| v as u32).collect();
        assert!(same_partition(&kept.labels, &theirs), "{h}x{w}: size filter");
        assert!(kept.count < l.count || l.count == 0 || kept.labels == l.labels);
    }
}

/// Hand-drawn objects for the convex hull: single pixels (one in a corner),
/// a row, a column on the border, diagonal and steep lines, L, U and plus
/// shapes, a ring, a disc cut in two touching halves, labels split into
/// pieces far apart (rows without pixels between them), a knight's-move pair,
/// rotated ellipses touching the border, and a large rough disc.
fn shapes() -> (Vec<u32>, u32, usize, usize) {
    // Each call draws the next label.
    fn put(l: &mut [u32], n: &mut u32, w: usize, pixels: impl IntoIterator<Item = (usize, usize)>) {
        *n += 1;
        for (y, x) in pixels {
            l[y * w + x] = *n;
        }
    }
    let (h, w) = (150usize, 170usize);
    let mut l = vec![0u32; h * w];
    let mut n = 0;
    put(&mut l, &mut n, w, [(0, 0)]);
    put(&mut l, &mut n, w, [(5, 5)]);
    put(&mut l, &mut n, w, (3..10).map(|x| (2, x + 10)));
    put(&mut l, &mut n, w, (144..150).map(|y| (y, 3)));
    put(&mut l, &mut n, w, (0..6).map(|k| (10 + k, 2 + k)));
    put(&mut l, &mut n, w, (0..7).map(|k| (10 + k, 30 - k)));
    put(&mut l, &mut n, w, (0..9).map(|k| (20 + k, 40 + k / 3)));
    // L and U
    put(&mut l, &mut n, w, (0..8).map(|k| (20 + k, 5)).chain((0..6).map(|k| (27, 6 + k))));
    put(&mut l, &mut n, w, (0..7).flat_map(|k| [(30 + k, 20), (30 + k, 21), (30 + k, 28)]).chain((20..29).map(|x| (36, x))));
    // plus
    put(&mut l, &mut n, w, (0..9).flat_map(|k| [(40 + k, 14), (44, 10 + k)]));
    // ring, and a disc cut into two touching halves
    let disc = |cy: f64, cx: f64, r0: f64, r1: f64| {
        (0..h).flat_map(move |y| (0..w).map(move |x| (y, x))).filter(move |&(y, x)| {
            let d = (y as f64 - cy).hypot(x as f64 - cx);
            (r0..=r1).contains(&d)
        })
    };
    put(&mut l, &mut n, w, disc(60.0, 30.0, 4.0, 9.5));
    put(&mut l, &mut n, w, disc(60.0, 60.0, 0.0, 8.3).filter(|&(y, x)| x + y < 120));
    put(&mut l, &mut n, w, disc(60.0, 60.0, 0.0, 8.3).filter(|&(y, x)| x + y >= 120));
    // pieces far apart, and a knight's move
    put(&mut l, &mut n, w, [(80, 5), (80, 6), (95, 12), (88, 2)]);
    put(&mut l, &mut n, w, [(85, 20), (86, 22)]);
    put(&mut l, &mut n, w, [(90, 30), (90, 31), (91, 30), (91, 31)]);
    // rotated ellipses, two touching the right and top borders
    for (cy, cx, a, b, t) in [(100.0, 60.0, 12.0, 4.0, 0.4), (30.0, 165.0, 15.0, 6.0, 1.1), (2.0, 120.0, 9.0, 5.0, 2.5)] {
        let (c, s) = (f64::cos(t), f64::sin(t));
        let inside = |&(y, x): &(usize, usize)| {
            let (dy, dx) = (y as f64 - cy, x as f64 - cx);
            ((dx * c + dy * s) / a).powi(2) + ((dy * c - dx * s) / b).powi(2) <= 1.0
        };
        put(&mut l, &mut n, w, (0..h).flat_map(|y| (0..w).map(move |x| (y, x))).filter(inside));
    }
    // a large disc with a rough edge
    let mut r = Rng::new(77);
    let bumps: Vec<f64> = (0..64).map(|_| 38.0 + 4.0 * r.unit()).collect();
    let inside = |&(y, x): &(usize, usize)| {
        let (dy, dx) = (y as f64 - 100.0, x as f64 - 120.0);
        let k = ((dy.atan2(dx) + std::f64::consts::PI) / std::f64::consts::TAU * 64.0) as usize % 64;
        dy.hypot(dx) <= bumps[k]
    };
    put(&mut l, &mut n, w, (0..h).flat_map(|y| (0..w).map(move |x| (y, x))).filter(inside));
    (l, n, h, w)
}

#[test]
fn measurements_match_regionprops() {
    let Some(mut oracle) = Oracle::for_script("objects_oracle.py") else { return };
    let mut cases: Vec<(Vec<u32>, u32, Stack, usize, usize)> = Vec::new();
    for (k, (m, h, w)) in masks().into_iter().enumerate() {
        let l = label_mask(&m, h, w, Connectivity::Eight);
        let img = common::random_stack(DType::U16, [1, h, w], 300 + k as u64);
        cases.push((l.labels, l.count, img, h, w));
    }
    // Watershed-split nuclei (objects touching each other).
    let (img, _) = blobs_stack(DType::U16, [1, 128, 120], 40, 30000.0, 0.02, 9);
    let Stack::U16(a) = &img else { unreachable!() };
    let l = segment_nuclei(a.plane(0), 128, 120, &NucleiParams { min_area: 5, ..NucleiParams::default() }).unwrap();
    assert!(l.count > 10);
    cases.push((l.labels, l.count, img.clone(), 128, 120));
    let (l, count, h, w) = shapes();
    cases.push((l, count, common::random_stack(DType::U16, [1, h, w], 17), h, w));
    // Many small irregular clusters: sparse noise, 8-connected.
    let mut r = Rng::new(5);
    let sparse: Vec<bool> = (0..200 * 180).map(|_| r.unit() < 0.3).collect();
    let l = label_mask(&sparse, 200, 180, Connectivity::Eight);
    cases.push((l.labels, l.count, common::random_stack(DType::U16, [1, 200, 180], 18), 200, 180));
    // Random star shapes (a radius per angular sector), touching their neighbours.
    let (h, w) = (240, 250);
    let mut stars = vec![0u32; h * w];
    let mut n = 0;
    for cy in (15..h).step_by(30) {
        for cx in (15..w).step_by(30) {
            n += 1;
            let sectors = 3 + (r.unit() * 9.0) as usize;
            let radii: Vec<f64> = (0..sectors).map(|_| 4.0 + 14.0 * r.unit()).collect();
            let turn = r.unit() * std::f64::consts::TAU;
            for y in cy.saturating_sub(18)..(cy + 18).min(h) {
                for x in cx.saturating_sub(18)..(cx + 18).min(w) {
                    let (dy, dx) = (y as f64 - cy as f64, x as f64 - cx as f64);
                    let a = (dy.atan2(dx) + turn).rem_euclid(std::f64::consts::TAU);
                    if dy.hypot(dx) <= radii[(a / std::f64::consts::TAU * sectors as f64) as usize % sectors] {
                        stars[y * w + x] = n;
                    }
                }
            }
        }
    }
    cases.push((stars, n, common::random_stack(DType::U16, [1, h, w], 19), h, w));
    let jobs: Vec<usize> =
        cases.iter().map(|(l, _, img, h, w)| oracle.add("regionprops", &[&u16_stack(l, *h, *w), img], json!({}))).collect();
    let refs = oracle.run();
    let (mut objects, mut concave) = (0, 0);
    for ((l, count, img, h, w), j) in cases.iter().zip(jobs) {
        let Stack::U16(a) = img else { unreachable!() };
        let ours = measure_objects(l, *count, a.plane(0), *h, *w).unwrap();
        let theirs = &refs[j];
        assert_eq!(ours.len(), theirs.shape()[0], "{h}x{w}: object count");
        for (k, m) in ours.iter().enumerate() {
            let row: Vec<f64> = (0..18).map(|c| theirs[[k, c]]).collect();
            let mine = [
                m.label as f64,
                m.area as f64,
                m.center_x,
                m.center_y,
                m.bbox[1] as f64,
                m.bbox[0] as f64,
                m.bbox[3] as f64,
                m.bbox[2] as f64,
                m.perimeter,
                m.eccentricity,
                m.major_axis_length,
                m.minor_axis_length,
                m.convex_area as f64,
                m.solidity,
                m.mean_intensity,
                m.integrated_intensity,
                m.min_intensity,
                m.max_intensity,
            ];
            for (c, (&a, &b)) in mine.iter().zip(&row).enumerate() {
                let tol = match c {
                    0 | 1 | 4..=7 | 12 => 0.0,
                    13 => 1e-12,
                    _ => 1e-9 * b.abs().max(1.0),
                };
                assert!((a - b).abs() <= tol, "{h}x{w} object {} column {c}: {a} vs regionprops {b}", m.label);
            }
        }
        objects += ours.len();
        concave += ours.iter().filter(|m| m.convex_area > m.area).count();
    }
    assert!(concave > 200, "only {concave} objects whose convex hull adds pixels");
    println!("regionprops: {objects} objects ({concave} not convex), every column within tolerance");
}

/// Greedy one-to-one matching by increasing distance within `radius`: matched count.
fn matched(truth: &[(f64, f64)], found: &[(f64, f64)], radius: f64) -> usize {
    let mut pairs: Vec<(f64, usize, usize)> = Vec::new();
    for (i, t) in truth.iter().enumerate() {
        for (j, f) in found.iter().enumerate() {
            let d = (t.0 - f.0).hypot(t.1 - f.1);
            if d <= radius {
                pairs.push((d, i, j));
            }
        }
    }
    pairs.sort_by(|a, b| a.0.total_cmp(&b.0));
    let (mut ut, mut uf) = (vec![false; truth.len()], vec![false; found.len()]);
    let mut n = 0;
    for (_, i, j) in pairs {
        if !ut[i] && !uf[j] {
            ut[i] = true;
            uf[j] = true;
            n += 1;
        }
    }
    n
}

/// Nuclei as the synthetic plates draw them (radius 6–11 px, Gaussian profile
/// σ = r/1.6, amplitude 600–1500), on a grid of cells each holding one nucleus
/// or a touching pair (centres 0.9–1.1 × (r₁ + r₂) apart, random direction).
fn touching_nuclei(size: usize, seed: u64) -> (Vec<Nucleus>, usize) {
    let mut r = Rng::new(seed);
    let mut nuclei = Vec::new();
    let mut pairs = 0;
    let cell = 64.0;
    let n = (size as f64 / cell) as usize;
    let one = |x: f64, y: f64, rad: f64, r: &mut Rng| Nucleus {
        x,
        y,
        radius: rad,
        sigma: vec![rad / 1.6],
        amplitude: vec![600.0 + 900.0 * r.unit()],
    };
    for cy in 0..n {
        for cx in 0..n {
            let (x0, y0) = (cx as f64 * cell + cell / 2.0, cy as f64 * cell + cell / 2.0);
            let r1 = 6.0 + 5.0 * r.unit();
            if r.unit() < 0.5 {
                nuclei.push(one(x0 + 8.0 * (r.unit() - 0.5), y0 + 8.0 * (r.unit() - 0.5), r1, &mut r));
            } else {
                let r2 = 6.0 + 5.0 * r.unit();
                let d = (r1 + r2) * (0.9 + 0.2 * r.unit());
                let a = std::f64::consts::TAU * r.unit();
                let (dx, dy) = (d * a.cos() / 2.0, d * a.sin() / 2.0);
                nuclei.push(one(x0 - dx, y0 - dy, r1, &mut r));
                nuclei.push(one(x0 + dx, y0 + dy, r2, &mut r));
                pairs += 1;
            }
        }
    }
    (nuclei, pairs)
}

#[test]
fn segment_nuclei_separates_touching_synthetic_nuclei() {
    let size = 512;
    let ff = vec![1f32; size * size];
    let (mut tp, mut n_true, mut n_found, mut n_pairs) = (0, 0, 0, 0);
    let (mut tp_blob, mut n_blob) = (0, 0);
    for seed in 0..3u64 {
        let (nuclei, pairs) = touching_nuclei(size, 1000 + seed);
        n_pairs += pairs;
        let truth: Vec<(f64, f64)> = nuclei.iter().map(|n| (n.x, n.y)).collect();
        let index = NucleusIndex::new(nuclei, size as f64, size as f64);
        let spec = TileSpec {
            x0: 0.0,
            y0: 0.0,
            width: size,
            height: size,
            channel: 0,
            defocus: 0.0,
            background: 60.0,
            dark_offset: 100.0,
            read_noise: 5.0,
            flatfield: &ff,
            seed,
        };
        let tile = render_tile(&index, &spec);
        let l = segment_nuclei(&tile, size, size, &NucleiParams::default()).unwrap();
        let objs = measure_objects(&l.labels, l.count, &tile, size, size).unwrap();
        let found: Vec<(f64, f64)> = objs.iter().map(|o| (o.center_x, o.center_y)).collect();
        tp += matched(&truth, &found, 5.0);
        n_true += truth.len();
        n_found += found.len();
        // Without declumping (threshold + label), for comparison.
        let plain = hcsflow_ops::count::count_cells(
            &Stack::from(Array3::from_shape_vec((1, size, size), tile.clone()).unwrap()),
            &hcsflow_ops::count::CountMethod::Threshold {
                method: hcsflow_ops::threshold::ThresholdMethod::Otsu,
                connectivity: Connectivity::Eight,
                min_area: 30,
                max_area: 100_000,
            },
        )
        .unwrap();
        let pf: Vec<(f64, f64)> = plain.objects.rows.iter().map(|r| (r.x, r.y)).collect();
        tp_blob += matched(&truth, &pf, 5.0);
        n_blob += pf.len();
    }
    let (recall, precision) = (tp as f64 / n_true as f64, tp as f64 / n_found as f64);
    println!(
        "segment_nuclei on {n_true} synthetic nuclei ({n_pairs} touching pairs): found {n_found}, matched {tp} within 5 px: recall {recall:.3}, precision {precision:.3}; \
         threshold + label without declumping: recall {:.3}, precision {:.3}",
        tp_blob as f64 / n_true as f64,
        tp_blob as f64 / n_blob.max(1) as f64
    );
    assert!(recall >= 0.95 && precision >= 0.95, "recall {recall:.3}, precision {precision:.3}");
}

fn read_csv(path: &std::path::Path) -> Vec<HashMap<String, String>> {
    let text = std::fs::read_to_string(path).unwrap();
    let mut lines = text.lines();
    let header: Vec<String> = lines.next().unwrap_or("").split(',').map(String::from).collect();
    lines.map(|l| header.iter().cloned().zip(l.split(',').map(String::from)).collect()).collect()
}

fn num(row: &HashMap<String, String>, key: &str) -> f64 {
    row[key].parse().unwrap()
}

/// Scores one tile's labels against the truth nuclei of its well (tile
/// coordinates, nuclei outside the tile included): a truth nucleus whose centre
/// lies in the tile is found when the object under its centre pixel is not
/// already another's (so two nuclei merged into one object count one miss);
/// an object holding no truth centre is a false positive unless it touches the
/// tile border (then it is the cut part of a nucleus centred outside the tile).
/// Returns (truth nuclei in the tile, objects, matched, unmatched border objects).
fn score_tile(labels: &[u32], count: u32, h: usize, w: usize, truth: &[(f64, f64)]) -> (usize, usize, usize, usize) {
    let mut taken = vec![false; count as usize + 1];
    let (mut n_true, mut tp) = (0, 0);
    for &(x, y) in truth {
        if x < 0.0 || y < 0.0 || x >= w as f64 || y >= h as f64 {
            continue;
        }
        n_true += 1;
        let l = labels[(y.round() as usize).min(h - 1) * w + (x.round() as usize).min(w - 1)] as usize;
        if l != 0 && !taken[l] {
            taken[l] = true;
            tp += 1;
        }
    }
    let mut border = vec![false; count as usize + 1];
    for y in 0..h {
        for x in 0..w {
            if y == 0 || x == 0 || y == h - 1 || x == w - 1 {
                border[labels[y * w + x] as usize] = true;
            }
        }
    }
    let neutral = (1..=count as usize).filter(|&l| !taken[l] && border[l]).count();
    (n_true, count as usize, tp, neutral)
}

/// `segment_nuclei` (default settings) on the tiles of `hcsflow synth` plates
/// (defaults: 2 wells × 3×3 sites of 256², nuclei of radius 6–11 px, Gaussian
/// profile, flat-field, Poisson and read noise): (truth nuclei, objects counted,
/// matched, truth nuclei with another's centre closer than half their radii's sum).
fn score_plate(seed: u64, min_separation: f64, density: f64) -> (usize, usize, usize, usize) {
    let dir = tempfile::tempdir().unwrap();
    let plate = dir.path().join("plate");
    let cfg = hcsflow_synth::SynthConfig {
        channels: 1,
        z_planes: 1,
        size: 256,
        seed,
        nucleus_min_separation: min_separation,
        nuclei_density: density,
        ..Default::default()
    };
    hcsflow_synth::generate(&cfg, &plate).unwrap();
    let opened = hcsflow_plate::open_plate(&plate, None).unwrap();
    let tiles: HashMap<(String, u32), (f64, f64)> = read_csv(&plate.join("ground_truth/tile_positions.csv"))
        .iter()
        .map(|r| ((r["well"].clone(), num(r, "site") as u32), (num(r, "x_px"), num(r, "y_px"))))
        .collect();
    let nuclei = read_csv(&plate.join("ground_truth/nuclei.csv"));
    let (mut n_true, mut n_found, mut tp, mut n_overlapping) = (0, 0, 0, 0);
    for img in opened.images.iter().filter(|i| i.channel == 1) {
        let stack = hcsflow_tiff::read_stack(&img.path).unwrap();
        let [_, h, w] = stack.shape();
        let (tx, ty) = tiles[&(img.well.clone(), img.site)];
        let all: Vec<(f64, f64, f64)> = nuclei
            .iter()
            .filter(|r| r["well"] == img.well)
            .map(|r| (num(r, "x_px") - tx, num(r, "y_px") - ty, num(r, "radius_px")))
            .collect();
        let truth: Vec<(f64, f64)> = all.iter().map(|&(x, y, _)| (x, y)).collect();
        n_overlapping += all
            .iter()
            .enumerate()
            .filter(|&(i, &(x, y, r))| {
                x >= 0.0
                    && y >= 0.0
                    && x < w as f64
                    && y < h as f64
                    && all.iter().enumerate().any(|(j, &(u, v, q))| j != i && (x - u).hypot(y - v) < 0.5 * (r + q))
            })
            .count();
        let Stack::U16(a) = &stack else { panic!("synthetic tiles are u16") };
        let l = segment_nuclei(a.plane(0), h, w, &NucleiParams::default()).unwrap();
        let (t, f, m, neutral) = score_tile(&l.labels, l.count, h, w, &truth);
        n_true += t;
        n_found += f - neutral;
        tp += m;
    }
    (n_true, n_found, tp, n_overlapping)
}

/// Recall and precision of `segment_nuclei` at its default settings on the
/// nuclei truth of synthetic plates drawn as a monolayer (nuclei touch but do
/// not overlap: `nucleus_min_separation = 1`), over four plate seeds, each
/// seed asserted. For comparison, printed only: the plates' default drawing,
/// where nuclei are placed independently and some overlap beyond separation.
#[test]
fn segment_nuclei_on_synthetic_plates() {
    let default_density = hcsflow_synth::SynthConfig::default().nuclei_density;
    // The default density, and a crowded one where many nuclei touch.
    for (seed, density) in [(0, default_density), (1, default_density), (2, default_density), (3, 800.0), (4, 800.0)] {
        let (n_true, n_found, tp, _) = score_plate(seed, 1.0, density);
        let (recall, precision) = (tp as f64 / n_true as f64, tp as f64 / n_found as f64);
        println!(
            "plate seed {seed}, monolayer, {density} nuclei per 10⁶ px²: {n_true} nuclei, {n_found} objects, {tp} matched: recall {recall:.3}, precision {precision:.3}"
        );
        assert!(recall >= 0.95 && precision >= 0.95, "seed {seed}: recall {recall:.3}, precision {precision:.3}");
    }
    for seed in 0..2 {
        let (n_true, n_found, tp, over) = score_plate(seed, 0.0, default_density);
        println!(
            "plate seed {seed}, nuclei placed independently: {n_true} nuclei ({over} with another's centre closer than half their radii's sum), {n_found} objects, {tp} matched: recall {:.3}, precision {:.3}",
            tp as f64 / n_true as f64,
            tp as f64 / n_found as f64
        );
    }
}

/// Two channels as a stack `[A, B]` of one dtype.
fn two_planes<T: Clone + hcsflow_core::Pixel>(a: &[T], b: &[T], h: usize, w: usize) -> (Stack, Stack)
where
    Stack: From<Array3<T>>,
{
    (
        Stack::from(Array3::from_shape_vec((1, h, w), a.to_vec()).unwrap()),
        Stack::from(Array3::from_shape_vec((1, h, w), b.to_vec()).unwrap()),
    )
}

/// Colocalisation per image and per object against skimage.measure's
/// pearson_corr_coeff, manders_coloc_coeff (both ways, masks = channel >
/// threshold), manders_overlap_coeff and intersection_coeff (both ways), each
/// with the object as mask: NaN where skimage gives NaN (constant channel in an
/// object, single-pixel object), otherwise within 1e-9.
#[test]
fn colocalization_matches_skimage() {
    use hcsflow_ops::coloc::colocalization;
    use hcsflow_ops::threshold::{threshold_value, ThresholdMethod};
    let Some(mut oracle) = Oracle::for_script("objects_oracle.py") else { return };
    // (A, B, labels, thresholds) as f32 values; u16 or f32 stacks.
    type Case = (Stack, Stack, Vec<u32>, usize, usize, f64, f64);
    let mut cases: Vec<Case> = Vec::new();
    for seed in 0..3u64 {
        // Nuclei in A; B partly the same blobs (correlated), partly others.
        let (h, w) = (128, 120);
        let (sa, _) = blobs_stack(DType::U16, [1, h, w], 30, 20000.0, 0.02, 50 + seed);
        let (sb, _) = blobs_stack(DType::U16, [1, h, w], 30, 20000.0, 0.02, 60 + seed);
        let (Stack::U16(a), Stack::U16(b2)) = (&sa, &sb) else { unreachable!() };
        let (a, b2) = (a.plane(0).to_vec(), b2.plane(0).to_vec());
        let b: Vec<u16> = a.iter().zip(&b2).enumerate().map(|(i, (&x, &y))| if (i / w) < h / 2 { x / 2 + y / 3 } else { y }).collect();
        let mut labels = segment_nuclei(&a, h, w, &NucleiParams { min_area: 5, ..NucleiParams::default() }).unwrap().labels;
        // A single-pixel object and a block where B is constant.
        labels[3 * w + 3] = 500;
        let mut b = b;
        for y in 100..106 {
            for x in 100..110 {
                labels[y * w + x] = 501;
                b[y * w + x] = 77;
            }
        }
        let ta = threshold_value(&a, ThresholdMethod::Otsu).unwrap();
        let tb = threshold_value(&b, ThresholdMethod::Otsu).unwrap();
        let (s0, s1) = two_planes(&a, &b, h, w);
        cases.push((s0, s1, labels, h, w, ta, tb));
    }
    // Random f32 images with a label grid, and manual thresholds.
    let (h, w) = (40, 50);
    let mut r = Rng::new(7);
    let a: Vec<f32> = (0..h * w).map(|_| 1000.0 * r.unit() as f32).collect();
    let b: Vec<f32> = a.iter().map(|&x| 0.3 * x + 700.0 * r.unit() as f32).collect();
    let labels: Vec<u32> = (0..h * w).map(|i| ((i / w) / 10 * 5 + (i % w) / 10) as u32).collect();
    let (s0, s1) = two_planes(&a, &b, h, w);
    cases.push((s0, s1, labels, h, w, 400.0, 300.0));
    let jobs: Vec<usize> = cases
        .iter()
        .map(|(a, b, l, h, w, ta, tb)| oracle.add("coloc", &[a, b, &u16_stack(l, *h, *w)], json!({"ta": ta, "tb": tb})))
        .collect();
    let refs = oracle.run();
    let mut rows = 0;
    let mut worst = 0f64;
    for ((sa, sb, l, h, w, ta, tb), j) in cases.iter().zip(jobs) {
        let ours = match (sa, sb) {
            (Stack::U16(a), Stack::U16(b)) => colocalization(a.plane(0), b.plane(0), Some(l), *ta, *tb).unwrap(),
            (Stack::F32(a), Stack::F32(b)) => colocalization(a.plane(0), b.plane(0), Some(l), *ta, *tb).unwrap(),
            _ => unreachable!(),
        };
        let theirs = &refs[j];
        assert_eq!(ours.len(), theirs.shape()[0], "{h}x{w}: regions");
        for (k, c) in ours.iter().enumerate() {
            let mine = [c.label as f64, c.pearson, c.manders_m1, c.manders_m2, c.overlap, c.intersection_ab, c.intersection_ba];
            for (col, &a) in mine.iter().enumerate() {
                let b = theirs[[k, col]];
                if b.is_nan() {
                    assert!(a.is_nan(), "{h}x{w} region {} column {col}: {a} vs skimage NaN", c.label);
                    continue;
                }
                worst = worst.max((a - b).abs());
                assert!((a - b).abs() <= 1e-9, "{h}x{w} region {} column {col}: {a} vs skimage {b}", c.label);
            }
        }
        rows += ours.len();
    }
    println!("colocalization: {rows} regions (images and objects), largest difference from skimage {worst:.2e}");
    // Negative intensities are refused, as skimage's Manders coefficients do.
    assert!(colocalization(&[1.0f32, -1.0], &[1.0, 1.0], None, 0.0, 0.0).is_err());
    assert!(colocalization(&[1.0f32, 2.0], &[1.0], None, 0.0, 0.0).is_err());
}

/// `colocalization` through the registry: a 2- or 3-plane stack in, the same
/// stack out; 1 or 4 planes refused before any pixel is read.
#[test]
fn colocalization_is_a_registered_function() {
    let mut r = hcsflow_core::Registry::new();
    hcsflow_ops::register(&mut r);
    let conv = hcsflow_core::Conversions::default();
    let (s, _) = blobs_stack(DType::U16, [3, 64, 64], 10, 20000.0, 0.02, 3);
    let out = hcsflow_testkit::call(&r, &conv, "colocalization", &["threshold_method=otsu"], &s, hcsflow_core::Device::Cpu).unwrap();
    assert_eq!(out.to_f32(), s.to_f32());
    let two = Stack::concat(&[s.plane(0), s.plane(1)]).unwrap();
    assert!(hcsflow_testkit::call(&r, &conv, "colocalization", &[], &two, hcsflow_core::Device::Cpu).is_ok());
    assert!(hcsflow_testkit::call(&r, &conv, "colocalization", &[], &s.plane(0), hcsflow_core::Device::Cpu).is_err());
}

/// `measure_objects` (labels as plane 0, intensities after): one row per object
/// and intensity plane, equal to `measure_objects` of the Rust API; through the
/// registry it returns its input, and refuses a single plane.
#[test]
fn measure_objects_function_measures_each_intensity_plane() {
    let (img, _) = blobs_stack(DType::U16, [2, 96, 90], 20, 30000.0, 0.02, 21);
    let Stack::U16(a) = &img else { unreachable!() };
    let l = segment_nuclei(a.plane(0), 96, 90, &NucleiParams { min_area: 5, ..NucleiParams::default() }).unwrap();
    assert!(l.count > 3);
    let stack = Stack::concat(&[u16_stack(&l.labels, 96, 90), img.plane(0), img.plane(1)]).unwrap();
    let table = hcsflow_ops::measure::measure_objects_stack(&stack).unwrap();
    assert_eq!(table.rows.len(), 2 * l.count as usize);
    for z in 0..2 {
        let direct = measure_objects(&l.labels, l.count, a.plane(z), 96, 90).unwrap();
        let rows: Vec<_> = table.rows.iter().filter(|r| r.plane == Some(z + 1)).collect();
        assert_eq!(rows.len(), direct.len());
        for (r, m) in rows.iter().zip(&direct) {
            assert_eq!(r.cells[0].as_f64(), Some(m.label as f64));
            assert_eq!(r.cells[12].as_f64(), Some(m.convex_area as f64), "plane {z} object {}", m.label);
            assert_eq!(r.cells[13].as_f64(), Some(m.solidity), "plane {z} object {}", m.label);
            assert_eq!(r.cells[14].as_f64(), Some(m.mean_intensity), "plane {z} object {}", m.label);
        }
    }
    let mut reg = hcsflow_core::Registry::new();
    hcsflow_ops::register(&mut reg);
    let conv = hcsflow_core::Conversions::default();
    let out = hcsflow_testkit::call(&reg, &conv, "measure_objects", &[], &stack, hcsflow_core::Device::Cpu).unwrap();
    assert_eq!(out.to_f32(), stack.to_f32());
    assert!(hcsflow_testkit::call(&reg, &conv, "measure_objects", &[], &img.plane(0), hcsflow_core::Device::Cpu).is_err());
}

/// `watershed` through the registry (image, markers, optional mask as planes)
/// equals the Rust API, which the oracle test compares with skimage.
#[test]
fn watershed_is_a_registered_function() {
    let (m, h, w) = masks().swap_remove(5);
    let d = distance_transform_edt(&m, h, w, (1.0, 1.0));
    let seeds = maxima_markers(&d, h, w, 2);
    let neg: Vec<f32> = d.iter().map(|&v| -v).collect();
    let markers: Vec<f32> = seeds.labels.iter().map(|&v| v as f32).collect();
    let mask: Vec<f32> = m.iter().map(|&v| f32::from(u8::from(v))).collect();
    let stack = Stack::concat(&[f32_stack(&neg, h, w), f32_stack(&markers, h, w), f32_stack(&mask, h, w)]).unwrap();
    let mut reg = hcsflow_core::Registry::new();
    hcsflow_ops::register(&mut reg);
    let conv = hcsflow_core::Conversions::default();
    for (arg, conn) in [("connectivity=4", Connectivity::Four), ("connectivity=8", Connectivity::Eight)] {
        let out = hcsflow_testkit::call(&reg, &conv, "watershed", &[arg], &stack, hcsflow_core::Device::Cpu).unwrap();
        let direct = watershed(&neg, &seeds.labels, Some(&m), h, w, conn).unwrap();
        assert_eq!(out.shape(), [1, h, w]);
        assert_eq!(out.to_f32().iter().copied().collect::<Vec<f32>>(), direct.iter().map(|&v| v as f32).collect::<Vec<_>>(), "{arg}");
    }
    assert!(hcsflow_testkit::call(&reg, &conv, "watershed", &[], &stack.plane(0), hcsflow_core::Device::Cpu).is_err());
}
