//! basic_fit and basic_correct through the registry: shapes, the profiles as
//! planes, profile files as arguments, and the errors a user meets.

use hcsflow_basic::profiles::write_ffp_dfp;
use hcsflow_basic::Profiles;
use hcsflow_core::{Conversions, DType, Device, Registry, Stack};
use hcsflow_testkit::{call, random_stack};
use ndarray::Array2;

fn registry() -> Registry {
    let mut registry = Registry::new();
    hcsflow_ops::register(&mut registry);
    registry
}

#[test]
fn fit_returns_flat_and_dark_planes() {
    let registry = registry();
    let tiles = random_stack(DType::U16, [6, 40, 48], 5);
    let out = call(&registry, &Conversions::default(), "basic_fit", &["working_size=16", "darkfield=true"], &tiles, Device::Cpu).unwrap();
    assert_eq!((out.shape(), out.dtype()), ([2, 40, 48], DType::F32));
    let flat = out.to_f32();
    let mean = flat.index_axis(ndarray::Axis(0), 0).mean().unwrap();
    // Mean 1 at the working size (as BaSiCPy); upsampling moves it a little.
    assert!((mean - 1.0).abs() < 1e-2, "flat-field mean {mean}");
    let e = call(&registry, &Conversions::default(), "basic_fit", &[], &random_stack(DType::U16, [1, 40, 48], 1), Device::Cpu).unwrap_err();
    let e = e.to_string();
    assert!(e.contains("basic_fit: the input stack: BaSiC needs at least 2 images") && !e.contains("working_size"), "{e}");
}

#[test]
fn correct_reads_the_profiles_named_by_its_arguments() {
    let registry = registry();
    let dir = tempfile::tempdir().unwrap();
    let profiles = Profiles { flatfield: Array2::from_elem((8, 10), 2.0), darkfield: Array2::from_elem((8, 10), 10.0) };
    let (ffp, dfp) = write_ffp_dfp(dir.path(), "plate", &[profiles]).unwrap();
    let tiles = Stack::from(ndarray::Array3::<u16>::from_elem((3, 8, 10), 1000));
    let args = [format!("flatfield={}", ffp.display()), format!("darkfield={}", dfp.display()), "camera_offset=90".into()];
    let args: Vec<&str> = args.iter().map(String::as_str).collect();
    let out = call(&registry, &Conversions::default(), "basic_correct", &args, &tiles, Device::Cpu).unwrap();
    assert_eq!(out.shape(), [3, 8, 10]);
    assert!(out.to_f32().iter().all(|&v| v == 450.0), "(1000 - 90 - 10) / 2");
    // Profiles of another size: the file and both sizes in the message.
    let small = Stack::from(ndarray::Array3::<u16>::from_elem((1, 4, 10), 1000));
    let e = call(&registry, &Conversions::default(), "basic_correct", &args, &small, Device::Cpu).unwrap_err().to_string();
    assert!(e.contains("plate-ffp.tiff") && e.contains("8x10") && e.contains("4x10"), "{e}");
    let e = call(&registry, &Conversions::default(), "basic_correct", &[], &tiles, Device::Cpu).unwrap_err().to_string();
    assert!(e.contains("flatfield"), "{e}");
}
