//! The plate model of hcsflow and the microscope handlers that build it.
//!
//! A [`Plate`] is what a microscope folder means: a list of images, each with
//! its components (well, site, channel, z, timepoint — all 1-based except the
//! well name), plus plate metadata (plate size, acquired wells, site grid,
//! pixel size, stage positions, channel names, image size and dtype).
//!
//! Handlers: ImageXpress/MetaXpress (`.HTD`, [`imagexpress`]), Opera
//! Phenix/Operetta (Harmony index XML, [`phenix`]), OME-Zarr HCS plates
//! ([`ome_zarr`]), OME-TIFF ([`ome_tiff`]) and hcsflow's own TIFF outputs
//! ([`run_output`]). [`detect`] picks one from
//! the metadata files present; [`open_plate`] accepts an explicit override.
//! Each format module also writes what it reads (names, descriptor, image
//! metadata), for the synthetic plates of `hcsflow-synth`; [`naming`] holds the
//! names of pipeline outputs that follow from a plate's layout.
//!
//! Contract shared by every handler:
//! - **Read-only.** Opening a plate never writes, renames or touches a file in
//!   it (tests compare the file tree and mtimes before and after).
//! - **Numeric order.** Images are sorted by well (row, then column), then
//!   site, channel, z, timepoint, as numbers: `w2` before `w10`, `B01` before `AA01`.
//! - **Problems are reported, not hidden.** Expected images that are absent
//!   (no file, empty URL) go to [`Plate::missing`]. File names we cannot
//!   interpret, thumbnails we skipped on purpose aside, go to
//!   [`Plate::warnings`]: real plate folders contain stray TIFFs (exports,
//!   overlays), so they must not make a plate unreadable. What makes a plate
//!   unreadable — no descriptor, a descriptor that is not one, malformed XML,
//!   not a single image, counts the files on disk cannot back
//!   ([`imagexpress::MAX_EXPECTED_FLOOR`]) — is a [`PlateError`] naming the file.
//! - **Only regular files are opened** (or symbolic links resolving to one,
//!   wherever they point: plates are often folders of links into a share).
//!   A FIFO, socket, device or folder named like an image is a warning and
//!   its plane is missing ([`not_a_regular_file`]); a FIFO would block forever.
//! - **Only what is inside the plate is named.** An index `<URL>` that is
//!   absolute, has a scheme, or leaves the plate through `..` is never opened:
//!   the image is missing, with a warning saying why.
//! - **Hidden files are never images.** Names starting with `.` (macOS
//!   `._name.tif` AppleDouble companions) are skipped with one summary
//!   warning; among duplicate images, the one whose prefix is the
//!   descriptor's name wins.
//! - [`verify()`] reads every image header (not only one per site) for
//!   `hcsflow inspect --verify`, and finds the planes MetaXpress wrote as
//!   copies of another plane's file.

use std::collections::BTreeMap;
use std::fmt;
use std::path::{Path, PathBuf};
use std::str::FromStr;

use hcsflow_core::DType;
use serde::{Deserialize, Serialize};

mod grid;
mod image;
pub mod imagexpress;
pub mod naming;
pub mod ome_tiff;
pub mod ome_zarr;
pub mod phenix;
pub mod run_output;
mod summary;
pub mod verify;
pub mod well;
mod xml;

pub use image::{image_format, read_image, ImageError};
pub use summary::summary_text;
pub use verify::{verify, DuplicatePlane, FileProblem, PlaneShape, ProblemKind, VerifyReport};
pub use well::{cmp_wells, parse_well, well_name};

/// A microscope plate format hcsflow reads.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(rename_all = "kebab-case")]
pub enum Format {
    /// Molecular Devices ImageXpress / MetaXpress: `.HTD` plus TIFFs.
    #[serde(rename = "imagexpress")]
    ImageXpress,
    /// Revvity (PerkinElmer) Opera Phenix / Operetta: Harmony index XML plus TIFFs.
    OperaPhenix,
    /// A step's TIFF output of an `hcsflow run`, described by its
    /// `hcsflow-plate.json` ([`run_output`]).
    Hcsflow,
    /// An OME-Zarr HCS plate, NGFF 0.4 or 0.5 ([`ome_zarr`]).
    OmeZarr,
    /// OME-TIFF files with OME-XML metadata ([`ome_tiff`]).
    OmeTiff,
}

impl Format {
    /// The name used on the command line and in JSON.
    pub fn name(self) -> &'static str {
        match self {
            Format::ImageXpress => "imagexpress",
            Format::OperaPhenix => "opera-phenix",
            Format::Hcsflow => "hcsflow",
            Format::OmeZarr => "ome-zarr",
            Format::OmeTiff => "ome-tiff",
        }
    }
}

impl fmt::Display for Format {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.name())
    }
}

/// Error for a format name that is not one we read.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("unknown plate format '{0}': expected 'imagexpress', 'opera-phenix', 'hcsflow', 'ome-zarr' or 'ome-tiff'")]
pub struct UnknownFormat(pub String);

impl FromStr for Format {
    type Err = UnknownFormat;
    fn from_str(s: &str) -> Result<Self, Self::Err> {
        match s.to_ascii_lowercase().replace('_', "-").as_str() {
            "imagexpress" | "ixm" | "metaxpress" => Ok(Format::ImageXpress),
            "opera-phenix" | "operaphenix" | "phenix" | "operetta" | "harmony" => Ok(Format::OperaPhenix),
            "hcsflow" | "hcsflow-output" => Ok(Format::Hcsflow),
            "ome-zarr" | "omezarr" | "zarr" | "ngff" => Ok(Format::OmeZarr),
            "ome-tiff" | "ometiff" | "ome-tif" => Ok(Format::OmeTiff),
            _ => Err(UnknownFormat(s.to_string())),
        }
    }
}

/// Where an image's plane is inside its container, for plates whose files
/// hold more than one plane.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(tag = "kind", rename_all = "kebab-case")]
pub enum PlaneAt {
    /// The `y × x` plane at `index` (one index per array dimension; y and x
    /// are 0) of the Zarr array in the folder [`ImageRecord::path`].
    Zarr { index: Vec<u64> },
    /// Page `page` (0-based IFD) of the multi-page TIFF [`ImageRecord::path`].
    TiffPage { page: u32 },
}

/// One image (one plane) of the plate and its components.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct ImageRecord {
    /// Well name, `A01` .. `AF48` (Opera `r01c01` becomes `A01`).
    pub well: String,
    /// 1-based site (field) number in raster order of the site grid.
    pub site: u32,
    /// 1-based channel (ImageXpress wave, Phenix ChannelID).
    pub channel: u32,
    /// 1-based z plane.
    pub z_index: u32,
    /// 1-based time point.
    pub timepoint: u32,
    /// Absolute path of the file (of the array folder, for a Zarr plane).
    pub path: PathBuf,
    /// Where the plane is in `path`, when that holds several planes;
    /// `None`: `path` is a one-plane image file.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub at: Option<PlaneAt>,
}

impl ImageRecord {
    /// The numeric sort key: (well row, well column, site, channel, z, t).
    pub fn sort_key(&self) -> (u32, u32, u32, u32, u32, u32) {
        let (r, c) = parse_well(&self.well).unwrap_or((u32::MAX, u32::MAX));
        (r, c, self.site, self.channel, self.z_index, self.timepoint)
    }
}

/// An image the plate's metadata promises but whose pixels are not there.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct MissingImage {
    pub well: String,
    pub site: u32,
    pub channel: u32,
    pub z_index: u32,
    pub timepoint: u32,
    /// Where the file was expected, when the metadata names one.
    pub path: Option<PathBuf>,
    /// Why it is missing (e.g. "empty URL in index", "file not found").
    pub reason: String,
}

/// Stage position of one site of one well, in µm.
///
/// Oriented like the image: `x_um` grows with image columns and `y_um` with
/// image rows, so the offset between two tiles in pixels is their difference
/// divided by the pixel size. (Phenix stage Y grows upward; the handler flips it.)
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct StagePosition {
    pub well: String,
    pub site: u32,
    pub x_um: f64,
    pub y_um: f64,
}

/// Where a site sits in the site grid (0-based row and column).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
pub struct SiteCell {
    pub site: u32,
    pub row: u32,
    pub col: u32,
}

/// Plate-level metadata. `None` means the plate does not say (or the
/// image header it comes from could not be read; a warning says which).
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
pub struct PlateMetadata {
    /// Plate name (HTD file stem, Harmony plate Name).
    pub name: String,
    /// Free-text description (HTD `Description`, decoded leniently).
    pub description: Option<String>,
    pub plate_rows: u32,
    pub plate_columns: u32,
    /// Wells the acquisition selected, numeric order.
    pub acquired_wells: Vec<String>,
    /// Site grid rows and columns.
    pub grid_rows: u32,
    pub grid_cols: u32,
    /// Grid cell of every site number (raster order over the acquired cells).
    pub site_cells: Vec<SiteCell>,
    /// Phenix only: FieldID → site number we expose (raster order by stage position).
    pub field_to_site: BTreeMap<u32, u32>,
    pub pixel_size_um: Option<f64>,
    /// Per (well, site), numeric order.
    pub stage_positions: Vec<StagePosition>,
    /// Channel number → name.
    pub channel_names: BTreeMap<u32, String>,
    pub bit_depth: Option<u32>,
    pub image_width: Option<u32>,
    pub image_height: Option<u32>,
    pub dtype: Option<DType>,
    /// Number of sites, channels, z planes and time points the metadata declares.
    pub sites: u32,
    pub channels: u32,
    pub z_planes: u32,
    pub timepoints: u32,
}

impl PlateMetadata {
    /// Channel number (1-based, in list order) → name, for a container's
    /// channel labels; empty labels name nothing.
    pub(crate) fn numbered_names(labels: &[String]) -> BTreeMap<u32, String> {
        labels.iter().enumerate().filter(|(_, l)| !l.is_empty()).map(|(c, l)| (c as u32 + 1, l.clone())).collect()
    }

    /// The stage position of `site` in `well`, in µm (image-oriented).
    pub fn stage_position(&self, well: &str, site: u32) -> Option<(f64, f64)> {
        self.stage_positions.iter().find(|p| p.well == well && p.site == site).map(|p| (p.x_um, p.y_um))
    }

    /// The grid cell (0-based row, col) of `site`.
    pub fn site_cell(&self, site: u32) -> Option<(u32, u32)> {
        self.site_cells.iter().find(|c| c.site == site).map(|c| (c.row, c.col))
    }
}

/// A plate folder as hcsflow understands it.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Plate {
    pub format: Format,
    /// The plate folder.
    pub root: PathBuf,
    /// The descriptor file read (HTD or index XML).
    pub descriptor: PathBuf,
    pub metadata: PlateMetadata,
    /// Every image, numeric order.
    pub images: Vec<ImageRecord>,
    /// ImageXpress z-projections stored beside `ZStep_<z>/` folders; `z_index` is 0.
    pub projections: Vec<ImageRecord>,
    /// Expected images that are absent, numeric order.
    pub missing: Vec<MissingImage>,
    /// Everything odd that did not stop reading.
    pub warnings: Vec<String>,
}

impl Plate {
    /// Wells that have at least one image, numeric order.
    pub fn wells(&self) -> Vec<String> {
        let mut w: Vec<String> = self.images.iter().map(|i| i.well.clone()).collect();
        w.dedup();
        w.sort_by(|a, b| cmp_wells(a, b));
        w.dedup();
        w
    }

    /// Channels with an image or a projection, in number order (a wave
    /// acquired only as a projection is a channel of the plate too).
    pub fn channels(&self) -> Vec<u32> {
        let set: std::collections::BTreeSet<u32> = self.images.iter().chain(&self.projections).map(|i| i.channel).collect();
        set.into_iter().collect()
    }

    /// The image with these components, if present.
    pub fn image(&self, well: &str, site: u32, channel: u32, z: u32, t: u32) -> Option<&ImageRecord> {
        self.images.iter().find(|i| i.well == well && i.site == site && i.channel == channel && i.z_index == z && i.timepoint == t)
    }
}

/// Why a plate could not be read. Every variant about a file names it.
#[derive(Debug, thiserror::Error)]
pub enum PlateError {
    #[error("{path}: no such file or folder")]
    NotFound { path: PathBuf },
    #[error("{path}: {source}")]
    Io { path: PathBuf, source: std::io::Error },
    #[error("{path}: no plate found (no .HTD file, no Index.idx.xml / Index.ref.xml / Index.xml here or in Images/, no MetaXpress acquisition folder <date>/<id>/ with images here or below, no OME-Zarr plate here or directly inside, no .ome.tif files)")]
    NoPlateFound { path: PathBuf },
    /// A MetaXpress plate folder (`<plate>/<YYYY-MM-DD>/<id>/`) holding
    /// several acquisitions: which one is meant is the user's choice.
    #[error("{path}: {} MetaXpress acquisition folders below ({}); point at one of them", .folders.len(), path_list(.folders))]
    SeveralAcquisitions { path: PathBuf, folders: Vec<PathBuf> },
    #[error("{path}: looks like both an ImageXpress and an Opera Phenix plate ({found}); pass the format explicitly")]
    AmbiguousFormat { path: PathBuf, found: String },
    #[error("{path}: several plate descriptors ({files}); point at one of them")]
    MultipleDescriptors { path: PathBuf, files: String },
    #[error("{path}, line {line}: not a valid HTD file: {message}")]
    Htd { path: PathBuf, line: usize, message: String },
    #[error("{path}: malformed index XML: {message}")]
    Xml { path: PathBuf, message: String },
    #[error("{path}: index XML is not a Harmony plate index: {message}")]
    IndexContent { path: PathBuf, message: String },
    /// An hcsflow output plate's descriptor ([`run_output::DESCRIPTOR_NAME`]) that cannot be used.
    #[error("{path}: not a valid hcsflow output plate descriptor: {message}")]
    Descriptor { path: PathBuf, message: String },
    #[error("{path}: mixed image names: {prefixed} has a plate prefix but {bare} starts with the well; all images of a plate must be named one way (rename or move the odd ones)")]
    MixedNaming { path: PathBuf, prefixed: PathBuf, bare: PathBuf },
    #[error("{path}: no images of the plate found ({detail})")]
    NoImages { path: PathBuf, detail: String },
    /// A descriptor count that the files on disk cannot back: reading on
    /// would enumerate (and list as missing) billions of planes. See
    /// [`imagexpress::MAX_EXPECTED_FLOOR`] for the rule.
    #[error("{path}: {key} {value} but the plate folder has {files} image file(s); {detail}; a corrupt HTD?")]
    ImplausibleCount { path: PathBuf, key: String, value: u64, files: usize, detail: String },
    /// An OME-TIFF file whose OME-XML cannot be read, or describes images
    /// hcsflow cannot read.
    #[error("{path}: OME-TIFF: {message}")]
    OmeXml { path: PathBuf, message: String },
    /// An OME-Zarr plate whose metadata cannot be read as NGFF says.
    #[error("{path}: not a readable OME-Zarr plate: {source}")]
    Zarr { path: PathBuf, source: Box<hcsflow_zarr::ZarrError> },
    /// The descriptor is not a regular file (a FIFO, a device, a folder…).
    #[error("{path}: {reason}; not opened")]
    NotRegularFile { path: PathBuf, reason: String },
}

/// `a, b, c` of the paths as displayed.
fn path_list(paths: &[PathBuf]) -> String {
    paths.iter().map(|p| p.display().to_string()).collect::<Vec<_>>().join(", ")
}

pub(crate) fn io_err(path: &Path) -> impl FnOnce(std::io::Error) -> PlateError + '_ {
    move |source| PlateError::Io { path: path.to_path_buf(), source }
}

/// What a folder entry is, from its directory entry (symlinks not followed).
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord)]
pub(crate) enum EntryKind {
    Dir,
    File,
    /// A symbolic link, not followed (it may name a file, a folder, nothing, or itself).
    Symlink,
    /// A FIFO, socket or device.
    Other,
}

/// Lists a folder's entries (file names and kinds), sorted; errors name the folder.
pub(crate) fn list_dir(dir: &Path) -> Result<Vec<(String, EntryKind)>, PlateError> {
    let mut out = Vec::new();
    for entry in std::fs::read_dir(dir).map_err(io_err(dir))? {
        let entry = entry.map_err(io_err(dir))?;
        let t = entry.file_type().map_err(io_err(dir))?;
        let kind = if t.is_dir() {
            EntryKind::Dir
        } else if t.is_file() {
            EntryKind::File
        } else if t.is_symlink() {
            EntryKind::Symlink
        } else {
            EntryKind::Other
        };
        out.push((entry.file_name().to_string_lossy().into_owned(), kind));
    }
    out.sort();
    Ok(out)
}

/// Why `path` cannot be an image or descriptor file, or `None` when it is a
/// regular file or a symbolic link that resolves to one.
///
/// Only such files are ever opened by the plate readers: opening a FIFO
/// blocks until a writer appears, a device can be endless, and a folder is
/// not an image. Symbolic links are followed (plates are often built from
/// links into an acquisition share, possibly outside the plate folder); what
/// the link resolves to must be a regular file. The reason reads as a
/// predicate: "is a FIFO (named pipe), not a regular file".
pub fn not_a_regular_file(path: &Path) -> Option<String> {
    match std::fs::metadata(path) {
        Ok(m) if m.is_file() => None,
        Ok(m) => Some(format!("is {}, not a regular file", hcsflow_tiff::file_kind(&m.file_type()))),
        Err(e) if std::fs::symlink_metadata(path).is_ok() => Some(format!("is a symbolic link that cannot be followed ({e})")),
        Err(e) => Some(format!("cannot be read ({e})")),
    }
}

/// `NotFound` when `path` does not exist; any other reason it cannot be
/// reached (a symlink loop, a permission) as that reason, not as "no such file".
fn require_exists(path: &Path) -> Result<(), PlateError> {
    match std::fs::metadata(path) {
        Ok(_) => Ok(()),
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => Err(PlateError::NotFound { path: path.to_path_buf() }),
        Err(source) => Err(PlateError::Io { path: path.to_path_buf(), source }),
    }
}

/// Which format the folder (or descriptor file) `path` holds.
///
/// An `hcsflow run` output (a step folder with `hcsflow-plate.json`, that
/// file, or the run's output folder: [`run_output::find_descriptor`]) is
/// [`Format::Hcsflow`]. A `.HTD`/`.htd` file, or a folder containing one, is ImageXpress; an
/// `Index.idx.xml`, `Index.ref.xml` or `Index.xml`, or a folder with one of
/// them (or with one in `Images/`), is Opera Phenix. A folder with both is
/// [`PlateError::AmbiguousFormat`]: guessing would silently read the wrong one.
/// A folder with neither is ImageXpress when it is a MetaXpress database
/// acquisition, or a plate or date folder above exactly one
/// ([`imagexpress::database_acquisition`]; several are
/// [`PlateError::SeveralAcquisitions`]). An OME-Zarr HCS plate (its root
/// folder, or the one such folder inside `path`, as in a run's output folder)
/// is [`Format::OmeZarr`]; a `.ome.tif(f)` file, or a folder of them with
/// none of the above, [`Format::OmeTiff`].
pub fn detect(path: &Path) -> Result<Format, PlateError> {
    require_exists(path)?;
    if run_output::find_descriptor(path)?.is_some() {
        return Ok(Format::Hcsflow);
    }
    if hcsflow_zarr::is_plate(path) {
        return Ok(Format::OmeZarr);
    }
    if path.is_file() {
        let name = path.file_name().map(|n| n.to_string_lossy().into_owned()).unwrap_or_default();
        if name.to_ascii_lowercase().ends_with(".htd") {
            return Ok(Format::ImageXpress);
        }
        if phenix::INDEX_NAMES.iter().any(|n| n.eq_ignore_ascii_case(&name)) {
            return Ok(Format::OperaPhenix);
        }
        if ome_tiff::is_ome_tiff_name(&name) {
            return Ok(Format::OmeTiff);
        }
        return Err(PlateError::NoPlateFound { path: path.to_path_buf() });
    }
    let htd = !imagexpress::find_htd_files(path)?.is_empty();
    let idx = phenix::find_index(path)?.is_some();
    match (htd, idx) {
        (true, false) => Ok(Format::ImageXpress),
        (false, true) => Ok(Format::OperaPhenix),
        (true, true) => Err(PlateError::AmbiguousFormat { path: path.to_path_buf(), found: "an .HTD file and a Harmony index".into() }),
        (false, false) if imagexpress::database_acquisition(path)?.is_some() => Ok(Format::ImageXpress),
        (false, false) if ome_zarr::find_plate(path)?.is_some() => Ok(Format::OmeZarr),
        (false, false) if !ome_tiff::find_files(path)?.is_empty() => Ok(Format::OmeTiff),
        (false, false) => Err(PlateError::NoPlateFound { path: path.to_path_buf() }),
    }
}

/// Opens the plate at `path` (its folder, or its descriptor file), with the
/// format detected unless `format` overrides it. Never writes into the plate.
pub fn open_plate(path: &Path, format: Option<Format>) -> Result<Plate, PlateError> {
    require_exists(path)?;
    let format = match format {
        Some(f) => f,
        None => detect(path)?,
    };
    let mut plate = match format {
        Format::ImageXpress => imagexpress::open(path)?,
        Format::OperaPhenix => phenix::open(path)?,
        Format::OmeZarr => ome_zarr::open(path)?,
        Format::OmeTiff => ome_tiff::open(path)?,
        Format::Hcsflow => match run_output::find_descriptor(path)? {
            Some(descriptor) => run_output::open(&descriptor)?,
            None => {
                return Err(PlateError::NoImages {
                    path: path.to_path_buf(),
                    detail: format!("not an hcsflow output plate (no {})", run_output::DESCRIPTOR_NAME),
                })
            }
        },
    };
    plate.images.sort_by_key(|i| i.sort_key());
    plate.projections.sort_by_key(|i| i.sort_key());
    plate.missing.sort_by_key(|m| {
        let (r, c) = parse_well(&m.well).unwrap_or((u32::MAX, u32::MAX));
        (r, c, m.site, m.channel, m.z_index, m.timepoint)
    });
    plate.metadata.stage_positions.sort_by_key(|p| {
        let (r, c) = parse_well(&p.well).unwrap_or((u32::MAX, u32::MAX));
        (r, c, p.site)
    });
    plate.metadata.acquired_wells.sort_by(|a, b| cmp_wells(a, b));
    plate.metadata.acquired_wells.dedup();
    Ok(plate)
}

/// MetaSeries `<prop id=… value=…/>` pairs of an ImageDescription, in order.
/// Returns an empty list for descriptions that are not MetaSeries XML.
pub fn metaseries_props(description: &str) -> Vec<(String, String)> {
    let Ok(doc) = roxmltree::Document::parse(description.trim_start_matches('\u{feff}')) else {
        return Vec::new();
    };
    doc.descendants()
        .filter(|n| n.has_tag_name("prop"))
        .filter_map(|n| Some((n.attribute("id")?.to_string(), n.attribute("value")?.to_string())))
        .collect()
}
