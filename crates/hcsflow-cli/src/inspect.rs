//! `hcsflow inspect PLATE`: what a plate folder holds. Never writes into the plate.
//!
//! With `--verify`, also reads every image's TIFF header (in parallel, no
//! pixels) and lists each file that would fail or mislead a run; the exit
//! code is then 1 when anything was found, 0 when the plate is clean. Planes
//! whose file is a copy of another plane's (MetaXpress fills planes it did
//! not acquire that way) are listed too, without changing the exit code.

use std::fmt::Write as _;
use std::path::PathBuf;

use anyhow::Context;
use clap::Args;
use hcsflow::plate::{Format, VerifyReport};

use crate::{CliError, CliResult, Exit};

#[derive(Args)]
pub struct InspectArgs {
    /// The plate folder (ImageXpress: holds the .HTD; Opera Phenix: holds Index*.xml or Images/).
    plate: PathBuf,
    /// Override auto-detection: imagexpress | opera-phenix.
    #[arg(long)]
    format: Option<String>,
    /// Print JSON instead of text.
    #[arg(long)]
    json: bool,
    /// Read the header of every image (no pixels) and report zero-byte,
    /// truncated, non-TIFF and multi-page files and planes whose size or
    /// dtype differs from the plate's. Exit code 1 if anything is found.
    #[arg(long)]
    verify: bool,
}

pub fn run(a: InspectArgs) -> CliResult {
    let format = a.format.as_deref().map(str::parse::<Format>).transpose().map_err(|e| CliError::new(Exit::Usage, e))?;
    let plate = hcsflow::plate::open_plate(&a.plate, format).with_context(|| format!("opening plate {}", a.plate.display()))?;
    let report = a.verify.then(|| hcsflow::plate::verify(&plate));
    let text = if a.json {
        let mut v = serde_json::to_value(&plate).context("serialising the plate")?;
        if let (Some(r), Some(obj)) = (&report, v.as_object_mut()) {
            obj.insert("verify".into(), serde_json::to_value(r).context("serialising the verification")?);
        }
        serde_json::to_string_pretty(&v).context("serialising the plate")? + "\n"
    } else {
        let mut s = hcsflow::plate::summary_text(&plate);
        if let Some(r) = &report {
            s.push_str(&verify_text(r));
        }
        s
    };
    // A reader that went away (`| head`) ends the command quietly (console.rs).
    out!("{text}")?;
    match report {
        Some(r) if !r.is_clean() => Err(CliError::new(
            Exit::Failure,
            anyhow::anyhow!(
                "verify: {} problem(s) in {} image file(s) checked{}{}",
                r.problems.len(),
                r.checked,
                if r.plate_problems.is_empty() { String::new() } else { format!(", {} plate-wide", r.plate_problems.len()) },
                if r.missing == 0 { String::new() } else { format!(", {} missing image(s)", r.missing) }
            ),
        )),
        _ => Ok(()),
    }
}

/// The `--verify` section of the text summary: every problem, one line
/// each, then every duplicated plane (not a problem: it does not change the exit code).
fn verify_text(r: &VerifyReport) -> String {
    let mut s = String::new();
    let plane = match r.plane {
        Some(p) => format!("plane {p} ({} of {} images)", r.plane_count, r.checked),
        None => "no readable image".to_string(),
    };
    let _ = writeln!(s, "Verify:      {} image file(s) checked, {plane}", r.checked);
    let _ = writeln!(s, "Problems:    {}", r.problems.len() + r.plate_problems.len());
    if r.missing > 0 {
        let _ = writeln!(s, "  {} image(s) the plate declares are missing (listed above under Missing)", r.missing);
    }
    for p in &r.problems {
        let _ = writeln!(s, "  {}", p.message);
    }
    for p in &r.plate_problems {
        let _ = writeln!(s, "  {p}");
    }
    if !r.duplicates.is_empty() {
        let _ = writeln!(
            s,
            "Duplicates:  {} image(s) with the same bytes as another plane of their well, site and channel \
             (MetaXpress writes such copies for planes it did not acquire; not measurements of their plane)",
            r.duplicates.len()
        );
        for d in &r.duplicates {
            let _ = writeln!(s, "  {}", d.message);
        }
    }
    s
}
