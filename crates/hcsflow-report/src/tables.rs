//! Per-well measures the report draws as heatmaps from the artifact tables a
//! run wrote (`OUT/<step>/<artifact>/<well>.csv`, listed in the manifest):
//!
//! - an objects table (a column `ObjectNumber` or `label`): objects per well,
//!   the table's rows;
//! - a `count` column (per-image counts): their sum per well;
//! - the `image_quality` function's focus, saturation and mean-intensity
//!   columns: their mean per well and channel (the table's `channel` column);
//! - `tile_positions`' tables: the edges' median score and how many edges were
//!   not accepted (`score`, `status`), and the largest shift of a tile from its
//!   stage position (`x_px`, `y_px`, `stage_x_px`, `stage_y_px`): each tile's
//!   registered − stage offset, less the well's mean offset (registration
//!   anchors the grid anywhere), its length in pixels.

use std::path::Path;

use hcsflow_pipeline::ArtifactRecord;
use serde::Serialize;

/// One per-well value of a table, for a heatmap titled `title`.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct TableMeasure {
    pub title: String,
    pub value: f64,
    /// "" or "%".
    pub unit: &'static str,
}

/// The `image_quality` columns shown, with their heatmap titles and units.
const QUALITY_SHOWN: [(&str, &str, &str); 3] = [
    ("ImageQuality_LaplacianVariance", "Focus (variance of the Laplacian / mean)", ""),
    ("ImageQuality_PercentSaturated", "Saturated pixels (%)", "%"),
    ("ImageQuality_MeanIntensity", "Mean intensity", ""),
];

/// The measures of one well's artifact tables (see the module docs); a table
/// that cannot be read is a problem (named with its path), not an error.
pub fn well_measures(out: &Path, artifacts: &[ArtifactRecord], problems: &mut Vec<String>) -> Vec<TableMeasure> {
    let mut measures = Vec::new();
    for a in artifacts {
        let path = out.join(&a.path);
        let text = match std::fs::read_to_string(&path) {
            Ok(t) => t,
            Err(e) => {
                problems.push(format!("{}: {e}", path.display()));
                continue;
            }
        };
        let records = parse_csv(&text);
        let Some((header, rows)) = records.split_first() else { continue };
        let column = |name: &str| header.iter().position(|h| h == name);
        let source = format!("{}/{}", a.step, a.artifact);
        if column("ObjectNumber").or(column("label")).is_some() {
            measures.push(TableMeasure { title: format!("Objects per well ({source})"), value: a.rows as f64, unit: "" });
        }
        if let Some(c) = column("count") {
            let sum = rows.iter().filter_map(|r| number(r, c)).sum();
            measures.push(TableMeasure { title: format!("Count per well ({source})"), value: sum, unit: "" });
        }
        if let (Some(score), Some(status)) = (column("score"), column("status")) {
            let mut scores: Vec<f64> = rows.iter().filter_map(|r| number(r, score)).collect();
            scores.sort_by(f64::total_cmp);
            if let Some(&median) = scores.get(scores.len() / 2) {
                measures.push(TableMeasure { title: format!("Median edge score ({source})"), value: median, unit: "" });
            }
            let rejected = rows.iter().filter(|r| r.get(status).is_some_and(|s| s != "accepted")).count();
            measures.push(TableMeasure { title: format!("Edges not accepted ({source})"), value: rejected as f64, unit: "" });
        }
        if let [Some(x), Some(y), Some(sx), Some(sy)] = ["x_px", "y_px", "stage_x_px", "stage_y_px"].map(column) {
            let offsets: Vec<(f64, f64)> =
                rows.iter().filter_map(|r| Some((number(r, x)? - number(r, sx)?, number(r, y)? - number(r, sy)?))).collect();
            if !offsets.is_empty() {
                let n = offsets.len() as f64;
                let (mx, my) = offsets.iter().fold((0.0, 0.0), |(a, b), (dx, dy)| (a + dx / n, b + dy / n));
                let largest = offsets.iter().map(|(dx, dy)| (dx - mx).hypot(dy - my)).fold(0.0, f64::max);
                measures.push(TableMeasure {
                    title: format!("Largest tile shift from the stage, px ({source})"),
                    value: largest,
                    unit: "",
                });
            }
        }
        let channel = column("channel");
        for (name, title, unit) in QUALITY_SHOWN {
            let Some(c) = column(name) else { continue };
            let mut by_channel: std::collections::BTreeMap<String, (f64, usize)> = Default::default();
            for r in rows {
                if let Some(v) = number(r, c) {
                    let key = channel.and_then(|k| r.get(k)).cloned().unwrap_or_default();
                    let e = by_channel.entry(key).or_default();
                    *e = (e.0 + v, e.1 + 1);
                }
            }
            for (ch, (sum, n)) in by_channel {
                let which = if ch.is_empty() { String::new() } else { format!(", channel {ch}") };
                measures.push(TableMeasure { title: format!("{title}{which} ({source})"), value: sum / n as f64, unit });
            }
        }
    }
    measures
}

/// The finite number in `record`'s `column`, if any.
pub(crate) fn number(record: &[String], column: usize) -> Option<f64> {
    record.get(column).and_then(|v| v.parse::<f64>().ok()).filter(|v| v.is_finite())
}

/// The records of a CSV text as our tables write it (RFC 4180: fields with a
/// comma, quote or line break are quoted, quotes doubled); blank lines skipped.
pub fn parse_csv(text: &str) -> Vec<Vec<String>> {
    let mut records = Vec::new();
    let (mut record, mut field) = (Vec::new(), String::new());
    let (mut quoted, mut chars) = (false, text.chars().peekable());
    while let Some(c) = chars.next() {
        match (quoted, c) {
            (true, '"') if chars.peek() == Some(&'"') => {
                chars.next();
                field.push('"');
            }
            (true, '"') => quoted = false,
            (true, c) => field.push(c),
            (false, '"') => quoted = true,
            (false, ',') => record.push(std::mem::take(&mut field)),
            (false, '\r') => {}
            (false, '\n') => {
                record.push(std::mem::take(&mut field));
                if !(record.len() == 1 && record[0].is_empty()) {
                    records.push(std::mem::take(&mut record));
                }
                record.clear();
            }
            (false, c) => field.push(c),
        }
    }
    if !field.is_empty() || !record.is_empty() {
        record.push(field);
        records.push(record);
    }
    records
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn csv_fields_round_trip_what_cells_write() {
        use hcsflow_core::artifact::Cell;
        let cells = [Cell::Text("a,b".into()), Cell::Text("say \"hi\"\nthen go".into()), Cell::Float(1.5), Cell::Empty, Cell::Int(-3)];
        let line: Vec<String> = cells.iter().map(|c| c.to_string()).collect();
        let text = format!("x,y,z,w,v\r\n{}\n\n", line.join(","));
        let parsed = parse_csv(&text);
        assert_eq!(parsed.len(), 2, "{parsed:?}");
        assert_eq!(parsed[1], ["a,b", "say \"hi\"\nthen go", "1.5", "", "-3"]);
        assert_eq!(parse_csv("a,b"), [["a", "b"]]);
    }

    #[test]
    fn measures_of_objects_counts_and_quality_tables() {
        let dir = tempfile::tempdir().unwrap();
        let write = |name: &str, text: &str| {
            std::fs::write(dir.path().join(name), text).unwrap();
            ArtifactRecord {
                step: "s".into(),
                artifact: name.trim_end_matches(".csv").into(),
                path: name.into(),
                rows: text.lines().count() - 1,
            }
        };
        let objects =
            write("objects.csv", "well,site,channel,z_index,timepoint,ObjectNumber,AreaShape_Area\nA01,1,1,,,1,10\nA01,2,1,,,1,12\n");
        let counts = write("counts.csv", "well,site,channel,z_index,timepoint,count\nA01,1,1,,,5\nA01,2,1,,,7\n");
        let quality = write(
            "q.csv",
            "well,site,channel,z_index,timepoint,ImageQuality_MeanIntensity,ImageQuality_LaplacianVariance,ImageQuality_PercentSaturated\n\
             A01,1,1,,,100,0.5,0\nA01,2,1,,,300,1.5,2\nA01,1,2,,,50,0.25,1\n",
        );
        let edges = write(
            "edges.csv",
            "well,site,channel,z_index,timepoint,tile_a,tile_b,score,status\nA01,,,,,1,2,0.9,accepted\nA01,,,,,1,3,0.2,low_score\nA01,,,,,2,4,0.7,accepted\n",
        );
        let positions = write(
            "positions.csv",
            "well,site,channel,z_index,timepoint,x_px,y_px,stage_x_px,stage_y_px\nA01,1,,,,10,20,0,0\nA01,2,,,,110,20,100,0\nA01,3,,,,13,124,0,100\nA01,4,,,,110,120,100,100\n",
        );
        let missing = ArtifactRecord { step: "s".into(), artifact: "gone".into(), path: "gone.csv".into(), rows: 0 };
        let mut problems = Vec::new();
        let m = well_measures(dir.path(), &[objects, counts, quality, edges, positions, missing], &mut problems);
        let value = |t: &str| m.iter().find(|x| x.title == t).map(|x| x.value);
        assert_eq!(value("Objects per well (s/objects)"), Some(2.0));
        assert_eq!(value("Count per well (s/counts)"), Some(12.0));
        assert_eq!(value("Mean intensity, channel 1 (s/q)"), Some(200.0));
        assert_eq!(value("Mean intensity, channel 2 (s/q)"), Some(50.0));
        assert_eq!(value("Focus (variance of the Laplacian / mean), channel 1 (s/q)"), Some(1.0));
        assert_eq!(value("Saturated pixels (%), channel 2 (s/q)"), Some(1.0));
        assert_eq!(value("Median edge score (s/edges)"), Some(0.7));
        assert_eq!(value("Edges not accepted (s/edges)"), Some(1.0));
        // Offsets (10,20), (10,20), (13,24), (10,20): mean (10.75, 21); tile 3 is off by (2.25, 3).
        assert_eq!(value("Largest tile shift from the stage, px (s/positions)"), Some(2.25f64.hypot(3.0)));
        assert_eq!(m.len(), 2 + 3 * 2 + 3);
        assert!(problems.len() == 1 && problems[0].contains("gone.csv"), "{problems:?}");
    }
}
