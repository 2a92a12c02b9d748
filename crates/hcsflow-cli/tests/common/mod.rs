//! Helpers shared by the CLI test binaries (each binary uses a subset).
#![allow(dead_code)]

use std::collections::BTreeMap;
use std::process::{Command, Output};

use serde_json::Value;

pub mod outputs;

/// Runs the `hcsflow` binary of this build. The software-GPU allowance is
/// removed from the environment so that a test only gets it by asking.
pub fn hcsflow(args: &[&str]) -> Output {
    Command::new(env!("CARGO_BIN_EXE_hcsflow")).args(args).env_remove("HCSFLOW_ALLOW_SOFTWARE_GPU").output().expect("run hcsflow")
}

pub fn stderr(o: &Output) -> String {
    String::from_utf8_lossy(&o.stderr).into_owned()
}

/// A span as the trace shows it: name, arguments, start and end (µs), thread.
#[derive(Debug, Clone)]
pub struct Interval {
    pub name: String,
    pub args: Value,
    pub start: f64,
    pub end: f64,
    pub tid: u64,
}

/// Pairs the `B`/`E` events of every thread (a stack per thread).
pub fn intervals(events: &[Value]) -> Vec<Interval> {
    let mut open: BTreeMap<u64, Vec<&Value>> = BTreeMap::new();
    let mut out = Vec::new();
    for e in events {
        let tid = e["tid"].as_u64().unwrap_or(0);
        match e["ph"].as_str() {
            Some("B") => open.entry(tid).or_default().push(e),
            Some("E") => {
                let b = open.get_mut(&tid).and_then(Vec::pop).unwrap_or_else(|| panic!("E without B: {e}"));
                assert_eq!(b["name"], e["name"], "B/E of thread {tid} do not nest");
                out.push(Interval {
                    name: b["name"].as_str().unwrap().to_string(),
                    // The end event's args: those given at the start plus any recorded later.
                    args: e.get("args").unwrap_or(&b["args"]).clone(),
                    start: b["ts"].as_f64().unwrap(),
                    end: e["ts"].as_f64().unwrap(),
                    tid,
                });
            }
            _ => {}
        }
    }
    assert!(open.values().all(Vec::is_empty), "spans left open: {open:?}");
    out
}

pub fn within(inner: &Interval, outer: &Interval) -> bool {
    outer.start <= inner.start && inner.end <= outer.end
}
