//! OME-Zarr HCS plates as input ([`Format::OmeZarr`]): NGFF 0.4 (Zarr v2) and
//! 0.5 (Zarr v3), written by hcsflow, ome-zarr-py, Fractal or any other NGFF
//! writer. The metadata is read by [`hcsflow_zarr::ZarrPlate`]; this module
//! maps it onto the plate model.
//!
//! - **Wells**: the plate's row name and column number (`A` + `1` → `A01`);
//!   rows that are not letters or columns that are not numbers are named by
//!   their indices in the plate's `rows` and `columns`, with a warning.
//! - **Sites**: 1 + a field's position in its well's `images` list (a field
//!   that cannot be read keeps its number: its planes are missing).
//! - **Channel, z, timepoint**: 1 + the index along the field's `c`, `z` and
//!   `t` axes (1 when the image has no such axis).
//! - **Images**: every plane of every field's full-resolution (level-0)
//!   array; [`ImageRecord::path`] is the array's folder and
//!   [`ImageRecord::at`] the plane's index in it ([`PlaneAt::Zarr`]).
//! - **Metadata**: pixel size from the x axis' scale and unit (none when the
//!   axis has no length unit: a scale without a unit is not a size); channel
//!   names from the first field's `omero.channels` labels; image size and
//!   dtype from its array; stage positions from the fields' y/x translations
//!   when the fields of a well are not all at one place, and the site grid
//!   from them (else one row, with a warning); plate size the smallest
//!   standard plate holding the wells and as many rows and columns as the
//!   plate lists (NGFF asks for all of them; writers, hcsflow's included,
//!   often list only those with wells).
//! - **Problems**: a field that cannot be read, or whose planes differ in
//!   size or dtype from the first readable field's, is left out with a
//!   warning, and its planes (as many as that field has) are
//!   [`Plate::missing`]; so is site 1 of a listed well without any field.

use std::path::{Path, PathBuf};

use hcsflow_zarr::{ZarrField, ZarrPlate, ZarrWell};

use crate::grid::place_sites;
use crate::well::{parse_well, smallest_plate, well_name};
use crate::{Format, ImageRecord, MissingImage, PlaneAt, Plate, PlateError, PlateMetadata, StagePosition};

/// The OME-Zarr plate at `path`: the folder itself when it is one, else the
/// one plate folder directly inside it (an `hcsflow run` output folder
/// holding `<plate>.ome.zarr`). `Ok(None)` when there is none; several are
/// [`PlateError::MultipleDescriptors`].
pub fn find_plate(path: &Path) -> Result<Option<PathBuf>, PlateError> {
    if !path.is_dir() {
        return Ok(None);
    }
    if hcsflow_zarr::is_plate(path) {
        return Ok(Some(path.to_path_buf()));
    }
    let plates: Vec<PathBuf> = crate::list_dir(path)?
        .into_iter()
        .filter(|(name, kind)| *kind == crate::EntryKind::Dir && !name.starts_with('.'))
        .map(|(name, _)| path.join(name))
        .filter(|dir| hcsflow_zarr::is_plate(dir))
        .collect();
    match plates.len() {
        0 => Ok(None),
        1 => Ok(plates.into_iter().next()),
        _ => Err(PlateError::MultipleDescriptors {
            path: path.to_path_buf(),
            files: plates.iter().map(|p| p.display().to_string()).collect::<Vec<_>>().join(", "),
        }),
    }
}

/// Opens the OME-Zarr plate at `path` (see [`find_plate`]). Reads metadata
/// only, never writes.
pub fn open(path: &Path) -> Result<Plate, PlateError> {
    let root = match find_plate(path)? {
        Some(root) => root,
        // Zarr group metadata that does not read as a plate: say what is wrong with it.
        None if [".zattrs", "zarr.json", ".zgroup"].iter().any(|f| path.join(f).is_file()) => path.to_path_buf(),
        None => return Err(PlateError::NoPlateFound { path: path.to_path_buf() }),
    };
    let zarr = ZarrPlate::open(&root).map_err(|source| PlateError::Zarr { path: root.clone(), source: Box::new(source) })?;
    let mut warnings = zarr.warnings.clone();
    let Some(first) = zarr.wells.iter().flat_map(|w| &w.fields).next() else {
        return Err(PlateError::NoImages { path: root, detail: "no well has a readable field image".into() });
    };
    let reference = PlaneShape::of(first);
    let mut metadata = PlateMetadata {
        name: zarr.name.clone().unwrap_or_else(|| plate_name(&root)),
        pixel_size_um: first.physical_size_um("x"),
        channel_names: PlateMetadata::numbered_names(&first.channel_labels),
        image_width: Some(reference.width),
        image_height: Some(reference.height),
        dtype: Some(reference.dtype),
        bit_depth: Some(reference.dtype.size_bytes() as u32 * 8),
        channels: reference.channels,
        z_planes: reference.z,
        timepoints: reference.t,
        ..PlateMetadata::default()
    };
    let (mut images, mut missing) = (Vec::new(), Vec::new());
    // The plate holds every well and, where the metadata lists them all (as
    // NGFF asks), every listed row and column.
    let mut max_row_col = (zarr.rows.len() as u32, zarr.columns.len() as u32);
    for well in &zarr.wells {
        let name = well_of(&zarr, well, &mut warnings);
        if let Some((r, c)) = parse_well(&name) {
            max_row_col = (max_row_col.0.max(r), max_row_col.1.max(c));
        }
        metadata.acquired_wells.push(name.clone());
        if well.fields.is_empty() && well.unreadable.is_empty() {
            missing.extend(reference.planes(&name, 1, "the well has no field image (see the warnings)"));
        }
        for (index, path, why) in &well.unreadable {
            metadata.sites = metadata.sites.max(*index as u32 + 1);
            missing.extend(reference.planes(&name, *index as u32 + 1, &format!("field {path} cannot be read: {why}")));
        }
        let positions: Vec<Option<(f64, f64)>> = well.fields.iter().map(|f| Some((f.offset_um("x")?, f.offset_um("y")?))).collect();
        let first_position = positions.first().copied().flatten();
        let placed = positions.iter().flatten().any(|p| Some(*p) != first_position);
        for (field, position) in well.fields.iter().zip(&positions) {
            let site = field.index as u32 + 1;
            metadata.sites = metadata.sites.max(site);
            if let Some(problem) = reference.differs(field) {
                warnings.push(format!("field {} left out: {problem}", field.path));
                missing.extend(reference.planes(&name, site, &format!("field {} {problem}", field.path)));
                continue;
            }
            if let (true, Some((x_um, y_um))) = (placed, *position) {
                metadata.stage_positions.push(StagePosition { well: name.clone(), site, x_um, y_um });
            }
            images.extend(planes_of(&zarr.root, field, &name, site));
        }
    }
    let (rows, cols) = smallest_plate(max_row_col.0, max_row_col.1);
    (metadata.plate_rows, metadata.plate_columns) = (rows, cols);
    let sites: Vec<u32> = (1..=metadata.sites).collect();
    place_sites(&mut metadata, &sites, &mut warnings, "an NGFF translation of its fields that tells them apart");
    if images.is_empty() {
        return Err(PlateError::NoImages { path: root, detail: "no well has a readable field image".into() });
    }
    Ok(Plate { format: Format::OmeZarr, root, descriptor: zarr.descriptor, metadata, images, projections: Vec::new(), missing, warnings })
}

/// The name of a well: row letters and column number, or, when the plate
/// names them otherwise, the well at its indices (with a warning).
fn well_of(zarr: &ZarrPlate, well: &ZarrWell, warnings: &mut Vec<String>) -> String {
    let by_name = well.column.parse::<u32>().ok().and_then(|c| parse_well(&format!("{}{c:02}", well.row.to_ascii_uppercase())));
    if let Some((r, c)) = by_name {
        if let Some(name) = well_name(r, c) {
            return name;
        }
    }
    let name = well_name(well.row_index as u32 + 1, well.column_index as u32 + 1).unwrap_or_else(|| well.path.replace('/', "_"));
    warnings.push(format!(
        "{}: well '{}' is not a row letter and a column number; named {name} by its place in the plate's rows and columns",
        zarr.descriptor.display(),
        well.path
    ));
    name
}

/// The plate's name when the metadata gives none: its folder name without
/// `.zarr` / `.ome.zarr`.
fn plate_name(root: &Path) -> String {
    let name = root.file_name().map(|n| n.to_string_lossy().into_owned()).unwrap_or_default();
    name.trim_end_matches(".zarr").trim_end_matches(".ome").to_string()
}

/// Every plane of `field` as an image of `well`, site `site`.
fn planes_of(root: &Path, field: &ZarrField, well: &str, site: u32) -> Vec<ImageRecord> {
    let path = root.join(&field.array);
    let mut out = Vec::new();
    for t in 0..field.size("t") {
        for c in 0..field.size("c") {
            for z in 0..field.size("z") {
                out.push(ImageRecord {
                    well: well.to_string(),
                    site,
                    channel: c as u32 + 1,
                    z_index: z as u32 + 1,
                    timepoint: t as u32 + 1,
                    path: path.clone(),
                    at: Some(PlaneAt::Zarr { index: field.plane_index(t, c, z) }),
                });
            }
        }
    }
    out
}

/// What every field of a plate must share with the first: plane size and
/// dtype (the pipeline reads all planes into stacks of one format), and the
/// counts of channels, z planes and time points missing planes are listed by.
struct PlaneShape {
    height: u32,
    width: u32,
    dtype: hcsflow_core::DType,
    channels: u32,
    z: u32,
    t: u32,
}

impl PlaneShape {
    fn of(field: &ZarrField) -> PlaneShape {
        let (height, width) = field.plane_size();
        PlaneShape {
            height: height as u32,
            width: width as u32,
            dtype: field.dtype,
            channels: field.size("c") as u32,
            z: field.size("z") as u32,
            t: field.size("t") as u32,
        }
    }

    /// Why `field`'s planes cannot join the plate's, if they cannot.
    fn differs(&self, field: &ZarrField) -> Option<String> {
        let (h, w) = field.plane_size();
        if (h, w) != (u64::from(self.height), u64::from(self.width)) || field.dtype != self.dtype {
            return Some(format!(
                "has {h}×{w} {} planes; the plate's first field has {}×{} {}",
                field.dtype, self.height, self.width, self.dtype
            ));
        }
        None
    }

    /// The missing images of one field.
    fn planes(&self, well: &str, site: u32, reason: &str) -> Vec<MissingImage> {
        let mut out = Vec::new();
        for t in 1..=self.t {
            for c in 1..=self.channels {
                for z in 1..=self.z {
                    let (channel, z_index, timepoint) = (c, z, t);
                    out.push(MissingImage { well: well.into(), site, channel, z_index, timepoint, path: None, reason: reason.into() });
                }
            }
        }
        out
    }
}
