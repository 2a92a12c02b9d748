//! Plates written by `hcsflow run`: a step's TIFF output folder, described by
//! the `hcsflow-plate.json` the run writes into it ([`DESCRIPTOR_NAME`]).
//!
//! The descriptor is what makes a run's output a plate: a second pipeline
//! runs on a first one's results, and `hcsflow inspect` reports the same
//! wells, fields and channels as the run that wrote them. It records the
//! plate metadata as the run knew it (pixel size, stage positions, site grid,
//! channel names; a component a step reduced away is one value without a
//! name or position) and every image with its components and its file,
//! relative to the folder. Reading it checks every file like the microscope
//! readers do: a file that is gone is [`Plate::missing`], a name that leaves
//! the folder is never opened.
//!
//! Pointing at a run's output folder itself (`OUT`, holding
//! `run_manifest.json`) opens the one step folder with a descriptor; when
//! several steps wrote images the error lists them, and the user points at one.

use std::path::{Component, Path, PathBuf};

use serde::{Deserialize, Serialize};

use crate::{io_err, not_a_regular_file, Format, ImageRecord, MissingImage, Plate, PlateError, PlateMetadata};

/// The descriptor's file name in a step's output folder.
pub const DESCRIPTOR_NAME: &str = "hcsflow-plate.json";

/// The run manifest's file name, which marks a run's output folder.
pub const RUN_MANIFEST_NAME: &str = "run_manifest.json";

/// The descriptor version this build writes and reads.
pub const DESCRIPTOR_VERSION: u32 = 1;

/// Where the images of an output plate came from.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct OutputSource {
    /// The plate the run read.
    pub plate: PathBuf,
    /// Its format.
    pub format: Format,
    /// The pipeline's name.
    pub pipeline: String,
    /// The step whose output this is.
    pub step: String,
}

/// One image of an output plate: its components and its file.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct OutputImage {
    pub well: String,
    pub site: u32,
    pub channel: u32,
    pub z_index: u32,
    pub timepoint: u32,
    /// Relative to the descriptor's folder.
    pub file: PathBuf,
}

/// The content of [`DESCRIPTOR_NAME`].
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct OutputDescriptor {
    /// [`DESCRIPTOR_VERSION`] when written.
    pub version: u32,
    pub source: OutputSource,
    pub metadata: PlateMetadata,
    /// Every image, numeric order.
    pub images: Vec<OutputImage>,
}

/// The descriptor of the output plate at `path`, when `path` is one: the
/// descriptor file itself, a folder holding it, or a run's output folder
/// with exactly one step folder holding one. `None` when `path` is none of
/// these, or a run's output folder where no step wrote TIFFs but one
/// OME-Zarr plate is (that plate is the output plate, [`crate::ome_zarr`]);
/// an error when it is a run's output folder whose images cannot be chosen
/// (no step wrote images, or several steps wrote TIFFs: the error lists them).
pub fn find_descriptor(path: &Path) -> Result<Option<PathBuf>, PlateError> {
    if path.is_file() {
        let named = path.file_name().is_some_and(|n| n == DESCRIPTOR_NAME);
        return Ok(named.then(|| path.to_path_buf()));
    }
    let own = path.join(DESCRIPTOR_NAME);
    if own.exists() {
        return Ok(Some(own));
    }
    if !path.join(RUN_MANIFEST_NAME).exists() {
        return Ok(None);
    }
    let mut steps = Vec::new();
    for (name, kind) in crate::list_dir(path)? {
        let descriptor = path.join(&name).join(DESCRIPTOR_NAME);
        if kind == crate::EntryKind::Dir && descriptor.exists() {
            steps.push(descriptor);
        }
    }
    match steps.len() {
        1 => Ok(steps.pop()),
        // Only OME-Zarr output: that plate is the run's output plate (`ome_zarr::find_plate`).
        0 if crate::ome_zarr::find_plate(path)?.is_some() => Ok(None),
        0 => Err(PlateError::NoImages {
            path: path.to_path_buf(),
            detail: format!(
                "an hcsflow run's output folder, but no step folder holds {DESCRIPTOR_NAME}: no step wrote TIFF images \
                 (materialize = [\"tiff\"]), or the run predates output plates (run it again with --resume)"
            ),
        }),
        _ => Err(PlateError::MultipleDescriptors {
            path: path.to_path_buf(),
            files: steps.iter().map(|d| d.parent().unwrap_or(d).display().to_string()).collect::<Vec<_>>().join(", "),
        }),
    }
}

/// Opens the output plate whose descriptor is `descriptor`.
///
/// Every listed file is checked as the microscope readers check theirs: a
/// file that does not exist (or is not a regular file) is missing, with the
/// reason; a name that is absolute or leaves the folder is missing and never
/// opened. Errors: the descriptor cannot be read, is not JSON of this shape
/// ([`PlateError::Descriptor`]), or is of a newer version.
pub fn open(descriptor: &Path) -> Result<Plate, PlateError> {
    if let Some(reason) = not_a_regular_file(descriptor) {
        return Err(PlateError::NotRegularFile { path: descriptor.to_path_buf(), reason });
    }
    let text = std::fs::read_to_string(descriptor).map_err(io_err(descriptor))?;
    let bad = |message: String| PlateError::Descriptor { path: descriptor.to_path_buf(), message };
    let parsed: OutputDescriptor = serde_json::from_str(&text).map_err(|e| bad(e.to_string()))?;
    if parsed.version != DESCRIPTOR_VERSION {
        return Err(bad(format!(
            "descriptor version {}; this hcsflow reads version {DESCRIPTOR_VERSION} (written by another hcsflow version?)",
            parsed.version
        )));
    }
    let root = descriptor.parent().map(Path::to_path_buf).unwrap_or_default();
    let mut plate = Plate {
        format: Format::Hcsflow,
        root: root.clone(),
        descriptor: descriptor.to_path_buf(),
        metadata: parsed.metadata,
        images: Vec::new(),
        projections: Vec::new(),
        missing: Vec::new(),
        warnings: Vec::new(),
    };
    for image in parsed.images {
        match located(&root, &image.file) {
            Ok(path) => plate.images.push(ImageRecord {
                well: image.well,
                site: image.site,
                channel: image.channel,
                z_index: image.z_index,
                timepoint: image.timepoint,
                path,
                at: None,
            }),
            Err((path, reason)) => plate.missing.push(MissingImage {
                well: image.well,
                site: image.site,
                channel: image.channel,
                z_index: image.z_index,
                timepoint: image.timepoint,
                path: Some(path),
                reason,
            }),
        }
    }
    if plate.images.is_empty() {
        return Err(PlateError::NoImages { path: descriptor.to_path_buf(), detail: "none of the images it lists is there".into() });
    }
    Ok(plate)
}

/// The file `rel` of the plate in `root`, or where it was expected and why
/// it cannot be read (it leaves the folder, is gone, is not a regular file).
fn located(root: &Path, rel: &Path) -> Result<PathBuf, (PathBuf, String)> {
    let Some(path) = inside(root, rel) else {
        return Err((rel.to_path_buf(), "its name is absolute or leaves the plate folder; not opened".into()));
    };
    match not_a_regular_file(&path) {
        None => Ok(path),
        Some(reason) => Err((path, reason)),
    }
}

/// `root/rel` when `rel` is relative and stays inside `root`, else `None`.
fn inside(root: &Path, rel: &Path) -> Option<PathBuf> {
    let normal = rel.components().all(|c| matches!(c, Component::Normal(_) | Component::CurDir));
    (normal && rel.components().next().is_some()).then(|| root.join(rel))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn only_names_inside_the_folder_are_opened() {
        let root = Path::new("/out/step");
        assert_eq!(inside(root, Path::new("TimePoint_1/a.tif")), Some(PathBuf::from("/out/step/TimePoint_1/a.tif")));
        assert_eq!(inside(root, Path::new("../plate/a.tif")), None);
        assert_eq!(inside(root, Path::new("/etc/passwd")), None);
        assert_eq!(inside(root, Path::new("")), None);
    }
}
