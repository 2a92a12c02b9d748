//! `hcsflow report OUT`: (re)writes the QC report of a finished run from what
//! it wrote (`OUT/report.html`, `OUT/hcsflow_mqc.json`); `hcsflow run` writes
//! it at the end of every run.

use std::path::PathBuf;

use clap::Args;

use crate::{CliError, CliResult, Exit};

#[derive(Args)]
pub struct ReportArgs {
    /// The output folder of a run (it holds run_manifest.json).
    out: PathBuf,
}

pub fn run(a: ReportArgs) -> CliResult {
    let written = hcsflow::report::write_report(&a.out).map_err(|e| {
        let exit = if matches!(e, hcsflow::report::ReportError::NotARun(_)) { Exit::Usage } else { Exit::Failure };
        CliError::new(exit, anyhow::Error::new(e))
    })?;
    for problem in &written.problems {
        errln!("not shown: {problem}");
    }
    outln!("{}", written.html.display())?;
    outln!("{}", written.multiqc.display())?;
    Ok(())
}
