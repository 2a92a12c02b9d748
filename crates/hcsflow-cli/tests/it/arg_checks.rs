//! Argument errors knowable from the input's shape exit 2 before any pixel
//! is read, in `run` (compile, also with `--dry-run`) and in `apply` (the
//! input file's header); `functions` documents the bound of clahe's kernel.

use std::path::Path;

use hcsflow_core::Stack;
use ndarray::Array3;

use crate::common;
use common::{hcsflow, stderr};

/// One well, 2×2 sites, 2 channels, 2 z planes, 64² pixels (the probe's plate).
fn plate(root: &Path) {
    let o = hcsflow(&["synth", root.to_str().unwrap(), "--wells", "A01", "--grid", "2x2", "--channels", "2", "--z", "2", "--size", "64"]);
    assert!(o.status.success(), "{}", stderr(&o));
}

#[test]
fn run_refuses_an_even_median_at_compile_with_exit_2_and_writes_nothing() {
    let dir = tempfile::tempdir().unwrap();
    let root = dir.path().join("plate");
    plate(&root);
    let pipeline = dir.path().join("median4.toml");
    std::fs::write(&pipeline, "name = \"x\"\n[[steps]]\nname = \"a\"\nfunc = { name = \"median_filter\", args = { size = 4 } }\n").unwrap();
    let out = dir.path().join("out");
    for dry in [true, false] {
        let mut args = vec!["run", root.to_str().unwrap(), pipeline.to_str().unwrap(), out.to_str().unwrap()];
        if dry {
            args.push("--dry-run");
        }
        let o = hcsflow(&args);
        let err = stderr(&o);
        assert_eq!(o.status.code(), Some(2), "dry run {dry}: {err}");
        assert!(err.contains("step 'a': median_filter: argument 'size': size must be odd, got 4"), "{err}");
        assert!(err.contains("64×64") && err.contains("fix: use 3 or 5"), "{err}");
        assert!(!out.join("run_manifest.json").exists(), "dry run {dry}: a manifest was written");
    }
}

#[test]
fn apply_checks_arguments_against_the_input_shape_with_exit_2() {
    let dir = tempfile::tempdir().unwrap();
    let input = dir.path().join("in.tif");
    hcsflow_tiff::write_stack(&input, &Stack::from(Array3::<u16>::zeros((2, 17, 23))), &Default::default()).unwrap();
    let out = dir.path().join("out.tif");
    let (i, o) = (input.to_str().unwrap(), out.to_str().unwrap());
    let cases: [(&[&str], &str); 3] = [
        (&["apply", "bin", i, o, "--arg", "factor=20"], "bin: argument 'factor': factor 20 is larger than the 17x23 plane"),
        (&["apply", "apply_mask", i, o, "--arg", "mask_index=2"], "mask_index 2 is not a plane of this 2-plane stack"),
        (&["apply", "composite", i, o, "--arg", "weights=1,2,3"], "3 weights given for a stack of 2 planes"),
    ];
    for (args, message) in cases {
        let r = hcsflow(args);
        assert_eq!(r.status.code(), Some(2), "{args:?}: {}", stderr(&r));
        assert!(stderr(&r).contains(message), "{args:?}: {}", stderr(&r));
        assert!(!out.exists(), "{args:?} wrote its output");
    }
    // The same arguments on a shape they fit run.
    let r = hcsflow(&["apply", "bin", i, o, "--arg", "factor=17", "--device", "cpu"]);
    assert!(r.status.success(), "{}", stderr(&r));
}

#[test]
fn functions_documents_clahe_kernel_size_bounded_by_the_plane() {
    let o = hcsflow(&["functions"]);
    assert!(o.status.success(), "{}", stderr(&o));
    let text = String::from_utf8_lossy(&o.stdout);
    let line = text.lines().find(|l| l.contains("--arg kernel_size=")).expect("clahe kernel_size listed");
    assert!(line.contains("(0..65536)") && line.contains("at most the plane's larger side"), "{line}");
}
