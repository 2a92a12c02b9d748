//! `n2v_denoise` through the registry: it denoises a synthetic stack against its clean ground
//! truth, a seed gives the same output twice, a saved model reloaded with `model=` predicts the
//! same, and bad arguments or too-small planes are refused naming the argument or the input.

use hcsflow_core::{Conversions, DType, Device, Registry, Stack};
use hcsflow_testkit::call;
use ndarray::Array3;

fn registry() -> Registry {
    let mut registry = Registry::new();
    hcsflow_n2v::register(&mut registry);
    registry
}

fn run(registry: &Registry, args: &[&str], stack: &Stack) -> Result<Stack, String> {
    call(registry, &Conversions::default(), "n2v_denoise", args, stack, Device::Cpu).map_err(|e| e.to_string())
}

/// [`noisy_stack`](crate::synthetic::noisy_stack) with a nucleus per 300 pixels.
fn noisy_stack(depth: usize, h: usize, w: usize, seed: u64, peak: f64) -> (Array3<f32>, Array3<f32>) {
    crate::synthetic::noisy_stack(depth, h, w, seed, peak, 300)
}

fn mse(a: &Array3<f32>, b: &Array3<f32>) -> f64 {
    a.iter().zip(b.iter()).map(|(&x, &y)| (x as f64 - y as f64).powi(2)).sum::<f64>() / a.len() as f64
}

/// Settings small enough for a debug-profile test.
const TINY: [&str; 8] =
    ["patch_size=32", "batch_size=8", "steps_per_epoch=15", "epochs=6", "features=8", "tile_size=64", "tile_overlap=16", "seed=7"];

#[test]
fn it_trains_denoises_and_is_reproducible_and_its_saved_model_predicts_the_same() {
    let registry = registry();
    let (clean, noisy) = noisy_stack(2, 80, 72, 3, 30.0);
    let stack = Stack::from(noisy.clone());
    let dir = tempfile::tempdir().unwrap();
    let save = format!("save={}", dir.path().join("model-{well}").display());
    let mut args = TINY.to_vec();
    args.push(&save);

    let out = run(&registry, &args, &stack).unwrap();
    assert_eq!(out.dtype(), DType::F32);
    assert_eq!(out.shape(), [2, 80, 72]);
    let denoised = out.to_f32();
    let (before, after) = (mse(&clean, &noisy), mse(&clean, &denoised));
    println!("MSE against the clean stack: noisy {before:.3}, denoised {after:.3}");
    assert!(after < 0.6 * before, "MSE noisy {before:.3} → denoised {after:.3}");

    // The same seed: the same output, bit for bit; another seed: another network.
    assert_eq!(run(&registry, &args, &stack).unwrap().to_f32(), denoised);
    let mut other = TINY.to_vec();
    other[7] = "seed=8";
    assert_ne!(run(&registry, &other, &stack).unwrap().to_f32(), denoised);

    // Outside a plate the stack has no well: `{well}` becomes "stack".
    let model_dir = dir.path().join("model-stack");
    assert!(model_dir.join(hcsflow_n2v::META_FILE).is_file() && model_dir.join(hcsflow_n2v::WEIGHTS_FILE).is_file());
    let model = format!("model={}", model_dir.display());
    // Predicting with the saved model (training arguments ignored) gives the trained output.
    let reloaded = run(&registry, &[&model, "tile_size=64", "tile_overlap=16", "steps_per_epoch=1"], &stack).unwrap();
    assert_eq!(reloaded.to_f32(), denoised, "the reloaded model predicts identically");
    // A u16 input converts (f32 output) and a loaded model predicts planes smaller than a patch.
    let small = Stack::from(noisy.slice(ndarray::s![.., ..10, ..13]).mapv(|v| v.max(0.0).round() as u16));
    let out = run(&registry, &[&model], &small).unwrap();
    assert_eq!((out.dtype(), out.shape()), (DType::F32, [2, 10, 13]));
}

#[test]
fn bad_arguments_and_small_planes_are_refused_naming_the_argument_or_the_input() {
    let registry = registry();
    let (_, noisy) = noisy_stack(1, 40, 48, 5, 30.0);
    let stack = Stack::from(noisy);
    let cases: [(&[&str], &[&str]); 8] = [
        (&["patch_size=30"], &["argument 'patch_size'", "multiple of 4"]),
        (&["patch_size=8"], &["patch_size", "16"]),
        (&["patch_size=64"], &["the input stack", "40×48", "smaller than patch_size 64", "patch_size ≤ 40"]),
        (&["patch_size=32", "learning_rate=0"], &["argument 'learning_rate'", "positive"]),
        (&["patch_size=32", "tile_size=66"], &["argument 'tile_size'", "multiple of 4"]),
        (&["patch_size=32", "tile_size=64", "tile_overlap=40"], &["argument 'tile_overlap'", "at most half"]),
        (&["patch_size=32", "batch_size=0"], &["batch_size"]),
        (&["model=/no/such/n2v-model"], &["argument 'model'", "/no/such/n2v-model", "n2v.json"]),
    ];
    for (args, wanted) in cases {
        let e = run(&registry, args, &stack).unwrap_err();
        println!("{args:?}: {e}");
        for w in wanted {
            assert!(e.contains(w), "{args:?}: {e} lacks {w}");
        }
    }
    // NaN pixels are an error naming the pixel, not a panic.
    let mut bad = stack.to_f32();
    bad[[0, 2, 3]] = f32::NAN;
    let e = run(&registry, &["patch_size=32", "steps_per_epoch=1", "epochs=1", "features=2"], &Stack::from(bad)).unwrap_err();
    assert!(e.contains("NaN") && e.contains("row 2"), "{e}");
}
