//! Training and prediction on `flex`: one device read per epoch, determinism, save → load →
//! identical prediction, any image size, and a short run that denoises.

use burn::tensor::Device;
use hcsflow_n2v::{train, Denoiser, N2vConfig, N2vError};
use ndarray::Array2;

/// One plane of [`noisy_stack`](crate::synthetic::noisy_stack) with a nucleus per 400 pixels.
fn noisy_pair(h: usize, w: usize, seed: u64, peak: f64) -> (Array2<f32>, Array2<f32>) {
    crate::synthetic::noisy_plane(h, w, seed, peak, 400)
}

fn psnr(clean: &Array2<f32>, x: &Array2<f32>) -> f64 {
    let range = clean.iter().cloned().fold(f32::MIN, f32::max) - clean.iter().cloned().fold(f32::MAX, f32::min);
    let mse = clean.iter().zip(x.iter()).map(|(&a, &b)| (a as f64 - b as f64).powi(2)).sum::<f64>() / clean.len() as f64;
    10.0 * ((range as f64).powi(2) / mse).log10()
}

fn tiny() -> N2vConfig {
    N2vConfig {
        patch_size: 32,
        batch_size: 4,
        steps_per_epoch: 3,
        epochs: 4,
        features: 4,
        tile_size: 64,
        tile_overlap: 16,
        tile_batch: 3,
        ..N2vConfig::default()
    }
}

#[test]
fn the_training_loop_reads_from_the_device_once_per_epoch() {
    let (_, noisy) = noisy_pair(80, 72, 1, 30.0);
    for (epochs, steps) in [(1, 5), (4, 3), (3, 1)] {
        let cfg = N2vConfig { epochs, steps_per_epoch: steps, ..tiny() };
        let (_, report) = train(noisy.view(), &cfg, &Device::flex()).unwrap();
        assert_eq!(report.steps, epochs * steps);
        assert_eq!(report.readbacks, epochs, "{epochs} epochs × {steps} steps");
        assert_eq!(report.epoch_losses.len(), epochs);
        assert!(report.epoch_losses.iter().all(|l| l.is_finite() && *l > 0.0), "{:?}", report.epoch_losses);
    }
}

#[test]
fn a_seed_gives_one_model_and_another_seed_another() {
    let (_, noisy) = noisy_pair(70, 90, 2, 30.0);
    let dev = Device::flex();
    let run = |seed| {
        let (d, r) = train(noisy.view(), &N2vConfig { seed, ..tiny() }, &dev).unwrap();
        (d.predict(noisy.view()).unwrap(), r.epoch_losses)
    };
    let (a, la) = run(7);
    let (b, lb) = run(7);
    let (c, lc) = run(8);
    assert_eq!(la, lb);
    assert_eq!(a, b, "same seed, same prediction, bit for bit");
    assert_ne!(la, lc);
    assert_ne!(a, c);
}

#[test]
fn a_saved_model_reloads_and_predicts_identically() {
    let (_, noisy) = noisy_pair(75, 66, 3, 30.0);
    let dev = Device::flex();
    let (denoiser, _) = train(noisy.view(), &tiny(), &dev).unwrap();
    let dir = tempfile::tempdir().unwrap();
    let model_dir = dir.path().join("n2v");
    denoiser.save(&model_dir).unwrap();
    let loaded = Denoiser::load(&model_dir, &dev).unwrap();
    assert_eq!(loaded.normalization(), denoiser.normalization());
    assert_eq!(loaded.config(), denoiser.config());
    let want = denoiser.predict(noisy.view()).unwrap();
    assert_eq!(loaded.predict(noisy.view()).unwrap(), want, "bit for bit");
    // A fresh network (the same seed, untrained) predicts differently: the weights were loaded.
    let (untrained, _) = train(noisy.view(), &N2vConfig { epochs: 1, steps_per_epoch: 1, ..tiny() }, &dev).unwrap();
    assert_ne!(untrained.predict(noisy.view()).unwrap(), want);

    // Broken directories are typed errors naming the file.
    let err = Denoiser::load(&dir.path().join("missing"), &dev).unwrap_err();
    assert!(matches!(err, N2vError::Io { .. }), "{err}");
    std::fs::write(model_dir.join("n2v.json"), "{\"format\": \"other\"}").unwrap();
    let err = Denoiser::load(&model_dir, &dev).unwrap_err();
    assert!(matches!(err, N2vError::Model { .. }) && err.to_string().contains("n2v.json"), "{err}");
}

#[test]
fn prediction_takes_any_size_and_keeps_it() {
    let (_, noisy) = noisy_pair(64, 64, 4, 30.0);
    let dev = Device::flex();
    let (denoiser, _) = train(noisy.view(), &N2vConfig { epochs: 1, ..tiny() }, &dev).unwrap();
    for (h, w) in [(1, 1), (1, 7), (5, 3), (37, 53), (64, 64), (65, 130), (150, 97)] {
        let (_, img) = noisy_pair(h, w, 9, 30.0);
        let out = denoiser.predict(img.view()).unwrap();
        assert_eq!(out.dim(), (h, w));
        assert!(out.iter().all(|v| v.is_finite()), "{h}×{w}");
    }
    // An image smaller than a patch trains too (mirrored up to the patch).
    let (_, small) = noisy_pair(20, 9, 5, 30.0);
    let (d, _) = train(small.view(), &N2vConfig { epochs: 1, ..tiny() }, &dev).unwrap();
    assert_eq!(d.predict(small.view()).unwrap().dim(), (20, 9));
    // Bad inputs are refused, not panics.
    let mut bad = small.clone();
    bad[[3, 4]] = f32::NAN;
    assert!(matches!(train(bad.view(), &tiny(), &dev), Err(N2vError::Image(_))));
    assert!(matches!(denoiser.predict(Array2::<f32>::zeros((0, 5)).view()), Err(N2vError::Image(_))));
    assert!(matches!(train(small.view(), &N2vConfig { patch_size: 30, ..tiny() }, &dev), Err(N2vError::Config(_))));
}

#[test]
fn seams_of_tiled_prediction_are_blended() {
    // The same network on one 128² tile and on 64² tiles overlapping by 32: away from the image
    // border the two agree closely (a tile's own border effects are ramped out).
    let (_, noisy) = noisy_pair(128, 128, 6, 30.0);
    let dev = Device::flex();
    let (d, _) = train(noisy.view(), &N2vConfig { epochs: 3, steps_per_epoch: 5, features: 8, ..tiny() }, &dev).unwrap();
    let whole = d.clone().with_tiling(128, 0, 1).unwrap().predict(noisy.view()).unwrap();
    let tiled = d.with_tiling(64, 32, 4).unwrap().predict(noisy.view()).unwrap();
    let spread = whole.std(0.0) as f64;
    assert!(spread > 0.1, "the network does not predict a constant: spread {spread}");
    let inner = |a: &Array2<f32>| a.slice(ndarray::s![8..120, 8..120]).to_owned();
    let diff = (inner(&whole) - inner(&tiled)).mapv(|v| (v as f64).abs());
    let mean_diff = diff.mean().unwrap();
    assert!(mean_diff < 0.05 * spread, "mean |whole − tiled| {mean_diff} vs image spread {spread}");
}

#[test]
fn a_short_training_run_lowers_the_loss_and_denoises() {
    let (clean, noisy) = noisy_pair(128, 128, 10, 30.0);
    let cfg = N2vConfig {
        patch_size: 32,
        batch_size: 8,
        steps_per_epoch: 15,
        epochs: 6,
        features: 8,
        tile_size: 128,
        tile_overlap: 32,
        ..N2vConfig::default()
    };
    let (d, report) = train(noisy.view(), &cfg, &Device::flex()).unwrap();
    let l = &report.epoch_losses;
    assert!(l[l.len() - 1] < 0.8 * l[0], "losses {l:?}");
    let before = psnr(&clean, &noisy);
    let after = psnr(&clean, &d.predict(noisy.view()).unwrap());
    println!("losses {l:?}; PSNR {before:.2} dB → {after:.2} dB");
    assert!(after > before + 3.0, "PSNR {before:.2} dB → {after:.2} dB");
}
