//! Reading OME-Zarr HCS plates: NGFF 0.4 (Zarr v2) and 0.5 (Zarr v3), written
//! by hcsflow, ome-zarr-py, Fractal or any other NGFF writer.
//!
//! [`ZarrPlate::open`] reads the metadata only: the plate's rows, columns and
//! wells (`plate`), each well's fields (`well.images`) and each field's
//! multiscale image (`multiscales[0]`: axes, level-0 dataset, its scale and
//! translation; `omero.channels` labels), and opens every field's level-0
//! array to learn its shape and data type. [`read_plane`] then reads one
//! `y × x` plane of such an array.
//!
//! Spec points this follows (NGFF 0.4 §§ "axes", "multiscales", "plate",
//! "well"; 0.5 moves the same objects under the `ome` attribute of `zarr.json`):
//! - axes are 2 to 5, at most one `time` and one `channel` axis, then 2 or 3
//!   `space` axes, the last two being y and x; NGFF ≤ 0.3 images, without
//!   `axes`, are `t, c, z, y, x`;
//! - a dataset's `coordinateTransformations` are one `scale` and at most one
//!   `translation`; the multiscale's own transformations apply after them;
//! - a space axis' `unit` names the physical unit of its scale; a scale
//!   without a unit is not a physical size.
//!
//! What is wrong with a field (a group the well lists but that is absent, a
//! dataset that is not an array, a data type hcsflow does not process) is a
//! warning naming the path, and the field is left out: a plate with one bad
//! field is still a plate. What is wrong with the plate itself is a
//! [`ZarrError`].

use std::path::{Path, PathBuf};
use std::sync::Arc;

use hcsflow_core::{DType, Pixel, Stack};
use ndarray::Array3;
use serde_json::{Map, Value};
use zarrs::array::{data_type, Array, ArraySubset, ElementOwned};
use zarrs::filesystem::FilesystemStore;

use crate::error::ZarrError;
use crate::metadata::read_group_attributes;
use crate::spec::NgffVersion;

/// The kind of an image axis (NGFF `axes[].type`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum AxisKind {
    Time,
    Channel,
    Space,
    /// A type the spec leaves open (or none given on a non-spatial axis).
    Other,
}

/// One axis of a field image, in array order.
#[derive(Debug, Clone, PartialEq)]
pub struct Axis {
    pub name: String,
    pub kind: AxisKind,
    /// The physical unit of the axis' scale, as written (`micrometer`, …).
    pub unit: Option<String>,
}

/// One field (site) of a well: its multiscale image at full resolution.
#[derive(Debug, Clone, PartialEq)]
pub struct ZarrField {
    /// 0-based position of the field in its well's `images` list.
    pub index: usize,
    /// The field group, relative to the plate root (`A/1/0`).
    pub path: String,
    /// The level-0 array, relative to the plate root (`A/1/0/0`).
    pub array: String,
    pub axes: Vec<Axis>,
    /// Level-0 array shape, one size per axis.
    pub shape: Vec<u64>,
    pub dtype: DType,
    /// Level-0 scale per axis (dataset scale × multiscale scale).
    pub scale: Vec<f64>,
    /// Level-0 translation per axis (zeros when none is given).
    pub translation: Vec<f64>,
    /// `omero.channels[].label`, when present.
    pub channel_labels: Vec<String>,
}

impl ZarrField {
    /// The index of the axis named `name` (`t`, `c`, `z`, `y`, `x`).
    pub fn axis(&self, name: &str) -> Option<usize> {
        self.axes.iter().position(|a| a.name.eq_ignore_ascii_case(name))
    }

    /// The size along the axis `name`, 1 when the image has no such axis.
    pub fn size(&self, name: &str) -> u64 {
        self.axis(name).map_or(1, |i| self.shape[i])
    }

    /// Plane height and width (the last two axes).
    pub fn plane_size(&self) -> (u64, u64) {
        let n = self.shape.len();
        (self.shape[n - 2], self.shape[n - 1])
    }

    /// The array index of the plane at 0-based `t`, `c`, `z` (y and x 0):
    /// what [`read_plane`] takes. Components the image has no axis for must be 0.
    pub fn plane_index(&self, t: u64, c: u64, z: u64) -> Vec<u64> {
        let mut index = vec![0; self.shape.len()];
        for (name, v) in [("t", t), ("c", c), ("z", z)] {
            if let Some(i) = self.axis(name) {
                index[i] = v;
            }
        }
        index
    }

    /// Micrometres per unit of the space axis `name` and its level-0 scale:
    /// the physical pixel size in µm, when the axis has a known length unit.
    pub fn physical_size_um(&self, name: &str) -> Option<f64> {
        let i = self.axis(name)?;
        let per_unit = micrometres_per(self.axes[i].unit.as_deref()?)?;
        Some(self.scale[i] * per_unit)
    }

    /// The level-0 translation along the space axis `name`, in µm.
    pub fn offset_um(&self, name: &str) -> Option<f64> {
        let i = self.axis(name)?;
        let per_unit = micrometres_per(self.axes[i].unit.as_deref()?)?;
        Some(self.translation[i] * per_unit)
    }
}

/// µm per one of the NGFF length unit `unit` (UDUNITS-2 names the spec allows,
/// the common ones), `None` for other units.
pub fn micrometres_per(unit: &str) -> Option<f64> {
    Some(match unit {
        "micrometer" | "micron" | "µm" | "um" => 1.0,
        "nanometer" | "nm" => 1e-3,
        "angstrom" => 1e-4,
        "picometer" => 1e-6,
        "millimeter" | "mm" => 1e3,
        "centimeter" => 1e4,
        "meter" | "m" => 1e6,
        _ => return None,
    })
}

/// One well of the plate, with the fields found.
#[derive(Debug, Clone, PartialEq)]
pub struct ZarrWell {
    /// Row and column names as the plate lists them (`A`, `1`).
    pub row: String,
    pub column: String,
    /// 0-based indices into the plate's rows and columns.
    pub row_index: usize,
    pub column_index: usize,
    /// The well group, relative to the plate root (`A/1`).
    pub path: String,
    /// The readable fields, in the order the well lists them.
    pub fields: Vec<ZarrField>,
    /// The fields the well lists that cannot be read: (index in the list,
    /// path relative to the root, why). Each is a warning of the plate too.
    pub unreadable: Vec<(usize, String, String)>,
}

/// An OME-Zarr HCS plate's metadata.
#[derive(Debug, Clone, PartialEq)]
pub struct ZarrPlate {
    pub root: PathBuf,
    pub version: NgffVersion,
    /// The metadata file that declares the plate (`zarr.json` or `.zattrs`).
    pub descriptor: PathBuf,
    /// `plate.name`, when given.
    pub name: Option<String>,
    pub rows: Vec<String>,
    pub columns: Vec<String>,
    /// Wells as the plate lists them, with at least one readable field or not.
    pub wells: Vec<ZarrWell>,
    /// Everything odd that did not stop reading, each naming its path.
    pub warnings: Vec<String>,
}

/// Whether `dir` is the root group of an OME-Zarr HCS plate (a group whose
/// NGFF attributes have a `plate` object). Unreadable metadata is `false`:
/// [`ZarrPlate::open`] says what is wrong with it.
pub fn is_plate(dir: &Path) -> bool {
    matches!(read_group_attributes(dir), Ok(Some((_, attrs))) if ngff(&attrs).get("plate").is_some())
}

/// The NGFF objects of a group's attributes: under `ome` (0.5), else the
/// attributes themselves (0.4 and earlier).
fn ngff(attrs: &Map<String, Value>) -> &Map<String, Value> {
    attrs.get("ome").and_then(Value::as_object).unwrap_or(attrs)
}

impl ZarrPlate {
    /// Reads the plate at `root` (its metadata and every field's level-0
    /// array metadata; no pixels).
    ///
    /// Errors: `root` has no Zarr group metadata, or no `plate` attribute
    /// ([`ZarrError::NotAPlate`]), its metadata is not JSON ([`ZarrError::Json`]),
    /// or the `plate` object lacks `rows`, `columns` or `wells`, or a well
    /// points outside them ([`ZarrError::Metadata`]).
    pub fn open(root: &Path) -> Result<ZarrPlate, ZarrError> {
        let not_a_plate = |reason: &str| ZarrError::NotAPlate { root: root.to_path_buf(), reason: reason.into() };
        let (version, attrs) = read_group_attributes(root)?.ok_or_else(|| not_a_plate("no zarr.json or .zattrs"))?;
        let descriptor = root.join(metadata_file(version));
        let bad = |message: String| ZarrError::Metadata { path: descriptor.clone(), message };
        let plate = ngff(&attrs).get("plate").and_then(Value::as_object).ok_or_else(|| not_a_plate("no NGFF 'plate' attribute"))?;
        let names = |key: &str| -> Result<Vec<String>, ZarrError> {
            let list = plate.get(key).and_then(Value::as_array).ok_or_else(|| bad(format!("plate.{key} is missing or not a list")))?;
            list.iter()
                .map(|v| v.get("name").and_then(Value::as_str).map(str::to_string))
                .collect::<Option<Vec<_>>>()
                .ok_or_else(|| bad(format!("plate.{key}: every entry needs a 'name'")))
        };
        let (rows, columns) = (names("rows")?, names("columns")?);
        let listed = plate.get("wells").and_then(Value::as_array).ok_or_else(|| bad("plate.wells is missing or not a list".into()))?;
        let mut out = ZarrPlate {
            root: root.to_path_buf(),
            version,
            descriptor: descriptor.clone(),
            name: plate.get("name").and_then(Value::as_str).map(str::to_string),
            rows,
            columns,
            wells: Vec::new(),
            warnings: Vec::new(),
        };
        for entry in listed {
            let well = out.listed_well(entry).map_err(bad)?;
            out.wells.push(well);
        }
        let wells = std::mem::take(&mut out.wells);
        out.wells = wells.into_iter().map(|w| out.with_fields(w)).collect();
        Ok(out)
    }

    /// A `plate.wells` entry: its path, and row and column indices (given,
    /// or found from the path's two parts).
    fn listed_well(&self, entry: &Value) -> Result<ZarrWell, String> {
        let path = entry.get("path").and_then(Value::as_str).ok_or("plate.wells: an entry without a 'path'")?;
        let parts: Vec<&str> = path.split('/').collect();
        let [row, column] = parts[..] else {
            return Err(format!("plate.wells: path '{path}' is not '<row>/<column>'"));
        };
        let index = |key: &str, names: &[String], name: &str| -> Result<usize, String> {
            let i = match entry.get(key).and_then(Value::as_u64) {
                Some(i) => i as usize,
                None => names.iter().position(|n| n == name).ok_or(format!("plate.wells: '{path}': '{name}' is not a listed {key}"))?,
            };
            match names.get(i) {
                Some(n) if n == name => Ok(i),
                _ => Err(format!("plate.wells: '{path}': {key} {i} is not '{name}'")),
            }
        };
        Ok(ZarrWell {
            row: row.to_string(),
            column: column.to_string(),
            row_index: index("rowIndex", &self.rows, row)?,
            column_index: index("columnIndex", &self.columns, column)?,
            path: path.to_string(),
            fields: Vec::new(),
            unreadable: Vec::new(),
        })
    }

    /// `well` with the fields its group lists that can be read; a warning for
    /// each that cannot (and for the well itself when its group is absent).
    fn with_fields(&mut self, mut well: ZarrWell) -> ZarrWell {
        let dir = self.root.join(&well.path);
        let attrs = match read_group_attributes(&dir) {
            Ok(Some((_, attrs))) => attrs,
            Ok(None) => {
                self.warnings.push(format!("{}: the plate lists well {} but its group is not there", dir.display(), well.path));
                return well;
            }
            Err(e) => {
                self.warnings.push(format!("well {}: {e}", well.path));
                return well;
            }
        };
        let images: Vec<String> = ngff(&attrs)
            .get("well")
            .and_then(|w| w.get("images"))
            .and_then(Value::as_array)
            .map(|list| list.iter().filter_map(|i| i.get("path").and_then(Value::as_str).map(str::to_string)).collect())
            .unwrap_or_default();
        if images.is_empty() {
            self.warnings.push(format!("{}: well {} lists no field images (no well.images)", dir.display(), well.path));
        }
        for (index, image) in images.into_iter().enumerate() {
            let path = format!("{}/{image}", well.path);
            match read_field(&self.root, &path) {
                Ok(field) => well.fields.push(ZarrField { index, ..field }),
                Err(e) => {
                    self.warnings.push(format!("field {path} left out: {e}"));
                    well.unreadable.push((index, path, e.to_string()));
                }
            }
        }
        well
    }
}

/// The group metadata file of a version.
fn metadata_file(version: NgffVersion) -> &'static str {
    match version {
        NgffVersion::V05 => "zarr.json",
        NgffVersion::V04 => ".zattrs",
    }
}

/// The field image at `path` (relative to `root`): its multiscale metadata
/// and level-0 array (`index` 0: the caller knows the field's place).
fn read_field(root: &Path, path: &str) -> Result<ZarrField, ZarrError> {
    let dir = root.join(path);
    let (version, attrs) =
        read_group_attributes(&dir)?.ok_or_else(|| ZarrError::Metadata { path: dir.clone(), message: "no group metadata".into() })?;
    let file = dir.join(metadata_file(version));
    let bad = |message: String| ZarrError::Metadata { path: file.clone(), message };
    let ngff = ngff(&attrs);
    let multiscale =
        ngff.get("multiscales").and_then(Value::as_array).and_then(|m| m.first()).ok_or_else(|| bad("no multiscales image".into()))?;
    let dataset = multiscale
        .get("datasets")
        .and_then(Value::as_array)
        .and_then(|d| d.first())
        .ok_or_else(|| bad("multiscales[0] has no datasets".into()))?;
    let level0 = dataset.get("path").and_then(Value::as_str).ok_or_else(|| bad("datasets[0] has no path".into()))?;
    let array_path = format!("{path}/{level0}");
    let (shape, dtype) = array_shape(&root.join(&array_path))?;
    let axes = parse_axes(multiscale.get("axes"), shape.len()).map_err(&bad)?;
    let n = axes.len();
    let mut scale = vec![1.0; n];
    let mut translation = vec![0.0; n];
    for transforms in [dataset.get("coordinateTransformations"), multiscale.get("coordinateTransformations")] {
        apply_transforms(transforms, &mut scale, &mut translation).map_err(&bad)?;
    }
    let channel_labels = ngff
        .get("omero")
        .and_then(|o| o.get("channels"))
        .and_then(Value::as_array)
        .map(|c| c.iter().map(|ch| ch.get("label").and_then(Value::as_str).unwrap_or_default().to_string()).collect())
        .unwrap_or_default();
    Ok(ZarrField { index: 0, path: path.to_string(), array: array_path, axes, shape, dtype, scale, translation, channel_labels })
}

/// `multiscales[0].axes` for an array of `ndim` dimensions: objects with
/// `name`, `type` and `unit` (NGFF 0.4, 0.5), names only (0.3), or absent
/// (≤ 0.2: `t, c, z, y, x`, the last `ndim` of them).
fn parse_axes(axes: Option<&Value>, ndim: usize) -> Result<Vec<Axis>, String> {
    let kind_of_name = |name: &str| match name {
        "t" => AxisKind::Time,
        "c" => AxisKind::Channel,
        "z" | "y" | "x" => AxisKind::Space,
        _ => AxisKind::Other,
    };
    let parsed: Vec<Axis> = match axes.and_then(Value::as_array) {
        None => {
            if !(2..=5).contains(&ndim) {
                return Err(format!("no axes and a {ndim}-dimensional array"));
            }
            ["t", "c", "z", "y", "x"][5 - ndim..].iter().map(|n| Axis { name: n.to_string(), kind: kind_of_name(n), unit: None }).collect()
        }
        Some(list) => list
            .iter()
            .map(|a| match a {
                Value::String(name) => Ok(Axis { name: name.clone(), kind: kind_of_name(name), unit: None }),
                Value::Object(o) => {
                    let name = o.get("name").and_then(Value::as_str).ok_or("an axis without a name")?.to_string();
                    let kind = match o.get("type").and_then(Value::as_str) {
                        Some("time") => AxisKind::Time,
                        Some("channel") => AxisKind::Channel,
                        Some("space") => AxisKind::Space,
                        Some(_) => AxisKind::Other,
                        None => kind_of_name(&name),
                    };
                    Ok(Axis { name, kind, unit: o.get("unit").and_then(Value::as_str).map(str::to_string) })
                }
                _ => Err("an axis that is neither a name nor an object"),
            })
            .collect::<Result<_, _>>()?,
    };
    if parsed.len() != ndim {
        return Err(format!("{} axes for a {ndim}-dimensional level-0 array", parsed.len()));
    }
    let names: Vec<&str> = parsed.iter().map(|a| a.name.as_str()).collect();
    if ndim < 2 || !names[ndim - 2].eq_ignore_ascii_case("y") || !names[ndim - 1].eq_ignore_ascii_case("x") {
        return Err(format!("axes {names:?}: the last two must be y and x"));
    }
    for (i, a) in parsed.iter().enumerate().take(ndim - 2) {
        let known = matches!(a.name.to_ascii_lowercase().as_str(), "t" | "c" | "z");
        if !known {
            return Err(format!("axis {i} '{}': hcsflow reads images whose other axes are t, c and z", a.name));
        }
    }
    for n in ["t", "c", "z"] {
        if names.iter().filter(|a| a.eq_ignore_ascii_case(n)).count() > 1 {
            return Err(format!("axes {names:?}: '{n}' twice"));
        }
    }
    Ok(parsed)
}

/// Applies a `coordinateTransformations` list (`scale`, then `translation`)
/// to the level-0 scale and translation. Transformations of type `identity`
/// or given by `path` are left out (a `path` one is for arrays of
/// transformations, which HCS writers do not use).
fn apply_transforms(transforms: Option<&Value>, scale: &mut [f64], translation: &mut [f64]) -> Result<(), String> {
    let Some(list) = transforms.and_then(Value::as_array) else {
        return Ok(());
    };
    for t in list {
        let values = |key: &str| -> Result<Option<Vec<f64>>, String> {
            let Some(v) = t.get(key) else { return Ok(None) };
            let v: Vec<f64> = v
                .as_array()
                .and_then(|a| a.iter().map(Value::as_f64).collect::<Option<Vec<f64>>>())
                .ok_or(format!("coordinateTransformations: '{key}' is not a list of numbers"))?;
            if v.len() != scale.len() {
                return Err(format!("coordinateTransformations: '{key}' has {} values for {} axes", v.len(), scale.len()));
            }
            Ok(Some(v))
        };
        match t.get("type").and_then(Value::as_str) {
            Some("scale") => {
                if let Some(s) = values("scale")? {
                    for (i, v) in s.into_iter().enumerate() {
                        scale[i] *= v;
                        translation[i] *= v;
                    }
                }
            }
            Some("translation") => {
                if let Some(tr) = values("translation")? {
                    for (i, v) in tr.into_iter().enumerate() {
                        translation[i] += v;
                    }
                }
            }
            _ => {}
        }
    }
    Ok(())
}

/// Opens the array at `dir` (v3 or v2): its shape and data type, which must
/// be one hcsflow processes.
fn array_shape(dir: &Path) -> Result<(Vec<u64>, DType), ZarrError> {
    let array = open_array(dir)?;
    Ok((array.shape().to_vec(), dtype_of(&array, dir)?))
}

/// The hcsflow dtype of `array` (in folder `dir`), or why it has none.
fn dtype_of(array: &Array<FilesystemStore>, dir: &Path) -> Result<DType, ZarrError> {
    let dt = array.data_type();
    let dtype = if *dt == data_type::uint8() {
        DType::U8
    } else if *dt == data_type::uint16() {
        DType::U16
    } else if *dt == data_type::float32() {
        DType::F32
    } else {
        return Err(ZarrError::Metadata {
            path: dir.to_path_buf(),
            message: format!("data type {}: hcsflow reads uint8, uint16 and float32 images", array_dtype_name(dir)),
        });
    };
    Ok(dtype)
}

/// The data type as the array's metadata file writes it (for messages).
fn array_dtype_name(dir: &Path) -> String {
    for (file, key) in [("zarr.json", "data_type"), (".zarray", "dtype")] {
        if let Ok(text) = std::fs::read(dir.join(file)) {
            if let Ok(doc) = serde_json::from_slice::<Value>(&text) {
                return doc.get(key).map(Value::to_string).unwrap_or_else(|| "(none)".into());
            }
        }
    }
    "(unknown)".into()
}

/// The plane height, width and dtype of the array in folder `dir` (its last
/// two dimensions), from its metadata.
pub fn plane_format(dir: &Path) -> Result<(usize, usize, DType), ZarrError> {
    let (shape, dtype) = array_shape(dir)?;
    match shape[..] {
        [.., h, w] => Ok((h as usize, w as usize, dtype)),
        _ => Err(ZarrError::Metadata { path: dir.to_path_buf(), message: format!("array of shape {shape:?} has no y × x planes") }),
    }
}

fn open_array(dir: &Path) -> Result<Array<FilesystemStore>, ZarrError> {
    let store = FilesystemStore::new(dir).map_err(|e| ZarrError::zarr(dir, e))?;
    Array::open(Arc::new(store), "/").map_err(|e| ZarrError::zarr(dir, format!("not a readable Zarr array: {e}")))
}

/// Reads the `y × x` plane at `index` (one index per array dimension; the
/// last two are ignored) of the array in folder `array`, as a `[1, Y, X]`
/// stack, which must have the size and dtype `expected` (height, width,
/// dtype) when given: a plate's planes all have one, and a field that
/// disagrees is an error naming the array, not a surprise downstream.
pub fn read_plane(array: &Path, index: &[u64], expected: Option<(usize, usize, DType)>) -> Result<Stack, ZarrError> {
    let arr = open_array(array)?;
    let shape = arr.shape().to_vec();
    let n = shape.len();
    let bad = |message: String| ZarrError::Metadata { path: array.to_path_buf(), message };
    if index.len() != n || n < 2 {
        return Err(bad(format!("plane index {index:?} for an array of shape {shape:?}")));
    }
    if let Some((i, (&v, &s))) = index[..n - 2].iter().zip(&shape[..n - 2]).enumerate().find(|(_, (v, s))| v >= s) {
        return Err(bad(format!("plane index {v} on axis {i} is beyond the array's size {s}")));
    }
    let (h, w) = (shape[n - 2] as usize, shape[n - 1] as usize);
    let dtype = dtype_of(&arr, array)?;
    if let Some((eh, ew, ed)) = expected {
        if (eh, ew, ed) != (h, w, dtype) {
            return Err(bad(format!("planes are {h}×{w} {dtype}; the plate's are {eh}×{ew} {ed}")));
        }
    }
    let ranges: Vec<std::ops::Range<u64>> = index[..n - 2].iter().map(|&v| v..v + 1).chain([0..shape[n - 2], 0..shape[n - 1]]).collect();
    let subset = ArraySubset::new_with_ranges(&ranges);
    match dtype {
        DType::U8 => plane_of::<u8>(&arr, &subset, array, index),
        DType::U16 => plane_of::<u16>(&arr, &subset, array, index),
        DType::F32 => plane_of::<f32>(&arr, &subset, array, index),
    }
}

/// The `[1, Y, X]` stack of the one-plane `subset` of `arr` (in folder `path`).
fn plane_of<T: Pixel + ElementOwned>(
    arr: &Array<FilesystemStore>,
    subset: &ArraySubset,
    path: &Path,
    index: &[u64],
) -> Result<Stack, ZarrError> {
    let shape = subset.shape();
    let n = shape.len();
    let (h, w) = (shape[n - 2] as usize, shape[n - 1] as usize);
    let context = format!("plane {:?}", &index[..n - 2]);
    let pixels: Vec<T> = arr.retrieve_array_subset(subset).map_err(|e| ZarrError::array(path, &context, &e))?;
    let plane = Array3::from_shape_vec([1, h, w], pixels)
        .map_err(|e| ZarrError::Metadata { path: path.to_path_buf(), message: format!("{context}: {e}") })?;
    Ok(Stack::from(plane))
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    #[test]
    fn axes_of_every_ngff_generation() {
        let objects = json!([{"name": "c", "type": "channel"}, {"name": "z", "type": "space", "unit": "micrometer"},
                             {"name": "y", "type": "space", "unit": "micrometer"}, {"name": "x", "type": "space", "unit": "nanometer"}]);
        let a = parse_axes(Some(&objects), 4).unwrap();
        assert_eq!(a.iter().map(|a| a.name.as_str()).collect::<Vec<_>>(), ["c", "z", "y", "x"]);
        assert_eq!((a[0].kind, a[3].unit.as_deref()), (AxisKind::Channel, Some("nanometer")));
        let names = parse_axes(Some(&json!(["t", "y", "x"])), 3).unwrap();
        assert_eq!((names[0].kind, names[1].kind), (AxisKind::Time, AxisKind::Space));
        let implicit = parse_axes(None, 3).unwrap();
        assert_eq!(implicit.iter().map(|a| a.name.as_str()).collect::<Vec<_>>(), ["z", "y", "x"]);
        assert!(parse_axes(Some(&json!(["x", "y"])), 2).unwrap_err().contains("last two must be y and x"));
        assert!(parse_axes(Some(&json!(["c", "y", "x"])), 4).unwrap_err().contains("3 axes for a 4-dimensional"));
        assert!(parse_axes(Some(&json!(["angle", "y", "x"])), 3).unwrap_err().contains("'angle'"));
        assert!(parse_axes(Some(&json!(["z", "z", "y", "x"])), 4).unwrap_err().contains("'z' twice"));
    }

    #[test]
    fn scale_then_translation_then_the_multiscale_transforms() {
        let (mut s, mut t) = (vec![1.0; 3], vec![0.0; 3]);
        let dataset = json!([{"type": "scale", "scale": [2.0, 0.5, 0.25]}, {"type": "translation", "translation": [0.0, 10.0, 20.0]}]);
        apply_transforms(Some(&dataset), &mut s, &mut t).unwrap();
        apply_transforms(Some(&json!([{"type": "scale", "scale": [1.0, 2.0, 2.0]}])), &mut s, &mut t).unwrap();
        assert_eq!((s, t), (vec![2.0, 1.0, 0.5], vec![0.0, 20.0, 40.0]));
        let (mut s, mut t) = (vec![1.0; 2], vec![0.0; 2]);
        let wrong = json!([{"type": "scale", "scale": [1.0]}]);
        assert!(apply_transforms(Some(&wrong), &mut s, &mut t).unwrap_err().contains("1 values for 2 axes"));
    }

    #[test]
    fn length_units_in_micrometres() {
        assert_eq!(micrometres_per("micrometer"), Some(1.0));
        assert_eq!(micrometres_per("nanometer"), Some(1e-3));
        assert_eq!(micrometres_per("meter"), Some(1e6));
        assert_eq!(micrometres_per("second"), None);
    }
}
