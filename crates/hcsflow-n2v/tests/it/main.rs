//! The integration tests of `hcsflow-n2v` as one test binary: each file here is
//! a module (linking a binary per file cost minutes of every CI run).

mod function;
mod host;
mod layers;
mod masking;
mod synthetic;
mod training;
mod unet;
mod wgpu;
