//! `OUT/<step>/hcsflow-plate.json`: the TIFF output of each step as a plate
//! that `hcsflow inspect` and a second `hcsflow run` open
//! ([`hcsflow_plate::run_output`]).
//!
//! Written after the run from the manifest, so it lists the images of every
//! complete well (a resumed run's too) and nothing of a failed one. The
//! metadata is the input plate's as the plan holds it, restricted to what the
//! step's images have: a component the step reduced away (a projection's z,
//! a mosaic's sites, a composite's channels) is the single value 1, without
//! a channel name, stage position or grid place it no longer has.

use std::collections::{BTreeMap, BTreeSet};
use std::path::{Path, PathBuf};

use hcsflow_core::DType;
use hcsflow_plate::run_output::{OutputDescriptor, OutputImage, OutputSource, DESCRIPTOR_NAME, DESCRIPTOR_VERSION};
use hcsflow_plate::{PlateMetadata, SiteCell, StagePosition};

use crate::compile::{Plan, Slot, StepPlan};
use crate::output::manifest::{Manifest, OutputRecord, WellStatus};
use crate::output::write_atomic;
use crate::spec::Materialize;
use crate::PipelineError;

/// The descriptor path of every step that materialises TIFFs.
pub(crate) fn descriptor_paths(plan: &Plan) -> impl Iterator<Item = PathBuf> + '_ {
    plan.steps.iter().filter(|s| s.materialize.contains(&Materialize::Tiff)).map(|s| s.out_dir.join(DESCRIPTOR_NAME))
}

/// Writes the descriptor of every TIFF-materialising step that has images
/// in a complete well; returns the files written.
pub(crate) fn write_output_plates(plan: &Plan, manifest: &Manifest) -> Result<Vec<PathBuf>, PipelineError> {
    let mut written = Vec::new();
    for step in plan.steps.iter().filter(|s| s.materialize.contains(&Materialize::Tiff)) {
        let outputs: Vec<(&str, &OutputRecord)> = manifest
            .wells
            .iter()
            .filter(|(_, r)| r.status == WellStatus::Complete)
            .flat_map(|(well, r)| r.outputs.iter().filter(|o| o.step == step.name).map(move |o| (well.as_str(), o)))
            .collect();
        if outputs.is_empty() {
            continue;
        }
        let descriptor = describe(plan, step, &outputs);
        let json = serde_json::to_vec_pretty(&descriptor).map_err(|e| PipelineError::io(&step.out_dir, std::io::Error::other(e)))?;
        let path = step.out_dir.join(DESCRIPTOR_NAME);
        write_atomic(&path, &json)?;
        written.push(path);
    }
    Ok(written)
}

/// A key component as a plate component: a reduced one is 1.
fn component(raw: u32) -> u32 {
    Slot::of(raw).value().unwrap_or(1)
}

/// The value every item has, if they all have the same one.
fn common<T: PartialEq>(mut values: impl Iterator<Item = T>) -> Option<T> {
    let first = values.next()?;
    values.all(|v| v == first).then_some(first)
}

/// The descriptor of `step`'s images `outputs` (well, record).
fn describe(plan: &Plan, step: &StepPlan, outputs: &[(&str, &OutputRecord)]) -> OutputDescriptor {
    let mut images: Vec<OutputImage> = outputs
        .iter()
        .map(|(well, o)| OutputImage {
            well: well.to_string(),
            site: component(o.key[0]),
            channel: component(o.key[1]),
            z_index: component(o.key[2]),
            timepoint: component(o.key[3]),
            file: plan.out.join(&o.path).strip_prefix(&step.out_dir).map(Path::to_path_buf).unwrap_or_else(|_| o.path.clone()),
        })
        .collect();
    let components = |i: &OutputImage| (i.site, i.channel, i.z_index, i.timepoint);
    images.sort_by(|a, b| hcsflow_plate::cmp_wells(&a.well, &b.well).then(components(a).cmp(&components(b))));
    let reduced = |i: usize| outputs.iter().any(|(_, o)| Slot::of(o.key[i]) == Slot::Collapsed);
    let distinct = |f: fn(&OutputImage) -> u32| images.iter().map(f).collect::<BTreeSet<u32>>();
    let wells: BTreeSet<&str> = images.iter().map(|i| i.well.as_str()).collect();
    let sites = distinct(|i| i.site);
    let channels = distinct(|i| i.channel);
    let (grid, site_cells, stage_positions) = if reduced(0) {
        ((1, 1), vec![SiteCell { site: 1, row: 0, col: 0 }], Vec::new())
    } else {
        let cells = sites.iter().filter_map(|&s| plan.site_cells.get(&s).map(|&(row, col)| SiteCell { site: s, row, col })).collect();
        let positions = wells
            .iter()
            .flat_map(|w| sites.iter().map(move |&s| (*w, s)))
            .filter_map(|(w, s)| {
                let (x_um, y_um) = *plan.stage_positions.get(&(w.to_string(), s))?;
                Some(StagePosition { well: w.to_string(), site: s, x_um, y_um })
            })
            .collect();
        (plan.site_grid, cells, positions)
    };
    let channel_names: BTreeMap<u32, String> =
        if reduced(1) { BTreeMap::new() } else { channels.iter().filter_map(|c| Some((*c, plan.channel_names.get(c)?.clone()))).collect() };
    let metadata = PlateMetadata {
        name: plan.plate_name.clone(),
        description: Some(format!("step '{}' of pipeline '{}' run on {}", step.name, plan.pipeline_name, plan.plate_root.display())),
        plate_rows: plan.plate_size.0,
        plate_columns: plan.plate_size.1,
        acquired_wells: wells.iter().map(|w| w.to_string()).collect(),
        grid_rows: grid.0,
        grid_cols: grid.1,
        site_cells,
        field_to_site: BTreeMap::new(),
        pixel_size_um: plan.pixel_size_um,
        stage_positions,
        channel_names,
        bit_depth: None,
        image_width: common(outputs.iter().map(|(_, o)| o.width)).and_then(|w| u32::try_from(w).ok()),
        image_height: common(outputs.iter().map(|(_, o)| o.height)).and_then(|h| u32::try_from(h).ok()),
        dtype: common(outputs.iter().map(|(_, o)| o.dtype.as_str())).and_then(|d| d.parse::<DType>().ok()),
        sites: sites.len() as u32,
        channels: channels.len() as u32,
        z_planes: distinct(|i| i.z_index).len() as u32,
        timepoints: distinct(|i| i.timepoint).len() as u32,
    };
    let source = OutputSource {
        plate: plan.plate_root.clone(),
        format: plan.plate_format,
        pipeline: plan.pipeline_name.clone(),
        step: step.name.clone(),
    };
    OutputDescriptor { version: DESCRIPTOR_VERSION, source, metadata, images }
}
