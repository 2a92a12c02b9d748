//! `stack_slices` / `unstack_slices`: the only way 2D images become a 3D stack
//! for a function and back, with the validation rules of semantics.md §4.

use crate::convert::{ConversionError, ConversionPolicy, Conversions};
use crate::dtype::DType;
use crate::memory::{check_device, Array, Device, MemoryType};
use crate::stack::{HostArray, Stack};
use crate::with_pixels;

/// Why slices could not be stacked or a stack could not be split.
#[derive(Debug, Clone, PartialEq, thiserror::Error)]
pub enum SliceError {
    #[error("stack_slices: the list of slices is empty; a stack needs at least one 2D slice")]
    Empty,
    #[error("stack_slices: slice {index} is not 2D: it has shape {shape:?} ({} axes)", shape.len())]
    NotTwoD { index: usize, shape: Vec<usize> },
    #[error("stack_slices: slice {index} has shape {shape:?} but slice 0 has shape {expected:?}; all slices of a stack must have the same shape")]
    ShapeMismatch { index: usize, shape: Vec<usize>, expected: Vec<usize> },
    #[error(
        "stack_slices: slice {index} has dtype {dtype} but slice 0 has dtype {expected}; all slices of a stack must have the same dtype"
    )]
    DTypeMismatch { index: usize, dtype: DType, expected: DType },
    #[error("unstack_slices: the input is not 3D: it has shape {shape:?} ({} axes); expected [Z, Y, X]", shape.len())]
    NotThreeD { shape: Vec<usize> },
    #[error("invalid device {device} for memory type {memory_type}: {reason}")]
    BadDevice { memory_type: MemoryType, device: Device, reason: String },
    #[error(transparent)]
    Conversion(#[from] ConversionError),
}

fn to_host(array: Array, conversions: &Conversions, policy: ConversionPolicy) -> Result<HostArray, SliceError> {
    let route = conversions.plan(array.memory_type(), MemoryType::Host, array.device().runtime(), policy)?;
    match conversions.execute(&route, array, Device::Cpu)? {
        Array::Host(h) => Ok(h),
        Array::Device(b) => Err(SliceError::Conversion(ConversionError {
            from: b.memory_type(),
            to: MemoryType::Host,
            method: route.method.to_string(),
            reason: "converter returned a device array".into(),
        })),
    }
}

fn from_host(
    array: HostArray,
    memory_type: MemoryType,
    device: Device,
    conversions: &Conversions,
    policy: ConversionPolicy,
) -> Result<Array, SliceError> {
    let route = conversions.plan(MemoryType::Host, memory_type, device.runtime(), policy)?;
    Ok(conversions.execute(&route, Array::Host(array), device)?)
}

/// Stacks 2D slices into one `[N, Y, X]` array of `memory_type` on `device`.
///
/// Rules: the list is non-empty; every slice is 2D; all share slice 0's shape
/// and dtype; `device` can hold `memory_type`. Errors name the offending index
/// and the shapes involved. Slices may come from any memory type the build can
/// convert from.
pub fn stack_slices(
    slices: Vec<Array>,
    memory_type: MemoryType,
    device: Device,
    conversions: &Conversions,
    policy: ConversionPolicy,
) -> Result<Array, SliceError> {
    check_device(memory_type, device).map_err(|reason| SliceError::BadDevice { memory_type, device, reason })?;
    let first = slices.first().ok_or(SliceError::Empty)?;
    let expected = first.shape().to_vec();
    let expected_dtype = first.dtype();
    for (index, s) in slices.iter().enumerate() {
        if s.shape().len() != 2 {
            return Err(SliceError::NotTwoD { index, shape: s.shape().to_vec() });
        }
        if s.shape() != expected.as_slice() {
            return Err(SliceError::ShapeMismatch { index, shape: s.shape().to_vec(), expected: expected.clone() });
        }
        if s.dtype() != expected_dtype {
            return Err(SliceError::DTypeMismatch { index, dtype: s.dtype(), expected: expected_dtype });
        }
    }
    let host: Vec<HostArray> = slices.into_iter().map(|s| to_host(s, conversions, policy)).collect::<Result<_, _>>()?;
    let stacked = stack_host(&host, &expected)?;
    from_host(stacked.into_host_array(), memory_type, device, conversions, policy)
}

/// Stacks validated host slices (same shape and dtype, 2D). Internal helper.
fn stack_host(slices: &[HostArray], expected: &[usize]) -> Result<Stack, SliceError> {
    let planes: Vec<Stack> = slices
        .iter()
        .enumerate()
        .map(|(index, s)| {
            with_pixels!(HostArray, s, a, T => {
                let mismatch = |_| SliceError::ShapeMismatch { index, shape: a.shape().to_vec(), expected: expected.to_vec() };
                Stack::from_vec([1, a.shape()[0], a.shape()[1]], a.iter().copied().collect::<Vec<T>>()).map_err(mismatch)
            })
        })
        .collect::<Result<_, _>>()?;
    Ok(Stack::concat_owned(planes).unwrap_or_else(|| unreachable!("validated same shape and dtype")))
}

/// Splits a `[N, Y, X]` array into N 2D slices of `memory_type` on `device`.
pub fn unstack_slices(
    array: Array,
    memory_type: MemoryType,
    device: Device,
    conversions: &Conversions,
    policy: ConversionPolicy,
) -> Result<Vec<Array>, SliceError> {
    check_device(memory_type, device).map_err(|reason| SliceError::BadDevice { memory_type, device, reason })?;
    if array.shape().len() != 3 {
        return Err(SliceError::NotThreeD { shape: array.shape().to_vec() });
    }
    let host = to_host(array, conversions, policy)?;
    let n = host.shape()[0];
    (0..n).map(|i| from_host(host.index_first(i), memory_type, device, conversions, policy)).collect()
}
