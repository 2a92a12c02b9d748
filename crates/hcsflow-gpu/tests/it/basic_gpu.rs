//! basic_correct on wgpu (lavapipe in CI) against the host implementation and
//! against its definition `(I − camera_offset − D) / F`, with a dark-field and
//! a camera offset, profiles from TIFF files (one-page and MCMICRO -ffp/-dfp).
//!
//! Tolerance: the kernel computes the host's `I·(1/F) − (D + offset)/F` with
//! the same folded factors; a driver may fuse the two operations into an FMA,
//! so each value is held to one ulp of the larger of `I·(1/F)` and the result
//! (bit-exact when nothing is fused; the test prints how many were).

use crate::common;

use std::path::Path;

use common::gpu;
use hcsflow_basic::profiles::{write_ffp_dfp, write_profile};
use hcsflow_basic::Profiles;
use hcsflow_core::{CallContext, ConversionPolicy, Conversions, DType, Device, MemoryType, Registry, RouteKind, Stack};
use hcsflow_testkit::Rng;
use ndarray::{Array2, Array3};

/// basic_correct with `args` on `device` through the registry, back on the host.
fn call(registry: &Registry, conversions: &Conversions, args: &[String], stack: &Stack, device: Device) -> Result<Stack, String> {
    let parsed = registry.get("basic_correct").unwrap().parse_args(args).map_err(|e| e.to_string())?;
    let plan = registry
        .plan_call("basic_correct", parsed, MemoryType::Host, device, conversions, ConversionPolicy::default())
        .map_err(|e| e.to_string())?;
    let route = if device == Device::Cpu { RouteKind::Identity } else { RouteKind::DeviceCopy };
    assert_eq!(plan.route_in.kind, route, "{device}");
    registry
        .run_to_host(&plan, stack.clone(), conversions, ConversionPolicy::default(), &mut CallContext::default())
        .map_err(|e| e.to_string())
}

/// A vignetted flat-field (mean ≈ 1, 0.55..1.25) and a sloped dark-field with noise.
fn profiles(h: usize, w: usize, seed: u64) -> Profiles {
    let mut rng = Rng::new(seed);
    let flatfield = Array2::from_shape_fn((h, w), |(y, x)| {
        let (dy, dx) = (y as f32 / h as f32 - 0.5, x as f32 / w as f32 - 0.5);
        1.25 - 1.2 * (dy * dy + dx * dx)
    });
    let darkfield = Array2::from_shape_fn((h, w), |(y, x)| 40.0 + 0.3 * y as f32 - 0.2 * x as f32 + 5.0 * rng.unit() as f32);
    Profiles { flatfield, darkfield }
}

/// Pixels over the dtype's range (f32: signed, with fractions, no subnormals).
fn stack(dtype: DType, shape: [usize; 3], seed: u64) -> Stack {
    let mut rng = Rng::new(seed);
    let top = match dtype {
        DType::U8 => 255.0,
        DType::U16 => 65535.0,
        DType::F32 => 5000.0,
    };
    let lowest = if dtype == DType::F32 { -500.0 } else { 0.0 };
    let f = Array3::from_shape_fn(shape, |_| lowest + (top - lowest) * rng.unit() as f32);
    Stack::from_f32_array(if dtype == DType::F32 { f } else { f.mapv(f32::round) }, dtype)
}

/// The spacing of f32 values at `|x|` (at least the smallest normal's).
fn ulp(x: f32) -> f32 {
    let a = x.abs().max(f32::MIN_POSITIVE);
    f32::from_bits(a.to_bits() + 1) - a
}

fn paths(dir: &Path, profiles: &Profiles, tag: &str) -> (String, String) {
    let (ffp, dfp) = (dir.join(format!("flat_{tag}.tif")), dir.join(format!("dark_{tag}.tif")));
    write_profile(&ffp, &profiles.flatfield).unwrap();
    write_profile(&dfp, &profiles.darkfield).unwrap();
    (ffp.display().to_string(), dfp.display().to_string())
}

#[test]
fn basic_correct_with_darkfield_and_camera_offset_agrees_with_the_host() {
    let Some(dev) = gpu() else { return };
    let (registry, conversions) = common::registry();
    let dir = tempfile::tempdir().unwrap();
    let offset = 12.75f32;
    let (mut values, mut exact) = (0usize, 0usize);
    // Odd widths exercise the word padding of packed u8/u16 planes.
    for (k, shape) in [[1usize, 1, 1], [3, 7, 5], [4, 33, 65], [2, 64, 64], [1, 130, 257]].into_iter().enumerate() {
        let [_, h, w] = shape;
        let p = profiles(h, w, 50 + k as u64);
        let (ffp, dfp) = paths(dir.path(), &p, &format!("{h}x{w}"));
        let args = [format!("flatfield={ffp}"), format!("darkfield={dfp}"), format!("camera_offset={offset}")];
        for dtype in DType::ALL {
            let what = format!("{dtype} {shape:?}");
            let input = stack(dtype, shape, 100 + k as u64);
            let host = call(&registry, &conversions, &args, &input, Device::Cpu).unwrap();
            let got = call(&registry, &conversions, &args, &input, dev).unwrap();
            assert_eq!(got.dtype(), DType::F32, "{what}");
            assert_eq!(got.shape(), shape, "{what}");
            let (g, hst, i) = (got.to_f32(), host.to_f32(), input.to_f32());
            for ((z, y, x), &v) in i.indexed_iter() {
                let (a, b) = (g[[z, y, x]], hst[[z, y, x]]);
                let product = v * (1.0 / p.flatfield[[y, x]]);
                assert!((a - b).abs() <= ulp(product).max(ulp(b)), "{what} at {z},{y},{x}: gpu {a}, host {b}");
                // The definition, in f64: (I − offset − D) / F.
                let want = (f64::from(v) - f64::from(offset) - f64::from(p.darkfield[[y, x]])) / f64::from(p.flatfield[[y, x]]);
                assert!((f64::from(a) - want).abs() <= 4.0 * f64::from(ulp(product).max(ulp(a))), "{what}: gpu {a}, definition {want}");
                values += 1;
                exact += usize::from(a.to_bits() == b.to_bits());
            }
        }
    }
    eprintln!("basic_correct on {dev}: {exact} of {values} values bit-exact with the host, the rest within one ulp");
}

#[test]
fn basic_correct_reads_the_channel_page_of_an_ffp_dfp_pair_on_the_gpu() {
    let Some(dev) = gpu() else { return };
    let (registry, conversions) = common::registry();
    let dir = tempfile::tempdir().unwrap();
    let (h, w) = (24, 31);
    let channels = [profiles(h, w, 1), profiles(h, w, 2), Profiles::flat_only(Array2::from_elem((h, w), 2.0))];
    let (ffp, dfp) = write_ffp_dfp(dir.path(), "plate", &channels).unwrap();
    let input = stack(DType::U16, [3, h, w], 9);
    let values = input.to_f32();
    for (c, p) in channels.iter().enumerate() {
        let args = [format!("flatfield={}", ffp.display()), format!("darkfield={}", dfp.display()), format!("channel={c}")];
        let host = call(&registry, &conversions, &args, &input, Device::Cpu).unwrap().to_f32();
        let got = call(&registry, &conversions, &args, &input, dev).unwrap();
        for ((z, y, x), &a) in got.to_f32().indexed_iter() {
            let b = host[[z, y, x]];
            let product = values[[z, y, x]] / p.flatfield[[y, x]];
            assert!((a - b).abs() <= ulp(product).max(ulp(b)), "channel {c} at {z},{y},{x}: gpu {a}, host {b}");
            // The page of channel c was read: (I − D_c) / F_c.
            let want = (f64::from(values[[z, y, x]]) - f64::from(p.darkfield[[y, x]])) / f64::from(p.flatfield[[y, x]]);
            assert!((f64::from(a) - want).abs() <= 4.0 * f64::from(ulp(product).max(ulp(a))), "channel {c}: gpu {a}, definition {want}");
        }
    }
    // Without a dark-field file: I / F (channel 2's flat-field is 2 everywhere: exact halves).
    let args = [format!("flatfield={}", ffp.display()), "channel=2".into()];
    let got = call(&registry, &conversions, &args, &input, dev).unwrap();
    assert_eq!(got.to_f32(), values.mapv(|v| v * 0.5));
}

#[test]
fn basic_correct_on_the_gpu_refuses_bad_profiles() {
    let Some(dev) = gpu() else { return };
    let (registry, conversions) = common::registry();
    let dir = tempfile::tempdir().unwrap();
    let input = stack(DType::U8, [2, 16, 16], 3);
    let (small, _) = paths(dir.path(), &profiles(8, 16, 4), "small");
    let e = call(&registry, &conversions, &[format!("flatfield={small}")], &input, dev).unwrap_err();
    assert!(e.contains("8x16") && e.contains("16x16"), "{e}");
    let mut zero = profiles(16, 16, 5);
    zero.flatfield[[3, 4]] = 0.0;
    let (bad, _) = paths(dir.path(), &zero, "zero");
    let e = call(&registry, &conversions, &[format!("flatfield={bad}")], &input, dev).unwrap_err();
    assert!(e.contains("positive"), "{e}");
    let missing = dir.path().join("missing.tif").display().to_string();
    let e = call(&registry, &conversions, &[format!("flatfield={missing}")], &input, dev).unwrap_err();
    assert!(e.contains("missing.tif"), "{e}");
}

/// A plate-wide fit reaches the kernel as the call's `basic_profiles` planes
/// (no file arguments): the GPU result equals the host's on the same context,
/// and both equal (I − D) / F of those profiles.
#[test]
fn basic_correct_takes_a_plate_wide_fit_from_the_call_context_on_the_gpu() {
    let Some(dev) = gpu() else { return };
    let (registry, conversions) = common::registry();
    let (h, w) = (19, 27);
    let p = profiles(h, w, 7);
    let fitted = ndarray::stack(ndarray::Axis(0), &[p.flatfield.view(), p.darkfield.view()]).unwrap();
    let mut context = CallContext::default();
    context.planes.insert("basic_profiles".into(), std::sync::Arc::new(Stack::from(fitted)));
    let input = stack(DType::U16, [2, h, w], 9);
    let run = |device: Device, context: &mut CallContext| {
        let parsed = registry.get("basic_correct").unwrap().parse_args(&[]).unwrap();
        let plan =
            registry.plan_call("basic_correct", parsed, MemoryType::Host, device, &conversions, ConversionPolicy::default()).unwrap();
        registry.run_to_host(&plan, input.clone(), &conversions, ConversionPolicy::default(), context).unwrap().to_f32()
    };
    let host = run(Device::Cpu, &mut context.clone());
    let got = run(dev, &mut context.clone());
    for ((z, y, x), &v) in input.to_f32().indexed_iter() {
        let (a, b) = (got[[z, y, x]], host[[z, y, x]]);
        let product = v * (1.0 / p.flatfield[[y, x]]);
        assert!((a - b).abs() <= ulp(product).max(ulp(b)), "at {z},{y},{x}: gpu {a}, host {b}");
        let want = (f64::from(v) - f64::from(p.darkfield[[y, x]])) / f64::from(p.flatfield[[y, x]]);
        assert!((f64::from(a) - want).abs() <= 4.0 * f64::from(ulp(product).max(ulp(a))), "gpu {a}, definition {want}");
    }
    // Without a fit or a file, both refuse the call.
    let parsed = registry.get("basic_correct").unwrap().parse_args(&[]).unwrap();
    let plan = registry.plan_call("basic_correct", parsed, MemoryType::Host, dev, &conversions, ConversionPolicy::default()).unwrap();
    let e = registry.run_to_host(&plan, input.clone(), &conversions, ConversionPolicy::default(), &mut CallContext::default()).unwrap_err();
    assert!(e.to_string().contains("no flat-field"), "{e}");
}
