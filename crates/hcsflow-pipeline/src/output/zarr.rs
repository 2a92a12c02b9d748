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
}

impl ZarrLayout {
    /// `(field, t, c, z)` of an output plane.
    pub fn position(&self, key: &Key) -> Option<(usize, usize, usize, usize)> {
        let at = |i: usize| self.index[i].get(&key[i]).copied();
        Some((at(0)?, at(3)?, at(1)?, at(2)?))
    }
}

/// Layouts of every zarr-materialised step. One step writes
/// `OUT/<plate>.ome.zarr`; several write `OUT/<plate>_<step>.ome.zarr`.
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
    zarr_steps
        .iter()
        .map(|&si| {
            let step = &plan.steps[si];
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
            let index: [BTreeMap<u32, usize>; 4] = values.clone().map(|set| set.into_iter().enumerate().map(|(i, v)| (v, i)).collect());
            let count = |i: usize| values[i].len().max(1);
            let channel_names = values[1]
                .iter()
                .map(|&c| match Slot::of(c) {
                    Slot::Collapsed => "composite".to_string(),
                    _ => channel_names.get(&c).cloned().unwrap_or_else(|| format!("Channel {c}")),
                })
                .collect();
            let (h, w, dtype) = plan.plane;
            let dtype: DType = step.dtype.output.resolve(dtype);
            let name = if zarr_steps.len() == 1 { format!("{plate}.ome.zarr") } else { format!("{plate}_{}.ome.zarr", step.name) };
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
            ZarrLayout { step: si, root: plan.out.join(name), spec, index }
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

    /// Writes one output plane of step `step` of `well`.
    pub(crate) fn write(&self, step: usize, well: &str, key: &Key, plane: &Stack) -> Result<(), StepError> {
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
