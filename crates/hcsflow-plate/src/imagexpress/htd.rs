//! The `.HTD` descriptor: what it says ([`HtdInfo`]) and how it is parsed ([`parse_htd`]).

use std::collections::BTreeMap;
use std::path::Path;

use crate::well::well_name;
use crate::{PlateError, SiteCell};

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
    let r = Records::read(&decode_text(bytes), path)?;
    let x_wells = r.num("XWells", 0)?;
    let y_wells = r.num("YWells", 0)?;
    if x_wells == 0 || y_wells == 0 {
        return Err(r.bad(0, "XWells and YWells (plate columns and rows) are required and must be positive".into()));
    }
    // When an on/off key is absent, the counts decide (some exporters omit them).
    let sites = r.boolean("Sites", u64::from(r.num("XSites", 1)?.max(1)) * u64::from(r.num("YSites", 1)?.max(1)) > 1)?;
    let (x_sites, y_sites) = if sites { (r.num("XSites", 1)?.max(1), r.num("YSites", 1)?.max(1)) } else { (1, 1) };
    let z_series = r.boolean("ZSeries", r.num("ZSteps", 1)? > 1)?;
    let n_wavelengths = r.num("NWavelengths", 1)?.max(1);
    let waves = r.boolean("Waves", n_wavelengths > 1)?;
    let mut wave_names = BTreeMap::new();
    let mut wave_collect = BTreeMap::new();
    let declared_waves = if waves { n_wavelengths } else { 1 };
    for (w, (_, v)) in r.numbered_keys("WaveName") {
        if let (true, Some(n)) = (w <= declared_waves, v.first()) {
            wave_names.insert(w, n.to_string());
        }
    }
    for (w, _) in r.numbered_keys("WaveCollect") {
        if w <= declared_waves {
            wave_collect.insert(w, r.num(&format!("WaveCollect{w}"), 1)? != 0);
        }
    }
    Ok(HtdInfo {
        description: r.get("Description").map(str::to_string),
        timepoints: r.num("TimePoints", 1)?.max(1),
        z_series,
        z_steps: if z_series { r.num("ZSteps", 1)?.max(1) } else { 1 },
        z_projection: r.boolean("ZProjection", false)?,
        x_wells,
        y_wells,
        wells_selection: r.selection("WellsSelection", y_wells, x_wells)?,
        sites,
        x_sites,
        y_sites,
        site_selection: if sites { r.selection("SiteSelection", y_sites, x_sites)? } else { None },
        waves,
        n_wavelengths: if waves { n_wavelengths } else { 1 },
        wave_names,
        wave_collect,
        unique_id: r.get("UniquePlateIdentifier").map(str::to_string),
        has_end: r.has_end,
        skipped_lines: r.skipped,
    })
}

/// The records of an HTD file, by key: the line and the values.
struct Records<'p> {
    path: &'p Path,
    entries: BTreeMap<String, (usize, Vec<String>)>,
    /// Whether an `"EndFile"` record was found.
    has_end: bool,
    /// Records skipped as malformed ("line N: why").
    skipped: Vec<String>,
}

impl<'p> Records<'p> {
    /// Reads the records of `text` up to `"EndFile"`. A malformed record is
    /// fatal on the first line (the file is not an HTD at all) and skipped
    /// with a note afterwards (a multi-line Description must not make a plate
    /// unreadable); the first record must be `"HTSInfoFile"`.
    fn read(text: &str, path: &'p Path) -> Result<Self, PlateError> {
        let mut r = Records { path, entries: BTreeMap::new(), has_end: false, skipped: Vec::new() };
        let mut first = true;
        for (i, raw) in text.split('\n').enumerate() {
            let lineno = i + 1;
            let line = raw.trim_end_matches('\r').trim();
            if line.is_empty() {
                continue;
            }
            let (key, values) = match parse_record(line) {
                Ok(rec) => rec,
                Err(m) if first => return Err(r.bad(lineno, m)),
                Err(m) => {
                    r.skipped.push(format!("line {lineno}: {m}"));
                    continue;
                }
            };
            if first {
                if key != "HTSInfoFile" {
                    return Err(r.bad(lineno, format!("first record must be \"HTSInfoFile\", found {key:?}")));
                }
                first = false;
                continue;
            }
            if key == "EndFile" {
                r.has_end = true;
                break;
            }
            r.entries.insert(key, (lineno, values));
        }
        if first {
            return Err(r.bad(1, "empty file (no \"HTSInfoFile\" record)".into()));
        }
        Ok(r)
    }

    fn bad(&self, line: usize, message: String) -> PlateError {
        PlateError::Htd { path: self.path.to_path_buf(), line, message }
    }

    /// The first value of `k`.
    fn get(&self, k: &str) -> Option<&str> {
        self.entries.get(k).and_then(|(_, v)| v.first()).map(String::as_str)
    }

    /// `k` as a non-negative integer, `default` when absent.
    fn num(&self, k: &str, default: u32) -> Result<u32, PlateError> {
        match self.entries.get(k) {
            None => Ok(default),
            Some((line, v)) => v
                .first()
                .and_then(|s| s.parse::<u32>().ok())
                .ok_or_else(|| self.bad(*line, format!("{k} must be a non-negative integer, found {v:?}"))),
        }
    }

    /// `k` as TRUE/FALSE, `default` when absent.
    fn boolean(&self, k: &str, default: bool) -> Result<bool, PlateError> {
        match self.entries.get(k) {
            None => Ok(default),
            Some((line, v)) => parse_bool(v.first().map(String::as_str).unwrap_or(""))
                .ok_or_else(|| self.bad(*line, format!("{k} must be TRUE or FALSE, found {v:?}"))),
        }
    }

    /// Keys `<prefix><n>` present in the file, with n parsed: loops over what
    /// the file holds, never over a count it declares (a corrupt count must
    /// not turn into billions of iterations or allocations).
    fn numbered_keys(&self, prefix: &str) -> Vec<(u32, &(usize, Vec<String>))> {
        self.entries
            .range(prefix.to_string()..)
            .take_while(|(k, _)| k.starts_with(prefix))
            .filter_map(|(k, v)| Some((k[prefix.len()..].parse::<u32>().ok().filter(|n| *n > 0)?, v)))
            .collect()
    }

    /// The `<prefix><r>` TRUE/FALSE rows for `r` in `1..=rows`, each of
    /// `cols` values; `None` when there is no `<prefix>1`.
    fn selection(&self, prefix: &str, rows: u32, cols: u32) -> Result<Option<BTreeMap<u32, Vec<bool>>>, PlateError> {
        if !self.entries.contains_key(&format!("{prefix}1")) {
            return Ok(None);
        }
        let mut out = BTreeMap::new();
        for (r, (line, v)) in self.numbered_keys(prefix) {
            if r > rows {
                continue;
            }
            let row: Option<Vec<bool>> = v.iter().map(|s| parse_bool(s)).collect();
            let row = row.ok_or_else(|| self.bad(*line, format!("{prefix}{r}: values must be TRUE or FALSE")))?;
            if row.len() != cols as usize {
                return Err(self.bad(*line, format!("{prefix}{r} has {} values, expected {cols}", row.len())));
            }
            out.insert(r, row);
        }
        Ok(Some(out))
    }
}

/// One record line: the quoted key and its values.
fn parse_record(line: &str) -> Result<(String, Vec<String>), String> {
    let after = line.strip_prefix('"').ok_or_else(|| format!("expected a line starting with a quoted key, found {:?}", clip(line)))?;
    let end = after.find('"').ok_or_else(|| "unterminated quoted key".to_string())?;
    let key = &after[..end];
    let rest = after[end + 1..].trim_start();
    let values = match rest.strip_prefix(',') {
        Some(v) => split_values(v),
        None if rest.is_empty() => Vec::new(),
        None => return Err(format!("expected ',' after key {key:?}")),
    };
    Ok((key.to_string(), values))
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

#[cfg(test)]
mod tests {
    use super::*;

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
