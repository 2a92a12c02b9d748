//! The N2V2 U-Net (CAREamics `UNet(conv_dims=2, depth=2, num_channels_init=32,
//! use_batch_norm=True, n2v2=True)`), written from its description:
//!
//! - encoder: two blocks (1 → F, F → 2F features), each followed by MaxBlurPool;
//! - bottleneck: 2F → 4F → 2F;
//! - decoder: bilinear ×2 upsampling, concatenation with the second encoder block, block
//!   4F → 2F → F; upsampling again and, N2V2's change, **no** skip from the first block; block
//!   F → F → F;
//! - a 1 × 1 convolution to one channel, no final activation and no residual connection.
//!
//! A block is conv 3 × 3 (zero padding 1) → batch norm → ReLU, twice. MaxBlurPool is a 2 × 2 max
//! with stride 1 followed by the normalised 3 × 3 binomial blur `[1 2 1]ᵀ[1 2 1] / 16` with zero
//! padding 1 and stride 2 (Zhang 2019, as Kornia and CAREamics), which halves even sides.
//! Upsampling is bilinear with half-pixel centres (PyTorch `nn.Upsample(scale_factor=2,
//! mode="bilinear")`, `align_corners=False`). Weights start as PyTorch's defaults: uniform in
//! `±1/sqrt(fan_in)` for convolution weights and biases, batch norm γ = 1, β = 0, drawn from the
//! run's seed on the host.

use burn::module::{Module, Param};
use burn::nn::{BatchNorm, BatchNormConfig};
use burn::tensor::module::{conv2d, max_pool2d};
use burn::tensor::ops::{ConvOptions, MaxPoolOptions};
use burn::tensor::{Device, Int, Tensor, TensorData};

use crate::host::{batch_norm_relu, conv3x3_norm_relu};
use crate::rng::SplitMix64;

/// A 2-D convolution with bias, stride 1, zero padding `kernel / 2` (same size out).
#[derive(Module, Debug)]
pub struct Conv {
    /// Weights, `[out, in, k, k]`.
    pub weight: Param<Tensor<4>>,
    /// Bias, `[out]`.
    pub bias: Param<Tensor<1>>,
    /// Zero padding on each side.
    pub padding: usize,
}

impl Conv {
    /// A `kernel × kernel` convolution `inputs → outputs` with PyTorch's default initialisation.
    pub fn new(inputs: usize, outputs: usize, kernel: usize, rng: &mut SplitMix64, device: &Device) -> Self {
        let fan_in = inputs * kernel * kernel;
        let bound = 1.0 / (fan_in as f64).sqrt();
        let mut uniform = |n: usize| -> Vec<f32> { (0..n).map(|_| ((rng.next_f64() * 2.0 - 1.0) * bound) as f32).collect() };
        let weight = TensorData::new(uniform(outputs * fan_in), [outputs, inputs, kernel, kernel]);
        let bias = TensorData::new(uniform(outputs), [outputs]);
        Self::from_data(weight, bias, device)
    }

    /// A convolution with the given weights `[out, in, k, k]` (k odd) and bias `[out]`.
    pub fn from_data(weight: TensorData, bias: TensorData, device: &Device) -> Self {
        let padding = weight.shape()[2] / 2;
        Self { weight: Param::from_data(weight, device), bias: Param::from_data(bias, device), padding }
    }

    /// `[B, in, H, W]` → `[B, out, H, W]`.
    pub fn forward(&self, x: Tensor<4>) -> Tensor<4> {
        let p = self.padding;
        match p {
            1 => return crate::host::conv3x3(x, self.weight.val(), self.bias.val()),
            0 => return crate::host::conv1x1(x, self.weight.val(), self.bias.val()),
            _ => {}
        }
        conv2d(x, self.weight.val(), Some(self.bias.val()), ConvOptions::new([1, 1], [p, p], [1, 1], 1))
    }

    /// `relu(norm(self.forward(x)))`, fused into one host kernel where [`conv3x3_norm_relu`] can.
    fn norm_relu(&self, norm: &BatchNorm, x: Tensor<4>) -> Tensor<4> {
        if self.padding == 1 {
            return conv3x3_norm_relu(x, self.weight.val(), self.bias.val(), norm);
        }
        batch_norm_relu(norm, self.forward(x))
    }
}

/// Conv 3 × 3 → batch norm → ReLU, twice.
#[derive(Module, Debug)]
pub struct ConvBlock {
    conv1: Conv,
    norm1: BatchNorm,
    conv2: Conv,
    norm2: BatchNorm,
}

impl ConvBlock {
    /// A block `inputs → middle → outputs`.
    pub fn new(inputs: usize, middle: usize, outputs: usize, rng: &mut SplitMix64, device: &Device) -> Self {
        Self {
            conv1: Conv::new(inputs, middle, 3, rng, device),
            norm1: BatchNormConfig::new(middle).init(device),
            conv2: Conv::new(middle, outputs, 3, rng, device),
            norm2: BatchNormConfig::new(outputs).init(device),
        }
    }

    /// `[B, in, H, W]` → `[B, out, H, W]`. Batch statistics (and running-average updates) on an
    /// autodiff device with the module in training mode, the running averages otherwise.
    pub fn forward(&self, x: Tensor<4>) -> Tensor<4> {
        let x = self.conv1.norm_relu(&self.norm1, x);
        self.conv2.norm_relu(&self.norm2, x)
    }

    fn set_norm_momentum(&mut self, momentum: f64) {
        self.norm1.momentum = momentum;
        self.norm2.momentum = momentum;
    }
}

/// The normalised 3 × 3 binomial kernel, `[channels, 1, 3, 3]`, made on the device from an
/// index range (no upload): `w(i) = (2 − |i − 1|) / 4`.
fn binomial_kernel(channels: usize, device: &Device) -> Tensor<4> {
    let w = Tensor::<1, Int>::arange(0..3, device).float().sub_scalar(1.0).abs().neg().add_scalar(2.0).div_scalar(4.0);
    let k = w.clone().reshape([3, 1]) * w.reshape([1, 3]);
    k.reshape([1, 1, 3, 3]).expand([channels, 1, 3, 3])
}

/// MaxBlurPool: 2 × 2 max (stride 1), then the binomial blur with zero padding 1 and stride 2,
/// per channel. `[B, C, H, W]` → `[B, C, H/2, W/2]` for even `H`, `W`. On `flex` a host kernel
/// ([`crate::host`]), elsewhere [`max_blur_pool_composed`].
pub fn max_blur_pool(x: Tensor<4>) -> Tensor<4> {
    crate::host::max_blur_pool(x)
}

/// [`max_blur_pool`] composed of burn's `max_pool2d` and a grouped `conv2d`: what other backends
/// than `flex` run, and the reference of the host kernel's tests.
pub fn max_blur_pool_composed(x: Tensor<4>) -> Tensor<4> {
    let channels = x.dims()[1];
    let device = x.device();
    let x = max_pool2d(x, MaxPoolOptions::new([2, 2]).with_stride([1, 1]));
    conv2d(x, binomial_kernel(channels, &device), None, ConvOptions::new([2, 2], [1, 1], [1, 1], channels))
}

/// Bilinear ×2 upsampling with half-pixel centres (PyTorch `align_corners=False`).
///
/// On `flex` a host kernel ([`crate::host`]); elsewhere written with slices, sums and a reshape
/// rather than burn's `interpolate`, whose bilinear backward the CubeCL (wgpu) backend does not
/// implement ([`upsample_composed`]). Along each axis, output `2i` is
/// `¾ x[i] + ¼ x[i − 1]` and output `2i + 1` is `¾ x[i] + ¼ x[i + 1]`, the edge sample repeated.
pub fn upsample(x: Tensor<4>) -> Tensor<4> {
    crate::host::upsample2(x)
}

/// [`upsample`] composed of burn tensor operations: what other backends than `flex` run, and the
/// reference of the host kernel's tests.
pub fn upsample_composed(x: Tensor<4>) -> Tensor<4> {
    upsample_axis(upsample_axis(x, 2), 3)
}

fn upsample_axis(x: Tensor<4>, axis: usize) -> Tensor<4> {
    let mut dims = x.dims();
    let n = dims[axis];
    let (prev, next) = if n > 1 {
        let first = x.clone().narrow(axis, 0, 1);
        let last = x.clone().narrow(axis, n - 1, 1);
        (Tensor::cat(vec![first, x.clone().narrow(axis, 0, n - 1)], axis), Tensor::cat(vec![x.clone().narrow(axis, 1, n - 1), last], axis))
    } else {
        (x.clone(), x.clone())
    };
    let even = x.clone().mul_scalar(0.75) + prev.mul_scalar(0.25);
    let odd = x.mul_scalar(0.75) + next.mul_scalar(0.25);
    dims[axis] = 2 * n;
    Tensor::stack::<5>(vec![even, odd], axis + 1).reshape(dims)
}

/// The N2V2 U-Net of depth 2.
#[derive(Module, Debug)]
pub struct UNet {
    enc0: ConvBlock,
    enc1: ConvBlock,
    bottleneck: ConvBlock,
    dec0: ConvBlock,
    dec1: ConvBlock,
    head: Conv,
}

impl UNet {
    /// A freshly initialised network with `features` first-level features, weights drawn from
    /// `seed` (on the host, so every backend starts from the same weights).
    pub fn new(features: usize, seed: u64, device: &Device) -> Self {
        let f = features;
        let mut rng = SplitMix64::new(seed ^ 0x5EED_0000_0000_4E57);
        Self {
            enc0: ConvBlock::new(1, f, f, &mut rng, device),
            enc1: ConvBlock::new(f, 2 * f, 2 * f, &mut rng, device),
            bottleneck: ConvBlock::new(2 * f, 4 * f, 2 * f, &mut rng, device),
            dec0: ConvBlock::new(4 * f, 2 * f, f, &mut rng, device),
            dec1: ConvBlock::new(f, f, f, &mut rng, device),
            head: Conv::new(f, 1, 1, &mut rng, device),
        }
    }

    /// Sets the momentum of every batch norm's running statistics: a training-mode forward pass
    /// updates them to `(1 − momentum)·running + momentum·batch`.
    pub(crate) fn set_norm_momentum(&mut self, momentum: f64) {
        for block in [&mut self.enc0, &mut self.enc1, &mut self.bottleneck, &mut self.dec0, &mut self.dec1] {
            block.set_norm_momentum(momentum);
        }
    }

    /// `[B, 1, H, W]` → `[B, 1, H, W]`, `H` and `W` multiples of 4.
    pub fn forward(&self, x: Tensor<4>) -> Tensor<4> {
        let e0 = self.enc0.forward(x);
        let e1 = self.enc1.forward(max_blur_pool(e0));
        let b = self.bottleneck.forward(max_blur_pool(e1.clone()));
        let d0 = self.dec0.forward(Tensor::cat(vec![upsample(b), e1], 1));
        // N2V2: no skip connection from the first encoder block.
        let d1 = self.dec1.forward(upsample(d0));
        self.head.forward(d1)
    }
}
