//! The integration tests of `hcsflow-ops` as one test binary: each file here is
//! a module (linking a binary per file cost minutes of every CI run).

#[path = "../common/mod.rs"]
mod common;

mod basic;
mod clahe;
mod count;
mod decon;
mod equalize;
mod filters;
mod focus;
mod geometry;
mod normalize;
mod objects;
mod projection;
mod quality;
mod registry;
mod tophat;
