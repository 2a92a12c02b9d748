//! Helpers shared by the CLI test binaries (each binary uses a subset).
#![allow(dead_code)]

use std::process::{Command, Output};

/// Runs the `hcsflow` binary of this build. The software-GPU allowance is
/// removed from the environment so that a test only gets it by asking.
pub fn hcsflow(args: &[&str]) -> Output {
    Command::new(env!("CARGO_BIN_EXE_hcsflow"))
        .args(args)
        .env_remove("HCSFLOW_ALLOW_SOFTWARE_GPU")
        .output()
        .expect("run hcsflow")
}

pub fn stderr(o: &Output) -> String {
    String::from_utf8_lossy(&o.stderr).into_owned()
}
