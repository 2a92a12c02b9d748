//! The integration tests of `hcsflow` as one test binary: each file here is
//! a module (linking a binary per file cost minutes of every CI run).

mod builtin;
mod errors;
mod gpu_memory;
mod gpu_queues;
mod mega_flex;
mod n2v;
mod require_gpu;
