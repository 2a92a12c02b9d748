//! `n2v_denoise` on the GPU: N2V2 trained and predicting on burn's wgpu backend, on the adapter and
//! queue of its input (burn is given the input's cubecl device, so it shares that queue's runtime).
//!
//! The network is burn's, not a kernel of this crate: the stack crosses from the input's buffer to
//! burn's tensors through the host, one download and one upload per call, both counted in the
//! transfers like any other copy (the plan and the run report show them). The arithmetic is
//! `hcsflow_n2v`'s model on burn's wgpu operations, which agrees with the host (`flex`) to float32
//! reduction order (the conformance test holds it to that).

use std::sync::Arc;

use hcsflow_core::{Array, CallContext, FunctionError};
use hcsflow_n2v::{N2vDenoiseArgs, N2V_DENOISE};

use super::wgpu_input;
use crate::array::{download, upload_stack};

pub(super) fn n2v_denoise(array: Array, args: &N2vDenoiseArgs, context: &mut CallContext) -> Result<Array, FunctionError> {
    const NAME: &str = N2V_DENOISE.name;
    let input = wgpu_input(NAME, &array)?;
    let ctx = input.context().clone();
    let host = download(input)
        .map_err(|e| e.into_function_error(NAME))?
        .into_stack()
        .map_err(|a| FunctionError::failed(NAME, format!("the GPU stack came back with {} axes, not 3", a.shape().len())))?;
    let device_name = format!("wgpu ({}, {}, queue {})", ctx.device, ctx.info.name, ctx.queue);
    let out = hcsflow_n2v::function::n2v_denoise_wgpu(&host, args, context, ctx.wgpu_device().clone(), &device_name)?;
    let uploaded = upload_stack(&out, ctx.device).map_err(|e| e.into_function_error(NAME))?;
    Ok(Array::Device(Arc::new(uploaded)))
}
