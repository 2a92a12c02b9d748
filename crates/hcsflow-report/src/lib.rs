//! The QC report of a run, made from what the run wrote in its output folder.
//!
//! [`write_report`] reads `OUT/run_manifest.json` (every well's outcome and
//! outputs), `OUT/run_report.json` (device, timings, peak RSS, failures,
//! notes; absent for runs older than the report) and output images, and
//! writes:
//!
//! - `OUT/report.html`: one self-contained file (styles and images inline,
//!   no script, nothing fetched), rendered from `templates/report.html` with
//!   minijinja: the run summary, failures with their reasons, a plate-layout
//!   heatmap per per-well measure (well time; per channel mean intensity,
//!   focus and saturation) with failed wells crossed out in red and wells not
//!   in the run greyed, a thumbnail per well that opens larger (a mosaic with
//!   its tile borders, stage positions and edge scores drawn over it,
//!   [`stitching`]), the image
//!   quality table, per-step times, the flat-field profiles of plate-wide
//!   steps (BaSiC), and each step's quality against the plate's ground truth
//!   when the run has it ([`truth`]: synthetic plates).
//! - `OUT/hcsflow_mqc.json`: the per-well table as MultiQC custom content
//!   (`plot_type: table`), so the run slots into nf-core-style reports.
//!
//! **What is measured.** Per well, the images of the step that wrote its
//! largest TIFF images (a mosaic; of steps with images of one size, the
//! later): per channel the one with the lowest site / z / timepoint. Thumbnails and image-quality measures
//! ([`image::Quality`]) are of those images, so a report reads one image per
//! well and channel whatever the plate's size. A well whose image cannot be
//! read gets no thumbnail and a note saying why; the report is still written.

mod data;
pub mod image;
pub mod stitching;
pub mod tables;
pub mod truth;

use std::path::{Path, PathBuf};

use hcsflow_io::Durability;
use hcsflow_pipeline::{Manifest, PipelineError, REPORT_HTML_NAME, REPORT_MQC_NAME};

pub use data::{PlateLayout, ReportData};

/// The longer side of a well's thumbnail, pixels (shown at 96 px in the
/// plate grid and at twice this size when opened).
pub const THUMBNAIL_SIDE: usize = 256;

/// Why no report could be written.
#[derive(Debug, thiserror::Error)]
pub enum ReportError {
    #[error("{0} holds no run_manifest.json: not the output folder of an hcsflow run")]
    NotARun(PathBuf),
    #[error(transparent)]
    Manifest(#[from] PipelineError),
    #[error("{path}: {source}")]
    Json { path: PathBuf, source: serde_json::Error },
    #[error("rendering the report: {0}")]
    Template(#[from] minijinja::Error),
    #[error("reading {path}: {source}")]
    Read { path: PathBuf, source: std::io::Error },
    #[error("writing {path}: {source}")]
    Write { path: PathBuf, source: std::io::Error },
}

/// The files [`write_report`] wrote.
#[derive(Debug, Clone)]
pub struct Written {
    pub html: PathBuf,
    pub multiqc: PathBuf,
    /// What could not be shown (an unreadable image…), also in the report.
    pub problems: Vec<String>,
}

/// Writes `OUT/report.html` and `OUT/hcsflow_mqc.json` for the run in `out`
/// (see the crate docs), each atomically.
pub fn write_report(out: &Path) -> Result<Written, ReportError> {
    let manifest = Manifest::read(out)?.ok_or_else(|| ReportError::NotARun(out.to_path_buf()))?;
    let data = ReportData::collect(out, &manifest)?;
    let html = render(&data)?;
    let multiqc =
        serde_json::to_vec_pretty(&data.multiqc()).map_err(|source| ReportError::Json { path: out.join(REPORT_MQC_NAME), source })?;
    let write = |name: &str, bytes: &[u8]| {
        let path = out.join(name);
        hcsflow_io::write_atomic(&path, bytes, Durability::Process).map_err(|source| ReportError::Write { path: path.clone(), source })?;
        Ok::<PathBuf, ReportError>(path)
    };
    Ok(Written { html: write(REPORT_HTML_NAME, html.as_bytes())?, multiqc: write(REPORT_MQC_NAME, &multiqc)?, problems: data.problems })
}

/// The HTML of `data` (the template is compiled into the crate).
pub fn render(data: &ReportData) -> Result<String, ReportError> {
    let mut env = minijinja::Environment::new();
    env.add_template("report.html", include_str!("../templates/report.html"))?;
    Ok(env.get_template("report.html")?.render(data)?)
}
