//! The output planes of a step materialized as TIFF: one file per plane,
//! `OUT/<step>/<name mirroring the input's>`, written atomically by `hcsflow-tiff`.

use std::path::{Path, PathBuf};

use hcsflow_core::Stack;
use hcsflow_tiff::WriteOptions;
use rayon::prelude::*;

use crate::compile::{Key, Plan, StepPlan, WellStepPlan};
use crate::exec::{key_text, StepError};
use crate::output::disk_full;
use crate::output::manifest::OutputRecord;

/// Writes the output planes of step `step` in one well (`stacks`, its
/// stacks) from `planes`, in parallel; each file's folder is created. The
/// records name the files relative to OUT. A plane the plan names and
/// `planes` lacks is an error.
pub(crate) fn write_planes(
    plan: &Plan,
    step: &StepPlan,
    stacks: &WellStepPlan,
    planes: &std::collections::BTreeMap<Key, Stack>,
) -> Result<Vec<OutputRecord>, StepError> {
    let files: Vec<(&Key, PathBuf)> =
        stacks.groups.iter().flat_map(|g| g.outputs.iter()).map(|o| (&o.key, step.out_dir.join(&o.rel))).collect();
    let options = WriteOptions { pixel_size_um: plan.pixel_size_um.filter(|p| p.is_finite() && *p > 0.0), ..Default::default() };
    files
        .par_iter()
        .map(|(key, path)| {
            let stack = planes.get(*key).ok_or_else(|| StepError::Failed(format!("output plane {} was not produced", key_text(key))))?;
            if let Some(parent) = path.parent() {
                std::fs::create_dir_all(parent).map_err(|e| StepError::io(parent, e))?;
            }
            disk_full::reserve(stack.nbytes() as u64).map_err(|e| StepError::io(path, e))?;
            hcsflow_tiff::write_stack(path, stack, &options)?;
            let [_, h, w] = stack.shape();
            Ok(OutputRecord {
                step: step.name.clone(),
                key: **key,
                path: path.strip_prefix(&plan.out).map(Path::to_path_buf).unwrap_or_else(|_| path.clone()),
                height: h,
                width: w,
                dtype: stack.dtype().to_string(),
            })
        })
        .collect()
}
