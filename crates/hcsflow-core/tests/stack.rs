//! Moving stacks apart and together: `concat_owned` and `into_planes` give
//! what the copying `concat` and `plane` give, whatever the arrays' layout.

use hcsflow_core::Stack;
use ndarray::{s, Array3};

fn ramp(shape: (usize, usize, usize), start: u16) -> Array3<u16> {
    let n = shape.0 * shape.1 * shape.2;
    Array3::from_shape_vec(shape, (0..n).map(|i| start.wrapping_add(i as u16)).collect()).unwrap()
}

#[test]
fn concat_owned_equals_concat_for_every_dtype_and_layout() {
    let a = Stack::from(ramp((2, 3, 5), 0));
    let b = Stack::from(ramp((1, 3, 5), 100));
    // A plane sliced out of a larger array (its pixels start at an offset)
    // and a stack whose Y and X axes are swapped in memory (not standard layout).
    let sliced = Stack::U16(ramp((4, 3, 5), 200).slice_move(s![2..3, .., ..]));
    let swapped = Stack::U16(ramp((1, 5, 3), 300).permuted_axes([0, 2, 1]));
    let parts = vec![a, b, sliced, swapped];
    let want = Stack::concat(&parts).unwrap();
    assert_eq!(want.shape(), [5, 3, 5]);
    assert_eq!(Stack::concat_owned(parts.clone()), Some(want.clone()));
    // The unusual layouts in first place, whose buffer is the one that grows.
    for first in [2, 3] {
        let mut reordered = parts.clone();
        reordered.swap(0, first);
        assert_eq!(Stack::concat_owned(reordered.clone()), Stack::concat(&reordered), "part {first} first");
    }
    for dtype in hcsflow_core::DType::ALL {
        let typed: Vec<Stack> = parts.iter().map(|p| p.clone().cast(dtype, Default::default())).collect();
        assert_eq!(Stack::concat_owned(typed.clone()), Stack::concat(&typed), "{dtype}");
    }
}

#[test]
fn concat_owned_refuses_what_concat_refuses() {
    assert_eq!(Stack::concat_owned(Vec::new()), None);
    let a = Stack::from(ramp((1, 3, 5), 0));
    let wider = Stack::from(ramp((1, 3, 6), 0));
    assert_eq!(Stack::concat_owned(vec![a.clone(), wider]), None);
    let other_dtype = a.clone().cast(hcsflow_core::DType::F32, Default::default());
    assert_eq!(Stack::concat_owned(vec![a.clone(), other_dtype]), None);
    // One part comes back as it is.
    assert_eq!(Stack::concat_owned(vec![a.clone()]), Some(a));
}

#[test]
fn into_planes_equals_plane_by_plane() {
    let stacks = [
        Stack::from(ramp((3, 4, 2), 7)),
        Stack::from(ramp((1, 4, 2), 9)),
        Stack::U16(ramp((5, 4, 2), 11).slice_move(s![1..4, .., ..])),
        Stack::U16(ramp((2, 2, 4), 13).permuted_axes([0, 2, 1])),
    ];
    for s in stacks {
        let want: Vec<Stack> = (0..s.depth()).map(|z| s.plane(z)).collect();
        let got = s.clone().into_planes();
        assert_eq!(got, want, "{:?}", s.shape());
        assert!(got.iter().all(|p| p.depth() == 1));
    }
    assert_eq!(Stack::from(ramp((0, 4, 2), 0)).into_planes().len(), 1);
}

#[test]
fn f32_to_integer_casts_round_ties_even_then_saturate() {
    use hcsflow_core::Pixel;
    let check = |v: f32| {
        assert_eq!(u16::from_f32_clip(v), v.round_ties_even() as u16, "u16 from {v:e}");
        assert_eq!(u8::from_f32_clip(v), v.round_ties_even() as u8, "u8 from {v:e}");
    };
    for v in [
        f32::NAN,
        -f32::NAN,
        f32::INFINITY,
        f32::NEG_INFINITY,
        f32::MAX,
        f32::MIN,
        -0.0,
        0.0,
        -0.5,
        -0.6,
        0.5,
        1.5,
        254.5,
        255.5,
        256.0,
        65_534.5,
        65_535.5,
        65_536.0,
        1e10,
        -1e10,
    ] {
        check(v);
    }
    for v in [1e-45, 1e-38, 1e-10, 0.1, 0.2499] {
        check(v);
        check(-v);
    }
    // Every f32 from 0.25 up to 2^17 (the u8 and u16 ranges, all their halves
    // and their neighbours) and its negative, through the bit patterns.
    for bits in 0.25f32.to_bits()..=131_072f32.to_bits() {
        let v = f32::from_bits(bits);
        check(v);
        check(-v);
    }
    // Beyond, up to 2^24 and a little past the largest f32.
    let mut v = 131_072.0f32;
    while v < 16_777_216.0 {
        check(v);
        check(v + 0.5);
        v *= 1.01;
    }
}
