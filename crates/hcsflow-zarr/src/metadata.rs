//! NGFF metadata documents (plate, well, multiscales, omero) and the Zarr
//! group files that carry them, for NGFF 0.5/Zarr v3 and NGFF 0.4/Zarr v2.

use std::path::Path;

use hcsflow_core::DType;
use serde_json::{json, Map, Value};

use crate::error::ZarrError;
use crate::spec::{NgffVersion, PlateSpec};
use crate::store::write_atomic;

/// Key under which the plate root stores the hcsflow spec (for resume).
pub(crate) const HCSFLOW_KEY: &str = "hcsflow";
/// Bumped if the stored spec layout changes incompatibly.
pub(crate) const HCSFLOW_FORMAT: u64 = 1;

/// Writes a group's metadata with `ngff` attributes (without the NGFF version
/// key, added here) and `extra` top-level attributes.
///
/// v3: `zarr.json` with `attributes.ome = {version: "0.5", ..ngff}`.
/// v2: `.zgroup` plus `.zattrs` with `ngff` at the top level; the `plate`,
/// `well` and `multiscales[]` objects get `version: "0.4"` as NGFF 0.4 requires.
pub(crate) fn write_group(dir: &Path, version: NgffVersion, ngff: Map<String, Value>, extra: Map<String, Value>) -> Result<(), ZarrError> {
    match version {
        NgffVersion::V05 => {
            let mut attributes = extra;
            if !ngff.is_empty() {
                let mut ome = Map::new();
                ome.insert("version".into(), json!("0.5"));
                ome.extend(ngff);
                attributes.insert("ome".into(), Value::Object(ome));
            }
            let doc = json!({"zarr_format": 3, "node_type": "group", "attributes": attributes});
            write_json(&dir.join("zarr.json"), &doc)
        }
        NgffVersion::V04 => {
            write_json(&dir.join(".zgroup"), &json!({"zarr_format": 2}))?;
            let mut attrs = extra;
            for (k, mut v) in ngff {
                match (k.as_str(), &mut v) {
                    ("plate" | "well", Value::Object(o)) => {
                        o.insert("version".into(), json!("0.4"));
                    }
                    ("multiscales", Value::Array(list)) => {
                        for m in list.iter_mut().filter_map(Value::as_object_mut) {
                            m.insert("version".into(), json!("0.4"));
                        }
                    }
                    _ => {}
                }
                attrs.insert(k, v);
            }
            write_json(&dir.join(".zattrs"), &Value::Object(attrs))
        }
    }
}

/// Pretty JSON, written atomically.
pub(crate) fn write_json(path: &Path, doc: &Value) -> Result<(), ZarrError> {
    let bytes = serde_json::to_vec_pretty(doc).map_err(|e| ZarrError::Json { path: path.to_path_buf(), message: e.to_string() })?;
    write_atomic(path, &bytes).map_err(|e| ZarrError::io(path, e))
}

/// The NGFF version a group was written with and its attributes.
pub(crate) type GroupAttributes = (NgffVersion, Map<String, Value>);

/// Reads the group attributes of `dir` (v3 `zarr.json` attributes, else v2
/// `.zattrs`). `Ok(None)` if neither file exists.
pub(crate) fn read_group_attributes(dir: &Path) -> Result<Option<GroupAttributes>, ZarrError> {
    for (file, version) in [("zarr.json", NgffVersion::V05), (".zattrs", NgffVersion::V04)] {
        let path = dir.join(file);
        let text = match std::fs::read(&path) {
            Ok(t) => t,
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => continue,
            Err(e) => return Err(ZarrError::io(path, e)),
        };
        let doc: Value = serde_json::from_slice(&text).map_err(|e| ZarrError::Json { path: path.clone(), message: e.to_string() })?;
        let attrs = match version {
            NgffVersion::V05 => doc.get("attributes").cloned().unwrap_or(Value::Null),
            NgffVersion::V04 => doc,
        };
        return Ok(Some((version, attrs.as_object().cloned().unwrap_or_default())));
    }
    Ok(None)
}

/// NGFF `plate` object. `wells` are (row index, column index) of the wells
/// that have at least one field; `field_count` is the most fields in a well.
pub(crate) fn plate(spec: &PlateSpec, wells: &[(usize, usize)], field_count: usize) -> Map<String, Value> {
    let names = |v: &[String]| v.iter().map(|n| json!({"name": n})).collect::<Vec<_>>();
    let wells: Vec<Value> = wells
        .iter()
        .map(|&(r, c)| {
            json!({
                "path": format!("{}/{}", spec.rows[r], spec.columns[c]),
                "rowIndex": r,
                "columnIndex": c,
            })
        })
        .collect();
    let mut m = Map::new();
    m.insert(
        "plate".into(),
        json!({
            "name": spec.name,
            "rows": names(&spec.rows),
            "columns": names(&spec.columns),
            "wells": wells,
            "field_count": field_count,
        }),
    );
    m
}

/// NGFF `well` object listing the field image paths present.
pub(crate) fn well(fields: &[usize]) -> Map<String, Value> {
    let images: Vec<Value> = fields.iter().map(|f| json!({"path": f.to_string()})).collect();
    let mut m = Map::new();
    m.insert("well".into(), json!({"images": images}));
    m
}

/// Default display colours per channel (blue, green, red, magenta, cyan, yellow, grey).
const COLORS: [&str; 7] = ["0000FF", "00FF00", "FF0000", "FF00FF", "00FFFF", "FFFF00", "FFFFFF"];

/// `multiscales` and `omero` of one field image, placed at `position`
/// (y, x in µm) when given.
///
/// Scales: t and c 1; z `z_step_um` (or 1); y, x `pixel_size × 2^level` (or
/// `2^level`). Units only where the size is known. Windows span the dtype's
/// range for integers and [0, 1] for f32 (the data range is not known when the
/// field is created).
pub(crate) fn image(spec: &PlateSpec, name: &str, position: Option<(f64, f64)>) -> Map<String, Value> {
    let space = |known: bool, name: &str| {
        if known {
            json!({"name": name, "type": "space", "unit": "micrometer"})
        } else {
            json!({"name": name, "type": "space"})
        }
    };
    let axes = vec![
        json!({"name": "t", "type": "time"}),
        json!({"name": "c", "type": "channel"}),
        space(spec.z_step_um.is_some(), "z"),
        space(spec.pixel_size_um.is_some(), "y"),
        space(spec.pixel_size_um.is_some(), "x"),
    ];
    let (py, px) = spec.pixel_size_um.unwrap_or((1.0, 1.0));
    let pz = spec.z_step_um.unwrap_or(1.0);
    // A translation only where the position and the pixel size (the unit) are known.
    let position = position.filter(|_| spec.pixel_size_um.is_some());
    let datasets: Vec<Value> = (0..spec.pyramid_levels)
        .map(|k| {
            let f = (1u64 << k) as f64;
            let mut transforms = vec![json!({"type": "scale", "scale": [1.0, 1.0, pz, py * f, px * f]})];
            if let Some((y, x)) = position {
                let centre = (f - 1.0) / 2.0;
                transforms.push(json!({"type": "translation", "translation": [0.0, 0.0, 0.0, y + centre * py, x + centre * px]}));
            }
            json!({"path": k.to_string(), "coordinateTransformations": transforms})
        })
        .collect();
    let (lo, hi) = match spec.dtype {
        DType::U8 => (0.0, 255.0),
        DType::U16 => (0.0, 65535.0),
        DType::F32 => (0.0, 1.0),
    };
    let channels: Vec<Value> = spec
        .channel_names
        .iter()
        .enumerate()
        .map(|(i, label)| {
            let color = if spec.channel_names.len() == 1 { "FFFFFF" } else { COLORS[i % COLORS.len()] };
            json!({
                "label": label,
                "color": color,
                "active": true,
                "coefficient": 1,
                "family": "linear",
                "inverted": false,
                "window": {"min": lo, "max": hi, "start": lo, "end": hi},
            })
        })
        .collect();
    let mut m = Map::new();
    m.insert(
        "multiscales".into(),
        json!([{
            "name": name,
            "axes": axes,
            "datasets": datasets,
            "type": "mean",
            "metadata": {"description": "2x2 block mean in y and x per level (hcsflow)"},
        }]),
    );
    m.insert(
        "omero".into(),
        json!({
            "name": name,
            "channels": channels,
            "rdefs": {"model": "color", "defaultT": 0, "defaultZ": spec.shape.z / 2},
        }),
    );
    m
}

/// The `labels` group of an image: `labels` lists the label images under it
/// (NGFF "labels" metadata, under `ome` in 0.5).
pub(crate) fn labels(names: &[String]) -> Map<String, Value> {
    let mut m = Map::new();
    m.insert("labels".into(), json!(names));
    m
}

/// A label image of a field (NGFF "image-label"): the field's `multiscales`
/// (same axes, levels and transforms, so it overlays the image), with its
/// pyramid described as nearest-neighbour subsampling, no `omero`, and
/// `image-label` naming the image as its source (`../../`, the field group
/// two levels up). In 0.4 `image-label` carries `version` itself; in 0.5 the
/// version is the group's `ome.version`.
pub(crate) fn label_image(spec: &PlateSpec, name: &str, position: Option<(f64, f64)>) -> Map<String, Value> {
    let mut m = image(spec, name, position);
    m.remove("omero");
    if let Some(ms) = m.get_mut("multiscales").and_then(Value::as_array_mut).and_then(|l| l.first_mut()).and_then(Value::as_object_mut) {
        ms.insert("type".into(), json!("nearest"));
        ms.insert(
            "metadata".into(),
            json!({"description": "level k keeps every 2^k-th pixel in y and x (labels are never averaged; hcsflow)"}),
        );
    }
    let mut label = json!({"source": {"image": "../../"}});
    if spec.version == NgffVersion::V04 {
        label["version"] = json!("0.4");
    }
    m.insert("image-label".into(), label);
    m
}
