//! hcsflow-decon against its references: scikit-image's `richardson_lucy`
//! (clip=False) for the "same" boundary, a NumPy FFT transcription for the
//! circular one (tests/oracle/decon_oracle.py), a centred point source, beads
//! with Poisson noise (FWHM), Biggs–Andrews acceleration, and bad input.

use std::path::{Path, PathBuf};

use hcsflow_bench::{read_npy, write_npy};
use hcsflow_core::{DType, Stack};
use hcsflow_decon::{richardson_lucy, Boundary, DeconError, Method, Psf, RlParams};
use hcsflow_testkit::oracle::{require, Oracle};
use hcsflow_testkit::Rng;
use ndarray::{Array3, ArrayView3};

const PIP: &str = "pip install -r .ci/requirements-oracles.txt";

fn oracle(modules: &[&str]) -> Option<(Oracle, String)> {
    let script = Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/oracle/decon_oracle.py");
    require(modules, PIP).map(|o| (o, script.to_string_lossy().into_owned()))
}

fn save(path: &Path, a: &Array3<f32>) {
    let (z, y, x) = a.dim();
    write_npy(path, &Stack::from_vec([z, y, x], a.iter().copied().collect()).unwrap()).unwrap();
}

fn load(path: &Path) -> Array3<f32> {
    let s = read_npy(path).unwrap();
    assert_eq!(s.dtype(), DType::F32);
    s.to_f32()
}

/// A positive random image: background 5 plus a few bright random blobs, then noise.
fn random_image(shape: [usize; 3], seed: u64) -> Array3<f32> {
    let mut rng = Rng::new(seed);
    let mut a = Array3::from_shape_fn((shape[0], shape[1], shape[2]), |_| 5.0 + rng.unit() as f32);
    for _ in 0..6 {
        let c = [rng.below(shape[0]), rng.below(shape[1]), rng.below(shape[2])];
        let v = 50.0 + 100.0 * rng.unit() as f32;
        a[c] += v;
    }
    a
}

/// An asymmetric positive PSF (so a wrong adjoint, which equals the right one
/// for symmetric PSFs, shows), peak in the middle voxel.
fn asymmetric_psf(shape: [usize; 3], seed: u64) -> Array3<f32> {
    let mut rng = Rng::new(seed);
    let mut a = Array3::from_shape_fn((shape[0], shape[1], shape[2]), |(z, y, x)| {
        let d = (z as f32 - (shape[0] / 2) as f32).powi(2) + (y as f32 - (shape[1] / 2) as f32).powi(2) * 0.5 + x as f32 * 0.3;
        (-d / 4.0).exp() * (0.5 + rng.unit() as f32)
    });
    a[[shape[0] / 2, shape[1] / 2, shape[2] / 2]] += 3.0;
    a
}

/// `max |a − b| / max |b|`, and `‖a − b‖₂ / ‖b‖₂`.
fn relative_error(a: ArrayView3<f32>, b: ArrayView3<f32>) -> (f64, f64) {
    assert_eq!(a.dim(), b.dim());
    let scale = b.iter().fold(0.0f64, |m, &v| m.max(f64::from(v).abs()));
    let max = a.iter().zip(b).fold(0.0f64, |m, (&x, &y)| m.max((f64::from(x) - f64::from(y)).abs()));
    let num: f64 = a.iter().zip(b).map(|(&x, &y)| (f64::from(x) - f64::from(y)).powi(2)).sum();
    let den: f64 = b.iter().map(|&y| f64::from(y).powi(2)).sum();
    (max / scale, (num / den).sqrt())
}

/// Runs the oracle's `cmd` (skimage or circular) on `image` and `psf`.
fn reference(python: &Oracle, script: &str, cmd: &str, image: &Array3<f32>, psf: &Array3<f32>, iterations: usize) -> Array3<f32> {
    let dir = tempfile::tempdir().unwrap();
    let (i, p, o) = (dir.path().join("image.npy"), dir.path().join("psf.npy"), dir.path().join("out.npy"));
    save(&i, image);
    save(&p, psf);
    let path = |p: &PathBuf| p.to_str().unwrap().to_string();
    python.run([script, cmd, &path(&i), &path(&p), &path(&o), &iterations.to_string()]);
    load(&o)
}

fn params(boundary: Boundary) -> RlParams {
    RlParams { iterations: 10, boundary, ..RlParams::default() }
}

/// RL with each method that applies to `psf` (direct convolution only for a
/// separable one): `(method, result)`.
fn each_method(image: &Array3<f32>, psf: &Psf, p: RlParams) -> Vec<(Method, Array3<f32>)> {
    let mut out = vec![(Method::Fft, richardson_lucy(image.view(), psf, &RlParams { method: Method::Fft, ..p }).unwrap())];
    match richardson_lucy(image.view(), psf, &RlParams { method: Method::Separable, ..p }) {
        Ok(r) => out.push((Method::Separable, r)),
        Err(DeconError::Params(e)) => assert!(e.contains("not separable"), "{e}"),
        Err(e) => panic!("{e}"),
    }
    out
}

#[test]
fn same_boundary_matches_scikit_image_in_3d_and_2d() {
    let Some((python, script)) = oracle(&["numpy", "scipy", "skimage"]) else { return };
    let cases: [([usize; 3], Array3<f32>); 4] = [
        // 3D, sizes that are not FFT-friendly, an asymmetric PSF
        ([13, 37, 29], asymmetric_psf([5, 7, 3], 1)),
        // 3D with a Gaussian PSF as large as the image along z
        ([11, 24, 30], Psf::gaussian([1.6, 1.2, 1.0]).unwrap().view().to_owned()),
        // 2D: a one-plane image and PSF
        ([1, 61, 50], asymmetric_psf([1, 9, 7], 2)),
        // a stack with a one-plane PSF: each plane on its own
        ([4, 33, 40], asymmetric_psf([1, 5, 9], 3)),
    ];
    for (k, (shape, psf_array)) in cases.iter().enumerate() {
        let image = random_image(*shape, 10 + k as u64);
        let psf = Psf::new(psf_array.clone(), "test").unwrap();
        let want = reference(&python, &script, "skimage", &image, psf_array, 10);
        for (method, got) in each_method(&image, &psf, params(Boundary::Same)) {
            let (max, l2) = relative_error(got.view(), want.view());
            println!("case {k} {shape:?} psf {:?} {method:?}: max rel error {max:.2e}, L2 rel error {l2:.2e}", psf.shape());
            assert!(max <= 1e-4, "case {k} {method:?}: {max:.3e} > 1e-4 against skimage");
        }
    }
}

#[test]
fn circular_boundary_matches_a_numpy_fft_transcription() {
    let Some((python, script)) = oracle(&["numpy"]) else { return };
    // a prime size along y and x (a Bluestein transform), an even one along z
    let cases = [
        ([12, 31, 29], asymmetric_psf([5, 7, 3], 30)),
        ([1, 40, 33], asymmetric_psf([1, 9, 5], 31)),
        ([9, 16, 18], asymmetric_psf([9, 3, 5], 32)),
        // separable: also by direct convolution, wrapped
        ([12, 23, 26], Psf::gaussian([1.5, 1.2, 2.0]).unwrap().view().to_owned()),
    ];
    for (k, (shape, psf_array)) in cases.into_iter().enumerate() {
        let image = random_image(shape, 20 + k as u64);
        let psf = Psf::new(psf_array.clone(), "test").unwrap();
        let want = reference(&python, &script, "circular", &image, &psf_array, 10);
        for (method, got) in each_method(&image, &psf, params(Boundary::Circular)) {
            let (max, l2) = relative_error(got.view(), want.view());
            println!("circular case {k} {shape:?} {method:?}: max rel error {max:.2e}, L2 rel error {l2:.2e}");
            assert!(max <= 1e-4, "case {k} {method:?}: {max:.3e} > 1e-4 against the NumPy transcription");
        }
    }
}

/// Intensity-weighted centroid `(z, y, x)` of the voxels within `r` of `c` (a window symmetric about `c`).
fn centroid(a: ArrayView3<f32>, c: [usize; 3], r: usize) -> [f64; 3] {
    let mut s = [0.0f64; 4];
    for ((z, y, x), &v) in a.indexed_iter() {
        if z.abs_diff(c[0]) > r || y.abs_diff(c[1]) > r || x.abs_diff(c[2]) > r {
            continue;
        }
        let v = f64::from(v);
        s[0] += v * z as f64;
        s[1] += v * y as f64;
        s[2] += v * x as f64;
        s[3] += v;
    }
    [s[0] / s[3], s[1] / s[3], s[2] / s[3]]
}

/// The ≈0.3-voxel trap (references-wave2.md §3.3): a centred point source,
/// blurred by a centred Gaussian, stays centred to < 0.01 voxel after 10 and
/// 50 iterations, in both boundary models, with and without acceleration.
#[test]
fn a_centred_point_source_stays_centred() {
    let psf = Psf::gaussian([2.5, 1.5, 1.5]).unwrap();
    let (kz, ky, kx) = psf.view().dim();
    let mut image = Array3::from_elem((32, 64, 64), 1e-3f32);
    let centre = [16usize, 32, 32];
    for ((z, y, x), &v) in psf.view().indexed_iter() {
        image[[centre[0] + z - kz / 2, centre[1] + y - ky / 2, centre[2] + x - kx / 2]] += 1000.0 * v;
    }
    for boundary in [Boundary::Same, Boundary::Circular] {
        for (iterations, acceleration) in [(10, false), (50, false), (10, true)] {
            let p = RlParams { iterations, boundary, acceleration, ..RlParams::default() };
            for (method, out) in each_method(&image, &psf, p) {
                let c = centroid(out.view(), centre, 8);
                println!("{boundary:?} {method:?} {iterations} it, acceleration {acceleration}: centroid {c:?}");
                for (got, want) in c.iter().zip(centre) {
                    assert!((got - want as f64).abs() < 0.01, "{boundary:?} {iterations} it: centroid {c:?}, want {centre:?}");
                }
                let peak = out.indexed_iter().fold(((0, 0, 0), f32::MIN), |m, (i, &v)| if v > m.1 { (i, v) } else { m });
                assert_eq!([peak.0 .0, peak.0 .1, peak.0 .2], centre);
            }
        }
    }
}

/// FWHM along x through `(z, y, x0)` of `a`, above the profile's minimum,
/// by linear interpolation of the half-maximum crossings.
fn fwhm_x(a: ArrayView3<f32>, z: usize, y: usize, x0: usize, half_window: usize) -> f64 {
    let profile: Vec<f64> = (x0 - half_window..=x0 + half_window).map(|x| f64::from(a[[z, y, x]])).collect();
    let base = profile.iter().cloned().fold(f64::MAX, f64::min);
    let c = half_window;
    let half = base + (profile[c] - base) / 2.0;
    let cross = |dir: isize| {
        let mut i = c as isize;
        loop {
            let j = i + dir;
            let (vi, vj) = (profile[i as usize], profile[j as usize]);
            if vj <= half {
                return (i as f64) + dir as f64 * (vi - half) / (vi - vj);
            }
            i = j;
        }
    };
    cross(1) - cross(-1)
}

/// Beads (small Gaussians) blurred by a known PSF with Poisson noise: the
/// lateral FWHM after Richardson–Lucy is smaller than the blurred one and
/// moves toward the true one, more with more iterations.
#[test]
fn beads_restored_fwhm_shrinks_toward_the_truth() {
    let Some((python, script)) = oracle(&["numpy", "scipy"]) else { return };
    let shape = (24usize, 72usize, 72usize);
    let beads = [(12usize, 18usize, 18usize), (12, 18, 54), (10, 54, 18), (14, 54, 54), (12, 36, 36)];
    let bead_sigma = 0.8f64;
    let photons = 4000.0f64;
    let background = 20.0f64;
    let truth = Array3::from_shape_fn(shape, |(z, y, x)| {
        let mut v = background;
        for &(bz, by, bx) in &beads {
            let d2 = ((z as f64 - bz as f64).powi(2) + (y as f64 - by as f64).powi(2) + (x as f64 - bx as f64).powi(2))
                / (2.0 * bead_sigma * bead_sigma);
            v += photons * (-d2).exp();
        }
        v as f32
    });
    let psf_array = Psf::gaussian([2.0, 1.6, 1.6]).unwrap().view().to_owned();
    let dir = tempfile::tempdir().unwrap();
    let (t, p, b) = (dir.path().join("truth.npy"), dir.path().join("psf.npy"), dir.path().join("blurred.npy"));
    save(&t, &truth);
    save(&p, &psf_array);
    python.run([script.as_str(), "blur", t.to_str().unwrap(), p.to_str().unwrap(), b.to_str().unwrap(), "7"]);
    let blurred = load(&b);
    let psf = Psf::new(psf_array, "Gaussian").unwrap();
    let mean_fwhm = |a: ArrayView3<f32>| beads.iter().map(|&(z, y, x)| fwhm_x(a, z, y, x, 8)).sum::<f64>() / beads.len() as f64;
    let (f_truth, f_blurred) = (mean_fwhm(truth.view()), mean_fwhm(blurred.view()));
    println!("bead FWHM along x (voxels): truth {f_truth:.3}, blurred {f_blurred:.3}");
    let mut previous = f_blurred;
    for iterations in [10, 30, 100] {
        let out = richardson_lucy(blurred.view(), &psf, &RlParams { iterations, ..RlParams::default() }).unwrap();
        let f = mean_fwhm(out.view());
        let acc = richardson_lucy(blurred.view(), &psf, &RlParams { iterations, acceleration: true, ..RlParams::default() }).unwrap();
        let fa = mean_fwhm(acc.view());
        println!("  RL {iterations} it: FWHM {f:.3}; accelerated: {fa:.3}");
        assert!(f < previous && f > 0.8 * f_truth, "{iterations} it: FWHM {f:.3} (previous {previous:.3}, truth {f_truth:.3})");
        assert!(fa < f + 1e-6 && fa > 0.8 * f_truth, "accelerated {iterations} it: FWHM {fa:.3} vs plain {f:.3}");
        previous = f;
    }
    assert!(previous - f_truth < 0.5 * (f_blurred - f_truth), "100 iterations closed less than half the gap");
}

/// Biggs–Andrews reaches in 10 iterations what plain RL needs many more for.
#[test]
fn acceleration_converges_faster() {
    let image = random_image([12, 40, 40], 5);
    let psf = Psf::gaussian([1.5, 1.5, 1.5]).unwrap();
    let run = |iterations, acceleration| {
        richardson_lucy(image.view(), &psf, &RlParams { iterations, acceleration, ..RlParams::default() }).unwrap()
    };
    let far = run(60, false);
    let (plain, accelerated) = (run(10, false), run(10, true));
    let (e_plain, e_acc) = (relative_error(plain.view(), far.view()).1, relative_error(accelerated.view(), far.view()).1);
    println!("distance to plain RL after 60 it: plain 10 it {e_plain:.3e}, accelerated 10 it {e_acc:.3e}");
    assert!(e_acc < 0.85 * e_plain, "acceleration did not help: {e_acc:.3e} vs {e_plain:.3e}");
    assert!(accelerated.iter().all(|v| v.is_finite() && *v >= 0.0));
}

#[test]
fn results_are_non_negative_and_reproducible() {
    let mut image = random_image([6, 30, 26], 8);
    image.slice_mut(ndarray::s![.., 10..20, ..]).fill(0.0); // zeros: ratio 0 there
    let psf = Psf::new(asymmetric_psf([3, 5, 5], 4), "test").unwrap();
    for boundary in [Boundary::Same, Boundary::Circular] {
        let a = richardson_lucy(image.view(), &psf, &params(boundary)).unwrap();
        let b = richardson_lucy(image.view(), &psf, &params(boundary)).unwrap();
        assert_eq!(a, b);
        assert!(a.iter().all(|v| v.is_finite() && *v >= 0.0));
    }
}

#[test]
fn bad_input_is_refused_with_clear_errors() {
    let image = random_image([5, 20, 20], 1);
    let psf = Psf::gaussian([0.6, 1.0, 1.0]).unwrap();
    // PSF larger than the image
    let big = Psf::gaussian([2.0, 1.0, 1.0]).unwrap();
    let e = richardson_lucy(image.view(), &big, &RlParams::default()).unwrap_err();
    assert!(matches!(e, DeconError::PsfTooLarge { axis: "z", .. }), "{e}");
    assert!(e.to_string().contains("larger along z"), "{e}");
    // negative or non-finite image values
    let mut neg = image.clone();
    neg[[1, 2, 3]] = -1.0;
    let e = richardson_lucy(neg.view(), &psf, &RlParams::default()).unwrap_err().to_string();
    assert!(e.contains("-1") && e.contains("(1, 2, 3)") && e.contains("non-negative"), "{e}");
    neg[[1, 2, 3]] = f32::NAN;
    assert!(richardson_lucy(neg.view(), &psf, &RlParams::default()).unwrap_err().to_string().contains("NaN"));
    // parameters
    for p in [RlParams { iterations: 0, ..RlParams::default() }, RlParams { epsilon: -1.0, ..RlParams::default() }] {
        assert!(matches!(richardson_lucy(image.view(), &psf, &p), Err(DeconError::Params(_))));
    }
    // PSF arrays: negative, even-sized, off-centre, all-zero, non-finite
    let mut p = asymmetric_psf([3, 5, 5], 1);
    p[[0, 0, 0]] = -0.5;
    assert!(Psf::new(p, "neg.tif").unwrap_err().to_string().contains("PSF neg.tif: has a negative value"));
    let e = Psf::new(Array3::from_elem((3, 4, 5), 1.0), "even").unwrap_err().to_string();
    assert!(e.contains("along y (4) is even"), "{e}");
    let mut corner = Array3::from_elem((1, 9, 9), 0.01f32);
    corner[[0, 0, 0]] = 1.0; // peak at a corner: an FFT-shifted PSF
    assert!(Psf::new(corner, "corner").unwrap_err().to_string().contains("not centred"));
    assert!(Psf::new(Array3::zeros((1, 3, 3)), "zero").unwrap_err().to_string().contains("sums to 0"));
    let mut inf = Array3::from_elem((1, 3, 3), 1.0f32);
    inf[[0, 1, 1]] = f32::INFINITY;
    assert!(Psf::new(inf, "inf").unwrap_err().to_string().contains("non-finite"));
}

#[test]
fn psf_files_are_read_validated_and_named_in_errors() {
    use hcsflow_tiff::{write_stack, WriteOptions};
    let dir = tempfile::tempdir().unwrap();
    // a valid 3-plane u16 PSF: normalised on reading
    let good = dir.path().join("psf.tif");
    let values: Vec<u16> = (0..3 * 5 * 5).map(|i| if i == 37 { 1000 } else { 10 }).collect();
    write_stack(&good, &Stack::from_vec([3, 5, 5], values).unwrap(), &WriteOptions::default()).unwrap();
    let psf = Psf::from_tiff(&good).unwrap();
    assert_eq!(psf.shape(), [3, 5, 5]);
    assert!((psf.view().sum() - 1.0).abs() < 1e-5);
    assert!((psf.view()[[1, 2, 2]] - 1000.0 / 1740.0).abs() < 1e-6);
    // not a TIFF, missing, negative f32 values, even size: each error names the file
    let junk = dir.path().join("junk.tif");
    std::fs::write(&junk, b"not a tiff at all").unwrap();
    let missing = dir.path().join("missing.tif");
    let negative = dir.path().join("negative.tif");
    let mut v = vec![0.1f32; 9];
    v[4] = 1.0;
    v[0] = -0.2;
    write_stack(&negative, &Stack::from_vec([1, 3, 3], v).unwrap(), &WriteOptions::default()).unwrap();
    let even = dir.path().join("even.tif");
    write_stack(&even, &Stack::from_vec([1, 4, 4], vec![1.0f32; 16]).unwrap(), &WriteOptions::default()).unwrap();
    for (path, what) in [(&junk, ""), (&missing, ""), (&negative, "negative"), (&even, "even")] {
        let e = Psf::from_tiff(path).unwrap_err().to_string();
        println!("{e}");
        assert!(e.contains(path.to_str().unwrap()) && e.contains(what), "{e}");
    }
}
