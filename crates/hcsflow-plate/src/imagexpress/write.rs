//! Writing ImageXpress metadata: the `.HTD` descriptor ([`htd_bytes`]) and the
//! MetaSeries XML of an image's ImageDescription ([`metaseries_xml`]), the
//! inverses of what [`open`](super::open) reads.

use std::fmt::Write;

use crate::xml::xml_escape;

/// What an HTD says.
pub struct HtdSpec<'a> {
    pub description_bytes: Vec<u8>,
    pub timepoints: u32,
    pub z_steps: u32,
    pub z_projection: bool,
    pub plate_rows: u32,
    pub plate_cols: u32,
    /// Selected wells as 1-based (row, col).
    pub wells: &'a [(u32, u32)],
    pub grid_rows: u32,
    pub grid_cols: u32,
    /// Per raster cell (row-major), whether selected.
    pub site_selected: &'a [bool],
    pub sites_on: bool,
    pub wave_names: &'a [String],
    pub guid: String,
}

fn tf(b: bool) -> &'static str {
    if b {
        "TRUE"
    } else {
        "FALSE"
    }
}

/// The HTD bytes: CRLF lines, quoted keys, `"EndFile"` last.
pub fn htd_bytes(h: &HtdSpec) -> Vec<u8> {
    let mut out: Vec<u8> = b"\"HTSInfoFile\", Version 1.0\r\n".to_vec();
    // The description may hold raw Windows-1252 bytes: it is written as bytes.
    out.extend_from_slice(b"\"Description\", \"");
    out.extend_from_slice(&h.description_bytes);
    out.extend_from_slice(b"\"\r\n");
    let mut rest = String::new();
    let _ = writeln!(rest, "\"PlateType\", 6");
    let _ = writeln!(rest, "\"TimePoints\", {}", h.timepoints);
    let _ = writeln!(rest, "\"ZSeries\", {}", tf(h.z_steps > 1));
    let _ = writeln!(rest, "\"ZSteps\", {}", h.z_steps);
    let _ = writeln!(rest, "\"ZProjection\", {}", tf(h.z_projection));
    let _ = writeln!(rest, "\"XWells\", {}", h.plate_cols);
    let _ = writeln!(rest, "\"YWells\", {}", h.plate_rows);
    for r in 1..=h.plate_rows {
        let vals: Vec<&str> = (1..=h.plate_cols).map(|c| tf(h.wells.contains(&(r, c)))).collect();
        let _ = writeln!(rest, "\"WellsSelection{r}\", {}", vals.join(", "));
    }
    let _ = writeln!(rest, "\"Sites\", {}", tf(h.sites_on));
    if h.sites_on {
        let _ = writeln!(rest, "\"XSites\", {}", h.grid_cols);
        let _ = writeln!(rest, "\"YSites\", {}", h.grid_rows);
        for r in 0..h.grid_rows {
            let vals: Vec<&str> = (0..h.grid_cols).map(|c| tf(h.site_selected[(r * h.grid_cols + c) as usize])).collect();
            let _ = writeln!(rest, "\"SiteSelection{}\", {}", r + 1, vals.join(", "));
        }
    }
    let _ = writeln!(rest, "\"Waves\", {}", tf(h.wave_names.len() > 1));
    let _ = writeln!(rest, "\"NWavelengths\", {}", h.wave_names.len());
    for (i, n) in h.wave_names.iter().enumerate() {
        let _ = writeln!(rest, "\"WaveName{}\", \"{}\"", i + 1, n);
        let _ = writeln!(rest, "\"WaveCollect{}\", 1", i + 1);
    }
    let _ = writeln!(rest, "\"UniquePlateIdentifier\", \"{}\"", h.guid);
    let _ = writeln!(rest, "\"EndFile\"");
    for l in rest.lines() {
        out.extend_from_slice(l.as_bytes());
        out.extend_from_slice(b"\r\n");
    }
    out
}

/// MetaSeries XML for an ImageXpress TIFF's ImageDescription.
pub struct MetaSeries<'a> {
    pub pixel_size_um: f64,
    pub stage_x_um: f64,
    pub stage_y_um: f64,
    pub z_um: f64,
    pub wavelength_nm: u32,
    pub channel_name: &'a str,
    pub stage_label: String,
    pub width: u32,
    pub height: u32,
}

pub fn metaseries_xml(m: &MetaSeries) -> String {
    let mut s = String::from("<MetaData>\r\n");
    let mut prop = |id: &str, ty: &str, v: String| {
        let _ = write!(s, "<prop id=\"{id}\" type=\"{ty}\" value=\"{}\"/>\r\n", xml_escape(&v));
    };
    prop("Description", "string", "hcsflow synthetic plate".into());
    prop("MetaDataVersion", "float", "1".into());
    prop("ApplicationName", "string", "hcsflow-synth".into());
    prop("pixel-size-x", "int", m.width.to_string());
    prop("pixel-size-y", "int", m.height.to_string());
    prop("bits-per-pixel", "int", "16".into());
    prop("spatial-calibration-x", "float", format!("{}", m.pixel_size_um));
    prop("spatial-calibration-y", "float", format!("{}", m.pixel_size_um));
    prop("spatial-calibration-units", "string", "um".into());
    prop("stage-position-x", "float", format!("{}", m.stage_x_um));
    prop("stage-position-y", "float", format!("{}", m.stage_y_um));
    prop("z-position", "float", format!("{}", m.z_um));
    prop("wavelength", "float", m.wavelength_nm.to_string());
    prop("image-name", "string", m.channel_name.to_string());
    prop("stage-label", "string", m.stage_label.clone());
    prop("acquisition-time-local", "time", "20260101 12:00:00.000".into());
    prop("Binning", "string", "1 x 1".into());
    prop("Exposure", "string", "100 ms".into());
    s.push_str("</MetaData>\r\n");
    s
}
