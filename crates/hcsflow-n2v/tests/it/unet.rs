//! The whole N2V2 U-Net (after a few training steps, so batch norm's running statistics are not
//! the initial ones) against a float64 NumPy forward pass built from CAREamics' description
//! (tests/oracle_unet.py): checks the wiring (skip, concatenation order, no top skip, head).

use burn::module::{Module, ModuleVisitor, Param};
use burn::tensor::{Device, Tensor, TensorData};
use hcsflow_n2v::rng::SplitMix64;
use hcsflow_n2v::{train, N2vConfig};
use ndarray::Array2;
use serde_json::{json, Map, Value};

/// Every float tensor of a module (parameters and running statistics) by its dotted path.
#[derive(Default)]
struct Collect {
    path: Vec<String>,
    tensors: Map<String, Value>,
}

impl ModuleVisitor for Collect {
    fn enter_module(&mut self, name: &str, _container_type: &str) {
        self.path.push(name.to_string());
    }
    fn exit_module(&mut self, _name: &str, _container_type: &str) {
        self.path.pop();
    }
    fn visit_float<const D: usize>(&mut self, param: &Param<Tensor<D>>) {
        let t = param.val();
        let shape = t.dims().to_vec();
        let data = t.into_data().try_to_vec::<f32>().unwrap();
        self.tensors.insert(self.path.join("."), json!({"shape": shape, "data": data}));
    }
}

#[test]
fn the_network_matches_a_float64_forward_pass_of_its_description() {
    let Some(python) = hcsflow_testkit::oracle::require(&["numpy"], "pip install numpy") else {
        return;
    };
    // (features, input batch, height, width): the second has the channels and the 64 columns for
    // the Winograd F(4 × 4, 3 × 3) kernel of inference on its first level where the CPU has
    // AVX-512.
    for (features, b, h, w) in [(4, 2, 12, 20), (8, 1, 8, 64)] {
        let mut rng = SplitMix64::new(21);
        let image = Array2::from_shape_fn((48, 40), |_| rng.next_f64() as f32 * 10.0);
        // The running statistics of the training steps, not estimated again: after 3 steps some
        // channels' variance is ≈ 0.03 (the average from 1 keeps ≈ 0.74), and 1/sqrt(var + ε)
        // would scale the float32 rounding up with it.
        let cfg =
            N2vConfig { patch_size: 16, batch_size: 4, steps_per_epoch: 3, epochs: 1, features, norm_batches: 0, ..N2vConfig::default() };
        let dev = Device::flex();
        let (denoiser, _) = train(image.view(), &cfg, &dev).unwrap();
        let model = denoiser.model().clone();
        let mut collect = Collect::default();
        model.visit(&mut collect);
        let names: Vec<&String> = collect.tensors.keys().collect();
        assert!(collect.tensors.contains_key("enc0.norm1.running_mean"), "{names:?}");
        let rm = collect.tensors["enc0.norm1.running_mean"]["data"].as_array().unwrap();
        assert!(rm.iter().any(|v| v.as_f64().unwrap() != 0.0), "running statistics were updated");

        let x: Vec<f32> = (0..b * h * w).map(|_| (rng.next_f64() * 4.0 - 2.0) as f32).collect();
        let case = json!({"x": x, "x_shape": [b, 1, h, w], "params": Value::Object(collect.tensors)});
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("case.json");
        std::fs::write(&path, case.to_string()).unwrap();
        let script = concat!(env!("CARGO_MANIFEST_DIR"), "/tests/oracle_unet.py");
        let want: Vec<f64> = serde_json::from_str(&python.run([script, path.to_str().unwrap()])).unwrap();
        let got = model.forward(Tensor::from_data(TensorData::new(x, [b, 1, h, w]), &dev)).into_data().try_to_vec::<f32>().unwrap();
        assert_eq!(got.len(), want.len());
        let scale = want.iter().fold(0f64, |m, v| m.max(v.abs())).max(1.0);
        let worst = got.iter().zip(&want).map(|(&g, &w)| (g as f64 - w).abs()).fold(0.0, f64::max) / scale;
        assert!(worst < 1e-6, "features {features}, {b}×{h}×{w}: worst error {worst:e} relative to the largest output");
    }
}
