//! Every wgpu implementation the engine registers ([`hcsflow::builtin`])
//! against the host implementation of the same function, on lavapipe in CI:
//! default arguments (plus the files a function reads: `arguments`),
//! u8/u16/f32 test stacks, each function within the agreement its family is
//! held to in `gpu_vs_host.rs` (and `focus_gpu.rs`, `assemble_gpu.rs`,
//! `basic_gpu.rs`). A new kernel is covered the moment it is registered;
//! a function without a tolerance here fails the test until one is chosen.
//! One shared device per test process (GpuContext caches it).

use crate::common;

use common::{gpu, random_stack};

use std::path::Path;

use hcsflow_core::{Array, ConversionPolicy, Conversions, DType, Device, MemoryType, Registry, Stack};
use ndarray::Axis;

/// Odd plane sizes exercise the word padding of packed u8/u16 planes; 4
/// planes make a square tile grid (`assemble`'s default `grid_cols = 0`) and
/// leave images beside the mask plane (`apply_mask`).
const SHAPES: [[usize; 3]; 2] = [[4, 17, 23], [4, 32, 33]];

/// How closely a GPU result must agree with the host's.
#[derive(Debug, Clone, Copy)]
enum Agreement {
    /// Bit for bit.
    Exact,
    /// Every value within `atol + rtol·|host|`; `atol` is scaled by the
    /// input's largest magnitude (at least 1) when `scaled`.
    Close { atol: f32, rtol: f32, scaled: bool },
    /// Values may differ at up to 1 % of the pixels (focus_stack's `log`
    /// picks, per pixel, the plane with the largest measure; measures equal
    /// to 1e-5 may pick another plane on the GPU).
    MostPixels,
}

/// The agreement each function is held to, per dtype: the same as its family's
/// test in `gpu_vs_host.rs`, `focus_gpu.rs` or `assemble_gpu.rs`.
fn agreement(function: &str, dtype: DType) -> Agreement {
    let integer = dtype != DType::F32;
    match function {
        "max_projection" | "min_projection" | "sum_projection" | "mean_projection" | "apply_mask" => Agreement::Exact,
        "std_projection" => Agreement::Close { atol: 1e-3, rtol: 1e-6, scaled: false },
        "percentile_normalize" | "stack_percentile_normalize" if integer => Agreement::Exact,
        "percentile_normalize" | "stack_percentile_normalize" => Agreement::Close { atol: 0.07, rtol: 1e-6, scaled: false },
        "stack_equalize_histogram" if integer => Agreement::Exact,
        "stack_equalize_histogram" => Agreement::Close { atol: 2e-6, rtol: 0.0, scaled: false },
        "gaussian_blur" | "sharpen" | "composite" => Agreement::Close { atol: 1e-6, rtol: 0.0, scaled: true },
        // `I·(1/F) − (D + offset)/F`: bit-exact unless the driver fuses it into an FMA,
        // then within an ulp of I/F (1/F ≤ 2 here); basic_gpu.rs holds each value to that ulp.
        "basic_correct" => Agreement::Close { atol: 1e-6, rtol: 0.0, scaled: true },
        // The median is a value of the window, found exactly (morphology_gpu.rs).
        "median_filter" => Agreement::Exact,
        // Exact min/max and the subtraction in the input dtype (morphology_gpu.rs).
        "white_tophat" => Agreement::Exact,
        // The host's tables and the host's f64 rounding of each term, emulated in integers (morphology_gpu.rs).
        "clahe" => Agreement::Exact,
        "focus_stack" => Agreement::MostPixels,
        // The same training and prediction on burn's wgpu operations: float32 reduction order
        // (hcsflow-n2v's wgpu.rs holds a short training's predictions to 1e-3 of the image spread).
        "n2v_denoise" => Agreement::Close { atol: 1e-3, rtol: 0.0, scaled: true },
        "assemble" if integer => Agreement::Close { atol: 1.0, rtol: 0.0, scaled: false },
        "assemble" => Agreement::Close { atol: 1e-6, rtol: 0.0, scaled: true },
        other => panic!("{other} has a wgpu implementation but no agreement in conformance.rs: add the one its kernel is held to"),
    }
}

/// The arguments `function` needs besides its defaults for a stack of `shape`:
/// the files it reads, written into `dir` (basic_correct's profiles, with a
/// dark-field and a camera offset so that every term is exercised).
fn arguments(function: &str, shape: [usize; 3], dir: &Path) -> Vec<String> {
    match function {
        "basic_correct" => {
            let [_, h, w] = shape;
            let flat = random_stack(DType::F32, [1, h, w], 77).to_f32().index_axis_move(Axis(0), 0).mapv(|v| 1.0 + v / 2000.0);
            let dark = random_stack(DType::F32, [1, h, w], 78).to_f32().index_axis_move(Axis(0), 0).mapv(|v| 20.0 + v / 100.0);
            let (ffp, dfp) = (dir.join(format!("flat_{h}x{w}.tif")), dir.join(format!("dark_{h}x{w}.tif")));
            hcsflow_basic::write_profile(&ffp, &flat).unwrap();
            hcsflow_basic::write_profile(&dfp, &dark).unwrap();
            vec![format!("flatfield={}", ffp.display()), format!("darkfield={}", dfp.display()), "camera_offset=3.25".into()]
        }
        // A few steps of a small network on patches that fit the test planes (≥ 17²).
        "n2v_denoise" => ["patch_size=16", "batch_size=2", "steps_per_epoch=2", "epochs=1", "features=4", "tile_size=16", "tile_overlap=4"]
            .map(String::from)
            .to_vec(),
        _ => vec![],
    }
}

/// Runs `function` with `args` (defaults for the rest) on `device`; the result back on the host.
fn run(registry: &Registry, conversions: &Conversions, function: &str, args: &[String], stack: &Stack, device: Device) -> Stack {
    let args = registry.get(function).unwrap().parse_args(args).unwrap();
    let plan = registry.plan_call(function, args, MemoryType::Host, device, conversions, ConversionPolicy::default()).unwrap();
    let expected = if device == Device::Cpu { MemoryType::Host } else { MemoryType::Wgpu };
    assert_eq!(plan.implementation.memory_in, expected, "{function} on {device}");
    let out = registry.execute(&plan, Array::from(stack.clone()), conversions).unwrap_or_else(|e| panic!("{function} on {device}: {e}"));
    let back = conversions.plan(out.memory_type(), MemoryType::Host, out.device().runtime(), ConversionPolicy::default()).unwrap();
    conversions.execute(&back, out, Device::Cpu).unwrap().into_host_stack().unwrap()
}

/// Asserts `gpu` agrees with `host` as `agreement` says (same dtype and shape;
/// NaN where the host has NaN).
fn assert_agrees(gpu: &Stack, host: &Stack, input: &Stack, agreement: Agreement, what: &str) {
    assert_eq!(gpu.dtype(), host.dtype(), "{what}");
    assert_eq!(gpu.shape(), host.shape(), "{what}");
    let (g, h) = (gpu.to_f32(), host.to_f32());
    match agreement {
        Agreement::Exact => assert_eq!(gpu, host, "{what}"),
        Agreement::Close { atol, rtol, scaled } => {
            let scale = if scaled { input.to_f32().iter().fold(1.0f32, |m, v| m.max(v.abs())) } else { 1.0 };
            for (i, (a, b)) in g.iter().zip(h.iter()).enumerate() {
                assert_eq!(a.is_nan(), b.is_nan(), "{what}: value {i}: gpu {a}, host {b}");
                assert!(a.is_nan() || (a - b).abs() <= atol * scale + rtol * b.abs(), "{what}: value {i}: gpu {a}, host {b}");
            }
        }
        Agreement::MostPixels => {
            let differ = g.iter().zip(h.iter()).filter(|(a, b)| a != b).count();
            assert!(differ * 100 <= h.len(), "{what}: {differ} of {} values differ", h.len());
        }
    }
}

#[test]
fn every_wgpu_implementation_agrees_with_the_host() {
    let Some(dev) = gpu() else { return };
    let (registry, conversions) = hcsflow::builtin();
    let dir = tempfile::tempdir().unwrap();
    let mut checked = Vec::new();
    for function in registry.functions().filter(|f| f.memory_types().contains(&MemoryType::Wgpu)) {
        let name = function.spec.name;
        assert!(function.memory_types().contains(&MemoryType::Host), "{name} has a wgpu implementation but no host one to agree with");
        for dtype in DType::ALL {
            let agreement = agreement(name, dtype);
            for (i, shape) in SHAPES.iter().enumerate() {
                let input = random_stack(dtype, *shape, 900 + i as u64);
                let args = arguments(name, *shape, dir.path());
                let host = run(&registry, &conversions, name, &args, &input, Device::Cpu);
                let gpu = run(&registry, &conversions, name, &args, &input, dev);
                assert_agrees(&gpu, &host, &input, agreement, &format!("{name} {dtype} {shape:?}"));
            }
        }
        checked.push(name);
    }
    eprintln!("checked on {dev}: {}", checked.join(", "));
    assert_eq!(checked.len(), hcsflow_gpu::implementations().len(), "checked {checked:?}");
}

#[test]
fn every_declared_kernel_is_attached_once() {
    let (registry, _) = hcsflow::builtin();
    let mut declared: Vec<&str> = hcsflow_gpu::implementations().iter().map(|b| b.function()).collect();
    assert!(hcsflow_gpu::implementations().iter().all(|b| b.memory_in() == MemoryType::Wgpu));
    declared.sort_unstable();
    let count = declared.len();
    declared.dedup();
    assert_eq!(declared.len(), count, "a function has two wgpu kernels: {declared:?}");
    let attached: Vec<&str> = registry.functions().filter(|f| f.memory_types().contains(&MemoryType::Wgpu)).map(|f| f.spec.name).collect();
    assert_eq!(attached, declared);
    // Each of them is a function the host crates declare, not one the GPU binding created.
    for name in attached {
        assert!(registry.get(name).unwrap().memory_types().contains(&MemoryType::Host), "{name}");
    }
}
