//! OME-Zarr output of steps with `materialize = ["zarr"]`, through `hcsflow-zarr`.
//!
//! The layout is decided at compile time from the step's output keys over
//! all wells: fields are the distinct sites (numeric order), `c` the distinct
//! channels, `z` the distinct z planes (1 when a projection collapsed z), `t`
//! the timepoints. Fields that are plate sites carry their stage positions
//! as NGFF translations, so the plate re-opens with its site grid. The y × x extent is taken from the planes themselves
//! ([`FieldExtent::Grow`], chunked by the plate's field size), because a
//! step's output size is known only when it runs: a step that keeps the field
//! size writes field-sized images, and a step whose planes are whole-well
//! mosaics (`assemble`, the site collapsed) writes one field per well holding
//! the mosaic, every well padded with 0 at the bottom and right to the plate's
//! largest mosaic (NGFF allows any shape per image, but ome-zarr-py and napari
//! draw the plate with the first well's shape). The TIFF output of the same
//! step holds each mosaic at its own size. Planes are written as each well finishes the step; the
//! plate metadata is written by [`ZarrOutput::finish`] after the run, listing
//! the wells that have fields (a failed well is left out, and added by a
//! `--resume` run, which reopens the same plate).
//!
//! **Labels.** A zarr-materialised step whose output is a label image (every
//! chain ends in a function declared with
//! [`with_label_output`](hcsflow_core::FunctionDecl::with_label_output):
//! `segment_nuclei`, `watershed`, `label`, ...) writes no plate of its own
//! when another zarr-materialised step writes images (the nearest earlier
//! one, else the nearest later one): its planes become OME-NGFF label images
//! under that plate's fields (`{row}/{col}/{field}/labels/{name}`, u16, see
//! [`PlateWriter::write_label_plane`]), so napari shows them over the
//! images. The label image is named after the step (`{step}_{channel}` when
//! the step keeps several channels), each plane going to the field, t and z of
//! the image plate with the same site, timepoint and z. Without an image
//! plate the step writes its labels as a plate of images, as any step.

use std::collections::{BTreeMap, BTreeSet};
use std::path::PathBuf;

use hcsflow_core::{DType, Stack};
use hcsflow_zarr::{FieldExtent, FieldPosition, FieldShape, NgffVersion, PlateSpec, PlateWriter};

use crate::compile::{Key, Plan, Slot};
use crate::exec::StepError;
use crate::spec::Materialize;
use crate::PipelineError;

/// Where each component value goes in the zarr plate of one step.
#[derive(Debug, Clone)]
pub struct ZarrLayout {
    /// Index into [`crate::Plan::steps`].
    pub step: usize,
    pub root: PathBuf,
    pub spec: PlateSpec,
    /// Per component (site, channel, z, t): value → 0-based index.
    index: [BTreeMap<u32, usize>; 4],
    /// Steps whose label images go under this plate's fields.
    pub labels: Vec<LabelLayout>,
}

/// A label step written as NGFF labels into another step's plate.
#[derive(Debug, Clone)]
pub struct LabelLayout {
    /// Index into [`crate::Plan::steps`].
    pub step: usize,
    /// Channel value of an output plane → the label image's name.
    names: BTreeMap<u32, String>,
}

impl ZarrLayout {
    /// `(field, t, c, z)` of an output plane.
    pub fn position(&self, key: &Key) -> Option<(usize, usize, usize, usize)> {
        let at = |i: usize| self.index[i].get(&key[i]).copied();
        Some((at(0)?, at(3)?, at(1)?, at(2)?))
    }

    /// `(field, t, z, label name)` of an output plane of label step `label`.
    fn label_position<'a>(&self, label: &'a LabelLayout, key: &Key) -> Option<(usize, usize, usize, &'a str)> {
        let at = |i: usize| self.index[i].get(&key[i]).copied();
        Some((at(0)?, at(3)?, at(2)?, label.names.get(&key[1])?.as_str()))
    }
}

/// A name as a path segment of a label image: ASCII letters, digits, `_`
/// and `-` kept, anything else `_`.
fn label_segment(name: &str) -> String {
    name.chars().map(|ch| if ch.is_ascii_alphanumeric() || ch == '-' { ch } else { '_' }).collect()
}

/// Layouts of every zarr-materialised step that writes a plate (label steps
/// with an image plate are in that plate's [`ZarrLayout::labels`]). One plate
/// is `OUT/<plate>.ome.zarr`; several are `OUT/<plate>_<step>.ome.zarr`.
/// `version` is the NGFF version of every plate of the run (0.5 on Zarr v3
/// by default; 0.4 on Zarr v2 for readers that predate Zarr v3).
pub(crate) fn layouts(plan: &Plan, channel_names: &BTreeMap<u32, String>, version: NgffVersion) -> Vec<ZarrLayout> {
    let zarr_steps: Vec<usize> = (0..plan.steps.len()).filter(|&i| plan.steps[i].materialize.contains(&Materialize::Zarr)).collect();
    let plate = if plan.plate_name.is_empty() { "plate".to_string() } else { plan.plate_name.replace(['/', '\\'], "_") };
    let mut rows = BTreeSet::new();
    let mut cols = BTreeSet::new();
    for w in &plan.wells {
        if let Some((r, c)) = hcsflow_plate::parse_well(&w.well) {
            rows.insert(r);
            cols.insert(c);
        }
    }
    // Label steps with an image plate to go into: step → the image step.
    let is_labels = |si: usize| {
        let chains = &plan.steps[si].chains;
        !chains.is_empty() && chains.iter().all(|c| c.calls.last().is_some_and(|call| call.output_labels))
    };
    let image_steps: Vec<usize> = zarr_steps.iter().copied().filter(|&si| !is_labels(si)).collect();
    let label_target = |si: usize| -> Option<usize> {
        if !is_labels(si) {
            return None;
        }
        image_steps.iter().rev().find(|&&i| i < si).or_else(|| image_steps.iter().find(|&&i| i > si)).copied()
    };
    let component_values = |si: usize| {
        let mut values: [BTreeSet<u32>; 4] = Default::default();
        for w in &plan.wells {
            for ws in w.steps.iter().filter(|s| s.step == si) {
                for o in ws.groups.iter().flat_map(|g| &g.outputs) {
                    for (i, v) in o.key.iter().enumerate() {
                        values[i].insert(*v);
                    }
                }
            }
        }
        values
    };
    let channel_name = |c: u32| match Slot::of(c) {
        Slot::Collapsed => "composite".to_string(),
        _ => channel_names.get(&c).cloned().unwrap_or_else(|| format!("Channel {c}")),
    };
    let plates: Vec<usize> = zarr_steps.iter().copied().filter(|&si| label_target(si).is_none()).collect();
    let label_layouts = |image: usize| -> Vec<LabelLayout> {
        zarr_steps
            .iter()
            .copied()
            .filter(|&si| label_target(si) == Some(image))
            .map(|si| {
                let step = label_segment(&plan.steps[si].name);
                let channels = component_values(si)[1].clone();
                let names = channels
                    .iter()
                    .map(|&c| {
                        let name = if channels.len() == 1 { step.clone() } else { format!("{step}_{}", label_segment(&channel_name(c))) };
                        (c, name)
                    })
                    .collect();
                LabelLayout { step: si, names }
            })
            .collect()
    };
    plates
        .iter()
        .map(|&si| {
            let step = &plan.steps[si];
            let values = component_values(si);
            let index: [BTreeMap<u32, usize>; 4] = values.clone().map(|set| set.into_iter().enumerate().map(|(i, v)| (v, i)).collect());
            let count = |i: usize| values[i].len().max(1);
            let channel_names = values[1].iter().map(|&c| channel_name(c)).collect();
            let (h, w, dtype) = plan.plane;
            let dtype: DType = step.dtype.output.resolve(dtype);
            let name = if plates.len() == 1 { format!("{plate}.ome.zarr") } else { format!("{plate}_{}.ome.zarr", step.name) };
            // Fields that are sites of the plate keep their stage positions (a
            // reduced site, a mosaic, has none).
            let field_positions_um = plan
                .wells
                .iter()
                .flat_map(|w| index[0].iter().map(move |(&site, &field)| (w, site, field)))
                .filter_map(|(w, site, field)| {
                    let &(x_um, y_um) = plan.stage_positions.get(&(w.well.clone(), site))?;
                    Some(FieldPosition { well: w.well.clone(), field, y_um, x_um })
                })
                .collect();
            let spec = PlateSpec {
                name: plate.clone(),
                rows: rows.iter().filter_map(|&r| hcsflow_plate::well::row_letters(r)).collect(),
                columns: cols.iter().map(|c| c.to_string()).collect(),
                wells: plan.wells.iter().map(|w| w.well.clone()).collect(),
                fields_per_well: count(0),
                channel_names,
                pixel_size_um: plan.pixel_size_um.map(|p| (p, p)),
                dtype,
                shape: FieldShape { t: count(3), c: count(1), z: count(2), y: h, x: w },
                version,
                extent: FieldExtent::Grow,
                field_positions_um,
                ..PlateSpec::default()
            };
            ZarrLayout { step: si, root: plan.out.join(name), spec, index, labels: label_layouts(si) }
        })
        .collect()
}

/// The open zarr plates of a run.
pub(crate) struct ZarrOutput {
    pub(crate) writers: Vec<(ZarrLayout, PlateWriter)>,
}

impl ZarrOutput {
    /// Creates (or, for a rerun or `--resume`, reopens) every zarr plate.
    pub(crate) fn open(layouts: Vec<ZarrLayout>) -> Result<ZarrOutput, PipelineError> {
        let mut writers = Vec::new();
        for l in layouts {
            let w = PlateWriter::create_or_resume(&l.root, l.spec.clone()).map_err(|e| PipelineError::Config {
                message: format!("{}: {e}", l.root.display()),
                fix: "remove the old OME-Zarr output or choose another output folder".into(),
            })?;
            writers.push((l, w));
        }
        Ok(ZarrOutput { writers })
    }

    /// The plate roots, in the order of the layouts.
    pub(crate) fn roots(&self) -> Vec<PathBuf> {
        self.writers.iter().map(|(l, _)| l.root.clone()).collect()
    }

    /// Writes one output plane of step `step` of `well` (as a label image
    /// when the step's labels go into another step's plate).
    pub(crate) fn write(&self, step: usize, well: &str, key: &Key, plane: &Stack) -> Result<(), StepError> {
        for (layout, writer) in &self.writers {
            let Some(label) = layout.labels.iter().find(|l| l.step == step) else { continue };
            let (field, t, z, name) = layout.label_position(label, key).ok_or_else(|| {
                StepError::Failed(format!(
                    "OME-Zarr labels: plane {key:?} has no field, timepoint and z of the same site, timepoint and z in {}",
                    layout.root.display()
                ))
            })?;
            return writer.write_label_plane(well, field, name, t, z, plane).map_err(|e| StepError::Zarr(Box::new(e)));
        }
        let Some((layout, writer)) = self.writers.iter().find(|(l, _)| l.step == step) else { return Ok(()) };
        let (field, t, c, z) = layout
            .position(key)
            .ok_or_else(|| StepError::Failed(format!("OME-Zarr: plane {key:?} has no place in {}", layout.root.display())))?;
        writer.write_plane(well, field, t, c, z, plane).map_err(|e| StepError::Zarr(Box::new(e)))
    }

    /// Writes the plate metadata of every zarr plate.
    pub(crate) fn finish(self) -> Result<Vec<PathBuf>, PipelineError> {
        self.writers
            .into_iter()
            .map(|(l, w)| w.finish().map_err(|e| PipelineError::Zarr { path: l.root.clone(), source: Box::new(e) }))
            .collect()
    }
}
