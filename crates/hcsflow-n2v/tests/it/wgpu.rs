//! The same code on burn's wgpu backend (lavapipe in CI; tiny sizes): the device-drawn batches
//! are bit-identical to flex's, and a short training run gives the same losses and predictions
//! within float32 reduction-order tolerance. Run with `--features wgpu`.
#![cfg(feature = "wgpu")]

use burn::tensor::{Device, DeviceKind, Tensor, TensorData};
use hcsflow_n2v::masking::Masker;
use hcsflow_n2v::rng::SplitMix64;
use hcsflow_n2v::{train, N2vConfig};
use ndarray::Array2;

/// The wgpu adapter: the first one wgpu lists (lavapipe, device type CPU, on machines without a
/// GPU).
fn gpu() -> Device {
    Device::wgpu(DeviceKind::DefaultDevice)
}

fn floats<const D: usize>(t: Tensor<D>) -> Vec<f32> {
    t.into_data().try_to_vec::<f32>().unwrap()
}

fn image(h: usize, w: usize, seed: u64) -> Array2<f32> {
    let mut rng = SplitMix64::new(seed);
    Array2::from_shape_fn((h, w), |(y, x)| ((y as f32 * 0.3).sin() + (x as f32 * 0.2).cos()) * 5.0 + rng.next_f64() as f32)
}

#[test]
fn batches_drawn_on_wgpu_equal_those_drawn_on_flex() {
    let (h, w) = (40, 36);
    let img = image(h, w, 1);
    let cfg = N2vConfig { patch_size: 16, batch_size: 3, masked_pixel_percentage: 2.0, roi_size: 5, ..N2vConfig::default() };
    let on = |dev: &Device| {
        let t = Tensor::<1>::from_data(TensorData::new(img.iter().copied().collect::<Vec<_>>(), [h * w]), dev);
        let m = Masker::new(t, h, w, &cfg, dev);
        (0..3).map(|s| m.batch(s)).map(|b| (floats(b.input), floats(b.target), floats(b.loss_mask))).collect::<Vec<_>>()
    };
    assert_eq!(on(&gpu()), on(&Device::flex()));
}

#[test]
fn training_on_wgpu_agrees_with_flex() {
    let img = image(48, 40, 2);
    let cfg = N2vConfig {
        patch_size: 16,
        batch_size: 2,
        steps_per_epoch: 3,
        epochs: 2,
        features: 4,
        tile_size: 32,
        tile_overlap: 8,
        ..N2vConfig::default()
    };
    let (df, rf) = train(img.view(), &cfg, &Device::flex()).unwrap();
    let (dg, rg) = train(img.view(), &cfg, &gpu()).unwrap();
    assert_eq!(rg.readbacks, cfg.epochs);
    // Tolerance: float32 sums in another order, through 6 Adam steps and batch norm.
    for (a, b) in rf.epoch_losses.iter().zip(&rg.epoch_losses) {
        assert!((a - b).abs() <= 1e-3 * a.abs().max(1e-3), "losses flex {:?} vs wgpu {:?}", rf.epoch_losses, rg.epoch_losses);
    }
    let pf = df.predict(img.view()).unwrap();
    let pg = dg.predict(img.view()).unwrap();
    // Relative to the image's spread (the units of the prediction).
    let spread = img.std(0.0);
    let worst = pf.iter().zip(pg.iter()).map(|(a, b)| (a - b).abs()).fold(0f32, f32::max);
    println!("losses flex {:?} wgpu {:?}; prediction differs by at most {worst} (image spread {spread})", rf.epoch_losses, rg.epoch_losses);
    assert!(worst <= 1e-3 * spread, "prediction differs by {worst} (image spread {spread})");
}
