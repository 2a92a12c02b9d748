//! The U-Net's layers on the host, forward and backward, written for `flex` as a burn backend
//! extension: the 3 × 3 convolutions (stride 1, zero padding 1, bias), the 1 × 1 head, batch
//! norm with ReLU, MaxBlurPool and the bilinear ×2 upsampling; and masking's medians
//! ([`HostKernels::row_rank`]). Same arithmetic as the burn formulations in [`crate::model`] and
//! [`crate::masking`], which other backends (wgpu) keep and the tests compare with. burn `flex`
//! runs many of its operations (the 1 × 1 convolution, reductions) on the calling thread alone;
//! these share their work out among rayon's threads.
//!
//! **Convolution.**
//! burn `flex` 0.22.1 convolves by im2col + gemm and has no backward of its own: burn's defaults
//! take the input gradient as a transposed convolution (gemm + col2im) and the weight gradient as a
//! convolution of the input with the output gradient as a `H × W` kernel (an im2col 9× the
//! batch and gemms 9 columns wide). Those were most of a training step. Here all three are gemms
//! on a zero-padded copy of the input, without im2col: with the padded row length `Wp = W + 2`, a
//! kernel tap `(ky, kx)` is a flat shift `ky·Wp + kx` of the padded plane, so
//!
//! - forward: `out[co, p] = Σ_tap Σ_ci w[co, ci, tap] · xpad[ci, p + shift(tap)]` — nine gemms
//!   `[Co × Ci] · [Ci × H·Wp]` accumulating into a "wide" output whose two extra columns per row
//!   are dropped;
//! - input gradient: the same convolution of the padded output gradient with the weights
//!   transposed (`ci ↔ co`) and flipped (`tap → 8 − tap`);
//! - weight gradient: `dw[co, ci, tap] = Σ_b Σ_p g[b, co, p] · xpad[b, ci, p + shift(tap)]` with
//!   `g` zero on the extra columns — nine gemms `[Co × H·Wp] · [H·Wp × Ci]` per image;
//! - bias gradient: the sum of the output gradient over batch and pixels.
//!
//! Where the CPU has AVX-512F, the convolutions and weight gradients compute these same sums
//! in register blocks instead (the private `direct` module: about 1.5× the gemms' speed on these
//! shapes); the gemms are the fallback elsewhere and the reference of its tests. Convolutions with
//! at least 8 input channels over planes wide enough to fill Winograd's 16-tile units (forward,
//! input gradient, and the weight gradient when the output has 8 channels too) go through Winograd
//! F(2 × 2, 3 × 3) there (the private `winograd` module: 16 multiplies per 2 × 2 outputs instead
//! of 36, same sums up to rounding). In inference the convolution goes through F(4 × 4, 3 × 3)
//! instead (36 multiplies per 4 × 4 outputs) and applies batch norm and ReLU as it writes its
//! output ([`HostKernels::conv3x3_affine_relu`]).
//!
//! **MaxBlurPool** (burn `flex`: a 2 × 2 max pool of stride 1 that took ~100 ms on a `[16, 32,
//! 64, 64]` batch, then a grouped convolution): one pass per plane computing the 2 × 2 maximum and
//! the stride-2 binomial blur; backward scatters the blur's transpose onto the maxima and routes
//! each to the first largest of its 2 × 2 window (recomputed from the input).
//!
//! **Upsampling**: `¾ x[i] + ¼ x[i ∓ 1]` along rows then columns, per plane; backward is its
//! transpose, columns then rows.

use burn::backend::autodiff::checkpoint::base::Checkpointer;
use burn::backend::autodiff::checkpoint::strategy::CheckpointStrategy;
use burn::backend::autodiff::grads::Gradients;
use burn::backend::autodiff::ops::{Backward, Ops, OpsKind};
use burn::backend::autodiff::NodeId;
use burn::backend::flex::{FlexTensor, Layout};
use burn::backend::ops::{ConvOptions, ModuleOps};
use burn::backend::tensor::FloatTensor;
use burn::backend::{backend_extension, Autodiff, Backend, DType, Dispatch, DispatchDevice, Flex, TensorMetadata};
use burn::nn::BatchNorm;
use burn::tensor::activation::relu;
use burn::tensor::module::conv2d;
use burn::tensor::{Bytes, Device, Shape, Tensor};
use rayon::prelude::*;
use std::cell::RefCell;
use std::mem::MaybeUninit;

#[cfg(target_arch = "x86_64")]
mod direct;
#[cfg(target_arch = "x86_64")]
mod winograd;

/// The layers as backend operations (implemented for `flex` and autodiff over it).
#[backend_extension(Flex, Autodiff)]
pub trait HostKernels: Backend {
    /// `x` `[B, Ci, H, W]`, `weight` `[Co, Ci, 3, 3]`, `bias` `[Co]` → `[B, Co, H, W]`.
    fn conv3x3(x: FloatTensor<Self>, weight: FloatTensor<Self>, bias: FloatTensor<Self>) -> FloatTensor<Self>;
    /// `x` `[B, Ci, H, W]`, `weight` `[Co, Ci, 1, 1]`, `bias` `[Co]` → `[B, Co, H, W]`.
    fn conv1x1(x: FloatTensor<Self>, weight: FloatTensor<Self>, bias: FloatTensor<Self>) -> FloatTensor<Self>;
    /// MaxBlurPool, `[B, C, H, W]` → `[B, C, H/2, W/2]` (`H`, `W` ≥ 2).
    fn max_blur_pool(x: FloatTensor<Self>) -> FloatTensor<Self>;
    /// Bilinear ×2 upsampling with half-pixel centres, `[B, C, H, W]` → `[B, C, 2H, 2W]`.
    fn upsample2(x: FloatTensor<Self>) -> FloatTensor<Self>;
    /// `relu(γ·(x − mean)/sqrt(var + eps) + β)` with the batch's per-channel mean and biased
    /// variance (batch norm in training, then ReLU), `x` `[B, C, H, W]`, `γ`, `β` `[C]`; `stats`
    /// are [`HostKernels::batch_stats`] of `x` (not differentiated: the gradient through them is
    /// part of this operation's).
    fn batch_norm_relu(
        x: FloatTensor<Self>,
        stats: FloatTensor<Self>,
        gamma: FloatTensor<Self>,
        beta: FloatTensor<Self>,
        epsilon: f64,
    ) -> FloatTensor<Self>;
    /// The per-channel mean and biased variance of `x` `[B, C, H, W]`, `[2, C]`.
    fn batch_stats(x: FloatTensor<Self>) -> FloatTensor<Self>;
    /// The value of rank `rank` (0-based, in ascending order) of each row of `values` `[N, K]`
    /// (`rank < K`, no NaN), `[N]`; not differentiated.
    fn row_rank(values: FloatTensor<Self>, rank: usize) -> FloatTensor<Self>;
    /// `relu((conv3x3(x) + bias)·scale + shift)` per output channel: a convolution followed by
    /// batch norm in inference and ReLU, in one pass over the output. Composed of
    /// [`HostKernels::conv3x3`] and [`HostKernels::affine_relu`] by default.
    fn conv3x3_affine_relu(
        x: FloatTensor<Self>,
        weight: FloatTensor<Self>,
        bias: FloatTensor<Self>,
        scale: FloatTensor<Self>,
        shift: FloatTensor<Self>,
    ) -> FloatTensor<Self> {
        Self::affine_relu(Self::conv3x3(x, weight, bias), scale, shift)
    }
    /// `relu(x·scale + shift)` per channel (batch norm in inference, then ReLU), `x`
    /// `[B, C, H, W]`, `scale`, `shift` `[C]`. Composed of burn operations by default.
    fn affine_relu(x: FloatTensor<Self>, scale: FloatTensor<Self>, shift: FloatTensor<Self>) -> FloatTensor<Self> {
        let c = scale.shape()[0];
        let scale = Self::float_reshape(scale, Shape::new([1, c, 1, 1]));
        let shift = Self::float_reshape(shift, Shape::new([1, c, 1, 1]));
        Self::relu(Self::float_add(Self::float_mul(x, scale), shift))
    }
}

/// Whether `x` runs through this module's kernels: an f32 tensor on `flex` (plain or autodiff).
/// The functions below fall back to burn's formulation otherwise.
pub fn applies<const D: usize>(x: &Tensor<D>) -> bool {
    matches!(x.device().inner().as_dispatch(), DispatchDevice::Flex(_)) && x.dtype() == DType::F32
}

/// `relu(norm(x))`: batch norm with the batch statistics (updating the running ones as burn's
/// `BatchNorm` does) on an autodiff device with the layer training, with the running statistics
/// on a plain device, each followed by ReLU as one host kernel; burn's `BatchNorm` and `relu`
/// where the kernels do not apply (other backends, a frozen layer on an autodiff device).
pub fn batch_norm_relu(norm: &BatchNorm, x: Tensor<4>) -> Tensor<4> {
    let device = x.device();
    if !applies(&x) {
        return relu(norm.forward(x));
    }
    if !device.is_autodiff() {
        let (scale, shift) = inference_affine(norm, &device);
        return Tensor::from_dispatch(<Dispatch as HostKernels>::affine_relu(
            x.into_dispatch(),
            scale.into_dispatch(),
            shift.into_dispatch(),
        ));
    }
    if !norm.training.is_enabled() {
        return relu(norm.forward(x));
    }
    let stats = Tensor::<2>::from_dispatch(<Dispatch as HostKernels>::batch_stats(x.clone().inner().into_dispatch()));
    let stats = Tensor::<2>::from_inner(stats);
    let c = stats.dims()[1];
    let mean = stats.clone().slice([0..1, 0..c]).reshape([c]);
    let var = stats.clone().slice([1..2, 0..c]).reshape([c]);
    let out = Tensor::from_dispatch(<Dispatch as HostKernels>::batch_norm_relu(
        x.into_dispatch(),
        stats.into_dispatch(),
        norm.gamma.val().into_dispatch(),
        norm.beta.val().into_dispatch(),
        norm.epsilon,
    ));
    let m = norm.momentum;
    let running_mean = norm.running_mean.value_sync().to_device(&device).mul_scalar(1.0 - m).add(mean.mul_scalar(m));
    let running_var = norm.running_var.value_sync().to_device(&device).mul_scalar(1.0 - m).add(var.mul_scalar(m));
    norm.running_mean.update(running_mean.detach());
    norm.running_var.update(running_var.detach());
    out
}

/// Batch norm with the running statistics as a per-channel affine map `x·scale + shift`.
fn inference_affine(norm: &BatchNorm, device: &Device) -> (Tensor<1>, Tensor<1>) {
    let mean = norm.running_mean.value().to_device(device);
    let var = norm.running_var.value().to_device(device);
    let scale = norm.gamma.val().div(var.add_scalar(norm.epsilon).sqrt());
    let shift = norm.beta.val().sub(mean.mul(scale.clone()));
    (scale, shift)
}

/// `relu(norm(conv3x3(x)))`: on a plain `flex` device (inference, the running statistics) one
/// fused kernel ([`HostKernels::conv3x3_affine_relu`]), which writes each output once;
/// [`batch_norm_relu`] of [`conv3x3`] otherwise.
pub fn conv3x3_norm_relu(x: Tensor<4>, weight: Tensor<4>, bias: Tensor<1>, norm: &BatchNorm) -> Tensor<4> {
    let device = x.device();
    if applies(&x) && !device.is_autodiff() && weight.dims()[2..] == [3, 3] {
        let (scale, shift) = inference_affine(norm, &device);
        return Tensor::from_dispatch(<Dispatch as HostKernels>::conv3x3_affine_relu(
            x.into_dispatch(),
            weight.into_dispatch(),
            bias.into_dispatch(),
            scale.into_dispatch(),
            shift.into_dispatch(),
        ));
    }
    batch_norm_relu(norm, conv3x3(x, weight, bias))
}

/// The value of rank `rank` (0-based, ascending) of each row of `values` `[N, K]`, `[N]`, through
/// this module's kernel ([`HostKernels::row_rank`]: a selection per row) on `flex`; `None` on
/// other backends or for `rank ≥ K`.
pub fn row_rank(values: Tensor<2>, rank: usize) -> Option<Tensor<1>> {
    (applies(&values) && rank < values.dims()[1])
        .then(|| Tensor::from_dispatch(<Dispatch as HostKernels>::row_rank(values.into_dispatch(), rank)))
}

/// MaxBlurPool: this module's kernel where it [`applies`] and the planes are at least 2 × 2,
/// [`crate::model::max_blur_pool_composed`] otherwise.
pub fn max_blur_pool(x: Tensor<4>) -> Tensor<4> {
    let [_, _, h, w] = x.dims();
    if applies(&x) && h >= 2 && w >= 2 {
        Tensor::from_dispatch(<Dispatch as HostKernels>::max_blur_pool(x.into_dispatch()))
    } else {
        crate::model::max_blur_pool_composed(x)
    }
}

/// Bilinear ×2 upsampling: this module's kernel where it [`applies`],
/// [`crate::model::upsample_composed`] otherwise.
pub fn upsample2(x: Tensor<4>) -> Tensor<4> {
    if applies(&x) {
        Tensor::from_dispatch(<Dispatch as HostKernels>::upsample2(x.into_dispatch()))
    } else {
        crate::model::upsample_composed(x)
    }
}

fn options() -> ConvOptions<2> {
    ConvOptions::new([1, 1], [1, 1], [1, 1], 1)
}

/// A 3 × 3 convolution, stride 1, zero padding 1, with bias: this module's kernels where they
/// [`applies`], burn's `conv2d` otherwise.
pub fn conv3x3(x: Tensor<4>, weight: Tensor<4>, bias: Tensor<1>) -> Tensor<4> {
    if applies(&x) && weight.dims()[2..] == [3, 3] {
        Tensor::from_dispatch(<Dispatch as HostKernels>::conv3x3(x.into_dispatch(), weight.into_dispatch(), bias.into_dispatch()))
    } else {
        conv2d(x, weight, Some(bias), options())
    }
}

/// A 1 × 1 convolution with bias (the U-Net's head): this module's kernel where it [`applies`],
/// burn's `conv2d` otherwise.
pub fn conv1x1(x: Tensor<4>, weight: Tensor<4>, bias: Tensor<1>) -> Tensor<4> {
    if applies(&x) && weight.dims()[2..] == [1, 1] {
        Tensor::from_dispatch(<Dispatch as HostKernels>::conv1x1(x.into_dispatch(), weight.into_dispatch(), bias.into_dispatch()))
    } else {
        conv2d(x, weight, Some(bias), ConvOptions::new([1, 1], [0, 0], [1, 1], 1))
    }
}

fn is_f32(tensors: &[&FlexTensor]) -> bool {
    tensors.iter().all(|t| t.dtype() == DType::F32)
}

impl HostKernels for Flex {
    fn conv3x3(x: FlexTensor, weight: FlexTensor, bias: FlexTensor) -> FlexTensor {
        if !is_f32(&[&x, &weight, &bias]) {
            return <Flex as ModuleOps<Flex>>::conv2d(x, weight, Some(bias), options());
        }
        let [b, ci, h, w] = dims4(&x);
        let co = weight.shape()[0];
        let (x, weight, bias) = (x.to_contiguous(), weight.to_contiguous(), bias.to_contiguous());
        let (xs, ws, bs) = (f32s(&x), f32s(&weight), f32s(&bias));
        // w[co, ci, tap] at co·9Ci + ci·9 + tap: output rows (co) stride 9Ci, reduction (ci) stride 9.
        let out = conv_same(xs, [b, ci, h, w], co, ws, forward_taps(ci), &Epilogue { bias: Some(bs), affine: None }, Winograd::F2);
        tensor(out, [b, co, h, w])
    }

    fn conv3x3_affine_relu(x: FlexTensor, weight: FlexTensor, bias: FlexTensor, scale: FlexTensor, shift: FlexTensor) -> FlexTensor {
        if !is_f32(&[&x, &weight, &bias, &scale, &shift]) {
            return Self::affine_relu(Self::conv3x3(x, weight, bias), scale, shift);
        }
        let [b, ci, h, w] = dims4(&x);
        let co = weight.shape()[0];
        let (x, weight, bias) = (x.to_contiguous(), weight.to_contiguous(), bias.to_contiguous());
        let (scale, shift) = (scale.to_contiguous(), shift.to_contiguous());
        let epilogue = Epilogue { bias: Some(f32s(&bias)), affine: Some((f32s(&scale), f32s(&shift))) };
        let out = conv_same(f32s(&x), [b, ci, h, w], co, f32s(&weight), forward_taps(ci), &epilogue, Winograd::F4);
        tensor(out, [b, co, h, w])
    }

    fn conv1x1(x: FlexTensor, weight: FlexTensor, bias: FlexTensor) -> FlexTensor {
        if !is_f32(&[&x, &weight, &bias]) {
            return <Flex as ModuleOps<Flex>>::conv2d(x, weight, Some(bias), ConvOptions::new([1, 1], [0, 0], [1, 1], 1));
        }
        let [b, ci, h, w] = dims4(&x);
        let co = weight.shape()[0];
        let (x, weight, bias) = (x.to_contiguous(), weight.to_contiguous(), bias.to_contiguous());
        tensor(pointwise(f32s(&x), [ci, h * w], f32s(&weight), Some(f32s(&bias))), [b, co, h, w])
    }

    fn max_blur_pool(x: FlexTensor) -> FlexTensor {
        let [b, c, h, w] = dims4(&x);
        let x = x.to_contiguous();
        let (oh, ow) = pooled(h, w);
        // SAFETY: `max_blur_plane` writes every element of each plane.
        let out = unsafe { planes_written(f32s(&x), h * w, oh * ow, |_, src, dst| max_blur_plane(src, h, w, dst)) };
        tensor(out, [b, c, oh, ow])
    }

    fn upsample2(x: FlexTensor) -> FlexTensor {
        let [b, c, h, w] = dims4(&x);
        let x = x.to_contiguous();
        // SAFETY: `upsample_plane` writes every element of each plane.
        let out = unsafe { planes_written(f32s(&x), h * w, 4 * h * w, |_, src, dst| upsample_plane(src, h, w, dst)) };
        tensor(out, [b, c, 2 * h, 2 * w])
    }

    fn batch_norm_relu(x: FlexTensor, stats: FlexTensor, gamma: FlexTensor, beta: FlexTensor, epsilon: f64) -> FlexTensor {
        let [b, c, h, w] = dims4(&x);
        let (x, gamma, beta) = (x.to_contiguous(), gamma.to_contiguous(), beta.to_contiguous());
        let (mean, var) = mean_var(&stats, c);
        let affine = Affine::new(&mean, &var, f32s(&gamma), f32s(&beta), epsilon);
        let out = affine_relu_planes(f32s(&x), c, h * w, |ch| affine.of(ch));
        tensor(out, [b, c, h, w])
    }

    fn affine_relu(x: FlexTensor, scale: FlexTensor, shift: FlexTensor) -> FlexTensor {
        let [b, c, h, w] = dims4(&x);
        let (x, scale, shift) = (x.to_contiguous(), scale.to_contiguous(), shift.to_contiguous());
        let (sc, sh) = (f32s(&scale), f32s(&shift));
        let out = affine_relu_planes(f32s(&x), c, h * w, |ch| (sc[ch], sh[ch]));
        tensor(out, [b, c, h, w])
    }

    fn row_rank(values: FlexTensor, rank: usize) -> FlexTensor {
        let (n, k) = (values.shape()[0], values.shape()[1]);
        let values = values.to_contiguous();
        assert!(rank < k, "row_rank: rank {rank} of rows of {k}");
        let mut row = vec![0.0f32; k];
        let picked: Vec<f32> = f32s(&values)
            .chunks_exact(k)
            .map(|r| {
                row.copy_from_slice(r);
                *row.select_nth_unstable_by(rank, f32::total_cmp).1
            })
            .collect();
        FlexTensor::new(Bytes::from_elems(picked), Layout::contiguous(Shape::from(vec![n])), DType::F32)
    }

    fn batch_stats(x: FlexTensor) -> FlexTensor {
        let [b, c, h, w] = dims4(&x);
        let x = x.to_contiguous();
        let (mean, var) = channel_stats(f32s(&x), [b, c, h, w]);
        let values: Vec<f32> = mean.iter().chain(&var).map(|&v| v as f32).collect();
        FlexTensor::new(Bytes::from_elems(values), Layout::contiguous(Shape::from(vec![2, c])), DType::F32)
    }
}

/// The mean and variance rows of [`HostKernels::batch_stats`]' `[2, c]` result.
fn mean_var(stats: &FlexTensor, c: usize) -> (Vec<f64>, Vec<f64>) {
    let stats = stats.to_contiguous();
    let values: Vec<f64> = f32s(&stats).iter().map(|&v| v as f64).collect();
    assert!(values.len() == 2 * c, "batch norm: statistics of {} values for {c} channels", values.len());
    let (mean, var) = values.split_at(c);
    (mean.to_vec(), var.to_vec())
}

/// `relu(v·scale + shift)` for the values of `[B, C, plane]` planes, `(scale, shift)` of channel
/// `ch` given by `of(ch)`.
fn affine_relu_planes(x: &[f32], c: usize, plane: usize, of: impl Fn(usize) -> (f32, f32) + Sync) -> Vec<f32> {
    // SAFETY: every element of each plane is written.
    unsafe {
        planes_written(x, plane, plane, |i, src, dst| {
            let (scale, shift) = of(i % c);
            for (d, &v) in dst.iter_mut().zip(src) {
                d.write((v * scale + shift).max(0.0));
            }
        })
    }
}

/// A vector of `n` values written by `write` without zeroing them first (activations are tens of
/// megabytes: zeroing them was a tenth of a prediction).
///
/// # Safety
/// `write` must initialise every element of the slice it is given.
unsafe fn written(n: usize, write: impl FnOnce(&mut [MaybeUninit<f32>])) -> Vec<f32> {
    let mut out = Vec::<f32>::with_capacity(n);
    write(&mut out.spare_capacity_mut()[..n]);
    // SAFETY: the capacity is at least `n` and the caller promises all `n` are initialised.
    out.set_len(n);
    out
}

/// One plane of `dst_plane` values per plane of `src_plane` values of `src`, plane `i` written by
/// `f(i, source plane i, its output plane)`, the planes shared out among rayon's threads; not
/// zeroed first ([`written`]). Empty when either plane is.
///
/// # Safety
/// `f` must initialise every element of the output plane it is given.
unsafe fn planes_written(
    src: &[f32],
    src_plane: usize,
    dst_plane: usize,
    f: impl Fn(usize, &[f32], &mut [MaybeUninit<f32>]) + Sync,
) -> Vec<f32> {
    if src_plane == 0 || dst_plane == 0 {
        return Vec::new();
    }
    let write = |out: &mut [MaybeUninit<f32>]| {
        src.par_chunks_exact(src_plane).zip(out.par_chunks_exact_mut(dst_plane)).enumerate().for_each(|(i, (s, d))| f(i, s, d));
    };
    // SAFETY: the output planes, one per source plane, cover the `n` values, and the caller
    // promises `f` writes every element of each.
    written(src.len() / src_plane * dst_plane, write)
}

/// `dst` set to zero, as initialised values.
fn zeroed(dst: &mut [MaybeUninit<f32>]) -> &mut [f32] {
    for d in dst.iter_mut() {
        d.write(0.0);
    }
    // SAFETY: every element was just initialised, and `MaybeUninit<f32>` has `f32`'s layout.
    unsafe { &mut *(dst as *mut [MaybeUninit<f32>] as *mut [f32]) }
}

/// Per-channel mean and biased variance of `[B, C, H, W]` values (two passes; each plane summed
/// in f32 lanes, the planes in f64).
fn channel_stats(x: &[f32], [b, c, h, w]: [usize; 4]) -> (Vec<f64>, Vec<f64>) {
    let plane = h * w;
    let n = (b * plane).max(1) as f64;
    (0..c)
        .into_par_iter()
        .map(|ch| {
            let planes = || (0..b).map(move |i| &x[(i * c + ch) * plane..(i * c + ch + 1) * plane]);
            let mean = planes().map(|p| lane_sum(p, |v| v)).sum::<f64>() / n;
            let m = mean as f32;
            let var = planes().map(|p| lane_sum(p, |v| (v - m) * (v - m))).sum::<f64>() / n;
            (mean, var)
        })
        .unzip()
}

/// `Σ f(v)` over `values`, accumulated in 16 f32 lanes (vectorised) and returned as f64.
fn lane_sum(values: &[f32], f: impl Fn(f32) -> f32) -> f64 {
    let mut acc = [0.0f32; 16];
    let chunks = values.chunks_exact(16);
    let rest = chunks.remainder();
    for chunk in chunks {
        for (a, &v) in acc.iter_mut().zip(chunk) {
            *a += f(v);
        }
    }
    acc.iter().map(|&v| v as f64).sum::<f64>() + rest.iter().map(|&v| f(v) as f64).sum::<f64>()
}

/// Batch norm as a per-channel affine map: `y = x·scale + shift`, `scale = γ/sqrt(var + eps)`,
/// `shift = β − mean·scale`; `inv = 1/sqrt(var + eps)`.
struct Affine {
    scale: Vec<f32>,
    shift: Vec<f32>,
    inv: Vec<f32>,
    mean: Vec<f32>,
}

impl Affine {
    fn new(mean: &[f64], var: &[f64], gamma: &[f32], beta: &[f32], epsilon: f64) -> Self {
        let inv: Vec<f64> = var.iter().map(|&v| 1.0 / (v + epsilon).sqrt()).collect();
        let scale: Vec<f64> = inv.iter().zip(gamma).map(|(&i, &g)| i * g as f64).collect();
        let shift = beta.iter().zip(mean).zip(&scale).map(|((&b, &m), &s)| (b as f64 - m * s) as f32).collect();
        Self {
            scale: scale.into_iter().map(|v| v as f32).collect(),
            shift,
            inv: inv.into_iter().map(|v| v as f32).collect(),
            mean: mean.iter().map(|&v| v as f32).collect(),
        }
    }

    fn of(&self, ch: usize) -> (f32, f32) {
        (self.scale[ch], self.shift[ch])
    }
}

#[derive(Debug)]
struct Conv3x3Grad;

impl Backward<Flex, 3> for Conv3x3Grad {
    type State = (NodeId, NodeId);

    fn backward(self, ops: Ops<Self::State, 3>, grads: &mut Gradients, checkpointer: &mut Checkpointer) {
        let [node_x, node_w, node_b] = ops.parents;
        let grad = grads.consume::<Flex>(&ops.node);
        let (x_id, w_id) = ops.state;
        let x: FlexTensor = checkpointer.retrieve_node_output(x_id);
        let weight: FlexTensor = checkpointer.retrieve_node_output(w_id);
        if !is_f32(&[&x, &weight, &grad]) {
            // Not reached by this crate (f32 throughout); burn's own backward otherwise.
            if let Some(node) = node_x {
                grads.register::<Flex>(
                    node.id,
                    <Flex as ModuleOps<Flex>>::conv2d_x_backward(x.clone(), weight.clone(), grad.clone(), options()),
                );
            }
            if let Some(node) = node_w {
                grads.register::<Flex>(
                    node.id,
                    <Flex as ModuleOps<Flex>>::conv2d_weight_backward(x.clone(), weight, grad.clone(), options()),
                );
            }
            if let Some(node) = node_b {
                grads.register::<Flex>(node.id, bias_grad(&grad.to_contiguous(), dims4(&grad)));
            }
            return;
        }
        let [b, ci, h, w] = dims4(&x);
        let co = weight.shape()[0];
        let grad = grad.to_contiguous();
        let gs = f32s(&grad);
        if let Some(node) = node_x {
            let weight = weight.to_contiguous();
            // Transposed and flipped: output rows are ci (stride 9), the reduction runs over co
            // (stride 9Ci), tap t reads 8 − t.
            let taps = Taps { row_stride: 9, red_stride: 9 * ci, flip: true };
            let dx = conv_same(gs, [b, co, h, w], ci, f32s(&weight), taps, &Epilogue { bias: None, affine: None }, Winograd::F2);
            grads.register::<Flex>(node.id, tensor(dx, [b, ci, h, w]));
        }
        if let Some(node) = node_w {
            let x = x.to_contiguous();
            let dw = weight_grad(f32s(&x), gs, [b, ci, h, w], co);
            grads.register::<Flex>(node.id, tensor(dw, [co, ci, 3, 3]));
        }
        if let Some(node) = node_b {
            grads.register::<Flex>(node.id, bias_grad(&grad, [b, co, h, w]));
        }
    }
}

#[derive(Debug)]
struct Conv1x1Grad;

impl Backward<Flex, 3> for Conv1x1Grad {
    type State = (NodeId, NodeId);

    fn backward(self, ops: Ops<Self::State, 3>, grads: &mut Gradients, checkpointer: &mut Checkpointer) {
        let [node_x, node_w, node_b] = ops.parents;
        let grad = grads.consume::<Flex>(&ops.node).to_contiguous();
        let (x_id, w_id) = ops.state;
        let x: FlexTensor = checkpointer.retrieve_node_output::<FlexTensor>(x_id).to_contiguous();
        let weight: FlexTensor = checkpointer.retrieve_node_output::<FlexTensor>(w_id).to_contiguous();
        // Reached only through `conv1x1` on an f32 input (`applies`), with this crate's f32
        // parameters.
        let [b, ci, h, w] = dims4(&x);
        let co = weight.shape()[0];
        let (xs, ws, gs) = (f32s(&x), f32s(&weight), f32s(&grad));
        if let Some(node) = node_x {
            // dx[c] = Σ_o w[o, c] · g[o]: the same kernel with the weights transposed.
            let transposed: Vec<f32> = (0..ci * co).map(|i| ws[(i % co) * ci + i / co]).collect();
            grads.register::<Flex>(node.id, tensor(pointwise(gs, [co, h * w], &transposed, None), [b, ci, h, w]));
        }
        if let Some(node) = node_w {
            grads.register::<Flex>(node.id, tensor(pointwise_weight_grad(xs, gs, [b, ci, h * w], co), [co, ci, 1, 1]));
        }
        if let Some(node) = node_b {
            grads.register::<Flex>(node.id, bias_grad(&grad, [b, co, h, w]));
        }
    }
}

/// `out[b, o, p] = bias[o] + Σ_c weight[o, c] · x[b, c, p]` for `x` `[B, C, P]` (`[c, p]` given)
/// and `weight` `[O, C]`, as `[B, O, P]`: one image per task, the pixels in blocks that stay in
/// L1 while the channels are summed into them.
fn pointwise(x: &[f32], [c, p]: [usize; 2], weight: &[f32], bias: Option<&[f32]>) -> Vec<f32> {
    const BLOCK: usize = 1024;
    let o = weight.len().checked_div(c).unwrap_or(0);
    assert!(weight.len() == o * c && bias.is_none_or(|b| b.len() == o), "conv1x1: inconsistent sizes");
    // SAFETY: every element of each image's `o` output planes is written (each block of each).
    unsafe {
        planes_written(x, c * p, o * p, |_, src, dst| {
            let mut acc = [0.0f32; BLOCK];
            for (k, out) in dst.chunks_exact_mut(p).enumerate() {
                for start in (0..p).step_by(BLOCK) {
                    let len = BLOCK.min(p - start);
                    let acc = &mut acc[..len];
                    acc.fill(bias.map_or(0.0, |b| b[k]));
                    for (ch, &wv) in weight[k * c..(k + 1) * c].iter().enumerate() {
                        for (a, &v) in acc.iter_mut().zip(&src[ch * p + start..][..len]) {
                            *a += wv * v;
                        }
                    }
                    for (d, &a) in out[start..start + len].iter_mut().zip(acc.iter()) {
                        d.write(a);
                    }
                }
            }
        })
    }
}

/// `dw[o, c] = Σ_b Σ_p g[b, o, p] · x[b, c, p]` for `x` `[B, C, P]` and `g` `[B, O, P]`, as
/// `[O, C]`: each image's sums in f32 lanes on its own task, the images added in f64.
fn pointwise_weight_grad(x: &[f32], g: &[f32], [b, c, p]: [usize; 3], o: usize) -> Vec<f32> {
    assert!(x.len() == b * c * p && g.len() == b * o * p, "conv1x1: inconsistent sizes");
    let dot = |a: &[f32], z: &[f32]| {
        let mut lanes = [0.0f32; 16];
        let (ca, cz) = (a.chunks_exact(16), z.chunks_exact(16));
        let rest: f64 = ca.remainder().iter().zip(cz.remainder()).map(|(&u, &v)| (u * v) as f64).sum();
        for (u, v) in ca.zip(cz) {
            for l in 0..16 {
                lanes[l] += u[l] * v[l];
            }
        }
        rest + lanes.iter().map(|&v| v as f64).sum::<f64>()
    };
    let per_image: Vec<Vec<f64>> = (0..b)
        .into_par_iter()
        .map(|i| (0..o * c).map(|k| dot(&g[(i * o + k / c) * p..][..p], &x[(i * c + k % c) * p..][..p])).collect())
        .collect();
    (0..o * c).map(|k| per_image.iter().map(|v| v[k]).sum::<f64>() as f32).collect()
}

#[derive(Debug)]
struct MaxBlurPoolGrad;

impl Backward<Flex, 1> for MaxBlurPoolGrad {
    type State = NodeId;

    fn backward(self, ops: Ops<Self::State, 1>, grads: &mut Gradients, checkpointer: &mut Checkpointer) {
        let [node_x] = ops.parents;
        let grad = grads.consume::<Flex>(&ops.node).to_contiguous();
        let x: FlexTensor = checkpointer.retrieve_node_output(ops.state);
        if let Some(node) = node_x {
            let [b, c, h, w] = dims4(&x);
            let x = x.to_contiguous();
            let (oh, ow) = pooled(h, w);
            let g = f32s(&grad);
            // SAFETY: each plane is zeroed.
            let dx = unsafe {
                planes_written(f32s(&x), h * w, h * w, |i, src, dst| {
                    max_blur_plane_backward(src, h, w, &g[i * oh * ow..(i + 1) * oh * ow], zeroed(dst))
                })
            };
            grads.register::<Flex>(node.id, tensor(dx, [b, c, h, w]));
        }
    }
}

#[derive(Debug)]
struct UpsampleGrad;

impl Backward<Flex, 1> for UpsampleGrad {
    type State = ();

    fn backward(self, ops: Ops<Self::State, 1>, grads: &mut Gradients, _checkpointer: &mut Checkpointer) {
        let [node_x] = ops.parents;
        let grad = grads.consume::<Flex>(&ops.node).to_contiguous();
        if let Some(node) = node_x {
            let [b, c, h2, w2] = dims4(&grad);
            let (h, w) = (h2 / 2, w2 / 2);
            // SAFETY: each plane is zeroed.
            let dx = unsafe { planes_written(f32s(&grad), 4 * h * w, h * w, |_, g, dst| upsample_plane_backward(g, h, w, zeroed(dst))) };
            grads.register::<Flex>(node.id, tensor(dx, [b, c, h, w]));
        }
    }
}

#[derive(Debug)]
struct BatchNormReluGrad;

impl Backward<Flex, 3> for BatchNormReluGrad {
    /// The input, γ and β (checkpointed), the input's statistics and epsilon.
    type State = (NodeId, NodeId, NodeId, FlexTensor, f64);

    fn backward(self, ops: Ops<Self::State, 3>, grads: &mut Gradients, checkpointer: &mut Checkpointer) {
        let [node_x, node_gamma, node_beta] = ops.parents;
        let grad = grads.consume::<Flex>(&ops.node).to_contiguous();
        let (x_id, gamma_id, beta_id, stats, epsilon) = ops.state;
        let x: FlexTensor = checkpointer.retrieve_node_output(x_id);
        let gamma: FlexTensor = checkpointer.retrieve_node_output(gamma_id);
        let beta: FlexTensor = checkpointer.retrieve_node_output(beta_id);
        let [b, c, h, w] = dims4(&x);
        let (x, gamma, beta) = (x.to_contiguous(), gamma.to_contiguous(), beta.to_contiguous());
        let (xs, gs, gam) = (f32s(&x), f32s(&grad), f32s(&gamma));
        let (mean, var) = mean_var(&stats, c);
        let affine = Affine::new(&mean, &var, gam, f32s(&beta), epsilon);
        let plane = h * w;
        // Per channel: Σ g' and Σ g'·x̂ with g' the gradient where the ReLU passed.
        let (dbeta, dgamma): (Vec<f64>, Vec<f64>) = (0..c)
            .into_par_iter()
            .map(|ch| {
                let (scale, shift) = affine.of(ch);
                let (m, inv) = (affine.mean[ch], affine.inv[ch]);
                let (mut sb, mut sg) = (0.0f64, 0.0f64);
                for i in 0..b {
                    let range = (i * c + ch) * plane..(i * c + ch + 1) * plane;
                    let (xp, gp) = (&xs[range.clone()], &gs[range]);
                    // 16 f32 lanes per plane (vectorised), planes summed in f64.
                    let (mut pb, mut pg) = ([0.0f32; 16], [0.0f32; 16]);
                    let mut k = 0;
                    while k + 16 <= xp.len() {
                        for l in 0..16 {
                            let (v, g) = (xp[k + l], gp[k + l]);
                            let g = if v * scale + shift > 0.0 { g } else { 0.0 };
                            pb[l] += g;
                            pg[l] += g * (v - m) * inv;
                        }
                        k += 16;
                    }
                    for (&v, &g) in xp[k..].iter().zip(&gp[k..]) {
                        let g = if v * scale + shift > 0.0 { g } else { 0.0 };
                        sb += g as f64;
                        sg += (g * (v - m) * inv) as f64;
                    }
                    sb += pb.iter().map(|&v| v as f64).sum::<f64>();
                    sg += pg.iter().map(|&v| v as f64).sum::<f64>();
                }
                (sb, sg)
            })
            .unzip();
        if let Some(node) = node_x {
            let n = (b * plane) as f32;
            // SAFETY: every element of each plane is written.
            let dx = unsafe {
                planes_written(xs, plane, plane, |i, src, dst| {
                    let ch = i % c;
                    let (scale, shift) = affine.of(ch);
                    let (m, inv) = (affine.mean[ch], affine.inv[ch]);
                    let (db, dg) = (dbeta[ch] as f32, dgamma[ch] as f32);
                    let k = gam[ch] * inv / n;
                    for ((d, &v), &g) in dst.iter_mut().zip(src).zip(&gs[i * plane..(i + 1) * plane]) {
                        let g = if v * scale + shift > 0.0 { g } else { 0.0 };
                        d.write(k * (n * g - db - (v - m) * inv * dg));
                    }
                })
            };
            grads.register::<Flex>(node.id, tensor(dx, [b, c, h, w]));
        }
        let vector = |v: Vec<f64>| {
            let values: Vec<f32> = v.into_iter().map(|v| v as f32).collect();
            FlexTensor::new(Bytes::from_elems(values), Layout::contiguous(Shape::from(vec![c])), DType::F32)
        };
        if let Some(node) = node_gamma {
            grads.register::<Flex>(node.id, vector(dgamma));
        }
        if let Some(node) = node_beta {
            grads.register::<Flex>(node.id, vector(dbeta));
        }
    }
}

impl<C: CheckpointStrategy> HostKernels for Autodiff<Flex, C> {
    fn batch_norm_relu(
        x: FloatTensor<Self>,
        stats: FloatTensor<Self>,
        gamma: FloatTensor<Self>,
        beta: FloatTensor<Self>,
        epsilon: f64,
    ) -> FloatTensor<Self> {
        let stats = stats.into_primitive();
        match BatchNormReluGrad.prepare::<C>([x.node(), gamma.node(), beta.node()]).compute_bound().stateful() {
            OpsKind::Tracked(mut prep) => {
                let state = (prep.checkpoint(&x), prep.checkpoint(&gamma), prep.checkpoint(&beta), stats.clone(), epsilon);
                let out = <Flex as HostKernels>::batch_norm_relu(
                    x.into_primitive(),
                    stats,
                    gamma.into_primitive(),
                    beta.into_primitive(),
                    epsilon,
                );
                prep.finish(state, out)
            }
            OpsKind::UnTracked(prep) => prep.finish(<Flex as HostKernels>::batch_norm_relu(
                x.into_primitive(),
                stats,
                gamma.into_primitive(),
                beta.into_primitive(),
                epsilon,
            )),
        }
    }

    fn batch_stats(x: FloatTensor<Self>) -> FloatTensor<Self> {
        // A new leaf: the statistics are not differentiated (the running averages use them
        // detached; the gradient through them is part of `batch_norm_relu`'s).
        FloatTensor::<Self>::new(<Flex as HostKernels>::batch_stats(x.into_primitive()))
    }

    fn row_rank(values: FloatTensor<Self>, rank: usize) -> FloatTensor<Self> {
        // A new leaf, as `batch_stats`: masking's medians are not differentiated.
        FloatTensor::<Self>::new(<Flex as HostKernels>::row_rank(values.into_primitive(), rank))
    }

    fn conv1x1(x: FloatTensor<Self>, weight: FloatTensor<Self>, bias: FloatTensor<Self>) -> FloatTensor<Self> {
        tracked_conv::<C, _>(Conv1x1Grad, [x, weight, bias], <Flex as HostKernels>::conv1x1)
    }

    fn max_blur_pool(x: FloatTensor<Self>) -> FloatTensor<Self> {
        match MaxBlurPoolGrad.prepare::<C>([x.node()]).compute_bound().stateful() {
            OpsKind::Tracked(mut prep) => {
                let id = prep.checkpoint(&x);
                prep.finish(id, <Flex as HostKernels>::max_blur_pool(x.into_primitive()))
            }
            OpsKind::UnTracked(prep) => prep.finish(<Flex as HostKernels>::max_blur_pool(x.into_primitive())),
        }
    }

    fn upsample2(x: FloatTensor<Self>) -> FloatTensor<Self> {
        match UpsampleGrad.prepare::<C>([x.node()]).compute_bound().stateful() {
            OpsKind::Tracked(prep) => prep.finish((), <Flex as HostKernels>::upsample2(x.into_primitive())),
            OpsKind::UnTracked(prep) => prep.finish(<Flex as HostKernels>::upsample2(x.into_primitive())),
        }
    }

    fn conv3x3(x: FloatTensor<Self>, weight: FloatTensor<Self>, bias: FloatTensor<Self>) -> FloatTensor<Self> {
        tracked_conv::<C, _>(Conv3x3Grad, [x, weight, bias], <Flex as HostKernels>::conv3x3)
    }
}

/// A convolution `forward(x, weight, bias)` on the autodiff device: `op`'s node, with `x` and the
/// weights checkpointed for its backward when the graph tracks it.
fn tracked_conv<C: CheckpointStrategy, G: Backward<Flex, 3, State = (NodeId, NodeId)>>(
    op: G,
    [x, weight, bias]: [FloatTensor<Autodiff<Flex, C>>; 3],
    forward: fn(FlexTensor, FlexTensor, FlexTensor) -> FlexTensor,
) -> FloatTensor<Autodiff<Flex, C>> {
    match op.prepare::<C>([x.node(), weight.node(), bias.node()]).compute_bound().stateful() {
        OpsKind::Tracked(mut prep) => {
            let state = (prep.checkpoint(&x), prep.checkpoint(&weight));
            prep.finish(state, forward(x.into_primitive(), weight.into_primitive(), bias.into_primitive()))
        }
        OpsKind::UnTracked(prep) => prep.finish(forward(x.into_primitive(), weight.into_primitive(), bias.into_primitive())),
    }
}

fn dims4(t: &FlexTensor) -> [usize; 4] {
    let s = t.shape();
    [s[0], s[1], s[2], s[3]]
}

/// The values of a contiguous f32 tensor.
fn f32s(t: &FlexTensor) -> &[f32] {
    // Contiguous by construction (`to_contiguous`) and f32 (checked by the callers).
    t.as_slice::<f32>().unwrap_or(&[])
}

fn tensor(values: Vec<f32>, shape: [usize; 4]) -> FlexTensor {
    FlexTensor::new(Bytes::from_elems(values), Layout::contiguous(Shape::from(shape.to_vec())), DType::F32)
}

/// The bias gradient: `[B, Co, H, W]` summed to `[Co]`.
fn bias_grad(grad: &FlexTensor, [b, co, h, w]: [usize; 4]) -> FlexTensor {
    let g = f32s(grad);
    let plane = h * w;
    assert!(g.len() >= b * co * plane, "conv3x3: inconsistent sizes");
    let sum = |c: usize| (0..b).map(|i| lane_sum(&g[(i * co + c) * plane..][..plane], |v| v)).sum::<f64>() as f32;
    let values: Vec<f32> = (0..co).into_par_iter().map(sum).collect();
    FlexTensor::new(Bytes::from_elems(values), Layout::contiguous(Shape::from(vec![co])), DType::F32)
}

/// How the weights `[Co, Ci, 3, 3]` are read as the matrix of one tap: the stride between output
/// rows, the stride along the reduction, and whether tap `t` reads `8 − t` (the input gradient).
#[derive(Clone, Copy)]
struct Taps {
    row_stride: usize,
    red_stride: usize,
    flip: bool,
}

/// The forward layout of `[Co, Ci, 3, 3]` weights: `w[co, ci, tap]` at `co·9Ci + ci·9 + tap`.
const fn forward_taps(ci: usize) -> Taps {
    Taps { row_stride: 9 * ci, red_stride: 9, flip: false }
}

/// The Winograd transform [`conv_same`] uses on AVX-512 where it suits the shape.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Winograd {
    /// F(2 × 2, 3 × 3): 16 multiplies per 2 × 2 outputs and input channel (4 per output), with
    /// transforms of ±1 and ½. Training (forward and input gradient; the weight gradient is
    /// written for it too).
    F2,
    /// F(4 × 4, 3 × 3): 36 multiplies per 4 × 4 outputs (2.25 per output) and fewer transformed
    /// values to write and read per output, with transforms of up to ×8 and 1/24 that round more
    /// (within the same 1e-5 of the sum of absolute products in the kernel tests, though). Inference.
    F4,
}

/// What [`conv_same`] applies to each output value `s` of channel `c`:
/// `(s + bias[c])·scale[c] + shift[c]`, then ReLU when `affine` is given (batch norm in inference
/// and ReLU fused into the convolution); `s + bias[c]` otherwise.
struct Epilogue<'a> {
    bias: Option<&'a [f32]>,
    affine: Option<(&'a [f32], &'a [f32])>,
}

/// [`Epilogue`] for one channel: `v ↦ (v + add)·scale + shift`, then `max(·, 0)` if `relu`.
#[derive(Clone, Copy)]
struct Map {
    add: f32,
    scale: f32,
    shift: f32,
    relu: bool,
}

impl Epilogue<'_> {
    fn of(&self, c: usize) -> Map {
        let add = self.bias.map_or(0.0, |b| b[c]);
        match self.affine {
            Some((scale, shift)) => Map { add, scale: scale[c], shift: shift[c], relu: true },
            None => Map { add, scale: 1.0, shift: 0.0, relu: false },
        }
    }
}

impl Map {
    /// `dst[i] = map(src[i])`.
    fn apply(self, src: &[f32], dst: &mut [MaybeUninit<f32>]) {
        if self.relu {
            for (d, &s) in dst.iter_mut().zip(src) {
                d.write(((s + self.add) * self.scale + self.shift).max(0.0));
            }
        } else {
            for (d, &s) in dst.iter_mut().zip(src) {
                d.write((s + self.add) * self.scale + self.shift);
            }
        }
    }
}

/// The padded geometry of an `h × w` plane: row length `w + 2`, a plane of `(h + 2)(w + 2)`
/// plus 2 elements of slack (the bottom-right tap reads 2 past the padded plane on the extra
/// columns), and the wide output length `h·(w + 2)`.
#[derive(Clone, Copy)]
struct Padded {
    h: usize,
    w: usize,
    row: usize,
    plane: usize,
    wide: usize,
}

impl Padded {
    fn new(h: usize, w: usize) -> Self {
        let row = w + 2;
        Self { h, w, row, plane: (h + 2) * row + 2, wide: h * row }
    }

    /// Flat shift of tap `t` (`ky = t / 3`, `kx = t % 3`).
    fn shift(&self, t: usize) -> usize {
        (t / 3) * self.row + t % 3
    }

    /// Copies `channels` planes `[channels, h, w]` into the interior of `dst` (`[channels,
    /// plane]` then any slack, zero elsewhere). Only the border is zeroed. The planes are shared
    /// out among rayon's threads when `parallel`.
    fn fill(&self, src: &[f32], channels: usize, dst: &mut [f32], parallel: bool) {
        let (interior, slack) = dst.split_at_mut(channels * self.plane);
        let plane = |(s, d): (&[f32], &mut [f32])| {
            // The top row and the left border of the first row.
            d[..self.row + 1].fill(0.0);
            for y in 0..self.h {
                let o = (y + 1) * self.row + 1;
                d[o..o + self.w].copy_from_slice(&s[y * self.w..(y + 1) * self.w]);
                // The right border of this row and the left border of the next.
                d[o + self.w..o + self.w + 2].fill(0.0);
            }
            // The bottom row (past its left border, written above) and the 2 of slack.
            d[(self.h + 1) * self.row + 1..].fill(0.0);
        };
        let src = &src[..channels * self.h * self.w];
        if parallel {
            src.par_chunks_exact(self.h * self.w).zip(interior.par_chunks_exact_mut(self.plane)).for_each(plane);
        } else {
            src.chunks_exact(self.h * self.w).zip(interior.chunks_exact_mut(self.plane)).for_each(plane);
        }
        slack.fill(0.0);
    }

    /// Copies the planes `[channels, h, w]` of `src` onto the wide positions of `dst`, plane `c`
    /// from `c·stride` (`stride ≥ wide`): row `y` at `y·row`. The two extra columns of each row
    /// and the positions past `wide` are left as they are (the callers zero them once).
    fn widen(&self, src: &[f32], stride: usize, dst: &mut [f32]) {
        for (c, plane) in src.chunks_exact(self.h * self.w).enumerate() {
            for (y, row) in plane.chunks_exact(self.w).enumerate() {
                dst[c * stride + y * self.row..][..self.w].copy_from_slice(row);
            }
        }
    }
}

thread_local! {
    /// Per-thread scratch of the convolution kernels, kept between calls.
    static SCRATCH: RefCell<(Vec<f32>, Vec<f32>)> = const { RefCell::new((Vec::new(), Vec::new())) };
}

/// Runs `f` with two scratch slices of `a` and `b` elements (contents unspecified): the calling
/// thread's buffers, kept between calls so that each call does not fault in fresh pages, or new
/// ones if this thread is already using them.
fn with_scratch<R>(a: usize, b: usize, f: impl FnOnce(&mut [f32], &mut [f32]) -> R) -> R {
    SCRATCH.with(|cell| match cell.try_borrow_mut() {
        Ok(mut buffers) => {
            let (x, y) = &mut *buffers;
            if x.len() < a {
                x.resize(a, 0.0);
            }
            if y.len() < b {
                y.resize(b, 0.0);
            }
            f(&mut x[..a], &mut y[..b])
        }
        Err(_) => f(&mut vec![0.0; a], &mut vec![0.0; b]),
    })
}

/// Rayon gemm parallelism when the batch alone cannot occupy the threads.
fn gemm_parallelism(batch: usize) -> gemm::Parallelism {
    let threads = rayon::current_num_threads();
    if batch >= threads {
        gemm::Parallelism::None
    } else {
        gemm::Parallelism::Rayon(threads)
    }
}

/// `out[b, o, y, x] = E(Σ_tap Σ_r W_tap[o, r] · in_pad[b, r, y + ky − 1, x + kx − 1])` for `input`
/// `[B, R, H, W]` and `O` output channels, with `E` the `epilogue` of channel `o`; `weights` read
/// as `taps` says. On AVX-512 the [`winograd`] kernel of `variant` where [`winograd::suits`] the
/// shape, else the [`direct`] one; nine tap gemms without AVX-512.
#[allow(clippy::too_many_arguments)]
#[cfg_attr(not(target_arch = "x86_64"), allow(unused_variables))]
fn conv_same(
    input: &[f32],
    [b, r, h, w]: [usize; 4],
    o: usize,
    weights: &[f32],
    taps: Taps,
    epilogue: &Epilogue,
    variant: Winograd,
) -> Vec<f32> {
    let geo = Padded::new(h, w);
    let plane_out = h * w;
    let len = b * o * plane_out;
    if len == 0 {
        return Vec::new();
    }
    assert!(input.len() == b * r * h * w && weights.len() == o * r * 9, "conv3x3: inconsistent sizes");
    let par = gemm_parallelism(b);
    let parallel_images = matches!(par, gemm::Parallelism::None);
    #[cfg(target_arch = "x86_64")]
    let transformed =
        (direct::available() && winograd::suits(variant, r, h, w)).then(|| winograd::Transformed::new(weights, o, r, taps, variant));
    #[cfg(target_arch = "x86_64")]
    let packed = (direct::available() && transformed.is_none()).then(|| direct::Packed::new(weights, o, r, taps));
    let image = |(src, dst): (&[f32], &mut [MaybeUninit<f32>])| {
        #[cfg(target_arch = "x86_64")]
        if let Some(transformed) = &transformed {
            winograd::convolve(src, [h, w], transformed, epilogue, dst, !parallel_images);
            return;
        }
        #[cfg(target_arch = "x86_64")]
        if let Some(packed) = &packed {
            with_scratch(r * geo.plane + direct::SLACK, 0, |padded, _| {
                geo.fill(src, r, padded, !parallel_images);
                direct::convolve(padded, geo, packed, epilogue, dst, !parallel_images);
            });
            return;
        }
        conv_image_gemm(src, geo, [r, o], weights, taps, epilogue, par, dst);
    };
    let write = |out: &mut [MaybeUninit<f32>]| {
        if parallel_images {
            input.par_chunks_exact(r * h * w).zip(out.par_chunks_exact_mut(o * plane_out)).for_each(image);
        } else {
            input.chunks_exact(r * h * w).zip(out.chunks_exact_mut(o * plane_out)).for_each(image);
        }
    };
    // SAFETY: the images' outputs (`o·h·w` each, `b` of them) cover `out`; both kernels write
    // every element of each (`direct::convolve` says so, `conv_image_gemm` every row of every
    // channel).
    unsafe { written(len, write) }
}

/// One image of [`conv_same`] through the nine tap gemms (what runs without AVX-512): `src`
/// `[r, h, w]` → `dst` `[o, h, w]`, every element written. Padded input and wide output in the
/// thread's scratch; `par` is the gemms' parallelism (the padded copy is shared among the threads
/// too when it is not `None`).
#[allow(clippy::too_many_arguments)]
fn conv_image_gemm(
    src: &[f32],
    geo: Padded,
    [r, o]: [usize; 2],
    weights: &[f32],
    taps: Taps,
    epilogue: &Epilogue,
    par: gemm::Parallelism,
    dst: &mut [MaybeUninit<f32>],
) {
    let (h, w) = (geo.h, geo.w);
    assert!(src.len() == r * h * w && dst.len() == o * h * w, "conv3x3: inconsistent sizes");
    // Scratch: the padded input (its border zeroed by `fill`) and the wide output (overwritten by
    // the first tap).
    with_scratch(r * geo.plane, o * geo.wide, |padded, wide| {
        geo.fill(src, r, padded, !matches!(par, gemm::Parallelism::None));
        tap_gemms(padded, geo, r, o, weights, taps, par, wide);
        for (c, plane) in dst.chunks_exact_mut(h * w).enumerate() {
            let map = epilogue.of(c);
            for (y, row) in plane.chunks_exact_mut(w).enumerate() {
                map.apply(&wide[c * geo.wide + y * geo.row..][..w], row);
            }
        }
    })
}

/// `wide[o, n] = Σ_tap Σ_r W_tap[o, r] · padded[r, n + shift(tap)]` for the `geo.wide` positions
/// `n`: nine gemms accumulating into `wide` (`o × geo.wide`, overwritten).
#[allow(clippy::too_many_arguments)]
fn tap_gemms(padded: &[f32], geo: Padded, r: usize, o: usize, weights: &[f32], taps: Taps, par: gemm::Parallelism, wide: &mut [f32]) {
    assert!(padded.len() >= r * geo.plane && wide.len() >= o * geo.wide && weights.len() >= 9 * o * r, "conv3x3: inconsistent sizes");
    for t in 0..9 {
        let tap = if taps.flip { 8 - t } else { t };
        // SAFETY: dst `wide` is `o × geo.wide` row-major; lhs reads weights at
        // `tap + i·row_stride + j·red_stride` for i < o, j < r, the largest being
        // `8 + (o−1)·row_stride + (r−1)·red_stride < 9·o·r = weights.len()` for both
        // layouts (`row_stride`, `red_stride`) = (9r, 9) and (9, 9o) with `o`, `r` swapped
        // by the caller; rhs reads `padded` at `shift(t) + j·plane + n` for j < r,
        // n < geo.wide: at most `(r−1)·plane + 2·row + 2 + h·row − 1 = r·plane − 1`.
        unsafe {
            gemm::gemm(
                o,
                geo.wide,
                r,
                wide.as_mut_ptr(),
                1,
                geo.wide as isize,
                t > 0,
                weights.as_ptr().add(tap),
                taps.red_stride as isize,
                taps.row_stride as isize,
                padded.as_ptr().add(geo.shift(t)),
                1,
                geo.plane as isize,
                1.0f32,
                1.0f32,
                false,
                false,
                false,
                par,
            );
        }
    }
}

/// `dw[co, ci, tap] = Σ_b Σ_(y, x) g[b, co, y, x] · x_pad[b, ci, y + ky − 1, x + kx − 1]` for `x`
/// `[B, Ci, H, W]` and `g` `[B, Co, H, W]`, as `[Co, Ci, 3, 3]`.
fn weight_grad(x: &[f32], g: &[f32], [b, ci, h, w]: [usize; 4], co: usize) -> Vec<f32> {
    let size = co * ci * 9;
    if b == 0 || size == 0 || h * w == 0 {
        return vec![0.0; size];
    }
    assert!(x.len() == b * ci * h * w && g.len() == b * co * h * w, "conv3x3: inconsistent sizes");
    let threads = rayon::current_num_threads().max(1);
    let chunks = threads.min(b);
    let per = b.div_ceil(chunks);
    let par = gemm_parallelism(b);
    let partial = |first: usize| -> Vec<f32> {
        let images = first..(first + per).min(b);
        #[cfg(target_arch = "x86_64")]
        if direct::available() && co >= 8 && winograd::suits(Winograd::F2, ci, h, w) && matches!(par, gemm::Parallelism::None) {
            return winograd::weight_grad(x, g, images, [ci, h, w], co);
        }
        #[cfg(target_arch = "x86_64")]
        if direct::available() {
            return direct::weight_grad(x, g, images, [ci, h, w], co, !matches!(par, gemm::Parallelism::None));
        }
        weight_grad_gemm(x, g, images, [ci, h, w], co, par)
    };
    let starts: Vec<usize> = (0..b).step_by(per).collect();
    let parts: Vec<Vec<f32>> = if matches!(par, gemm::Parallelism::None) {
        starts.into_par_iter().map(partial).collect()
    } else {
        starts.into_iter().map(partial).collect()
    };
    let mut parts = parts.into_iter();
    let mut dw = parts.next().unwrap_or_else(|| vec![0.0; size]);
    for part in parts {
        for (a, v) in dw.iter_mut().zip(part) {
            *a += v;
        }
    }
    dw
}

/// The weight gradient of `images` through nine gemms per image (what [`weight_grad`] runs
/// without AVX-512), as `[co, ci, 9]`.
fn weight_grad_gemm(
    x: &[f32],
    g: &[f32],
    images: std::ops::Range<usize>,
    [ci, h, w]: [usize; 3],
    co: usize,
    par: gemm::Parallelism,
) -> Vec<f32> {
    let geo = Padded::new(h, w);
    assert!(x.len() >= images.end * ci * h * w && g.len() >= images.end * co * h * w, "conv3x3: inconsistent sizes");
    let mut dw = vec![0.0f32; co * ci * 9];
    with_scratch(ci * geo.plane, co * geo.wide, |padded, wide| {
        // The gradient on the wide layout, zero on the two extra columns of each row.
        wide.fill(0.0);
        for (k, image) in images.enumerate() {
            geo.fill(&x[image * ci * h * w..(image + 1) * ci * h * w], ci, padded, !matches!(par, gemm::Parallelism::None));
            geo.widen(&g[image * co * h * w..(image + 1) * co * h * w], geo.wide, wide);
            for t in 0..9 {
                // SAFETY: dst writes `dw` at `t + i·9ci + j·9` for i < co, j < ci (< 9·co·ci);
                // lhs reads `wide` (`co × geo.wide` row-major); rhs reads `padded` at
                // `shift(t) + n + j·plane` for n < geo.wide, j < ci: at most `ci·plane − 1`.
                unsafe {
                    gemm::gemm(
                        co,
                        ci,
                        geo.wide,
                        dw.as_mut_ptr().add(t),
                        9,
                        (9 * ci) as isize,
                        k > 0,
                        wide.as_ptr(),
                        1,
                        geo.wide as isize,
                        padded.as_ptr().add(geo.shift(t)),
                        geo.plane as isize,
                        1,
                        1.0f32,
                        1.0f32,
                        false,
                        false,
                        false,
                        par,
                    );
                }
            }
        }
    });
    dw
}

/// The binomial blur's 1-D weights `[1 2 1] / 4`.
const BLUR: [f32; 3] = [0.25, 0.5, 0.25];

/// MaxBlurPool's output size: the `(h − 1) × (w − 1)` maxima blurred with padding 1, stride 2.
fn pooled(h: usize, w: usize) -> (usize, usize) {
    (h.saturating_sub(2) / 2 + 1, w.saturating_sub(2) / 2 + 1)
}

/// One plane of MaxBlurPool: `dst[oy, ox] = Σ_(i, j) BLUR[i]·BLUR[j]·m[2oy + i − 1, 2ox + j − 1]`
/// with `m` the 2 × 2 maxima (zero outside); the blur applied down the rows, then along them.
/// Every element of `dst` (`pooled(h, w)`) is written.
fn max_blur_plane(src: &[f32], h: usize, w: usize, dst: &mut [MaybeUninit<f32>]) {
    let (mh, mw) = (h - 1, w - 1);
    let mut m = Vec::with_capacity(mh * mw);
    for (r0, r1) in src.chunks_exact(w).zip(src.chunks_exact(w).skip(1)) {
        m.extend((0..mw).map(|x| r0[x].max(r0[x + 1]).max(r1[x].max(r1[x + 1]))));
    }
    let (oh, ow) = pooled(h, w);
    let mut blurred = vec![0.0f32; mw];
    for (oy, out) in dst.chunks_exact_mut(ow).take(oh).enumerate() {
        blurred.fill(0.0);
        for (i, wi) in BLUR.iter().enumerate() {
            let Some(y) = (2 * oy + i).checked_sub(1).filter(|&y| y < mh) else { continue };
            for (b, &v) in blurred.iter_mut().zip(&m[y * mw..(y + 1) * mw]) {
                *b += wi * v;
            }
        }
        for (ox, o) in out.iter_mut().enumerate() {
            let mut acc = 0.0f32;
            for (j, wj) in BLUR.iter().enumerate() {
                let Some(x) = (2 * ox + j).checked_sub(1).filter(|&x| x < mw) else { continue };
                acc += wj * blurred[x];
            }
            o.write(acc);
        }
    }
}

/// The gradient of [`max_blur_plane`]: the blur's transpose onto the maxima, each routed to the
/// first largest value of its window, added to `dst` (zero on entry).
fn max_blur_plane_backward(src: &[f32], h: usize, w: usize, g: &[f32], dst: &mut [f32]) {
    let (mh, mw) = (h - 1, w - 1);
    let (oh, ow) = pooled(h, w);
    let mut gm = vec![0.0f32; mh * mw];
    for oy in 0..oh {
        for ox in 0..ow {
            let v = g[oy * ow + ox];
            for (i, wi) in BLUR.iter().enumerate() {
                let Some(y) = (2 * oy + i).checked_sub(1).filter(|&y| y < mh) else { continue };
                for (j, wj) in BLUR.iter().enumerate() {
                    let Some(x) = (2 * ox + j).checked_sub(1).filter(|&x| x < mw) else { continue };
                    gm[y * mw + x] += wi * wj * v;
                }
            }
        }
    }
    // Each window's gradient goes to the first largest value of its window (`>` over top left,
    // top right, bottom left, bottom right: ties keep the first; a NaN wins only in the top left,
    // `max_pool2d` promising nothing else): per row of windows, the shares of
    // the four corners (one of them the gradient, the others 0) in one vectorised pass, then each
    // value's shares added in the order of its windows, (y − 1, x − 1), (y − 1, x), (y, x − 1),
    // (y, x): the same sums as routing window by window.
    let mut shares = vec![0.0f32; 4 * mw];
    let (sa, rest) = shares.split_at_mut(mw);
    let (sb, rest) = rest.split_at_mut(mw);
    let (sc, sd) = rest.split_at_mut(mw);
    for y in 0..mh {
        let (r0, r1, gy) = (&src[y * w..(y + 1) * w], &src[(y + 1) * w..(y + 2) * w], &gm[y * mw..(y + 1) * mw]);
        for x in 0..mw {
            let (a, b, c, d) = (r0[x], r0[x + 1], r1[x], r1[x + 1]);
            let pb = b > a;
            let best = if pb { b } else { a };
            let pc = c > best;
            let pd = d > if pc { c } else { best };
            let v = gy[x];
            sd[x] = if pd { v } else { 0.0 };
            sc[x] = if pc && !pd { v } else { 0.0 };
            sb[x] = if pb && !pc && !pd { v } else { 0.0 };
            sa[x] = if pb || pc || pd { 0.0 } else { v };
        }
        let (top, bottom) = dst[y * w..(y + 2) * w].split_at_mut(w);
        // Row y: the windows above it added theirs first (as row y + 1 of the previous pass).
        for (row, left, right) in [(top, &*sb, &*sa), (bottom, &*sd, &*sc)] {
            row[0] += right[0];
            for x in 1..mw {
                row[x] = (row[x] + left[x - 1]) + right[x];
            }
            row[mw] += left[mw - 1];
        }
    }
}

/// Bilinear ×2 along one axis of `n` samples: output `2i` is `¾ x[i] + ¼ x[i − 1]`, `2i + 1` is
/// `¾ x[i] + ¼ x[i + 1]`, the edge sample repeated. `get(i)` reads sample `i`.
fn upsample_line(n: usize, get: impl Fn(usize) -> f32, mut put: impl FnMut(usize, f32)) {
    for i in 0..n {
        let v = get(i);
        let prev = get(i.saturating_sub(1));
        let next = get((i + 1).min(n - 1));
        put(2 * i, v * 0.75 + prev * 0.25);
        put(2 * i + 1, v * 0.75 + next * 0.25);
    }
}

/// One plane of the upsampling: rows (axis 2) first, then columns (axis 3), as
/// [`crate::model::upsample`]; every element of `dst` (`2h × 2w`) is written.
fn upsample_plane(src: &[f32], h: usize, w: usize, dst: &mut [MaybeUninit<f32>]) {
    let mut tall = vec![0.0f32; w];
    for i in 0..h {
        let row = &src[i * w..(i + 1) * w];
        let prev = &src[i.saturating_sub(1) * w..(i.saturating_sub(1) + 1) * w];
        let next = &src[(i + 1).min(h - 1) * w..((i + 1).min(h - 1) + 1) * w];
        // Output rows 2i (with the row above) and 2i + 1 (with the row below).
        for (k, other) in [prev, next].into_iter().enumerate() {
            for ((t, &v), &o) in tall.iter_mut().zip(row).zip(other) {
                *t = v * 0.75 + o * 0.25;
            }
            let out = &mut dst[(2 * i + k) * 2 * w..(2 * i + k + 1) * 2 * w];
            upsample_line(
                w,
                |i| tall[i],
                |o, v| {
                    out[o].write(v);
                },
            );
        }
    }
}

/// The transpose of [`upsample_line`]: `acc(i, v)` adds `v` to sample `i`; `g(o)` reads output
/// `o`.
fn upsample_line_backward(n: usize, g: impl Fn(usize) -> f32, mut acc: impl FnMut(usize, f32)) {
    for i in 0..n {
        let (even, odd) = (g(2 * i), g(2 * i + 1));
        acc(i, 0.75 * (even + odd));
        acc(i.saturating_sub(1), 0.25 * even);
        acc((i + 1).min(n - 1), 0.25 * odd);
    }
}

/// The gradient of [`upsample_plane`]: columns first, then rows, added to `dst` (zero on entry).
fn upsample_plane_backward(g: &[f32], h: usize, w: usize, dst: &mut [f32]) {
    let mut tall = vec![0.0f32; 2 * h * w];
    for y in 0..2 * h {
        let row = &g[y * 2 * w..(y + 1) * 2 * w];
        let out = &mut tall[y * w..(y + 1) * w];
        upsample_line_backward(w, |o| row[o], |i, v| out[i] += v);
    }
    for x in 0..w {
        upsample_line_backward(h, |o| tall[o * w + x], |i, v| dst[i * w + x] += v);
    }
}
