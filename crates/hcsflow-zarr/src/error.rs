//! Errors of the plate writer. Every variant names the file, well or plane
//! involved, so a failed run can say what to fix without a debugger.

use std::path::PathBuf;

use hcsflow_core::DType;

/// What can go wrong creating, writing or finishing an OME-Zarr plate.
#[derive(Debug, thiserror::Error)]
pub enum ZarrError {
    /// The plate description cannot produce a valid NGFF plate.
    #[error("invalid plate spec: {0}")]
    InvalidSpec(String),

    /// `create` refuses to write into a directory that already has content:
    /// outputs are never silently mixed with older files.
    #[error("output directory {root} exists and is not empty; {hint}")]
    RootNotEmpty { root: PathBuf, hint: String },

    /// `open_existing` was pointed at something that is not an hcsflow plate.
    #[error("{root} is not an hcsflow OME-Zarr plate: {reason}")]
    NotAPlate { root: PathBuf, reason: String },

    /// `create_or_resume` found a plate written with a different spec.
    #[error("cannot resume {root}: it was created with a different spec ({detail})")]
    SpecMismatch { root: PathBuf, detail: String },

    /// The well name is not one of the plate's wells.
    #[error("unknown well '{well}' for plate {root} (wells: {known})")]
    UnknownWell { root: PathBuf, well: String, known: String },

    /// Field index beyond `fields_per_well`.
    #[error("well {well}: field {field} out of range (fields_per_well = {fields_per_well}, fields are 0-based)")]
    FieldOutOfRange { well: String, field: usize, fields_per_well: usize },

    /// A t, c or z index beyond the field shape.
    #[error("well {well} field {field}: {axis} = {index} out of range (size {size})")]
    IndexOutOfRange { well: String, field: usize, axis: char, index: usize, size: usize },

    /// The plane given to `write_plane` does not have shape `[1, Y, X]`.
    #[error("well {well} field {field} (t={t}, c={c}, z={z}): plane shape {got:?}, expected {expected:?} ([1, Y, X])")]
    PlaneShape { well: String, field: usize, t: usize, c: usize, z: usize, expected: [usize; 3], got: [usize; 3] },

    /// The plane's dtype is not the plate's dtype.
    #[error("well {well} field {field} (t={t}, c={c}, z={z}): plane dtype {got}, plate dtype {expected}")]
    PlaneDType { well: String, field: usize, t: usize, c: usize, z: usize, expected: DType, got: DType },

    /// `write_field` received the wrong number of stacks.
    #[error("well {well} field {field}: write_field got {got} stacks, expected t*c = {expected} (indexed [t][c])")]
    FieldStackCount { well: String, field: usize, expected: usize, got: usize },

    /// A stack given to `write_field` does not have shape `[Z, Y, X]`.
    #[error("well {well} field {field} (t={t}, c={c}): stack shape {got:?}, expected {expected:?} ([Z, Y, X])")]
    StackShape { well: String, field: usize, t: usize, c: usize, expected: [usize; 3], got: [usize; 3] },

    /// A label plane or label name that `write_label_plane` cannot store
    /// (not an integer plane, wrong shape, a name that is not a path segment).
    #[error("well {well} field {field}: label image '{name}' (t={t}, z={z}): {problem}")]
    LabelPlane { well: String, field: usize, name: String, t: usize, z: usize, problem: String },

    /// File system error on a path.
    #[error("{path}: {source}")]
    Io { path: PathBuf, source: std::io::Error },

    /// Metadata JSON could not be read, parsed or produced.
    #[error("{path}: invalid JSON metadata: {message}")]
    Json { path: PathBuf, message: String },

    /// An OME-Zarr plate's metadata (or an array's) that cannot be read as
    /// NGFF says, with what is wrong.
    #[error("{path}: {message}")]
    Metadata { path: PathBuf, message: String },

    /// An error reported by zarrs (array creation, encoding, storage). When
    /// the store failed with an I/O error (a full disk, say), `io` keeps it,
    /// so a caller tells it apart without reading `message`.
    #[error("{path}: zarr error: {message}")]
    Zarr {
        path: PathBuf,
        message: String,
        #[source]
        io: Option<std::io::Error>,
    },
}

impl ZarrError {
    pub(crate) fn io(path: impl Into<PathBuf>, source: std::io::Error) -> ZarrError {
        ZarrError::Io { path: path.into(), source }
    }

    pub(crate) fn zarr(path: impl Into<PathBuf>, e: impl std::fmt::Display) -> ZarrError {
        ZarrError::Zarr { path: path.into(), message: e.to_string(), io: None }
    }

    /// A zarrs array error on `path`, described by `context`; the store's
    /// I/O error, if that is what it was, stays typed in `io` (zarrs shares it
    /// behind an `Arc`, so its kind and text are carried over).
    pub(crate) fn array(path: impl Into<PathBuf>, context: impl std::fmt::Display, e: &zarrs::array::ArrayError) -> ZarrError {
        let io = match e {
            zarrs::array::ArrayError::StorageError(zarrs::storage::StorageError::IOError(io)) => {
                Some(std::io::Error::new(io.kind(), io.to_string()))
            }
            _ => None,
        };
        ZarrError::Zarr { path: path.into(), message: format!("{context}: {e}"), io }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use zarrs::array::ArrayError;
    use zarrs::storage::StorageError;

    #[test]
    fn a_store_io_error_stays_typed_under_the_zarrs_text() {
        let full = ArrayError::StorageError(StorageError::from(std::io::Error::from(std::io::ErrorKind::StorageFull)));
        let e = ZarrError::array("/o/p.zarr/A/1/0/0", "plane t=0 c=1 z=2", &full);
        let io = std::error::Error::source(&e).and_then(|s| s.downcast_ref::<std::io::Error>()).map(std::io::Error::kind);
        assert_eq!(io, Some(std::io::ErrorKind::StorageFull), "{e}");
        assert!(e.to_string().starts_with("/o/p.zarr/A/1/0/0: zarr error: plane t=0 c=1 z=2: "), "{e}");
        // Not a storage failure: no I/O error to find.
        let other = ArrayError::InvalidChunkGridIndicesError(vec![9, 9]);
        assert!(std::error::Error::source(&ZarrError::array("/o", "x", &other)).is_none());
    }
}
