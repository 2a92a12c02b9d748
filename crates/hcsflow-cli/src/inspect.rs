//! `hcsflow inspect PLATE`: what a plate folder holds. Never writes into the plate.

use std::path::PathBuf;

use anyhow::Context;
use clap::Args;
use hcsflow_plate::Format;

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
}

pub fn run(a: InspectArgs) -> CliResult {
    let format = a.format.as_deref().map(str::parse::<Format>).transpose().map_err(|e| CliError::new(Exit::Usage, e))?;
    let plate = hcsflow_plate::open_plate(&a.plate, format).with_context(|| format!("opening plate {}", a.plate.display()))?;
    if a.json {
        println!("{}", serde_json::to_string_pretty(&plate).context("serialising the plate")?);
    } else {
        print!("{}", hcsflow_plate::summary_text(&plate));
    }
    Ok(())
}
