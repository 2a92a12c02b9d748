//! The output folder of a run: one run at a time, no stale temporaries, and
//! another run's outputs never mixed with this one's.
//!
//! - [`OutputLock`]: `OUT/.hcsflow.lock`, an OS advisory lock held for the
//!   whole run (released by the OS when the process ends, even by `kill -9`),
//!   recording who holds it. A second run into the same OUT is refused at
//!   once, before it writes anything.
//! - [`remove_stale_temps`]: hcsflow's own temporaries left by a killed run
//!   ([`hcsflow_io::is_temp_name`]), removed under the lock.
//! - [`check_previous`]: OUT holding another pipeline's or plate's outputs is
//!   refused unless the caller asks to overwrite, and then [`remove_recorded`]
//!   removes only what the old manifest records.

use std::fs::{File, OpenOptions, TryLockError};
use std::io::{Seek, SeekFrom, Write};
use std::path::{Component, Path, PathBuf};
use std::time::{SystemTime, UNIX_EPOCH};

use serde::{Deserialize, Serialize};

use crate::compile::Plan;
use crate::output::manifest::{Manifest, MANIFEST_NAME};
use crate::output::tables::{ARTIFACTS_NAME, SUMMARY_NAME};
use crate::PipelineError;

/// The lock file's name in OUT. It stays after the run (removing it would
/// let a waiting and a new run both lock a file each); the lock, not the
/// file, says whether a run is in progress.
pub const LOCK_NAME: &str = ".hcsflow.lock";

/// What the lock file records about the run holding it.
#[derive(Debug, Serialize, Deserialize)]
struct LockHolder {
    pid: u32,
    host: String,
    /// UTC, `YYYY-MM-DDTHH:MM:SSZ`.
    started: String,
    /// The command line of the process.
    command: String,
    pipeline: String,
}

/// The output folder's lock; released when dropped (or when the process ends).
#[derive(Debug)]
pub(crate) struct OutputLock {
    _file: File,
}

/// Takes `OUT/.hcsflow.lock` (OUT must exist) for the run of `plan`,
/// exclusively: a whole run, or the finalize of a sharded run. If another
/// process holds it (a run, or shards running: they hold it shared): a usage
/// error naming them ([`PipelineError::Config`]). A file system without locks
/// (some network mounts) gets a warning, not a refusal.
pub(crate) fn lock(out: &Path, plan: &Plan) -> Result<OutputLock, PipelineError> {
    let path = out.join(LOCK_NAME);
    match take(&path, plan, false)? {
        Ok(lock) => Ok(lock),
        Err(holder) => {
            let shards = crate::shard::running_shards(out);
            let who = if shards.is_empty() { holder } else { shards.join("; ") };
            Err(in_use(out, &path, &who))
        }
    }
}

/// Takes `OUT/.hcsflow.lock` shared, for one shard of a run: shards run side
/// by side, a whole run or a finalize (exclusive) is refused while any runs,
/// and a shard is refused while one of those runs.
pub(crate) fn lock_shared(out: &Path, plan: &Plan) -> Result<OutputLock, PipelineError> {
    let path = out.join(LOCK_NAME);
    take(&path, plan, true)?.map_err(|who| in_use(out, &path, &who))
}

/// Takes the lock file `path` exclusively and records who holds it; if
/// another process holds it, its holder as text (`Err` inside `Ok`).
pub(crate) fn take(path: &Path, plan: &Plan, shared: bool) -> Result<Result<OutputLock, String>, PipelineError> {
    let io = |e: std::io::Error| PipelineError::io(path, e);
    let mut file = OpenOptions::new().read(true).write(true).create(true).truncate(false).open(path).map_err(io)?;
    let taken = if shared { file.try_lock_shared() } else { file.try_lock() };
    match taken {
        Ok(()) => {}
        Err(TryLockError::WouldBlock) => return Ok(Err(holder_text(path))),
        Err(TryLockError::Error(e)) if e.kind() == std::io::ErrorKind::Unsupported => {
            tracing::warn!("{}: the file system does not support locks ({e}); nothing stops a second run into this folder", path.display());
        }
        Err(TryLockError::Error(e)) => return Err(io(e)),
    }
    if shared {
        // Several holders: none of them can say it is the one.
        return Ok(Ok(OutputLock { _file: file }));
    }
    let holder = LockHolder {
        pid: std::process::id(),
        host: host_name(),
        started: utc_now(),
        command: std::env::args_os().map(|a| a.to_string_lossy().into_owned()).collect::<Vec<_>>().join(" "),
        pipeline: plan.pipeline_name.clone(),
    };
    // Who holds the lock is information for a refused run, not a condition of
    // this one: a full disk must not stop the run here.
    if let Ok(json) = serde_json::to_vec_pretty(&holder) {
        let written = file.set_len(0).and_then(|_| file.seek(SeekFrom::Start(0))).and_then(|_| file.write_all(&json));
        if let Err(e) = written {
            tracing::warn!("{}: cannot record the run holding the lock: {e}", path.display());
        }
    }
    Ok(Ok(OutputLock { _file: file }))
}

/// Takes the lock file `path` exclusively, waiting for its holder to release
/// it (the set-up of a sharded run: one shard at a time).
pub(crate) fn wait_for(path: &Path) -> Result<OutputLock, PipelineError> {
    let io = |e: std::io::Error| PipelineError::io(path, e);
    let file = OpenOptions::new().read(true).write(true).create(true).truncate(false).open(path).map_err(io)?;
    match file.try_lock() {
        Ok(()) => {}
        Err(TryLockError::WouldBlock) => {
            tracing::info!("{}: waiting for another shard to finish setting up the run", path.display());
            file.lock().map_err(io)?;
        }
        Err(TryLockError::Error(e)) if e.kind() == std::io::ErrorKind::Unsupported => {
            tracing::warn!("{}: the file system does not support locks ({e}); shards are not serialised", path.display());
        }
        Err(TryLockError::Error(e)) => return Err(io(e)),
    }
    Ok(OutputLock { _file: file })
}

/// Who the lock file `path` says holds it.
pub(crate) fn holder_text(path: &Path) -> String {
    let holder = std::fs::read_to_string(path).ok().and_then(|t| serde_json::from_str::<LockHolder>(&t).ok());
    match holder {
        Some(h) => format!("hcsflow run pid {} on host {} since {} (pipeline '{}': {})", h.pid, h.host, h.started, h.pipeline, h.command),
        None => "another hcsflow run".to_string(),
    }
}

/// The usage error of an OUT in use by `who`.
fn in_use(out: &Path, lock: &Path, who: &str) -> PipelineError {
    PipelineError::Config {
        message: format!(
            "{} is in use by {who}; a second run into the same folder would mix its outputs with that run's (lock: {})",
            out.display(),
            lock.display()
        ),
        fix: "wait for that run to finish, or choose another output folder".into(),
    }
}

/// This machine's name, as far as it can be found without a system call binding.
fn host_name() -> String {
    std::fs::read_to_string("/proc/sys/kernel/hostname")
        .ok()
        .or_else(|| std::env::var("HOSTNAME").ok())
        .or_else(|| std::env::var("COMPUTERNAME").ok())
        .map(|h| h.trim().to_string())
        .filter(|h| !h.is_empty())
        .unwrap_or_else(|| "unknown".into())
}

/// Now, UTC, as `YYYY-MM-DDTHH:MM:SSZ`.
fn utc_now() -> String {
    utc_text(SystemTime::now().duration_since(UNIX_EPOCH).map(|d| d.as_secs()).unwrap_or(0))
}

/// `secs` after 1970-01-01 UTC as `YYYY-MM-DDTHH:MM:SSZ`.
fn utc_text(secs: u64) -> String {
    let (days, rem) = (secs / 86_400, secs % 86_400);
    // Civil date from days since 1970-01-01 (Howard Hinnant's algorithm).
    let z = days as i64 + 719_468;
    let era = z.div_euclid(146_097);
    let doe = z.rem_euclid(146_097);
    let yoe = (doe - doe / 1460 + doe / 36_524 - doe / 146_096) / 365;
    let doy = doe - (365 * yoe + yoe / 4 - yoe / 100);
    let mp = (5 * doy + 2) / 153;
    let day = doy - (153 * mp + 2) / 5 + 1;
    let month = if mp < 10 { mp + 3 } else { mp - 9 };
    let year = yoe + era * 400 + i64::from(month <= 2);
    format!("{year:04}-{month:02}-{day:02}T{:02}:{:02}:{:02}Z", rem / 3600, rem % 3600 / 60, rem % 60)
}

/// Reads OUT's manifest, if any. One that cannot be read is a usage error:
/// nothing tells what the folder holds.
pub(crate) fn previous_manifest(out: &Path) -> Result<Option<Manifest>, PipelineError> {
    Manifest::read(out).map_err(|e| PipelineError::Config {
        message: e.to_string(),
        fix: format!(
            "choose another output folder, or delete {} if that folder's outputs are no longer needed",
            out.join(MANIFEST_NAME).display()
        ),
    })
}

/// How `previous` (OUT's manifest) differs from the run of `plan`: another
/// pipeline (digest) or another plate; `None` if it is the same run.
pub(crate) fn difference(previous: &Manifest, plan: &Plan) -> Option<String> {
    if previous.digest != plan.digest {
        return Some(format!(
            "a different pipeline ('{}', digest {}; this one is '{}', digest {})",
            previous.pipeline, previous.digest, plan.pipeline_name, plan.digest
        ));
    }
    let canonical = |p: &Path| p.canonicalize().unwrap_or_else(|_| p.to_path_buf());
    if canonical(&previous.plate) != canonical(&plan.plate_root) {
        return Some(format!("a different plate ({}; this one is {})", previous.plate.display(), plan.plate_root.display()));
    }
    None
}

/// Refuses to run into an OUT whose manifest records another pipeline's or
/// plate's run (`difference`), unless `overwrite`. `resume` and `overwrite`
/// together are refused too.
pub(crate) fn check_previous(previous: Option<&Manifest>, plan: &Plan, resume: bool, overwrite: bool) -> Result<(), PipelineError> {
    if resume && overwrite {
        return Err(PipelineError::Config {
            message: "--resume keeps the wells a previous run completed and --overwrite removes them; they cannot go together".into(),
            fix: "use --resume to finish a run, or --overwrite to start over".into(),
        });
    }
    let Some(previous) = previous else {
        return Ok(());
    };
    let Some(difference) = difference(previous, plan) else {
        return Ok(());
    };
    if overwrite {
        return Ok(());
    }
    let manifest = plan.out.join(MANIFEST_NAME);
    let (message, fix) = if resume {
        (
            format!("{} was written by a run of {difference}; --resume can only finish the same run", manifest.display()),
            "run with --overwrite to remove that run's outputs and start over, or use another output folder",
        )
    } else {
        (
            format!(
                "{} holds the outputs of a run of {difference}; running here would mix the two runs' outputs",
                plan.out.display()
            ),
            "choose another output folder, or run with --overwrite to remove that run's outputs first (only the files its run_manifest.json lists)",
        )
    };
    Err(PipelineError::Config { message, fix: fix.into() })
}

/// `rel` (from a manifest) if it is a plain relative path below OUT.
fn below(out: &Path, rel: &Path) -> Option<PathBuf> {
    let plain = rel.components().next().is_some() && rel.components().all(|c| matches!(c, Component::Normal(_)));
    plain.then(|| out.join(rel))
}

/// Removes what the manifest `previous` records in OUT (the outputs and
/// artifact tables of its wells and of its plate-wide steps, its plate-level
/// tables and summaries, its OME-Zarr plates), then the folders this leaves empty. Never a file the
/// manifest does not list, nothing outside OUT, nothing inside `plate`.
/// Returns how many files and plates were removed.
pub(crate) fn remove_recorded(out: &Path, previous: &Manifest, plate: &Path) -> Result<usize, PipelineError> {
    let plate = plate.canonicalize().unwrap_or_else(|_| plate.to_path_buf());
    let safe = |rel: &Path| below(out, rel).filter(|p| !p.canonicalize().unwrap_or_else(|_| p.clone()).starts_with(&plate));
    let mut files: Vec<&Path> = vec![Path::new(SUMMARY_NAME), Path::new(ARTIFACTS_NAME)];
    files.extend(previous.files.iter().map(PathBuf::as_path));
    for record in previous.wells.values() {
        files.extend(record.outputs.iter().map(|o| o.path.as_path()));
        files.extend(record.artifacts.iter().map(|a| a.path.as_path()));
    }
    for record in previous.plate_steps.values() {
        files.extend(record.outputs.iter().map(|o| o.path.as_path()));
        files.extend(record.artifacts.iter().map(|a| a.path.as_path()));
    }
    let mut removed = 0;
    let mut folders = std::collections::BTreeSet::new();
    for path in files.into_iter().filter_map(safe) {
        match std::fs::symlink_metadata(&path) {
            Ok(m) if !m.is_dir() => {
                std::fs::remove_file(&path).map_err(|e| PipelineError::io(&path, e))?;
                removed += 1;
                folders.extend(path.ancestors().skip(1).take_while(|a| *a != out).map(Path::to_path_buf));
            }
            _ => {}
        }
    }
    for rel in &previous.zarr_plates {
        let is_plate = rel.components().count() == 1 && rel.to_string_lossy().ends_with(".ome.zarr");
        let Some(path) = safe(rel).filter(|_| is_plate) else {
            continue;
        };
        if std::fs::symlink_metadata(&path).is_ok_and(|m| m.is_dir()) {
            std::fs::remove_dir_all(&path).map_err(|e| PipelineError::io(&path, e))?;
            removed += 1;
        }
    }
    // Deepest first; a folder that still holds something (a user's file) stays.
    for folder in folders.iter().rev() {
        let _ = std::fs::remove_dir(folder);
    }
    Ok(removed)
}

/// Removes hcsflow's stale temporaries from OUT (its top level), from the
/// step folders and OME-Zarr plates of `plan` and of `previous` (OUT's
/// manifest), never from a folder that is or holds the input plate. Call
/// with the lock held: then no write of ours is in flight. Best effort: a
/// folder that cannot be read is skipped with a warning. Returns how many.
pub(crate) fn remove_stale_temps(out: &Path, plan: &Plan, previous: Option<&Manifest>, zarr_plates: &[PathBuf]) -> usize {
    let plate = plan.plate_root.canonicalize().unwrap_or_else(|_| plan.plate_root.clone());
    let mut removed = 0;
    if let Ok(entries) = std::fs::read_dir(out) {
        for entry in entries.flatten() {
            let name = entry.file_name();
            let temp = entry.file_type().is_ok_and(|t| t.is_file()) && hcsflow_io::is_temp_name(&name.to_string_lossy());
            if temp && std::fs::remove_file(entry.path()).is_ok() {
                removed += 1;
            }
        }
    }
    let mut folders: std::collections::BTreeSet<PathBuf> = plan.steps.iter().map(|s| s.out_dir.clone()).collect();
    folders.extend(zarr_plates.iter().cloned());
    if let Some(previous) = previous {
        let firsts = previous
            .wells
            .values()
            .flat_map(|r| r.outputs.iter().map(|o| &o.path).chain(r.artifacts.iter().map(|a| &a.path)))
            .chain(&previous.files)
            .chain(&previous.zarr_plates)
            .filter_map(|p| p.components().next())
            .filter(|c| matches!(c, Component::Normal(_)))
            .map(|c| out.join(c.as_os_str()));
        folders.extend(firsts);
    }
    for folder in folders {
        let real = folder.canonicalize().unwrap_or_else(|_| folder.clone());
        if real.starts_with(&plate) || plate.starts_with(&real) || !std::fs::symlink_metadata(&folder).is_ok_and(|m| m.is_dir()) {
            continue;
        }
        match hcsflow_zarr::remove_stale_temps(&folder) {
            Ok(n) => removed += n,
            Err(e) => tracing::warn!("{}: cannot remove stale temporary files: {e}", folder.display()),
        }
    }
    removed
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn utc_dates() {
        assert_eq!(utc_text(0), "1970-01-01T00:00:00Z");
        assert_eq!(utc_text(951_782_400), "2000-02-29T00:00:00Z");
        assert_eq!(utc_text(1_700_000_000), "2023-11-14T22:13:20Z");
        assert_eq!(utc_text(4_107_542_399), "2100-02-28T23:59:59Z");
    }

    #[test]
    fn only_plain_relative_paths_are_below_out() {
        let out = Path::new("/o");
        assert_eq!(below(out, Path::new("a/b.tif")), Some(PathBuf::from("/o/a/b.tif")));
        for bad in ["", "/etc/passwd", "../x", "a/../../x", "./a"] {
            assert_eq!(below(out, Path::new(bad)), None, "{bad}");
        }
    }
}
