//! The description of a plate to write: layout, field shape, dtype, physical
//! sizes and on-disk format choices.

use hcsflow_core::DType;
use serde::{Deserialize, Serialize};

use crate::error::ZarrError;

/// Which OME-NGFF / Zarr format to write.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, Serialize, Deserialize)]
pub enum NgffVersion {
    /// NGFF 0.5 on Zarr v3 (`zarr.json`, metadata under `attributes.ome`). The default:
    /// current zarr-python, ome-zarr-py and napari read it.
    #[default]
    V05,
    /// NGFF 0.4 on Zarr v2 (`.zgroup`/`.zattrs`/`.zarray`, `/` chunk separator), for
    /// readers that predate Zarr v3 (older Fiji/MoBIE, zarr-python 2).
    V04,
}

impl NgffVersion {
    /// `"0.5"` or `"0.4"`, as written in the metadata.
    pub fn as_str(self) -> &'static str {
        match self {
            NgffVersion::V05 => "0.5",
            NgffVersion::V04 => "0.4",
        }
    }
}

impl std::fmt::Display for NgffVersion {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(self.as_str())
    }
}

impl std::str::FromStr for NgffVersion {
    type Err = ZarrError;

    /// `"0.5"` or `"0.4"` (what `hcsflow run --zarr-format` takes).
    fn from_str(s: &str) -> Result<Self, Self::Err> {
        match s.trim() {
            "0.5" => Ok(NgffVersion::V05),
            "0.4" => Ok(NgffVersion::V04),
            other => Err(ZarrError::InvalidSpec(format!(
                "unknown OME-NGFF version '{other}': expected 0.5 (Zarr v3, the default) or 0.4 (Zarr v2)"
            ))),
        }
    }
}

/// Chunk compression.
///
/// Blosc is not offered: zarrs' blosc codec builds the C library, and zstd alone
/// already compresses microscopy planes well at a fraction of the CPU.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
pub enum ZarrCompression {
    /// Raw little-endian bytes (fastest writes, largest files).
    None,
    /// zstd at the given level (1..=22). Zarr v3: the core `zstd` codec; Zarr v2:
    /// numcodecs `{"id": "zstd", "level": N}`.
    Zstd(i32),
}

impl Default for ZarrCompression {
    /// zstd level 1: on noisy 16-bit microscopy planes it writes ~4× faster than
    /// level 3 for files ~14 % larger (`examples/bench_write.rs`: 2048² u16,
    /// 202 vs 51 MB/s, 61 vs 54 MB on disk for 75 MB of pixels), and the writer
    /// must keep up with a pipeline targeting ≥ 100 MB/s.
    fn default() -> Self {
        ZarrCompression::Zstd(1)
    }
}

/// Shape of every field image: `(t, c, z, y, x)`, all ≥ 1. With
/// [`FieldExtent::Grow`], `y` and `x` are the chunk size and the fields' extent
/// comes from the planes written.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, Serialize, Deserialize)]
pub struct FieldShape {
    pub t: usize,
    pub c: usize,
    pub z: usize,
    pub y: usize,
    pub x: usize,
}

impl FieldShape {
    /// `[t, c, z, y, x]`.
    pub fn as_array(&self) -> [usize; 5] {
        [self.t, self.c, self.z, self.y, self.x]
    }
}

/// How the y × x extent of the field images is decided.
///
/// NGFF 0.4 and 0.5 put no constraint on the shapes of a plate's images: each
/// field is its own multiscale image, and the well and plate metadata only list
/// paths. Readers that draw the whole plate (ome-zarr-py's plate node, which
/// napari shows) tile it with the first well's first field, so every field
/// should still have one shape: with [`FieldExtent::Grow`], `finish` gives them
/// the largest one.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum FieldExtent {
    /// Every plane is exactly `shape.y × shape.x`, one chunk per plane.
    #[default]
    Fixed,
    /// Planes of any y × x (e.g. a whole-well mosaic per well, whose size is
    /// known only once the well's tiles are registered). A field grows to hold
    /// the largest plane written to it, and
    /// [`update_metadata`](crate::PlateWriter::update_metadata) grows every
    /// field of the plate to the largest field, so that all share one shape.
    /// A plane smaller than its field is padded with the fill value (0) at the
    /// bottom and right, on every pyramid level (level k holds the 2^k block
    /// means of the plane itself, padded; see the pyramid rule below).
    /// `shape.y × shape.x` is then the chunk size (`ceil(n / 2^k)` on level k),
    /// so growing an array only rewrites its metadata.
    Grow,
}

/// Everything needed to lay out an OME-Zarr HCS plate.
///
/// **Naming.** `rows` are letters (`"A"`..`"P"`, `"AA"`.. on 1536-well plates);
/// `columns` are the plate's column numbers **without zero padding** (`"1"`..`"24"`),
/// which is what the NGFF spec examples, IDR plates, ome-zarr-py and napari show.
/// `wells` are names such as `"A01"`, `"A1"` or `"a01"`: letters then digits; the
/// digits are matched numerically against `columns`, so `"A01"` is stored at path
/// `A/1` (row `A`, column `1`). The same forms are accepted by
/// [`PlateWriter::write_plane`](crate::PlateWriter::write_plane).
///
/// **Pyramid.** `pyramid_levels` counts level 0 (full resolution): 3 gives
/// full, ½ and ¼ in y and x. Each level is the 2×2 block mean of the one above
/// (computed exactly from level-0 sums; integers rounded half to even; odd edges
/// average the pixels that exist, so level sizes are `ceil(n / 2^k)`). t, c and z
/// are never downsampled.
///
/// **Physical sizes.** `pixel_size_um` is `(y, x)` in µm. Unknown sizes are
/// written as scale 1 without a unit (saying "1 micrometer" would be wrong).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct PlateSpec {
    /// Plate name (NGFF `plate.name`, also the multiscale image names' prefix).
    pub name: String,
    pub rows: Vec<String>,
    pub columns: Vec<String>,
    pub wells: Vec<String>,
    pub fields_per_well: usize,
    /// One name per channel (`shape.c` of them), shown as channel labels.
    pub channel_names: Vec<String>,
    pub pixel_size_um: Option<(f64, f64)>,
    pub z_step_um: Option<f64>,
    pub dtype: DType,
    pub shape: FieldShape,
    pub pyramid_levels: usize,
    pub version: NgffVersion,
    pub compression: ZarrCompression,
    /// `Fixed` when absent (plates written before this field existed).
    #[serde(default)]
    pub extent: FieldExtent,
    /// Where fields are on the stage (e.g. the plate's stage positions), in
    /// µm. A field listed here gets an NGFF `translation` after its `scale`
    /// on every level (level k also shifted by (2^k − 1)/2 pixels, the
    /// centre of its 2^k block), so viewers place the fields as imaged and
    /// readers recover the positions. Needs `pixel_size_um` (a translation in
    /// µm of axes without a unit would mean nothing); ignored without it.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub field_positions_um: Vec<FieldPosition>,
}

/// The stage position of one field of one well (level-0 top-left pixel), in µm.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct FieldPosition {
    /// A well of [`PlateSpec::wells`], as named there.
    pub well: String,
    /// 0-based field.
    pub field: usize,
    pub y_um: f64,
    pub x_um: f64,
}

impl Default for PlateSpec {
    /// An empty plate with the documented defaults (3 pyramid levels, NGFF 0.5,
    /// zstd level 1, u16); fill in layout, shape and channels before use.
    fn default() -> Self {
        PlateSpec {
            name: String::new(),
            rows: Vec::new(),
            columns: Vec::new(),
            wells: Vec::new(),
            fields_per_well: 1,
            channel_names: Vec::new(),
            pixel_size_um: None,
            z_step_um: None,
            dtype: DType::U16,
            shape: FieldShape::default(),
            pyramid_levels: 3,
            version: NgffVersion::V05,
            compression: ZarrCompression::default(),
            extent: FieldExtent::Fixed,
            field_positions_um: Vec::new(),
        }
    }
}

/// Position of a well in the plate grid.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub(crate) struct WellPos {
    pub row: usize,
    pub col: usize,
}

/// Splits `"A01"`/`"a1"`/`"AF48"` into (`"A"`, 1). `None` if not letters+digits.
pub(crate) fn split_well_name(well: &str) -> Option<(String, u64)> {
    let split = well.find(|ch: char| ch.is_ascii_digit())?;
    let (letters, digits) = well.split_at(split);
    if letters.is_empty() || !letters.chars().all(|ch| ch.is_ascii_alphabetic()) || !digits.chars().all(|ch| ch.is_ascii_digit()) {
        return None;
    }
    Some((letters.to_ascii_uppercase(), digits.parse().ok()?))
}

/// Level-`k` size of a `(y, x)` plane: `ceil(n / 2^k)` per axis.
pub(crate) fn level_of((y, x): (usize, usize), level: usize) -> (usize, usize) {
    let d = 1usize << level.min(usize::BITS as usize - 1);
    (y.div_ceil(d), x.div_ceil(d))
}

fn path_safe(s: &str) -> bool {
    !s.is_empty() && s.chars().all(|ch| ch.is_ascii_alphanumeric())
}

impl PlateSpec {
    /// Level-`k` (y, x) size of a `shape.y × shape.x` field: `ceil(n / 2^k)`.
    pub fn level_yx(&self, level: usize) -> (usize, usize) {
        level_of((self.shape.y, self.shape.x), level)
    }

    /// Finds the grid position of a well name (see the type docs for the forms).
    pub(crate) fn locate(&self, well: &str) -> Option<WellPos> {
        let (letters, number) = split_well_name(well)?;
        let row = self.rows.iter().position(|r| r.eq_ignore_ascii_case(&letters))?;
        let col = self.columns.iter().position(|c| c.parse::<u64>().ok() == Some(number))?;
        Some(WellPos { row, col })
    }

    /// Checks everything a reader would trip over later; called by `create`.
    pub fn validate(&self) -> Result<(), ZarrError> {
        let bad = |m: String| Err(ZarrError::InvalidSpec(m));
        if self.rows.is_empty() || self.columns.is_empty() {
            return bad("rows and columns must not be empty".into());
        }
        for (what, names) in [("row", &self.rows), ("column", &self.columns)] {
            for (i, n) in names.iter().enumerate() {
                if !path_safe(n) {
                    return bad(format!("{what} name '{n}' must be ASCII letters/digits (it is a path)"));
                }
                if names[..i].iter().any(|m| m.eq_ignore_ascii_case(n)) {
                    return bad(format!("duplicate {what} name '{n}'"));
                }
            }
        }
        for r in &self.rows {
            if !r.chars().all(|ch| ch.is_ascii_alphabetic()) {
                return bad(format!("row name '{r}' must be letters (A..P, AA..AF)"));
            }
        }
        for c in &self.columns {
            match c.parse::<u64>() {
                Ok(n) if n.to_string() == *c => {}
                _ => return bad(format!("column name '{c}' must be a number without zero padding (\"1\"..\"24\")")),
            }
        }
        if self.wells.is_empty() {
            return bad("no wells".into());
        }
        let mut seen = Vec::with_capacity(self.wells.len());
        for w in &self.wells {
            let Some(pos) = self.locate(w) else {
                return bad(format!("well '{w}' is not in the plate grid (rows {:?}, columns {:?})", self.rows, self.columns));
            };
            if seen.contains(&pos) {
                return bad(format!("well '{w}' listed twice"));
            }
            seen.push(pos);
        }
        if self.fields_per_well == 0 {
            return bad("fields_per_well must be ≥ 1".into());
        }
        let s = self.shape;
        if s.as_array().contains(&0) {
            return bad(format!("every dimension of shape must be ≥ 1, got {s:?}"));
        }
        if self.channel_names.len() != s.c {
            return bad(format!("{} channel names for {} channels", self.channel_names.len(), s.c));
        }
        if self.pyramid_levels == 0 || self.pyramid_levels > 16 {
            return bad(format!("pyramid_levels must be 1..=16, got {}", self.pyramid_levels));
        }
        if let Some((y, x)) = self.pixel_size_um {
            if !(y.is_finite() && y > 0.0 && x.is_finite() && x > 0.0) {
                return bad(format!("pixel_size_um must be finite and > 0, got ({y}, {x})"));
            }
        }
        if let Some(z) = self.z_step_um {
            if !(z.is_finite() && z > 0.0) {
                return bad(format!("z_step_um must be finite and > 0, got {z}"));
            }
        }
        if let ZarrCompression::Zstd(level) = self.compression {
            if !(1..=22).contains(&level) {
                return bad(format!("zstd level must be 1..=22, got {level}"));
            }
        }
        Ok(())
    }
}
