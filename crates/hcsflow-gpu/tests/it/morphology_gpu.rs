//! median_filter, white_tophat and clahe on the GPU (wgpu, lavapipe in CI)
//! against their host implementations, through the registry on both devices.

use crate::common;

use common::{gpu, random_stack};

use hcsflow_core::{CallError, DType, Device, Registry, Stack};
use ndarray::Array3;

fn registry() -> (Registry, hcsflow_core::Conversions) {
    let mut registry = Registry::new();
    let mut conversions = hcsflow_core::Conversions::default();
    hcsflow_ops::register(&mut registry);
    hcsflow_gpu::register(&mut registry, &mut conversions);
    (registry, conversions)
}

/// Runs `name` with `args` on `device`: the host result, or the function's error message.
fn run(name: &str, args: &[&str], stack: &Stack, device: Device) -> Result<Stack, String> {
    let (registry, conversions) = registry();
    match hcsflow_testkit::call(&registry, &conversions, name, args, stack, device) {
        Err(CallError::Function(e)) => Err(e.to_string()),
        other => Ok(other.unwrap()),
    }
}

/// Same dtype, shape and values; NaN where the host has NaN.
fn assert_same(gpu: &Stack, host: &Stack, what: &str) {
    assert_eq!(gpu.dtype(), host.dtype(), "{what}");
    assert_eq!(gpu.shape(), host.shape(), "{what}");
    for (i, (a, b)) in gpu.to_f32().iter().zip(host.to_f32().iter()).enumerate() {
        assert!(a == b || (a.is_nan() && b.is_nan()), "{what}: value {i}: gpu {a}, host {b}");
    }
}

/// Plane shapes: a single pixel, odd widths (padding lanes of packed u8/u16
/// words), sizes that are not multiples of the 256-thread workgroup.
const SHAPES: [[usize; 3]; 4] = [[1, 1, 1], [3, 7, 5], [2, 33, 65], [3, 64, 61]];

/// The median is a value of the window: exact for every dtype and side,
/// whichever host path (fused 3×3, comparator network up to 9, selection above).
#[test]
fn median_filter_gpu_is_exact_with_host() {
    let Some(dev) = gpu() else { return };
    for dtype in DType::ALL {
        for (i, shape) in SHAPES.iter().enumerate() {
            for size in ["1", "3", "5", "7", "9", "11", "15"] {
                let s = random_stack(dtype, *shape, 1000 + i as u64);
                let args = [format!("size={size}")];
                let args: Vec<&str> = args.iter().map(String::as_str).collect();
                let host = run("median_filter", &args, &s, Device::Cpu).unwrap();
                let gpu = run("median_filter", &args, &s, dev).unwrap();
                assert_same(&gpu, &host, &format!("median size {size} {dtype} {shape:?}"));
            }
        }
    }
    // The largest side the host takes, on planes smaller than the window
    // (reflected several times over).
    for dtype in DType::ALL {
        // 43 and above ran past lavapipe's 65,535 loop iterations per
        // invocation before the window's columns were unrolled.
        let s = random_stack(dtype, [2, 9, 14], 1010);
        for size in ["43", "51", "99"] {
            let host = run("median_filter", &[&format!("size={size}")], &s, Device::Cpu).unwrap();
            let gpu = run("median_filter", &[&format!("size={size}")], &s, dev).unwrap();
            assert_same(&gpu, &host, &format!("median size {size} {dtype}"));
        }
    }
    // Few distinct values (many ties), negative f32 and NaN (ordered as
    // total_cmp orders it, like the host's selection above side 9).
    let mut f = random_stack(DType::F32, [2, 21, 19], 1011).to_f32().mapv(|v| (v / 300.0).round());
    f.iter_mut().step_by(5).for_each(|v| *v = f32::NAN);
    let s = Stack::from_f32_array(f, DType::F32);
    for size in ["11", "13"] {
        let args = [format!("size={size}")];
        let host = run("median_filter", &[args[0].as_str()], &s, Device::Cpu).unwrap();
        let gpu = run("median_filter", &[args[0].as_str()], &s, dev).unwrap();
        assert_same(&gpu, &host, &format!("median size {size} ties and NaN"));
    }
    let ties = Stack::from_f32_array(random_stack(DType::U16, [2, 21, 19], 1012).to_f32().mapv(|v| (v / 20000.0).floor()), DType::U16);
    for size in ["3", "5", "9", "11"] {
        let host = run("median_filter", &[&format!("size={size}")], &ties, Device::Cpu).unwrap();
        let gpu = run("median_filter", &[&format!("size={size}")], &ties, dev).unwrap();
        assert_same(&gpu, &host, &format!("median size {size} u16 ties"));
    }
    // A constant stack stays constant.
    let c = Stack::from_f32_array(Array3::from_elem((2, 3, 5), 9.0), DType::U8);
    assert_eq!(run("median_filter", &["size=5"], &c, dev).unwrap(), c);
}

/// Min, max and the subtraction are exact: u8/u16 bit for bit, f32 equal
/// values, for radii whose disks decompose over every sparse-table level
/// (and the default 50, wider than the planes); NaN refused as on the host.
#[test]
fn white_tophat_gpu_is_exact_with_host() {
    let Some(dev) = gpu() else { return };
    for dtype in DType::ALL {
        for (i, shape) in SHAPES.iter().enumerate() {
            for radius in ["0", "1", "2", "3", "5", "8", "13", "50"] {
                let s = random_stack(dtype, *shape, 1100 + i as u64);
                let args = [format!("radius={radius}")];
                let args: Vec<&str> = args.iter().map(String::as_str).collect();
                let host = run("white_tophat", &args, &s, Device::Cpu).unwrap();
                let gpu = run("white_tophat", &args, &s, dev).unwrap();
                assert_same(&gpu, &host, &format!("white_tophat radius {radius} {dtype} {shape:?}"));
            }
        }
    }
    // Spots on a smooth background: the top-hat keeps the spots.
    let mut spots = Array3::from_shape_fn((2, 40, 37), |(z, y, x)| (z + y + x) as f32);
    spots[[0, 10, 10]] += 150.0;
    spots[[1, 30, 20]] += 120.0;
    for dtype in DType::ALL {
        let s = Stack::from_f32_array(spots.clone(), dtype);
        let host = run("white_tophat", &["radius=4"], &s, Device::Cpu).unwrap();
        let gpu = run("white_tophat", &["radius=4"], &s, dev).unwrap();
        assert_same(&gpu, &host, &format!("white_tophat spots {dtype}"));
        assert!(gpu.to_f32()[[0, 10, 10]] >= 150.0, "{dtype}");
    }
    let mut nan = random_stack(DType::F32, [2, 5, 6], 1101).to_f32();
    nan[[1, 2, 3]] = f32::NAN;
    let s = Stack::from_f32_array(nan, DType::F32);
    let host = run("white_tophat", &["radius=2"], &s, Device::Cpu).unwrap_err();
    let gpu = run("white_tophat", &["radius=2"], &s, dev).unwrap_err();
    assert_eq!(gpu, host);
}

/// The host's tables (bins, clipped maps, output stretch) and each bilinear
/// term rounded as the host's f64 product then f32: equal to the host for
/// every dtype, tile size, clip limit and bin count, f32 inputs inside and
/// outside [-1, 1] included; NaN refused as on the host.
#[test]
fn clahe_gpu_is_exact_with_host() {
    let Some(dev) = gpu() else { return };
    let settings: [&[&str]; 5] =
        [&[], &["kernel_size=5"], &["kernel_size=16", "clip_limit=0"], &["kernel_size=7", "clip_limit=0.05", "nbins=64"], &["nbins=1000"]];
    for dtype in DType::ALL {
        for (i, shape) in SHAPES.iter().enumerate() {
            for args in settings {
                if args.first().is_some_and(|a| a.starts_with("kernel_size")) && shape[1].max(shape[2]) < 16 {
                    continue; // kernel_size is at most the plane's larger side
                }
                let s = random_stack(dtype, *shape, 1200 + i as u64);
                let host = run("clahe", args, &s, Device::Cpu).unwrap();
                let gpu = run("clahe", args, &s, dev).unwrap();
                assert_same(&gpu, &host, &format!("clahe {args:?} {dtype} {shape:?}"));
            }
        }
    }
    // f32 inside [-1, 1] (no stretch), a constant plane, a low-contrast u16 plane.
    let unit = Stack::from_f32_array(random_stack(DType::F32, [2, 30, 27], 1201).to_f32().mapv(|v| v / 1000.0), DType::F32);
    let constant = Stack::from_f32_array(Array3::from_elem((1, 9, 12), 3.0), DType::F32);
    let low =
        Stack::from_f32_array(random_stack(DType::U16, [2, 30, 27], 1202).to_f32().mapv(|v| 1000.0 + (v / 4000.0).floor()), DType::U16);
    for (what, s) in [("unit f32", &unit), ("constant f32", &constant), ("low-contrast u16", &low)] {
        let host = run("clahe", &[], s, Device::Cpu).unwrap();
        let gpu = run("clahe", &[], s, dev).unwrap();
        assert_same(&gpu, &host, what);
    }
    let mut nan = random_stack(DType::F32, [2, 5, 6], 1203).to_f32();
    nan[[1, 2, 3]] = f32::NAN;
    let s = Stack::from_f32_array(nan, DType::F32);
    assert_eq!(run("clahe", &[], &s, dev).unwrap_err(), run("clahe", &[], &s, Device::Cpu).unwrap_err());
}
