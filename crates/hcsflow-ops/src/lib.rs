//! Host implementations of hcsflow's functions.
//!
//! Each public function is a plain Rust function on [`Stack`]s with a
//! numerical contract tested against an independent reference; [`register`]
//! declares them (spec, contract, arguments) in a [`Registry`]. GPU crates add
//! their implementations to the same logical functions afterwards.

pub mod basic;
pub mod clahe;
pub mod coloc;
pub mod composite;
pub mod convolve;
pub mod count;
pub mod decon;
pub mod equalize;
pub mod filters;
pub mod focus;
pub mod geometry;
pub mod histogram;
pub mod label;
pub mod measure;
pub mod normalize;
pub mod projection;
pub mod quality;
pub mod segment;
pub mod threshold;
pub mod tophat;

use hcsflow_core::{Binding, FunctionArgs, FunctionDecl, FunctionError, Registry, Stack};

/// A host implementation that receives the whole stack even under a per-plane
/// contract, for functions that already treat every plane on their own (and
/// parallelise inside each plane). [`FunctionDecl::host`] would have the
/// registry copy each plane out and concatenate the results: two extra copies
/// of the data per call, which cost as much as a fast filter itself.
/// The registry still checks that the plane count is kept.
pub(crate) fn host_all_planes<A: FunctionArgs>(
    decl: &FunctionDecl<A>,
    kernel: impl Fn(&Stack, &A) -> Result<Stack, FunctionError> + Send + Sync + 'static,
) -> Binding {
    decl.host_owned(move |s, a, _| kernel(&s, a))
}

/// Declares every host function in `registry`.
pub fn register(registry: &mut Registry) {
    projection::register(registry);
    normalize::register(registry);
    equalize::register(registry);
    clahe::register(registry);
    filters::register(registry);
    geometry::register(registry);
    composite::register(registry);
    tophat::register(registry);
    focus::register(registry);
    threshold::register(registry);
    label::register(registry);
    count::register(registry);
    segment::register(registry);
    coloc::register(registry);
    measure::register(registry);
    basic::register(registry);
    decon::register(registry);
    quality::register(registry);
}
