//! The pipeline file (TOML): what the user writes, parsed but not yet checked
//! against a plate or the registry (that is [`crate::compile`]'s job).
//!
//! ```toml
//! name = "max-z"
//!
//! [[steps]]
//! name = "max_z"                       # unique; also the output folder name
//! func = "max_projection"              # (a) a function name
//! variable_components = ["z_index"]    # default ["site"]
//! group_by = "channel"                 # default "channel"; "none" for no grouping
//! input_source = "previous"            # or "pipeline_start"
//! enabled = true
//! materialize = ["tiff"]               # and/or "zarr"; default: kept in memory only
//! dtype = "input"                      # input | u8 | u16 | f32
//! stretch = false                      # float -> integer: stretch min..max instead of clipping
//! device = "cpu"                       # pin this step to the host in a --device gpu run
//! artifacts_from = { positions = "positions" }  # which earlier step's artifact to consume
//!                                      # (default: the latest earlier step producing it)
//! scope = "well"                       # or "plate": run once, before the wells, on a
//!                                      # sample of the whole plate (e.g. basic_fit)
//! sample = 200                         # plate scope: at most this many planes per group
//! seed = 0                             # plate scope: which planes are sampled
//!
//! # (b) func = { name = "mean_projection", args = { ... } }
//! # (c) func = ["max_projection", { name = "...", args = { ... } }]   a chain
//! # (d) [steps.func]  a map keyed by the group_by value (channel number or name)
//! #     1 = "max_projection"
//! #     GFP = ["mean_projection"]
//! #     missing_groups = "error" | "passthrough" | "skip"   (step key, default "error")
//! ```
//!
//! Unknown keys are errors (a typo such as `varaible_components` must not be
//! silently ignored).

use std::collections::BTreeMap;
use std::fmt;
use std::str::FromStr;

use hcsflow_core::ArgValue;
use serde::{Deserialize, Serialize};

use crate::PipelineError;

/// A whole pipeline file.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct PipelineSpec {
    /// A label for reports.
    #[serde(default)]
    pub name: String,
    #[serde(default)]
    pub description: String,
    /// Ordered steps.
    #[serde(default)]
    pub steps: Vec<StepSpec>,
}

/// One step as written.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct StepSpec {
    pub name: String,
    /// Kept as a TOML value: its four forms are resolved by [`FuncSpec::parse`]
    /// so that errors can name the step and say which form was meant.
    pub func: toml::Value,
    #[serde(default = "default_variable_components")]
    pub variable_components: Vec<String>,
    #[serde(default = "default_group_by")]
    pub group_by: String,
    #[serde(default)]
    pub input_source: InputSource,
    #[serde(default = "yes")]
    pub enabled: bool,
    #[serde(default)]
    pub missing_groups: MissingGroups,
    #[serde(default)]
    pub materialize: Vec<Materialize>,
    #[serde(default = "default_dtype")]
    pub dtype: String,
    #[serde(default)]
    pub stretch: bool,
    /// Artifact name → the earlier step whose artifact this step's functions
    /// consume. Without an entry, the latest earlier step producing it is used.
    #[serde(default, skip_serializing_if = "BTreeMap::is_empty")]
    pub artifacts_from: BTreeMap<String, String>,
    /// `"cpu"` runs this step on the host whatever the run's `--device`
    /// (for functions that have no GPU implementation).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub device: Option<String>,
    /// Where the step runs: in every well (default), or once on a sample of
    /// the whole plate, before the wells ([`Scope::Plate`]).
    #[serde(default, skip_serializing_if = "Scope::is_well")]
    pub scope: Scope,
    /// `scope = "plate"`: at most this many planes per group across the
    /// plate (default [`DEFAULT_SAMPLE`]).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub sample: Option<u64>,
    /// `scope = "plate"`: the seed choosing the sampled planes (default 0).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub seed: Option<u64>,
}

/// The planes a plate-wide step samples per group when `sample` is not
/// given: BaSiCPy fits a few hundred tiles at most, and a fit at the working
/// size holds `sample × working_size² × 4` bytes (200 × 128² × 4 = 13 MB).
pub const DEFAULT_SAMPLE: u64 = 200;

/// Where a step runs.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum Scope {
    /// In every well, on that well's stacks.
    #[default]
    Well,
    /// Once, before the wells, on a sample of the whole plate: its groups
    /// span every well (e.g. one BaSiC fit per channel); its results reach
    /// each well's consumers through a planes artifact, the one whose group
    /// matches theirs.
    Plate,
}

impl Scope {
    fn is_well(&self) -> bool {
        *self == Scope::Well
    }
}

fn default_variable_components() -> Vec<String> {
    vec!["site".into()]
}
fn default_group_by() -> String {
    "channel".into()
}
fn default_dtype() -> String {
    "input".into()
}
fn yes() -> bool {
    true
}

/// Where a step's images come from.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum InputSource {
    /// The previous enabled step's output (the plate for the first step).
    #[default]
    Previous,
    /// The plate's original images, re-read from disk.
    PipelineStart,
}

/// What happens to groups a `func` map has no entry for.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum MissingGroups {
    /// A compile error naming the groups (OpenHCS silently skips them).
    #[default]
    Error,
    /// The group's images go on unchanged.
    Passthrough,
    /// The group's images are dropped from this step's output.
    Skip,
}

/// Where a step's output is written, besides being passed on in memory.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum Materialize {
    /// One TIFF per plane under `OUT/<step>/`, mirroring the input naming.
    Tiff,
    /// OME-Zarr HCS plate `OUT/<plate>.ome.zarr`.
    Zarr,
}

/// An image component a step can vary over or group by.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum Component {
    Site,
    Channel,
    ZIndex,
    Timepoint,
}

impl Component {
    pub const ALL: [Component; 4] = [Component::Site, Component::Channel, Component::ZIndex, Component::Timepoint];

    /// Position in a [`crate::Key`].
    pub fn index(self) -> usize {
        self as usize
    }

    pub fn name(self) -> &'static str {
        match self {
            Component::Site => "site",
            Component::Channel => "channel",
            Component::ZIndex => "z_index",
            Component::Timepoint => "timepoint",
        }
    }
}

impl fmt::Display for Component {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.name())
    }
}

impl FromStr for Component {
    type Err = String;
    fn from_str(s: &str) -> Result<Self, Self::Err> {
        match s {
            "site" | "field" => Ok(Component::Site),
            "channel" => Ok(Component::Channel),
            "z_index" | "z" => Ok(Component::ZIndex),
            "timepoint" | "t" => Ok(Component::Timepoint),
            "well" => Err("'well' cannot be a variable component or group: wells are processed one at a time".into()),
            _ => Err(format!("unknown component '{s}': expected site, channel, z_index or timepoint")),
        }
    }
}

/// One function call as written: a name and its arguments.
#[derive(Debug, Clone, PartialEq)]
pub struct CallSpec {
    pub name: String,
    pub args: Vec<(String, ArgValue)>,
}

/// The four forms of `func`, after reading the TOML value.
#[derive(Debug, Clone, PartialEq)]
pub enum FuncSpec {
    /// A chain of one or more calls (forms a, b, c).
    Chain(Vec<CallSpec>),
    /// Form d: group value as written (e.g. "1" or "DAPI") → chain.
    Map(BTreeMap<String, Vec<CallSpec>>),
}

impl FuncSpec {
    /// Reads `func` of step `step`. Errors say which form was expected.
    pub fn parse(step: &str, value: &toml::Value) -> Result<FuncSpec, PipelineError> {
        let err = |message: String, fix: &str| PipelineError::step(step, message, fix);
        match value {
            toml::Value::Table(t) if !t.contains_key("name") => {
                if t.is_empty() {
                    return Err(err("func is an empty map".into(), "give at least one `group value = function` entry"));
                }
                let mut map = BTreeMap::new();
                for (key, v) in t {
                    let chain = parse_chain(step, v).map_err(|e| match e {
                        PipelineError::Step { step, message, fix } => {
                            PipelineError::Step { step, message: format!("func map entry '{key}': {message}"), fix }
                        }
                        other => other,
                    })?;
                    map.insert(key.clone(), chain);
                }
                Ok(FuncSpec::Map(map))
            }
            other => parse_chain(step, other).map(FuncSpec::Chain),
        }
    }
}

fn parse_chain(step: &str, value: &toml::Value) -> Result<Vec<CallSpec>, PipelineError> {
    match value {
        toml::Value::Array(items) => {
            if items.is_empty() {
                return Err(PipelineError::step(step, "func is an empty list", "list at least one function"));
            }
            items.iter().map(|v| parse_call(step, v)).collect()
        }
        other => Ok(vec![parse_call(step, other)?]),
    }
}

fn parse_call(step: &str, value: &toml::Value) -> Result<CallSpec, PipelineError> {
    const FORMS: &str = "write func = \"name\", func = { name = \"name\", args = { ... } }, \
                         a list of those (a chain), or a table keyed by the group_by value";
    match value {
        toml::Value::String(name) => Ok(CallSpec { name: name.clone(), args: Vec::new() }),
        toml::Value::Table(t) => {
            let name = match t.get("name") {
                Some(toml::Value::String(n)) => n.clone(),
                _ => return Err(PipelineError::step(step, "a function table needs `name = \"...\"`", FORMS)),
            };
            if let Some(extra) = t.keys().find(|k| *k != "name" && *k != "args") {
                return Err(PipelineError::step(
                    step,
                    format!("function '{name}': unknown key '{extra}'"),
                    "a function table has only `name` and `args`",
                ));
            }
            let mut args = Vec::new();
            match t.get("args") {
                None => {}
                Some(toml::Value::Table(a)) => {
                    for (k, v) in a {
                        args.push((k.clone(), arg_value(step, &name, k, v)?));
                    }
                }
                Some(_) => {
                    return Err(PipelineError::step(
                        step,
                        format!("function '{name}': `args` must be a table"),
                        "write args = { name = value, ... }",
                    ))
                }
            }
            Ok(CallSpec { name, args })
        }
        other => Err(PipelineError::step(step, format!("func cannot be {}", other.type_str()), FORMS)),
    }
}

fn arg_value(step: &str, function: &str, name: &str, v: &toml::Value) -> Result<ArgValue, PipelineError> {
    match v {
        toml::Value::Integer(i) => Ok(ArgValue::Int(*i)),
        toml::Value::Float(f) => Ok(ArgValue::Float(*f)),
        toml::Value::Boolean(b) => Ok(ArgValue::Bool(*b)),
        toml::Value::String(s) => Ok(ArgValue::Str(s.clone())),
        // Lists of numbers (e.g. composite weights); the function's spec validates them.
        toml::Value::Array(items) if items.iter().all(|v| v.is_integer() || v.is_float()) => {
            Ok(ArgValue::FloatList(items.iter().filter_map(|v| v.as_float().or_else(|| v.as_integer().map(|i| i as f64))).collect()))
        }
        other => Err(PipelineError::step(
            step,
            format!("{function}: argument '{name}' cannot be {}", other.type_str()),
            "arguments are integers, numbers, booleans, strings or lists of numbers (`hcsflow functions` lists them)",
        )),
    }
}

impl PipelineSpec {
    /// Parses a pipeline file's text; `origin` names it in errors.
    pub fn parse(text: &str, origin: &str) -> Result<PipelineSpec, PipelineError> {
        toml::from_str(text).map_err(|e| PipelineError::Parse { origin: origin.to_string(), message: e.to_string() })
    }

    /// Reads and parses a pipeline file.
    pub fn read(path: &std::path::Path) -> Result<PipelineSpec, PipelineError> {
        let text = std::fs::read_to_string(path).map_err(|e| PipelineError::io(path, e))?;
        Self::parse(&text, &path.display().to_string())
    }

    /// A stable digest of the pipeline (64-bit FNV-1a of its canonical JSON),
    /// recorded in the run manifest so `--resume` refuses a different pipeline.
    pub fn digest(&self) -> String {
        let json = serde_json::to_string(self).unwrap_or_default();
        let mut h: u64 = 0xcbf29ce484222325;
        for b in json.bytes() {
            h ^= u64::from(b);
            h = h.wrapping_mul(0x100000001b3);
        }
        format!("{h:016x}")
    }
}
