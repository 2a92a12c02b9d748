//! The integration tests of `hcsflow-zarr` as one test binary: each file here is
//! a module (linking a binary per file cost minutes of every CI run).

#[path = "../common/mod.rs"]
mod common;

mod concurrency;
mod errors;
mod grow;
mod oracle;
mod roundtrip;
