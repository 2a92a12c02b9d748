//! ImageXpress / MetaXpress plates: a `.HTD` descriptor plus one TIFF per plane.
//!
//! Folder variants accepted (formats.md §4.1): images directly in the plate
//! folder; `TimePoint_<t>/`; `TimePoint_<t>/ZStep_<z>/`; and, with
//! `ZProjection TRUE`, the projected plane in `TimePoint_<t>/` beside the
//! `ZStep_<z>/` folders (exposed as [`Plate::projections`]).
//!
//! File names are parsed from the right (the plate prefix may contain `_`):
//! `prefix_WELL[_sS][_wW][_tT][_thumb][GUID].tif|.TIF|.tiff`. A trailing 36-character
//! GUID (bare, `_`-separated or bracketed) is removed first, so that in
//! `…_w107447158-AC76-…` the wave is `1` and not `107447158`.
//!
//! Names without the plate prefix (`A01_s001_w1.tif`, `A01_s001_w1_z001.tif`,
//! `…_z001_t001.tif`: what OpenHCS's synthetic generator writes) are read too,
//! when every image of the plate is named that way; a folder mixing both is
//! [`PlateError::MixedNaming`], naming one file of each kind. A `_z<Z>` token
//! gives the plane outside `ZStep_<z>/` folders; inside one, the folder wins
//! and a disagreeing token is a warning.
//!
//! Sites are numbered 1.. over the TRUE cells of `SiteSelection` in reading
//! order, which also gives each site's grid cell.
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

use std::collections::{BTreeMap, BTreeSet};
use std::path::{Path, PathBuf};

use rayon::prelude::*;

use crate::well::{parse_well, well_name};
use crate::{
    io_err, list_dir, metaseries_props, not_a_regular_file, EntryKind, Format, ImageRecord, MissingImage, Plate, PlateError, PlateMetadata,
    SiteCell, StagePosition,
};

/// Decodes descriptor bytes: UTF-8 when valid (BOM stripped), otherwise
/// Windows-1252, byte by byte, so that a `Description` typed on a Windows PC
/// (µ, en dash, accented names) never makes a plate unreadable.
pub fn decode_text(bytes: &[u8]) -> String {
    let bytes = bytes.strip_prefix(b"\xEF\xBB\xBF").unwrap_or(bytes);
    match std::str::from_utf8(bytes) {
        Ok(s) => s.to_string(),
        Err(_) => bytes.iter().map(|&b| cp1252(b)).collect(),
    }
}

fn cp1252(b: u8) -> char {
    const HIGH: [char; 32] = [
        '€', '\u{81}', '‚', 'ƒ', '„', '…', '†', '‡', 'ˆ', '‰', 'Š', '‹', 'Œ', '\u{8d}', 'Ž', '\u{8f}', '\u{90}', '‘', '’', '“', '”', '•',
        '–', '—', '˜', '™', 'š', '›', 'œ', '\u{9d}', 'ž', 'Ÿ',
    ];
    match b {
        0x80..=0x9F => HIGH[usize::from(b - 0x80)],
        _ => char::from(b),
    }
}

/// What a `.HTD` file says, with defaults for absent keys.
#[derive(Debug, Clone, PartialEq, Default)]
pub struct HtdInfo {
    pub description: Option<String>,
    pub timepoints: u32,
    pub z_series: bool,
    pub z_steps: u32,
    pub z_projection: bool,
    pub x_wells: u32,
    pub y_wells: u32,
    /// `WellsSelection<r>` rows present in the file, by 1-based row `r`
    /// (absent rows select no well); `None` when the HTD has no `WellsSelection1`.
    pub wells_selection: Option<BTreeMap<u32, Vec<bool>>>,
    pub sites: bool,
    pub x_sites: u32,
    pub y_sites: u32,
    /// `SiteSelection<r>` rows present in the file, by 1-based row `r`
    /// (absent rows select no site); `None` when the HTD has no `SiteSelection1`.
    pub site_selection: Option<BTreeMap<u32, Vec<bool>>>,
    pub waves: bool,
    pub n_wavelengths: u32,
    /// `WaveName<w>` records present, for `w` in `1..=n_wavelengths`.
    pub wave_names: BTreeMap<u32, String>,
    /// `WaveCollect<w>` records present, for `w` in `1..=n_wavelengths`.
    pub wave_collect: BTreeMap<u32, bool>,
    pub unique_id: Option<String>,
    /// False when the file does not end with `"EndFile"` (possibly truncated).
    pub has_end: bool,
    /// Records that could not be parsed and were skipped ("line N: why").
    pub skipped_lines: Vec<String>,
}

impl HtdInfo {
    /// Number of sites [`site_cells`](Self::site_cells) returns, computed
    /// without enumerating them (the grid may be absurdly large in a corrupt file).
    pub fn site_count(&self) -> u64 {
        if !self.sites {
            return 1;
        }
        match &self.site_selection {
            Some(rows) => rows
                .iter()
                .filter(|(r, _)| **r <= self.y_sites.max(1))
                .map(|(_, row)| row.iter().take(self.x_sites.max(1) as usize).filter(|b| **b).count() as u64)
                .sum(),
            None => u64::from(self.x_sites.max(1)) * u64::from(self.y_sites.max(1)),
        }
    }

    /// Grid cells (0-based row, col) of sites 1.., reading order over selected cells.
    ///
    /// Allocates one entry per site: check [`site_count`](Self::site_count)
    /// first on an HTD that has not been checked against the files on disk.
    pub fn site_cells(&self) -> Vec<SiteCell> {
        if !self.sites {
            return vec![SiteCell { site: 1, row: 0, col: 0 }];
        }
        let mut out = Vec::new();
        let mut push = |r: u32, c: u32| out.push(SiteCell { site: out.len() as u32 + 1, row: r, col: c });
        match &self.site_selection {
            // Only rows present in the file can select a site.
            Some(rows) => {
                for (&r, row) in rows.range(1..=self.y_sites.max(1)) {
                    for (c, _) in row.iter().enumerate().take(self.x_sites.max(1) as usize).filter(|(_, b)| **b) {
                        push(r - 1, c as u32);
                    }
                }
            }
            None => {
                for r in 0..self.y_sites.max(1) {
                    for c in 0..self.x_sites.max(1) {
                        push(r, c);
                    }
                }
            }
        }
        out
    }

    /// Number of channels [`channels`](Self::channels) returns, computed without enumerating them.
    pub fn channel_count(&self) -> u64 {
        let n = if self.waves { self.n_wavelengths.max(1) } else { 1 };
        let skipped = self.wave_collect.iter().filter(|(w, on)| **w <= n && !**on).count() as u64;
        u64::from(n) - skipped
    }

    /// Collected channel numbers (waves), ascending.
    ///
    /// Allocates one entry per channel: check [`channel_count`](Self::channel_count)
    /// first on an HTD that has not been checked against the files on disk.
    pub fn channels(&self) -> Vec<u32> {
        let n = if self.waves { self.n_wavelengths.max(1) } else { 1 };
        (1..=n).filter(|w| self.wave_collect.get(w).copied().unwrap_or(true)).collect()
    }

    /// Selected wells, numeric order; `None` when the HTD has no selection lines.
    pub fn selected_wells(&self) -> Option<Vec<String>> {
        let rows = self.wells_selection.as_ref()?;
        let mut out = Vec::new();
        for (&r, row) in rows {
            for (c, &sel) in row.iter().enumerate() {
                if sel {
                    if let Some(w) = well_name(r, c as u32 + 1) {
                        out.push(w);
                    }
                }
            }
        }
        Some(out)
    }
}

/// Splits the values after the key: comma-separated, double-quoted strings may
/// contain commas; quotes are removed.
fn split_values(rest: &str) -> Vec<String> {
    let mut out = Vec::new();
    let mut cur = String::new();
    let mut in_quotes = false;
    for ch in rest.chars() {
        match ch {
            '"' => in_quotes = !in_quotes,
            ',' if !in_quotes => {
                out.push(cur.trim().to_string());
                cur.clear();
            }
            _ => cur.push(ch),
        }
    }
    if !cur.trim().is_empty() || !out.is_empty() {
        out.push(cur.trim().to_string());
    }
    out
}

/// Parses the text of a `.HTD` file. `path` is only used in errors.
pub fn parse_htd(bytes: &[u8], path: &Path) -> Result<HtdInfo, PlateError> {
    let text = decode_text(bytes);
    let bad = |line: usize, message: String| PlateError::Htd { path: path.to_path_buf(), line, message };
    let mut entries: BTreeMap<String, (usize, Vec<String>)> = BTreeMap::new();
    let mut first = true;
    let mut has_end = false;
    let mut skipped = Vec::new();
    for (i, raw) in text.split('\n').enumerate() {
        let lineno = i + 1;
        let line = raw.trim_end_matches('\r').trim();
        if line.is_empty() {
            continue;
        }
        // Parse one record; a malformed record is fatal on the first line (the
        // file is not an HTD at all) and skipped with a warning afterwards (a
        // multi-line Description must not make a plate unreadable).
        let record = (|| {
            let after =
                line.strip_prefix('"').ok_or_else(|| format!("expected a line starting with a quoted key, found {:?}", clip(line)))?;
            let end = after.find('"').ok_or_else(|| "unterminated quoted key".to_string())?;
            let key = &after[..end];
            let rest = after[end + 1..].trim_start();
            let values = match rest.strip_prefix(',') {
                Some(v) => split_values(v),
                None if rest.is_empty() => Vec::new(),
                None => return Err(format!("expected ',' after key {key:?}")),
            };
            Ok((key.to_string(), values))
        })();
        let (key, values) = match record {
            Ok(r) => r,
            Err(m) if first => return Err(bad(lineno, m)),
            Err(m) => {
                skipped.push(format!("line {lineno}: {m}"));
                continue;
            }
        };
        if first {
            if key != "HTSInfoFile" {
                return Err(bad(lineno, format!("first record must be \"HTSInfoFile\", found {key:?}")));
            }
            first = false;
            continue;
        }
        if key == "EndFile" {
            has_end = true;
            break;
        }
        entries.insert(key, (lineno, values));
    }
    if first {
        return Err(bad(1, "empty file (no \"HTSInfoFile\" record)".into()));
    }

    let get = |k: &str| entries.get(k).and_then(|(_, v)| v.first()).map(String::as_str);
    let num = |k: &str, default: u32| -> Result<u32, PlateError> {
        match entries.get(k) {
            None => Ok(default),
            Some((line, v)) => v
                .first()
                .and_then(|s| s.parse::<u32>().ok())
                .ok_or_else(|| bad(*line, format!("{k} must be a non-negative integer, found {v:?}"))),
        }
    };
    let boolean = |k: &str, default: bool| -> Result<bool, PlateError> {
        match entries.get(k) {
            None => Ok(default),
            Some((line, v)) => parse_bool(v.first().map(String::as_str).unwrap_or(""))
                .ok_or_else(|| bad(*line, format!("{k} must be TRUE or FALSE, found {v:?}"))),
        }
    };
    // Keys `<prefix><n>` present in the file, with n parsed: loops over what
    // the file holds, never over a count it declares (a corrupt count must
    // not turn into billions of iterations or allocations).
    let numbered_keys = |prefix: &str| -> Vec<(u32, &(usize, Vec<String>))> {
        entries
            .range(prefix.to_string()..)
            .take_while(|(k, _)| k.starts_with(prefix))
            .filter_map(|(k, v)| Some((k[prefix.len()..].parse::<u32>().ok().filter(|n| *n > 0)?, v)))
            .collect()
    };
    let selection = |prefix: &str, rows: u32, cols: u32| -> Result<Option<BTreeMap<u32, Vec<bool>>>, PlateError> {
        if !entries.contains_key(&format!("{prefix}1")) {
            return Ok(None);
        }
        let mut out = BTreeMap::new();
        for (r, (line, v)) in numbered_keys(prefix) {
            if r > rows {
                continue;
            }
            let row: Option<Vec<bool>> = v.iter().map(|s| parse_bool(s)).collect();
            let row = row.ok_or_else(|| bad(*line, format!("{prefix}{r}: values must be TRUE or FALSE")))?;
            if row.len() != cols as usize {
                return Err(bad(*line, format!("{prefix}{r} has {} values, expected {cols}", row.len())));
            }
            out.insert(r, row);
        }
        Ok(Some(out))
    };

    let x_wells = num("XWells", 0)?;
    let y_wells = num("YWells", 0)?;
    if x_wells == 0 || y_wells == 0 {
        return Err(bad(0, "XWells and YWells (plate columns and rows) are required and must be positive".into()));
    }
    // When an on/off key is absent, the counts decide (some exporters omit them).
    let sites = boolean("Sites", u64::from(num("XSites", 1)?.max(1)) * u64::from(num("YSites", 1)?.max(1)) > 1)?;
    let (x_sites, y_sites) = if sites { (num("XSites", 1)?.max(1), num("YSites", 1)?.max(1)) } else { (1, 1) };
    let z_series = boolean("ZSeries", num("ZSteps", 1)? > 1)?;
    let n_wavelengths = num("NWavelengths", 1)?.max(1);
    let waves = boolean("Waves", n_wavelengths > 1)?;
    let mut wave_names = BTreeMap::new();
    let mut wave_collect = BTreeMap::new();
    let declared_waves = if waves { n_wavelengths } else { 1 };
    for (w, (_, v)) in numbered_keys("WaveName") {
        if let (true, Some(n)) = (w <= declared_waves, v.first()) {
            wave_names.insert(w, n.to_string());
        }
    }
    for (w, _) in numbered_keys("WaveCollect") {
        if w <= declared_waves {
            wave_collect.insert(w, num(&format!("WaveCollect{w}"), 1)? != 0);
        }
    }
    Ok(HtdInfo {
        description: get("Description").map(str::to_string),
        timepoints: num("TimePoints", 1)?.max(1),
        z_series,
        z_steps: if z_series { num("ZSteps", 1)?.max(1) } else { 1 },
        z_projection: boolean("ZProjection", false)?,
        x_wells,
        y_wells,
        wells_selection: selection("WellsSelection", y_wells, x_wells)?,
        sites,
        x_sites,
        y_sites,
        site_selection: if sites { selection("SiteSelection", y_sites, x_sites)? } else { None },
        waves,
        n_wavelengths: if waves { n_wavelengths } else { 1 },
        wave_names,
        wave_collect,
        unique_id: get("UniquePlateIdentifier").map(str::to_string),
        has_end,
        skipped_lines: skipped,
    })
}

fn parse_bool(s: &str) -> Option<bool> {
    match s.trim() {
        t if t.eq_ignore_ascii_case("true") => Some(true),
        t if t.eq_ignore_ascii_case("false") => Some(false),
        _ => None,
    }
}

fn clip(s: &str) -> String {
    s.chars().take(40).collect()
}

/// The components of an ImageXpress image file name.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ImageName {
    /// Plate/measurement prefix (may contain `_`). `None` for names that start
    /// with the well (`A01_s001_w1.tif`): MetaXpress always writes a prefix,
    /// but OpenHCS's synthetic generator and renamed exports do not.
    pub prefix: Option<String>,
    pub well: String,
    pub site: Option<u32>,
    pub wave: Option<u32>,
    /// `_t<T>` time point token (Bio-Formats' exact-name lookup accepts it;
    /// MetaXpress itself uses `TimePoint_<t>/` folders).
    pub timepoint: Option<u32>,
    /// `_z<Z>` plane token (OpenHCS's names, e.g. `A01_s001_w1_z003.tif`;
    /// MetaXpress itself uses `ZStep_<z>/` folders).
    pub z: Option<u32>,
    /// True for `_thumb` thumbnails (to be skipped).
    pub thumb: bool,
    /// The GUID suffix without brackets, if any.
    pub guid: Option<String>,
}

fn is_guid(s: &str) -> bool {
    let b = s.as_bytes();
    b.len() == 36
        && b.iter().enumerate().all(|(i, c)| match i {
            8 | 13 | 18 | 23 => *c == b'-',
            _ => c.is_ascii_hexdigit(),
        })
}

/// Removes `_<digits>` with the given marker letter from the end of `s`
/// (e.g. `_w2`), returning the number.
fn strip_token(s: &mut String, marker: char) -> Option<u32> {
    let idx = s.rfind(&format!("_{marker}"))?;
    let digits = &s[idx + 2..];
    if digits.is_empty() || !digits.bytes().all(|b| b.is_ascii_digit()) {
        return None;
    }
    let n = digits.parse().ok()?;
    s.truncate(idx);
    Some(n)
}

/// Parses an ImageXpress image file name (no folder). Returns `None` for names
/// that are not images of the grammar (other extensions, no well).
///
/// `_thumb` anywhere in the name marks a thumbnail: the result has `thumb`
/// set and callers skip it.
///
/// A name may start with the well (no plate prefix) only when it carries a
/// `_s`, `_w`, `_z` or `_t` token: a bare `A01.tif` says nothing that makes it
/// an acquisition image (per-well exports are named like that), so it is not
/// taken as one. Whether prefix-less and prefixed names may share a plate is
/// the caller's decision ([`open`] refuses the mix).
pub fn parse_image_name(name: &str) -> Option<ImageName> {
    let dot = name.rfind('.')?;
    let ext = &name[dot + 1..];
    if !(ext.eq_ignore_ascii_case("tif") || ext.eq_ignore_ascii_case("tiff")) {
        return None;
    }
    let mut stem = name[..dot].to_string();
    // 1. GUID: bracketed, or the fixed 36-character shape at the very end.
    let mut guid = None;
    if stem.ends_with(']') {
        if let Some(open) = stem.rfind('[') {
            let inner = &stem[open + 1..stem.len() - 1];
            if is_guid(inner) {
                guid = Some(inner.to_string());
                stem.truncate(open);
            }
        }
    } else if stem.len() >= 36 && stem.is_char_boundary(stem.len() - 36) && is_guid(&stem[stem.len() - 36..]) {
        guid = Some(stem[stem.len() - 36..].to_string());
        stem.truncate(stem.len() - 36);
    }
    if guid.is_some() && stem.ends_with('_') {
        stem.pop();
    }
    // 2. thumbnail marker
    let thumb = stem.contains("_thumb");
    if let Some(i) = stem.rfind("_thumb") {
        if stem[i + 6..].is_empty() {
            stem.truncate(i);
        }
    }
    // 3. time point and plane (either order, each at most once), wave, then
    //    site, from the right
    let (mut timepoint, mut z) = (None, None);
    loop {
        if timepoint.is_none() {
            if let Some(t) = strip_token(&mut stem, 't') {
                timepoint = Some(t);
                continue;
            }
        }
        if z.is_none() {
            if let Some(v) = strip_token(&mut stem, 'z') {
                z = Some(v);
                continue;
            }
        }
        break;
    }
    let wave = strip_token(&mut stem, 'w');
    let site = strip_token(&mut stem, 's');
    // 4. well, after the last `_`, or the whole rest for prefix-less names
    let (prefix, well) = match stem.rfind('_') {
        Some(us) if us > 0 => (Some(stem[..us].to_string()), &stem[us + 1..]),
        _ => {
            if site.is_none() && wave.is_none() && z.is_none() && timepoint.is_none() {
                return None;
            }
            (None, stem.strip_prefix('_').unwrap_or(&stem))
        }
    };
    parse_well(well)?;
    Some(ImageName { prefix, well: well.to_string(), site, wave, timepoint, z, thumb, guid })
}

/// `.HTD`/`.htd` files directly in `dir`, sorted. Hidden names (starting
/// with `.`, e.g. macOS `._Plate.HTD` AppleDouble companions) are not descriptors.
pub fn find_htd_files(dir: &Path) -> Result<Vec<PathBuf>, PlateError> {
    Ok(list_dir(dir)?
        .into_iter()
        .filter(|(n, kind)| *kind != EntryKind::Dir && !n.starts_with('.') && n.to_ascii_lowercase().ends_with(".htd"))
        .map(|(n, _)| dir.join(n))
        .collect())
}

/// Index of a numbered folder like `TimePoint_3` (case-insensitive prefix).
fn numbered(name: &str, prefix: &str) -> Option<u32> {
    let head = name.get(..prefix.len())?;
    if !head.eq_ignore_ascii_case(prefix) {
        return None;
    }
    name.get(prefix.len()..)?.parse().ok().filter(|n| *n > 0)
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
    /// Beside `ZStep_<z>/` folders: a projection, unless the name has `_z<Z>`.
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

/// Opens an ImageXpress plate (folder or `.HTD` file).
pub fn open(path: &Path) -> Result<Plate, PlateError> {
    let (root, htd_path) = if path.is_file() {
        let root = path.parent().map(Path::to_path_buf).unwrap_or_else(|| PathBuf::from("."));
        (root, path.to_path_buf())
    } else {
        let htds = find_htd_files(path)?;
        match htds.len() {
            0 => return Err(PlateError::NoPlateFound { path: path.to_path_buf() }),
            1 => (path.to_path_buf(), htds[0].clone()),
            _ => {
                let files = htds.iter().map(|p| p.display().to_string()).collect::<Vec<_>>().join(", ");
                return Err(PlateError::MultipleDescriptors { path: path.to_path_buf(), files });
            }
        }
    };
    if let Some(reason) = not_a_regular_file(&htd_path) {
        return Err(PlateError::NotRegularFile { path: htd_path, reason });
    }
    let bytes = std::fs::read(&htd_path).map_err(io_err(&htd_path))?;
    let htd = parse_htd(&bytes, &htd_path)?;
    let mut warnings = Vec::new();
    for l in &htd.skipped_lines {
        warnings.push(format!("{}: skipped malformed record at {l}", htd_path.display()));
    }
    if !htd.has_end {
        warnings.push(format!("{}: no \"EndFile\" record (file may be truncated)", htd_path.display()));
    }

    // Collect candidate files from every folder variant.
    let mut found = Vec::new();
    let mut unknown = Vec::new();
    let mut hidden = Vec::new();
    let mut not_regular: Vec<(Found, String)> = Vec::new();
    let mut scan = |dir: &Path,
                    t: u32,
                    folder_z: FolderZ,
                    found: &mut Vec<Found>,
                    warnings: &mut Vec<String>|
     -> Result<Vec<(String, EntryKind)>, PlateError> {
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
                hidden.push(dir.join(n));
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
                        None => found.push(Found { name, path, t, z }),
                        Some(why) => not_regular.push((Found { name, path, t, z }, why)),
                    }
                }
                None => unknown.push(dir.join(n)),
            }
        }
        Ok(entries)
    };
    let root_entries = scan(&root, 1, FolderZ::Flat, &mut found, &mut warnings)?;
    for (n, kind) in &root_entries {
        let Some(t) = numbered(n, "TimePoint_").filter(|_| *kind == EntryKind::Dir) else {
            continue;
        };
        let tdir = root.join(n);
        let tentries = list_dir(&tdir)?;
        let zdirs: Vec<(u32, PathBuf)> = tentries
            .iter()
            .filter(|(_, k)| *k == EntryKind::Dir)
            .filter_map(|(zn, _)| numbered(zn, "ZStep_").map(|z| (z, tdir.join(zn))))
            .collect();
        let here_z = if zdirs.is_empty() { FolderZ::Flat } else { FolderZ::BesideSteps };
        scan(&tdir, t, here_z, &mut found, &mut warnings)?;
        for (z, zdir) in zdirs {
            scan(&zdir, t, FolderZ::Step(z), &mut found, &mut warnings)?;
        }
    }
    if !unknown.is_empty() {
        let shown: Vec<String> = unknown.iter().take(10).map(|p| p.display().to_string()).collect();
        warnings.push(format!(
            "{} TIFF file(s) with names that are not ImageXpress image names were ignored: {}{}",
            unknown.len(),
            shown.join(", "),
            if unknown.len() > 10 { ", …" } else { "" }
        ));
    }
    if !hidden.is_empty() {
        let shown: Vec<String> = hidden.iter().take(3).map(|p| p.display().to_string()).collect();
        warnings.push(format!(
            "{} hidden TIFF-named file(s) (name starting with '.', e.g. macOS '._' AppleDouble companions) were ignored: {}{}",
            hidden.len(),
            shown.join(", "),
            if hidden.len() > 3 { ", …" } else { "" }
        ));
    }
    for (f, why) in &not_regular {
        warnings.push(format!("{} {why}; not opened, the plane counts as missing", f.path.display()));
    }

    check_counts(&htd, &htd_path, &found, not_regular.len())?;

    // Duplicates keep the first file of `found`: files whose prefix is the
    // HTD's name come first, so a stray copy with another prefix never
    // replaces the acquisition's own image (stable: otherwise folder order).
    let htd_stem = htd_path.file_stem().map(|s| s.to_string_lossy().into_owned()).unwrap_or_default();
    found.sort_by_key(|f| !f.name.prefix.as_deref().is_some_and(|p| p.eq_ignore_ascii_case(&htd_stem)));

    let cells = htd.site_cells();
    let n_sites = cells.len() as u32;
    let channels = htd.channels();
    // Prefix-less names are accepted only when every image is named that way:
    // a mix means two naming schemes (or stray exports) in one folder, and
    // guessing which files belong to the acquisition would be silent.
    let prefixed = found.iter().find(|f| f.name.prefix.is_some());
    let bare = found.iter().find(|f| f.name.prefix.is_none());
    if let (Some(a), Some(b)) = (prefixed, bare) {
        return Err(PlateError::MixedNaming { path: root.clone(), prefixed: a.path.clone(), bare: b.path.clone() });
    }
    let prefixes: BTreeSet<&str> = found.iter().filter_map(|f| f.name.prefix.as_deref()).collect();
    if prefixes.len() > 1 {
        warnings.push(format!("images carry several plate prefixes: {prefixes:?}"));
    }

    let mut images = Vec::new();
    let mut projections = Vec::new();
    let mut seen = BTreeSet::new();
    for f in &found {
        let fname = f.path.display();
        let channel = match f.name.wave {
            Some(w) => w,
            None if channels.len() <= 1 && htd.n_wavelengths <= 1 => 1,
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
        let rec = |z: u32| ImageRecord { well: f.name.well.clone(), site, channel, z_index: z, timepoint: f.t, path: f.path.clone() };
        match f.z {
            None => {
                if !htd.z_projection {
                    warnings.push(format!("{fname}: image beside ZStep folders but ZProjection is not TRUE; treated as a projection"));
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
    if images.is_empty() {
        return Err(PlateError::NoImages { path: root.clone(), detail: format!("{} candidate TIFF(s) parsed; none usable", found.len()) });
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
    // Files named like an expected image but not regular files: missing, with why.
    let odd: BTreeMap<PlaneKey, (&PathBuf, &String)> = not_regular
        .iter()
        .filter_map(|(f, why)| Some(((f.name.well.clone(), f.name.site.unwrap_or(1), f.name.wave.unwrap_or(1), f.z?, f.t), (&f.path, why))))
        .collect();
    let mut missing = Vec::new();
    for well in &wells {
        for cell in &cells {
            for &ch in &channels {
                for z in 1..=htd.z_steps {
                    for t in 1..=htd.timepoints {
                        let key = (well.clone(), cell.site, ch, z, t);
                        if !seen.contains(&key) {
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
    }
    let well_set: BTreeSet<&String> = wells.iter().collect();
    let extra: BTreeSet<&String> = images.iter().map(|i| &i.well).filter(|w| !well_set.contains(w)).collect();
    if !extra.is_empty() {
        warnings.push(format!("images found for wells not selected in the HTD: {extra:?}"));
    }

    // Per-image metadata from the TIFF headers: one image per (well, site).
    let mut reps: BTreeMap<(String, u32), &ImageRecord> = BTreeMap::new();
    for img in &images {
        reps.entry((img.well.clone(), img.site)).or_insert(img);
    }
    let reps: Vec<(&(String, u32), &&ImageRecord)> = reps.iter().collect();
    let infos: Vec<Result<(String, u32, hcsflow_tiff::TiffInfo), hcsflow_tiff::TiffError>> =
        reps.par_iter().map(|((w, s), img)| hcsflow_tiff::read_info(&img.path).map(|i| (w.clone(), *s, i))).collect();
    let mut metadata = PlateMetadata {
        name: htd_path.file_stem().map(|s| s.to_string_lossy().into_owned()).unwrap_or_default(),
        description: htd.description.clone(),
        plate_rows: htd.y_wells,
        plate_columns: htd.x_wells,
        acquired_wells: wells.clone(),
        grid_rows: htd.y_sites,
        grid_cols: htd.x_sites,
        site_cells: cells.clone(),
        channel_names: htd.wave_names.clone(),
        sites: n_sites,
        channels: channels.len() as u32,
        z_planes: htd.z_steps,
        timepoints: htd.timepoints,
        ..PlateMetadata::default()
    };
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

    Ok(Plate { format: Format::ImageXpress, root, descriptor: htd_path, metadata, images, projections, missing, warnings })
}

#[cfg(test)]
mod tests {
    use super::*;

    fn name(s: &str) -> ImageName {
        parse_image_name(s).unwrap_or_else(|| panic!("{s} should parse"))
    }

    #[test]
    fn bbbc021_name_with_bare_guid_after_wave() {
        let n = name("Week1_150607_B02_s1_w107447158-AC76-4844-8431-E6A954BD1174.tif");
        assert_eq!(n.prefix.as_deref(), Some("Week1_150607"));
        assert_eq!(n.well, "B02");
        assert_eq!(n.site, Some(1));
        assert_eq!(n.wave, Some(1));
        assert_eq!(n.guid.as_deref(), Some("07447158-AC76-4844-8431-E6A954BD1174"));
        assert!(!n.thumb);
    }

    #[test]
    fn bracketed_guid_and_underscore_guid() {
        let n = name("Plate_A01_s1_[0F1E2D3C-4B5A-6978-8796-A5B4C3D2E1F0].tif");
        assert_eq!((n.well.as_str(), n.site, n.wave), ("A01", Some(1), None));
        assert_eq!(n.guid.as_deref(), Some("0F1E2D3C-4B5A-6978-8796-A5B4C3D2E1F0"));
        let n = name("Plate_A01_s3_w2_0f1e2d3c-4b5a-6978-8796-a5b4c3d2e1f0.TIF");
        assert_eq!((n.site, n.wave), (Some(3), Some(2)));
    }

    #[test]
    fn thumbnails_are_flagged() {
        assert!(name("Plate_A01_s1_w1_thumb4A5B6C7D-1111-2222-3333-444455556666.tif").thumb);
        assert!(name("Plate_A01_s1_w1_thumb.tif").thumb);
        assert!(!name("Plate_A01_s1_w1.tif").thumb);
    }

    #[test]
    fn optional_site_and_wave_two_letter_rows_and_prefix_underscores() {
        let n = name("my_plate_2024_01_C05_w2.tiff");
        assert_eq!((n.prefix.as_deref(), n.well.as_str(), n.site, n.wave), (Some("my_plate_2024_01"), "C05", None, Some(2)));
        let n = name("P_AF48_s12_w4.TIF");
        assert_eq!((n.well.as_str(), n.site, n.wave), ("AF48", Some(12), Some(4)));
        let n = name("X_s1_H12.tif");
        assert_eq!((n.prefix.as_deref(), n.well.as_str(), n.site, n.wave), (Some("X_s1"), "H12", None, None));
        let n = name("Plate_B07_s2_w3_t4.tif");
        assert_eq!((n.well.as_str(), n.site, n.wave, n.timepoint), ("B07", Some(2), Some(3), Some(4)));
        // a well in row W is not mistaken for a wave token
        let n = name("Plate_W01_s2.tif");
        assert_eq!((n.well.as_str(), n.site, n.wave), ("W01", Some(2), None));
    }

    #[test]
    fn prefix_less_names_with_padded_tokens_and_z() {
        let n = name("A01_s001_w1.tif");
        assert_eq!((n.prefix, n.well.as_str(), n.site, n.wave, n.z, n.timepoint), (None, "A01", Some(1), Some(1), None, None));
        let n = name("AF48_s012_w3_z004.tif");
        assert_eq!((n.prefix, n.well.as_str(), n.site, n.wave, n.z), (None, "AF48", Some(12), Some(3), Some(4)));
        // OpenHCS's "all components" names, and the tokens in the other order
        for s in ["B02_s002_w2_z003_t001.tif", "B02_s002_w2_t001_z003.tif"] {
            let n = name(s);
            assert_eq!(
                (n.prefix.is_none(), n.well.as_str(), n.site, n.wave, n.z, n.timepoint),
                (true, "B02", Some(2), Some(2), Some(3), Some(1)),
                "{s}"
            );
        }
        let n = name("C03_w2.TIF");
        assert_eq!((n.prefix, n.site, n.wave), (None, None, Some(2)));
        // a prefixed name with a z token keeps its prefix
        let n = name("My_Plate_A01_s1_w2_z3.tif");
        assert_eq!((n.prefix.as_deref(), n.well.as_str(), n.z), (Some("My_Plate"), "A01", Some(3)));
        // the well itself is still required, and must be a well
        for bad in ["s001_w1.tif", "A1_s001_w1.tif", "a01_s1_w1.tif", "A01_s1_w1_zz.tif"] {
            assert_eq!(parse_image_name(bad), None, "{bad}");
        }
    }

    #[test]
    fn non_images_are_rejected() {
        for bad in ["Plate.HTD", "Plate_A01_s1_w1.png", "notes.tif", "Plate_A1_s1.tif", "Plate_a01.tif", "A01.tif"] {
            assert_eq!(parse_image_name(bad), None, "{bad}");
        }
    }

    #[test]
    fn numbered_folders() {
        assert_eq!(numbered("TimePoint_12", "TimePoint_"), Some(12));
        assert_eq!(numbered("timepoint_3", "TimePoint_"), Some(3));
        assert_eq!(numbered("TimePoint_0", "TimePoint_"), None);
        assert_eq!(numbered("TimePoint_", "TimePoint_"), None);
        assert_eq!(numbered("TimePoinµ_1", "TimePoint_"), None); // multi-byte at the boundary
        assert_eq!(numbered("ZStep_x", "ZStep_"), None);
    }

    #[test]
    fn cp1252_description_is_decoded() {
        let s = decode_text(b"caf\xe9 \x96 5\xb5m");
        assert_eq!(s, "café – 5µm");
        assert_eq!(decode_text("naïve".as_bytes()), "naïve");
    }

    #[test]
    fn htd_site_selection_numbers_selected_cells_in_reading_order() {
        let htd = b"\"HTSInfoFile\", Version 1.0\r\n\"XWells\", 12\r\n\"YWells\", 8\r\n\"Sites\", TRUE\r\n\"XSites\", 3\r\n\"YSites\", 2\r\n\"SiteSelection1\", FALSE, TRUE, TRUE\r\n\"SiteSelection2\", TRUE, FALSE, TRUE\r\n\"EndFile\"\r\n";
        let h = parse_htd(htd, Path::new("p.HTD")).unwrap();
        let cells: Vec<(u32, u32, u32)> = h.site_cells().iter().map(|c| (c.site, c.row, c.col)).collect();
        assert_eq!(cells, [(1, 0, 1), (2, 0, 2), (3, 1, 0), (4, 1, 2)]);
    }

    #[test]
    fn absent_switches_follow_the_counts() {
        let htd = b"\"HTSInfoFile\", Version 1.0\r\n\"XWells\", 24\r\n\"YWells\", 16\r\n\"XSites\", 2\r\n\"YSites\", 2\r\n\"ZSteps\", 4\r\n\"NWavelengths\", 3\r\n\"EndFile\"\r\n";
        let h = parse_htd(htd, Path::new("p.HTD")).unwrap();
        assert!(h.sites && h.z_series && h.waves);
        assert_eq!((h.site_cells().len(), h.z_steps, h.channels()), (4, 4, vec![1, 2, 3]));
        assert!(h.has_end);
        let h = parse_htd(b"\"HTSInfoFile\", Version 1.0\r\n\"XWells\", 12\r\n\"YWells\", 8\r\n", Path::new("p.HTD")).unwrap();
        assert!(!h.sites && !h.z_series && !h.waves && !h.has_end);
    }

    #[test]
    fn malformed_records_after_the_header_are_skipped_not_fatal() {
        let htd = b"\"HTSInfoFile\", Version 1.0\r\n\"Description\", \"two\r\nlines\"\r\n\"XWells\", 12\r\n\"YWells\", 8\r\n\"Bad\" 3\r\n\"EndFile\"\r\n";
        let h = parse_htd(htd, Path::new("p.HTD")).unwrap();
        assert_eq!((h.x_wells, h.y_wells), (12, 8));
        assert_eq!(h.skipped_lines.len(), 2, "{:?}", h.skipped_lines);
        assert!(h.skipped_lines[0].starts_with("line 3:"));
    }

    #[test]
    fn garbage_htd_is_a_located_error() {
        let cases: [&[u8]; 5] = [
            b"",
            b"\x00\x01\x02garbage",
            b"\"NotHTS\", 1\r\n",
            b"\"HTSInfoFile\", Version 1.0\r\n\"XWells\", twelve\r\n\"YWells\", 8\r\n",
            b"\"HTSInfoFile\", Version 1.0\r\n\"XWells\", 12\r\n\"YWells\", 8\r\n\"Sites\", MAYBE\r\n",
        ];
        for c in cases {
            match parse_htd(c, Path::new("bad.HTD")) {
                Err(PlateError::Htd { path, .. }) => assert_eq!(path, Path::new("bad.HTD")),
                other => panic!("{:?}: expected Htd error, got {other:?}", String::from_utf8_lossy(c)),
            }
        }
    }
}
