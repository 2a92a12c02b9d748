//! Writing Harmony metadata: the index XML ([`harmony_index`]) that
//! [`open`](super::open) reads, and the Harmony XML of an image's TIFF tag
//! 65500 ([`tiff_tag_xml`]).

use std::fmt::Write;

use crate::xml::xml_escape;

/// The Harmony XML that an image's TIFF tag 65500 holds: the channel name.
pub fn tiff_tag_xml(channel_name: &str) -> String {
    format!(
        "<?xml version=\"1.0\" encoding=\"utf-8\"?><Harmony xmlns=\"http://www.perkinelmer.com/PEHH/HarmonyV5\"><Image><ChannelName>{}</ChannelName></Image></Harmony>",
        xml_escape(channel_name)
    )
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
