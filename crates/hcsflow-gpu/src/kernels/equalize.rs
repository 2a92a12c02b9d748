//! Whole-stack histogram equalisation on the GPU: the u8/u16 histogram
//! kernel with atomics, the host's lookup table (`hcsflow_ops::equalize`,
//! the same code on 256 KB of counts), then the LUT kernel. Bit-exact with
//! the host. f32 stacks are not supported on the GPU yet (an error says to
//! run with --device cpu).

use hcsflow_core::{Args, Array, DType, DeviceBuffer, FunctionError};
use hcsflow_ops::equalize::equalize_lut;

use super::normalize::{apply_luts, failed, geometry, integer_histograms};
use super::wgpu_input;

const NAME: &str = "stack_equalize_histogram";

pub(super) fn stack_equalize_histogram(array: Array, _args: &Args) -> Result<Array, FunctionError> {
    let input = wgpu_input(NAME, &array)?;
    let g = geometry(NAME, input)?;
    let empty = || failed(NAME, "the stack has no pixels (or only NaN)");
    let hists = integer_histograms(NAME, input, &g, false)?;
    let hist = hists.first().ok_or_else(empty)?;
    let lut: Vec<u32> = match DeviceBuffer::dtype(input) {
        DType::U8 => equalize_lut::<u8>(hist).ok_or_else(empty)?.into_iter().map(u32::from).collect(),
        DType::U16 => equalize_lut::<u16>(hist).ok_or_else(empty)?.into_iter().map(u32::from).collect(),
        DType::F32 => {
            return Err(failed(NAME, "f32 stacks are equalised on the CPU only for now: run this step with --device cpu"))
        }
    };
    apply_luts(NAME, input, &g, &lut, 0)
}
