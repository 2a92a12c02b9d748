//! `n2v_denoise` in a pipeline: the built-in engine lists it, and a one-step TOML trains and
//! predicts on each (well, channel) stack of a synthetic plate, writing f32 images and one saved
//! model per well.

use std::sync::atomic::AtomicBool;
use std::sync::Arc;

use hcsflow::core::Contract;
use hcsflow::pipeline::PipelineSpec;

#[test]
fn the_engine_lists_n2v_denoise() {
    let catalogue = hcsflow::Engine::builtin().catalogue();
    let f = catalogue.iter().find(|f| f.name == "n2v_denoise").expect("n2v_denoise is registered");
    assert_eq!(f.contract, Contract::Pure3d);
    let args: Vec<&str> = f.args.iter().map(|a| a.name).collect();
    for a in ["steps_per_epoch", "epochs", "patch_size", "batch_size", "learning_rate", "seed", "model", "save"] {
        assert!(args.contains(&a), "{a} in {args:?}");
    }
}

#[test]
fn a_one_step_pipeline_denoises_a_synthetic_plate() {
    let dir = tempfile::tempdir().unwrap();
    let plate = dir.path().join("plate");
    let config = hcsflow_synth::SynthConfig {
        wells: vec!["A01".into()],
        grid_rows: 1,
        grid_cols: 2,
        channels: 1,
        z_planes: 1,
        size: 48,
        ..Default::default()
    };
    hcsflow_synth::generate(&config, &plate).unwrap();
    let models = dir.path().join("models");
    let toml = format!(
        r#"
name = "n2v"
[[steps]]
name = "denoise"
func = {{ name = "n2v_denoise", args = {{ patch_size = 32, batch_size = 4, steps_per_epoch = 3, epochs = 2, features = 4, tile_size = 48, tile_overlap = 8, save = "{}/{{well}}" }} }}
variable_components = ["site"]
dtype = "f32"
materialize = ["tiff"]
"#,
        models.display()
    );
    let spec = PipelineSpec::parse(&toml, "n2v.toml").unwrap();
    let engine = hcsflow::Engine::builtin();
    let options = hcsflow::RunOptions { device: hcsflow::DeviceOptions::cpu(), workers: 1, ..Default::default() };
    let out = dir.path().join("out");
    let plan = engine.plan_spec(&plate, &spec, &out, &options).unwrap();
    let summary = engine.execute(&plan, &options, Arc::new(AtomicBool::new(false)), &|_| {}).unwrap();
    assert_eq!(summary.completed, ["A01"]);
    assert!(hcsflow::run_problems(&summary, "cancelled").is_empty(), "{:?}", hcsflow::run_problems(&summary, "cancelled"));

    let mut images: Vec<_> = walk(&out.join("denoise")).into_iter().filter(|p| p.extension().is_some_and(|e| e == "tif")).collect();
    images.sort();
    assert_eq!(images.len(), 2, "one denoised image per site: {images:?}");
    for path in &images {
        let stack = hcsflow::tiff::read_stack(path).unwrap();
        assert_eq!(stack.dtype(), hcsflow::core::DType::F32, "{}", path.display());
        assert_eq!(stack.shape(), [1, 48, 48]);
        assert!(stack.to_f32().iter().all(|v| v.is_finite()));
    }
    assert!(models.join("A01").join(hcsflow::n2v::META_FILE).is_file(), "the model of well A01 is saved");
}

fn walk(dir: &std::path::Path) -> Vec<std::path::PathBuf> {
    let mut out = Vec::new();
    if let Ok(entries) = std::fs::read_dir(dir) {
        for e in entries.flatten() {
            let p = e.path();
            if p.is_dir() {
                out.extend(walk(&p));
            } else {
                out.push(p);
            }
        }
    }
    out
}
