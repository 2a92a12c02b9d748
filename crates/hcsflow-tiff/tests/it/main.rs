//! The integration tests of `hcsflow-tiff` as one test binary: each file here is
//! a module (linking a binary per file cost minutes of every CI run).
//! Not here: `tests/fuzz.rs`, which installs a process-wide panic hook.

#[path = "../common/mod.rs"]
mod common;

mod atomic;
mod descriptions;
mod expected;
mod oracle;
mod roundtrip;
mod strip_layouts;
