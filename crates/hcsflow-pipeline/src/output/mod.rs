//! What a run writes: every file goes through [`write_atomic`] (a hidden
//! temporary renamed into place, [`hcsflow_io`]).
//!
//! - [`manifest`]: `OUT/run_manifest.json`, every well's outcome;
//! - [`tiff`]: the output planes of steps materialized as TIFF;
//! - [`plate`]: each such step's `hcsflow-plate.json`, which makes its TIFFs a plate;
//! - [`tables`]: the per-well artifact CSVs, the joined tables and the
//!   `summary.csv`/`artifacts.csv` summaries;
//! - [`zarr`]: the OME-Zarr plates (`hcsflow-zarr` writes their files).

use std::fs::File;
use std::io::BufWriter;
use std::path::Path;

use hcsflow_io::Durability;

use crate::PipelineError;

/// `OUT/run_report.json`: the run's [`RunReport`](crate::RunReport) (device,
/// timings, routes, peak RSS, failures, notes), written at the end of every
/// run; what `report.html` is made from.
pub const RUN_REPORT_NAME: &str = "run_report.json";
/// `OUT/report.html` and `OUT/hcsflow_mqc.json`: the QC report and its
/// MultiQC side output (written by `hcsflow-report`, listed here so that
/// step names cannot take them and `--overwrite` removes them).
pub const REPORT_HTML_NAME: &str = "report.html";
pub const REPORT_MQC_NAME: &str = "hcsflow_mqc.json";

/// Writes `report` to `OUT/run_report.json`.
pub(crate) fn write_run_report(out: &Path, report: &crate::RunReport) -> Result<(), PipelineError> {
    let path = out.join(RUN_REPORT_NAME);
    let json = serde_json::to_vec_pretty(report).map_err(|e| PipelineError::io(&path, std::io::Error::other(e)))?;
    write_atomic(&path, &json)
}

pub(crate) mod manifest;
pub(crate) mod plate;
pub(crate) mod tables;
pub(crate) mod tiff;
pub(crate) mod zarr;

/// Writes `bytes` to `path` atomically ([`hcsflow_io::write_atomic_with`], not
/// fsync'ed). If anything fails the temporary is removed and `path` is as it
/// was; the error names `path`.
pub(crate) fn write_atomic(path: &Path, bytes: &[u8]) -> Result<(), PipelineError> {
    write_atomic_with(path, bytes, |w, bytes| disk_full::write(w, bytes))
}

/// [`write_atomic`] with the function that fills the temporary.
fn write_atomic_with(
    path: &Path,
    bytes: &[u8],
    write: impl FnOnce(&mut BufWriter<&File>, &[u8]) -> std::io::Result<()>,
) -> Result<(), PipelineError> {
    let replaced = std::fs::metadata(path).map(|m| m.len()).ok();
    hcsflow_io::write_atomic_with(path, Durability::Process, |w| write(w, bytes)).map_err(|e| PipelineError::io(path, e))?;
    disk_full::freed(replaced.unwrap_or(0));
    Ok(())
}

/// Test-only fault injection, not a feature: with the environment variable
/// `HCSFLOW_TEST_DISK_FULL_AFTER=N` (read once per process), the run's own
/// writes (wells' TIFF planes and CSV tables, the manifest, summaries; not
/// OME-Zarr chunks, which `hcsflow-zarr` writes) behave as on a file system
/// with N bytes free: a write that does not fit writes what fits, then fails
/// with ENOSPC; a replaced file frees its old size. The process-level
/// disk-full tests use it, so they run where no small file system can be mounted.
pub(crate) mod disk_full {
    use std::io::Write;
    use std::sync::{Mutex, OnceLock};

    static FREE: OnceLock<Option<Mutex<u64>>> = OnceLock::new();

    fn free() -> Option<&'static Mutex<u64>> {
        FREE.get_or_init(|| std::env::var("HCSFLOW_TEST_DISK_FULL_AFTER").ok()?.trim().parse().ok().map(Mutex::new)).as_ref()
    }

    /// "No space left on device": ENOSPC is 28 on Linux, macOS and the BSDs.
    fn enospc() -> std::io::Error {
        std::io::Error::from_raw_os_error(28)
    }

    /// Writes `bytes` to `file` (all of them unless the injection is on).
    pub(super) fn write(file: &mut impl Write, bytes: &[u8]) -> std::io::Result<()> {
        let Some(free) = free() else {
            return file.write_all(bytes);
        };
        let mut free = free.lock().unwrap_or_else(|p| p.into_inner());
        let fits = usize::try_from(*free).unwrap_or(usize::MAX).min(bytes.len());
        file.write_all(&bytes[..fits])?;
        if fits < bytes.len() {
            return Err(enospc());
        }
        *free -= fits as u64;
        Ok(())
    }

    /// Takes `len` bytes for a file another crate writes; ENOSPC if they do not fit.
    pub(crate) fn reserve(len: u64) -> std::io::Result<()> {
        let Some(free) = free() else { return Ok(()) };
        let mut free = free.lock().unwrap_or_else(|p| p.into_inner());
        *free = free.checked_sub(len).ok_or_else(enospc)?;
        Ok(())
    }

    /// A file of `len` bytes was replaced or removed.
    pub(super) fn freed(len: u64) {
        if let Some(free) = free() {
            let mut free = free.lock().unwrap_or_else(|p| p.into_inner());
            *free = free.saturating_add(len);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A write that fails half-way (the disk fills) leaves no temporary and
    /// the target as it was.
    #[test]
    fn a_failed_atomic_write_removes_its_temporary() {
        let dir = tempfile::tempdir().expect("tempdir");
        let target = dir.path().join("table.csv");
        std::fs::write(&target, "old").expect("write");
        let e = write_atomic_with(&target, b"new contents", |f, bytes| {
            std::io::Write::write_all(f, &bytes[..4])?;
            Err(std::io::Error::from_raw_os_error(28))
        })
        .expect_err("the write fails");
        let text = e.to_string();
        assert!(text.starts_with(&target.display().to_string()) && text.contains("(os error 28)"), "{text}");
        assert!(crate::exec::storage_exhausted(&e));
        let names: Vec<String> = std::fs::read_dir(dir.path())
            .expect("read_dir")
            .map(|e| e.expect("entry").file_name().to_string_lossy().into_owned())
            .collect();
        assert_eq!(names, ["table.csv"]);
        assert_eq!(std::fs::read_to_string(&target).expect("read"), "old");
        write_atomic(&target, b"new").expect("write");
        assert_eq!(std::fs::read_to_string(&target).expect("read"), "new");
    }
}
