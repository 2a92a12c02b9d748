//! Percentile normalisation against numpy: percentiles bit-identical to
//! np.percentile (u8/u16) / np.nanpercentile (f32); normalised integer
//! outputs identical to numpy's float64 formula rounded to nearest.

use crate::common;

use common::{assert_close, assert_exact, cells_stack, random_stack, run_registered as run, Oracle};
use hcsflow_core::{DType, Stack};
use hcsflow_ops::histogram::{percentiles_f32, percentiles_int};
use hcsflow_ops::normalize::{percentile_normalize, PercentileNormalize};
use ndarray::{Array3, ArrayD};
use serde_json::json;

fn inputs() -> Vec<(String, Stack)> {
    let mut v = Vec::new();
    for dtype in DType::ALL {
        v.push((format!("{dtype} random 3x17x33"), random_stack(dtype, [3, 17, 33], 1)));
        v.push((format!("{dtype} cells 2x64x61"), cells_stack(dtype, [2, 64, 61], 2)));
        v.push((format!("{dtype} 1 pixel"), random_stack(dtype, [1, 1, 1], 3)));
        v.push((format!("{dtype} constant"), Stack::from_f32_array(Array3::from_elem((2, 5, 5), 77.0), dtype)));
        // Few distinct values: percentiles fall between equal neighbours.
        let few = Stack::from_f32_array(Array3::from_shape_fn((1, 9, 11), |(_, y, x)| ((y * 3 + x) % 4) as f32 * 10.0), dtype);
        v.push((format!("{dtype} four values"), few));
    }
    // Planes large enough for the sampled-window route of integer percentiles
    // (≥ 2¹⁸ pixels), one of them camera-like: a noisy dark background.
    for dtype in [DType::U8, DType::U16] {
        v.push((format!("{dtype} cells 2x600x701"), cells_stack(dtype, [2, 600, 701], 4)));
    }
    let Stack::U16(noise) = random_stack(DType::U16, [1, 640, 480], 5) else { unreachable!() };
    let camera = Array3::from_shape_fn((1, 640, 480), |(z, y, x)| {
        let blob = ((y as f32 * 0.05).sin() * (x as f32 * 0.043).cos()).max(0.0).powi(3);
        (180 + noise[[z, y, x]] % 401) as f32 + 3800.0 * blob
    });
    v.push(("u16 camera 1x640x480".to_string(), Stack::from_f32_array(camera, DType::U16)));
    v
}

/// numpy's float64 result as our dtype delivers it: rounded to nearest and
/// clipped for integers, rounded to f32 for f32.
fn as_dtype(r: &ArrayD<f64>, dtype: DType) -> ArrayD<f64> {
    match dtype.integer_range() {
        Some((_, max)) => r.mapv(|v| v.round_ties_even().clamp(0.0, max as f64)),
        None => r.mapv(|v| v as f32 as f64),
    }
}

fn percentiles_of(s: &Stack, ps: &[f64]) -> Vec<f64> {
    match s {
        Stack::U8(a) => percentiles_int(a.pixels(), ps),
        Stack::U16(a) => percentiles_int(a.pixels(), ps),
        Stack::F32(a) => percentiles_f32(a.pixels(), ps),
    }
    .unwrap()
}

#[test]
fn percentiles_are_bit_identical_to_numpy() {
    let Some(mut oracle) = Oracle::new() else { return };
    // Many percentiles at once take the full histogram; one or two pairs take
    // the sampled windows on large integer inputs.
    let sets: [&[f64]; 3] = [&[0.0, 0.1, 1.0, 2.5, 33.3, 50.0, 98.7, 99.0, 99.9, 100.0], &[1.0, 99.0], &[0.0, 5.0, 95.0]];
    let mut jobs = Vec::new();
    for (name, s) in inputs() {
        for ps in sets {
            let j = oracle.add("percentiles", &[&s], json!({"q": ps}));
            jobs.push((name.clone(), s.clone(), ps, j));
        }
    }
    let refs = oracle.run();
    for (name, s, ps, j) in jobs {
        let ours = percentiles_of(&s, ps);
        for (i, (a, b)) in ours.iter().zip(refs[j].iter()).enumerate() {
            assert_eq!(a.to_bits(), b.to_bits(), "{name}: percentile {} is {a}, numpy says {b}", ps[i]);
        }
    }
}

#[test]
fn normalisation_matches_numpy_per_slice_and_whole_stack() {
    let Some(mut oracle) = Oracle::new() else { return };
    let settings: [(&[&str], serde_json::Value); 3] = [
        (&[], json!({"low_percentile": 1.0, "high_percentile": 99.0, "target_min": 0.0, "target_max": 65535.0})),
        (
            &["low_percentile=5", "high_percentile=95", "target_max=255"],
            json!({"low_percentile": 5.0, "high_percentile": 95.0, "target_min": 0.0, "target_max": 255.0}),
        ),
        (
            &["low_percentile=0", "high_percentile=100", "target_min=1000", "target_max=3"],
            json!({"low_percentile": 0.0, "high_percentile": 100.0, "target_min": 1000.0, "target_max": 3.0}),
        ),
    ];
    let mut jobs = Vec::new();
    for (name, s) in inputs() {
        for (k, (texts, kw)) in settings.iter().enumerate() {
            let whole = oracle.add("percentile_normalize_stack", &[&s], kw.clone());
            let slices = oracle.add("percentile_normalize_slices", &[&s], kw.clone());
            jobs.push((name.clone(), s.clone(), k, *texts, whole, slices));
        }
    }
    let refs = oracle.run();
    for (name, s, k, texts, whole, slices) in jobs {
        let w = run("stack_percentile_normalize", texts, &s);
        let p = run("percentile_normalize", texts, &s);
        assert_eq!(w.dtype(), s.dtype());
        let what = format!("{name} setting {k}");
        if s.dtype() == DType::F32 {
            // Our f64 value rounded once to f32.
            assert_close(&w, &as_dtype(&refs[whole], DType::F32), 0.0, 0.0, &format!("stack {what}"));
            assert_close(&p, &as_dtype(&refs[slices], DType::F32), 0.0, 0.0, &format!("slices {what}"));
        } else {
            assert_exact(&w, &as_dtype(&refs[whole], s.dtype()), &format!("stack {what}"));
            assert_exact(&p, &as_dtype(&refs[slices], s.dtype()), &format!("slices {what}"));
        }
    }
}

#[test]
fn bad_percentile_order_and_empty_input_are_errors() {
    let s = random_stack(DType::U16, [1, 4, 4], 9);
    let p = PercentileNormalize { low_percentile: 90.0, high_percentile: 10.0, ..Default::default() };
    let err = percentile_normalize(&s, &p).unwrap_err().to_string();
    assert_eq!(err, "percentile_normalize: low_percentile (90) must not exceed high_percentile (10)");
    let nan = Stack::from(Array3::<f32>::from_elem((1, 2, 2), f32::NAN));
    let err = percentile_normalize(&nan, &Default::default()).unwrap_err().to_string();
    assert!(err.contains("no pixels (or only NaN)"), "{err}");
    // NaN pixels are ignored by the percentiles and stay NaN.
    let mut a = Array3::from_shape_fn((1, 3, 3), |(_, y, x)| (y * 3 + x) as f32);
    a[[0, 1, 1]] = f32::NAN;
    let Stack::F32(out) = percentile_normalize(
        &Stack::from(a),
        &PercentileNormalize { low_percentile: 0.0, high_percentile: 100.0, target_min: 0.0, target_max: 8.0 },
    )
    .unwrap() else {
        panic!()
    };
    assert!(out[[0, 1, 1]].is_nan());
    assert_eq!(out[[0, 2, 2]], 8.0);
    assert_eq!(out[[0, 0, 0]], 0.0);
}
