//! A file appears under its name whole or not at all.

use std::fs::{File, OpenOptions};
use std::io::{self, BufWriter, Write};
use std::path::{Path, PathBuf};

use crate::temp_name;

/// How far a completed [`write_atomic`] is guaranteed to survive.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Durability {
    /// Against the writing process being interrupted (Ctrl-C, crash, kill):
    /// the data is not fsync'ed, so a power loss may still lose it. What
    /// image, table and OME-Zarr writers use: an fsync per file would cost
    /// more than the write itself on network file systems.
    Process,
    /// The file's data is fsync'ed before the rename, so the name never
    /// points at data still only in the page cache.
    Fsync,
}

/// Writes `bytes` to `path` atomically: see [`write_atomic_with`].
pub fn write_atomic(path: &Path, bytes: &[u8], durability: Durability) -> io::Result<()> {
    write_in_temp(path, durability, |mut file| file.write_all(bytes))
}

/// Writes the file `path` through `write` atomically: `write` fills a hidden
/// temporary in `path`'s folder (named by [`temp_name`]), which is renamed
/// over `path` only when `write`, the flush and (per `durability`) the fsync
/// succeeded. So `path` holds either its previous content or the whole new
/// file, never a part, for readers and after an interruption; if anything
/// fails (or `write` panics) the temporary is removed and the error returned.
/// (A process killed outright can leave the temporary behind, never a partial
/// `path`; [`is_temp_name`](crate::is_temp_name) recognises it.) The folder
/// must exist. If `path` is a symbolic link, the link itself is replaced.
///
/// `write` writes into a 1 MiB buffer over the file, which it may also seek.
pub fn write_atomic_with<E: From<io::Error>>(
    path: &Path,
    durability: Durability,
    write: impl FnOnce(&mut BufWriter<&File>) -> Result<(), E>,
) -> Result<(), E> {
    let mut result = Ok(());
    let io_result = write_in_temp(path, durability, |file| {
        let mut out = BufWriter::with_capacity(1 << 20, file);
        result = write(&mut out);
        if result.is_err() {
            let _unwritten = out.into_parts();
            return Err(io::Error::other("the writer failed"));
        }
        out.flush()
    });
    result?;
    io_result.map_err(E::from)
}

/// Creates the temporary, fills it through `fill`, syncs per `durability`
/// and renames it over `path`; removes it on any failure.
fn write_in_temp(path: &Path, durability: Durability, fill: impl FnOnce(&File) -> io::Result<()>) -> io::Result<()> {
    let (temp, file) = create_temp(path)?;
    fill(&file)?;
    if durability == Durability::Fsync {
        file.sync_all()?;
    }
    drop(file);
    std::fs::rename(&temp.path, path)?;
    temp.disarm();
    Ok(())
}

/// Removes the temporary file when dropped, unless disarmed after a successful rename.
struct TempFile {
    path: PathBuf,
    armed: bool,
}

impl TempFile {
    fn disarm(mut self) {
        self.armed = false;
    }
}

impl Drop for TempFile {
    fn drop(&mut self) {
        if self.armed {
            let _ = std::fs::remove_file(&self.path);
        }
    }
}

/// Creates a new temporary file beside `target`; retries on a name that
/// exists (a stale temporary of a dead process with the same pid).
fn create_temp(target: &Path) -> io::Result<(TempFile, File)> {
    let name = target
        .file_name()
        .filter(|n| !n.is_empty())
        .ok_or_else(|| io::Error::new(io::ErrorKind::InvalidInput, "the path does not name a file"))?;
    let dir = match target.parent() {
        Some(p) if !p.as_os_str().is_empty() => p,
        _ => Path::new("."),
    };
    let name = name.to_string_lossy();
    let mut last_err = None;
    for _ in 0..64 {
        let path = dir.join(temp_name(&name));
        match OpenOptions::new().write(true).create_new(true).open(&path) {
            Ok(file) => return Ok((TempFile { path, armed: true }, file)),
            Err(e) if e.kind() == io::ErrorKind::AlreadyExists => last_err = Some(e),
            Err(e) => return Err(e),
        }
    }
    Err(last_err.unwrap_or_else(|| io::Error::other("could not create a temporary file")))
}

#[cfg(test)]
mod tests {
    use std::io::{self, Seek, SeekFrom, Write};
    use std::path::Path;

    use super::{write_atomic, write_atomic_with, Durability};

    fn names(dir: &Path) -> Vec<String> {
        let mut v: Vec<String> =
            std::fs::read_dir(dir).expect("read_dir").map(|e| e.expect("entry").file_name().to_string_lossy().into_owned()).collect();
        v.sort();
        v
    }

    #[test]
    fn writes_and_replaces_whole_files_leaving_no_temporary() {
        let dir = tempfile::tempdir().expect("tempdir");
        let path = dir.path().join("a.csv");
        write_atomic(&path, b"first", Durability::Process).expect("write");
        assert_eq!(std::fs::read(&path).expect("read"), b"first");
        write_atomic(&path, b"second, longer", Durability::Fsync).expect("replace");
        assert_eq!(std::fs::read(&path).expect("read"), b"second, longer");
        assert_eq!(names(dir.path()), ["a.csv"]);
    }

    #[test]
    fn the_writer_may_seek_back() {
        let dir = tempfile::tempdir().expect("tempdir");
        let path = dir.path().join("b.bin");
        write_atomic_with(&path, Durability::Process, |w| -> io::Result<()> {
            w.write_all(b"xxxxtail")?;
            w.seek(SeekFrom::Start(0))?;
            w.write_all(b"head")
        })
        .expect("write");
        assert_eq!(std::fs::read(&path).expect("read"), b"headtail");
    }

    #[derive(Debug, PartialEq)]
    enum Failure {
        Io(io::ErrorKind),
        Refused,
    }

    impl From<io::Error> for Failure {
        fn from(e: io::Error) -> Self {
            Failure::Io(e.kind())
        }
    }

    #[test]
    fn a_failed_write_keeps_the_old_file_removes_the_temporary_and_returns_the_writers_error() {
        let dir = tempfile::tempdir().expect("tempdir");
        let path = dir.path().join("c.tif");
        std::fs::write(&path, b"old").expect("seed");
        let err = write_atomic_with(&path, Durability::Fsync, |w| {
            w.write_all(&[7u8; 3 << 20])?;
            Err(Failure::Refused)
        })
        .expect_err("refused");
        assert_eq!(err, Failure::Refused);
        assert_eq!(std::fs::read(&path).expect("read"), b"old");
        assert_eq!(names(dir.path()), ["c.tif"]);
    }

    #[test]
    fn a_panicking_writer_leaves_no_temporary() {
        let dir = tempfile::tempdir().expect("tempdir");
        let path = dir.path().join("d.tif");
        let caught = std::panic::catch_unwind(|| {
            let _ = write_atomic_with(&path, Durability::Process, |w| -> io::Result<()> {
                w.write_all(b"partial")?;
                panic!("writer panicked")
            });
        });
        assert!(caught.is_err());
        assert!(names(dir.path()).is_empty(), "{:?}", names(dir.path()));
    }

    #[test]
    fn io_errors_are_returned_typed() {
        let dir = tempfile::tempdir().expect("tempdir");
        let missing = dir.path().join("no such folder").join("e.csv");
        let err = write_atomic(&missing, b"x", Durability::Process).expect_err("no folder");
        assert_eq!(err.kind(), io::ErrorKind::NotFound);
        let err = write_atomic_with(&missing, Durability::Process, |_| Ok::<(), Failure>(())).expect_err("no folder");
        assert_eq!(err, Failure::Io(io::ErrorKind::NotFound));
        let err = write_atomic(Path::new("/"), b"x", Durability::Process).expect_err("not a file name");
        assert_eq!(err.kind(), io::ErrorKind::InvalidInput);
    }
}
