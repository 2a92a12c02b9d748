//! Host implementations of hcsflow's functions.
//!
//! Each public function is a plain Rust function on [`Stack`]s with a
//! numerical contract tested against an independent reference; [`register`]
//! declares them (spec, contract, arguments) in a [`Registry`]. GPU crates add
//! their implementations to the same logical functions afterwards.

pub mod clahe;
pub mod composite;
pub mod convolve;
pub mod count;
pub mod equalize;
pub mod filters;
pub mod histogram;
pub mod normalize;
pub mod focus;
pub mod geometry;
pub mod label;
pub mod projection;
pub mod threshold;
pub mod tophat;

use hcsflow_core::Registry;

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
}
