//! ImageXpress / MetaXpress plates: a `.HTD` descriptor plus one TIFF per plane.
//!
//! Folder variants accepted (formats.md §4.1): images directly in the plate
//! folder; `TimePoint_<t>/`; `TimePoint_<t>/ZStep_<z>/`; and, with
//! `ZProjection TRUE`, the projected plane in `TimePoint_<t>/` beside the
//! `ZStep_<z>/` folders (exposed as [`Plate::projections`](crate::Plate::projections)).
//!
//! File names are parsed from the right (the plate prefix may contain `_`):
//! `prefix_WELL[_sS][_wW][_tT][_thumb][GUID].tif|.TIF|.tiff`. A trailing 36-character
//! GUID (bare, `_`-separated or bracketed) is removed first, so that in
//! `…_w107447158-AC76-…` the wave is `1` and not `107447158`.
//!
//! Names without the plate prefix (`A01_s001_w1.tif`, `A01_s001_w1_z001.tif`,
//! `…_z001_t001.tif`: what OpenHCS's synthetic generator writes) are read too,
//! when every image of the plate is named that way; a folder mixing both is
//! [`PlateError::MixedNaming`](crate::PlateError::MixedNaming), naming one file of each kind. A `_z<Z>` token
//! gives the plane outside `ZStep_<z>/` folders; inside one, the folder wins
//! and a disagreeing token is a warning.
//!
//! Sites are numbered 1.. over the TRUE cells of `SiteSelection` in reading
//! order, which also gives each site's grid cell.
//!
//! MetaXpress database acquisitions (`<plate>/<YYYY-MM-DD>/<id>/`, no HTD)
//! are read from their names and folders alone; the plate or date folder
//! above one acquisition opens it, above several is
//! [`PlateError::SeveralAcquisitions`](crate::PlateError::SeveralAcquisitions)
//! ([`database_acquisition`]). Their site numbers are those found, placed on
//! the grid their MetaSeries stage positions show (one row, with a warning,
//! when the TIFFs have none).
//!
//! Stage positions are MetaSeries `stage-position-x/y` as written (µm). We
//! take MetaXpress stage Y to grow with image rows (no flip); no public source
//! states the sign, and the synthetic generator writes the same convention.
//! Only one TIFF header per (well, site) is read (first channel/plane/time).
//!
//! Hidden files (`._Plate_A01_s1_w1.tif`, what macOS leaves on SMB/exFAT) are
//! never images; a duplicate image keeps the file whose prefix is the HTD's
//! name. The HTD's counts must be backed by files on disk: see
//! [`MAX_EXPECTED_FLOOR`] for the rule, checked before anything is enumerated.
//!
//! Both directions of the format live here: the descriptor (`htd`: [`parse_htd`]),
//! the file and folder names (`names`: [`parse_image_name`] and the name
//! builders), opening a plate (`read`: [`open`]), and the metadata writers
//! (`write`: [`htd_bytes`], [`metaseries_xml`]) that `hcsflow-synth` uses.

mod htd;
mod names;
mod read;
mod write;

pub use htd::{decode_text, parse_htd, HtdInfo};
pub use names::{
    htd_file_name, image_file_name, parse_image_name, plane_folder, thumbnail_file_name, GuidSuffix, ImageName, TIMEPOINT_FOLDER,
    ZSTEP_FOLDER,
};
pub use read::{database_acquisition, find_htd_files, is_database_acquisition, open, MAX_EXPECTED_FLOOR, MAX_EXPECTED_PER_FILE};
pub use write::{htd_bytes, metaseries_xml, HtdSpec, MetaSeries};
