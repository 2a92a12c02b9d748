//! The integration tests of `hcsflow-core` as one test binary: each file here is
//! a module (linking a binary per file cost minutes of every CI run).

mod artifacts;
mod registry;
mod routes;
mod slices;
mod stack;
