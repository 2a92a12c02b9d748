//! The integration tests of `hcsflow-cli` as one test binary: each file here is
//! a module (linking a binary per file cost minutes of every CI run).

#[path = "../common/mod.rs"]
mod common;

mod arg_checks;
mod bench;
mod cli;
mod faults;
mod gpu_demo;
mod gpu_queues;
mod gpu_runtime;
mod inspect_verify;
mod missing;
mod output_folder;
mod report;
mod run;
mod shards;
mod slurm;
mod synth_inspect;
mod trace;
