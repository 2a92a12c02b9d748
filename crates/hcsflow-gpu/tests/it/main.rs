//! The integration tests of `hcsflow-gpu` as one test binary: each file here is
//! a module (linking a binary per file cost minutes of every CI run).

#[path = "../common/mod.rs"]
mod common;

mod assemble_gpu;
mod basic_gpu;
mod conformance;
mod errors;
mod focus_gpu;
mod gpu_vs_host;
mod morphology_gpu;
mod queues;
