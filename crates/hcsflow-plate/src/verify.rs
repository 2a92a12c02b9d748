//! `hcsflow inspect --verify`: every image header of a plate, checked.
//!
//! Opening a plate reads one TIFF header per (well, site) for metadata, so a
//! zero-byte, truncated or foreign file elsewhere is found only when a run
//! reaches it. [`verify`] reads the header of every image (and projection) in
//! parallel — tags only, no pixels — and reports each file that would fail or
//! mislead a run, plus images that disagree among themselves about the plane
//! size and dtype.
//!
//! What is checked per file: it is a regular file; it is not empty; it is a
//! TIFF hcsflow reads (u8/u16/f32 grayscale) whose IFD chain is intact; it has
//! one page; for uncompressed files, the file is long enough for the pixels
//! its header declares; its plane size and dtype are the plate's. Damage
//! inside compressed pixel data is not found (that needs decoding every
//! plane: a run finds it and fails that well).
//!
//! The plate's plane size and dtype are those of the majority of readable
//! images (ties: the one of the earliest image in plate order). When the
//! plate's metadata says something else — it is taken from the first image
//! header read (ImageXpress) or from the index (Opera Phenix) — the report
//! says so in [`VerifyReport::plate_problems`].
//!
//! Duplicated planes: MetaXpress fills the planes of a wave it did not
//! acquire (z steps of a one-plane wave, time points it skipped) with
//! byte-for-byte copies of the last acquired image. Those files are sound,
//! but their pixels are not a measurement of their plane, so they are listed
//! in [`VerifyReport::duplicates`] (not as problems). Cost is bounded by the
//! headers already read: only images of the same well, site and channel whose
//! ImageDescription is identical and not empty (a real MetaSeries
//! description carries the acquisition time and z position) and whose file
//! lengths are equal are candidates; each candidate is read once to hash it,
//! and a matching hash is confirmed by comparing the two files byte for byte.

use std::collections::BTreeMap;
use std::fmt;
use std::hash::Hasher;
use std::io::Read;
use std::path::{Path, PathBuf};

use hcsflow_core::DType;
use hcsflow_tiff::TiffError;
use rayon::prelude::*;
use serde::Serialize;

use crate::{not_a_regular_file, ImageRecord, Plate};

/// Width, height and dtype of one plane.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
pub struct PlaneShape {
    pub width: usize,
    pub height: usize,
    pub dtype: DType,
}

impl fmt::Display for PlaneShape {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{} x {} {}", self.width, self.height, self.dtype)
    }
}

/// What is wrong with one image file.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
#[serde(rename_all = "kebab-case", tag = "kind")]
pub enum ProblemKind {
    /// A FIFO, socket, device, folder or broken link named like an image (not opened).
    NotRegularFile,
    /// Zero bytes.
    Empty,
    /// Starts like a TIFF but its structure is broken, or it is shorter than its pixels.
    Truncated,
    /// Not a TIFF at all (garbage, another image format).
    NotTiff,
    /// A TIFF hcsflow does not read (RGB, 32-bit integer, …).
    Unsupported,
    /// The file could not be read (permissions, I/O error).
    Unreadable,
    /// More than one page: it would add planes to its stack.
    MultiPage { pages: usize },
    /// Plane size or dtype differs from the plate's.
    Mismatch { found: PlaneShape, expected: PlaneShape },
}

/// One image file with a problem.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct FileProblem {
    pub path: PathBuf,
    #[serde(flatten)]
    pub kind: ProblemKind,
    /// One line naming the file and the problem.
    pub message: String,
}

/// An image whose file has the same bytes as the file of an earlier plane
/// of the same well, site and channel: a copy MetaXpress wrote for a plane it
/// did not acquire (see the module documentation).
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct DuplicatePlane {
    /// The copy.
    pub path: PathBuf,
    pub well: String,
    pub site: u32,
    pub channel: u32,
    /// The copy's z plane; 0 for a projection.
    pub z_index: u32,
    pub timepoint: u32,
    /// The file it copies: the first plane with these bytes in acquisition
    /// order (time point, then z, a projection before the planes). Which of
    /// them the microscope acquired the bytes cannot tell.
    pub copy_of: PathBuf,
    /// One line naming both files and the planes.
    pub message: String,
}

/// What [`verify`] found.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct VerifyReport {
    /// Image files checked (images and projections).
    pub checked: usize,
    /// The plane size and dtype of the majority of readable images, if any.
    pub plane: Option<PlaneShape>,
    /// How many readable images have that plane.
    pub plane_count: usize,
    /// What the plate's metadata says the plane is, when it says.
    pub metadata_plane: Option<PlaneShape>,
    /// Files with problems, in plate order; then files named like an
    /// expected image that are not regular files (they are also in
    /// [`Plate::missing`]).
    pub problems: Vec<FileProblem>,
    /// How many images the plate declares but does not have
    /// ([`Plate::missing`], listed by the plate summary).
    pub missing: usize,
    /// Problems of the plate as a whole (e.g. its metadata plane is not the
    /// images' majority plane).
    pub plate_problems: Vec<String>,
    /// Images whose file is a byte-for-byte copy of another plane's, in plate
    /// order (images, then projections). Not problems: [`Self::is_clean`]
    /// does not count them.
    pub duplicates: Vec<DuplicatePlane>,
}

impl VerifyReport {
    /// True when no file and nothing plate-wide has a problem, and no
    /// declared image is missing.
    pub fn is_clean(&self) -> bool {
        self.problems.is_empty() && self.plate_problems.is_empty() && self.missing == 0
    }
}

/// Reads the header of every image and projection of `plate` in parallel
/// and reports each file's problems (see the module documentation). Never
/// decodes pixels, never opens a file that is not a regular file, never
/// writes. The order of [`VerifyReport::problems`] is the plate's image order.
pub fn verify(plate: &Plate) -> VerifyReport {
    let records: Vec<&ImageRecord> = plate.images.iter().chain(&plate.projections).collect();
    let paths: Vec<&Path> = records.iter().map(|i| i.path.as_path()).collect();
    let results: Vec<Result<Header, FileProblem>> = records.par_iter().map(|r| check_image(r)).collect();
    let duplicates = duplicated_planes(&records, &results);

    // The majority plane; ties go to the plane seen first in plate order.
    let mut counts: Vec<(PlaneShape, usize)> = Vec::new();
    for Header { shape, .. } in results.iter().flatten() {
        match counts.iter_mut().find(|(s, _)| s == shape) {
            Some((_, n)) => *n += 1,
            None => counts.push((*shape, 1)),
        }
    }
    let majority = counts.iter().fold(None::<(PlaneShape, usize)>, |best, &(s, n)| match best {
        Some((_, m)) if m >= n => best,
        _ => Some((s, n)),
    });

    let mut problems = Vec::new();
    for (path, r) in paths.iter().zip(results) {
        match r {
            Err(p) => problems.push(p),
            Ok(Header { shape, pages, .. }) => {
                if pages > 1 {
                    problems.push(FileProblem {
                        path: path.to_path_buf(),
                        kind: ProblemKind::MultiPage { pages },
                        message: format!("{}: {pages} pages; an image of the plate is one plane (one page)", path.display()),
                    });
                }
                if let Some((expected, n)) = majority.filter(|(m, _)| *m != shape) {
                    problems.push(FileProblem {
                        path: path.to_path_buf(),
                        kind: ProblemKind::Mismatch { found: shape, expected },
                        message: format!(
                            "{}: plane is {shape} but the plate's is {expected} ({n} of {} images)",
                            path.display(),
                            paths.len()
                        ),
                    });
                }
            }
        }
    }

    for (path, why) in plate.missing.iter().filter_map(|m| Some((m.path.as_deref()?, not_a_regular_file(m.path.as_deref()?)?))) {
        problems.push(FileProblem {
            path: path.to_path_buf(),
            kind: ProblemKind::NotRegularFile,
            message: format!("{} {why}; not opened", path.display()),
        });
    }

    let m = &plate.metadata;
    let metadata_plane = match (m.image_width, m.image_height, m.dtype) {
        (Some(w), Some(h), Some(dtype)) => Some(PlaneShape { width: w as usize, height: h as usize, dtype }),
        _ => None,
    };
    let mut plate_problems = Vec::new();
    if let (Some(meta), Some((maj, n))) = (metadata_plane, majority) {
        if meta != maj {
            let source = match plate.format {
                crate::Format::ImageXpress => "taken from the first image header read".to_string(),
                crate::Format::OperaPhenix | crate::Format::Hcsflow | crate::Format::OmeZarr | crate::Format::OmeTiff => {
                    format!("from {}", plate.descriptor.display())
                }
            };
            let odd = problems.iter().filter(|p| matches!(p.kind, ProblemKind::Mismatch { .. })).count();
            plate_problems.push(format!(
                "the plate's plane size {meta} ({source}) is not the images' majority {maj} ({n} of {} images); \
                 {odd} image(s) differ from the majority (listed above)",
                paths.len()
            ));
        }
    }
    VerifyReport {
        checked: paths.len(),
        plane: majority.map(|(s, _)| s),
        plane_count: majority.map_or(0, |(_, n)| n),
        metadata_plane,
        problems,
        missing: plate.missing.len(),
        plate_problems,
        duplicates,
    }
}

/// What [`check_file`] reads of a sound file.
struct Header {
    shape: PlaneShape,
    pages: usize,
    /// The ImageDescription of page 0, if any.
    description: Option<String>,
    /// File length in bytes.
    len: u64,
}

/// The images (`records`, with their `headers` in the same order) whose file
/// is a copy of an earlier plane's: candidates are grouped by well, site,
/// channel, non-empty ImageDescription and length; within a group, in
/// acquisition order, a file whose hash and then bytes equal an earlier
/// one's is a copy of it. Files that cannot be read again are left out.
fn duplicated_planes(records: &[&ImageRecord], headers: &[Result<Header, FileProblem>]) -> Vec<DuplicatePlane> {
    let mut groups: BTreeMap<(&str, u32, u32, &str, u64), Vec<usize>> = BTreeMap::new();
    for (i, (r, h)) in records.iter().zip(headers).enumerate() {
        let Ok(Header { description: Some(d), len, .. }) = h else { continue };
        if !d.trim().is_empty() {
            groups.entry((r.well.as_str(), r.site, r.channel, d.as_str(), *len)).or_default().push(i);
        }
    }
    let groups: Vec<Vec<usize>> = groups.into_values().filter(|g| g.len() > 1).collect();
    let mut copies: Vec<(usize, usize)> = groups.par_iter().flat_map_iter(|g| copies_in_group(records, g)).collect();
    copies.sort_unstable();
    copies
        .into_iter()
        .map(|(i, of)| {
            let (r, o) = (records[i], records[of]);
            DuplicatePlane {
                path: r.path.clone(),
                well: r.well.clone(),
                site: r.site,
                channel: r.channel,
                z_index: r.z_index,
                timepoint: r.timepoint,
                copy_of: o.path.clone(),
                message: format!(
                    "{}: the same bytes as {} (well {} site {} channel {}: z {} t {} is a copy of z {} t {}; z 0 is the projection)",
                    r.path.display(),
                    o.path.display(),
                    r.well,
                    r.site,
                    r.channel,
                    r.z_index,
                    r.timepoint,
                    o.z_index,
                    o.timepoint
                ),
            }
        })
        .collect()
}

/// (copy, original) index pairs among the candidate images `group` (indices
/// into `records`), taken in acquisition order (time point, then z).
fn copies_in_group(records: &[&ImageRecord], group: &[usize]) -> Vec<(usize, usize)> {
    let mut order = group.to_vec();
    order.sort_by_key(|&i| (records[i].timepoint, records[i].z_index, i));
    let mut originals: Vec<(u64, usize)> = Vec::new();
    let mut copies = Vec::new();
    for i in order {
        let Ok(hash) = file_hash(&records[i].path) else { continue };
        let same = originals.iter().find(|(h, o)| *h == hash && same_bytes(&records[*o].path, &records[i].path).unwrap_or(false));
        match same {
            Some(&(_, o)) => copies.push((i, o)),
            None => originals.push((hash, i)),
        }
    }
    copies
}

/// A hash of the file's bytes (not cryptographic: equal hashes are confirmed by [`same_bytes`]).
fn file_hash(path: &Path) -> std::io::Result<u64> {
    let mut file = std::fs::File::open(path)?;
    let mut hasher = std::collections::hash_map::DefaultHasher::new();
    let mut buf = vec![0u8; 1 << 16];
    loop {
        let n = file.read(&mut buf)?;
        if n == 0 {
            return Ok(hasher.finish());
        }
        hasher.write(&buf[..n]);
    }
}

/// Whether two files hold the same bytes (read in chunks, stopping at the first difference).
fn same_bytes(a: &Path, b: &Path) -> std::io::Result<bool> {
    let (mut fa, mut fb) = (std::fs::File::open(a)?, std::fs::File::open(b)?);
    let (mut ba, mut bb) = (vec![0u8; 1 << 16], vec![0u8; 1 << 16]);
    loop {
        let na = read_full(&mut fa, &mut ba)?;
        let nb = read_full(&mut fb, &mut bb)?;
        if na != nb || ba[..na] != bb[..nb] {
            return Ok(false);
        }
        if na == 0 {
            return Ok(true);
        }
    }
}

/// Reads until `buf` is full or the file ends; returns the bytes read.
fn read_full(file: &mut std::fs::File, buf: &mut [u8]) -> std::io::Result<usize> {
    let mut n = 0;
    while n < buf.len() {
        match file.read(&mut buf[n..])? {
            0 => break,
            k => n += k,
        }
    }
    Ok(n)
}

/// The header of one image, or its problem: a file's ([`check_file`]), or
/// for a plane of an OME-Zarr array the array's metadata (its chunks are not
/// decoded; a chunk never written reads as the fill value, which Zarr allows).
fn check_image(image: &ImageRecord) -> Result<Header, FileProblem> {
    if image.at.is_none() {
        return check_file(&image.path);
    }
    let (height, width, dtype, pages) = crate::image_format(image).map_err(|e| FileProblem {
        path: image.path.clone(),
        kind: ProblemKind::Unreadable,
        message: e.to_string(),
    })?;
    Ok(Header { shape: PlaneShape { width, height, dtype }, pages, description: None, len: 0 })
}

/// The header of one file, or its problem.
fn check_file(path: &Path) -> Result<Header, FileProblem> {
    let problem = |kind: ProblemKind, message: String| FileProblem { path: path.to_path_buf(), kind, message };
    if let Some(why) = not_a_regular_file(path) {
        return Err(problem(ProblemKind::NotRegularFile, format!("{} {why}; not opened", path.display())));
    }
    let len = std::fs::metadata(path).map(|m| m.len()).unwrap_or(0);
    let info = hcsflow_tiff::read_info(path).map_err(|e| {
        let kind = match &e {
            TiffError::Empty { .. } => ProblemKind::Empty,
            TiffError::NotTiff { .. } => ProblemKind::NotTiff,
            TiffError::Corrupt { .. } => ProblemKind::Truncated,
            TiffError::Unsupported { .. } => ProblemKind::Unsupported,
            _ => ProblemKind::Unreadable,
        };
        problem(kind, e.to_string())
    })?;
    let shape = PlaneShape { width: info.width, height: info.height, dtype: info.dtype };
    if info.compression == "none" {
        let need = info.width as u128 * info.height as u128 * info.dtype.size_bytes() as u128 * info.pages as u128;
        if u128::from(len) < need {
            return Err(problem(
                ProblemKind::Truncated,
                format!(
                    "{}: truncated: {len} bytes, but its {} uncompressed page(s) of {shape} need {need} bytes of pixels",
                    path.display(),
                    info.pages
                ),
            ));
        }
    }
    Ok(Header { shape, pages: info.pages, description: info.description, len })
}
