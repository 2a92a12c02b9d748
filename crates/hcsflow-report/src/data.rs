//! What the report shows, gathered from the output folder.

use std::collections::BTreeMap;
use std::path::Path;

use hcsflow_core::{DType, Stack};
use hcsflow_pipeline::{Manifest, OutputRecord, WellStatus, RUN_REPORT_NAME};
use rayon::prelude::*;
use serde::{Deserialize, Serialize};

use crate::image::{self, Plane, Quality};
use crate::stitching::{stitch_view, StitchView};
use crate::tables::{well_measures, TableMeasure};
use crate::{ReportError, THUMBNAIL_SIDE};

/// The parts of `run_report.json` the report shows (older or newer files
/// with other fields still read: every field has a default).
#[derive(Debug, Clone, Default, Deserialize, Serialize)]
#[serde(default)]
pub struct RunFacts {
    pub pipeline: String,
    pub device: String,
    pub device_reason: String,
    pub workers: usize,
    pub seconds: f64,
    pub input_bytes: u64,
    pub mb_per_s: f64,
    pub peak_rss_bytes: Option<u64>,
    /// The device-memory budget of GPU calls (`--gpu-memory` or the
    /// adapter's default); `None` when nothing ran on a GPU.
    pub gpu_memory: Option<u64>,
    pub missing_policy: String,
    pub stopped: Option<String>,
    pub manifest_error: Option<String>,
    pub write_errors: Vec<String>,
    pub steps: Vec<StepFacts>,
    pub notes: Vec<NoteFacts>,
}

#[derive(Debug, Clone, Default, Deserialize, Serialize)]
#[serde(default)]
pub struct StepFacts {
    pub name: String,
    pub read_seconds: f64,
    pub compute_seconds: f64,
    pub write_seconds: f64,
    /// Stacks of the step that ran on the GPU in chunks of planes (over the
    /// device-memory budget).
    pub split_stacks: usize,
}

#[derive(Debug, Clone, Default, Deserialize, Serialize)]
#[serde(default)]
pub struct NoteFacts {
    pub well: String,
    pub step: String,
    pub text: String,
}

/// Rows × columns of a standard plate, the smallest that holds every well.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
pub struct PlateLayout {
    pub rows: usize,
    pub columns: usize,
}

impl PlateLayout {
    /// The smallest of the 6- to 1536-well layouts with at least `rows` rows
    /// and `columns` columns (larger: exactly those).
    pub fn covering(rows: usize, columns: usize) -> PlateLayout {
        const STANDARD: [(usize, usize); 7] = [(2, 3), (3, 4), (4, 6), (6, 8), (8, 12), (16, 24), (32, 48)];
        let (r, c) = STANDARD.iter().copied().find(|&(r, c)| r >= rows && c >= columns).unwrap_or((rows, columns));
        PlateLayout { rows: r, columns: c }
    }
}

/// `A01` → (0, 0); `P24` → (15, 23); `AF48` → (31, 47). `None` for names
/// that are not a row letter (or two) and a column number.
pub fn well_position(well: &str) -> Option<(usize, usize)> {
    let split = well.find(|c: char| c.is_ascii_digit())?;
    let (letters, digits) = well.split_at(split);
    if letters.is_empty() || letters.len() > 2 || !letters.chars().all(|c| c.is_ascii_uppercase()) {
        return None;
    }
    let column: usize = digits.parse().ok().filter(|&c| c >= 1)?;
    let row = letters.bytes().fold(0usize, |acc, b| acc * 26 + usize::from(b - b'A') + 1) - 1;
    Some((row, column - 1))
}

/// The label of row `index` (0 → `A`, 26 → `AA`).
fn row_label(index: usize) -> String {
    if index < 26 {
        char::from(b'A' + index as u8).to_string()
    } else {
        format!("{}{}", char::from(b'A' + (index / 26 - 1) as u8), char::from(b'A' + (index % 26) as u8))
    }
}

/// One well of the report.
#[derive(Debug, Clone, Serialize)]
pub struct WellFacts {
    pub well: String,
    /// "complete", "failed", "skipped (resumed)", "not started".
    pub status: String,
    /// The status as a CSS class: "complete", "failed", "skipped", "not-started".
    pub class: &'static str,
    pub seconds: f64,
    pub error: Option<String>,
    /// The step whose images are shown and measured.
    pub shown_step: Option<String>,
    /// Per channel (in channel order): the image's quality.
    pub channels: Vec<ChannelFacts>,
    /// The thumbnail (RGB composite of the channels) as a PNG data URI.
    pub thumbnail: Option<String>,
    /// Per-well values of the well's artifact tables ([`crate::tables`]).
    pub tables: Vec<TableMeasure>,
    /// The tile layout over the shown mosaic ([`crate::stitching`]).
    pub stitching: Option<StitchView>,
}

#[derive(Debug, Clone, Serialize)]
pub struct ChannelFacts {
    pub channel: u32,
    pub path: String,
    pub quality: Quality,
}

/// One cell of a heatmap.
#[derive(Debug, Clone, Serialize)]
pub struct HeatCell {
    pub well: String,
    /// "complete", "failed", "skipped", "not-started", "empty" (not in the run), "no-value".
    pub class: String,
    pub colour: String,
    pub text: String,
}

#[derive(Debug, Clone, Serialize)]
pub struct HeatRow {
    pub label: String,
    pub cells: Vec<HeatCell>,
}

/// A plate-layout heatmap of one per-well measure.
#[derive(Debug, Clone, Serialize)]
pub struct Heatmap {
    pub title: String,
    pub low: String,
    pub high: String,
    pub columns: Vec<usize>,
    pub rows: Vec<HeatRow>,
}

/// A flat-field (and dark-field) profile of a plate-wide step.
#[derive(Debug, Clone, Serialize)]
pub struct ProfileFacts {
    pub step: String,
    pub path: String,
    pub planes: Vec<ProfilePlane>,
}

#[derive(Debug, Clone, Serialize)]
pub struct ProfilePlane {
    pub name: String,
    pub min: f64,
    pub max: f64,
    pub image: String,
}

/// A step's time in the chart: seconds and bar widths (% of the slowest step).
#[derive(Debug, Clone, Serialize)]
pub struct StepBar {
    pub name: String,
    pub read: f64,
    pub compute: f64,
    pub write: f64,
    pub read_pct: f64,
    pub compute_pct: f64,
    pub write_pct: f64,
    /// [`StepFacts::split_stacks`].
    pub split_stacks: usize,
}

/// Everything the template shows.
#[derive(Debug, Clone, Serialize)]
pub struct ReportData {
    pub version: &'static str,
    pub out: String,
    pub plate: String,
    pub pipeline: String,
    /// `None`: the run wrote no run_report.json (older hcsflow).
    pub run: Option<RunFacts>,
    pub peak_rss_mib: Option<f64>,
    pub counts: BTreeMap<String, usize>,
    pub layout: Option<PlateLayout>,
    pub wells: Vec<WellFacts>,
    pub heatmaps: Vec<Heatmap>,
    pub steps: Vec<StepBar>,
    pub profiles: Vec<ProfileFacts>,
    /// Each step against the plate's ground truth, when the run has
    /// `quality_vs_truth.json` ([`crate::truth`]).
    pub truth: Vec<crate::truth::QualityFacts>,
    /// What could not be shown, and why.
    pub problems: Vec<String>,
}

fn status_text(status: WellStatus) -> String {
    serde_json::to_value(status).ok().and_then(|v| v.as_str().map(str::to_string)).unwrap_or_else(|| format!("{status:?}"))
}

fn status_class(status: WellStatus) -> &'static str {
    match status {
        WellStatus::Complete => "complete",
        WellStatus::Failed => "failed",
        WellStatus::Skipped => "skipped",
        WellStatus::NotStarted => "not-started",
    }
}

impl ReportData {
    /// Gathers the report of the run in `out`, whose manifest is `manifest`.
    pub fn collect(out: &Path, manifest: &Manifest) -> Result<ReportData, ReportError> {
        let run = read_run_facts(out)?;
        let step_order: Vec<String> = match &run {
            Some(r) if !r.steps.is_empty() => r.steps.iter().map(|s| s.name.clone()).collect(),
            _ => first_appearance(manifest),
        };
        let results: Vec<(WellFacts, Vec<String>)> =
            manifest.wells.par_iter().map(|(name, record)| well_facts(out, name, record, &step_order)).collect();
        let mut problems = Vec::new();
        let mut wells = Vec::new();
        for (facts, p) in results {
            wells.push(facts);
            problems.extend(p);
        }
        let mut counts = BTreeMap::new();
        for w in &wells {
            *counts.entry(w.status.clone()).or_insert(0) += 1;
        }
        let positions: Vec<(usize, usize)> = wells.iter().filter_map(|w| well_position(&w.well)).collect();
        let layout = (!positions.is_empty() && positions.len() == wells.len()).then(|| {
            let rows = positions.iter().map(|p| p.0 + 1).max().unwrap_or(1);
            let columns = positions.iter().map(|p| p.1 + 1).max().unwrap_or(1);
            PlateLayout::covering(rows, columns)
        });
        let heatmaps = layout.map(|l| heatmaps(&wells, l)).unwrap_or_default();
        let steps = run.as_ref().map(|r| step_bars(&r.steps)).unwrap_or_default();
        let profiles = profiles(out, manifest, &mut problems);
        let truth = crate::truth::read_quality(out).unwrap_or_else(|problem| {
            problems.push(problem);
            Vec::new()
        });
        Ok(ReportData {
            version: env!("CARGO_PKG_VERSION"),
            out: out.display().to_string(),
            plate: manifest.plate.display().to_string(),
            pipeline: manifest.pipeline.clone(),
            peak_rss_mib: run.as_ref().and_then(|r| r.peak_rss_bytes).map(|b| b as f64 / (1024.0 * 1024.0)),
            run,
            counts,
            layout,
            wells,
            heatmaps,
            steps,
            profiles,
            truth,
            problems,
        })
    }

    /// The per-well table as MultiQC custom content.
    pub fn multiqc(&self) -> serde_json::Value {
        let mut data = serde_json::Map::new();
        for w in &self.wells {
            let mut row = serde_json::Map::new();
            row.insert("status".into(), w.status.clone().into());
            row.insert("seconds".into(), w.seconds.into());
            for c in &w.channels {
                row.insert(format!("mean_intensity_c{}", c.channel), c.quality.mean.into());
                row.insert(format!("focus_c{}", c.channel), c.quality.focus.into());
                row.insert(format!("saturated_pct_c{}", c.channel), (c.quality.saturated * 100.0).into());
            }
            data.insert(w.well.clone(), row.into());
        }
        serde_json::json!({
            "id": "hcsflow_wells",
            "section_name": "hcsflow wells",
            "description": "Per-well outcome, time and image quality of an hcsflow run (OUT/report.html has the plate views).",
            "plot_type": "table",
            "pconfig": { "id": "hcsflow_wells_table", "title": "hcsflow: wells" },
            "data": data,
        })
    }
}

fn read_run_facts(out: &Path) -> Result<Option<RunFacts>, ReportError> {
    let path = out.join(RUN_REPORT_NAME);
    match std::fs::read(&path) {
        Ok(bytes) => serde_json::from_slice(&bytes).map(Some).map_err(|source| ReportError::Json { path, source }),
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => Ok(None),
        Err(source) => Err(ReportError::Read { path, source }),
    }
}

/// Step names in the order their outputs first appear in the manifest.
fn first_appearance(manifest: &Manifest) -> Vec<String> {
    let mut order: Vec<String> = Vec::new();
    for o in manifest.wells.values().flat_map(|w| w.outputs.iter()) {
        if !order.contains(&o.step) {
            order.push(o.step.clone());
        }
    }
    order
}

fn is_tiff(o: &OutputRecord) -> bool {
    o.path.extension().and_then(|e| e.to_str()).is_some_and(|e| e.eq_ignore_ascii_case("tif") || e.eq_ignore_ascii_case("tiff"))
}

/// A well's facts: its images of the step with the largest TIFF outputs (a
/// mosaic; the later step on a tie), one per channel (lowest site, z,
/// timepoint), measured and composited.
fn well_facts(out: &Path, well: &str, record: &hcsflow_pipeline::WellRecord, order: &[String]) -> (WellFacts, Vec<String>) {
    let mut problems = Vec::new();
    let tiffs: Vec<&OutputRecord> = record.outputs.iter().filter(|o| is_tiff(o)).collect();
    // The step with the largest images (a mosaic), the later one on a tie.
    let area = |step: &String| tiffs.iter().filter(|o| &o.step == step).map(|o| o.height * o.width).max();
    let step = order.iter().enumerate().filter_map(|(i, s)| Some((area(s)?, i, s))).max().map(|(_, _, s)| s.clone());
    let mut chosen: BTreeMap<u32, &OutputRecord> = BTreeMap::new();
    for o in tiffs.iter().filter(|o| Some(&o.step) == step.as_ref()) {
        let [site, channel, z, t] = o.key;
        let better = chosen.get(&channel).is_none_or(|c| (site, z, t) < (c.key[0], c.key[2], c.key[3]));
        if better {
            chosen.insert(channel, o);
        }
    }
    let mut channels = Vec::new();
    let mut stretched = Vec::new();
    let mut size = None;
    let shown = chosen.values().next().map(|o| (o.height, o.width));
    for (&channel, o) in &chosen {
        let path = out.join(&o.path);
        let plane = match read_plane(&path) {
            Ok(p) => p,
            Err(e) => {
                problems.push(format!("{well}: {}: {e}", path.display()));
                continue;
            }
        };
        channels.push(ChannelFacts { channel, path: o.path.display().to_string(), quality: image::quality(&plane) });
        let (h, w, small) = image::downsample(&plane, THUMBNAIL_SIDE);
        if size.is_none_or(|s| s == (h, w)) {
            size = Some((h, w));
            stretched.push(image::stretch(&small));
        } else {
            problems.push(format!("{well}: channel {channel}'s image is not the size of the first channel's; left out of the thumbnail"));
        }
    }
    let thumbnail = size.and_then(|(h, w)| match image::png_data_uri(&image::composite(&stretched, h, w), h, w) {
        Ok(uri) => Some(uri),
        Err(e) => {
            problems.push(format!("{well}: encoding the thumbnail: {e}"));
            None
        }
    });
    let stitching = thumbnail.as_ref().and_then(|_| stitch_view(out, &record.artifacts, shown));
    let facts = WellFacts {
        well: well.to_string(),
        status: status_text(record.status),
        class: status_class(record.status),
        seconds: record.seconds,
        error: record.error.clone(),
        shown_step: step,
        channels,
        thumbnail,
        tables: well_measures(out, &record.artifacts, &mut problems),
        stitching,
    };
    (facts, problems)
}

/// The first plane of the TIFF at `path`, as the report measures it.
fn read_plane(path: &Path) -> Result<Plane, hcsflow_tiff::TiffError> {
    let stack: Stack = hcsflow_tiff::read_stack(path)?;
    let [_, h, w] = stack.shape();
    let saturation = hcsflow_ops::quality::saturation_level(stack.dtype());
    let values = stack.plane(0).to_f32().iter().copied().collect();
    Ok(Plane { height: h, width: w, values, saturation })
}

/// One heatmap per measure: well time, then per channel mean intensity,
/// focus and saturated percentage.
fn heatmaps(wells: &[WellFacts], layout: PlateLayout) -> Vec<Heatmap> {
    let by_well: BTreeMap<&str, &WellFacts> = wells.iter().map(|w| (w.well.as_str(), w)).collect();
    let channels: std::collections::BTreeSet<u32> = wells.iter().flat_map(|w| w.channels.iter().map(|c| c.channel)).collect();
    type Measure = Box<dyn Fn(&WellFacts) -> Option<f64>>;
    let mut measures: Vec<(String, Measure, &'static str)> = vec![("Well time (s)".into(), Box::new(|w: &WellFacts| Some(w.seconds)), "s")];
    for c in channels {
        let pick = move |w: &WellFacts| w.channels.iter().find(|x| x.channel == c).map(|x| x.quality);
        measures.push((format!("Mean intensity, channel {c}"), Box::new(move |w: &WellFacts| pick(w).map(|q| q.mean)), ""));
        measures.push((
            format!("Focus (variance of the Laplacian / mean), channel {c}"),
            Box::new(move |w: &WellFacts| pick(w).map(|q| q.focus)),
            "",
        ));
        measures.push((
            format!("Saturated pixels (%), channel {c}"),
            Box::new(move |w: &WellFacts| pick(w).map(|q| q.saturated * 100.0)),
            "%",
        ));
    }
    // The artifact tables' measures, in the order the wells list them.
    let mut titles: Vec<(&str, &'static str)> = Vec::new();
    for t in wells.iter().flat_map(|w| &w.tables) {
        if !titles.iter().any(|(title, _)| *title == t.title) {
            titles.push((&t.title, t.unit));
        }
    }
    for (title, unit) in titles {
        let owned = title.to_string();
        let pick = move |w: &WellFacts| w.tables.iter().find(|t| t.title == owned).map(|t| t.value);
        measures.push((title.to_string(), Box::new(pick), unit));
    }
    measures
        .into_iter()
        .map(|(title, measure, unit)| {
            let values: Vec<f64> = wells.iter().filter(|w| w.class != "failed").filter_map(&measure).collect();
            let lo = values.iter().copied().fold(f64::INFINITY, f64::min);
            let hi = values.iter().copied().fold(f64::NEG_INFINITY, f64::max);
            let rows = (0..layout.rows)
                .map(|r| HeatRow {
                    label: row_label(r),
                    cells: (0..layout.columns)
                        .map(|c| {
                            let name = format!("{}{:02}", row_label(r), c + 1);
                            heat_cell(&name, by_well.get(name.as_str()).copied(), &measure, (lo, hi), unit)
                        })
                        .collect(),
                })
                .collect();
            Heatmap { title, low: format_value(lo, unit), high: format_value(hi, unit), columns: (1..=layout.columns).collect(), rows }
        })
        .collect()
}

fn heat_cell(
    name: &str,
    well: Option<&WellFacts>,
    measure: &dyn Fn(&WellFacts) -> Option<f64>,
    (lo, hi): (f64, f64),
    unit: &str,
) -> HeatCell {
    let Some(w) = well else {
        return HeatCell { well: name.to_string(), class: "empty".into(), colour: String::new(), text: format!("{name}: not in this run") };
    };
    let class = w.class;
    if class == "failed" {
        let why = w.error.as_deref().unwrap_or("no reason recorded");
        return HeatCell { well: w.well.clone(), class: class.into(), colour: String::new(), text: format!("{}: FAILED: {why}", w.well) };
    }
    match measure(w) {
        Some(v) => {
            let t = if hi > lo { (v - lo) / (hi - lo) } else { 0.5 };
            HeatCell {
                well: w.well.clone(),
                class: class.into(),
                colour: image::viridis(t),
                text: format!("{}: {}", w.well, format_value(v, unit)),
            }
        }
        None => HeatCell {
            well: w.well.clone(),
            class: "no-value".into(),
            colour: String::new(),
            text: format!("{}: {} (no value)", w.well, w.status),
        },
    }
}

fn format_value(v: f64, unit: &str) -> String {
    if !v.is_finite() {
        return "–".into();
    }
    let number = if v.abs() >= 100.0 {
        format!("{v:.0}")
    } else if v.abs() >= 1.0 {
        format!("{v:.2}")
    } else {
        format!("{v:.4}")
    };
    match unit {
        "" => number,
        "%" => format!("{number} %"),
        u => format!("{number} {u}"),
    }
}

fn step_bars(steps: &[StepFacts]) -> Vec<StepBar> {
    let longest = steps.iter().map(|s| s.read_seconds + s.compute_seconds + s.write_seconds).fold(0.0, f64::max);
    let pct = |v: f64| if longest > 0.0 { 100.0 * v / longest } else { 0.0 };
    steps
        .iter()
        .map(|s| StepBar {
            name: s.name.clone(),
            read: s.read_seconds,
            compute: s.compute_seconds,
            write: s.write_seconds,
            read_pct: pct(s.read_seconds),
            compute_pct: pct(s.compute_seconds),
            write_pct: pct(s.write_seconds),
            split_stacks: s.split_stacks,
        })
        .collect()
}

/// The plate-wide steps' results that are profiles (`[flat-field,
/// dark-field]` f32 pages, BaSiC), as viridis images.
fn profiles(out: &Path, manifest: &Manifest, problems: &mut Vec<String>) -> Vec<ProfileFacts> {
    let mut found = Vec::new();
    for (step, record) in &manifest.plate_steps {
        for o in &record.outputs {
            let path = out.join(&o.path);
            let stack = match hcsflow_tiff::read_stack(&path) {
                Ok(s) => s,
                Err(e) => {
                    problems.push(format!("plate-wide step '{step}': {}: {e}", path.display()));
                    continue;
                }
            };
            if stack.dtype() != DType::F32 || stack.depth() != 2 {
                continue;
            }
            let [_, h, w] = stack.shape();
            let mut planes = Vec::new();
            for (z, name) in [(0, "flat-field"), (1, "dark-field")] {
                let values: Vec<f32> = stack.plane(z).to_f32().iter().copied().collect();
                let (min, max) = values.iter().fold((f32::INFINITY, f32::NEG_INFINITY), |(lo, hi), &v| (lo.min(v), hi.max(v)));
                if name == "dark-field" && min == 0.0 && max == 0.0 {
                    continue; // not estimated
                }
                let (sh, sw, small) = image::downsample(&Plane { height: h, width: w, values, saturation: None }, THUMBNAIL_SIDE);
                match image::png_data_uri(&image::viridis_rgb(&small), sh, sw) {
                    Ok(uri) => planes.push(ProfilePlane { name: name.into(), min: f64::from(min), max: f64::from(max), image: uri }),
                    Err(e) => problems.push(format!("{}: encoding the {name}: {e}", path.display())),
                }
            }
            found.push(ProfileFacts { step: step.clone(), path: o.path.display().to_string(), planes });
        }
    }
    found
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn well_names_map_to_plate_positions() {
        assert_eq!(well_position("A01"), Some((0, 0)));
        assert_eq!(well_position("P24"), Some((15, 23)));
        assert_eq!(well_position("AF48"), Some((31, 47)));
        assert_eq!(well_position("A0"), None);
        assert_eq!(well_position("well1"), None);
        assert_eq!((row_label(0), row_label(25), row_label(26), row_label(31)), ("A".into(), "Z".into(), "AA".into(), "AF".into()));
        assert_eq!(PlateLayout::covering(2, 2), PlateLayout { rows: 2, columns: 3 });
        assert_eq!(PlateLayout::covering(8, 5), PlateLayout { rows: 8, columns: 12 });
        assert_eq!(PlateLayout::covering(9, 1), PlateLayout { rows: 16, columns: 24 });
    }
}
