//! Moving stacks apart and together: `concat_owned` and `into_planes` give
//! what the copying `concat` and `plane` give, whatever the arrays' layout.

use hcsflow_core::{Stack, StackArray};
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
    let sliced = Stack::from(ramp((4, 3, 5), 200).slice_move(s![2..3, .., ..]));
    let swapped = Stack::from(ramp((1, 5, 3), 300).permuted_axes([0, 2, 1]));
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
        Stack::from(ramp((5, 4, 2), 11).slice_move(s![1..4, .., ..])),
        Stack::from(ramp((2, 2, 4), 13).permuted_axes([0, 2, 1])),
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

/// A stack is in standard layout whatever array it is built from, so each
/// plane is one slice holding what indexing the array gives.
#[test]
fn stacks_are_standard_layout_and_planes_are_slices() {
    let sliced = ramp((5, 4, 3), 11).slice_move(s![1..4, .., ..]);
    let swapped = ramp((3, 3, 4), 13).permuted_axes([0, 2, 1]);
    let reversed = ramp((3, 4, 3), 17).slice_move(s![..;-1, .., ..]);
    for array in [sliced, swapped, reversed] {
        let mut stack = Stack::from(array.clone());
        let Stack::U16(a) = &stack else { panic!("u16") };
        assert!(a.view().is_standard_layout());
        assert_eq!(*a, array);
        assert_eq!(a.pixels(), array.iter().copied().collect::<Vec<_>>());
        assert_eq!(a.planes().len(), 3);
        for (z, plane) in a.planes().enumerate() {
            let want: Vec<u16> = array.index_axis(ndarray::Axis(0), z).iter().copied().collect();
            assert_eq!(plane, want, "plane {z}");
            assert_eq!(a.plane(z), want);
        }
        let Stack::U16(a) = &mut stack else { panic!("u16") };
        a.plane_mut(1).fill(7);
        a.planes_mut().nth(2).unwrap().fill(9);
        assert!(a.view().index_axis(ndarray::Axis(0), 1).iter().all(|&v| v == 7));
        assert!(a.view().index_axis(ndarray::Axis(0), 2).iter().all(|&v| v == 9));
        assert_eq!(a.view().index_axis(ndarray::Axis(0), 0), array.index_axis(ndarray::Axis(0), 0));
    }
    // Planes of a stack without pixels are empty, one per plane.
    let empty = hcsflow_core::StackArray::<u8>::zeros([2, 0, 5]);
    assert_eq!(empty.planes().map(<[u8]>::len).collect::<Vec<_>>(), vec![0, 0]);
}

#[test]
fn from_vec_checks_the_length() {
    let s = Stack::from_vec([2, 2, 3], (0..12u16).collect()).unwrap();
    assert_eq!(s, Stack::from(ramp((2, 2, 3), 0)));
    assert!(Stack::from_vec([2, 2, 3], vec![0u8; 11]).is_err());
    assert!(Stack::from_vec([2, 2, 3], vec![0f32; 13]).is_err());
}

/// Pixels of another library, for the shared-pixel tests: a buffer the
/// stack must read and never write.
struct Foreign(Vec<u16>);

impl hcsflow_core::SharedPixels<u16> for Foreign {
    fn pixels(&self) -> &[u16] {
        &self.0
    }
}

#[test]
fn shared_pixels_are_read_in_place_and_copied_before_a_write() {
    use hcsflow_core::StackArray;
    use std::sync::Arc;

    let foreign = Arc::new(Foreign((0..24).collect()));
    let address = foreign.0.as_ptr();
    let mut a = StackArray::shared([2, 3, 4], foreign.clone()).unwrap();
    assert!(a.is_shared());
    // Reads see the foreign buffer itself.
    assert_eq!(a.pixels().as_ptr(), address);
    assert_eq!(a.plane(1), &(12..24).collect::<Vec<u16>>()[..]);
    assert_eq!(a[[1, 2, 3]], 23);
    assert_eq!(a.view().dim(), (2, 3, 4));
    let clone = a.clone();
    assert_eq!(clone.pixels().as_ptr(), address, "a clone shares too");
    // A write copies first: the foreign buffer is untouched.
    a[[0, 0, 0]] = 100;
    assert!(!a.is_shared());
    assert_ne!(a.pixels().as_ptr(), address);
    assert_eq!(foreign.0[0], 0);
    assert_eq!(a.pixels()[0], 100);
    assert_eq!(a.pixels()[1..], foreign.0[1..]);
    let mut b = clone.clone();
    b.pixels_mut()[5] = 7;
    b.view_mut()[[1, 0, 0]] = 9;
    assert_eq!((foreign.0[5], foreign.0[12]), (5, 12));
    assert_eq!((b.pixels()[5], b.pixels()[12]), (7, 9));
    // Giving up the stack copies shared pixels; equality compares pixels wherever they are.
    assert_eq!(clone.clone().into_pixels(), foreign.0);
    assert_eq!(clone, StackArray::from_vec([2, 3, 4], foreign.0.clone()).unwrap());
    // The shape must match the pixels.
    assert!(StackArray::shared([2, 3, 5], foreign).is_err());
}

/// `from_planes` gives every plane the values its closure yields, in order,
/// completes a short plane with zeros, ignores extra values, and makes an
/// empty stack of an empty shape.
#[test]
fn from_planes_writes_every_value_once() {
    let (n, h, w) = (5, 3, 4);
    let s = StackArray::<f32>::from_planes([n, h, w], |z| (0..h * w).map(move |i| (z * 100 + i) as f32));
    let want: Vec<f32> = (0..n).flat_map(|z| (0..h * w).map(move |i| (z * 100 + i) as f32)).collect();
    assert_eq!(s.pixels(), want.as_slice());
    assert_eq!(s.dim(), (n, h, w));

    let short = StackArray::<u16>::from_planes([2, 2, 2], |z| std::iter::repeat_n(7 + z as u16, if z == 0 { 3 } else { 9 }));
    assert_eq!(short.pixels(), &[7, 7, 7, 0, 8, 8, 8, 8]);

    for shape in [[0, 2, 2], [2, 0, 2], [2, 2, 0]] {
        let empty = StackArray::<u8>::from_planes(shape, |_| std::iter::repeat(1));
        assert_eq!((empty.pixels().len(), empty.dim()), (0, (shape[0], shape[1], shape[2])));
    }
}
