//! Focus stacking on wgpu (lavapipe in CI) against the host implementation.
//!
//! Tolerance: the blurred planes may differ by an ulp (drivers may fuse
//! multiply-adds), so the chosen plane may differ only where the host's measures
//! of the two planes tie to 1e-5 relative (+1e-6 of the stack's largest measure);
//! the `log` image is the exact gather of the GPU's depth map; the `weighted`
//! image agrees to 1e-4 relative to the stack's largest value.

use crate::common;

use common::{gpu, to_host};
use hcsflow_core::{Array, ConversionPolicy, Conversions, DType, MemoryType, Registry, Stack};
use hcsflow_ops::focus::{focus_measure, focus_stack, FocusMethod};
use ndarray::Array3;

/// Smooth random blobs plus noise, values spread over the dtype's range.
fn stack(dtype: DType, shape: [usize; 3], seed: u64) -> Stack {
    let mut rng = hcsflow_testkit::Rng::new(seed);
    let top = if dtype == DType::U8 { 250.0 } else { 60000.0 };
    let [n, h, w] = shape;
    let f = Array3::from_shape_fn((n, h, w), |(z, y, x)| {
        let a = ((y as f32 * 0.37 + z as f32).sin() * (x as f32 * 0.29 - z as f32 * 0.5).cos()).abs();
        (0.1 + 0.8 * a * a) * top
    });
    let f = f.mapv(|v| v * (0.9 + 0.2 * rng.unit() as f32));
    Stack::from_f32_array(f, dtype)
}

#[test]
fn focus_stack_gpu_agrees_with_host() {
    let Some(dev) = gpu() else { return };
    for dtype in DType::ALL {
        for (i, shape) in [[1usize, 1, 1], [3, 7, 5], [6, 33, 47], [4, 16, 3]].iter().enumerate() {
            for (method, sigma) in [(FocusMethod::Log, 1.0), (FocusMethod::Weighted, 1.5), (FocusMethod::Log, 7.0)] {
                let s = stack(dtype, *shape, 10 + i as u64);
                let what = format!("{dtype} {shape:?} {method:?} sigma={sigma}");
                let host = focus_stack(&s, sigma, method).unwrap();
                let g = hcsflow_gpu::upload_stack(&s, dev).unwrap();
                let (img, depth) = hcsflow_gpu::focus_stack_wgpu(&g, sigma, method).unwrap();
                let (img, depth) = (to_host(&img), to_host(&depth));
                let Stack::U16(depth) = depth else { panic!("{what}: depth must be u16") };
                let depth: Vec<u16> = depth.pixels().to_vec();
                let m = focus_measure(&s, sigma, method).unwrap();
                let [n, h, w] = *shape;
                let gmax = m.iter().cloned().fold(0.0f32, f32::max);
                let mut differ = 0;
                for p in 0..h * w {
                    let (hd, gd) = (host.depth.index[p] as usize, depth[p] as usize);
                    assert!(gd < n, "{what}: depth {gd}");
                    if hd != gd {
                        differ += 1;
                        let (mh, mg) = (m[[hd, p / w, p % w]], m[[gd, p / w, p % w]]);
                        assert!((mh - mg).abs() <= 1e-5 * mh + 1e-6 * gmax, "{what}: pixel {p}: host plane {hd} ({mh}) vs gpu {gd} ({mg})");
                    }
                }
                assert!(differ * 100 <= h * w, "{what}: {differ} pixels chose another plane");
                match method {
                    FocusMethod::Log => {
                        assert_eq!(img.dtype(), dtype);
                        let px = s.to_f32();
                        let got = img.to_f32();
                        for p in 0..h * w {
                            assert_eq!(got[[0, p / w, p % w]], px[[depth[p] as usize, p / w, p % w]], "{what}: gather");
                        }
                    }
                    FocusMethod::Weighted => {
                        assert_eq!(img.dtype(), DType::F32);
                        let top = s.to_f32().iter().cloned().fold(1.0f32, f32::max);
                        for (a, b) in img.to_f32().iter().zip(host.image.to_f32().iter()) {
                            assert!((a - b).abs() <= 1e-4 * top, "{what}: weighted {a} vs {b}");
                        }
                    }
                }
            }
        }
    }
}

#[test]
fn focus_stack_runs_through_the_registry_on_wgpu() {
    let Some(dev) = gpu() else { return };
    let mut registry = Registry::new();
    let mut conversions = Conversions::default();
    hcsflow_ops::register(&mut registry);
    hcsflow_gpu::register(&mut registry, &mut conversions);
    let f = registry.get("focus_stack").unwrap();
    assert!(f.memory_types().contains(&MemoryType::Wgpu));
    let args = f.parse_args(&["sigma=1.0".into()]).unwrap();
    let plan = registry.plan_call("focus_stack", args, MemoryType::Host, dev, &conversions, ConversionPolicy::default()).unwrap();
    let s = stack(DType::U16, [5, 20, 21], 3);
    let out = registry.execute(&plan, Array::from(s.clone()), &conversions).unwrap();
    assert_eq!(out.memory_type(), MemoryType::Wgpu);
    assert_eq!(out.shape(), [1, 20, 21]);
    let host = conversions.to_host_stack(out, ConversionPolicy::default()).unwrap();
    assert_eq!(host.dtype(), DType::U16);
    let empty = hcsflow_gpu::upload_stack(&Stack::zeros(DType::U16, [0, 4, 4]), dev);
    if let Ok(e) = empty {
        assert!(hcsflow_gpu::focus_stack_wgpu(&e, 1.0, FocusMethod::Log).is_err());
    }
}
