//! [`PlateWriter`]: creates the plate hierarchy, writes planes (all pyramid
//! levels at once) from any number of threads, and writes the plate and well
//! metadata at `finish`.

use std::collections::{HashMap, HashSet};
use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex};

use hcsflow_core::{DType, Pixel, Stack};
use rayon::prelude::*;
use serde_json::{json, Map, Value};
use zarrs::array::codec::{BytesCodec, ZstdCodec};
use zarrs::array::{data_type, Array, ArrayBuilder, ArrayMetadata, ArrayMetadataV2, Element};
use zarrs::metadata::Endianness;

use crate::error::ZarrError;
use crate::metadata::{self, HCSFLOW_FORMAT, HCSFLOW_KEY};
use crate::pyramid::{downsample, subsample};
use crate::spec::{level_of, FieldExtent, NgffVersion, PlateSpec, WellPos, ZarrCompression};
use crate::store::AtomicFsStore;

type LevelArray = Array<AtomicFsStore>;
/// The pyramid level arrays of one field, level 0 first.
type FieldLevels = Arc<Vec<LevelArray>>;

/// A field whose group and arrays exist: its arrays and level-0 (y, x) extent.
#[derive(Debug)]
struct Field {
    levels: FieldLevels,
    yx: (usize, usize),
}

/// Writes one OME-Zarr HCS plate.
///
/// Layout: `ROOT/{row}/{column}/{field}/{level}` — e.g. `plate.zarr/A/1/0/0` is
/// level 0 of field 0 of well A01. Each level array is `[t, c, z, y, x]` with
/// one chunk per `(t, c, z)` plane; pixels never written read as 0 (the fill
/// value). Field groups and their arrays are created on the first write to the
/// field; `finish` lists in the plate metadata only the wells that have at
/// least one field (and gives those wells all their fields, empty ones
/// included), so readers never open a path that is not there.
///
/// With [`FieldExtent::Grow`] planes may have any y × x; see there for how
/// fields grow and are padded.
///
/// `write_plane` and `write_field` take `&self` and may be called concurrently
/// from several threads, for different planes (writing the same plane twice
/// from two threads leaves one of the two, whole). Every file is written to a
/// temporary name and renamed, so an interrupted run leaves no partial file.
#[derive(Debug)]
pub struct PlateWriter {
    root: PathBuf,
    spec: PlateSpec,
    store: Arc<AtomicFsStore>,
    /// Grid position → index in `spec.wells`.
    well_index: HashMap<WellPos, usize>,
    /// Fields whose group and arrays exist, keyed by (well index, field).
    fields: Mutex<HashMap<(usize, usize), Field>>,
    /// Label images whose group and arrays exist, keyed by (well index, field, name).
    labels: Mutex<HashMap<(usize, usize, String), Field>>,
    /// Row and well groups already written by this writer.
    groups: Mutex<HashSet<String>>,
    /// Serialises `update_metadata` so a slower, older scan never overwrites a newer one.
    metadata_lock: Mutex<()>,
}

/// A plane's pixels, borrowed, with their type.
enum PlaneRef<'a> {
    U8(&'a [u8]),
    U16(&'a [u16]),
    F32(&'a [f32]),
}

impl PlateWriter {
    /// Creates a new plate at `root` (created if missing; must be empty if it
    /// exists). Writes the root group, with the spec stored under the `hcsflow`
    /// attribute so [`open_existing`](Self::open_existing) can resume.
    pub fn create(root: &Path, spec: PlateSpec) -> Result<PlateWriter, ZarrError> {
        spec.validate()?;
        match std::fs::read_dir(root) {
            Ok(mut entries) => {
                if entries.next().is_some() {
                    let hint = match metadata::read_group_attributes(root) {
                        Ok(Some((_, attrs))) if attrs.contains_key(HCSFLOW_KEY) => {
                            "it is an hcsflow plate: use PlateWriter::open_existing to resume it, \
                             or choose a new directory"
                        }
                        _ => "choose a new or empty directory",
                    };
                    return Err(ZarrError::RootNotEmpty { root: root.to_path_buf(), hint: hint.into() });
                }
            }
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => {
                std::fs::create_dir_all(root).map_err(|e| ZarrError::io(root, e))?;
            }
            Err(e) => return Err(ZarrError::io(root, e)),
        }
        let writer = PlateWriter::new(root, spec)?;
        let mut extra = Map::new();
        extra.insert(
            HCSFLOW_KEY.into(),
            json!({"format": HCSFLOW_FORMAT, "spec": serde_json::to_value(&writer.spec)
                .map_err(|e| ZarrError::Json { path: root.to_path_buf(), message: e.to_string() })?}),
        );
        metadata::write_group(root, writer.spec.version, Map::new(), extra)?;
        Ok(writer)
    }

    /// Reopens a plate created by [`create`](Self::create) (finished or not) to
    /// write more planes — the resume path. The spec is the one stored in the
    /// plate; check [`spec`](Self::spec) or use
    /// [`create_or_resume`](Self::create_or_resume) to compare with yours.
    pub fn open_existing(root: &Path) -> Result<PlateWriter, ZarrError> {
        let not_plate = |reason: &str| ZarrError::NotAPlate { root: root.to_path_buf(), reason: reason.into() };
        let (_, attrs) = metadata::read_group_attributes(root)?.ok_or_else(|| not_plate("no zarr.json or .zattrs at the root"))?;
        let stored = attrs.get(HCSFLOW_KEY).ok_or_else(|| not_plate("the root has no 'hcsflow' attribute (not written by hcsflow)"))?;
        if stored.get("format").and_then(Value::as_u64) != Some(HCSFLOW_FORMAT) {
            return Err(not_plate(&format!(
                "unsupported hcsflow plate format {:?} (this version writes {HCSFLOW_FORMAT})",
                stored.get("format")
            )));
        }
        let spec: PlateSpec = stored
            .get("spec")
            .cloned()
            .ok_or_else(|| not_plate("the 'hcsflow' attribute has no spec"))
            .and_then(|v| serde_json::from_value(v).map_err(|e| not_plate(&format!("stored spec: {e}"))))?;
        spec.validate().map_err(|e| not_plate(&format!("stored spec: {e}")))?;
        PlateWriter::new(root, spec)
    }

    /// Resumes `root` if it is an hcsflow plate with exactly `spec`, creates it
    /// if it is missing or empty, and fails otherwise (different spec, foreign
    /// content). The entry point for `--resume`.
    pub fn create_or_resume(root: &Path, spec: PlateSpec) -> Result<PlateWriter, ZarrError> {
        let empty = match std::fs::read_dir(root) {
            Ok(mut e) => e.next().is_none(),
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => true,
            Err(e) => return Err(ZarrError::io(root, e)),
        };
        if empty {
            return PlateWriter::create(root, spec);
        }
        let writer = PlateWriter::open_existing(root)?;
        // Compared as JSON, the form the stored spec went through, so a float
        // that does not survive a text round trip bit-exactly cannot cause a
        // false mismatch.
        let json_err = |e: serde_json::Error| ZarrError::Json { path: root.to_path_buf(), message: e.to_string() };
        let stored = serde_json::to_value(&writer.spec).map_err(json_err)?;
        let requested = serde_json::to_string(&spec)
            .and_then(|t| serde_json::from_str::<PlateSpec>(&t))
            .and_then(|s| serde_json::to_value(&s))
            .map_err(json_err)?;
        if stored != requested {
            let (Value::Object(a), Value::Object(b)) = (&stored, &requested) else {
                return Err(ZarrError::SpecMismatch {
                    root: root.to_path_buf(),
                    detail: format!("stored {stored}, requested {requested}"),
                });
            };
            let detail = a
                .iter()
                .filter(|(k, v)| b.get(k.as_str()) != Some(v))
                .map(|(k, v)| format!("{k}: stored {v}, requested {}", b.get(k.as_str()).unwrap_or(&Value::Null)))
                .collect::<Vec<_>>()
                .join("; ");
            return Err(ZarrError::SpecMismatch { root: root.to_path_buf(), detail });
        }
        Ok(writer)
    }

    fn new(root: &Path, spec: PlateSpec) -> Result<PlateWriter, ZarrError> {
        let mut well_index = HashMap::new();
        for (i, w) in spec.wells.iter().enumerate() {
            let pos = spec.locate(w).ok_or_else(|| ZarrError::InvalidSpec(format!("well '{w}' is not in the plate grid")))?;
            well_index.insert(pos, i);
        }
        Ok(PlateWriter {
            root: root.to_path_buf(),
            store: Arc::new(AtomicFsStore::new(root.to_path_buf())),
            spec,
            well_index,
            fields: Mutex::new(HashMap::new()),
            labels: Mutex::new(HashMap::new()),
            groups: Mutex::new(HashSet::new()),
            metadata_lock: Mutex::new(()),
        })
    }

    /// The plate's spec (as given to `create`, or as stored when reopened).
    pub fn spec(&self) -> &PlateSpec {
        &self.spec
    }

    /// The plate root directory.
    pub fn root(&self) -> &Path {
        &self.root
    }

    /// The path of a well inside the plate, e.g. `A/1` for `"A01"`.
    pub fn well_path(&self, well: &str) -> Result<String, ZarrError> {
        let pos = self.locate(well)?;
        Ok(format!("{}/{}", self.spec.rows[pos.row], self.spec.columns[pos.col]))
    }

    fn locate(&self, well: &str) -> Result<WellPos, ZarrError> {
        self.spec.locate(well).filter(|p| self.well_index.contains_key(p)).ok_or_else(|| ZarrError::UnknownWell {
            root: self.root.clone(),
            well: well.to_string(),
            known: self.spec.wells.join(", "),
        })
    }

    /// Writes plane `(t, c, z)` of `field` (0-based) of `well`: level 0 and
    /// every pyramid level (downsampling is in y and x only, so a plane's
    /// pyramid depends on that plane alone and is written with it).
    ///
    /// `plane` must be `[1, Y, X]` with the plate's dtype, and with the plate's
    /// Y, X unless the extent is [`FieldExtent::Grow`] (then any Y, X ≥ 1).
    /// Rewriting a plane replaces it. Errors name the well, field and indices.
    pub fn write_plane(&self, well: &str, field: usize, t: usize, c: usize, z: usize, plane: &Stack) -> Result<(), ZarrError> {
        let pos = self.check_indices(well, field, t, c, z)?;
        let s = self.spec.shape;
        let [_, py, px] = plane.shape();
        let expected = match self.spec.extent {
            FieldExtent::Fixed => [1, s.y, s.x],
            FieldExtent::Grow => [1, py.max(1), px.max(1)],
        };
        if plane.dtype() != self.spec.dtype {
            return Err(ZarrError::PlaneDType { well: well.into(), field, t, c, z, expected: self.spec.dtype, got: plane.dtype() });
        }
        if plane.shape() != expected {
            return Err(ZarrError::PlaneShape { well: well.into(), field, t, c, z, expected, got: plane.shape() });
        }
        let levels = self.field_arrays(pos, field, (py, px))?;
        self.store_plane(&levels, well, field, [t, c, z], (py, px), plane_ref(plane, 0))
    }

    /// Writes a whole field: `data` holds `t * c` stacks indexed `[t][c]`
    /// (i.e. `data[t * C + c]`), each `[Z, Y, X]` (Y, X as for
    /// [`write_plane`](Self::write_plane)). Everything is checked before
    /// anything is written; planes are then written in parallel (rayon).
    pub fn write_field(&self, well: &str, field: usize, data: &[Stack]) -> Result<(), ZarrError> {
        let s = self.spec.shape;
        let pos = self.check_indices(well, field, 0, 0, 0)?;
        if data.len() != s.t * s.c {
            return Err(ZarrError::FieldStackCount { well: well.into(), field, expected: s.t * s.c, got: data.len() });
        }
        let mut extent = (1, 1);
        for (i, stack) in data.iter().enumerate() {
            let (t, c) = (i / s.c, i % s.c);
            let [_, sy, sx] = stack.shape();
            let expected = match self.spec.extent {
                FieldExtent::Fixed => [s.z, s.y, s.x],
                FieldExtent::Grow => [s.z, sy.max(1), sx.max(1)],
            };
            extent = (extent.0.max(sy), extent.1.max(sx));
            if stack.dtype() != self.spec.dtype {
                return Err(ZarrError::PlaneDType { well: well.into(), field, t, c, z: 0, expected: self.spec.dtype, got: stack.dtype() });
            }
            if stack.shape() != expected {
                return Err(ZarrError::StackShape { well: well.into(), field, t, c, expected, got: stack.shape() });
            }
        }
        let levels = self.field_arrays(pos, field, extent)?;
        (0..data.len() * s.z).into_par_iter().try_for_each(|k| {
            let (i, z) = (k / s.z, k % s.z);
            let (t, c) = (i / s.c, i % s.c);
            let [_, h, w] = data[i].shape();
            self.store_plane(&levels, well, field, [t, c, z], (h, w), plane_ref(&data[i], z))
        })
    }

    /// Writes plane `(t, z)` of the label image `name` of `field` of `well`
    /// (e.g. a segmentation of that field): an OME-NGFF label image at
    /// `{row}/{column}/{field}/labels/{name}`, listed in the field's `labels`
    /// group, so that ome-zarr-py and napari show it over the field.
    ///
    /// The label image has the field's axes, pyramid levels and coordinate
    /// transforms with one channel (`[t, 1, z, y, x]`), u16 values (0 =
    /// background), and a nearest-neighbour pyramid (level k keeps every
    /// 2^k-th pixel: labels are never averaged). `plane` is `[1, Y, X]`, u8 or
    /// u16, with the field's Y, X (with [`FieldExtent::Grow`] any Y, X: the
    /// label image always has its field's extent, padded with 0 like the
    /// field). The field is created (empty) if nothing was written to it yet.
    /// `name` is a path segment: ASCII letters, digits, `_` or `-`. Errors
    /// name the well, field, label, t and z.
    pub fn write_label_plane(&self, well: &str, field: usize, name: &str, t: usize, z: usize, plane: &Stack) -> Result<(), ZarrError> {
        let pos = self.check_indices(well, field, t, 0, z)?;
        let bad = |problem: String| ZarrError::LabelPlane { well: well.into(), field, name: name.into(), t, z, problem };
        if name.is_empty() || !name.chars().all(|ch| ch.is_ascii_alphanumeric() || ch == '_' || ch == '-') {
            return Err(bad("a label name must be ASCII letters, digits, '_' or '-' (it is a path segment)".into()));
        }
        let [n, h, w] = plane.shape();
        let s = self.spec.shape;
        let fits = match self.spec.extent {
            FieldExtent::Fixed => [n, h, w] == [1, s.y, s.x],
            FieldExtent::Grow => n == 1 && h > 0 && w > 0,
        };
        if !fits {
            return Err(bad(format!("plane shape {:?}, expected [1, {}, {}]", plane.shape(), s.y, s.x)));
        }
        let values: std::borrow::Cow<'_, [u16]> = match plane {
            Stack::U8(a) => a.plane(0).iter().map(|&v| u16::from(v)).collect::<Vec<u16>>().into(),
            Stack::U16(a) => a.plane(0).into(),
            Stack::F32(_) => return Err(bad("labels must be integers (u8 or u16), got f32".into())),
        };
        let levels = self.label_arrays(pos, field, name, (h, w))?;
        let key = format!("{}/{field}/labels/{name}", self.well_path(well)?);
        self.store_typed(&levels, &key, [t, 0, z], (h, w), &values, subsample(&values, h, w, levels.len()))
    }

    /// The level arrays of label image `name` of a field, creating the field
    /// (when new), the label image and the `labels` group listing it on first
    /// use. The label image always has the field's extent: the field grows
    /// first to hold `at_least` (with [`FieldExtent::Grow`]).
    fn label_arrays(&self, pos: WellPos, field: usize, name: &str, at_least: (usize, usize)) -> Result<FieldLevels, ZarrError> {
        self.field_arrays(pos, field, at_least)?;
        let yx = self.field_yx(pos, field)?.unwrap_or(at_least);
        let wi = self.well_index.get(&pos).copied().unwrap_or_default();
        let mut labels = self.labels.lock().unwrap_or_else(|p| p.into_inner());
        let id = (wi, field, name.to_string());
        if let Some(l) = labels.get(&id) {
            if l.yx == yx {
                return Ok(l.levels.clone());
            }
        }
        let field_key = format!("{}/{}/{field}", self.spec.rows[pos.row], self.spec.columns[pos.col]);
        let labels_dir = self.root.join(format!("{field_key}/labels"));
        let label_key = format!("{field_key}/labels/{name}");
        let levels = Arc::new(self.label_level_arrays(&label_key, yx)?);
        if !labels.contains_key(&id) {
            let well = &self.spec.wells[wi];
            let position = self.spec.field_positions_um.iter().find(|p| &p.well == well && p.field == field).map(|p| (p.y_um, p.x_um));
            // The multiscale's name is the label's: what napari names the layer.
            metadata::write_group(
                &self.root.join(&label_key),
                self.spec.version,
                metadata::label_image(&self.spec, name, position),
                Map::new(),
            )?;
            let mut names = self.label_names(&labels_dir)?;
            if !names.iter().any(|n| n == name) {
                names.push(name.to_string());
                names.sort();
            }
            metadata::write_group(&labels_dir, self.spec.version, metadata::labels(&names), Map::new())?;
        }
        labels.insert(id, Field { levels: levels.clone(), yx });
        Ok(levels)
    }

    /// The label images under a `labels` directory (sub-groups with metadata), sorted.
    fn label_names(&self, labels_dir: &Path) -> Result<Vec<String>, ZarrError> {
        let entries = match std::fs::read_dir(labels_dir) {
            Ok(e) => e,
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Ok(Vec::new()),
            Err(e) => return Err(ZarrError::io(labels_dir, e)),
        };
        let mut names = Vec::new();
        for entry in entries {
            let entry = entry.map_err(|e| ZarrError::io(labels_dir, e))?;
            let dir = entry.path();
            if dir.join("zarr.json").exists() || dir.join(".zattrs").exists() {
                names.push(entry.file_name().to_string_lossy().into_owned());
            }
        }
        names.sort();
        Ok(names)
    }

    fn check_indices(&self, well: &str, field: usize, t: usize, c: usize, z: usize) -> Result<WellPos, ZarrError> {
        let pos = self.locate(well)?;
        if field >= self.spec.fields_per_well {
            return Err(ZarrError::FieldOutOfRange { well: well.into(), field, fields_per_well: self.spec.fields_per_well });
        }
        let s = self.spec.shape;
        for (axis, index, size) in [('t', t, s.t), ('c', c, s.c), ('z', z, s.z)] {
            if index >= size {
                return Err(ZarrError::IndexOutOfRange { well: well.into(), field, axis, index, size });
            }
        }
        Ok(pos)
    }

    /// The level arrays of a field, creating the row/well/field groups and the
    /// array metadata on first use (idempotent: a resumed writer rewrites the
    /// same metadata).
    ///
    /// `at_least` is the level-0 (y, x) the field must hold. With a fixed
    /// extent it is always the plate's. With [`FieldExtent::Grow`] a field is
    /// created (or, after a resume, reopened) with the larger of `at_least` and
    /// what is on disk, and an existing field smaller than `at_least` grows:
    /// its arrays' metadata are rewritten with the new shape, and the chunks
    /// (whose grid does not depend on the extent) stay valid.
    fn field_arrays(&self, pos: WellPos, field: usize, at_least: (usize, usize)) -> Result<FieldLevels, ZarrError> {
        let wi = *self.well_index.get(&pos).ok_or_else(|| ZarrError::UnknownWell {
            root: self.root.clone(),
            well: format!("{}{}", self.spec.rows[pos.row], self.spec.columns[pos.col]),
            known: self.spec.wells.join(", "),
        })?;
        let mut fields = self.fields.lock().unwrap_or_else(|p| p.into_inner());
        let row = &self.spec.rows[pos.row];
        let well_key = format!("{row}/{}", self.spec.columns[pos.col]);
        let field_key = format!("{well_key}/{field}");
        if let Some(f) = fields.get(&(wi, field)) {
            if f.yx.0 >= at_least.0 && f.yx.1 >= at_least.1 {
                return Ok(f.levels.clone());
            }
            let yx = (f.yx.0.max(at_least.0), f.yx.1.max(at_least.1));
            let levels = Arc::new(self.level_arrays(&field_key, yx)?);
            fields.insert((wi, field), Field { levels: levels.clone(), yx });
            return Ok(levels);
        }
        {
            let mut groups = self.groups.lock().unwrap_or_else(|p| p.into_inner());
            for key in [row.clone(), well_key.clone()] {
                if groups.insert(key.clone()) && !self.group_exists(&key) {
                    metadata::write_group(&self.root.join(&key), self.spec.version, Map::new(), Map::new())?;
                }
            }
        }
        let field_dir = self.root.join(&field_key);
        let yx = match self.spec.extent {
            FieldExtent::Fixed => (self.spec.shape.y, self.spec.shape.x),
            FieldExtent::Grow => {
                let on_disk = self.stored_yx(&field_key)?.unwrap_or((1, 1));
                (on_disk.0.max(at_least.0).max(1), on_disk.1.max(at_least.1).max(1))
            }
        };
        let levels = self.level_arrays(&field_key, yx)?;
        let name = format!("{} {} field {}", self.spec.name, self.spec.wells[wi], field);
        let well = &self.spec.wells[wi];
        let position = self.spec.field_positions_um.iter().find(|p| &p.well == well && p.field == field).map(|p| (p.y_um, p.x_um));
        metadata::write_group(&field_dir, self.spec.version, metadata::image(&self.spec, &name, position), Map::new())?;
        let levels = Arc::new(levels);
        fields.insert((wi, field), Field { levels: levels.clone(), yx });
        Ok(levels)
    }

    /// Creates (writes the metadata of) every pyramid level array of the field
    /// at `field_key` with level-0 extent `yx`.
    fn level_arrays(&self, field_key: &str, yx: (usize, usize)) -> Result<Vec<LevelArray>, ZarrError> {
        let (dtype, c) = (self.spec.dtype, self.spec.shape.c);
        (0..self.spec.pyramid_levels).map(|k| self.create_level_array(&format!("{field_key}/{k}"), k, level_of(yx, k), dtype, c)).collect()
    }

    /// [`level_arrays`](Self::level_arrays) of a label image at `label_key`:
    /// u16, one channel.
    fn label_level_arrays(&self, label_key: &str, yx: (usize, usize)) -> Result<Vec<LevelArray>, ZarrError> {
        (0..self.spec.pyramid_levels)
            .map(|k| self.create_level_array(&format!("{label_key}/{k}"), k, level_of(yx, k), DType::U16, 1))
            .collect()
    }

    /// Level-0 (y, x) of the field at `field_key` as its array metadata on
    /// disk says (a plate being resumed); `None` if it has no level 0 yet.
    fn stored_yx(&self, field_key: &str) -> Result<Option<(usize, usize)>, ZarrError> {
        let file = match self.spec.version {
            NgffVersion::V05 => "zarr.json",
            NgffVersion::V04 => ".zarray",
        };
        let path = self.root.join(format!("{field_key}/0/{file}"));
        let bytes = match std::fs::read(&path) {
            Ok(b) => b,
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Ok(None),
            Err(e) => return Err(ZarrError::io(path, e)),
        };
        let bad = |message: String| ZarrError::Json { path: path.clone(), message };
        let doc: Value = serde_json::from_slice(&bytes).map_err(|e| bad(e.to_string()))?;
        let shape: Vec<usize> = doc
            .get("shape")
            .and_then(Value::as_array)
            .map(|a| a.iter().filter_map(Value::as_u64).map(|v| v as usize).collect())
            .unwrap_or_default();
        match shape.as_slice() {
            [_, _, _, y, x] => Ok(Some((*y, *x))),
            other => Err(bad(format!("expected a 5-d [t, c, z, y, x] shape, found {other:?}"))),
        }
    }

    /// Level-0 (y, x) of an existing field: this writer's, else the one on disk.
    fn field_yx(&self, pos: WellPos, field: usize) -> Result<Option<(usize, usize)>, ZarrError> {
        if let Some(wi) = self.well_index.get(&pos) {
            let fields = self.fields.lock().unwrap_or_else(|p| p.into_inner());
            if let Some(f) = fields.get(&(*wi, field)) {
                return Ok(Some(f.yx));
            }
        }
        let key = format!("{}/{}/{field}", self.spec.rows[pos.row], self.spec.columns[pos.col]);
        self.stored_yx(&key)
    }

    fn group_exists(&self, key: &str) -> bool {
        let dir = self.root.join(key);
        dir.join("zarr.json").exists() || dir.join(".zgroup").exists()
    }

    /// Builds the zarrs array of pyramid level `k` at `key`, `(ly, lx)` in y
    /// and x, `channels` in c, of `dtype`, and writes its metadata
    /// (atomically, by us: zarrs validates and serialises it). Chunks: one per
    /// plane (fixed extent), or the spec's level-`k` plane size (grown extent).
    fn create_level_array(
        &self,
        key: &str,
        k: usize,
        (ly, lx): (usize, usize),
        dtype: DType,
        channels: usize,
    ) -> Result<LevelArray, ZarrError> {
        let s = self.spec.shape;
        let shape = vec![s.t as u64, channels as u64, s.z as u64, ly as u64, lx as u64];
        let (cy, cx) = self.chunk_yx(k, (ly, lx));
        let chunks = vec![1u64, 1, 1, cy as u64, cx as u64];
        let dir = self.root.join(key);
        let store = self.store.clone();
        match self.spec.version {
            NgffVersion::V05 => {
                let dt = match dtype {
                    DType::U8 => data_type::uint8(),
                    DType::U16 => data_type::uint16(),
                    DType::F32 => data_type::float32(),
                };
                let mut builder = match dtype {
                    DType::U8 => ArrayBuilder::new(shape, chunks, dt, 0u8),
                    DType::U16 => ArrayBuilder::new(shape, chunks, dt, 0u16),
                    DType::F32 => ArrayBuilder::new(shape, chunks, dt, 0f32),
                };
                builder
                    .array_to_bytes_codec(Arc::new(BytesCodec::new(Some(Endianness::Little))))
                    .dimension_names(Some(["t", "c", "z", "y", "x"]));
                if let ZarrCompression::Zstd(level) = self.spec.compression {
                    builder.bytes_to_bytes_codecs(vec![Arc::new(ZstdCodec::new(level, false))]);
                }
                let array = builder.build(store, &format!("/{key}")).map_err(|e| ZarrError::zarr(&dir, e))?;
                let doc = match array.metadata() {
                    ArrayMetadata::V3(m) => serde_json::to_value(m),
                    ArrayMetadata::V2(m) => serde_json::to_value(m),
                }
                .map_err(|e| ZarrError::Json { path: dir.join("zarr.json"), message: e.to_string() })?;
                metadata::write_json(&dir.join("zarr.json"), &doc)?;
                Ok(array)
            }
            NgffVersion::V04 => {
                let (dtype, fill) = match dtype {
                    DType::U8 => ("|u1", json!(0)),
                    DType::U16 => ("<u2", json!(0)),
                    DType::F32 => ("<f4", json!(0.0)),
                };
                let compressor = match self.spec.compression {
                    ZarrCompression::None => Value::Null,
                    ZarrCompression::Zstd(level) => json!({"id": "zstd", "level": level}),
                };
                // NGFF 0.4 requires the "/" dimension separator.
                let doc = json!({
                    "zarr_format": 2,
                    "shape": shape,
                    "chunks": chunks,
                    "dtype": dtype,
                    "compressor": compressor,
                    "fill_value": fill,
                    "order": "C",
                    "filters": null,
                    "dimension_separator": "/",
                });
                let path = dir.join(".zarray");
                let meta: ArrayMetadataV2 =
                    serde_json::from_value(doc.clone()).map_err(|e| ZarrError::Json { path: path.clone(), message: e.to_string() })?;
                let array =
                    Array::new_with_metadata(store, &format!("/{key}"), ArrayMetadata::V2(meta)).map_err(|e| ZarrError::zarr(&dir, e))?;
                metadata::write_json(&path, &doc)?;
                Ok(array)
            }
        }
    }

    /// Chunk (y, x) of level `k` for an array of level extent `level_yx`.
    fn chunk_yx(&self, k: usize, level_yx: (usize, usize)) -> (usize, usize) {
        match self.spec.extent {
            FieldExtent::Fixed => level_yx,
            FieldExtent::Grow => self.spec.level_yx(k),
        }
    }

    fn store_plane(
        &self,
        levels: &[LevelArray],
        well: &str,
        field: usize,
        tcz: [usize; 3],
        hw: (usize, usize),
        plane: PlaneRef<'_>,
    ) -> Result<(), ZarrError> {
        let key = format!("{}/{field}", self.well_path(well)?);
        match plane {
            PlaneRef::U8(p) => self.store_typed(levels, &key, tcz, hw, p, downsample(p, hw.0, hw.1, levels.len())),
            PlaneRef::U16(p) => self.store_typed(levels, &key, tcz, hw, p, downsample(p, hw.0, hw.1, levels.len())),
            PlaneRef::F32(p) => self.store_typed(levels, &key, tcz, hw, p, downsample(p, hw.0, hw.1, levels.len())),
        }
    }

    /// Stores a `h × w` plane (level 0) and its `pyramid` (levels 1..) at
    /// `(t, c, z)` of the image at `key` (errors name `key/level`).
    fn store_typed<T: Pixel + Element>(
        &self,
        levels: &[LevelArray],
        key: &str,
        [t, c, z]: [usize; 3],
        (h, w): (usize, usize),
        plane: &[T],
        pyramid: Vec<(Vec<T>, usize, usize)>,
    ) -> Result<(), ZarrError> {
        let err = |k: usize, e: zarrs::array::ArrayError| {
            ZarrError::array(self.root.join(format!("{key}/{k}")), format_args!("plane t={t} c={c} z={z}"), &e)
        };
        if let Some(l0) = levels.first() {
            self.store_level(l0, 0, [t, c, z], (h, w), plane).map_err(|e| err(0, e))?;
        }
        for (k, (data, lh, lw)) in pyramid.iter().enumerate() {
            self.store_level(&levels[k + 1], k + 1, [t, c, z], (*lh, *lw), data).map_err(|e| err(k + 1, e))?;
        }
        Ok(())
    }

    /// Stores the `h × w` level-`k` data of plane `(t, c, z)`: the whole chunk
    /// when chunks are planes of that size, else every chunk tile of the
    /// array, the part outside the data filled with 0 (tiles entirely outside
    /// are erased, so a rewritten plane leaves nothing of an older, larger one).
    fn store_level<T: Pixel + Element>(
        &self,
        array: &LevelArray,
        k: usize,
        [t, c, z]: [usize; 3],
        (h, w): (usize, usize),
        data: &[T],
    ) -> Result<(), zarrs::array::ArrayError> {
        let shape = array.shape();
        let (ay, ax) = (shape[3] as usize, shape[4] as usize);
        let (cy, cx) = self.chunk_yx(k, (ay, ax));
        let (t, c, z) = (t as u64, c as u64, z as u64);
        if (cy, cx) == (h, w) && (ay, ax) == (h, w) {
            return array.store_chunk(&[t, c, z, 0, 0], data);
        }
        let mut tile = vec![T::default(); cy * cx];
        for i in 0..ay.div_ceil(cy) {
            for j in 0..ax.div_ceil(cx) {
                let idx = [t, c, z, i as u64, j as u64];
                let (y0, x0) = (i * cy, j * cx);
                if y0 >= h || x0 >= w {
                    array.erase_chunk(&idx)?;
                    continue;
                }
                let (ny, nx) = ((h - y0).min(cy), (w - x0).min(cx));
                tile.fill(T::default());
                for r in 0..ny {
                    let src = &data[(y0 + r) * w + x0..][..nx];
                    tile[r * cx..r * cx + nx].copy_from_slice(src);
                }
                array.store_chunk(&idx, tile.as_slice())?;
            }
        }
        Ok(())
    }

    /// Writes the well and plate metadata (see [`update_metadata`](Self::update_metadata))
    /// and returns the plate root.
    ///
    /// Also removes temporary files left by an interrupted earlier run (none
    /// of this writer's writes can be in flight: `finish` owns it).
    pub fn finish(self) -> Result<PathBuf, ZarrError> {
        crate::store::remove_stale_temps(&self.root).map_err(|e| ZarrError::io(&self.root, e))?;
        self.update_metadata()?;
        Ok(self.root)
    }

    /// Writes the well metadata of every well with at least one field and the
    /// plate metadata listing those wells, without ending the writer.
    ///
    /// Call it after each completed well to keep the plate readable (by
    /// napari, ome-zarr-py) while a long run goes on or if it is killed;
    /// [`finish`](Self::finish) calls it once more at the end.
    ///
    /// What exists is read from the directory, so the result is correct after
    /// a partial run, after a resume, and when called again. Wells without any
    /// field are left out of the plate's `wells` (their rows and columns stay
    /// in the grid). A well with at least one field lists all
    /// `fields_per_well` fields: those never written are created empty, and
    /// like every plane never written they read as 0 (the fill value).
    /// Wells whose first field is created while this runs appear at the next call.
    pub fn update_metadata(&self) -> Result<(), ZarrError> {
        let _serial = self.metadata_lock.lock().unwrap_or_else(|p| p.into_inner());
        let image_file = match self.spec.version {
            NgffVersion::V05 => "zarr.json",
            NgffVersion::V04 => ".zattrs",
        };
        let mut present = Vec::new();
        let mut field_count = 0;
        // The extent every field gets: the plate's, or with a grown extent the
        // largest field written (ome-zarr-py and napari tile the plate view
        // with the first field's shape, so all fields must share it).
        let mut extent = (self.spec.shape.y, self.spec.shape.x);
        let mut existing = Vec::new();
        for w in &self.spec.wells {
            let pos = self.locate(w)?;
            let key = format!("{}/{}", self.spec.rows[pos.row], self.spec.columns[pos.col]);
            let exists: Vec<bool> =
                (0..self.spec.fields_per_well).map(|f| self.root.join(format!("{key}/{f}/{image_file}")).exists()).collect();
            if !exists.contains(&true) {
                continue;
            }
            if self.spec.extent == FieldExtent::Grow {
                extent = (1, 1);
            }
            existing.push((pos, key, exists));
        }
        if self.spec.extent == FieldExtent::Grow {
            for (pos, _, exists) in &existing {
                for f in (0..exists.len()).filter(|&f| exists[f]) {
                    if let Some((y, x)) = self.field_yx(*pos, f)? {
                        extent = (extent.0.max(y), extent.1.max(x));
                    }
                }
            }
        }
        for (pos, key, exists) in existing {
            // A well with some fields gets all of them: the missing ones as
            // empty images (fill value, no chunks), because ome-zarr-py and
            // napari's plate view open the first well's field paths in every well.
            let fields: Vec<usize> = (0..self.spec.fields_per_well).collect();
            for f in &fields {
                if !exists[*f] || self.spec.extent == FieldExtent::Grow {
                    self.field_arrays(pos, *f, extent)?;
                }
                if self.spec.extent == FieldExtent::Grow {
                    // Label images keep their field's (grown) extent.
                    for name in self.label_names(&self.root.join(format!("{key}/{f}/labels")))? {
                        self.label_arrays(pos, *f, &name, extent)?;
                    }
                }
            }
            field_count = field_count.max(fields.len());
            metadata::write_group(&self.root.join(&key), self.spec.version, metadata::well(&fields), Map::new())?;
            present.push((pos.row, pos.col));
        }
        // Rows are groups too; make sure each present row has its group file.
        for &(r, _) in &present {
            let row = &self.spec.rows[r];
            if !self.group_exists(row) {
                metadata::write_group(&self.root.join(row), self.spec.version, Map::new(), Map::new())?;
            }
        }
        let (_, attrs) = metadata::read_group_attributes(&self.root)?
            .ok_or_else(|| ZarrError::NotAPlate { root: self.root.clone(), reason: "the root group metadata disappeared".into() })?;
        let mut extra = Map::new();
        if let Some(h) = attrs.get(HCSFLOW_KEY) {
            extra.insert(HCSFLOW_KEY.into(), h.clone());
        }
        metadata::write_group(&self.root, self.spec.version, metadata::plate(&self.spec, &present, field_count), extra)?;
        Ok(())
    }
}

/// Plane `z` of `stack` as a typed slice (no copy).
fn plane_ref(stack: &Stack, z: usize) -> PlaneRef<'_> {
    match stack {
        Stack::U8(a) => PlaneRef::U8(a.plane(z)),
        Stack::U16(a) => PlaneRef::U16(a.plane(z)),
        Stack::F32(a) => PlaneRef::F32(a.plane(z)),
    }
}
