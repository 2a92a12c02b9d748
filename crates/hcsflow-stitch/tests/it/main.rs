//! The integration tests of `hcsflow-stitch` as one test binary: each file here is
//! a module (linking a binary per file cost minutes of every CI run).

#[path = "../common/mod.rs"]
mod common;

mod accuracy;
mod edge_cases;
mod registry;
