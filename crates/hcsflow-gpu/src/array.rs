//! [`WgpuArray`]: pixels in GPU memory, and the host ↔ GPU transfers.

use std::any::Any;
use std::sync::Arc;

use cubecl::server::Handle;
use hcsflow_core::{with_pixels, Array, ConversionError, DType, Device, DeviceBuffer, HostArray, MemoryType, Stack};
use ndarray::{ArrayD, IxDyn};

use crate::context::{GpuContext, GpuError};

/// An array of 2 or more axes in GPU memory (`[.., Y, X]`; usually `[Z, Y, X]`).
///
/// Each `Y × X` plane occupies [`plane_words`](Self::plane_words) 32-bit words:
/// u8/u16 pixels are packed 4/2 per word (little-endian) and the plane is
/// padded to a whole word, so every kernel can address planes by word.
#[derive(Clone)]
pub struct WgpuArray {
    pub(crate) ctx: Arc<GpuContext>,
    pub(crate) handle: Handle,
    shape: Vec<usize>,
    dtype: DType,
}

impl std::fmt::Debug for WgpuArray {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "WgpuArray({:?} {} on {})", self.shape, self.dtype, self.ctx.info.name)
    }
}

/// Words needed for `pixels` pixels of `dtype`, rounded up.
pub(crate) fn words_for(dtype: DType, pixels: usize) -> usize {
    (pixels * dtype.size_bytes()).div_ceil(4)
}

impl WgpuArray {
    /// Wraps a buffer a kernel wrote. `handle` must hold `planes × plane_words` words.
    pub(crate) fn from_parts(ctx: Arc<GpuContext>, handle: Handle, shape: Vec<usize>, dtype: DType) -> Self {
        WgpuArray { ctx, handle, shape, dtype }
    }

    /// Pixels in one `Y × X` plane.
    pub fn plane_pixels(&self) -> usize {
        let n = self.shape.len();
        self.shape[n - 2] * self.shape[n - 1]
    }

    /// Number of planes (product of the leading axes).
    pub fn planes(&self) -> usize {
        self.shape[..self.shape.len() - 2].iter().product()
    }

    /// 32-bit words per plane, padding included.
    pub fn plane_words(&self) -> usize {
        words_for(self.dtype, self.plane_pixels())
    }

    pub fn context(&self) -> &Arc<GpuContext> {
        &self.ctx
    }
}

impl DeviceBuffer for WgpuArray {
    fn memory_type(&self) -> MemoryType {
        MemoryType::Wgpu
    }
    fn device(&self) -> Device {
        self.ctx.device
    }
    fn shape(&self) -> &[usize] {
        &self.shape
    }
    fn dtype(&self) -> DType {
        self.dtype
    }
    fn as_any(&self) -> &dyn Any {
        self
    }
}

/// Copies a host array of 2 or more axes to `device`.
pub fn upload(array: &HostArray, device: Device) -> Result<WgpuArray, GpuError> {
    let bytes: Option<&[u8]> = with_pixels!(HostArray, array, a, T => a.as_slice().map(bytemuck::cast_slice));
    upload_raw(device, array.shape().to_vec(), array.dtype(), bytes)
}

/// Copies a host stack to `device`.
pub fn upload_stack(stack: &Stack, device: Device) -> Result<WgpuArray, GpuError> {
    upload_raw(device, stack.shape().to_vec(), stack.dtype(), Some(stack.as_bytes()))
}

/// `bytes`: the pixels in standard layout, `None` if the array was not contiguous.
fn upload_raw(device: Device, shape: Vec<usize>, dtype: DType, bytes: Option<&[u8]>) -> Result<WgpuArray, GpuError> {
    let ctx = GpuContext::get(device)?;
    if shape.len() < 2 {
        return Err(ctx.runtime_error("upload", format!("arrays need at least 2 axes, got shape {shape:?}")));
    }
    let bytes = bytes.ok_or_else(|| ctx.runtime_error("upload", "array is not in standard layout"))?;
    let n = shape.len();
    let plane_pixels = shape[n - 2] * shape[n - 1];
    let plane_bytes = plane_pixels * dtype.size_bytes();
    let plane_words = words_for(dtype, plane_pixels);
    let planes: usize = shape[..n - 2].iter().product();
    let total = (planes * plane_words * 4).max(4);
    ctx.check_size("uploading the stack", total as u64)?;
    let handle = if plane_bytes.is_multiple_of(4) && !bytes.is_empty() {
        ctx.upload_bytes(bytes)
    } else {
        let mut padded = vec![0u8; total];
        for p in 0..planes {
            padded[p * plane_words * 4..p * plane_words * 4 + plane_bytes].copy_from_slice(&bytes[p * plane_bytes..(p + 1) * plane_bytes]);
        }
        ctx.upload_bytes(&padded)
    };
    Ok(WgpuArray { ctx, handle, shape, dtype })
}

/// Copies a GPU array back to the host.
pub fn download(array: &WgpuArray) -> Result<HostArray, GpuError> {
    let ctx = &array.ctx;
    let data = ctx.read_back(array.handle.clone()).map_err(|e| ctx.server_error("download", e))?;
    let bytes: &[u8] = &data;
    let plane_bytes = array.plane_pixels() * array.dtype.size_bytes();
    let stride = array.plane_words() * 4;
    let planes = array.planes();
    if bytes.len() < planes * stride {
        return Err(ctx.runtime_error("download", format!("buffer holds {} bytes, expected {}", bytes.len(), planes * stride)));
    }
    let mut packed = Vec::with_capacity(planes * plane_bytes);
    for p in 0..planes {
        packed.extend_from_slice(&bytes[p * stride..p * stride + plane_bytes]);
    }
    let shape = IxDyn(&array.shape);
    let host = match array.dtype {
        DType::U8 => ArrayD::from_shape_vec(shape, packed).map(HostArray::U8),
        DType::U16 => ArrayD::from_shape_vec(shape, bytemuck::pod_collect_to_vec::<u8, u16>(&packed)).map(HostArray::U16),
        DType::F32 => ArrayD::from_shape_vec(shape, bytemuck::pod_collect_to_vec::<u8, f32>(&packed)).map(HostArray::F32),
    };
    host.map_err(|e| ctx.runtime_error("download", e))
}

/// The [`WgpuArray`] inside an [`Array`], or a conversion error.
pub(crate) fn as_wgpu(array: &Array) -> Option<&WgpuArray> {
    match array {
        Array::Device(b) => b.as_any().downcast_ref::<WgpuArray>(),
        Array::Host(_) => None,
    }
}

/// host → wgpu.
pub(crate) struct Upload;
/// wgpu → host.
pub(crate) struct Download;

fn conversion_error(from: MemoryType, to: MemoryType, method: &str, reason: impl ToString) -> ConversionError {
    ConversionError { from, to, method: method.into(), reason: reason.to_string() }
}

impl hcsflow_core::convert::Converter for Upload {
    fn convert(&self, array: Array, device: Device) -> Result<Array, ConversionError> {
        let err = |r: String| conversion_error(MemoryType::Host, MemoryType::Wgpu, "upload", r);
        match array {
            Array::Host(h) => Ok(Array::Device(Arc::new(upload(&h, device).map_err(|e| err(e.to_string()))?))),
            Array::Device(b) => Err(err(format!("expected a host array, got {}", b.memory_type()))),
        }
    }
}

impl hcsflow_core::convert::Converter for Download {
    fn convert(&self, array: Array, _device: Device) -> Result<Array, ConversionError> {
        let err = |r: String| conversion_error(MemoryType::Wgpu, MemoryType::Host, "download", r);
        let a = as_wgpu(&array).ok_or_else(|| err(format!("expected a wgpu array, got {}", array.memory_type())))?;
        Ok(Array::Host(download(a).map_err(|e| err(e.to_string()))?))
    }
}
