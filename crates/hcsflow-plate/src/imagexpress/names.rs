//! ImageXpress file and folder names, both directions: [`parse_image_name`]
//! reads one, [`ImageName::stem`] and the `*_name`/`*_folder` functions write one.

use crate::well::parse_well;

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

impl ImageName {
    /// The file stem these components make, the inverse of
    /// [`parse_image_name`] for names without GUID or thumbnail marker:
    /// `[prefix_]WELL[_sS][_wW][_zZ][_tT]`, numbers unpadded.
    pub fn stem(&self) -> String {
        let mut s = match &self.prefix {
            Some(p) => format!("{p}_{}", self.well),
            None => self.well.clone(),
        };
        for (marker, n) in [('s', self.site), ('w', self.wave), ('z', self.z), ('t', self.timepoint)] {
            if let Some(n) = n {
                s.push_str(&format!("_{marker}{n}"));
            }
        }
        s
    }
}

/// How a GUID follows the stem of an image file name (MetaXpress writes
/// either; [`parse_image_name`] reads both).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum GuidSuffix<'a> {
    /// No GUID.
    None,
    /// Directly after the stem: `Plate_A01_s1_w1<GUID>`.
    Bare(&'a str),
    /// After an underscore, in brackets: `Plate_A01_s1_w1_[<GUID>]`.
    Bracketed(&'a str),
}

/// The file name of an image: `stem`, then the GUID as `guid` says, then `.ext`.
pub fn image_file_name(stem: &str, guid: GuidSuffix, ext: &str) -> String {
    match guid {
        GuidSuffix::None => format!("{stem}.{ext}"),
        GuidSuffix::Bare(g) => format!("{stem}{g}.{ext}"),
        GuidSuffix::Bracketed(g) => format!("{stem}_[{g}].{ext}"),
    }
}

/// The file name of the thumbnail of the image with this stem: `stem_thumb<GUID>.ext`
/// (what [`parse_image_name`] flags as [`ImageName::thumb`]).
pub fn thumbnail_file_name(stem: &str, guid: &str, ext: &str) -> String {
    format!("{stem}_thumb{guid}.{ext}")
}

/// The name of the `.HTD` descriptor of the plate `plate_name`.
pub fn htd_file_name(plate_name: &str) -> String {
    format!("{plate_name}.HTD")
}

/// Prefix of the time point folders, `TimePoint_<t>` (read case-insensitively).
pub const TIMEPOINT_FOLDER: &str = "TimePoint_";
/// Prefix of the z step folders, `ZStep_<z>` (read case-insensitively).
pub const ZSTEP_FOLDER: &str = "ZStep_";

/// The folder, relative to the plate, of the images of time point `t` and
/// (`Some`) z step `z` in the time point layout: `TimePoint_<t>/ZStep_<z>`,
/// or `TimePoint_<t>` for `None` (single planes, and z projections beside
/// the z step folders).
pub fn plane_folder(t: u32, z: Option<u32>) -> std::path::PathBuf {
    let tdir = std::path::PathBuf::from(format!("{TIMEPOINT_FOLDER}{t}"));
    match z {
        Some(z) => tdir.join(format!("{ZSTEP_FOLDER}{z}")),
        None => tdir,
    }
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
/// the caller's decision ([`open`](super::open) refuses the mix).
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

/// Index of a numbered folder like `TimePoint_3` (case-insensitive prefix), from 1.
pub(crate) fn numbered(name: &str, prefix: &str) -> Option<u32> {
    numbered_from_zero(name, prefix).filter(|n| *n > 0)
}

/// [`numbered`], with 0 allowed (`ZStep_0`, a MetaXpress export's projection folder).
pub(crate) fn numbered_from_zero(name: &str, prefix: &str) -> Option<u32> {
    let head = name.get(..prefix.len())?;
    if !head.eq_ignore_ascii_case(prefix) {
        return None;
    }
    name.get(prefix.len()..)?.parse().ok()
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
    fn written_names_parse_back() {
        let n = ImageName {
            prefix: Some("My_Plate".into()),
            well: "B07".into(),
            site: Some(12),
            wave: Some(3),
            timepoint: None,
            z: None,
            thumb: false,
            guid: None,
        };
        assert_eq!(n.stem(), "My_Plate_B07_s12_w3");
        let g = "0F1E2D3C-4B5A-6978-8796-A5B4C3D2E1F0";
        for (file, guid) in [
            (image_file_name(&n.stem(), GuidSuffix::None, "tif"), None),
            (image_file_name(&n.stem(), GuidSuffix::Bare(g), "TIF"), Some(g)),
            (image_file_name(&n.stem(), GuidSuffix::Bracketed(g), "tif"), Some(g)),
        ] {
            assert_eq!(name(&file), ImageName { guid: guid.map(str::to_string), ..n.clone() }, "{file}");
        }
        assert_eq!(image_file_name("P_A01", GuidSuffix::Bracketed(g), "tif"), format!("P_A01_[{g}].tif"));
        let thumb = name(&thumbnail_file_name(&n.stem(), g, "tif"));
        assert!(thumb.thumb && thumb.site == Some(12) && thumb.wave == Some(3));
        let bare = ImageName {
            prefix: None,
            well: "A01".into(),
            site: Some(2),
            wave: Some(1),
            timepoint: Some(4),
            z: Some(3),
            thumb: false,
            guid: None,
        };
        assert_eq!(bare.stem(), "A01_s2_w1_z3_t4");
        assert_eq!(name(&format!("{}.tif", bare.stem())), bare);
        assert_eq!(plane_folder(2, Some(3)), std::path::Path::new("TimePoint_2/ZStep_3"));
        assert_eq!(plane_folder(1, None), std::path::Path::new("TimePoint_1"));
        assert_eq!(numbered(&format!("{TIMEPOINT_FOLDER}7"), "TimePoint_"), Some(7));
    }
}
