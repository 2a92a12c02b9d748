//! `hcsflow functions`.

use anyhow::Context;
use clap::Args;
use hcsflow::core::registry::ArgKind;

use crate::CliResult;

#[derive(Args)]
pub struct FunctionsArgs {
    /// Print JSON instead of text.
    #[arg(long)]
    json: bool,
}

pub fn run(a: FunctionsArgs) -> CliResult {
    let listing = hcsflow::Engine::builtin().catalogue();
    if a.json {
        outln!("{}", serde_json::to_string_pretty(&listing).context("serialising the function list")?)?;
        return Ok(());
    }
    for f in &listing {
        let mems: Vec<_> = f.memory_types.iter().map(|m| m.name()).collect();
        outln!("{}  [{}; {}]", f.name, f.contract, mems.join(", "))?;
        outln!("    {}", f.doc)?;
        for arg in &f.args {
            let range = match &arg.kind {
                ArgKind::Int { min, max } => range(min.map(|v| v.to_string()), max.map(|v| v.to_string())),
                ArgKind::Float { min, max } => range(min.map(|v| v.to_string()), max.map(|v| v.to_string())),
                ArgKind::Bool => "bool".into(),
                ArgKind::Choice { choices } => choices.join("|"),
                ArgKind::Text => "text".into(),
                ArgKind::FloatList { min, max, .. } => format!("list of {}", range(min.map(|v| v.to_string()), max.map(|v| v.to_string()))),
            };
            outln!("    --arg {}={}  ({range})  {}", arg.name, arg.default, arg.doc)?;
        }
        for a in &f.artifacts.produces {
            outln!("    produces '{}': {}", a.name, a.doc)?;
        }
        for a in &f.artifacts.consumes {
            outln!("    consumes '{}'{}: {}", a.name, if a.optional { " (optional)" } else { "" }, a.doc)?;
        }
    }
    Ok(())
}

fn range(min: Option<String>, max: Option<String>) -> String {
    format!("{}..{}", min.unwrap_or_default(), max.unwrap_or_default())
}
