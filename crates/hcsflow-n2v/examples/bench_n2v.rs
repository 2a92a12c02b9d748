//! N2V2 on bench_n2v.py's benchmark pair, as CAREamics is measured there: train `epochs ×
//! steps` steps of patch 64 × batch 16 on the noisy 1024² image, predict it (our default tiling:
//! tiles of at most 512 overlapping by 48, one per pass; CAREamics is run with its 256, overlap
//! 48), predict its 2 × 2 tiling (2048²), report s/step, PSNR against the clean image, times and
//! peak RSS as one JSON line.
//!
//! ```sh
//! python crates/hcsflow-n2v/examples/bench_n2v_pair.py ../shared/bench /tmp/n2v-bench
//! cargo run --release -p hcsflow-n2v --example bench_n2v -- /tmp/n2v-bench [--steps 100] [--epochs 2] [--batch 16] [--tile-size N] [--tile-batch N] [--seed N] [--predict 0]
//! ```

use std::path::{Path, PathBuf};
use std::time::Instant;

use burn::tensor::Device;
use hcsflow_n2v::{train, N2vConfig};
use ndarray::{concatenate, Array2, Axis};

/// The allocator of the CLI (with its options, below) and the Python module, where `n2v_denoise`
/// runs: measured as users run it.
#[global_allocator]
static ALLOCATOR: mimalloc::MiMalloc = mimalloc::MiMalloc;

fn plane(path: &Path) -> Result<Array2<f32>, Box<dyn std::error::Error>> {
    let stack = hcsflow_bench::read_npy(path)?.to_f32();
    Ok(stack.index_axis(Axis(0), 0).to_owned())
}

fn psnr(clean: &Array2<f32>, x: &Array2<f32>) -> f64 {
    let (lo, hi) = clean.iter().fold((f64::MAX, f64::MIN), |(lo, hi), &v| (lo.min(v as f64), hi.max(v as f64)));
    let mse = clean.iter().zip(x.iter()).map(|(&a, &b)| (a as f64 - b as f64).powi(2)).sum::<f64>() / clean.len() as f64;
    10.0 * ((hi - lo).powi(2) / mse).log10()
}

fn main() -> Result<(), Box<dyn std::error::Error>> {
    // As the CLI sets it (`keep_freed_memory` in crates/hcsflow-cli/src/main.rs): mimalloc's
    // `mi_option_purge_delay` (15) = −1, freed memory kept for reuse.
    // SAFETY: sets an integer in the allocator's option table; valid at any time.
    unsafe { libmimalloc_sys::mi_option_set(15, -1) };
    let mut args = std::env::args().skip(1);
    let dir = PathBuf::from(args.next().ok_or("usage: bench_n2v DIR [--steps N] [--epochs N]")?);
    let mut cfg = N2vConfig::default();
    let mut predict = true;
    while let Some(flag) = args.next() {
        let value: usize = args.next().ok_or("missing value")?.parse()?;
        match flag.as_str() {
            "--steps" => cfg.steps_per_epoch = value,
            "--epochs" => cfg.epochs = value,
            "--batch" => cfg.batch_size = value,
            "--tile-batch" => cfg.tile_batch = value,
            "--tile-size" => cfg.tile_size = value,
            "--seed" => cfg.seed = value as u64,
            "--predict" => predict = value != 0,
            other => return Err(format!("unknown option {other}").into()),
        }
    }
    let clean = plane(&dir.join("n2v_clean.npy"))?;
    let noisy = plane(&dir.join("n2v_noisy.npy"))?;
    let device = Device::flex();

    let (denoiser, report) = train(noisy.view(), &cfg, &device)?;
    if !predict {
        let s_per_step = report.seconds / report.steps.max(1) as f64;
        println!("{}", serde_json::json!({"train_steps": report.steps, "s_per_step": s_per_step, "epoch_losses": report.epoch_losses}));
        return Ok(());
    }
    let t = Instant::now();
    let denoised = denoiser.predict(noisy.view())?;
    let predict_1024 = t.elapsed().as_secs_f64();
    let big = concatenate(
        Axis(0),
        &[concatenate(Axis(1), &[noisy.view(), noisy.view()])?.view(), concatenate(Axis(1), &[noisy.view(), noisy.view()])?.view()],
    )?;
    let t = Instant::now();
    let big_out = denoiser.predict(big.view())?;
    let predict_2048 = t.elapsed().as_secs_f64();
    let out = serde_json::json!({
        "op": "n2v2 (hcsflow-n2v, burn flex)",
        "train_steps": report.steps,
        "train_s": (report.seconds * 100.0).round() / 100.0,
        "s_per_step": (report.seconds / report.steps as f64 * 10000.0).round() / 10000.0,
        "epoch_losses": report.epoch_losses,
        "readbacks": report.readbacks,
        "predict_1024_s": (predict_1024 * 100.0).round() / 100.0,
        "predict_2048_s": (predict_2048 * 100.0).round() / 100.0,
        "psnr_noisy_db": (psnr(&clean, &noisy) * 100.0).round() / 100.0,
        "psnr_denoised_db": (psnr(&clean, &denoised) * 100.0).round() / 100.0,
        "prediction_2048_finite": big_out.iter().all(|v| v.is_finite()),
        "peak_rss_mib": hcsflow_bench::peak_rss_mib().round(),
        "config": cfg,
    });
    println!("{out}");
    Ok(())
}
