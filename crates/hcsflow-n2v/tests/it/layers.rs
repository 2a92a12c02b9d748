//! Each layer of the N2V2 U-Net against a float64 NumPy reference (tests/oracle_layers.py):
//! conv 3 × 3 and 1 × 1, MaxBlurPool, bilinear upsampling, batch norm (batch statistics, and the
//! running statistics after one update). Odd and even sides, several channels and a batch.

use burn::module::{Module, Param};
use burn::nn::BatchNormConfig;
use burn::tensor::{Device, Tensor, TensorData};
use hcsflow_n2v::model::{max_blur_pool, upsample, Conv};
use hcsflow_n2v::rng::SplitMix64;
use serde_json::{json, Value};

fn random(n: usize, rng: &mut SplitMix64, scale: f64) -> Vec<f32> {
    (0..n).map(|_| ((rng.next_f64() * 2.0 - 1.0) * scale) as f32).collect()
}

fn values(t: Tensor<4>) -> Vec<f32> {
    t.into_data().try_to_vec::<f32>().unwrap()
}

/// Largest |got − want| relative to max(1, |want|).
fn worst(got: &[f32], want: &Value) -> f64 {
    let want: Vec<f64> = want.as_array().unwrap().iter().map(|v| v.as_f64().unwrap()).collect();
    assert_eq!(got.len(), want.len());
    got.iter().zip(&want).map(|(&g, &w)| (g as f64 - w).abs() / w.abs().max(1.0)).fold(0.0, f64::max)
}

fn check_shape(b: usize, c: usize, h: usize, w: usize) {
    let Some(python) = hcsflow_testkit::oracle::require(&["numpy"], "pip install numpy") else {
        return;
    };
    let mut rng = SplitMix64::new((b * 1000 + c * 100 + h * 10 + w) as u64);
    let x = random(b * c * h * w, &mut rng, 2.0);
    let (o, eps, momentum) = (5, 1e-5, 0.1);
    let w3 = random(o * c * 9, &mut rng, 0.5);
    let b3 = random(o, &mut rng, 0.5);
    let w1 = random(o * c, &mut rng, 0.5);
    let b1 = random(o, &mut rng, 0.5);
    let gamma = random(c, &mut rng, 1.5);
    let beta = random(c, &mut rng, 1.0);
    let case = json!({
        "x": x, "x_shape": [b, c, h, w],
        "w3": w3, "w3_shape": [o, c, 3, 3], "b3": b3, "b3_shape": [o],
        "w1": w1, "w1_shape": [o, c, 1, 1], "b1": b1, "b1_shape": [o],
        "gamma": gamma, "gamma_shape": [c], "beta": beta, "beta_shape": [c],
        "eps": eps, "momentum": momentum,
    });
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("case.json");
    std::fs::write(&path, case.to_string()).unwrap();
    let script = concat!(env!("CARGO_MANIFEST_DIR"), "/tests/oracle_layers.py");
    let want: Value = serde_json::from_str(&python.run([script, path.to_str().unwrap()])).unwrap();

    let dev = Device::flex();
    let input = || Tensor::<4>::from_data(TensorData::new(x.clone(), [b, c, h, w]), &dev);
    let conv3 = Conv::from_data(TensorData::new(w3, [o, c, 3, 3]), TensorData::new(b3, [o]), &dev);
    let conv1 = Conv::from_data(TensorData::new(w1, [o, c, 1, 1]), TensorData::new(b1, [o]), &dev);
    let tol = 2e-6;
    let checks =
        [("conv3", values(conv3.forward(input()))), ("conv1", values(conv1.forward(input()))), ("upsample", values(upsample(input())))];
    for (name, got) in checks {
        let e = worst(&got, &want[name]);
        assert!(e < tol, "{name} {b}x{c}x{h}x{w}: worst error {e:e}");
    }
    if h.is_multiple_of(2) && w.is_multiple_of(2) {
        let got = max_blur_pool(input());
        assert_eq!(got.dims(), [b, c, h / 2, w / 2]);
        let e = worst(&values(got), &want["pool"]);
        assert!(e < tol, "pool {b}x{c}x{h}x{w}: worst error {e:e}");
    }

    // Batch norm: batch statistics on an autodiff device in training mode, then the running
    // statistics that one update left, in inference mode.
    let ad = dev.clone().autodiff();
    let mut norm = BatchNormConfig::new(c).with_epsilon(eps).with_momentum(momentum).init(&ad);
    norm.gamma = Param::from_data(TensorData::new(gamma, [c]), &ad);
    norm.beta = Param::from_data(TensorData::new(beta, [c]), &ad);
    let train_out = norm.forward(Tensor::<4>::from_data(TensorData::new(x.clone(), [b, c, h, w]), &ad));
    let e = worst(&values(train_out), &want["norm_train"]);
    assert!(e < 2e-5, "batch norm (batch statistics) {b}x{c}x{h}x{w}: worst error {e:e}");
    let infer = norm.valid();
    let e = worst(&values(infer.forward(input())), &want["norm_infer"]);
    assert!(e < 2e-5, "batch norm (running statistics) {b}x{c}x{h}x{w}: worst error {e:e}");
}

#[test]
fn layers_match_the_float64_reference() {
    // The last two: enough channels and columns for the Winograd kernel where the CPU has AVX-512.
    for (b, c, h, w) in [(2, 3, 8, 12), (1, 1, 16, 16), (3, 2, 7, 5), (2, 4, 10, 6), (2, 8, 9, 32), (1, 12, 6, 61)] {
        check_shape(b, c, h, w);
    }
}
