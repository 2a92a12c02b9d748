//! Opening a Harmony plate: the index XML, fields placed into a site grid,
//! images and missing planes, plate metadata.

use std::collections::{BTreeMap, BTreeSet};
use std::path::{Path, PathBuf};

use hcsflow_core::DType;
use roxmltree::Node;

use super::names::{parse_phenix_name, INDEX_NAMES};
use crate::grid::{grid_cells, GridCells};
use crate::well::well_name;
use crate::{
    io_err, list_dir, not_a_regular_file, EntryKind, Format, ImageRecord, MissingImage, Plate, PlateError, PlateMetadata, SiteCell,
    StagePosition,
};

/// The index file of the plate folder `dir` (looked for in `dir`, then `dir/Images`).
pub fn find_index(dir: &Path) -> Result<Option<PathBuf>, PlateError> {
    for d in [dir.to_path_buf(), dir.join("Images")] {
        if !d.is_dir() {
            continue;
        }
        let entries = list_dir(&d)?;
        for want in INDEX_NAMES {
            if let Some((n, _)) = entries.iter().find(|(n, kind)| *kind != EntryKind::Dir && n.eq_ignore_ascii_case(want)) {
                return Ok(Some(d.join(n)));
            }
        }
    }
    Ok(None)
}

/// One `Image` element of the index.
#[derive(Debug, Clone)]
struct IndexEntry {
    id: String,
    url: String,
    row: u32,
    col: u32,
    field: u32,
    plane: u32,
    timepoint0: u32,
    channel: u32,
    channel_name: Option<String>,
    resolution_um: Option<f64>,
    size_x: Option<u32>,
    size_y: Option<u32>,
    pos_x_um: Option<f64>,
    pos_y_um: Option<f64>,
    max_intensity: Option<f64>,
    orientation: Option<String>,
}

fn child<'a, 'i>(n: Node<'a, 'i>, name: &str) -> Option<Node<'a, 'i>> {
    n.children().find(|c| c.is_element() && c.tag_name().name() == name)
}

fn text<'a>(n: Node<'a, '_>, name: &str) -> Option<&'a str> {
    child(n, name).and_then(|c| c.text()).map(str::trim)
}

/// A length in µm from an element with a `Unit` attribute (metres when absent).
fn length_um(n: Node, name: &str) -> Option<f64> {
    let c = child(n, name)?;
    let v: f64 = c.text()?.trim().parse().ok()?;
    let scale = match c.attribute("Unit").map(str::trim) {
        None | Some("m") => 1e6,
        Some("mm") => 1e3,
        Some("um") | Some("µm") | Some("micron") => 1.0,
        Some("nm") => 1e-3,
        Some(_) => return None,
    };
    Some(v * scale).filter(|x| x.is_finite())
}

/// Parses an OrientationMatrix `[[a,b,c,d],[e,f,g,h],[i,j,k,l]]` into rows.
pub fn parse_orientation(s: &str) -> Option<Vec<Vec<f64>>> {
    let inner = s.trim().strip_prefix('[')?.strip_suffix(']')?;
    let mut rows = Vec::new();
    for part in inner.split(']') {
        let part = part.trim().trim_start_matches(',').trim();
        if part.is_empty() {
            continue;
        }
        let nums = part.strip_prefix('[')?;
        let row: Option<Vec<f64>> = nums.split(',').map(|x| x.trim().parse().ok()).collect();
        rows.push(row?);
    }
    (rows.len() >= 2 && rows.iter().all(|r| r.len() >= 2)).then_some(rows)
}

fn parse_image(n: Node) -> Result<IndexEntry, String> {
    let id = text(n, "id").unwrap_or("").to_string();
    let num = |k: &str| -> Result<u32, String> {
        text(n, k).and_then(|t| t.parse().ok()).ok_or_else(|| format!("Image {id:?}: missing or invalid {k}"))
    };
    Ok(IndexEntry {
        url: text(n, "URL").unwrap_or("").to_string(),
        row: num("Row")?,
        col: num("Col")?,
        field: num("FieldID")?,
        plane: num("PlaneID")?,
        // Timepoints are numbered from 1 (`timepoint0 + 1`): the largest u32 has no successor.
        timepoint0: match text(n, "TimepointID") {
            None => 0,
            Some(_) => Some(num("TimepointID")?)
                .filter(|t| *t < u32::MAX)
                .ok_or_else(|| format!("Image {id:?}: TimepointID {} is out of range", u32::MAX))?,
        },
        channel: num("ChannelID")?,
        channel_name: text(n, "ChannelName").filter(|s| !s.is_empty()).map(str::to_string),
        resolution_um: length_um(n, "ImageResolutionX"),
        size_x: text(n, "ImageSizeX").and_then(|t| t.parse().ok()),
        size_y: text(n, "ImageSizeY").and_then(|t| t.parse().ok()),
        pos_x_um: length_um(n, "PositionX"),
        pos_y_um: length_um(n, "PositionY"),
        max_intensity: text(n, "MaxIntensity").and_then(|t| t.parse().ok()),
        orientation: text(n, "OrientationMatrix").map(str::to_string),
        id,
    })
}

/// Where an index `<URL>` names a file, or `None` when it points outside
/// the plate: a URL is opened only if it is a relative path (no scheme such
/// as `http://` or `file:`, no root, no drive) that stays inside `root` once
/// its `.` and `..` are applied lexically, starting from `base` (the index's
/// folder relative to `root`). What the metadata names is checked, not where
/// a symbolic link inside the plate resolves to: plates are often folders of
/// links into an acquisition share, and those are followed.
fn inside_plate(root: &Path, base: &Path, url: &str) -> Option<PathBuf> {
    use std::path::Component;
    // A scheme (`http:`, `file:`; RFC 3986: letters, digits, `+`, `-`, `.`
    // before a `:`), which also catches a Windows drive (`C:`); UNC paths next.
    if let Some((scheme, _)) = url.split_once(':') {
        if !scheme.is_empty() && scheme.chars().all(|c| c.is_ascii_alphanumeric() || "+-.".contains(c)) {
            return None;
        }
    }
    if url.starts_with('\\') || url.contains(":\\") {
        return None;
    }
    let mut parts: Vec<&std::ffi::OsStr> = base.iter().collect();
    for c in Path::new(url).components() {
        match c {
            Component::Normal(p) => parts.push(p),
            Component::CurDir => {}
            Component::ParentDir => {
                parts.pop()?;
            }
            Component::RootDir | Component::Prefix(_) => return None,
        }
    }
    if parts.is_empty() {
        return None;
    }
    Some(parts.iter().fold(root.to_path_buf(), |p, c| p.join(c)))
}

/// Opens a Harmony plate (folder, `Images/` folder or index file).
pub fn open(path: &Path) -> Result<Plate, PlateError> {
    let loc = locate(path)?;
    let index = &loc.index;
    if let Some(reason) = not_a_regular_file(index) {
        return Err(PlateError::NotRegularFile { path: index.clone(), reason });
    }
    let bytes = std::fs::read(index).map_err(io_err(index))?;
    let bytes = bytes.strip_prefix(b"\xEF\xBB\xBF").unwrap_or(&bytes);
    let xml = std::str::from_utf8(bytes).map_err(|e| PlateError::Xml { path: index.clone(), message: format!("not UTF-8: {e}") })?;
    let doc = roxmltree::Document::parse(xml).map_err(|e| PlateError::Xml { path: index.clone(), message: e.to_string() })?;
    let root_el = doc.root_element();
    let mut warnings = Vec::new();
    let entries = index_entries(root_el, index, &mut warnings)?;
    let (sx, sy) = axis_signs(&entries, index, &mut warnings);
    let grid = site_grid(&entries, sx, sy, &mut warnings);
    let found = resolve_images(&loc, &entries, &grid.field_to_site, (sx, sy), &mut warnings);
    if found.images.is_empty() {
        return Err(PlateError::NoImages {
            path: loc.root.clone(),
            detail: format!(
                "{} index entries, {} missing{}",
                entries.len(),
                found.missing.len(),
                found.missing.first().map(|m| format!(", the first because: {}", m.reason)).unwrap_or_default()
            ),
        });
    }
    let metadata = plate_metadata(root_el, &entries, grid, found.stage, found.channel_names);
    let Located { root, index, .. } = loc;
    Ok(Plate {
        format: Format::OperaPhenix,
        root,
        descriptor: index,
        metadata,
        images: found.images,
        projections: Vec::new(),
        missing: found.missing,
        warnings,
    })
}

/// Where a plate's index and folder are.
struct Located {
    index: PathBuf,
    /// The plate folder (the parent of `Images/` when the index is in it).
    root: PathBuf,
    /// Whether the index is in `Images/` (its URLs are relative to that folder).
    in_images: bool,
}

/// The index of the plate at `path` (a folder, its `Images/`, or the index itself).
fn locate(path: &Path) -> Result<Located, PlateError> {
    let index = if path.is_file() {
        path.to_path_buf()
    } else {
        find_index(path)?.ok_or_else(|| PlateError::NoPlateFound { path: path.to_path_buf() })?
    };
    let index_dir = index.parent().map(Path::to_path_buf).unwrap_or_else(|| PathBuf::from("."));
    let in_images = index_dir.file_name().is_some_and(|n| n.eq_ignore_ascii_case("Images"));
    let root = if in_images { index_dir.parent().map(Path::to_path_buf).unwrap_or(index_dir.clone()) } else { index_dir.clone() };
    Ok(Located { index, root, in_images })
}

/// The usable `<Image>` entries of the index document (others are warnings);
/// refuses a document without any.
fn index_entries(root_el: Node, index: &Path, warnings: &mut Vec<String>) -> Result<Vec<IndexEntry>, PlateError> {
    if !root_el.tag_name().namespace().unwrap_or("").contains("Harmony") {
        warnings.push(format!(
            "{}: root namespace {:?} is not a Harmony namespace; reading it anyway",
            index.display(),
            root_el.tag_name().namespace().unwrap_or("")
        ));
    }
    let content_err = |m: &str| PlateError::IndexContent { path: index.to_path_buf(), message: m.to_string() };
    let images_el = child(root_el, "Images").ok_or_else(|| content_err("no <Images> element"))?;
    let mut entries = Vec::new();
    for n in images_el.children().filter(|c| c.is_element() && c.tag_name().name() == "Image") {
        match parse_image(n) {
            Ok(img) => entries.push(img),
            Err(m) => warnings.push(format!("{}: {m}; image ignored", index.display())),
        }
    }
    if entries.is_empty() {
        return Err(content_err("no usable <Image> entries"));
    }
    // Harmony V5 numbers timepoints from 0; V6 and V7 from 1 (their file
    // names say `sk1` for TimepointID 1, V5's for TimepointID 0).
    let namespace = root_el.tag_name().namespace().unwrap_or("");
    if !namespace.contains("HarmonyV5") && entries.iter().all(|e| e.timepoint0 >= 1) {
        entries.iter_mut().for_each(|e| e.timepoint0 -= 1);
    }
    fill_from_maps(root_el, &mut entries);
    Ok(entries)
}

/// Per-channel metadata from the `Maps` block, for entries that lack it:
/// Harmony V7 keeps channel name, resolution, image size, intensity range
/// and orientation there (`Maps/Map/Entry ChannelID="c"`), not in `Image`.
fn fill_from_maps(root_el: Node, entries: &mut [IndexEntry]) {
    let Some(maps) = child(root_el, "Maps") else { return };
    let mut by_channel: BTreeMap<u32, Vec<Node>> = BTreeMap::new();
    for map in maps.children().filter(|c| c.is_element() && c.tag_name().name() == "Map") {
        for entry in map.children().filter(|c| c.is_element() && c.tag_name().name() == "Entry") {
            if let Some(channel) = entry.attribute("ChannelID").and_then(|c| c.parse().ok()) {
                by_channel.entry(channel).or_default().push(entry);
            }
        }
    }
    for e in entries.iter_mut() {
        let Some(nodes) = by_channel.get(&e.channel) else { continue };
        let first_text = |k: &str| nodes.iter().find_map(|n| text(*n, k).filter(|t| !t.is_empty()));
        e.channel_name = e.channel_name.take().or_else(|| first_text("ChannelName").map(str::to_string));
        e.resolution_um = e.resolution_um.or_else(|| nodes.iter().find_map(|n| length_um(*n, "ImageResolutionX")));
        e.size_x = e.size_x.or_else(|| first_text("ImageSizeX").and_then(|t| t.parse().ok()));
        e.size_y = e.size_y.or_else(|| first_text("ImageSizeY").and_then(|t| t.parse().ok()));
        e.max_intensity = e.max_intensity.or_else(|| first_text("MaxIntensity").and_then(|t| t.parse().ok()));
        e.orientation = e.orientation.take().or_else(|| first_text("OrientationMatrix").map(str::to_string));
    }
}

/// The signs that turn stage axes into image axes, from the first
/// OrientationMatrix (default: x as is, y flipped).
fn axis_signs(entries: &[IndexEntry], index: &Path, warnings: &mut Vec<String>) -> (f64, f64) {
    let (mut sx, mut sy) = (1.0f64, -1.0f64);
    if let Some(m) = entries.iter().find_map(|e| e.orientation.as_deref()) {
        match parse_orientation(m) {
            Some(rows) if rows[0][0] != 0.0 && rows[1][1] != 0.0 => {
                sx = rows[0][0].signum();
                sy = rows[1][1].signum();
            }
            _ => warnings.push(format!("{}: OrientationMatrix {m:?} not understood; assuming stage Y grows upward", index.display())),
        }
    }
    (sx, sy)
}

/// The fields placed into a raster site grid.
struct SiteGrid {
    /// FieldID → site number.
    field_to_site: BTreeMap<u32, u32>,
    site_cells: Vec<SiteCell>,
    rows: u32,
    cols: u32,
    /// Number of distinct fields.
    fields: u32,
}

/// Places every field by its mean stage position (image-oriented by the signs
/// `sx`, `sy`) into a raster grid and numbers the sites in reading order; when
/// a field has no position, sites follow FieldID order in one row.
fn site_grid(entries: &[IndexEntry], sx: f64, sy: f64, warnings: &mut Vec<String>) -> SiteGrid {
    let fields: BTreeSet<u32> = entries.iter().map(|e| e.field).collect();
    let mut sums: BTreeMap<u32, (f64, f64, u32)> = BTreeMap::new();
    for e in entries {
        if let (Some(x), Some(y)) = (e.pos_x_um, e.pos_y_um) {
            let s = sums.entry(e.field).or_insert((0.0, 0.0, 0));
            s.0 += sx * x;
            s.1 += sy * y;
            s.2 += 1;
        }
    }
    let mut field_to_site = BTreeMap::new();
    let mut site_cells = Vec::new();
    if sums.len() != fields.len() {
        warnings.push("some fields have no PositionX/PositionY; sites follow FieldID order in one row".into());
        for (k, f) in fields.iter().enumerate() {
            field_to_site.insert(*f, k as u32 + 1);
            site_cells.push(SiteCell { site: k as u32 + 1, row: 0, col: k as u32 });
        }
        return SiteGrid { field_to_site, site_cells, rows: 1, cols: fields.len() as u32, fields: fields.len() as u32 };
    }
    let resolution = entries.iter().find_map(|e| e.resolution_um);
    let size_x = entries.iter().find_map(|e| e.size_x);
    let size_y = entries.iter().find_map(|e| e.size_y);
    let ids: Vec<u32> = sums.keys().copied().collect();
    let positions: Vec<(f64, f64)> = sums.values().map(|s| (s.0 / f64::from(s.2), s.1 / f64::from(s.2))).collect();
    // Two fields are in the same row/column when closer than half a tile.
    let tile_w = resolution.zip(size_x).map(|(r, s)| r * f64::from(s)).unwrap_or(1.0);
    let tile_h = resolution.zip(size_y).map(|(r, s)| r * f64::from(s)).unwrap_or(tile_w);
    let GridCells { cells, rows, cols } = grid_cells(&positions, tile_w, tile_h);
    let mut order: Vec<usize> = (0..ids.len()).collect();
    order.sort_by_key(|&i| (cells[i], ids[i]));
    let mut occupied = BTreeSet::new();
    for (k, &i) in order.iter().enumerate() {
        let site = k as u32 + 1;
        let (row, col) = cells[i];
        if !occupied.insert((row, col)) {
            warnings.push(format!("field {} shares grid cell ({row}, {col}) with another field", ids[i]));
        }
        field_to_site.insert(ids[i], site);
        site_cells.push(SiteCell { site, row, col });
    }
    SiteGrid { field_to_site, site_cells, rows, cols, fields: fields.len() as u32 }
}

/// What the index entries resolve to.
struct Resolved {
    images: Vec<ImageRecord>,
    missing: Vec<MissingImage>,
    /// Stage position (µm, image-oriented) of every (well, site), the first entry's.
    stage: BTreeMap<(String, u32), (f64, f64)>,
    /// Channel number → name, the first entry's.
    channel_names: BTreeMap<u32, String>,
}

/// Resolves every index entry to an image file inside the plate, or to a
/// missing image saying why (empty URL, outside the plate, no file, not a
/// regular file); duplicates and entries that name no well are warnings.
fn resolve_images(
    loc: &Located,
    entries: &[IndexEntry],
    field_to_site: &BTreeMap<u32, u32>,
    (sx, sy): (f64, f64),
    warnings: &mut Vec<String>,
) -> Resolved {
    let mut found = Resolved { images: Vec::new(), missing: Vec::new(), stage: BTreeMap::new(), channel_names: BTreeMap::new() };
    let mut seen = BTreeSet::new();
    for e in entries {
        let Some(well) = well_name(e.row, e.col) else {
            warnings.push(format!("Image {:?}: row {} / column {} is not a well", e.id, e.row, e.col));
            continue;
        };
        let site = field_to_site.get(&e.field).copied().unwrap_or(0);
        let t = e.timepoint0 + 1;
        if let Some(n) = &e.channel_name {
            found.channel_names.entry(e.channel).or_insert_with(|| n.clone());
        }
        if let (Some(x), Some(y)) = (e.pos_x_um, e.pos_y_um) {
            found.stage.entry((well.clone(), site)).or_insert((sx * x, sy * y));
        }
        if !seen.insert((well.clone(), site, e.channel, e.plane, t)) {
            warnings.push(format!(
                "Image {:?}: duplicate entry for well {well} field {} channel {} plane {} t {t}; ignored",
                e.id, e.field, e.channel, e.plane
            ));
            continue;
        }
        let miss = |path: Option<PathBuf>, reason: &str| MissingImage {
            well: well.clone(),
            site,
            channel: e.channel,
            z_index: e.plane,
            timepoint: t,
            path,
            reason: reason.to_string(),
        };
        match entry_file(loc, e, warnings) {
            Ok(file) => {
                found.images.push(ImageRecord { well, site, channel: e.channel, z_index: e.plane, timepoint: t, path: file, at: None });
            }
            Err((path, reason)) => found.missing.push(miss(path, &reason)),
        }
    }
    found
}

/// The image file of the entry `e`, or where it was expected (if anywhere)
/// and why it is missing. Warns about URLs outside the plate, non-regular
/// files and file names that disagree with the entry.
fn entry_file(loc: &Located, e: &IndexEntry, warnings: &mut Vec<String>) -> Result<PathBuf, (Option<PathBuf>, String)> {
    if e.url.is_empty() {
        return Err((None, "empty URL in the index".into()));
    }
    let base = if loc.in_images { Path::new("Images") } else { Path::new("") };
    let Some(mut file) = inside_plate(&loc.root, base, &e.url) else {
        let reason = format!("URL {:?} points outside the plate; not opened", e.url);
        warnings.push(format!("{}: Image {:?}: {reason}", loc.index.display(), e.id));
        return Err((None, reason));
    };
    if !file.exists() && !loc.in_images {
        if let Some(alt) = inside_plate(&loc.root, Path::new("Images"), &e.url).filter(|a| a.exists()) {
            file = alt;
        }
    }
    if std::fs::symlink_metadata(&file).is_err() {
        return Err((Some(file), "file not found".into()));
    }
    if let Some(why) = not_a_regular_file(&file) {
        warnings.push(format!("{} {why}; not opened, the plane counts as missing", file.display()));
        return Err((Some(file), format!("the file {why}")));
    }
    let fname = Path::new(&e.url).file_name().map(|n| n.to_string_lossy().into_owned()).unwrap_or_default();
    if let Some(p) = parse_phenix_name(&fname) {
        if (p.row, p.col, p.field, p.plane, p.channel, p.sk) != (e.row, e.col, e.field, e.plane, e.channel, e.timepoint0 + 1) {
            warnings.push(format!("{fname}: file name disagrees with its index entry {:?}; the index is used", e.id));
        }
    }
    Ok(file)
}

/// The plate metadata: plate name and size and the acquired wells from the
/// document, the rest from the entries and the site grid.
fn plate_metadata(
    root_el: Node,
    entries: &[IndexEntry],
    grid: SiteGrid,
    stage: BTreeMap<(String, u32), (f64, f64)>,
    channel_names: BTreeMap<u32, String>,
) -> PlateMetadata {
    let plate_el = child(root_el, "Plates").and_then(|p| child(p, "Plate"));
    let plate_num = |k: &str| plate_el.and_then(|p| text(p, k)).and_then(|t| t.parse::<u32>().ok());
    let mut acquired: Vec<String> = child(root_el, "Wells")
        .map(|w| {
            w.children()
                .filter(|c| c.is_element() && c.tag_name().name() == "Well")
                .filter_map(|c| {
                    let r = text(c, "Row")?.parse().ok()?;
                    let col = text(c, "Col")?.parse().ok()?;
                    well_name(r, col)
                })
                .collect()
        })
        .unwrap_or_default();
    if acquired.is_empty() {
        acquired = entries.iter().filter_map(|e| well_name(e.row, e.col)).collect();
    }
    let max_intensity = entries.iter().find_map(|e| e.max_intensity);
    // V5 writes the largest value (65535), V7 the number of values (65536).
    let bit_depth = max_intensity.map(|m| {
        let m = m.max(1.0);
        if m.log2().fract() == 0.0 {
            m.log2() as u32
        } else {
            (m + 1.0).log2().ceil() as u32
        }
    });
    let channels: BTreeSet<u32> = entries.iter().map(|e| e.channel).collect();
    PlateMetadata {
        name: plate_el.and_then(|p| text(p, "Name")).unwrap_or("").to_string(),
        description: None,
        plate_rows: plate_num("PlateRows").unwrap_or(0),
        plate_columns: plate_num("PlateColumns").unwrap_or(0),
        acquired_wells: acquired,
        grid_rows: grid.rows,
        grid_cols: grid.cols,
        site_cells: grid.site_cells,
        field_to_site: grid.field_to_site,
        pixel_size_um: entries.iter().find_map(|e| e.resolution_um),
        stage_positions: stage.into_iter().map(|((well, site), (x_um, y_um))| StagePosition { well, site, x_um, y_um }).collect(),
        channel_names,
        bit_depth,
        image_width: entries.iter().find_map(|e| e.size_x),
        image_height: entries.iter().find_map(|e| e.size_y),
        dtype: bit_depth.map(|b| if b <= 8 { DType::U8 } else { DType::U16 }),
        sites: grid.fields,
        channels: channels.len() as u32,
        z_planes: entries.iter().map(|e| e.plane).max().unwrap_or(0),
        timepoints: entries.iter().map(|e| e.timepoint0 + 1).max().unwrap_or(0),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn orientation_matrix() {
        let m = parse_orientation("[[0.99,0,0,25.2],[0,-0.99,0,18.8],[0,0,-1,0]]").unwrap();
        assert_eq!(m.len(), 3);
        assert_eq!(m[1][1], -0.99);
        assert!(parse_orientation("[[a,b]]").is_none());
        assert!(parse_orientation("").is_none());
    }
}
