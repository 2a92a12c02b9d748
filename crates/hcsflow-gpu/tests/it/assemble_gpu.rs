//! GPU mosaic assembly (wgpu, lavapipe in CI) against the host assembly
//! `hcsflow_stitch::assemble` on the same tiles and positions.
//!
//! Tolerance (see `hcsflow_gpu::assemble`): integer positions with `none` /
//! `max` only copy or compare pixels, so they are bit-exact. Otherwise the
//! shader may fuse multiply-adds and divide with a few ulps of error: u8/u16
//! within 1 DN (a value near a .5 rounding tie may round the other way), f32
//! within 1e-6 × the largest |tile value| (several f32 ulps of it).

use crate::common;

use std::collections::BTreeMap;

use common::{gpu, random_stack, to_host};
use hcsflow_core::{Array, CallContext, Cell, ConversionPolicy, Conversions, DType, Device, MemoryType, Registry, Stack, StackInfo, Table};
use hcsflow_gpu::{assemble, assemble_chunked, upload_stack, Blend, GpuError};
use hcsflow_stitch::StitchError;

const BLENDS: [Blend; 3] = [Blend::Linear, Blend::None, Blend::Max];

/// Tiles of 23 × 21 px (odd: packed planes and canvas rows end mid-word).
const TH: usize = 23;
const TW: usize = 21;

/// A grid of `rows × cols` cells stepping (`sx`, `sy`) px from (`x0`, `y0`),
/// with a deterministic sub-pixel jitter of up to `jitter` px; `skip` cells
/// are left out (missing tiles).
fn grid(rows: usize, cols: usize, (x0, y0): (f64, f64), (sx, sy): (f64, f64), jitter: f64, skip: &[usize]) -> Vec<(f64, f64)> {
    (0..rows * cols)
        .filter(|k| !skip.contains(k))
        .map(|k| {
            let (r, c) = ((k / cols) as f64, (k % cols) as f64);
            let j = |s: f64| jitter * ((s * 12.9898).sin() * 43_758.547).fract();
            (x0 + c * sx + j(k as f64 + 0.3), y0 + r * sy + j(k as f64 + 0.7))
        })
        .collect()
}

/// Asserts the GPU mosaic equals the host one (`exact`) or agrees within the
/// module's tolerance; returns the largest difference seen.
fn check(gpu: &Stack, host: &Stack, tiles: &Stack, exact: bool, what: &str) -> f32 {
    assert_eq!(gpu.dtype(), host.dtype(), "{what}");
    assert_eq!(gpu.shape(), host.shape(), "{what}");
    if exact {
        assert_eq!(gpu, host, "{what}");
        return 0.0;
    }
    let tol = match host.dtype() {
        DType::F32 => 1e-6 * tiles.to_f32().iter().fold(1.0f32, |m, v| m.max(v.abs())),
        _ => 1.0,
    };
    let (g, h) = (gpu.to_f32(), host.to_f32());
    let mut worst = 0.0f32;
    for (i, (a, b)) in g.iter().zip(h.iter()).enumerate() {
        let d = (a - b).abs();
        assert!(d <= tol, "{what}: pixel {i}: gpu {a}, host {b} (tolerance {tol})");
        worst = worst.max(d);
    }
    worst
}

/// Runs one layout through both assemblies for every dtype and blend.
/// `integer`: every position is a whole number of pixels.
fn agree(dev: Device, name: &str, positions: &[(f64, f64)], integer: bool, seed: u64) {
    for dtype in DType::ALL {
        let tiles = random_stack(dtype, [positions.len(), TH, TW], seed);
        let on_gpu = upload_stack(&tiles, dev).unwrap();
        for blend in BLENDS {
            let host = hcsflow_stitch::assemble(&tiles, positions, blend).unwrap();
            let gpu = to_host(&assemble(&on_gpu, positions, blend).unwrap());
            let exact = integer && blend != Blend::Linear;
            let what = format!("{name} {dtype} {}", blend.name());
            let worst = check(&gpu, &host, &tiles, exact, &what);
            eprintln!("{what}: {:?} canvas, max |gpu - host| = {worst}", host.shape());
        }
    }
}

#[test]
fn integer_grid_is_bit_exact_for_none_and_max() {
    let Some(dev) = gpu() else { return };
    // 2 × 3 grid with negative coordinates (the canvas origin moves) and overlaps.
    let positions = grid(2, 3, (-7.0, 4.0), (16.0, 19.0), 0.0, &[]);
    agree(dev, "integer 2x3", &positions, true, 1);
}

#[test]
fn fractional_positions_agree() {
    let Some(dev) = gpu() else { return };
    let positions = grid(3, 3, (0.25, -2.5), (15.3, 17.7), 1.5, &[]);
    assert!(positions.iter().all(|p| p.0.fract() != 0.0 || p.1.fract() != 0.0));
    agree(dev, "fractional 3x3", &positions, false, 2);
}

#[test]
fn strip_of_one_row_agrees() {
    let Some(dev) = gpu() else { return };
    let positions = grid(1, 6, (0.5, 0.0), (14.25, 0.0), 0.8, &[]);
    agree(dev, "strip 1x6", &positions, false, 3);
    let column = grid(5, 1, (3.0, 0.0), (0.0, 18.0), 0.0, &[]);
    agree(dev, "strip 5x1", &column, true, 4);
}

#[test]
fn grid_with_a_missing_tile_agrees() {
    let Some(dev) = gpu() else { return };
    // The centre and a corner are missing: those canvas pixels stay 0 on both.
    let positions = grid(3, 3, (0.0, 0.0), (17.5, 20.0), 0.6, &[4, 8]);
    agree(dev, "3x3 without two tiles", &positions, false, 5);
    let host = hcsflow_stitch::assemble(&random_stack(DType::U16, [7, TH, TW], 5), &positions, Blend::Linear).unwrap();
    assert!(host.to_f32().iter().any(|&v| v == 0.0), "the missing tile leaves uncovered pixels");
}

/// Chunks of a few pixels (not whole rows, not whole words of u8) give the
/// same mosaic as one chunk, and agree with the host.
#[test]
fn many_small_chunks_give_the_same_mosaic() {
    let Some(dev) = gpu() else { return };
    let positions = grid(3, 4, (-1.5, 2.25), (15.5, 18.25), 1.0, &[6]);
    for dtype in DType::ALL {
        let tiles = random_stack(dtype, [positions.len(), TH, TW], 6);
        let on_gpu = upload_stack(&tiles, dev).unwrap();
        for blend in BLENDS {
            let whole = to_host(&assemble(&on_gpu, &positions, blend).unwrap());
            let pixels = whole.shape()[1] * whole.shape()[2];
            for chunk in [1, 37, 1000] {
                let chunked = to_host(&assemble_chunked(&on_gpu, &positions, blend, chunk).unwrap());
                assert!(pixels > 2 * chunk, "{pixels} pixels must make several chunks of {chunk}");
                assert_eq!(chunked, whole, "{dtype} {} chunk {chunk}", blend.name());
            }
            let host = hcsflow_stitch::assemble(&tiles, &positions, blend).unwrap();
            check(&whole, &host, &tiles, false, &format!("chunked {dtype} {}", blend.name()));
        }
    }
}

#[test]
fn invalid_positions_are_the_host_errors() {
    let Some(dev) = gpu() else { return };
    let tiles = upload_stack(&random_stack(DType::U8, [2, 4, 4], 7), dev).unwrap();
    let err = assemble(&tiles, &[(0.0, 0.0)], Blend::Linear).unwrap_err();
    assert!(matches!(err, GpuError::Stitch(StitchError::LayoutMismatch { tiles: 2, layout: 1 })), "{err}");
    let err = assemble(&tiles, &[(0.0, 0.0), (f64::NAN, 1.0)], Blend::Max).unwrap_err();
    assert!(matches!(err, GpuError::Stitch(StitchError::InvalidParameter(_))), "{err}");
}

fn registry() -> (Registry, Conversions) {
    let mut registry = Registry::new();
    let mut conversions = Conversions::default();
    hcsflow_stitch::register(&mut registry);
    hcsflow_gpu::register(&mut registry, &mut conversions);
    (registry, conversions)
}

/// The registered `assemble` on `device` in `ctx`; the mosaic back on the host.
fn call_assemble(tiles: &Stack, args: &[&str], device: Device, ctx: &mut CallContext) -> Stack {
    let (registry, conversions) = registry();
    let texts: Vec<String> = args.iter().map(|s| s.to_string()).collect();
    let args = registry.get("assemble").unwrap().parse_args(&texts).unwrap();
    let plan = registry.plan_call("assemble", args, MemoryType::Host, device, &conversions, ConversionPolicy::default()).unwrap();
    let out = registry.execute_in(&plan, Array::from(tiles.clone()), &conversions, ctx).unwrap();
    assert_eq!(out.memory_type(), if device == Device::Cpu { MemoryType::Host } else { MemoryType::Wgpu });
    conversions.to_host_stack(out, ConversionPolicy::default()).unwrap()
}

/// With a `positions` artifact in the call context, both implementations
/// place the tiles exactly there (the library mosaic at those positions).
#[test]
fn registered_assemble_uses_the_positions_artifact() {
    let Some(dev) = gpu() else { return };
    let positions = grid(2, 3, (0.5, -3.25), (16.3, 18.6), 1.2, &[]);
    let mut table = Table::new(["x_px", "y_px"]);
    for (i, &(x, y)) in positions.iter().enumerate() {
        table.push(Some(i), vec![Cell::from(x), Cell::from(y)]).unwrap();
    }
    for dtype in DType::ALL {
        let tiles = random_stack(dtype, [positions.len(), TH, TW], 8);
        for blend in BLENDS {
            let arg = format!("blend={}", blend.name());
            let context = || CallContext::new(StackInfo::default(), BTreeMap::from([("positions".to_string(), table.clone())]));
            let host = call_assemble(&tiles, &[&arg], Device::Cpu, &mut context());
            let gpu = call_assemble(&tiles, &[&arg], dev, &mut context());
            assert_eq!(host, hcsflow_stitch::assemble(&tiles, &positions, blend).unwrap(), "{dtype} {arg}");
            check(&gpu, &host, &tiles, false, &format!("registry {dtype} {arg}"));
        }
    }
}

/// Without the artifact, the GPU implementation registers the tiles with the
/// host's `tile_positions` and the same grid arguments: the same positions,
/// so the same mosaic, and the same run-report notes as the host `assemble`.
#[test]
fn registered_assemble_without_positions_registers_like_the_host() {
    let Some(dev) = gpu() else { return };
    // A 2 × 2 grid cut from one noise image: 64² tiles, 25 % overlap, so
    // registration has real overlaps to align.
    let base = random_stack(DType::U16, [1, 112, 112], 9).to_f32();
    let tiles = ndarray::Array3::from_shape_fn((4, 64, 64), |(k, y, x)| base[[0, (k / 2) * 48 + y, (k % 2) * 48 + x]]);
    let tiles = Stack::from_f32_array(tiles, DType::U16);
    // Blank tiles cannot be aligned: both fall back to the nominal grid and say so.
    let blank = Stack::from_f32_array(ndarray::Array3::from_elem((4, 64, 64), 1000.0), DType::U16);
    let cases: [(&Stack, &[&str]); 3] = [
        (&tiles, &["grid_cols=2", "overlap=0.25"]),
        (&tiles, &["grid_cols=4", "overlap=0.25", "blend=max"]),
        (&blank, &["grid_cols=2", "overlap=0.25", "blend=none"]),
    ];
    let mut noted = false;
    for (tiles, args) in cases {
        let (mut host_ctx, mut gpu_ctx) = (CallContext::default(), CallContext::default());
        let host = call_assemble(tiles, args, Device::Cpu, &mut host_ctx);
        let gpu = call_assemble(tiles, args, dev, &mut gpu_ctx);
        check(&gpu, &host, tiles, false, &format!("{args:?}"));
        assert_eq!(gpu_ctx.notes(), host_ctx.notes(), "{args:?}");
        noted |= !host_ctx.notes().is_empty();
        eprintln!("{args:?}: notes {:?}", host_ctx.notes());
    }
    assert!(noted, "the blank grid's fallback is noted");
}
