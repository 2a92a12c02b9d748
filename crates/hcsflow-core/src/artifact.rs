//! What a function sees besides its stack: metadata about the stack's planes
//! (injected by the pipeline from the plate), tables produced by earlier steps,
//! and the tables it produces itself.
//!
//! Images flow through a pipeline as stacks; everything else a function makes
//! (tile positions, per-image counts, object measurements, the edge table of a
//! registration) is a named [`Table`], an *artifact*. A function declares the
//! artifacts it produces and consumes ([`Artifacts`], registered with
//! [`Registry::register_with_artifacts`](crate::Registry::register_with_artifacts)),
//! so the pipeline compiler can wire producer steps to consumer steps and
//! refuse a pipeline whose consumer has no producer, before any pixel is read.
//!
//! Rows of a table may belong to one plane of the stack ([`Row::plane`]): the
//! pipeline writes that plane's site/channel/z/timepoint next to the row, and
//! when a consumer's stack has other planes than the producer's (positions
//! computed on a composite, used on each channel), the pipeline re-indexes the
//! rows to the consumer's planes by the components they share.

use std::collections::BTreeMap;
use std::fmt;
use std::sync::Arc;

use serde::Serialize;

use crate::stack::Stack;

/// One value of a table.
#[derive(Debug, Clone, PartialEq, Serialize)]
#[serde(untagged)]
pub enum Cell {
    Int(i64),
    Float(f64),
    Text(String),
    /// No value (an empty CSV field).
    Empty,
}

impl Cell {
    /// The value as a number (`Int` and `Float`), else `None`.
    pub fn as_f64(&self) -> Option<f64> {
        match self {
            Cell::Int(v) => Some(*v as f64),
            Cell::Float(v) => Some(*v),
            Cell::Text(_) | Cell::Empty => None,
        }
    }
}

impl fmt::Display for Cell {
    /// CSV text: numbers in Rust's shortest round-trip form, text quoted when
    /// it holds a comma, quote or line break.
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Cell::Int(v) => write!(f, "{v}"),
            Cell::Float(v) => write!(f, "{v}"),
            Cell::Text(s) if s.contains([',', '"', '\n', '\r']) => write!(f, "\"{}\"", s.replace('"', "\"\"")),
            Cell::Text(s) => f.write_str(s),
            Cell::Empty => Ok(()),
        }
    }
}

impl From<i64> for Cell {
    fn from(v: i64) -> Self {
        Cell::Int(v)
    }
}
impl From<u32> for Cell {
    fn from(v: u32) -> Self {
        Cell::Int(i64::from(v))
    }
}
impl From<usize> for Cell {
    fn from(v: usize) -> Self {
        Cell::Int(v as i64)
    }
}
impl From<f64> for Cell {
    fn from(v: f64) -> Self {
        Cell::Float(v)
    }
}
impl From<bool> for Cell {
    fn from(v: bool) -> Self {
        Cell::Text(if v { "true" } else { "false" }.into())
    }
}
impl From<&str> for Cell {
    fn from(v: &str) -> Self {
        Cell::Text(v.to_string())
    }
}
impl From<String> for Cell {
    fn from(v: String) -> Self {
        Cell::Text(v)
    }
}
impl<T: Into<Cell>> From<Option<T>> for Cell {
    fn from(v: Option<T>) -> Self {
        v.map_or(Cell::Empty, Into::into)
    }
}

/// One row: its cells (one per column) and the plane of the stack it belongs
/// to, if any (index into the stack the function received).
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct Row {
    pub plane: Option<usize>,
    pub cells: Vec<Cell>,
}

/// A named-column table: the one type of every artifact.
#[derive(Debug, Clone, PartialEq, Default, Serialize)]
pub struct Table {
    pub columns: Vec<String>,
    pub rows: Vec<Row>,
}

/// A row whose length differs from the table's columns.
#[derive(Debug, Clone, PartialEq, thiserror::Error)]
#[error("a row has {got} cells, the table has {expected} columns")]
pub struct RowLengthError {
    pub expected: usize,
    pub got: usize,
}

impl Table {
    pub fn new<S: Into<String>>(columns: impl IntoIterator<Item = S>) -> Table {
        Table { columns: columns.into_iter().map(Into::into).collect(), rows: Vec::new() }
    }

    /// Appends a row; its length must match the columns.
    pub fn push(&mut self, plane: Option<usize>, cells: Vec<Cell>) -> Result<(), RowLengthError> {
        if cells.len() != self.columns.len() {
            return Err(RowLengthError { expected: self.columns.len(), got: cells.len() });
        }
        self.rows.push(Row { plane, cells });
        Ok(())
    }

    /// Index of a column by name.
    pub fn column(&self, name: &str) -> Option<usize> {
        self.columns.iter().position(|c| c == name)
    }

    /// The numeric value of `column` in the first row of `plane`.
    pub fn plane_value(&self, plane: usize, column: &str) -> Option<f64> {
        let c = self.column(column)?;
        self.rows.iter().find(|r| r.plane == Some(plane)).and_then(|r| r.cells.get(c)).and_then(Cell::as_f64)
    }

    /// Appends `other`'s rows, their planes shifted by `plane_offset`. The
    /// columns must be the same (the rows of one function's per-plane calls).
    pub fn append(&mut self, other: Table, plane_offset: usize) -> Result<(), String> {
        if self.columns.is_empty() && self.rows.is_empty() {
            self.columns = other.columns.clone();
        }
        if other.columns != self.columns {
            return Err(format!("columns differ: [{}] vs [{}]", self.columns.join(", "), other.columns.join(", ")));
        }
        self.rows.extend(other.rows.into_iter().map(|mut r| {
            r.plane = r.plane.map(|p| p + plane_offset);
            r
        }));
        Ok(())
    }

    /// The rows of `plane`, re-indexed to plane 0 (what a per-plane call sees).
    pub fn of_plane(&self, plane: usize) -> Table {
        Table {
            columns: self.columns.clone(),
            rows: self.rows.iter().filter(|r| r.plane == Some(plane)).map(|r| Row { plane: Some(0), cells: r.cells.clone() }).collect(),
        }
    }
}

/// What the pipeline knows about one plane of a stack (from the plate).
/// Components are 1-based; 0 means collapsed by an earlier reduction.
#[derive(Debug, Clone, PartialEq, Default, Serialize)]
pub struct PlaneInfo {
    pub site: u32,
    pub channel: u32,
    pub z_index: u32,
    pub timepoint: u32,
    /// Stage position of the site, µm, image-oriented (x right, y down).
    pub stage_um: Option<(f64, f64)>,
    /// Grid cell of the site (row, column), 0-based.
    pub grid_cell: Option<(u32, u32)>,
}

/// What the pipeline knows about a stack: injected metadata. Empty when a
/// function is called outside a pipeline (e.g. `hcsflow apply` on a file), so
/// every function must work — or fail clearly — without it.
#[derive(Debug, Clone, PartialEq, Default, Serialize)]
pub struct StackInfo {
    /// Well name (`B03`), empty outside a plate.
    pub well: String,
    /// One entry per plane of the stack, in stack order, or empty.
    pub planes: Vec<PlaneInfo>,
    pub pixel_size_um: Option<f64>,
}

impl StackInfo {
    /// The stage positions of all `n` planes, if every plane has one.
    pub fn stage_positions_um(&self, n: usize) -> Option<Vec<(f64, f64)>> {
        if self.planes.len() != n {
            return None;
        }
        self.planes.iter().map(|p| p.stage_um).collect()
    }

    /// The grid cells of all `n` planes, if every plane has one.
    pub fn grid_cells(&self, n: usize) -> Option<Vec<(u32, u32)>> {
        if self.planes.len() != n {
            return None;
        }
        self.planes.iter().map(|p| p.grid_cell).collect()
    }
}

/// The context of one function call: injected metadata, consumed artifacts,
/// and what the call produces (artifacts, and notes for the run report).
#[derive(Debug, Clone, Default)]
pub struct CallContext {
    pub stack: StackInfo,
    /// Consumed artifacts by name, rows indexed to this call's planes.
    pub inputs: BTreeMap<String, Table>,
    /// Consumed [`ArtifactKind::Planes`] artifacts by name: the result stack
    /// of the producing plate-wide step for this call's group (e.g. BaSiC's
    /// `[flat-field, dark-field]` of this channel). Shared, never copied per plane.
    pub planes: BTreeMap<String, Arc<Stack>>,
    /// Set when the stack's planes were reduced as they were read (a
    /// function's [`PlaneReduction`](crate::PlaneReduction), applied to a
    /// plate-wide sample): the `(height, width)` of the planes before, which
    /// the function's result must have.
    pub reduced_from: Option<(usize, usize)>,
    outputs: Vec<(String, Table)>,
    notes: Vec<String>,
}

impl CallContext {
    pub fn new(stack: StackInfo, inputs: BTreeMap<String, Table>) -> CallContext {
        CallContext { stack, inputs, ..CallContext::default() }
    }

    /// The context of a per-plane call on plane `z`: that plane's metadata
    /// and artifact rows (re-indexed to plane 0), nothing produced yet.
    pub fn for_plane(&self, z: usize) -> CallContext {
        CallContext {
            stack: StackInfo {
                well: self.stack.well.clone(),
                planes: self.stack.planes.get(z).cloned().into_iter().collect(),
                pixel_size_um: self.stack.pixel_size_um,
            },
            inputs: self.inputs.iter().map(|(n, t)| (n.clone(), t.of_plane(z))).collect(),
            planes: self.planes.clone(),
            reduced_from: self.reduced_from,
            outputs: Vec::new(),
            notes: Vec::new(),
        }
    }

    /// Records a produced artifact (it must be declared in the function's [`Artifacts`]).
    pub fn produce(&mut self, name: &str, table: Table) {
        self.outputs.push((name.to_string(), table));
    }

    /// A note for the run report: something the user must know about this
    /// result that is not an error (e.g. stitching fell back to stage positions).
    pub fn note(&mut self, text: impl Into<String>) {
        self.notes.push(text.into());
    }

    pub fn outputs(&self) -> &[(String, Table)] {
        &self.outputs
    }

    pub fn notes(&self) -> &[String] {
        &self.notes
    }

    /// Takes the produced artifacts and notes.
    pub fn take_results(&mut self) -> (Vec<(String, Table)>, Vec<String>) {
        (std::mem::take(&mut self.outputs), std::mem::take(&mut self.notes))
    }
}

/// What an artifact is.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, Serialize)]
#[serde(rename_all = "snake_case")]
pub enum ArtifactKind {
    /// A [`Table`] the function records in its [`CallContext`] (written as CSV).
    #[default]
    Table,
    /// The result stack of the producing call itself (e.g. BaSiC's
    /// `[flat-field, dark-field]`), produced by a plate-wide step and given
    /// to consumers in [`CallContext::planes`], the one whose group matches
    /// theirs (same channel). Written as the producing step's TIFFs.
    Planes,
}

/// One artifact a function produces or consumes.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct ArtifactDecl {
    pub name: &'static str,
    /// What it holds (its columns), for `hcsflow functions`.
    pub doc: &'static str,
    /// For consumed artifacts: the function works without it (e.g. `assemble`
    /// registers the tiles itself when no earlier step computed positions).
    pub optional: bool,
    /// A table (the default) or the producer's result planes.
    pub kind: ArtifactKind,
    /// For consumed artifacts: the text argument that stands in for it
    /// (`basic_correct`'s `flatfield` file instead of a plate-wide fit). The
    /// pipeline compiler then requires exactly one of the two: the artifact
    /// wired from an earlier step, or the argument given (non-empty).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub instead: Option<&'static str>,
}

impl ArtifactDecl {
    /// A required table artifact.
    pub const fn table(name: &'static str, doc: &'static str) -> ArtifactDecl {
        ArtifactDecl { name, doc, optional: false, kind: ArtifactKind::Table, instead: None }
    }

    /// A planes artifact ([`ArtifactKind::Planes`]).
    pub const fn planes(name: &'static str, doc: &'static str) -> ArtifactDecl {
        ArtifactDecl { name, doc, optional: false, kind: ArtifactKind::Planes, instead: None }
    }

    /// Consumed optionally, or else through the text argument `arg` (see [`ArtifactDecl::instead`]).
    pub const fn or_argument(self, arg: &'static str) -> ArtifactDecl {
        ArtifactDecl { optional: true, instead: Some(arg), ..self }
    }
}

/// The artifacts a function produces and consumes.
#[derive(Debug, Clone, PartialEq, Default, Serialize)]
pub struct Artifacts {
    pub produces: Vec<ArtifactDecl>,
    pub consumes: Vec<ArtifactDecl>,
}

impl Artifacts {
    pub fn is_empty(&self) -> bool {
        self.produces.is_empty() && self.consumes.is_empty()
    }
}
