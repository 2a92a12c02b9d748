//! Files written safely, for every hcsflow crate that writes files.
//!
//! - [`write_atomic`] / [`write_atomic_with`]: a file appears under its name
//!   whole or not at all (a hidden temporary beside it, then a rename).
//! - [`temp_name`] / [`is_temp_name`]: the one name scheme of those
//!   temporaries, and the predicate that recognises it (and the schemes of
//!   earlier versions), for whoever sweeps what a killed run left behind.
//! - [`peak_rss_bytes`]: the process's peak resident memory.
//!
//! `hcsflow-core` stays free of I/O; this crate depends on nothing but `std`.

mod atomic;
mod rss;
mod temp_name;

pub use atomic::{write_atomic, write_atomic_with, Durability};
pub use rss::peak_rss_bytes;
pub use temp_name::{is_temp_name, temp_name};
