//! hcsflow-basic against its references: the DCT against scipy, the resize
//! against torch, the fit against a float64 NumPy transcription of BaSiCPy
//! 2.0's algorithm (tests/oracle/basic_oracle.py) and against BaSiCPy's
//! reference results on real data, a synthetic ground truth, profile files
//! and bad input.

use std::path::{Path, PathBuf};

use hcsflow_basic::dct::Dct2d;
use hcsflow_basic::profiles::{ffp_dfp_paths, read_ffp_dfp, read_profile, write_ffp_dfp, write_profile};
use hcsflow_basic::{correct, fit, fit_working, BasicError, BasicParams, Interpolation, Profiles, Resampler};
use hcsflow_bench::{read_npy, write_npy};
use hcsflow_core::{DType, Stack};
use hcsflow_testkit::oracle::{require, Oracle};
use hcsflow_testkit::{random_stack, Rng};
use ndarray::{Array2, Array3};

const PIP: &str = "pip install -r .ci/requirements-oracles.txt";

fn oracle(modules: &[&str]) -> Option<(Oracle, String)> {
    let script = Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/oracle/basic_oracle.py");
    require(modules, PIP).map(|o| (o, script.to_string_lossy().into_owned()))
}

fn f32s(stack: &Stack) -> Vec<f32> {
    stack.to_f32().iter().copied().collect()
}

/// The shared BaSiCPy data folder (`HCSFLOW_BASICPY_DATA`, else `shared/data/basicpy` beside an ancestor).
fn basicpy_data() -> PathBuf {
    if let Some(dir) = std::env::var_os("HCSFLOW_BASICPY_DATA") {
        return PathBuf::from(dir);
    }
    let repo = Path::new(env!("CARGO_MANIFEST_DIR")).join("../..");
    let candidates = repo.ancestors().map(|a| a.join("shared/data/basicpy")).chain([PathBuf::from("/work/shared/data/basicpy")]);
    let found = candidates.into_iter().find(|c| c.is_dir());
    found.unwrap_or_else(|| panic!("../shared/data/basicpy not found beside {}; set HCSFLOW_BASICPY_DATA", repo.display()))
}

/// `(max, mean)` of `|a − b| / |b|`.
fn relative_errors(a: &[f32], b: &[f32]) -> (f64, f64) {
    let errors: Vec<f64> = a.iter().zip(b).map(|(&x, &y)| (f64::from(x) - f64::from(y)).abs() / f64::from(y).abs().max(1e-12)).collect();
    (errors.iter().copied().fold(0.0, f64::max), errors.iter().sum::<f64>() / errors.len() as f64)
}

#[test]
fn dct_matches_scipy_ortho() {
    let Some((python, script)) = oracle(&["numpy", "scipy"]) else { return };
    let dir = tempfile::tempdir().unwrap();
    for (h, w) in [(128, 128), (16, 16), (7, 12), (1, 5), (33, 2)] {
        let input = random_stack(DType::F32, [2, h, w], (h * 100 + w) as u64);
        let (src, fwd, inv) = (dir.path().join("x.npy"), dir.path().join("f.npy"), dir.path().join("i.npy"));
        write_npy(&src, &input).unwrap();
        python.run([&script, "dct", src.to_str().unwrap(), fwd.to_str().unwrap()]);
        python.run([&script, "idct", src.to_str().unwrap(), inv.to_str().unwrap()]);
        let (want_f, want_i) = (f32s(&read_npy(&fwd).unwrap()), f32s(&read_npy(&inv).unwrap()));
        let mut plan = Dct2d::new(h, w);
        let values = f32s(&input);
        let scale = values.iter().fold(0f32, |m, v| m.max(v.abs()));
        for z in 0..2 {
            let plane = &values[z * h * w..(z + 1) * h * w];
            let (mut f, mut i) = (plane.to_vec(), plane.to_vec());
            plan.forward(&mut f);
            plan.inverse(&mut i);
            for (k, (a, b)) in f.iter().zip(&want_f[z * h * w..]).chain(i.iter().zip(&want_i[z * h * w..])).enumerate() {
                assert!((a - b).abs() <= 2e-6 * scale * (h * w) as f32, "{h}x{w} plane {z} value {k}: {a} vs {b}");
            }
            // Round trip.
            plan.inverse(&mut f);
            f.iter().zip(plane).for_each(|(a, b)| assert!((a - b).abs() <= 1e-5 * scale, "{a} vs {b}"));
        }
    }
}

#[test]
fn resize_matches_torch_interpolate() {
    let Some((python, script)) = oracle(&["numpy", "torch"]) else { return };
    let dir = tempfile::tempdir().unwrap();
    let cases = [
        ((1024, 1024), (128, 128), true),
        ((300, 517), (128, 128), true),
        ((64, 80), (128, 128), true),
        ((128, 128), (128, 128), true),
        ((128, 128), (1024, 1000), false),
        ((17, 9), (40, 31), false),
    ];
    for (k, ((ih, iw), (oh, ow), antialias)) in cases.into_iter().enumerate() {
        let input = random_stack(DType::U16, [2, ih, iw], 7 + k as u64);
        let (src, dst) = (dir.path().join("x.npy"), dir.path().join("y.npy"));
        write_npy(&src, &input).unwrap();
        let aa = if antialias { "1" } else { "0" };
        python.run([&script, "resize", src.to_str().unwrap(), dst.to_str().unwrap(), &oh.to_string(), &ow.to_string(), aa]);
        let want = f32s(&read_npy(&dst).unwrap());
        let mode = if antialias { Interpolation::Antialiased } else { Interpolation::AlignCorners };
        let ours = Resampler::new((ih, iw), (oh, ow), mode).resize_stack(&input);
        assert_eq!(ours.len(), want.len());
        let worst = ours.iter().zip(&want).map(|(a, b)| (a - b).abs()).fold(0f32, f32::max);
        // u16 values up to 65535: 1e-5 relative of the range.
        assert!(worst <= 0.7, "{ih}x{iw} -> {oh}x{ow} antialias={antialias}: max |diff| {worst}");
    }
}

/// Random scenes `n × h × w` (small Gaussian "cells" over a floor, a sparse
/// foreground as BaSiC assumes) times `shading`, plus `offset`.
fn shaded_tiles(n: usize, h: usize, w: usize, shading: &Array2<f32>, offset: f32, seed: u64) -> Array3<f32> {
    let mut rng = Rng::new(seed);
    let mut out = Array3::<f32>::zeros((n, h, w));
    for i in 0..n {
        let blobs: Vec<(f64, f64, f64, f64)> = (0..40)
            .map(|_| (rng.unit() * h as f64, rng.unit() * w as f64, 1.5 + rng.unit() * h as f64 / 64.0, 200.0 + rng.unit() * 800.0))
            .collect();
        for y in 0..h {
            for x in 0..w {
                let near = blobs.iter().filter(|&&(cy, cx, r, _)| (y as f64 - cy).abs() < 4.0 * r && (x as f64 - cx).abs() < 4.0 * r);
                let scene: f64 = 300.0
                    + near
                        .map(|&(cy, cx, r, a)| a * (-((y as f64 - cy).powi(2) + (x as f64 - cx).powi(2)) / (2.0 * r * r)).exp())
                        .sum::<f64>();
                out[[i, y, x]] = (scene as f32) * shading[[y, x]] + offset;
            }
        }
    }
    out
}

fn vignetting(h: usize, w: usize) -> Array2<f32> {
    let mut s = Array2::from_shape_fn((h, w), |(y, x)| {
        let (dy, dx) = ((y as f32 - h as f32 * 0.45) / h as f32, (x as f32 - w as f32 * 0.55) / w as f32);
        1.0 - 0.8 * (dy * dy + dx * dx)
    });
    let m = s.mean().unwrap_or(1.0);
    s.mapv_inplace(|v| v / m);
    s
}

#[test]
fn fit_matches_float64_transcription() {
    let Some((python, script)) = oracle(&["numpy", "scipy"]) else { return };
    let dir = tempfile::tempdir().unwrap();
    // 16²: one pixel chunk of whole SIMD blocks; 23 × 29 (667 pixels): a full
    // chunk of 512 and one of 155, which ends in a partial block.
    for (h, w) in [(16, 16), (23, 29)] {
        let p = h * w;
        let shading = vignetting(h, w);
        let tiles = Stack::from(shaded_tiles(8, h, w, &shading, 0.0, 3));
        let src = dir.path().join("tiles.npy");
        write_npy(&src, &tiles).unwrap();
        for (label, params, json) in [
            ("one ADMM solve", BasicParams { max_reweight_iterations: 1, ..Default::default() }, r#"{"max_reweight_iterations": 1}"#),
            ("re-weighted", BasicParams::default(), "{}"),
            (
                "fixed smoothness, sorted",
                BasicParams { smoothness_flatfield: Some(1.0), sort_intensity: true, ..Default::default() },
                r#"{"smoothness_flatfield": 1.0, "sort_intensity": true}"#,
            ),
            ("dark-field", BasicParams { get_darkfield: true, ..Default::default() }, r#"{"get_darkfield": true}"#),
        ] {
            let out = dir.path().join("fit.npy");
            python.run([&script, "fit", src.to_str().unwrap(), out.to_str().unwrap(), json]);
            let want = f32s(&read_npy(&out).unwrap());
            let want_baseline = f32s(&read_npy(&dir.path().join("fit.npy.baseline.npy")).unwrap());
            let ours = fit_working(&f32s(&tiles), 8, h, w, &params).unwrap();
            let (flat_max, _) = relative_errors(&ours.flatfield, &want[..p]);
            let dark_scale = want[p..].iter().fold(1f32, |m, v| m.max(v.abs()));
            let dark_max = ours.darkfield.iter().zip(&want[p..]).map(|(a, b)| (a - b).abs() / dark_scale).fold(0f32, f32::max);
            let (base_max, _) = relative_errors(&ours.baseline, &want_baseline);
            println!(
                "{h}x{w} {label}: flat {flat_max:.2e}, dark {dark_max:.2e}, baseline {base_max:.2e}, {} rounds",
                ours.reweight_iterations
            );
            assert!(
                flat_max < 1e-4 && dark_max < 1e-4 && base_max < 1e-4,
                "{h}x{w} {label}: flat {flat_max}, dark {dark_max}, baseline {base_max}"
            );
        }
    }
}

/// The reference results of BaSiCPy's repository on `wsi_brain.npz`.
#[test]
fn conformance_on_wsi_brain() {
    let Some((python, script)) = oracle(&["numpy"]) else { return };
    let data = basicpy_data();
    let dir = tempfile::tempdir().unwrap();
    let images = dir.path().join("images.npy");
    python.run([&script, "npz", data.join("wsi_brain.npz").to_str().unwrap(), "images", images.to_str().unwrap()]);
    let tiles = read_npy(&images).unwrap();
    assert_eq!(tiles.shape(), [63, 128, 128]);
    // BaSiCPy's compare_with_reference_impl notebook: approximate mode, sort_intensity=True.
    for (suffix, dark) in [("-flatonly", false), ("", true)] {
        let params = BasicParams { get_darkfield: dark, sort_intensity: true, ..Default::default() };
        let ours = fit(&tiles, &params).unwrap();
        let want = f32s(&read_npy(&data.join(format!("reference/wsi_brain__flatfield{suffix}.npy"))).unwrap());
        let m = want.iter().map(|&v| f64::from(v)).sum::<f64>() / want.len() as f64;
        let want: Vec<f32> = want.iter().map(|&v| (f64::from(v) / m) as f32).collect();
        let flat: Vec<f32> = ours.profiles.flatfield.iter().copied().collect();
        let (max, mean) = relative_errors(&flat, &want);
        let dark_ref = f32s(&read_npy(&data.join(format!("reference/wsi_brain__darkfield{suffix}.npy"))).unwrap());
        let dark_diff = ours.profiles.darkfield.iter().zip(&dark_ref).map(|(a, b)| (a - b).abs()).fold(0f32, f32::max);
        println!(
            "wsi_brain dark={dark}: flat-field max {:.3} %, mean {:.3} %; dark-field max |diff| {dark_diff:.2} (reference range {:.1}..{:.1}); {} rounds, {} ADMM iterations",
            max * 100.0,
            mean * 100.0,
            dark_ref.iter().copied().fold(f32::INFINITY, f32::min),
            dark_ref.iter().copied().fold(f32::NEG_INFINITY, f32::max),
            ours.working.reweight_iterations,
            ours.working.admm_iterations
        );
        // BaSiCPy 2.0.0 itself (same settings, this data, measured beside this test):
        // flat-only max 0.79 %, mean 0.17 %; with the dark-field max 6.41 %, mean 1.20 %.
        // The issue's 1 % / 5 % holds for the flat-only fit; with the dark-field we hold
        // ourselves to BaSiCPy's own distance from its reference.
        let (max_allowed, mean_allowed) = if dark { (0.07, 0.013) } else { (0.05, 0.01) };
        assert!(mean < mean_allowed && max < max_allowed, "dark={dark}: flat-field relative error max {max}, mean {mean}");
        assert_eq!(ours.warnings.iter().any(|w| w.contains("dark-field")), dark);
    }
}

#[test]
fn synthetic_shading_is_recovered() {
    let (h, w) = (256, 256);
    let shading = vignetting(h, w);
    let tiles = Stack::from(shaded_tiles(40, h, w, &shading, 0.0, 11).mapv(|v| v.round() as u16));
    let ours = fit(&tiles, &BasicParams::default()).unwrap();
    let flat: Vec<f32> = ours.profiles.flatfield.iter().copied().collect();
    let truth: Vec<f32> = shading.iter().copied().collect();
    let (max, mean) = relative_errors(&flat, &truth);
    println!("synthetic 40x256²: flat-field max {:.2} %, mean {:.2} %", max * 100.0, mean * 100.0);
    assert!(max < 0.02, "max relative error {max}");
    // The correction flattens the shading: the corrected mean image varies less.
    let corrected = correct(&tiles, &ours.profiles, 0.0, None).unwrap();
    let spread = |s: &Stack| {
        let a = s.to_f32();
        let m = a.mean_axis(ndarray::Axis(0)).unwrap();
        let (lo, hi) = m.iter().fold((f32::MAX, f32::MIN), |(lo, hi), &v| (lo.min(v), hi.max(v)));
        hi / lo
    };
    assert!(spread(&corrected) < spread(&tiles), "{} vs {}", spread(&corrected), spread(&tiles));
}

#[test]
fn correction_subtracts_offset_and_darkfield_then_divides() {
    let tiles = random_stack(DType::U16, [3, 5, 7], 9);
    let flat = Array2::from_shape_fn((5, 7), |(y, x)| 0.5 + (y * 7 + x) as f32 / 35.0);
    let dark = Array2::from_shape_fn((5, 7), |(y, x)| (y + x) as f32);
    let profiles = Profiles { flatfield: flat.clone(), darkfield: dark.clone() };
    let out = correct(&tiles, &profiles, 100.0, Some(&[1.0, 2.0, 3.0])).unwrap();
    assert_eq!(out.dtype(), DType::F32);
    let (a, b) = (tiles.to_f32(), out.to_f32());
    for ((z, y, x), &v) in b.indexed_iter() {
        let want = (a[[z, y, x]] - 100.0 - dark[[y, x]]) / flat[[y, x]] - (z + 1) as f32;
        assert!((v - want).abs() <= 1e-3 * want.abs().max(1.0), "{v} vs {want}");
    }
    let small = Profiles::flat_only(Array2::ones((4, 7)));
    assert!(matches!(correct(&tiles, &small, 0.0, None), Err(BasicError::Shape { .. })));
    assert!(matches!(correct(&tiles, &profiles, 0.0, Some(&[1.0])), Err(BasicError::Shape { .. })));
}

#[test]
fn profile_files_round_trip() {
    let dir = tempfile::tempdir().unwrap();
    let a = Profiles {
        flatfield: Array2::from_shape_fn((6, 9), |(y, x)| 0.8 + (y + x) as f32 * 0.01),
        darkfield: Array2::from_elem((6, 9), 101.5),
    };
    let b = Profiles::flat_only(Array2::from_elem((6, 9), 1.25));
    let path = dir.path().join("flat.tif");
    write_profile(&path, &a.flatfield).unwrap();
    assert_eq!(read_profile(&path, (6, 9)).unwrap(), a.flatfield);
    let (ffp, dfp) = write_ffp_dfp(dir.path(), "cycle1", &[a.clone(), b.clone()]).unwrap();
    assert_eq!((ffp.clone(), dfp.clone()), ffp_dfp_paths(dir.path(), "cycle1"));
    assert!(ffp.ends_with("cycle1-ffp.tiff") && dfp.ends_with("cycle1-dfp.tiff"));
    assert_eq!(read_ffp_dfp(&ffp, Some(&dfp), 0, (6, 9)).unwrap(), a);
    assert_eq!(read_ffp_dfp(&ffp, Some(&dfp), 1, (6, 9)).unwrap(), b);
    assert_eq!(read_ffp_dfp(&ffp, None, 1, (6, 9)).unwrap().darkfield, Array2::<f32>::zeros((6, 9)));
    // The wrong size names the file and both sizes.
    let e = read_ffp_dfp(&ffp, Some(&dfp), 0, (512, 512)).unwrap_err();
    assert!(matches!(e, BasicError::ProfileSize { profile: (6, 9), image: (512, 512), .. }), "{e}");
    let text = e.to_string();
    assert!(text.contains("cycle1-ffp.tiff") && text.contains("6x9") && text.contains("512x512"), "{text}");
    // A missing channel, a multi-page file as one profile, a non-positive flat-field.
    assert!(matches!(read_ffp_dfp(&ffp, None, 2, (6, 9)), Err(BasicError::ProfileContent { .. })));
    assert!(matches!(read_profile(&ffp, (6, 9)), Err(BasicError::ProfileContent { .. })));
    write_profile(&path, &Array2::zeros((6, 9))).unwrap();
    let e = read_ffp_dfp(&path, None, 0, (6, 9)).unwrap_err();
    assert!(e.to_string().contains("positive"), "{e}");
}

#[test]
fn bad_input_gets_clear_errors() {
    let one = random_stack(DType::U16, [1, 32, 32], 1);
    let e = fit(&one, &BasicParams::default()).unwrap_err();
    assert!(matches!(e, BasicError::TooFewImages { got: 1 }));
    assert!(e.to_string().contains("at least 2 images"), "{e}");
    let zeros = Stack::zeros(DType::U16, [3, 16, 16]);
    assert!(matches!(fit(&zeros, &BasicParams::default()), Err(BasicError::AllZero)));
    let mut nan = Array3::<f32>::ones((3, 8, 8));
    nan[[2, 1, 1]] = f32::NAN;
    assert!(matches!(
        fit(&Stack::from(nan), &BasicParams { working_size: 8, ..Default::default() }),
        Err(BasicError::NotFinite { image: 2 })
    ));
    assert!(matches!(
        fit(&random_stack(DType::U8, [3, 8, 8], 2), &BasicParams { working_size: 1, ..Default::default() }),
        Err(BasicError::WorkingSize(1))
    ));
}

/// `camera_offset` is subtracted before the fit: tiles with a bias of 100
/// counts fitted with `camera_offset = 100` give the profiles of the tiles
/// without it, and fitted without it a flatter (wrong) flat-field.
#[test]
fn camera_offset_is_subtracted_before_the_fit() {
    let (h, w) = (64, 64);
    let shading = vignetting(h, w);
    let clean = shaded_tiles(12, h, w, &shading, 0.0, 5);
    let biased = clean.mapv(|v| v + 100.0);
    let params = BasicParams { working_size: 32, ..Default::default() };
    let want = fit(&Stack::from(clean), &params).unwrap();
    let got = fit(&Stack::from(biased.clone()), &BasicParams { camera_offset: 100.0, ..params.clone() }).unwrap();
    let flat = |f: &hcsflow_basic::BasicFit| f.profiles.flatfield.iter().copied().collect::<Vec<f32>>();
    let (max, _) = relative_errors(&flat(&got), &flat(&want));
    assert!(max < 1e-4, "with the offset subtracted: max relative difference {max}");
    let ignored = fit(&Stack::from(biased), &params).unwrap();
    let range = |v: &[f32]| v.iter().fold(f32::MIN, |m, &x| m.max(x)) - v.iter().fold(f32::MAX, |m, &x| m.min(x));
    assert!(range(&flat(&ignored)) < 0.9 * range(&flat(&want)), "a bias left in flattens the fitted shading");
}
