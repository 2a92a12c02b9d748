//! A write-only zarrs store on the local file system where every key is written
//! to a temporary file in the same directory and then renamed into place.
//!
//! Why not `zarrs_filesystem::FilesystemStore`: it writes chunk files in place
//! (an interrupted run leaves truncated chunks that readers fail on) and
//! fsyncs every chunk. With rename, a reader or a resumed run sees either the
//! old chunk, the new one, or none — never half of one. No fsync: the guarantee
//! is against process interruption (Ctrl-C, crash, kill), not power loss.

use std::path::{Path, PathBuf};

use hcsflow_io::Durability;
use zarrs::storage::{Bytes, OffsetBytesIterator, StorageError, StoreKey, StorePrefix, WritableStorageTraits};

/// Writes `bytes` to `path` atomically ([`hcsflow_io::write_atomic`], not
/// fsync'ed), creating parent directories. Used for chunks and metadata JSON.
pub(crate) fn write_atomic(path: &Path, bytes: &[u8]) -> std::io::Result<()> {
    std::fs::create_dir_all(path.parent().unwrap_or(Path::new(".")))?;
    hcsflow_io::write_atomic(path, bytes, Durability::Process)
}

/// Removes hcsflow's temporary files ([`hcsflow_io::is_temp_name`]: every
/// hcsflow writer's, of this version and earlier ones) left under `dir` by
/// interrupted writes (a killed run); symbolic links are not followed. Only
/// call when no write is in flight under `dir`. Returns how many.
pub fn remove_stale_temps(dir: &Path) -> std::io::Result<usize> {
    let mut removed = 0;
    for entry in std::fs::read_dir(dir)? {
        let entry = entry?;
        let kind = entry.file_type()?;
        if kind.is_dir() {
            removed += remove_stale_temps(&entry.path())?;
        } else if kind.is_file() && hcsflow_io::is_temp_name(&entry.file_name().to_string_lossy()) {
            match std::fs::remove_file(entry.path()) {
                Err(e) if e.kind() != std::io::ErrorKind::NotFound => return Err(e),
                _ => removed += 1,
            }
        }
    }
    Ok(removed)
}

/// The store handed to zarrs arrays: keys map to paths under `root`.
#[derive(Debug)]
pub(crate) struct AtomicFsStore {
    root: PathBuf,
}

impl AtomicFsStore {
    pub(crate) fn new(root: PathBuf) -> AtomicFsStore {
        AtomicFsStore { root }
    }

    fn path(&self, key: &str) -> PathBuf {
        self.root.join(key.trim_start_matches('/'))
    }
}

impl WritableStorageTraits for AtomicFsStore {
    fn set(&self, key: &StoreKey, value: Bytes) -> Result<(), StorageError> {
        write_atomic(&self.path(key.as_str()), &value).map_err(StorageError::from)
    }

    fn set_partial_many(&self, key: &StoreKey, _offset_values: OffsetBytesIterator) -> Result<(), StorageError> {
        // Never needed: chunks are written whole (no sharding).
        Err(StorageError::Other(format!("partial writes are not supported by the hcsflow plate store ({})", key.as_str())))
    }

    fn erase(&self, key: &StoreKey) -> Result<(), StorageError> {
        match std::fs::remove_file(self.path(key.as_str())) {
            Err(e) if e.kind() != std::io::ErrorKind::NotFound => Err(e.into()),
            _ => Ok(()),
        }
    }

    fn erase_prefix(&self, prefix: &StorePrefix) -> Result<(), StorageError> {
        match std::fs::remove_dir_all(self.path(prefix.as_str())) {
            Err(e) if e.kind() != std::io::ErrorKind::NotFound => Err(e.into()),
            _ => Ok(()),
        }
    }

    fn supports_set_partial(&self) -> bool {
        false
    }
}
