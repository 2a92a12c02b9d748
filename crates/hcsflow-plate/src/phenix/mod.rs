//! Opera Phenix / Operetta plates exported by Harmony: an index XML plus one
//! TIFF per plane, all flat in `Images/`.
//!
//! The index is `Index.idx.xml`, `Index.ref.xml` or `Index.xml` (first found,
//! in that order), in the plate folder or its `Images/`. Namespaces HarmonyV5
//! and V6 are read alike (elements are matched by local name); a UTF-8 BOM is
//! accepted. Lengths are converted with their `Unit` attribute (metres when
//! absent, as Harmony writes them) to µm.
//!
//! Sites: Phenix FieldIDs are not raster order (field 1 is usually the centre
//! field, the others follow a snake), so fields are placed by stage position
//! into a raster grid — rows from −Y, since stage Y grows upward while image rows
//! grow downward — and numbered 1.. in reading order over the occupied cells.
//! [`PlateMetadata::field_to_site`](crate::PlateMetadata) keeps the mapping. The
//! OrientationMatrix contributes the axis directions (sign of its diagonal); its
//! scale and offset are not applied because their units are not documented.
//!
//! Both directions of the format live here: the file names (`names`:
//! [`parse_phenix_name`], [`PhenixName::file_name`], [`INDEX_NAMES`]), opening
//! a plate (`read`: [`open`]), and the metadata writers (`write`:
//! [`harmony_index`], [`tiff_tag_xml`]) that `hcsflow-synth` uses.

mod names;
mod read;
mod write;

pub use names::{parse_phenix_name, PhenixName, INDEX_NAMES};
pub use read::{find_index, open, parse_orientation};
pub use write::{harmony_index, tiff_tag_xml, IndexImage};
