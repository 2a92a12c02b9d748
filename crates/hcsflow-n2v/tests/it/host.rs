//! The host kernels of `flex` (crate::host) against burn's own formulation of the same layers
//! (what the wgpu path runs, itself checked against float64 in tests/it/layers.rs): forward values
//! and the gradients of every input, on odd and even sides, with a random upstream gradient.

use burn::module::Param;
use burn::nn::{BatchNorm, BatchNormConfig};
use burn::tensor::activation::relu;
use burn::tensor::module::conv2d;
use burn::tensor::ops::ConvOptions;
use burn::tensor::Gradients;
use burn::tensor::{Device, Tensor, TensorData};
use hcsflow_n2v::host::{applies, batch_norm_relu, conv1x1, conv3x3};
use hcsflow_n2v::model::{max_blur_pool, max_blur_pool_composed, upsample, upsample_composed};
use hcsflow_n2v::rng::SplitMix64;

fn random(n: usize, rng: &mut SplitMix64, scale: f64) -> Vec<f32> {
    (0..n).map(|_| ((rng.next_f64() * 2.0 - 1.0) * scale) as f32).collect()
}

fn tensor<const D: usize>(values: Vec<f32>, shape: [usize; D], dev: &Device) -> Tensor<D> {
    Tensor::from_data(TensorData::new(values, shape), dev)
}

fn values<const D: usize>(t: Tensor<D>) -> Vec<f32> {
    t.into_data().try_to_vec::<f32>().unwrap()
}

/// Largest |a − b| relative to max(1, |b|).
fn worst(a: &[f32], b: &[f32]) -> f64 {
    assert_eq!(a.len(), b.len());
    a.iter().zip(b).map(|(&x, &y)| (x as f64 - y as f64).abs() / (y as f64).abs().max(1.0)).fold(0.0, f64::max)
}

fn close(name: &str, got: Vec<f32>, want: Vec<f32>, tol: f64) {
    let e = worst(&got, &want);
    assert!(e < tol, "{name}: worst relative error {e:e}");
}

fn grad<const D: usize>(t: &Tensor<D>, grads: &Gradients) -> Vec<f32> {
    values(t.grad(grads).expect("a gradient"))
}

/// `Σ y · r` with a fixed random `r`, so every output position carries its own gradient.
fn loss(y: Tensor<4>, seed: u64) -> Tensor<1> {
    let dims = y.dims();
    let n = dims.iter().product();
    let r = tensor(random(n, &mut SplitMix64::new(seed), 1.0), dims, &y.device());
    (y * r).sum()
}

/// A convolution of `x` `[b, ci, h, w]` with weights `[co, ci, k, k]` and a bias.
type ConvLayer = fn(Tensor<4>, Tensor<4>, Tensor<1>) -> Tensor<4>;

/// `ours` against burn's `conv2d` (zero padding `k / 2`) on `(b, ci, co, h, w)` shapes with
/// `k × k` kernels: the output and the three gradients of a loss with random weights.
fn matches_burn_conv2d(name: &str, ours: ConvLayer, k: usize, shapes: &[(usize, usize, usize, usize, usize)]) {
    let dev = Device::flex().autodiff();
    for &(b, ci, co, h, w) in shapes {
        let mut rng = SplitMix64::new((b * ci * co * h * w * k) as u64);
        let xv = random(b * ci * h * w, &mut rng, 2.0);
        let wv = random(co * ci * k * k, &mut rng, 0.5);
        let bv = random(co, &mut rng, 0.5);
        let run = |mine: bool| {
            let x = tensor(xv.clone(), [b, ci, h, w], &dev).require_grad();
            let wt = tensor(wv.clone(), [co, ci, k, k], &dev).require_grad();
            let bt = tensor(bv.clone(), [co], &dev).require_grad();
            let p = k / 2;
            let y = if mine {
                ours(x.clone(), wt.clone(), bt.clone())
            } else {
                conv2d(x.clone(), wt.clone(), Some(bt.clone()), ConvOptions::new([1, 1], [p, p], [1, 1], 1))
            };
            let grads = loss(y.clone(), 7).backward();
            (values(y), grad(&x, &grads), grad(&wt, &grads), grad(&bt, &grads))
        };
        let (mine, theirs) = (run(true), run(false));
        let case = format!("{name} {b}x{ci}->{co}x{h}x{w}");
        close(&format!("{case} forward"), mine.0, theirs.0, 1e-5);
        close(&format!("{case} dx"), mine.1, theirs.1, 1e-5);
        close(&format!("{case} dw"), mine.2, theirs.2, 1e-4);
        close(&format!("{case} db"), mine.3, theirs.3, 1e-4);
    }
}

#[test]
fn conv3x3_matches_burn_conv2d_forward_and_backward() {
    assert!(applies(&Tensor::<4>::zeros([1, 1, 2, 2], &Device::flex().autodiff())));
    // The last two shapes have enough channels and columns for the Winograd kernel, forward and
    // for the input gradient, where the CPU has AVX-512.
    let shapes = [(2, 3, 4, 7, 5), (3, 1, 6, 8, 12), (1, 5, 2, 4, 4), (2, 8, 8, 16, 9), (2, 8, 12, 9, 32), (1, 16, 8, 11, 61)];
    matches_burn_conv2d("conv3x3", conv3x3, 3, &shapes);
}

#[test]
fn conv1x1_matches_burn_conv2d_forward_and_backward() {
    // The U-Net's head (32 → 1 over a batch of 64² patches), more outputs, pixels past a block.
    matches_burn_conv2d("conv1x1", conv1x1, 1, &[(4, 32, 1, 64, 64), (2, 3, 5, 7, 9), (1, 1, 1, 1, 1), (3, 8, 2, 40, 33)]);
}

#[test]
fn pooling_and_upsampling_match_their_burn_formulation_forward_and_backward() {
    let dev = Device::flex().autodiff();
    for (b, c, h, w) in [(2, 3, 8, 12), (1, 2, 7, 5), (3, 4, 16, 16), (1, 1, 2, 2), (2, 2, 1, 3)] {
        let mut rng = SplitMix64::new((b * c * h * w + 11) as u64);
        let xv = random(b * c * h * w, &mut rng, 2.0);
        let cases: [(&str, Layer, Layer); 2] =
            [("max_blur_pool", max_blur_pool, max_blur_pool_composed), ("upsample", upsample, upsample_composed)];
        for (name, ours, theirs) in cases {
            if name == "max_blur_pool" && (h < 2 || w < 2) {
                continue;
            }
            let run = |f: fn(Tensor<4>) -> Tensor<4>| {
                let x = tensor(xv.clone(), [b, c, h, w], &dev).require_grad();
                let y = f(x.clone());
                let dims = y.dims();
                let grads = loss(y.clone(), 3).backward();
                (dims, values(y), grad(&x, &grads))
            };
            // The host kernels apply here (so the comparison is not of burn with itself).
            assert!(applies(&tensor(xv.clone(), [b, c, h, w], &dev)));
            let (a, z) = (run(ours), run(theirs));
            assert_eq!(a.0, z.0, "{name} {b}x{c}x{h}x{w}: shape");
            close(&format!("{name} {b}x{c}x{h}x{w} forward"), a.1, z.1, 1e-6);
            close(&format!("{name} {b}x{c}x{h}x{w} dx"), a.2, z.2, 1e-6);
        }
    }
}

/// A layer as a function of its input.
type Layer = fn(Tensor<4>) -> Tensor<4>;

fn norm(c: usize, gamma: &[f32], beta: &[f32], dev: &Device) -> BatchNorm {
    let mut n = BatchNormConfig::new(c).init(dev);
    n.gamma = Param::from_tensor(tensor(gamma.to_vec(), [c], dev));
    n.beta = Param::from_tensor(tensor(beta.to_vec(), [c], dev));
    n
}

#[test]
fn batch_norm_relu_matches_burn_batch_norm_then_relu() {
    let dev = Device::flex().autodiff();
    for (b, c, h, w) in [(2, 3, 8, 12), (4, 2, 5, 7), (1, 4, 16, 16)] {
        let mut rng = SplitMix64::new((b * c * h * w + 5) as u64);
        let xv: Vec<f32> = random(b * c * h * w, &mut rng, 2.0).into_iter().map(|v| v + 0.3).collect();
        let gamma = random(c, &mut rng, 1.5);
        let beta = random(c, &mut rng, 1.0);
        let run = |ours: bool| {
            let n = norm(c, &gamma, &beta, &dev);
            let x = tensor(xv.clone(), [b, c, h, w], &dev).require_grad();
            let y = if ours { batch_norm_relu(&n, x.clone()) } else { relu(n.forward(x.clone())) };
            let grads = loss(y.clone(), 9).backward();
            let running = [values(n.running_mean.value()), values(n.running_var.value())].concat();
            (values(y), grad(&x, &grads), grad(&n.gamma.val(), &grads), grad(&n.beta.val(), &grads), running)
        };
        let (ours, theirs) = (run(true), run(false));
        let case = format!("{b}x{c}x{h}x{w}");
        close(&format!("bn+relu {case} forward"), ours.0, theirs.0, 2e-5);
        close(&format!("bn+relu {case} dx"), ours.1, theirs.1, 1e-4);
        close(&format!("bn+relu {case} dgamma"), ours.2, theirs.2, 1e-4);
        close(&format!("bn+relu {case} dbeta"), ours.3, theirs.3, 1e-4);
        close(&format!("bn+relu {case} running statistics"), ours.4, theirs.4, 1e-5);
    }
}

#[test]
fn batch_norm_relu_with_running_statistics_matches_burn() {
    let dev = Device::flex();
    let (b, c, h, w) = (3, 4, 6, 10);
    let mut rng = SplitMix64::new(17);
    let xv = random(b * c * h * w, &mut rng, 2.0);
    let gamma = random(c, &mut rng, 1.5);
    let beta = random(c, &mut rng, 1.0);
    let n = norm(c, &gamma, &beta, &dev);
    let mean: Vec<f32> = random(c, &mut rng, 0.5);
    let var: Vec<f32> = random(c, &mut rng, 0.5).into_iter().map(|v| v + 1.0).collect();
    n.running_mean.update(tensor(mean, [c], &dev));
    n.running_var.update(tensor(var, [c], &dev));
    let x = || tensor(xv.clone(), [b, c, h, w], &dev);
    assert!(applies(&x()));
    let ours = batch_norm_relu(&n, x());
    close("bn+relu inference", values(ours), values(relu(n.forward(x()))), 1e-5);
}
