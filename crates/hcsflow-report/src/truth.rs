//! The quality of a run's steps against a synthetic plate's ground truth.
//!
//! A front end that knows the truth of the plate it ran on (`hcsflow demo
//! --pipeline mega-flex`, `hcsflow::mega_flex`) measures each step's input
//! and output against it and writes the rows as `OUT/quality_vs_truth.json`
//! (a JSON array of [`QualityRow`]) and `.csv`; [`crate::write_report`] shows
//! them as a table when the JSON is there. Runs on real plates have no such
//! file and no such table.

use std::path::Path;

use serde::{Deserialize, Serialize};

/// The quality table's file names under OUT.
pub const QUALITY_CSV_NAME: &str = "quality_vs_truth.csv";
pub const QUALITY_JSON_NAME: &str = "quality_vs_truth.json";

/// Whether a measure is better lower, higher, or closer to the truth's value.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum Better {
    Lower,
    Higher,
    /// Closer to [`QualityRow::truth`] (e.g. a focus measure: sharper than
    /// the truth is as wrong as blurrier).
    Closer,
}

impl Better {
    /// As the CSV and the report say it.
    pub fn as_str(self) -> &'static str {
        match self {
            Better::Lower => "lower",
            Better::Higher => "higher",
            Better::Closer => "closer to the truth",
        }
    }
}

/// One row of the quality table: a step's measure on its input and its output.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct QualityRow {
    /// The pipeline step measured.
    pub step: String,
    /// 1-based channel, or `None` for a per-well (all channels) measure.
    pub channel: Option<u32>,
    /// A well, or `None` for a measure over every well.
    pub well: Option<String>,
    pub measure: String,
    pub unit: String,
    pub better: Better,
    /// The measure on the step's input (`None`: the input has no such measure).
    pub input: Option<f64>,
    pub output: f64,
    /// The value of the truth itself, where it has one (e.g. its focus).
    pub truth: Option<f64>,
    /// How many images, tiles or wells the value is the mean of.
    pub samples: usize,
}

impl QualityRow {
    /// Whether the output is better than the input (`None` without an
    /// input, or for [`Better::Closer`] without a truth value).
    pub fn improved(&self) -> Option<bool> {
        let input = self.input?;
        match self.better {
            Better::Lower => Some(self.output < input),
            Better::Higher => Some(self.output > input),
            Better::Closer => self.truth.map(|t| (self.output - t).abs() < (input - t).abs()),
        }
    }
}

/// A row as the report shows it.
#[derive(Debug, Clone, Serialize)]
pub struct QualityFacts {
    #[serde(flatten)]
    pub row: QualityRow,
    /// [`Better::as_str`].
    pub better_text: &'static str,
    /// The input, output and truth values as [`significant`] writes them ("—" for none).
    pub input_text: String,
    pub output_text: String,
    pub truth_text: String,
    pub improved: Option<bool>,
}

/// The rows of `OUT/quality_vs_truth.json`: empty when the run has none; an
/// error naming the file when it cannot be read or is not such a table.
pub fn read_quality(out: &Path) -> Result<Vec<QualityFacts>, String> {
    let path = out.join(QUALITY_JSON_NAME);
    let bytes = match std::fs::read(&path) {
        Ok(b) => b,
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Ok(Vec::new()),
        Err(e) => return Err(format!("{}: {e}", path.display())),
    };
    let rows: Vec<QualityRow> = serde_json::from_slice(&bytes).map_err(|e| format!("{}: not a quality table ({e})", path.display()))?;
    let text = |v: Option<f64>| v.map_or_else(|| "—".to_string(), significant);
    Ok(rows
        .into_iter()
        .map(|row| QualityFacts {
            better_text: row.better.as_str(),
            improved: row.improved(),
            input_text: text(row.input),
            output_text: text(Some(row.output)),
            truth_text: text(row.truth),
            row,
        })
        .collect())
}

/// `value` with 4 significant digits in plain notation (`0.0001684`, `6.241`, `30.80`, `232.0`):
/// the measures of the table span six orders of magnitude, so a fixed number of decimals shows
/// the small ones as 0.
pub fn significant(value: f64) -> String {
    if !value.is_finite() || value == 0.0 {
        return format!("{value}");
    }
    let decimals = (3 - value.abs().log10().floor() as i64).clamp(0, 12) as usize;
    format!("{value:.decimals$}")
}

#[cfg(test)]
mod tests {
    use super::*;

    fn row(better: Better, input: Option<f64>, output: f64, truth: Option<f64>) -> QualityRow {
        QualityRow {
            step: "s".into(),
            channel: Some(1),
            well: None,
            measure: "m".into(),
            unit: String::new(),
            better,
            input,
            output,
            truth,
            samples: 1,
        }
    }

    #[test]
    fn improved_follows_the_direction_of_the_measure() {
        assert_eq!(row(Better::Lower, Some(2.0), 1.0, None).improved(), Some(true));
        assert_eq!(row(Better::Higher, Some(2.0), 1.0, None).improved(), Some(false));
        assert_eq!(row(Better::Closer, Some(2.0), 1.2, Some(1.0)).improved(), Some(true));
        assert_eq!(row(Better::Closer, Some(2.0), 3.5, Some(1.0)).improved(), Some(false));
        assert_eq!(row(Better::Closer, Some(2.0), 1.0, None).improved(), None);
        assert_eq!(row(Better::Lower, None, 1.0, None).improved(), None);
    }

    #[test]
    fn values_keep_four_significant_digits() {
        let cases = [
            (0.000168412, "0.0001684"),
            (0.0028157, "0.002816"),
            (6.2412, "6.241"),
            (30.8003, "30.80"),
            (-1.5, "-1.500"),
            (232.0, "232.0"),
            (12345.6, "12346"),
            (0.0, "0"),
            (f64::INFINITY, "inf"),
        ];
        for (value, text) in cases {
            assert_eq!(significant(value), text, "{value}");
        }
    }

    #[test]
    fn the_table_round_trips_and_bad_files_are_named() {
        let dir = tempfile::tempdir().unwrap();
        assert!(read_quality(dir.path()).unwrap().is_empty());
        let rows = vec![row(Better::Closer, Some(6.24), 4.4, Some(0.0)), row(Better::Higher, None, 27.7, None)];
        std::fs::write(dir.path().join(QUALITY_JSON_NAME), serde_json::to_vec(&rows).unwrap()).unwrap();
        let read = read_quality(dir.path()).unwrap();
        assert_eq!(read.iter().map(|f| f.row.clone()).collect::<Vec<_>>(), rows);
        assert_eq!(read[0].improved, Some(true));
        assert_eq!(read[0].better_text, "closer to the truth");
        assert_eq!([&read[0].input_text, &read[0].output_text, &read[0].truth_text], ["6.240", "4.400", "0"]);
        assert_eq!([&read[1].input_text, &read[1].truth_text], ["—", "—"]);
        std::fs::write(dir.path().join(QUALITY_JSON_NAME), b"{\"step\": 1}").unwrap();
        let e = read_quality(dir.path()).unwrap_err();
        assert!(e.contains(QUALITY_JSON_NAME) && e.contains("not a quality table"), "{e}");
    }
}
