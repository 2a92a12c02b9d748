//! The tables a run writes: per well and artifact `OUT/<step>/<artifact>/<well>.csv`,
//! joined over wells `OUT/<step>/<artifact>.csv`, and the plate summaries
//! `OUT/summary.csv` (output planes) and `OUT/artifacts.csv` (artifact tables).

use std::path::{Path, PathBuf};

use crate::compile::{Key, Plan, Slot};
use crate::exec::{Produced, StepError};
use crate::output::manifest::{ArtifactRecord, Manifest, WellRecord, WellStatus};
use crate::output::write_atomic;
use crate::PipelineError;

/// The per-plate CSV summary of outputs in OUT.
pub const SUMMARY_NAME: &str = "summary.csv";
/// The per-plate CSV summary of artifact tables in OUT.
pub const ARTIFACTS_NAME: &str = "artifacts.csv";

/// Columns every artifact CSV starts with: where each row belongs.
const ARTIFACT_KEY_COLUMNS: &str = "well,site,channel,z_index,timepoint";

/// Writes the tables of artifact `name` of one step in one well to
/// `OUT/<step>/<name>/<well>.csv` (atomically): the key columns, then the table's.
pub(crate) fn write_well_artifact(
    plan: &Plan,
    well: &str,
    step: &str,
    name: &str,
    tables: &[&Produced],
) -> Result<ArtifactRecord, StepError> {
    let columns = tables.first().map(|p| p.table.columns.clone()).unwrap_or_default();
    if let Some(other) = tables.iter().find(|p| p.table.columns != columns) {
        return Err(StepError::Failed(format!(
            "artifact '{name}': stacks produced different columns ([{}] vs [{}])",
            columns.join(", "),
            other.table.columns.join(", ")
        )));
    }
    let mut csv = csv_header(&columns);
    let mut rows = 0;
    for p in tables {
        for row in &p.table.rows {
            let key = row.plane.and_then(|i| p.keys.get(i)).copied().unwrap_or(p.scope);
            push_row(&mut csv, well, &key, &row.cells);
            rows += 1;
        }
    }
    let dir = plan.out.join(step).join(name);
    std::fs::create_dir_all(&dir).map_err(|e| StepError::io(&dir, e))?;
    let path = dir.join(format!("{well}.csv"));
    write_atomic(&path, csv.as_bytes())?;
    Ok(ArtifactRecord {
        step: step.to_string(),
        artifact: name.to_string(),
        path: path.strip_prefix(&plan.out).map(Path::to_path_buf).unwrap_or(path),
        rows,
    })
}

/// Writes the tables of artifact `name` of the plate-wide step `step` to
/// `OUT/<step>/<name>.csv` (atomically): the key columns, each row's well and
/// components from the sampled plane it belongs to (`tables`: each group's
/// table with its sampled planes), then the table's columns.
pub(crate) fn write_plate_artifact(
    plan: &Plan,
    step: &str,
    name: &str,
    tables: &[crate::plate_run::SampledTable],
) -> Result<ArtifactRecord, PipelineError> {
    let columns = tables.first().map(|(t, _)| t.columns.clone()).unwrap_or_default();
    let mut csv = csv_header(&columns);
    let mut rows = 0;
    for (table, planes) in tables {
        for row in &table.rows {
            let (well, key) = match row.plane.and_then(|i| planes.get(i)) {
                Some((well, key)) => (well.as_str(), *key),
                None => ("", [crate::compile::COLLAPSED; 4]),
            };
            push_row(&mut csv, well, &key, &row.cells);
            rows += 1;
        }
    }
    let dir = plan.out.join(step);
    std::fs::create_dir_all(&dir).map_err(|e| PipelineError::io(&dir, e))?;
    let path = dir.join(format!("{name}.csv"));
    write_atomic(&path, csv.as_bytes())?;
    Ok(ArtifactRecord {
        step: step.to_string(),
        artifact: name.to_string(),
        path: path.strip_prefix(&plan.out).map(Path::to_path_buf).unwrap_or(path),
        rows,
    })
}

/// Joins the per-well artifact CSVs of the complete wells into
/// `OUT/<step>/<artifact>.csv` (wells in plate order) and writes the
/// `OUT/artifacts.csv` summary. Rebuilt from the manifest, so a resumed run's
/// tables include the wells of earlier runs.
pub(crate) fn write_artifact_tables(plan: &Plan, manifest: &Manifest) -> Result<Vec<PathBuf>, PipelineError> {
    let mut wells: Vec<(&String, &WellRecord)> = manifest.wells.iter().filter(|(_, r)| r.status == WellStatus::Complete).collect();
    wells.sort_by(|a, b| hcsflow_plate::cmp_wells(a.0, b.0));
    let mut summary = String::from("well,step,artifact,rows,path\n");
    let mut written = Vec::new();
    for step in &plan.steps {
        for name in &step.produces {
            let mut joined: Option<String> = None;
            for (well, record) in &wells {
                for a in record.artifacts.iter().filter(|a| a.step == step.name && &a.artifact == name) {
                    summary.push_str(&format!("{well},{},{},{},{}\n", a.step, a.artifact, a.rows, a.path.display()));
                    let path = plan.out.join(&a.path);
                    let text = std::fs::read_to_string(&path).map_err(|e| PipelineError::io(&path, e))?;
                    let (header, body) = text.split_once('\n').unwrap_or((text.as_str(), ""));
                    let j = joined.get_or_insert_with(|| format!("{header}\n"));
                    j.push_str(body);
                }
            }
            if let Some(j) = joined {
                let path = step.out_dir.join(format!("{name}.csv"));
                write_atomic(&path, j.as_bytes())?;
                written.push(path);
            }
        }
    }
    write_atomic(&plan.out.join(ARTIFACTS_NAME), summary.as_bytes())?;
    Ok(written)
}

/// `OUT/summary.csv`: one row per output plane of every complete well.
pub(crate) fn write_summary_csv(out: &Path, manifest: &Manifest) -> Result<(), PipelineError> {
    let mut csv = String::from("well,step,site,channel,z_index,timepoint,path,height,width,dtype\n");
    // Output planes have no variable component; a collapsed one is an empty cell.
    let cell = |v: u32| if Slot::of(v) == Slot::Collapsed { String::new() } else { v.to_string() };
    let mut wells: Vec<(&String, &WellRecord)> = manifest.wells.iter().filter(|(_, r)| r.status == WellStatus::Complete).collect();
    wells.sort_by(|a, b| hcsflow_plate::cmp_wells(a.0, b.0));
    for (well, record) in wells {
        for o in &record.outputs {
            let path = o.path.to_string_lossy();
            let path = if path.contains([',', '"']) { format!("\"{}\"", path.replace('"', "\"\"")) } else { path.into_owned() };
            csv.push_str(&format!(
                "{well},{},{},{},{},{},{path},{},{},{}\n",
                o.step,
                cell(o.key[0]),
                cell(o.key[1]),
                cell(o.key[2]),
                cell(o.key[3]),
                o.height,
                o.width,
                o.dtype
            ));
        }
    }
    write_atomic(&out.join(SUMMARY_NAME), csv.as_bytes())
}

/// The header line of an artifact table's CSV: the key columns, then
/// `columns` (quoted as CSV text where needed).
fn csv_header(columns: &[String]) -> String {
    let mut csv = String::from(ARTIFACT_KEY_COLUMNS);
    for c in columns {
        csv.push(',');
        csv.push_str(&hcsflow_core::Cell::Text(c.clone()).to_string());
    }
    csv.push('\n');
    csv
}

/// Appends one artifact row: its well, its plane's components (collapsed and
/// variable components have no value: empty cells), then its cells.
fn push_row(csv: &mut String, well: &str, key: &Key, cells: &[hcsflow_core::Cell]) {
    let cell = |v: u32| Slot::of(v).value().map(|v| v.to_string()).unwrap_or_default();
    csv.push_str(&format!("{well},{},{},{},{}", cell(key[0]), cell(key[1]), cell(key[2]), cell(key[3])));
    for c in cells {
        csv.push(',');
        csv.push_str(&c.to_string());
    }
    csv.push('\n');
}
