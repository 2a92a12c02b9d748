//! OME-Zarr HCS plates: the writer of hcsflow's outputs, and a reader of
//! any NGFF 0.4/0.5 plate ([`ZarrPlate`], [`read_plane`]) for inputs.
//!
//! Writes plate → row → column (well) → field images, each field a multiscale
//! `[t, c, z, y, x]` image with physical pixel sizes, channel names and a 2×2
//! mean pyramid, readable by zarr-python, ome-zarr-py and napari:
//!
//! - [`NgffVersion::V05`] (default): NGFF 0.5 on Zarr v3;
//! - [`NgffVersion::V04`]: NGFF 0.4 on Zarr v2.
//!
//! ```no_run
//! # use std::path::Path;
//! # use hcsflow_core::{DType, Stack};
//! # use hcsflow_zarr::*;
//! let spec = PlateSpec {
//!     name: "demo".into(),
//!     rows: vec!["A".into()],
//!     columns: vec!["1".into(), "2".into()],
//!     wells: vec!["A01".into(), "A02".into()],
//!     fields_per_well: 1,
//!     channel_names: vec!["DAPI".into()],
//!     pixel_size_um: Some((0.65, 0.65)),
//!     shape: FieldShape { t: 1, c: 1, z: 1, y: 512, x: 512 },
//!     ..PlateSpec::default()
//! };
//! let writer = PlateWriter::create(Path::new("out.zarr"), spec)?;
//! writer.write_plane("A01", 0, 0, 0, 0, &Stack::zeros(DType::U16, [1, 512, 512]))?;
//! let root = writer.finish()?; // A02 has no field: left out of the plate's wells
//! # Ok::<(), ZarrError>(())
//! ```
//!
//! Chunks are whole planes (one per `(t, c, z)` per level), so a plane is one
//! file write and readers fetch a plane with one read; with
//! [`FieldExtent::Grow`] (planes of any size, e.g. whole-well mosaics) they are
//! `shape.y × shape.x` tiles. Sharding is not used.

mod error;
mod metadata;
mod pyramid;
mod reader;
mod spec;
mod store;
mod writer;

pub use error::ZarrError;
pub use reader::{is_plate, micrometres_per, plane_format, read_plane, Axis, AxisKind, ZarrField, ZarrPlate, ZarrWell};
pub use spec::{FieldExtent, FieldPosition, FieldShape, NgffVersion, PlateSpec, ZarrCompression};
pub use store::remove_stale_temps;
pub use writer::PlateWriter;
