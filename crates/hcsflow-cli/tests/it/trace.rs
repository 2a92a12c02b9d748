//! `hcsflow run --trace trace.json`: a Chrome/Perfetto trace with spans per
//! well, step, read, stack, function call, conversion and write, nested in time.

use std::process::Command;

use hcsflow_synth::{generate, SynthConfig};
use serde_json::Value;

use crate::common;
use common::{intervals, within};

#[test]
fn trace_has_nested_spans_per_well_step_call_and_conversion() {
    let dir = tempfile::tempdir().unwrap();
    let plate = dir.path().join("plate");
    let cfg = SynthConfig {
        size: 32,
        z_planes: 2,
        grid_rows: 1,
        grid_cols: 2,
        wells: vec!["A01".into(), "B02".into()],
        ..SynthConfig::default()
    };
    generate(&cfg, &plate).unwrap();
    let pipeline = dir.path().join("p.toml");
    std::fs::write(
        &pipeline,
        "[[steps]]\nname = \"max_z\"\nfunc = \"max_projection\"\nvariable_components = [\"z_index\"]\nmaterialize = [\"tiff\"]\n\
         [[steps]]\nname = \"mean_sites\"\nfunc = \"mean_projection\"\nvariable_components = [\"site\"]\n",
    )
    .unwrap();
    let trace = dir.path().join("trace.json");
    let o = Command::new(env!("CARGO_BIN_EXE_hcsflow"))
        .args(["run", plate.to_str().unwrap(), pipeline.to_str().unwrap(), dir.path().join("out").to_str().unwrap()])
        .args(["--device", "cpu", "--workers", "2", "--trace", trace.to_str().unwrap()])
        .output()
        .unwrap();
    assert!(o.status.success(), "{}", String::from_utf8_lossy(&o.stderr));
    let events: Vec<Value> = serde_json::from_slice(&std::fs::read(&trace).unwrap()).expect("the trace is a JSON array");
    let spans = intervals(&events);
    let named = |n: &str| spans.iter().filter(|s| s.name == n).cloned().collect::<Vec<_>>();
    let (wells, steps, calls, conversions) = (named("well"), named("step"), named("call"), named("conversion"));

    let well_names: Vec<&str> = wells.iter().map(|w| w.args["well"].as_str().unwrap()).collect();
    assert_eq!(well_names.len(), 2, "one well span per well: {well_names:?}");
    assert!(well_names.contains(&"A01") && well_names.contains(&"B02"));
    // Each well runs both steps, inside its well span.
    assert_eq!(steps.len(), 4, "{steps:?}");
    for s in &steps {
        let w = wells.iter().find(|w| w.args["well"] == s.args["well"]).expect("the step's well");
        assert!(within(s, w), "step {s:?} inside well {w:?}");
    }
    // Calls: max_z per (site, channel) stack and mean per channel stack, each inside a step span.
    let by_function = |f: &str| calls.iter().filter(|c| c.args["function"] == f).count();
    assert_eq!(by_function("max_projection"), 2 * 2 * 2, "2 wells × 2 sites × 2 channels");
    assert_eq!(by_function("mean_projection"), 2 * 2, "2 wells × 2 channels");
    for c in &calls {
        assert!(steps.iter().any(|s| within(c, s)), "call {c:?} inside a step");
        assert!(c.args["route_in"].as_str().unwrap().contains("identity"), "{c:?}");
    }
    assert_eq!(conversions.len(), calls.len(), "one conversion back to the host per chain");
    for c in &conversions {
        assert!(steps.iter().any(|s| within(c, s)), "conversion {c:?} inside a step");
    }
    for name in ["read", "stack", "write"] {
        assert!(!named(name).is_empty(), "{name} spans");
    }
}
