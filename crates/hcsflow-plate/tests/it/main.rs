//! The integration tests of `hcsflow-plate` as one test binary: each file here is
//! a module (linking a binary per file cost minutes of every CI run).
//! Not here: `tests/fuzz.rs`, whose counting global allocator is the process's.

mod ome_tiff;
mod prefixless;
mod real_plates;
mod reliability;
mod robustness;
