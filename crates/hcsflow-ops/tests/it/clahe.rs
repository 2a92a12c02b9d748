//! CLAHE against scikit-image's `exposure.equalize_adapthist`, exactly: f32
//! results equal skimage's f32 output bit for bit; u8/u16 results equal
//! `img_as_ubyte` / `img_as_uint` of skimage's float64 output (the documented
//! dtype mapping). Inputs cover every dtype, odd sizes, regions larger than the
//! plane, constant planes, f32 outside [-1, 1], and non-default arguments.

use crate::common;

use common::{assert_exact, cells_stack, random_stack, Oracle};
use hcsflow_core::{DType, Stack};
use hcsflow_ops::clahe::{clahe, ClaheParams};
use ndarray::Array3;
use serde_json::json;

fn scaled(s: &Stack, factor: f32) -> Stack {
    Stack::from(s.to_f32().mapv(|v| v * factor))
}

fn inputs() -> Vec<(String, Stack)> {
    let mut v = Vec::new();
    for dtype in DType::ALL {
        v.push((format!("{dtype} cells 2x64x61"), cells_stack(dtype, [2, 64, 61], 1)));
        v.push((format!("{dtype} random 1x37x53"), random_stack(dtype, [1, 37, 53], 2)));
    }
    v.push(("f32 cells in [0, 1]".into(), scaled(&cells_stack(DType::F32, [1, 48, 50], 3), 1.0 / 60000.0)));
    v.push(("f32 random in [-1, 1]".into(), scaled(&random_stack(DType::F32, [1, 33, 40], 4), 1e-3)));
    v.push(("u16 1x1".into(), random_stack(DType::U16, [1, 1, 1], 5)));
    v.push(("u16 1x9 row".into(), random_stack(DType::U16, [1, 1, 9], 6)));
    v.push(("u16 constant".into(), Stack::from_f32_array(Array3::from_elem((1, 6, 7), 1234.0), DType::U16)));
    v.push(("u16 constant above 16383".into(), Stack::from_f32_array(Array3::from_elem((1, 9, 8), 40000.0), DType::U16)));
    v.push(("u8 constant 0".into(), Stack::zeros(DType::U8, [1, 5, 5])));
    v.push(("f32 constant 7".into(), Stack::from(Array3::<f32>::from_elem((1, 8, 9), 7.0))));
    v.push(("f32 two levels".into(), Stack::from(Array3::from_shape_fn((1, 12, 10), |(_, y, x)| ((y + x) % 2) as f32 * 0.25))));
    v
}

#[test]
fn clahe_matches_skimage_equalize_adapthist() {
    let Some(mut oracle) = Oracle::new() else { return };
    // (kernel_size, clip_limit, nbins): defaults, small and large regions,
    // anisotropic, no clipping, heavy clipping, few and many bins.
    type Case = (Option<(usize, usize)>, f64, usize);
    let cases: [Case; 8] = [
        (None, 0.01, 256),
        (Some((8, 8)), 0.01, 256),
        (Some((5, 13)), 0.03, 256),
        (Some((100, 100)), 0.01, 256),
        (None, 0.0, 256),
        (Some((7, 7)), 0.002, 64),
        (Some((16, 9)), 0.2, 3),
        (Some((10, 10)), 0.01, 16384),
    ];
    let mut jobs = Vec::new();
    for (name, s) in inputs() {
        for &(k, clip, nbins) in &cases {
            let kernel = k.map(|(ky, kx)| json!([ky, kx])).unwrap_or(json!(null));
            let j = oracle.add("clahe", &[&s], json!({"kernel_size": kernel, "clip_limit": clip, "nbins": nbins}));
            let params = ClaheParams { kernel_size: k, clip_limit: clip, nbins };
            jobs.push((format!("clahe {k:?} {clip} {nbins} on {name}"), s.dtype(), clahe(&s, &params).unwrap(), j));
        }
    }
    let refs = oracle.run();
    for (what, dtype, ours, j) in jobs {
        assert_eq!(ours.dtype(), dtype, "{what}");
        assert_exact(&ours, &refs[j], &what);
    }
}

#[test]
fn clahe_rejects_bad_input() {
    let nan = Stack::from(Array3::from_shape_fn((1, 4, 4), |(_, y, _)| if y == 2 { f32::NAN } else { 0.5 }));
    let err = clahe(&nan, &ClaheParams::default()).unwrap_err().to_string();
    assert!(err.contains("NaN or infinite"), "{err}");
    let s = random_stack(DType::U8, [1, 4, 4], 1);
    assert!(clahe(&s, &ClaheParams { nbins: 0, ..ClaheParams::default() }).is_err());
    assert!(clahe(&s, &ClaheParams { kernel_size: Some((0, 3)), ..ClaheParams::default() }).is_err());
    assert!(clahe(&s, &ClaheParams { clip_limit: f64::NAN, ..ClaheParams::default() }).is_err());
}
