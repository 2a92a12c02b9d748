//! Opening an ImageXpress plate: descriptor, folder variants, file names,
//! missing planes and header metadata.

use std::collections::{BTreeMap, BTreeSet};
use std::path::{Path, PathBuf};

use rayon::prelude::*;

use super::htd::{parse_htd, HtdInfo};
use super::names::{numbered, numbered_from_zero, parse_image_name, ImageName, TIMEPOINT_FOLDER, ZSTEP_FOLDER};
use crate::grid::{one_row, place_sites};
use crate::well::{parse_well, smallest_plate};
use crate::{
    io_err, list_dir, metaseries_props, not_a_regular_file, EntryKind, Format, ImageRecord, MissingImage, Plate, PlateError, PlateMetadata,
    SiteCell, StagePosition,
};

/// `.HTD`/`.htd` files directly in `dir`, sorted. Hidden names (starting
/// with `.`, e.g. macOS `._Plate.HTD` AppleDouble companions) are not descriptors.
pub fn find_htd_files(dir: &Path) -> Result<Vec<PathBuf>, PlateError> {
    Ok(list_dir(dir)?
        .into_iter()
        .filter(|(n, kind)| *kind != EntryKind::Dir && !n.starts_with('.') && n.to_ascii_lowercase().ends_with(".htd"))
        .map(|(n, _)| dir.join(n))
        .collect())
}

struct Found {
    name: ImageName,
    path: PathBuf,
    t: u32,
    /// `None` for a projection beside ZStep folders.
    z: Option<u32>,
}

/// What a folder says about the z plane of the images in it.
#[derive(Clone, Copy)]
enum FolderZ {
    /// No `ZStep_<z>/` folders here: plane 1 unless the name has `_z<Z>`.
    Flat,
    /// Inside `ZStep_<z>/`: that plane (a disagreeing `_z<Z>` is reported).
    Step(u32),
    /// Beside `ZStep_<z>/` folders, or in `ZStep_0/` (where MetaXpress
    /// exports put it): a projection, unless the name has `_z<Z>`.
    BesideSteps,
}

/// (well, site, channel, z, timepoint) of one plane.
type PlaneKey = (String, u32, u32, u32, u32);

/// The rule for HTD counts: **the planes an HTD expects (selected wells ×
/// sites × channels × z steps × time points) may be at most
/// max(`MAX_EXPECTED_FLOOR`, [`MAX_EXPECTED_PER_FILE`] × the image files
/// found on disk)**, otherwise [`PlateError::ImplausibleCount`]. Checked
/// before any plane, site or channel is enumerated.
pub const MAX_EXPECTED_FLOOR: u64 = 100_000;
/// Expected planes an HTD may declare per image file found on disk (see [`MAX_EXPECTED_FLOOR`]).
pub const MAX_EXPECTED_PER_FILE: u64 = 100;

/// The plausibility rule for the HTD's counts, checked before any plane is
/// enumerated: **the planes the HTD expects (selected wells × sites ×
/// channels × z steps × time points) may be at most
/// max([`MAX_EXPECTED_FLOOR`], [`MAX_EXPECTED_PER_FILE`] × the image files
/// found on disk)**. A plate that has lost most of its files (an aborted
/// acquisition) still opens, with its absent planes listed as missing; a
/// count corrupted into the billions (`"ZSteps", 2147483648`) is refused with
/// [`PlateError::ImplausibleCount`], naming the key that is furthest above
/// what the file names show, instead of listing billions of missing planes.
fn check_counts(htd: &HtdInfo, htd_path: &Path, found: &[Found], other_files: usize) -> Result<(), PlateError> {
    let files = found.len() + other_files;
    let wells = match htd.selected_wells() {
        Some(w) => w.len() as u64,
        None => found.iter().map(|f| f.name.well.as_str()).collect::<BTreeSet<_>>().len() as u64,
    };
    let dims: [(String, u64, &str, u64); 5] = [
        (
            if htd.wells_selection.is_some() { "WellsSelection (selected wells)".into() } else { "wells".into() },
            wells,
            "well",
            found.iter().map(|f| f.name.well.as_str()).collect::<BTreeSet<_>>().len() as u64,
        ),
        (
            if htd.site_selection.is_some() { "SiteSelection (selected sites)".into() } else { "XSites × YSites".into() },
            htd.site_count(),
            "site",
            found.iter().filter_map(|f| f.name.site).max().unwrap_or(1).into(),
        ),
        ("NWavelengths".into(), htd.channel_count(), "channel", found.iter().filter_map(|f| f.name.wave).max().unwrap_or(1).into()),
        ("ZSteps".into(), htd.z_steps.into(), "z step", found.iter().filter_map(|f| f.z).max().unwrap_or(1).into()),
        ("TimePoints".into(), htd.timepoints.into(), "time point", found.iter().map(|f| f.t).max().unwrap_or(1).into()),
    ];
    let expected: u128 = dims.iter().map(|d| u128::from(d.1)).product();
    let limit = MAX_EXPECTED_FLOOR.max(MAX_EXPECTED_PER_FILE.saturating_mul(files as u64));
    if expected <= u128::from(limit) {
        return Ok(());
    }
    // Name the count furthest above what the file names show.
    let worst = dims
        .iter()
        .max_by(|a, b| (u128::from(a.1) * u128::from(b.3.max(1))).cmp(&(u128::from(b.1) * u128::from(a.3.max(1)))))
        .unwrap_or(&dims[0]);
    let product =
        dims.iter().map(|(_, v, unit, _)| format!("{v} {unit}{}", if *v == 1 { "" } else { "s" })).collect::<Vec<_>>().join(" × ");
    Err(PlateError::ImplausibleCount {
        path: htd_path.to_path_buf(),
        key: worst.0.clone(),
        value: worst.1,
        files,
        detail: format!(
            "the HTD expects {product} = {expected} planes, more than {limit} (the limit is {MAX_EXPECTED_PER_FILE} × the image files found, at least {MAX_EXPECTED_FLOOR}); the file names go up to {} {}",
            worst.2,
            worst.3
        ),
    })
}

/// True if `dir` is a MetaXpress database-layout acquisition folder
/// (`<plate>/<date>/<acquisition id>/`, no HTD): it holds ImageXpress image
/// names, or `TimePoint_<t>/` / `ZStep_<z>/` folders that do.
pub fn is_database_acquisition(dir: &Path) -> Result<bool, PlateError> {
    let holds_images = |entries: &[(String, EntryKind)]| {
        entries.iter().any(|(n, k)| *k != EntryKind::Dir && parse_image_name(n).is_some_and(|i| !i.thumb))
    };
    let entries = list_dir(dir)?;
    if holds_images(&entries) {
        return Ok(true);
    }
    for (n, k) in &entries {
        let numbered_folder = numbered(n, TIMEPOINT_FOLDER).is_some() || numbered_from_zero(n, ZSTEP_FOLDER).is_some();
        if *k == EntryKind::Dir && numbered_folder && holds_images(&list_dir(&dir.join(n))?) {
            return Ok(true);
        }
    }
    Ok(false)
}

/// Whether `name` is a MetaXpress database date folder name, `YYYY-MM-DD`.
fn is_date_folder(name: &str) -> bool {
    let b = name.as_bytes();
    b.len() == 10 && b.iter().enumerate().all(|(i, c)| if i == 4 || i == 7 { *c == b'-' } else { c.is_ascii_digit() })
}

/// The folders directly in `dir` (not symbolic links), full paths, sorted.
fn sub_folders(dir: &Path) -> Result<Vec<PathBuf>, PlateError> {
    Ok(list_dir(dir)?.into_iter().filter(|(_, k)| *k == EntryKind::Dir).map(|(n, _)| dir.join(n)).collect())
}

/// The MetaXpress database acquisition folder that `path` stands for:
/// `path` itself when it is one ([`is_database_acquisition`]); otherwise the
/// one acquisition below it when `path` is a plate folder
/// (`<plate>/<YYYY-MM-DD>/<id>/`: the acquisitions in its date-named folders)
/// or a date folder (`<YYYY-MM-DD>/<id>/`). `Ok(None)` when there is none;
/// [`PlateError::SeveralAcquisitions`], listing them, when there are several.
/// Lists at most the folders two levels down (and their `TimePoint_`/`ZStep_` folders).
pub fn database_acquisition(path: &Path) -> Result<Option<PathBuf>, PlateError> {
    if !path.is_dir() {
        return Ok(None);
    }
    if is_database_acquisition(path)? {
        return Ok(Some(path.to_path_buf()));
    }
    let named_date = path.file_name().is_some_and(|n| is_date_folder(&n.to_string_lossy()));
    let date_folders = if named_date {
        vec![path.to_path_buf()]
    } else {
        sub_folders(path)?.into_iter().filter(|d| d.file_name().is_some_and(|n| is_date_folder(&n.to_string_lossy()))).collect()
    };
    let mut found = Vec::new();
    for date in date_folders {
        for id in sub_folders(&date)? {
            if is_database_acquisition(&id)? {
                found.push(id);
            }
        }
    }
    match found.len() {
        0 => Ok(None),
        1 => Ok(found.pop()),
        _ => Err(PlateError::SeveralAcquisitions { path: path.to_path_buf(), folders: found }),
    }
}

/// Opens an ImageXpress plate (folder or `.HTD` file), or a MetaXpress
/// database acquisition, which has no HTD: its folder, or the plate or date
/// folder above it when that holds only this one ([`database_acquisition`]).
pub fn open(path: &Path) -> Result<Plate, PlateError> {
    let (root, htd_path) = match find_descriptor(path) {
        Err(PlateError::NoPlateFound { .. }) if path.is_dir() => {
            let acquisition = database_acquisition(path)?.ok_or_else(|| PlateError::NoPlateFound { path: path.to_path_buf() })?;
            let mut plate = open_database(&acquisition)?;
            if acquisition != path {
                plate.warnings.insert(
                    0,
                    format!("{}: opened {}, the only MetaXpress acquisition folder below it", path.display(), acquisition.display()),
                );
            }
            return Ok(plate);
        }
        other => other?,
    };
    let htd = read_htd(&htd_path)?;
    let mut warnings = Vec::new();
    for l in &htd.skipped_lines {
        warnings.push(format!("{}: skipped malformed record at {l}", htd_path.display()));
    }
    if !htd.has_end {
        warnings.push(format!("{}: no \"EndFile\" record (file may be truncated)", htd_path.display()));
    }
    let mut scan = scan_folders(&root, &mut warnings)?;
    scan.report(&mut warnings);
    check_counts(&htd, &htd_path, &scan.found, scan.not_regular.len())?;
    let htd_stem = htd_path.file_stem().map(|s| s.to_string_lossy().into_owned()).unwrap_or_default();
    check_naming(&mut scan.found, &htd_stem, &root, &mut warnings)?;

    let cells = htd.site_cells();
    let channels = htd.channels();
    let Classified { mut images, projections, seen } = classify(&htd, cells.len() as u32, channels.len(), &scan.found, &mut warnings);
    if images.is_empty() {
        return Err(PlateError::NoImages {
            path: root.clone(),
            detail: format!("{} candidate TIFF(s) parsed; none usable", scan.found.len()),
        });
    }
    images.sort_by_key(|i| i.sort_key());

    let wells: Vec<String> = match htd.selected_wells() {
        Some(w) => w,
        None => {
            let mut w: Vec<String> = images.iter().map(|i| i.well.clone()).collect();
            w.dedup();
            w
        }
    };
    let expected = Expected { wells: &wells, cells: &cells, channels: &channels, z_steps: htd.z_steps, timepoints: htd.timepoints };
    let missing = missing_images(&expected, &seen, &scan.not_regular);
    let well_set: BTreeSet<&String> = wells.iter().collect();
    let extra: BTreeSet<&String> = images.iter().map(|i| &i.well).filter(|w| !well_set.contains(w)).collect();
    if !extra.is_empty() {
        warnings.push(format!("images found for wells not selected in the HTD: {extra:?}"));
    }

    let mut metadata = PlateMetadata {
        name: htd_stem,
        description: htd.description.clone(),
        plate_rows: htd.y_wells,
        plate_columns: htd.x_wells,
        acquired_wells: wells.clone(),
        grid_rows: htd.y_sites,
        grid_cols: htd.x_sites,
        site_cells: cells.clone(),
        channel_names: htd.wave_names.clone(),
        sites: cells.len() as u32,
        channels: channels.len() as u32,
        z_planes: htd.z_steps,
        timepoints: htd.timepoints,
        ..PlateMetadata::default()
    };
    header_metadata(&images, &mut metadata, &mut warnings);
    Ok(Plate { format: Format::ImageXpress, root, descriptor: htd_path, metadata, images, projections, missing, warnings })
}

/// Opens a MetaXpress database acquisition folder: without an HTD, the
/// plate is what its names and folders say. Wells, sites, waves, z planes
/// and time points are those found; a wave's planes are expected only at the
/// z planes some image of that wave has (a wave acquired as one plane in
/// `ZStep_1`, or only as a projection, is not "missing" its other planes),
/// so a hole is reported only where other wells, sites or time points have
/// the plane; the sites are the site numbers found (a site no file has is
/// not expected). Plate size is the smallest standard plate holding the
/// wells; the site grid comes from the MetaSeries stage positions
/// ([`place_sites`]); channel names are the MetaSeries `image-name` of each wave.
fn open_database(root: &Path) -> Result<Plate, PlateError> {
    let root = root.to_path_buf();
    let mut warnings = vec![format!(
        "{}: no .HTD; read as a MetaXpress database acquisition folder (wells, sites, waves, z and time points from the files)",
        root.display()
    )];
    let mut scan = scan_folders(&root, &mut warnings)?;
    scan.report(&mut warnings);
    let htd = htd_of_files(&scan.found);
    let prefix = scan.found.iter().find_map(|f| f.name.prefix.clone()).unwrap_or_default();
    check_naming(&mut scan.found, &prefix, &root, &mut warnings)?;
    let site_numbers: Vec<u32> = scan.found.iter().map(|f| f.name.site.unwrap_or(1)).collect::<BTreeSet<u32>>().into_iter().collect();
    let cells = one_row(&site_numbers);
    let channels = htd.channels();
    let Classified { mut images, projections, seen } = classify(&htd, htd.x_sites, channels.len(), &scan.found, &mut warnings);
    if images.is_empty() && projections.is_empty() {
        return Err(PlateError::NoImages {
            path: root.clone(),
            detail: format!("{} candidate TIFF(s) parsed; none usable", scan.found.len()),
        });
    }
    images.sort_by_key(|i| i.sort_key());
    let mut wells: Vec<String> = images.iter().chain(&projections).map(|i| i.well.clone()).collect();
    wells.sort_by(|a, b| crate::well::cmp_wells(a, b));
    wells.dedup();
    let expected = Expected { wells: &wells, cells: &cells, channels: &channels, z_steps: htd.z_steps, timepoints: htd.timepoints };
    let planes_of: BTreeSet<(u32, u32)> = images.iter().map(|i| (i.channel, i.z_index)).collect();
    let mut missing = missing_images(&expected, &seen, &scan.not_regular);
    missing.retain(|m| planes_of.contains(&(m.channel, m.z_index)));
    wave_planes_note(&images, &projections, &channels, &mut warnings);
    let mut metadata = PlateMetadata {
        name: prefix,
        plate_rows: htd.y_wells,
        plate_columns: htd.x_wells,
        acquired_wells: wells,
        grid_rows: 1,
        grid_cols: cells.len() as u32,
        site_cells: cells.clone(),
        sites: cells.len() as u32,
        channels: channels.len() as u32,
        z_planes: htd.z_steps,
        timepoints: htd.timepoints,
        ..PlateMetadata::default()
    };
    let all: Vec<ImageRecord> = images.iter().chain(&projections).cloned().collect();
    header_metadata(&all, &mut metadata, &mut warnings);
    place_sites(&mut metadata, &site_numbers, &mut warnings, "a MetaSeries stage-position-x/y");
    metadata.channel_names = wave_names(&all);
    Ok(Plate { format: Format::ImageXpress, root: root.clone(), descriptor: root, metadata, images, projections, missing, warnings })
}

/// The HTD a database acquisition would have had, from its files.
fn htd_of_files(found: &[Found]) -> HtdInfo {
    let max = |f: &dyn Fn(&Found) -> u32| found.iter().map(f).max().unwrap_or(1).max(1);
    let (rows, cols) = {
        let wells: Vec<(u32, u32)> = found.iter().filter_map(|f| parse_well(&f.name.well)).collect();
        let (r, c) = wells.iter().fold((0, 0), |(r, c), (wr, wc)| (r.max(*wr), c.max(*wc)));
        smallest_plate(r, c)
    };
    let sites = max(&|f| f.name.site.unwrap_or(1));
    let waves = max(&|f| f.name.wave.unwrap_or(1));
    HtdInfo {
        timepoints: max(&|f| f.t),
        z_series: found.iter().any(|f| f.z.unwrap_or(1) > 1),
        z_steps: max(&|f| f.z.unwrap_or(1)),
        z_projection: found.iter().any(|f| f.z.is_none()),
        x_wells: cols,
        y_wells: rows,
        sites: sites > 1,
        x_sites: sites,
        y_sites: 1,
        waves: waves > 1,
        n_wavelengths: waves,
        has_end: true,
        ..HtdInfo::default()
    }
}

/// A warning when waves differ in their planes (MetaXpress acquires some
/// waves as one plane, or only as a projection).
fn wave_planes_note(images: &[ImageRecord], projections: &[ImageRecord], channels: &[u32], warnings: &mut Vec<String>) {
    let planes = |c: u32| images.iter().filter(|i| i.channel == c).map(|i| i.z_index).collect::<BTreeSet<u32>>();
    let all: Vec<(u32, BTreeSet<u32>)> = channels.iter().map(|&c| (c, planes(c))).collect();
    if all.windows(2).all(|w| w[0].1 == w[1].1) {
        return;
    }
    let parts: Vec<String> = all
        .iter()
        .map(|(c, z)| match (z.len(), projections.iter().any(|p| p.channel == *c)) {
            (0, true) => format!("wave {c}: a projection only"),
            (0, false) => format!("wave {c}: no image"),
            (n, p) => format!("wave {c}: {n} plane(s){}", if p { " and a projection" } else { "" }),
        })
        .collect();
    warnings.push(format!("the waves differ in their planes: {}", parts.join("; ")));
}

/// Wave number → MetaSeries `image-name` of its first image (in the TIFF's
/// ImageDescription), where one says.
fn wave_names(images: &[ImageRecord]) -> BTreeMap<u32, String> {
    let mut first: BTreeMap<u32, &ImageRecord> = BTreeMap::new();
    for i in images {
        first.entry(i.channel).or_insert(i);
    }
    first
        .into_par_iter()
        .filter_map(|(c, img)| {
            let description = hcsflow_tiff::read_info(&img.path).ok()?.description?;
            let name = metaseries_props(&description).into_iter().find(|(k, _)| k == "image-name")?.1;
            (!name.trim().is_empty()).then(|| (c, name.trim().to_string()))
        })
        .collect()
}

/// The plate folder and its `.HTD` for `path` (a folder holding exactly one, or the file itself).
fn find_descriptor(path: &Path) -> Result<(PathBuf, PathBuf), PlateError> {
    if path.is_file() {
        let root = path.parent().map(Path::to_path_buf).unwrap_or_else(|| PathBuf::from("."));
        return Ok((root, path.to_path_buf()));
    }
    let htds = find_htd_files(path)?;
    match htds.len() {
        0 => Err(PlateError::NoPlateFound { path: path.to_path_buf() }),
        1 => Ok((path.to_path_buf(), htds[0].clone())),
        _ => {
            let files = htds.iter().map(|p| p.display().to_string()).collect::<Vec<_>>().join(", ");
            Err(PlateError::MultipleDescriptors { path: path.to_path_buf(), files })
        }
    }
}

/// Reads and parses the `.HTD` (a regular file only).
fn read_htd(htd_path: &Path) -> Result<HtdInfo, PlateError> {
    if let Some(reason) = not_a_regular_file(htd_path) {
        return Err(PlateError::NotRegularFile { path: htd_path.to_path_buf(), reason });
    }
    let bytes = std::fs::read(htd_path).map_err(io_err(htd_path))?;
    parse_htd(&bytes, htd_path)
}

/// The TIFF-named files of every folder variant, sorted by what they are.
#[derive(Default)]
struct FolderScan {
    /// Image names, regular files (or links to one).
    found: Vec<Found>,
    /// TIFF names that are not image names.
    unknown: Vec<PathBuf>,
    /// Names starting with `.`.
    hidden: Vec<PathBuf>,
    /// Image names that are not regular files, with why.
    not_regular: Vec<(Found, String)>,
}

/// Collects the candidate files of the plate folder, its `TimePoint_<t>/`
/// folders and their `ZStep_<z>/` folders.
fn scan_folders(root: &Path, warnings: &mut Vec<String>) -> Result<FolderScan, PlateError> {
    let mut scan = FolderScan::default();
    // The plate folder is time point 1 with its own `ZStep_<z>/` folders in
    // a MetaXpress database acquisition without time points.
    let root_entries = scan.scan_time_point(root, 1, warnings)?;
    for (n, kind) in &root_entries {
        let Some(t) = numbered(n, TIMEPOINT_FOLDER).filter(|_| *kind == EntryKind::Dir) else {
            continue;
        };
        scan.scan_time_point(&root.join(n), t, warnings)?;
    }
    Ok(scan)
}

impl FolderScan {
    /// Scans the images of time point `t` in `dir` and in its `ZStep_<z>/`
    /// folders (images beside those are projections, as are those in
    /// `ZStep_0/`, where MetaXpress exports put them); returns the entries of `dir`.
    fn scan_time_point(&mut self, dir: &Path, t: u32, warnings: &mut Vec<String>) -> Result<Vec<(String, EntryKind)>, PlateError> {
        let entries = list_dir(dir)?;
        let zdirs: Vec<(u32, PathBuf)> = entries
            .iter()
            .filter(|(_, k)| *k == EntryKind::Dir)
            .filter_map(|(zn, _)| numbered_from_zero(zn, ZSTEP_FOLDER).map(|z| (z, dir.join(zn))))
            .collect();
        let here_z = if zdirs.iter().any(|(z, _)| *z > 0) { FolderZ::BesideSteps } else { FolderZ::Flat };
        self.scan_dir(dir, t, here_z, warnings)?;
        for (z, zdir) in zdirs {
            let folder_z = if z == 0 { FolderZ::BesideSteps } else { FolderZ::Step(z) };
            self.scan_dir(&zdir, t, folder_z, warnings)?;
        }
        Ok(entries)
    }

    /// Sorts the TIFF-named entries of `dir` (time point `t`, planes as
    /// `folder_z` says) into the scan; returns every entry of `dir`.
    fn scan_dir(
        &mut self,
        dir: &Path,
        t: u32,
        folder_z: FolderZ,
        warnings: &mut Vec<String>,
    ) -> Result<Vec<(String, EntryKind)>, PlateError> {
        let entries = list_dir(dir)?;
        for (n, kind) in &entries {
            // Folders named like an image are reported below, like FIFOs.
            let lower = n.to_ascii_lowercase();
            if !(lower.ends_with(".tif") || lower.ends_with(".tiff")) {
                continue;
            }
            // Hidden files are never images: macOS writes `._<name>`
            // AppleDouble companions next to every file it copies to SMB or
            // exFAT, and they parse as a second plate prefix.
            if n.starts_with('.') {
                self.hidden.push(dir.join(n));
                continue;
            }
            match parse_image_name(n) {
                Some(name) if name.thumb => {}
                Some(name) => {
                    let t = name.timepoint.unwrap_or(t);
                    let path = dir.join(n);
                    let z = match (folder_z, name.z) {
                        (FolderZ::Step(fz), Some(nz)) if nz != fz => {
                            warnings.push(format!("{}: _z{nz} in the name but the folder is ZStep_{fz}; plane {fz} used", path.display()));
                            Some(fz)
                        }
                        (FolderZ::Step(fz), _) => Some(fz),
                        (_, Some(nz)) => Some(nz),
                        (FolderZ::Flat, None) => Some(1),
                        (FolderZ::BesideSteps, None) => None,
                    };
                    // Only regular files (or links to them) are images: a
                    // FIFO would block the first read forever.
                    let problem = match kind {
                        EntryKind::File => None,
                        _ => not_a_regular_file(&path),
                    };
                    match problem {
                        None => self.found.push(Found { name, path, t, z }),
                        Some(why) => self.not_regular.push((Found { name, path, t, z }, why)),
                    }
                }
                None => self.unknown.push(dir.join(n)),
            }
        }
        Ok(entries)
    }

    /// The warnings for the files that are not images: unknown names, hidden
    /// files (one summary line each) and non-regular files (one line each).
    fn report(&self, warnings: &mut Vec<String>) {
        if !self.unknown.is_empty() {
            let shown: Vec<String> = self.unknown.iter().take(10).map(|p| p.display().to_string()).collect();
            warnings.push(format!(
                "{} TIFF file(s) with names that are not ImageXpress image names were ignored: {}{}",
                self.unknown.len(),
                shown.join(", "),
                if self.unknown.len() > 10 { ", …" } else { "" }
            ));
        }
        if !self.hidden.is_empty() {
            let shown: Vec<String> = self.hidden.iter().take(3).map(|p| p.display().to_string()).collect();
            warnings.push(format!(
                "{} hidden TIFF-named file(s) (name starting with '.', e.g. macOS '._' AppleDouble companions) were ignored: {}{}",
                self.hidden.len(),
                shown.join(", "),
                if self.hidden.len() > 3 { ", …" } else { "" }
            ));
        }
        for (f, why) in &self.not_regular {
            warnings.push(format!("{} {why}; not opened, the plane counts as missing", f.path.display()));
        }
    }
}

/// Puts the files whose prefix is the HTD's name (`htd_stem`) first, so that
/// among duplicates the acquisition's own image wins (stable: otherwise folder
/// order), and refuses a mix of prefixed and prefix-less names.
fn check_naming(found: &mut [Found], htd_stem: &str, root: &Path, warnings: &mut Vec<String>) -> Result<(), PlateError> {
    found.sort_by_key(|f| !f.name.prefix.as_deref().is_some_and(|p| p.eq_ignore_ascii_case(htd_stem)));
    // Prefix-less names are accepted only when every image is named that way:
    // a mix means two naming schemes (or stray exports) in one folder, and
    // guessing which files belong to the acquisition would be silent.
    let prefixed = found.iter().find(|f| f.name.prefix.is_some());
    let bare = found.iter().find(|f| f.name.prefix.is_none());
    if let (Some(a), Some(b)) = (prefixed, bare) {
        return Err(PlateError::MixedNaming { path: root.to_path_buf(), prefixed: a.path.clone(), bare: b.path.clone() });
    }
    let prefixes: BTreeSet<&str> = found.iter().filter_map(|f| f.name.prefix.as_deref()).collect();
    if prefixes.len() > 1 {
        warnings.push(format!("images carry several plate prefixes: {prefixes:?}"));
    }
    Ok(())
}

/// The found files as images and projections.
struct Classified {
    images: Vec<ImageRecord>,
    projections: Vec<ImageRecord>,
    /// The plane of every image.
    seen: BTreeSet<PlaneKey>,
}

/// Gives every found file its site, channel, z and time point, warning about
/// components outside what the HTD declares; a file without a needed
/// component, or a duplicate (the first in `found` wins), is left out.
fn classify(htd: &HtdInfo, n_sites: u32, n_channels: usize, found: &[Found], warnings: &mut Vec<String>) -> Classified {
    let mut images = Vec::new();
    let mut projections = Vec::new();
    let mut seen = BTreeSet::new();
    for f in found {
        let fname = f.path.display();
        let channel = match f.name.wave {
            Some(w) => w,
            None if n_channels <= 1 && htd.n_wavelengths <= 1 => 1,
            None => {
                warnings.push(format!("{fname}: no _w<wave> in the name but the HTD declares {} wavelengths; ignored", htd.n_wavelengths));
                continue;
            }
        };
        if channel == 0 || channel > htd.n_wavelengths {
            warnings.push(format!("{fname}: wave {channel} is outside the HTD's {} wavelength(s)", htd.n_wavelengths));
        }
        let site = match f.name.site {
            Some(s) => s,
            None if n_sites <= 1 => 1,
            None => {
                warnings.push(format!("{fname}: no _s<site> in the name but the HTD selects {n_sites} sites; ignored"));
                continue;
            }
        };
        if site == 0 || site > n_sites {
            warnings.push(format!("{fname}: site {site} is outside the HTD's {n_sites} selected site(s)"));
        }
        if let Some((r, c)) = parse_well(&f.name.well) {
            if r > htd.y_wells || c > htd.x_wells {
                warnings.push(format!("{fname}: well {} is outside the {}x{} plate", f.name.well, htd.y_wells, htd.x_wells));
            }
        }
        if f.t > htd.timepoints {
            warnings.push(format!("{fname}: time point {} beyond the HTD's TimePoints {}", f.t, htd.timepoints));
        }
        let rec =
            |z: u32| ImageRecord { well: f.name.well.clone(), site, channel, z_index: z, timepoint: f.t, path: f.path.clone(), at: None };
        match f.z {
            None => {
                if !htd.z_projection {
                    warnings.push(format!(
                        "{fname}: image beside ZStep folders or in ZStep_0 but ZProjection is not TRUE; treated as a projection"
                    ));
                }
                projections.push(rec(0));
            }
            Some(z) => {
                if z > htd.z_steps {
                    warnings.push(format!("{fname}: z step {z} beyond the HTD's ZSteps {}", htd.z_steps));
                }
                if !seen.insert((f.name.well.clone(), site, channel, z, f.t)) {
                    warnings.push(format!(
                        "{fname}: duplicate image for well {} site {site} channel {channel} z {z} t {}; ignored",
                        f.name.well, f.t
                    ));
                    continue;
                }
                images.push(rec(z));
            }
        }
    }
    Classified { images, projections, seen }
}

/// The planes the HTD declares: wells × sites × channels × z steps × time points.
struct Expected<'a> {
    wells: &'a [String],
    cells: &'a [SiteCell],
    channels: &'a [u32],
    z_steps: u32,
    timepoints: u32,
}

/// The expected planes that have no image in `seen`; those named by a file
/// that is not a regular file (`not_regular`) say so and where.
fn missing_images(expected: &Expected, seen: &BTreeSet<PlaneKey>, not_regular: &[(Found, String)]) -> Vec<MissingImage> {
    let odd: BTreeMap<PlaneKey, (&PathBuf, &String)> = not_regular
        .iter()
        .filter_map(|(f, why)| Some(((f.name.well.clone(), f.name.site.unwrap_or(1), f.name.wave.unwrap_or(1), f.z?, f.t), (&f.path, why))))
        .collect();
    let mut missing = Vec::new();
    for well in expected.wells {
        for cell in expected.cells {
            for &ch in expected.channels {
                for z in 1..=expected.z_steps {
                    for t in 1..=expected.timepoints {
                        let key = (well.clone(), cell.site, ch, z, t);
                        if seen.contains(&key) {
                            continue;
                        }
                        let (path, reason) = match odd.get(&key) {
                            Some((p, why)) => (Some(p.to_path_buf()), format!("the file {why}")),
                            None => (None, "no image file found".to_string()),
                        };
                        missing.push(MissingImage {
                            well: well.clone(),
                            site: cell.site,
                            channel: ch,
                            z_index: z,
                            timepoint: t,
                            path,
                            reason,
                        });
                    }
                }
            }
        }
    }
    missing
}

/// Fills image size, dtype, pixel size and stage positions from the TIFF
/// headers, one image per (well, site) (the first of `images`, which are in
/// numeric order); warns about headers that cannot be read and metadata absent.
fn header_metadata(images: &[ImageRecord], metadata: &mut PlateMetadata, warnings: &mut Vec<String>) {
    let mut reps: BTreeMap<(String, u32), &ImageRecord> = BTreeMap::new();
    for img in images {
        reps.entry((img.well.clone(), img.site)).or_insert(img);
    }
    let reps: Vec<(&(String, u32), &&ImageRecord)> = reps.iter().collect();
    let infos: Vec<Result<(String, u32, hcsflow_tiff::TiffInfo), hcsflow_tiff::TiffError>> =
        reps.par_iter().map(|((w, s), img)| hcsflow_tiff::read_info(&img.path).map(|i| (w.clone(), *s, i))).collect();
    let mut failures = Vec::new();
    let mut no_position = 0usize;
    for r in infos {
        match r {
            Err(e) => failures.push(e.to_string()),
            Ok((well, site, info)) => {
                if metadata.image_width.is_none() {
                    metadata.image_width = Some(info.width as u32);
                    metadata.image_height = Some(info.height as u32);
                    metadata.dtype = Some(info.dtype);
                    metadata.bit_depth = Some(info.dtype.size_bytes() as u32 * 8);
                }
                let props = info.description.as_deref().map(metaseries_props).unwrap_or_default();
                let prop = |k: &str| props.iter().find(|(id, _)| id == k).and_then(|(_, v)| v.trim().parse::<f64>().ok());
                if metadata.pixel_size_um.is_none() {
                    metadata.pixel_size_um = prop("spatial-calibration-x").filter(|p| *p > 0.0);
                }
                match (prop("stage-position-x"), prop("stage-position-y")) {
                    (Some(x_um), Some(y_um)) => metadata.stage_positions.push(StagePosition { well, site, x_um, y_um }),
                    _ => no_position += 1,
                }
            }
        }
    }
    if !failures.is_empty() {
        warnings.push(format!(
            "could not read the TIFF header of {} image(s) (metadata incomplete): {}",
            failures.len(),
            failures.iter().take(3).cloned().collect::<Vec<_>>().join("; ")
        ));
    }
    if no_position > 0 {
        warnings.push(format!("{no_position} site(s) without MetaSeries stage-position-x/y in their TIFF"));
    }
    if metadata.pixel_size_um.is_none() {
        warnings.push("no pixel size (spatial-calibration-x) in the images' MetaSeries metadata".into());
    }
}
