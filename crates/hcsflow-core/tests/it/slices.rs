//! stack_slices / unstack_slices validation rules and messages (semantics.md §4).

use hcsflow_core::{
    stack_slices, unstack_slices, Array, ConversionPolicy, Conversions, DType, Device, HostArray, MemoryType, SliceError, Stack,
};
use ndarray::{Array3, ArrayD, IxDyn};

fn slice(h: usize, w: usize, fill: u16) -> Array {
    Array::Host(HostArray::from_2d(h, w, vec![fill; h * w]).unwrap())
}

fn run(slices: Vec<Array>) -> Result<Array, SliceError> {
    stack_slices(slices, MemoryType::Host, Device::Cpu, &Conversions::default(), ConversionPolicy::default())
}

#[test]
fn stacks_in_order_and_unstacks_back() {
    let slices: Vec<Array> = (0..3).map(|i| slice(2, 5, i as u16 * 10)).collect();
    let stacked = run(slices).unwrap();
    assert_eq!(stacked.shape(), &[3, 2, 5]);
    let Stack::U16(a) = stacked.clone().into_host_stack().unwrap() else { panic!("dtype") };
    for z in 0..3 {
        assert!(a.view().index_axis(ndarray::Axis(0), z).iter().all(|&v| v == z as u16 * 10));
    }
    let back = unstack_slices(stacked, MemoryType::Host, Device::Cpu, &Conversions::default(), ConversionPolicy::default()).unwrap();
    assert_eq!(back.len(), 3);
    for (z, s) in back.iter().enumerate() {
        assert_eq!(s.shape(), &[2, 5]);
        let Array::Host(HostArray::U16(v)) = s else { panic!("host u16") };
        assert!(v.iter().all(|&x| x == z as u16 * 10));
    }
}

#[test]
fn empty_list_is_an_error() {
    let err = run(vec![]).unwrap_err();
    assert_eq!(err, SliceError::Empty);
    assert!(err.to_string().contains("empty"), "{err}");
}

#[test]
fn non_2d_slice_names_its_index_and_shape() {
    let three_d = Array::Host(HostArray::from(ArrayD::<u16>::zeros(IxDyn(&[1, 2, 5]))));
    let err = run(vec![slice(2, 5, 0), slice(2, 5, 0), three_d]).unwrap_err();
    assert_eq!(err, SliceError::NotTwoD { index: 2, shape: vec![1, 2, 5] });
    assert_eq!(err.to_string(), "stack_slices: slice 2 is not 2D: it has shape [1, 2, 5] (3 axes)");
}

#[test]
fn mismatched_shape_names_index_and_both_shapes() {
    let err = run(vec![slice(2, 5, 0), slice(2, 4, 0)]).unwrap_err();
    assert_eq!(
        err.to_string(),
        "stack_slices: slice 1 has shape [2, 4] but slice 0 has shape [2, 5]; all slices of a stack must have the same shape"
    );
}

#[test]
fn mismatched_dtype_names_index() {
    let f = Array::Host(HostArray::from_2d(2, 5, vec![0f32; 10]).unwrap());
    let err = run(vec![slice(2, 5, 0), f]).unwrap_err();
    assert_eq!(err, SliceError::DTypeMismatch { index: 1, dtype: DType::F32, expected: DType::U16 });
    assert!(err.to_string().contains("slice 1 has dtype f32 but slice 0 has dtype u16"), "{err}");
}

#[test]
fn bad_device_for_memory_type() {
    let conv = Conversions::default();
    let p = ConversionPolicy::default();
    let err = stack_slices(vec![slice(2, 2, 0)], MemoryType::Host, Device::Gpu(0), &conv, p).unwrap_err();
    assert!(matches!(err, SliceError::BadDevice { device: Device::Gpu(0), .. }));
    assert!(err.to_string().contains("invalid device gpu:0 for memory type host"), "{err}");
    let err = stack_slices(vec![slice(2, 2, 0)], MemoryType::Wgpu, Device::Cpu, &conv, p).unwrap_err();
    assert!(err.to_string().contains("invalid device cpu for memory type wgpu"), "{err}");
    // torch has CPU tensors but none on a wgpu device; cupy has no CPU device.
    let err = unstack_slices(Array::from(Stack::zeros(DType::U8, [1, 2, 2])), MemoryType::Torch, Device::Gpu(0), &conv, p).unwrap_err();
    assert!(err.to_string().contains("invalid device gpu:0 for memory type torch: torch has no tensors on gpu:0"), "{err}");
    let err = unstack_slices(Array::from(Stack::zeros(DType::U8, [1, 2, 2])), MemoryType::Cupy, Device::Cpu, &conv, p).unwrap_err();
    assert!(err.to_string().contains("invalid device cpu for memory type cupy: cupy arrays live on a CUDA GPU"), "{err}");
    // On the cpu, torch is a route this build may lack: a conversion error, not a device error.
    let err = unstack_slices(Array::from(Stack::zeros(DType::U8, [1, 2, 2])), MemoryType::Torch, Device::Cpu, &conv, p).unwrap_err();
    assert!(matches!(err, SliceError::Conversion(_)), "{err:?}");
}

#[test]
fn unavailable_target_memory_is_a_conversion_error() {
    let err = stack_slices(vec![slice(2, 2, 0)], MemoryType::Wgpu, Device::Gpu(0), &Conversions::default(), ConversionPolicy::default())
        .unwrap_err();
    assert!(matches!(err, SliceError::Conversion(_)), "{err:?}");
    assert!(err.to_string().contains("host → wgpu"), "{err}");
}

#[test]
fn unstack_rejects_non_3d() {
    let two_d = slice(3, 3, 1);
    let err = unstack_slices(two_d, MemoryType::Host, Device::Cpu, &Conversions::default(), ConversionPolicy::default()).unwrap_err();
    assert_eq!(err, SliceError::NotThreeD { shape: vec![3, 3] });
    assert_eq!(err.to_string(), "unstack_slices: the input is not 3D: it has shape [3, 3] (2 axes); expected [Z, Y, X]");
}

#[test]
fn dtype_policy_clips_rounds_and_stretches() {
    use hcsflow_core::DTypeConversion::{Clip, Stretch};
    let f = Stack::from(Array3::from_shape_vec((1, 1, 6), vec![-3.0, 0.5, 1.5, 2.4999, 70000.0, f32::NAN]).unwrap());
    let Stack::U16(c) = f.clone().cast(DType::U16, Clip) else { panic!() };
    // numpy: np.clip(np.rint(x), 0, 65535) with NaN → 0 (rint rounds half to even).
    assert_eq!(c.pixels().to_vec(), vec![0, 0, 2, 2, 65535, 0]);
    let g = Stack::from(Array3::from_shape_vec((1, 1, 3), vec![10.0, 15.0, 20.0]).unwrap());
    let Stack::U8(s) = g.cast(DType::U8, Stretch) else { panic!() };
    assert_eq!(s.pixels().to_vec(), vec![0, 128, 255]);
    let constant = Stack::from(Array3::<f32>::from_elem((1, 2, 2), 7.0));
    let Stack::U8(k) = constant.cast(DType::U8, Stretch) else { panic!() };
    assert!(k.pixels().iter().all(|&v| v == 0));
}
