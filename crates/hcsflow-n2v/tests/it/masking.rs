//! The device-side batches: random numbers equal their host definition, patches are crops of the
//! image under one of the 8 flips/rotations, masking puts exactly one pixel in every grid box,
//! replaces it with the lower median of its window without the centre, and the loss counts only
//! changed pixels.

use burn::tensor::{Bool, Device, Int, Tensor, TensorData};
use hcsflow_n2v::masking::{lower_median_excluding, rank_by_counting, Masker};
use hcsflow_n2v::rng::{bits31_host, DeviceRandom, SplitMix64};
use hcsflow_n2v::N2vConfig;

fn floats<const D: usize>(t: Tensor<D>) -> Vec<f32> {
    t.into_data().try_to_vec::<f32>().unwrap()
}

fn ints<const D: usize>(t: Tensor<D, Int>) -> Vec<i64> {
    t.into_data().convert::<i64>().try_to_vec::<i64>().unwrap()
}

#[test]
fn device_random_numbers_equal_their_host_definition_and_are_uniform() {
    let dev = Device::flex();
    let n = 70_000; // crosses the 16-bit boundary of the counter
    let rng = DeviceRandom::new(42);
    for (step, stream) in [(0, 1), (7, 3), (123_456, 5)] {
        let got = ints(rng.bits31(DeviceRandom::counters(n, &dev), step, stream));
        for (c, &g) in got.iter().enumerate() {
            assert_eq!(g, bits31_host(42, step, stream, c as u32) as i64, "step {step} stream {stream} counter {c}");
        }
    }
    // Uniformity of draws below 10: chi-square with 9 degrees of freedom (p = 0.001 at 27.9).
    let below = ints(rng.below(DeviceRandom::counters(n, &dev), 3, 9, 10));
    let mut counts = [0f64; 10];
    below.iter().for_each(|&v| counts[v as usize] += 1.0);
    let e = n as f64 / 10.0;
    let chi2: f64 = counts.iter().map(|c| (c - e).powi(2) / e).sum();
    assert!(chi2 < 27.9, "chi-square {chi2}: {counts:?}");
    let u = floats(rng.uniform(DeviceRandom::counters(n, &dev), 3, 9));
    assert!(u.iter().all(|&v| (0.0..1.0).contains(&v)));
    let mean = u.iter().map(|&v| v as f64).sum::<f64>() / n as f64;
    assert!((mean - 0.5).abs() < 0.005, "mean {mean}");
}

fn config(patch: usize, batch: usize) -> N2vConfig {
    N2vConfig { patch_size: patch, batch_size: batch, seed: 5, ..N2vConfig::default() }
}

/// An image whose value is its own flat index: a patch reveals where it was cut.
fn index_image(h: usize, w: usize, dev: &Device) -> Tensor<1> {
    Tensor::from_data(TensorData::new((0..h * w).map(|i| i as f32).collect::<Vec<_>>(), [h * w]), dev)
}

#[test]
fn patches_are_crops_under_the_eight_flips_and_rotations() {
    let dev = Device::flex();
    let (h, w, p, b) = (90, 70, 16, 32);
    let cfg = config(p, b);
    let masker = Masker::new(index_image(h, w, &dev), h, w, &cfg, &dev);
    let mut seen = std::collections::BTreeSet::new();
    for step in 0..4 {
        let v = floats(masker.patches(step));
        for k in 0..b {
            let patch: Vec<(usize, usize)> = v[k * p * p..(k + 1) * p * p].iter().map(|&i| (i as usize / w, i as usize % w)).collect();
            let at = |a: usize, c: usize| patch[a * p + c];
            let (y0, x0) = (patch.iter().map(|q| q.0).min().unwrap(), patch.iter().map(|q| q.1).min().unwrap());
            assert!(y0 + p <= h && x0 + p <= w);
            // The corner (0, 0) of the patch tells the flips; (0, 1) tells the transpose.
            let (cy, cx) = at(0, 0);
            let flip_y = cy != y0;
            let flip_x = cx != x0;
            let (ny, _) = at(0, 1);
            let transposed = ny != cy;
            seen.insert((flip_y, flip_x, transposed));
            for a in 0..p {
                for c in 0..p {
                    let (r, s) = if transposed { (c, a) } else { (a, c) };
                    let r = if flip_y { p - 1 - r } else { r };
                    let s = if flip_x { p - 1 - s } else { s };
                    assert_eq!(at(a, c), (y0 + r, x0 + s), "step {step} patch {k} at ({a}, {c})");
                }
            }
        }
    }
    assert_eq!(seen.len(), 8, "all 8 orientations occur: {seen:?}");
}

/// The lower median of `values` without index `skip`.
fn median_without(values: &[f32], skip: usize) -> f32 {
    let mut v: Vec<f32> = values.iter().enumerate().filter(|&(i, _)| i != skip).map(|(_, &x)| x).collect();
    v.sort_by(f32::total_cmp);
    v[(v.len() - 1) / 2]
}

#[test]
fn the_rank_count_median_is_the_lower_median_without_the_excluded_entry() {
    let dev = Device::flex();
    let mut rng = SplitMix64::new(3);
    let rows: Vec<(Vec<f32>, usize)> = vec![
        (vec![5.0, 1.0, 2.0, 3.0, 4.0], 0), // excluded value is the largest
        (vec![3.0, 1.0, 2.0, 4.0, 5.0], 0), // excluded value would be the median
        (vec![2.0, 2.0, 2.0, 1.0, 9.0], 4), // ties
        (vec![7.0, 7.0, 7.0, 7.0, 7.0], 2), // all equal
        ((0..5).map(|_| rng.next_f64() as f32).collect(), 3),
    ];
    let k = 5;
    let values: Vec<f32> = rows.iter().flat_map(|r| r.0.clone()).collect();
    let mask: Vec<bool> = rows.iter().flat_map(|r| (0..k).map(move |i| i == r.1)).collect();
    let v = Tensor::<3>::from_data(TensorData::new(values, [rows.len(), 1, k]), &dev);
    let m = Tensor::<3, Bool>::from_data(TensorData::new(mask, [rows.len(), 1, k]), &dev);
    let got = floats(lower_median_excluding(v, m));
    for (r, g) in rows.iter().zip(got) {
        assert_eq!(g, median_without(&r.0, r.1), "{r:?}");
    }
}

#[test]
fn the_host_selection_and_the_rank_count_pick_the_same_medians() {
    // Masking's shape (16 patches × 9 masks, 11 × 11 windows), values with many ties, on the
    // autodiff device training uses; the same values as the rank count's, bit for bit.
    for dev in [Device::flex(), Device::flex().autodiff()] {
        let (n, k) = (144, 121);
        let mut rng = SplitMix64::new(7);
        let values: Vec<f32> = (0..n * k).map(|_| (rng.next_f64() * 20.0).floor() as f32 - 7.5).collect();
        let mask: Vec<bool> = (0..n * k).map(|i| i % k == (i / k) % k).collect();
        let v = Tensor::<3>::from_data(TensorData::new(values.clone(), [n, 1, k]), &dev);
        let m = Tensor::<3, Bool>::from_data(TensorData::new(mask, [n, 1, k]), &dev);
        let selected = floats(lower_median_excluding(v.clone(), m.clone()));
        let counted = floats(rank_by_counting(v.mask_fill(m, f32::MAX), (k - 2) / 2));
        assert_eq!(selected, counted);
        for (r, (row, &got)) in values.chunks_exact(k).zip(&selected).enumerate() {
            assert_eq!(got, median_without(row, r % k));
        }
    }
}

#[test]
fn masking_puts_one_pixel_per_box_and_replaces_it_with_the_median_without_the_centre() {
    let dev = Device::flex();
    let (h, w, p, b) = (100, 120, 64, 6);
    let mut rng = SplitMix64::new(11);
    let image: Vec<f32> = (0..h * w).map(|_| rng.next_f64() as f32).collect();
    let cfg = config(p, b);
    let g = cfg.masks_per_side();
    assert_eq!(g, 3, "0.2 % on 64²: boxes of 22.4 px → 3 × 3");
    let r = cfg.roi_size;
    let masker = Masker::new(Tensor::from_data(TensorData::new(image, [h * w]), &dev), h, w, &cfg, &dev);
    let mut differs_from_including_centre = 0;
    for step in [0, 1, 99] {
        let batch = masker.batch(step);
        let input = floats(batch.input);
        let target = floats(batch.target);
        let mask = floats(batch.loss_mask);
        let centres = ints(batch.centres);
        assert_eq!(centres.len(), b * g * g);
        assert_eq!(mask.iter().filter(|&&m| m == 1.0).count(), b * g * g, "continuous values: every masked pixel changes");
        for k in 0..b {
            let mut distinct = std::collections::BTreeSet::new();
            let q = p as f64 / g as f64;
            for (m, &c) in centres[k * g * g..(k + 1) * g * g].iter().enumerate() {
                let c = c as usize;
                assert_eq!(c / (p * p), k, "centre in its own patch");
                let (y, x) = ((c % (p * p)) / p, c % p);
                // The m-th centre lies in box (m / g, m % g) of side P / g.
                let (i, j) = ((m / g) as f64, (m % g) as f64);
                assert!((i * q).floor() <= y as f64 && (y as f64) < (i + 1.0) * q, "row {y} in box row {i}");
                assert!((j * q).floor() <= x as f64 && (x as f64) < (j + 1.0) * q, "column {x} in box column {j}");
                distinct.insert((y, x));
                // The reference: the window shifted inside the patch, without the centre.
                let sy = y.saturating_sub(r / 2).min(p - r);
                let sx = x.saturating_sub(r / 2).min(p - r);
                let patch = &target[k * p * p..(k + 1) * p * p];
                let window: Vec<f32> = (0..r * r).map(|i| patch[(sy + i / r) * p + sx + i % r]).collect();
                let centre = (y - sy) * r + (x - sx);
                let want = median_without(&window, centre);
                assert_eq!(input[c], want, "step {step} patch {k} pixel ({y}, {x})");
                assert_eq!(mask[c], 1.0);
                let mut with_centre = window.clone();
                with_centre.sort_by(f32::total_cmp);
                if with_centre[(r * r - 1) / 2] != want {
                    differs_from_including_centre += 1;
                }
            }
            assert_eq!(distinct.len(), g * g, "{g}×{g} distinct masked pixels in patch {k}");
        }
        // Only the masked pixels changed.
        let changed = input.iter().zip(&target).filter(|(a, b)| a != b).count();
        assert_eq!(changed, b * g * g);
    }
    assert!(differs_from_including_centre > 0, "the test tells a median with the centre from one without");
}

#[test]
fn the_loss_mask_leaves_out_pixels_the_replacement_did_not_change() {
    // A constant image: every median equals the pixel it replaces, nothing changes, nothing
    // counts (CAREamics: mask = manipulated != original).
    let dev = Device::flex();
    let (h, w) = (80, 80);
    let cfg = config(32, 4);
    let masker = Masker::new(Tensor::from_data(TensorData::new(vec![3.5f32; h * w], [h * w]), &dev), h, w, &cfg, &dev);
    let batch = masker.batch(0);
    assert!(floats(batch.loss_mask).iter().all(|&m| m == 0.0));
    let loss = floats(hcsflow_n2v::masked_mse(batch.input.clone(), batch.target.clone(), Tensor::zeros([4, 1, 32, 32], &dev)));
    assert_eq!(loss, vec![0.0], "no counted pixel: loss 0, not NaN");
}
