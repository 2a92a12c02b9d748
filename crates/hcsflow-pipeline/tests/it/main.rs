//! The integration tests of `hcsflow-pipeline` as one test binary: each file here is
//! a module (linking a binary per file cost minutes of every CI run).
//! Not here: `tests/bad_images.rs`, which measures the process's peak RSS.

#[path = "../common/mod.rs"]
mod common;

mod artifacts;
mod compile_checks;
mod missing;
mod ome_zarr_input;
mod one_stack_at_a_time;
mod output_folder;
mod output_plates;
mod pipeline;
mod plate_scope;
mod toml_fuzz;
mod zarr_oracle;
