//! `OUT/run_manifest.json`: the outcome of every well, rewritten atomically
//! after each; what `--resume` and `--overwrite` read.

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};

use serde::{Deserialize, Serialize};

use crate::compile::{Key, MissingPlane, Plan};
use crate::exec::WellReport;
use crate::output::tables::{ARTIFACTS_NAME, SUMMARY_NAME};
use crate::output::write_atomic;
use crate::PipelineError;

/// The run manifest's file name in OUT.
pub const MANIFEST_NAME: &str = "run_manifest.json";
/// One written output plane, as recorded in the manifest and the CSV summary.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct OutputRecord {
    pub step: String,
    /// `[site, channel, z_index, timepoint]`; 0 = collapsed by a reduction.
    pub key: Key,
    /// Relative to OUT.
    pub path: PathBuf,
    pub height: usize,
    pub width: usize,
    pub dtype: String,
}

/// One artifact table written for a well (`OUT/<step>/<artifact>/<well>.csv`).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct ArtifactRecord {
    pub step: String,
    pub artifact: String,
    /// Relative to OUT.
    pub path: PathBuf,
    pub rows: usize,
}

/// Something a function said about its result that the user must see (e.g.
/// stitching fell back to stage positions): not an error, never silent.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Note {
    pub well: String,
    pub step: String,
    pub text: String,
}

/// Where a well stands, in the manifest and the report. Written as the
/// strings "complete", "failed", "skipped (resumed)" and "not started".
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
pub enum WellStatus {
    /// Every step ran and every output was written.
    #[serde(rename = "complete")]
    Complete,
    /// The well failed (`error` says why); its outputs are not recorded.
    #[serde(rename = "failed")]
    Failed,
    /// Complete in an earlier run and not run again (`--resume`; the report only).
    #[serde(rename = "skipped (resumed)")]
    Skipped,
    /// The run was cancelled or stopped before the well started (`error` says why).
    #[serde(rename = "not started")]
    NotStarted,
}

impl WellStatus {
    /// The status as written in the manifest and the report.
    pub fn as_str(self) -> &'static str {
        match self {
            WellStatus::Complete => "complete",
            WellStatus::Failed => "failed",
            WellStatus::Skipped => "skipped (resumed)",
            WellStatus::NotStarted => "not started",
        }
    }
}

impl std::fmt::Display for WellStatus {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(self.as_str())
    }
}

/// A well in the manifest.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct WellRecord {
    /// Complete, failed or not started (`error` says why); `--resume` runs
    /// every well that is not complete.
    pub status: WellStatus,
    pub seconds: f64,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub error: Option<String>,
    #[serde(default)]
    pub outputs: Vec<OutputRecord>,
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub artifacts: Vec<ArtifactRecord>,
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub notes: Vec<Note>,
    /// Missing images this well used as planes of zeros (`--missing fill`).
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub filled: Vec<MissingPlane>,
}

impl WellRecord {
    /// The record of a well that wrote nothing.
    pub(crate) fn ended(status: WellStatus, seconds: f64, error: Option<String>) -> WellRecord {
        WellRecord { status, seconds, error, outputs: Vec::new(), artifacts: Vec::new(), notes: Vec::new(), filled: Vec::new() }
    }

    /// The report of `well` from this record: no step timings, nothing
    /// read, no GPU queue (the executor adds what it knows).
    pub(crate) fn report(&self, well: &str) -> WellReport {
        WellReport {
            well: well.to_string(),
            status: self.status,
            seconds: self.seconds,
            error: self.error.clone(),
            steps: Vec::new(),
            bytes_read: 0,
            notes: self.notes.clone(),
            filled: self.filled.clone(),
            adapter: None,
            queue: None,
        }
    }
}

/// One result of a plate-wide step: a group's planes, `OUT/<step>/<group>.tif`.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct PlateOutputRecord {
    /// The group's fixed components (`4294967295` = varied over, as in the plan).
    pub scope: Key,
    /// Relative to OUT.
    pub path: PathBuf,
    /// Planes sampled, and planes the plate has for the group.
    pub sampled: usize,
    pub available: usize,
    /// Size and 64-bit FNV-1a of the file as written: `--resume` re-reads it
    /// only if both still match.
    pub bytes: u64,
    pub checksum: String,
}

/// A plate-wide step in the manifest.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct PlateStepRecord {
    /// Complete or failed.
    pub status: WellStatus,
    /// The plan's digest of the step and its sample ([`PlateStepPlan::digest`](crate::PlateStepPlan)).
    pub digest: String,
    pub seconds: f64,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub error: Option<String>,
    #[serde(default)]
    pub outputs: Vec<PlateOutputRecord>,
    /// Its tables (e.g. `basic_baseline.csv`, one row per sampled plane).
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub artifacts: Vec<ArtifactRecord>,
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub notes: Vec<Note>,
}

/// `OUT/run_manifest.json`.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Manifest {
    pub version: u32,
    pub pipeline: String,
    pub digest: String,
    pub plate: PathBuf,
    /// Plate-level files the run writes, relative to OUT (summaries, joined
    /// artifact tables): with the wells' outputs, what `--overwrite` removes.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub files: Vec<PathBuf>,
    /// OME-Zarr plates the run writes, relative to OUT.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub zarr_plates: Vec<PathBuf>,
    /// Plate-wide steps by name: run once before the wells.
    #[serde(default, skip_serializing_if = "BTreeMap::is_empty")]
    pub plate_steps: BTreeMap<String, PlateStepRecord>,
    pub wells: BTreeMap<String, WellRecord>,
}

impl Manifest {
    pub(crate) fn new(plan: &Plan, zarr_plates: &[PathBuf]) -> Manifest {
        let rel = |p: &Path| p.strip_prefix(&plan.out).map(Path::to_path_buf).unwrap_or_else(|_| p.to_path_buf());
        let mut files: Vec<PathBuf> =
            [SUMMARY_NAME, ARTIFACTS_NAME, super::RUN_REPORT_NAME, super::REPORT_HTML_NAME, super::REPORT_MQC_NAME]
                .map(PathBuf::from)
                .into();
        for step in &plan.steps {
            files.extend(step.produces.iter().map(|name| rel(&step.out_dir.join(format!("{name}.csv")))));
        }
        // Plate-wide results, listed before they are written: `--overwrite`
        // removes them even when a run stopped before recording them.
        files.extend(
            plan.plate_steps.iter().flat_map(|ps| ps.groups.iter()).filter(|g| !g.output.as_os_str().is_empty()).map(|g| rel(&g.output)),
        );
        files.extend(crate::output::plate::descriptor_paths(plan).map(|p| rel(&p)));
        Manifest {
            version: 1,
            pipeline: plan.pipeline_name.clone(),
            digest: plan.digest.clone(),
            plate: plan.plate_root.clone(),
            files,
            zarr_plates: zarr_plates.iter().map(|p| rel(p)).collect(),
            plate_steps: BTreeMap::new(),
            wells: BTreeMap::new(),
        }
    }

    /// Reads `OUT/run_manifest.json`, `None` if absent.
    pub fn read(out: &Path) -> Result<Option<Manifest>, PipelineError> {
        Manifest::read_from(&out.join(MANIFEST_NAME))
    }

    /// Reads the manifest at `path` (a run's, or a shard's), `None` if absent.
    pub fn read_from(path: &Path) -> Result<Option<Manifest>, PipelineError> {
        let path = path.to_path_buf();
        match std::fs::read(&path) {
            Ok(bytes) => serde_json::from_slice(&bytes).map(Some).map_err(|source| PipelineError::Manifest { path, source }),
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => Ok(None),
            Err(e) => Err(PipelineError::io(&path, e)),
        }
    }

    /// Writes the manifest atomically; if that fails (a full disk), once more
    /// as compact JSON, which is smaller. The error is the last attempt's.
    pub(crate) fn write(&self, out: &Path) -> Result<(), PipelineError> {
        self.write_to(&out.join(MANIFEST_NAME))
    }

    /// [`Manifest::write`] to `path` (a shard's manifest).
    pub(crate) fn write_to(&self, path: &Path) -> Result<(), PipelineError> {
        let json = |pretty: bool| {
            (if pretty { serde_json::to_vec_pretty(self) } else { serde_json::to_vec(self) }).map_err(|e| PipelineError::io(path, e.into()))
        };
        write_atomic(path, &json(true)?).or_else(|_| write_atomic(path, &json(false)?))
    }
}

/// The manifest in memory (every well's outcome, always) and what the file
/// on disk holds.
pub(crate) struct ManifestState {
    /// Where it is written: `OUT/run_manifest.json`, or a shard's manifest.
    pub(crate) path: PathBuf,
    pub(crate) manifest: Manifest,
    /// Well → status of the last manifest written.
    pub(crate) on_disk: BTreeMap<String, WellStatus>,
    /// The last write's error, if it failed.
    pub(crate) error: Option<PipelineError>,
}

impl ManifestState {
    /// Records `record` for `well` and rewrites the file.
    pub(crate) fn record(&mut self, well: &str, record: WellRecord) {
        self.manifest.wells.insert(well.to_string(), record);
        self.save();
    }

    pub(crate) fn save(&mut self) {
        match self.manifest.write_to(&self.path) {
            Ok(()) => {
                self.on_disk = self.manifest.wells.iter().map(|(w, r)| (w.clone(), r.status)).collect();
                self.error = None;
            }
            Err(e) => self.error = Some(e),
        }
    }

    /// The wells whose outcome the file on disk misses or misstates.
    pub(crate) fn unrecorded(&self) -> Vec<String> {
        self.manifest
            .wells
            .iter()
            .filter(|(w, r)| self.on_disk.get(*w) != Some(&r.status))
            .map(|(w, r)| format!("{w} ({})", r.status))
            .collect()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_manifest_state_names_the_wells_the_file_misses() {
        let record = |status: WellStatus| WellRecord {
            status,
            seconds: 0.0,
            error: None,
            outputs: Vec::new(),
            artifacts: Vec::new(),
            notes: Vec::new(),
            filled: Vec::new(),
        };
        let manifest = Manifest {
            version: 1,
            pipeline: "p".into(),
            digest: "d".into(),
            plate: PathBuf::from("/plate"),
            files: Vec::new(),
            zarr_plates: Vec::new(),
            plate_steps: BTreeMap::new(),
            wells: [
                ("A01".to_string(), record(WellStatus::Complete)),
                ("A02".to_string(), record(WellStatus::Failed)),
                ("A03".to_string(), record(WellStatus::NotStarted)),
            ]
            .into(),
        };
        let on_disk = [("A01".to_string(), WellStatus::Complete), ("A03".to_string(), WellStatus::Failed)].into();
        let state = ManifestState { path: PathBuf::from("/o/run_manifest.json"), manifest, on_disk, error: None };
        assert_eq!(state.unrecorded(), ["A02 (failed)", "A03 (not started)"]);
    }

    /// The manifest and the report keep the status strings of earlier
    /// versions, so their manifests are read for `--resume` and the files
    /// written are the same bytes.
    #[test]
    fn well_status_is_written_and_read_as_before() {
        for (status, text) in [
            (WellStatus::Complete, "complete"),
            (WellStatus::Failed, "failed"),
            (WellStatus::Skipped, "skipped (resumed)"),
            (WellStatus::NotStarted, "not started"),
        ] {
            assert_eq!(serde_json::to_string(&status).expect("json"), format!("\"{text}\""));
            assert_eq!(serde_json::from_str::<WellStatus>(&format!("\"{text}\"")).expect("parse"), status);
            assert_eq!(status.to_string(), text);
        }
        let old = concat!(
            r#"{"version":1,"pipeline":"p","digest":"d","plate":"/plate","wells":{"#,
            r#""A01":{"status":"complete","seconds":1.5,"outputs":[]},"#,
            r#""A02":{"status":"failed","seconds":0.5,"error":"step 'x': boom","outputs":[]},"#,
            r#""A03":{"status":"not started","seconds":0.0,"error":"not started: the run was interrupted","outputs":[]}}}"#
        );
        let manifest: Manifest = serde_json::from_str(old).expect("an earlier version's manifest");
        let statuses: Vec<WellStatus> = manifest.wells.values().map(|r| r.status).collect();
        assert_eq!(statuses, [WellStatus::Complete, WellStatus::Failed, WellStatus::NotStarted]);
        assert_eq!(serde_json::to_string(&manifest).expect("json"), old);
    }
}
