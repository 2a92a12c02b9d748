//! richardson_lucy through the registry: each PSF source gives the library's
//! result, and the argument errors a user meets are named before any pixel.

use hcsflow_core::{CallContext, Conversions, DType, Device, FunctionArgs, Registry, Stack};
use hcsflow_decon::{Boundary, Optics, Psf, RlParams};
use hcsflow_ops::decon::{richardson_lucy, RichardsonLucyArgs};
use hcsflow_testkit::{call, random_stack};
use hcsflow_tiff::{write_stack, WriteOptions};

fn registry() -> Registry {
    let mut registry = Registry::new();
    hcsflow_ops::register(&mut registry);
    registry
}

fn run(registry: &Registry, args: &[&str], stack: &Stack) -> Result<Stack, String> {
    call(registry, &Conversions::default(), "richardson_lucy", args, stack, Device::Cpu).map_err(|e| e.to_string())
}

fn direct(stack: &Stack, psf: &Psf, params: &RlParams) -> ndarray::Array3<f32> {
    hcsflow_decon::richardson_lucy(stack.to_f32().view(), psf, params).unwrap()
}

#[test]
fn each_psf_source_gives_the_library_result() {
    let registry = registry();
    let stack = random_stack(DType::U16, [9, 40, 36], 3);
    // a Gaussian by sigma, circular, accelerated
    let out = run(&registry, &["sigma_xy=1.3", "sigma_z=1.1", "iterations=4", "boundary=circular", "acceleration=true"], &stack).unwrap();
    assert_eq!(out.dtype(), DType::F32);
    let p = RlParams { iterations: 4, boundary: Boundary::Circular, acceleration: true, ..RlParams::default() };
    assert_eq!(out.to_f32(), direct(&stack, &Psf::gaussian([1.1, 1.3, 1.3]).unwrap(), &p));
    // a PSF file
    let dir = tempfile::tempdir().unwrap();
    let file = dir.path().join("psf.tif");
    let psf = Psf::gaussian([1.0, 1.5, 1.2]).unwrap();
    let (kz, ky, kx) = psf.view().dim();
    write_stack(&file, &Stack::from_vec([kz, ky, kx], psf.view().iter().copied().collect()).unwrap(), &WriteOptions::default()).unwrap();
    let arg = format!("psf={}", file.display());
    let out = run(&registry, &[&arg], &stack).unwrap();
    assert_eq!(out.to_f32(), direct(&stack, &Psf::from_tiff(&file).unwrap(), &RlParams::default()));
    // the widefield model (a one-plane PSF without a z step)
    let args = ["na=0.8", "wavelength_nm=520", "refractive_index=1.0", "pixel_size_um=0.3", "iterations=3"];
    let out = run(&registry, &args, &stack).unwrap();
    let optics = Optics { na: 0.8, wavelength_nm: 520.0, refractive_index: 1.0, pixel_size_um: 0.3, z_step_um: None };
    let want = direct(&stack, &Psf::widefield(&optics).unwrap(), &RlParams { iterations: 3, ..RlParams::default() });
    assert_eq!(out.to_f32(), want);
}

#[test]
fn argument_errors_name_the_argument_and_the_fix() {
    let registry = registry();
    let stack = random_stack(DType::U16, [3, 32, 32], 1);
    let cases: [(&[&str], &[&str]); 7] = [
        (&[], &["no PSF", "psf="]),
        (&["sigma_xy=1", "na=1.2"], &["more than one PSF source"]),
        (&["sigma_xy=1", "sigma_z=2"], &["larger than the stack", "3 along z"]),
        (&["psf=/no/such/psf.tif"], &["/no/such/psf.tif"]),
        (&["na=1.2", "wavelength_nm=500"], &["refractive_index"]),
        (&["na=1.2", "wavelength_nm=500", "refractive_index=1.515"], &["pixel_size_um"]),
        (&["sigma_xy=1", "boundary=mirror"], &["boundary", "same, circular"]),
    ];
    for (args, wanted) in cases {
        let e = run(&registry, args, &stack).unwrap_err();
        println!("{args:?}: {e}");
        for w in wanted {
            assert!(e.contains(w), "{args:?}: {e} lacks {w}");
        }
    }
    // NA above the refractive index
    let e = run(&registry, &["na=1.4", "wavelength_nm=500", "refractive_index=1.0", "pixel_size_um=0.1"], &stack).unwrap_err();
    assert!(e.contains("cannot exceed"), "{e}");
    // negative pixels (f32 input): refused, never clipped
    let mut a = stack.to_f32();
    a[[1, 2, 3]] = -4.0;
    let e = run(&registry, &["sigma_xy=1"], &Stack::from(a.clone())).unwrap_err();
    assert!(e.contains("non-negative") && e.contains("-4"), "{e}");
    // ... unless asked: then as the stack clipped at 0 by hand.
    a[[2, 0, 0]] = -0.5;
    let clipped = run(&registry, &["sigma_xy=1", "negative=clip"], &Stack::from(a.clone())).unwrap().to_f32();
    let by_hand = run(&registry, &["sigma_xy=1"], &Stack::from(a.mapv(|v| v.max(0.0)))).unwrap().to_f32();
    assert_eq!(clipped, by_hand);
    // ... and said in the step's notes.
    let texts = ["sigma_xy=1".to_string(), "negative=clip".to_string()];
    let args = RichardsonLucyArgs::from_args(&registry.get("richardson_lucy").unwrap().parse_args(&texts).unwrap());
    let mut context = CallContext::default();
    richardson_lucy(&Stack::from(a.clone()), &args, &mut context).unwrap();
    assert!(context.notes().iter().any(|n| n.contains("2 values below 0 set to 0 (the lowest -4)")), "{:?}", context.notes());
    // NaN is not a value below 0: still refused.
    a[[0, 1, 1]] = f32::NAN;
    let e = run(&registry, &["sigma_xy=1", "negative=clip"], &Stack::from(a)).unwrap_err();
    assert!(e.contains("NaN"), "{e}");
    let e = run(&registry, &["sigma_xy=1", "negative=zero"], &stack).unwrap_err();
    assert!(e.contains("negative") && e.contains("error, clip"), "{e}");
}

#[test]
fn method_chooses_fft_or_direct_convolution_with_the_same_result() {
    let registry = registry();
    let stack = random_stack(DType::U16, [8, 30, 34], 4);
    let fft = run(&registry, &["sigma_xy=1.2", "sigma_z=1", "method=fft"], &stack).unwrap().to_f32();
    let direct = run(&registry, &["sigma_xy=1.2", "sigma_z=1", "method=separable"], &stack).unwrap().to_f32();
    let scale = fft.iter().fold(0.0f32, |m, &v| m.max(v));
    let max = fft.iter().zip(&direct).fold(0.0f32, |m, (a, b)| m.max((a - b).abs()));
    assert!(max <= 1e-5 * scale, "fft and direct differ by {max} (max {scale})");
    // a PSF file that is not separable cannot go the direct way
    let dir = tempfile::tempdir().unwrap();
    let file = dir.path().join("cross.tif");
    let mut v = vec![0.0f32; 9];
    for i in [1, 3, 4, 5, 7] {
        v[i] = 1.0;
    }
    write_stack(&file, &Stack::from_vec([1, 3, 3], v).unwrap(), &WriteOptions::default()).unwrap();
    let arg = format!("psf={}", file.display());
    let e = run(&registry, &[&arg, "method=separable"], &stack).unwrap_err();
    assert!(e.contains("'method'") && e.contains("not separable"), "{e}");
    assert!(run(&registry, &[&arg], &stack).is_ok());
}
