//! Helpers shared by the integration tests: stack generators over the test
//! PRNG (`hcsflow_testkit::Rng`). Not every test file uses every helper.
#![allow(dead_code)]

use hcsflow_core::Stack;
use ndarray::Array3;

pub use hcsflow_testkit::Rng;

/// A stack of `dtype` with values spread over the whole range of the type,
/// including its extremes; f32 stacks include NaN, ±inf, -0.0 and subnormals.
pub fn random_stack(dtype: hcsflow_core::DType, shape: [usize; 3], seed: u64) -> Stack {
    let mut rng = Rng::new(seed);
    let n = shape[0] * shape[1] * shape[2];
    match dtype {
        hcsflow_core::DType::U8 => {
            let mut v: Vec<u8> = (0..n).map(|_| rng.next_u64() as u8).collect();
            v[0] = 0;
            v[n - 1] = u8::MAX;
            Stack::from(Array3::from_shape_vec(shape, v).expect("shape"))
        }
        hcsflow_core::DType::U16 => {
            let mut v: Vec<u16> = (0..n).map(|_| rng.next_u64() as u16).collect();
            v[0] = 0;
            v[n - 1] = u16::MAX;
            Stack::from(Array3::from_shape_vec(shape, v).expect("shape"))
        }
        hcsflow_core::DType::F32 => {
            let mut v: Vec<f32> = (0..n).map(|_| (rng.next_u64() as i64 as f64 / i64::MAX as f64 * 1e4) as f32).collect();
            let special = [f32::NAN, f32::INFINITY, f32::NEG_INFINITY, -0.0, f32::MIN_POSITIVE / 4.0, f32::MAX];
            for (i, s) in special.iter().enumerate().take(n) {
                v[i] = *s;
            }
            Stack::from(Array3::from_shape_vec(shape, v).expect("shape"))
        }
    }
}

/// A smooth, compressible image (like a real micrograph, unlike noise).
pub fn smooth_u16(shape: [usize; 3]) -> Stack {
    Stack::from(Array3::<u16>::from_shape_fn(shape, |(z, y, x)| {
        (1000.0 + 500.0 * ((x as f32 / 17.0).sin() * (y as f32 / 23.0).cos()) + 100.0 * z as f32) as u16
    }))
}

/// Byte-exact equality (so NaN payloads and -0.0 count).
pub fn assert_same(a: &Stack, b: &Stack) {
    assert_eq!(a.dtype(), b.dtype(), "dtype");
    assert_eq!(a.shape(), b.shape(), "shape");
    assert!(a.as_bytes() == b.as_bytes(), "pixel bytes differ");
}
