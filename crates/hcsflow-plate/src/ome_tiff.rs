//! OME-TIFF plates ([`Format::OmeTiff`]): one `.ome.tif` file per field, or
//! one file holding several images (series), described by the OME-XML in the
//! first ImageDescription of each file (OME data model 2016-06, as
//! Bio-Formats, tifffile and the microscope vendors' exporters write it).
//!
//! - **Images**: each `Image` element's `Pixels` (`SizeX/Y/Z/C/T`, `Type`,
//!   `DimensionOrder`) and its `TiffData` blocks, which place its planes on
//!   IFDs (pages): `IFD` (default 0), `FirstZ/FirstC/FirstT` (default 0),
//!   `PlaneCount` (default 1 when `IFD` is given, else every IFD), the planes
//!   following one another in `DimensionOrder`; a `UUID` child's `FileName`
//!   names another file of the set (relative to this one's folder).
//!   [`ImageRecord::path`] is the file, [`ImageRecord::at`] the page
//!   ([`PlaneAt::TiffPage`]).
//! - **Wells and sites**: `Plate/Well` (`Row`, `Column`, 0-based) and its
//!   `WellSample`s, ordered by `Index`, each referring to an image
//!   (`ImageRef`): site k of the well is its k-th sample; stage positions
//!   from `PositionX/PositionY` (with their units; µm when none), and the
//!   site grid from them. Without a `Plate`, every image is a site of well
//!   A01, with a warning.
//! - **Metadata**: pixel size from `PhysicalSizeX` (+ unit), channel names
//!   from `Channel@Name`, plane size and dtype from the first image.
//! - The same image listed by several files (a multi-file set whose files
//!   all carry the whole OME-XML) counts once. A plane no `TiffData` places,
//!   or placed in a file that is not there, is [`Plate::missing`].

use std::collections::{BTreeMap, BTreeSet};
use std::path::{Path, PathBuf};

use hcsflow_core::DType;

use crate::grid::place_sites;
use crate::well::{parse_well, smallest_plate, well_name};
use crate::StagePosition;
use crate::{list_dir, not_a_regular_file, EntryKind, Format, ImageRecord, MissingImage, PlaneAt, Plate, PlateError, PlateMetadata};

/// Whether the file name is an OME-TIFF's (`.ome.tif`, `.ome.tiff`, any case).
pub fn is_ome_tiff_name(name: &str) -> bool {
    let lower = name.to_ascii_lowercase();
    !name.starts_with('.') && (lower.ends_with(".ome.tif") || lower.ends_with(".ome.tiff"))
}

/// The OME-TIFF files of `path`: the file itself, or the `.ome.tif(f)` files
/// directly in the folder, sorted.
pub fn find_files(path: &Path) -> Result<Vec<PathBuf>, PlateError> {
    if path.is_file() {
        let name = path.file_name().map(|n| n.to_string_lossy().into_owned()).unwrap_or_default();
        return Ok(if is_ome_tiff_name(&name) { vec![path.to_path_buf()] } else { Vec::new() });
    }
    Ok(list_dir(path)?
        .into_iter()
        .filter(|(name, kind)| *kind != EntryKind::Dir && is_ome_tiff_name(name))
        .map(|(name, _)| path.join(name))
        .collect())
}

/// One `Image` of an OME-XML document, with its planes placed on pages.
#[derive(Debug, Clone)]
struct OmeImage {
    id: String,
    height: u32,
    width: u32,
    dtype: DType,
    sizes: [u32; 3],
    pixel_size_um: Option<f64>,
    channel_names: Vec<String>,
    /// (z, c, t) 0-based → (file, page).
    planes: BTreeMap<(u32, u32, u32), (PathBuf, u32)>,
}

/// A well sample: (well name, sample index, position in µm).
type Sample = (String, u32, Option<(f64, f64)>);

/// An image placed in a well: (sample index, document order, the image, position in µm).
type SiteEntry<'a> = (u32, usize, &'a OmeImage, Option<(f64, f64)>);

/// Opens the OME-TIFF plate at `path` (a `.ome.tif` file or a folder of
/// them). Reads each file's first ImageDescription; decodes no pixels.
pub fn open(path: &Path) -> Result<Plate, PlateError> {
    let files = find_files(path)?;
    let Some(first) = files.first().cloned() else {
        return Err(PlateError::NoPlateFound { path: path.to_path_buf() });
    };
    let root = if path.is_file() { path.parent().map(Path::to_path_buf).unwrap_or_default() } else { path.to_path_buf() };
    let Documents { images, plate_name, no_plate, mut warnings } = read_documents(&files)?;
    let Some((reference, _)) = images.first().cloned() else {
        return Err(PlateError::NoImages { path: path.to_path_buf(), detail: "no OME-XML Image in the OME-TIFF files".into() });
    };
    if no_plate {
        warnings.push("no Plate in the OME-XML: every image is a site of well A01, in file and image order".into());
    }
    // Sites: per well, in sample-index order (images without a sample after them, in order).
    let mut by_well: BTreeMap<String, Vec<SiteEntry>> = BTreeMap::new();
    for (k, (image, sample)) in images.iter().enumerate() {
        let (well, index, position) = sample.clone().unwrap_or_else(|| ("A01".to_string(), u32::MAX, None));
        by_well.entry(well).or_default().push((index, k, image, position));
    }
    let mut metadata = PlateMetadata {
        name: plate_name.unwrap_or_else(|| {
            first
                .file_name()
                .map(|n| n.to_string_lossy().trim_end_matches(".tiff").trim_end_matches(".tif").trim_end_matches(".ome").to_string())
                .unwrap_or_default()
        }),
        pixel_size_um: reference.pixel_size_um,
        channel_names: PlateMetadata::numbered_names(&reference.channel_names),
        image_width: Some(reference.width),
        image_height: Some(reference.height),
        dtype: Some(reference.dtype),
        bit_depth: Some(reference.dtype.size_bytes() as u32 * 8),
        z_planes: reference.sizes[0],
        channels: reference.sizes[1],
        timepoints: reference.sizes[2],
        ..PlateMetadata::default()
    };
    let (mut records, mut missing) = (Vec::new(), Vec::new());
    let mut max_row_col = (0, 0);
    for (well, mut sites) in by_well {
        sites.sort_by_key(|(index, k, _, _)| (*index, *k));
        if let Some((r, c)) = parse_well(&well) {
            max_row_col = (max_row_col.0.max(r), max_row_col.1.max(c));
        }
        metadata.acquired_wells.push(well.clone());
        for (k, (_, _, image, position)) in sites.iter().enumerate() {
            let site = k as u32 + 1;
            metadata.sites = metadata.sites.max(site);
            if (image.height, image.width, image.dtype) != (reference.height, reference.width, reference.dtype) {
                warnings.push(format!(
                    "image {} ({well} site {site}) is {}×{} {}; the plate's first image is {}×{} {}; left out",
                    image.id, image.height, image.width, image.dtype, reference.height, reference.width, reference.dtype
                ));
                continue;
            }
            if let Some((x_um, y_um)) = position {
                metadata.stage_positions.push(StagePosition { well: well.clone(), site, x_um: *x_um, y_um: *y_um });
            }
            let (found, absent) = planes_of(image, &well, site);
            records.extend(found);
            missing.extend(absent);
        }
    }
    metadata.channels = metadata.channels.max(1);
    (metadata.plate_rows, metadata.plate_columns) = smallest_plate(max_row_col.0, max_row_col.1);
    let sites: Vec<u32> = (1..=metadata.sites).collect();
    place_sites(&mut metadata, &sites, &mut warnings, "a WellSample PositionX/PositionY");
    if records.is_empty() {
        return Err(PlateError::NoImages { path: path.to_path_buf(), detail: "no plane of the OME-XML images is in the files".into() });
    }
    Ok(Plate { format: Format::OmeTiff, root, descriptor: first, metadata, images: records, projections: Vec::new(), missing, warnings })
}

/// What the OME-XML documents of a set of files describe.
struct Documents {
    /// Images in file and document order, each with its well sample if a
    /// `Plate` lists it; one listed again (same id, same first plane: a
    /// document repeated in every file of a set) counts once.
    images: Vec<(OmeImage, Option<Sample>)>,
    /// The first `Plate@Name`.
    plate_name: Option<String>,
    /// Some document has no `Plate` (or one listing no samples).
    no_plate: bool,
    warnings: Vec<String>,
}

/// Reads the OME-XML of each file (page 0's first ImageDescription). A file
/// without one is a warning; malformed XML or an image hcsflow cannot read
/// is [`PlateError::OmeXml`] naming the file.
fn read_documents(files: &[PathBuf]) -> Result<Documents, PlateError> {
    let mut out = Documents { images: Vec::new(), plate_name: None, no_plate: false, warnings: Vec::new() };
    let mut seen: BTreeSet<(String, Option<(PathBuf, u32)>)> = BTreeSet::new();
    let bad = |file: &Path, message: String| PlateError::OmeXml { path: file.to_path_buf(), message };
    for file in files {
        if let Some(reason) = not_a_regular_file(file) {
            out.warnings.push(format!("{} {reason}; not opened", file.display()));
            continue;
        }
        let info = hcsflow_tiff::read_info(file).map_err(|e| bad(file, e.to_string()))?;
        let Some(xml) = info.description.filter(|d| d.contains("<OME")) else {
            out.warnings.push(format!("{}: no OME-XML in its ImageDescription; left out", file.display()));
            continue;
        };
        let doc = roxmltree::Document::parse(xml.trim_start_matches('\u{feff}')).map_err(|e| bad(file, format!("malformed XML: {e}")))?;
        let samples = plate_samples(&doc, &mut out.plate_name);
        out.no_plate |= samples.is_empty();
        let folder = file.parent().unwrap_or(Path::new(""));
        for node in doc.descendants().filter(|n| n.has_tag_name("Image")) {
            let image = parse_image(node, file, folder, info.pages as u32).map_err(|message| bad(file, message))?;
            let first_plane = image.planes.values().next().cloned();
            if seen.insert((image.id.clone(), first_plane)) {
                let sample = samples.get(&image.id).cloned();
                out.images.push((image, sample));
            }
        }
    }
    Ok(out)
}

/// Every plane of `image` as an image of `well`, site `site`: those its
/// TiffData place in a file that is there, and the missing others.
fn planes_of(image: &OmeImage, well: &str, site: u32) -> (Vec<ImageRecord>, Vec<MissingImage>) {
    let (mut records, mut missing) = (Vec::new(), Vec::new());
    for z in 0..image.sizes[0] {
        for c in 0..image.sizes[1] {
            for t in 0..image.sizes[2] {
                let (well, channel, z_index, timepoint) = (well.to_string(), c + 1, z + 1, t + 1);
                match image.planes.get(&(z, c, t)) {
                    Some((file, page)) if file.is_file() => records.push(ImageRecord {
                        well,
                        site,
                        channel,
                        z_index,
                        timepoint,
                        path: file.clone(),
                        at: Some(PlaneAt::TiffPage { page: *page }),
                    }),
                    placed => missing.push(MissingImage {
                        well,
                        site,
                        channel,
                        z_index,
                        timepoint,
                        path: placed.map(|(f, _)| f.clone()),
                        reason: match placed {
                            Some(_) => "the file its TiffData names is not there".into(),
                            None => format!("no TiffData of image {} places this plane", image.id),
                        },
                    }),
                }
            }
        }
    }
    (records, missing)
}

/// Image ID → (well, sample index, position in µm) from the document's
/// `Plate` elements; records the first plate's `Name`.
fn plate_samples(doc: &roxmltree::Document, name: &mut Option<String>) -> BTreeMap<String, Sample> {
    let mut out = BTreeMap::new();
    for plate in doc.descendants().filter(|n| n.has_tag_name("Plate")) {
        if name.is_none() {
            *name = plate.attribute("Name").map(str::to_string);
        }
        for well in plate.children().filter(|n| n.has_tag_name("Well")) {
            let index = |key: &str| well.attribute(key).and_then(|v| v.trim().parse::<u32>().ok());
            let (Some(row), Some(col)) = (index("Row"), index("Column")) else { continue };
            let Some(well_name) = well_name(row + 1, col + 1) else { continue };
            for sample in well.children().filter(|n| n.has_tag_name("WellSample")) {
                let Some(image) = sample.children().find(|n| n.has_tag_name("ImageRef")).and_then(|r| r.attribute("ID")) else { continue };
                let number = sample.attribute("Index").and_then(|v| v.parse().ok()).unwrap_or(u32::MAX);
                let position = |axis: &str| {
                    let v: f64 = sample.attribute(format!("Position{axis}").as_str())?.parse().ok()?;
                    Some(v * unit_um(sample.attribute(format!("Position{axis}Unit").as_str()))?)
                };
                let xy = position("X").zip(position("Y"));
                out.insert(image.to_string(), (well_name.clone(), number, xy));
            }
        }
    }
    out
}

/// µm per one of an OME length unit (µm when none is given).
fn unit_um(unit: Option<&str>) -> Option<f64> {
    match unit {
        None => Some(1.0),
        Some(u) => hcsflow_zarr::micrometres_per(match u {
            "µm" | "um" => "micrometer",
            "nm" => "nanometer",
            "mm" => "millimeter",
            "m" => "meter",
            "Å" => "angstrom",
            other => other,
        }),
    }
}

/// An `Image` element of the document in `file` (whose folder resolves
/// `UUID@FileName`; `pages` is its page count, for TiffData without an IFD).
fn parse_image(node: roxmltree::Node, file: &Path, folder: &Path, pages: u32) -> Result<OmeImage, String> {
    let id = node.attribute("ID").unwrap_or("Image").to_string();
    let pixels = node.children().find(|n| n.has_tag_name("Pixels")).ok_or(format!("image {id} has no Pixels"))?;
    let size = |key: &str| -> Result<u32, String> {
        pixels
            .attribute(key)
            .and_then(|v| v.trim().parse().ok())
            .filter(|v| *v > 0)
            .ok_or(format!("image {id}: Pixels {key} is missing or not a positive number"))
    };
    let (width, height) = (size("SizeX")?, size("SizeY")?);
    let sizes = [size("SizeZ")?, size("SizeC")?, size("SizeT")?];
    let dtype = match pixels.attribute("Type") {
        Some("uint8") => DType::U8,
        Some("uint16") => DType::U16,
        Some("float") => DType::F32,
        other => return Err(format!("image {id}: pixel type {other:?}; hcsflow reads uint8, uint16 and float images")),
    };
    let order = pixels.attribute("DimensionOrder").unwrap_or("XYZCT");
    // Fastest to slowest of z (0), c (1), t (2).
    let axes: Vec<usize> = order
        .chars()
        .skip(2)
        .map(|ch| match ch {
            'Z' => Ok(0),
            'C' => Ok(1),
            'T' => Ok(2),
            _ => Err(format!("image {id}: DimensionOrder '{order}' is not XY followed by Z, C and T")),
        })
        .collect::<Result<_, _>>()?;
    if axes.len() != 3 || axes.iter().collect::<BTreeSet<_>>().len() != 3 {
        return Err(format!("image {id}: DimensionOrder '{order}' is not XY followed by Z, C and T"));
    }
    let total = sizes.iter().product::<u32>();
    let plane_of = |linear: u32| -> [u32; 3] {
        let mut rest = linear;
        let mut zct = [0u32; 3];
        for &a in &axes {
            zct[a] = rest % sizes[a];
            rest /= sizes[a];
        }
        zct
    };
    let linear_of = |zct: [u32; 3]| -> u32 { axes.iter().rev().fold(0, |acc, &a| acc * sizes[a] + zct[a]) };
    let unit = pixels.attribute("PhysicalSizeXUnit");
    let pixel_size_um = pixels.attribute("PhysicalSizeX").and_then(|v| v.parse::<f64>().ok()).zip(unit_um(unit)).map(|(v, u)| v * u);
    let channel_names =
        pixels.children().filter(|n| n.has_tag_name("Channel")).map(|c| c.attribute("Name").unwrap_or_default().to_string()).collect();
    let mut planes = BTreeMap::new();
    for td in pixels.children().filter(|n| n.has_tag_name("TiffData")) {
        let attr = |key: &str| td.attribute(key).and_then(|v| v.trim().parse::<u32>().ok());
        let ifd = attr("IFD");
        let count = attr("PlaneCount").unwrap_or(if ifd.is_some() { 1 } else { pages.min(total) });
        let start = linear_of([attr("FirstZ").unwrap_or(0), attr("FirstC").unwrap_or(0), attr("FirstT").unwrap_or(0)]);
        let target = match td.children().find(|n| n.has_tag_name("UUID")).and_then(|u| u.attribute("FileName")) {
            Some(name) if !name.contains("..") && !Path::new(name).is_absolute() => folder.join(name),
            Some(name) => return Err(format!("image {id}: TiffData names '{name}', which leaves the folder; not opened")),
            None => file.to_path_buf(),
        };
        for k in 0..count {
            if start + k >= total {
                break;
            }
            let [z, c, t] = plane_of(start + k);
            planes.insert((z, c, t), (target.clone(), ifd.unwrap_or(0) + k));
        }
    }
    Ok(OmeImage { id, height, width, dtype, sizes, pixel_size_um, channel_names, planes })
}
