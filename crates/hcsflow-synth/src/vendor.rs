//! The vendor metadata text: ImageXpress HTD and MetaSeries XML, Harmony index XML.

use std::fmt::Write;

/// Escapes text for an XML attribute or element.
pub fn xml_escape(s: &str) -> String {
    let mut out = String::with_capacity(s.len());
    for ch in s.chars() {
        match ch {
            '&' => out.push_str("&amp;"),
            '<' => out.push_str("&lt;"),
            '>' => out.push_str("&gt;"),
            '"' => out.push_str("&quot;"),
            '\'' => out.push_str("&apos;"),
            _ => out.push(ch),
        }
    }
    out
}

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

/// One Image element of the Harmony index.
pub struct IndexImage<'a> {
    pub url: String,
    pub row: u32,
    pub col: u32,
    pub field: u32,
    pub plane: u32,
    /// 0-based.
    pub timepoint: u32,
    pub channel: u32,
    pub channel_name: &'a str,
    pub resolution_m: f64,
    pub size: u32,
    pub pos_x_m: f64,
    pub pos_y_m: f64,
    pub pos_z_m: f64,
    pub emission_nm: u32,
    pub time_offset_s: f64,
}

impl IndexImage<'_> {
    pub fn id(&self) -> String {
        format!("{:02}{:02}K{}F{}P{}R{}", self.row, self.col, self.timepoint + 1, self.field, self.plane, self.channel)
    }
}

/// The index XML document (without BOM).
pub fn harmony_index(plate_name: &str, v6: bool, plate_rows: u32, plate_cols: u32, wells: &[(u32, u32)], images: &[IndexImage]) -> String {
    let ns = if v6 { "http://www.perkinelmer.com/PEHH/HarmonyV6" } else { "http://www.perkinelmer.com/PEHH/HarmonyV5" };
    let mut s = String::new();
    let _ = writeln!(s, "<?xml version=\"1.0\" encoding=\"utf-8\"?>");
    let _ = writeln!(s, "<EvaluationInputData xmlns:xsd=\"http://www.w3.org/2001/XMLSchema\" xmlns:xsi=\"http://www.w3.org/2001/XMLSchema-instance\" Version=\"1\" xmlns=\"{ns}\">");
    let _ = writeln!(s, "  <User>hcsflow</User>\n  <InstrumentType>Phenix</InstrumentType>");
    let _ = writeln!(s, "  <Plates>\n    <Plate>");
    let _ = writeln!(s, "      <PlateID>{}</PlateID>\n      <MeasurementID>synthetic</MeasurementID>", xml_escape(plate_name));
    let _ = writeln!(s, "      <MeasurementStartTime>2026-01-01T12:00:00.000+00:00</MeasurementStartTime>");
    let _ = writeln!(
        s,
        "      <Name>{}</Name>\n      <PlateTypeName>{} well plate</PlateTypeName>",
        xml_escape(plate_name),
        plate_rows * plate_cols
    );
    let _ = writeln!(s, "      <PlateRows>{plate_rows}</PlateRows>\n      <PlateColumns>{plate_cols}</PlateColumns>");
    for (r, c) in wells {
        let _ = writeln!(s, "      <Well id=\"{r:02}{c:02}\" />");
    }
    let _ = writeln!(s, "    </Plate>\n  </Plates>\n  <Wells>");
    // group once: a full 1536-well plate has hundreds of thousands of images
    let mut by_well: std::collections::BTreeMap<(u32, u32), Vec<&IndexImage>> = std::collections::BTreeMap::new();
    for img in images {
        by_well.entry((img.row, img.col)).or_default().push(img);
    }
    for (r, c) in wells {
        let _ = writeln!(s, "    <Well>\n      <id>{r:02}{c:02}</id>\n      <Row>{r}</Row>\n      <Col>{c}</Col>");
        for img in by_well.get(&(*r, *c)).map(Vec::as_slice).unwrap_or(&[]) {
            let _ = writeln!(s, "      <Image id=\"{}\" />", img.id());
        }
        let _ = writeln!(s, "    </Well>");
    }
    let _ = writeln!(s, "  </Wells>\n  <Images>");
    for i in images {
        let _ = writeln!(s, "    <Image Version=\"1\">");
        let _ = writeln!(s, "      <id>{}</id>\n      <State>Ok</State>\n      <URL>{}</URL>", i.id(), xml_escape(&i.url));
        let _ = writeln!(
            s,
            "      <Row>{}</Row>\n      <Col>{}</Col>\n      <FieldID>{}</FieldID>\n      <PlaneID>{}</PlaneID>",
            i.row, i.col, i.field, i.plane
        );
        let _ = writeln!(
            s,
            "      <TimepointID>{}</TimepointID>\n      <ChannelID>{}</ChannelID>\n      <FlimID>1</FlimID>",
            i.timepoint, i.channel
        );
        let _ = writeln!(s, "      <ChannelName>{}</ChannelName>\n      <ImageType>Signal</ImageType>\n      <AcquisitionType>NipkowConfocal</AcquisitionType>", xml_escape(i.channel_name));
        let _ = writeln!(s, "      <IlluminationType>Epifluorescence</IlluminationType>\n      <ChannelType>Fluorescence</ChannelType>");
        let _ = writeln!(
            s,
            "      <ImageResolutionX Unit=\"m\">{:E}</ImageResolutionX>\n      <ImageResolutionY Unit=\"m\">{:E}</ImageResolutionY>",
            i.resolution_m, i.resolution_m
        );
        let _ = writeln!(s, "      <ImageSizeX>{}</ImageSizeX>\n      <ImageSizeY>{}</ImageSizeY>\n      <BinningX>1</BinningX>\n      <BinningY>1</BinningY>", i.size, i.size);
        let _ = writeln!(s, "      <MaxIntensity>65535</MaxIntensity>\n      <CameraType>AndorZylaCam</CameraType>");
        let _ =
            writeln!(s, "      <PositionX Unit=\"m\">{:E}</PositionX>\n      <PositionY Unit=\"m\">{:E}</PositionY>", i.pos_x_m, i.pos_y_m);
        let _ = writeln!(
            s,
            "      <PositionZ Unit=\"m\">{:E}</PositionZ>\n      <AbsPositionZ Unit=\"m\">{:E}</AbsPositionZ>",
            i.pos_z_m,
            i.pos_z_m + 0.0135
        );
        let _ = writeln!(
            s,
            "      <MeasurementTimeOffset Unit=\"s\">{}</MeasurementTimeOffset>\n      <AbsTime>2026-01-01T12:00:00.000+00:00</AbsTime>",
            i.time_offset_s
        );
        let _ = writeln!(s, "      <MainExcitationWavelength Unit=\"nm\">{}</MainExcitationWavelength>\n      <MainEmissionWavelength Unit=\"nm\">{}</MainEmissionWavelength>", i.emission_nm.saturating_sub(80), i.emission_nm);
        let _ = writeln!(s, "      <ObjectiveMagnification Unit=\"\">20</ObjectiveMagnification>\n      <ObjectiveNA Unit=\"\">0.8</ObjectiveNA>\n      <ExposureTime Unit=\"s\">0.1</ExposureTime>");
        let _ = writeln!(s, "      <OrientationMatrix>[[1,0,0,0],[0,-1,0,0],[0,0,1,0]]</OrientationMatrix>\n    </Image>");
    }
    let _ = writeln!(s, "  </Images>\n</EvaluationInputData>");
    s
}
