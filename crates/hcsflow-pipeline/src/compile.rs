//! Compile: (plate, pipeline, config) → a frozen [`Plan`], before any pixel is read.
//!
//! The plan fixes, for every step, the function chain (implementation,
//! memory types, device, conversion routes into each call and back to the
//! host) and, for every well × step, which planes form which stack, in which
//! order, what each stack's output planes are called and where they are
//! written. Execution only follows it.
//!
//! Components of a plane are a [`Key`] `[site, channel, z_index, timepoint]`.
//! A function that reduces N → 1 (contract `volumetric_to_slice`) collapses
//! the step's variable components: they become [`COLLAPSED`] (0; real
//! components are 1-based), so a max-Z projection of z planes 1..3 of
//! (site 2, channel 1) is the plane `[2, 1, 0, 1]`.

use std::collections::{BTreeMap, BTreeSet};
use std::path::{Path, PathBuf};

use hcsflow_core::{
    assign_adapters, blamed, AdapterLoad, ArgError, AssignError, CallPlan, Contract, ConversionPolicy, Conversions, DType, DTypeConversion,
    DTypePolicy, Device, MemoryType, OutputDType, PlanError, Registry, Route, Spread, StackShape,
};
use hcsflow_plate::naming::z_reduced_rel;
use hcsflow_plate::{ImageError, PlaneAt, Plate};
use serde::{Deserialize, Serialize};

use crate::output::manifest::MANIFEST_NAME;
use crate::output::tables::{ARTIFACTS_NAME, SUMMARY_NAME};
use crate::output::{REPORT_HTML_NAME, REPORT_MQC_NAME, RUN_REPORT_NAME};
use crate::scope::{covered_text, plan_plate_step, plate_covers, plate_scope_text, PlateSampling, PlateStepPlan};
use crate::spec::{CallSpec, Component, FuncSpec, InputSource, Materialize, MissingGroups, PipelineSpec, Scope, StepSpec, DEFAULT_SAMPLE};
use crate::PipelineError;

/// Components of one plane: `[site, channel, z_index, timepoint]`, indexed by
/// [`Component::index`]. [`COLLAPSED`] marks a component a reduction removed.
pub type Key = [u32; 4];

/// The value of a component collapsed by an N → 1 function.
pub const COLLAPSED: u32 = 0;

/// In a [`GroupPlan::scope`]: a component that varies within the stack.
pub const VARIABLE: u32 = u32::MAX;

/// What one component of a [`Key`] means: a value, or one of the two marks
/// ([`COLLAPSED`], [`VARIABLE`]) a key's plain numbers encode. Whoever reads a
/// key's components reads them through this, never by comparing numbers.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Slot {
    /// A component's value (1-based).
    Value(u32),
    /// Removed by an N → 1 function ([`COLLAPSED`]).
    Collapsed,
    /// Varies within the stack, in a [`GroupPlan::scope`] ([`VARIABLE`]).
    Variable,
}

impl Slot {
    /// The meaning of the component `raw` of a [`Key`].
    pub fn of(raw: u32) -> Slot {
        match raw {
            COLLAPSED => Slot::Collapsed,
            VARIABLE => Slot::Variable,
            v => Slot::Value(v),
        }
    }

    /// The value, if this is one.
    pub fn value(self) -> Option<u32> {
        match self {
            Slot::Value(v) => Some(v),
            Slot::Collapsed | Slot::Variable => None,
        }
    }
}

/// What compile needs besides the plate and the pipeline.
#[derive(Debug, Clone)]
pub struct CompileConfig {
    /// The device chosen (the CLI resolves `--device` with `select_device`).
    pub device: Device,
    /// Why that device, for the plan and the report.
    pub device_reason: String,
    pub policy: ConversionPolicy,
    /// The output folder. Must not be inside the plate.
    pub out: PathBuf,
    /// What to do with images the plate declares but does not have.
    pub missing: MissingPolicy,
    /// Refuse the plan if any call would run on the host (`--require-gpu`):
    /// a run on the CPU, a step pinned with `device = "cpu"`, or a GPU call
    /// that does part of its work on the host ([`PlannedHostWork`]). The
    /// error ([`PipelineError::HostCalls`]) names every such step and function.
    pub require_gpu: bool,
}

/// What a run does with an image the plate declares but does not have
/// (an [`InputPlane`] whose `path` is `None`: a deleted file, an empty URL
/// in an index, a directory named like the image…).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum MissingPolicy {
    /// Compile refuses the run ([`PipelineError::Config`], a usage error),
    /// listing the missing images: nothing is read or written. The default,
    /// because a plane of zeros silently changes results (a min projection
    /// becomes 0, a mean is biased).
    #[default]
    Error,
    /// The wells with a missing image are not run: each is recorded failed,
    /// its reason naming the images, so `--resume` runs it once they are back.
    SkipWell,
    /// A missing image is a plane of zeros in memory (never on disk); every
    /// filled plane is reported (summary, report, manifest, well notes).
    Fill,
}

impl MissingPolicy {
    /// The name on the command line (`--missing NAME`).
    pub fn name(self) -> &'static str {
        match self {
            MissingPolicy::Error => "error",
            MissingPolicy::SkipWell => "skip-well",
            MissingPolicy::Fill => "fill",
        }
    }
}

impl std::fmt::Display for MissingPolicy {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(self.name())
    }
}

impl std::str::FromStr for MissingPolicy {
    type Err = String;
    fn from_str(s: &str) -> Result<Self, String> {
        [MissingPolicy::Error, MissingPolicy::SkipWell, MissingPolicy::Fill]
            .into_iter()
            .find(|p| p.name() == s)
            .ok_or_else(|| format!("unknown missing-image policy '{s}': expected error, skip-well or fill"))
    }
}

/// An image the plate declares but does not have.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct MissingPlane {
    pub well: String,
    /// `[site, channel, z_index, timepoint]`.
    pub key: Key,
    /// Where the file was expected, when the plate metadata names it.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub expected: Option<PathBuf>,
    /// Why it is missing, as the plate reader says (e.g. "no image file found").
    pub reason: String,
}

impl std::fmt::Display for MissingPlane {
    /// `well A01 site 1, channel 1, z 2, t 1: /plate/x.tif (file not found)`.
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let [s, c, z, t] = self.key;
        write!(f, "well {} site {s}, channel {c}, z {z}, t {t}: ", self.well)?;
        match &self.expected {
            Some(p) => write!(f, "{} ({})", p.display(), self.reason),
            None => f.write_str(&self.reason),
        }
    }
}

/// One function chain of a step, fully resolved.
#[derive(Debug, Clone)]
pub struct ChainPlan {
    /// For map entries: the key as written and the group value it means.
    pub label: Option<String>,
    pub group_value: Option<u32>,
    pub calls: Vec<CallPlan>,
    /// The last call's output memory type → host (outputs are written and passed on from the host).
    pub route_out: Route,
    /// True if some call reduces N → 1.
    pub reduces: bool,
    /// Per call: whether an earlier call of the chain reduced the stack (the
    /// call then sees one collapsed plane rather than the group's inputs).
    pub reduced_before: Vec<bool>,
    /// Per call: the work it does on the host, and the route that brings its
    /// input there, because no earlier step produces the artifact that would
    /// spare it ([`hcsflow_core::HostWork`]); `None` for calls that do none.
    pub host_work: Vec<Option<PlannedHostWork>>,
}

/// A call's declared [`HostWork`](hcsflow_core::HostWork) that this pipeline
/// makes happen, with its route to the host planned like any other.
#[derive(Debug, Clone)]
pub struct PlannedHostWork {
    /// The artifact no earlier step produces.
    pub without: &'static str,
    /// What the call does on the host.
    pub work: &'static str,
    /// Its input memory type → host.
    pub route: Route,
}

impl ChainPlan {
    /// The artifacts this chain's calls produce.
    pub fn produces(&self) -> impl Iterator<Item = &'static str> + '_ {
        self.calls.iter().flat_map(|c| c.artifacts.produces.iter().map(|d| d.name))
    }
}

/// An artifact a step consumes and the step it comes from.
#[derive(Debug, Clone, PartialEq)]
pub struct ArtifactInput {
    pub name: String,
    /// Index into [`Plan::steps`]; `None` when the artifact is optional and
    /// no earlier step produces it (the function works without it).
    pub from_step: Option<usize>,
}

/// One enabled step.
#[derive(Debug, Clone)]
pub struct StepPlan {
    pub name: String,
    pub variable: Vec<Component>,
    pub group_by: Option<Component>,
    pub input_source: InputSource,
    pub missing_groups: MissingGroups,
    pub chains: Vec<ChainPlan>,
    pub materialize: BTreeSet<Materialize>,
    pub dtype: DTypePolicy,
    /// `OUT/<step name>` for TIFF output.
    pub out_dir: PathBuf,
    /// Artifacts the step's functions produce (written as CSV under `out_dir`).
    pub produces: Vec<String>,
    /// Artifacts the step's functions consume, wired to their producer step.
    pub consumes: Vec<ArtifactInput>,
    /// `Some` for a plate-wide step (`scope = "plate"`): it runs once, before
    /// the wells, on a sample of the plate ([`Plan::plate_steps`]), and has no
    /// stacks in the wells.
    pub plate: Option<PlateSampling>,
}

impl StepPlan {
    /// True when a call of one of its chains is declared
    /// [`one stack at a time`](hcsflow_core::FunctionDecl::with_one_stack_at_a_time):
    /// the executor then runs the step's stacks of a well one after another.
    pub fn runs_one_stack_at_a_time(&self) -> bool {
        self.chains.iter().flat_map(|c| &c.calls).any(|call| call.one_stack_at_a_time)
    }
}

/// One plane of the plate a well reads.
#[derive(Debug, Clone, PartialEq)]
pub struct InputPlane {
    pub key: Key,
    /// `None`: the plate declares this image but it is missing; what happens
    /// is [`Plan::missing_policy`] (under [`MissingPolicy::Fill`] it is filled
    /// with zeros in memory, never on disk, when a step needs it).
    pub path: Option<PathBuf>,
    /// Where the plane is in `path` when that holds several (an OME-Zarr
    /// array); `None` for a one-plane file.
    pub at: Option<PlaneAt>,
    /// The name outputs mirror ([`ImageRecord::rel`](hcsflow_plate::ImageRecord::rel)).
    pub rel: PathBuf,
}

/// What a stack goes through.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Action {
    /// `StepPlan::chains[i]`.
    Chain(usize),
    /// Missing from the func map under `missing_groups = "passthrough"`.
    Passthrough,
    /// Missing from the func map under `missing_groups = "skip"`.
    Skip,
}

/// An output plane: its components and its name relative to the step folder.
#[derive(Debug, Clone, PartialEq)]
pub struct OutPlane {
    pub key: Key,
    pub rel: PathBuf,
}

/// One stack of one step in one well.
#[derive(Debug, Clone)]
pub struct GroupPlan {
    /// The group's fixed components; [`VARIABLE`] for the step's variable ones.
    pub scope: Key,
    /// Input planes in stack order (numeric order of the variable components).
    pub inputs: Vec<Key>,
    pub action: Action,
    /// Output planes in stack order (empty for [`Action::Skip`]).
    pub outputs: Vec<OutPlane>,
    /// Per [`StepPlan::consumes`] entry: the producing group, as an index into
    /// the producer step's [`WellStepPlan::groups`] of the same well, or, when
    /// the producer is a plate-wide step, into its [`PlateStepPlan::groups`].
    pub sources: Vec<Option<usize>>,
}

/// The stacks of one step in one well.
#[derive(Debug, Clone)]
pub struct WellStepPlan {
    /// Index into [`Plan::steps`].
    pub step: usize,
    pub groups: Vec<GroupPlan>,
}

/// Everything one well does.
#[derive(Debug, Clone)]
pub struct WellPlan {
    pub well: String,
    pub inputs: Vec<InputPlane>,
    pub steps: Vec<WellStepPlan>,
    /// Bytes of the well's input planes.
    pub input_bytes: u64,
    /// Estimated peak bytes while the well runs (input planes, one stack
    /// copy, the outputs): what `--max-memory` budgets.
    pub estimate_bytes: u64,
    /// The GPU adapter (`gpu:N` index) the well's GPU calls run on: the one
    /// the calls are planned on, or the well's share of several
    /// ([`Plan::spread_over_gpus`]). `None` when no call of the plan runs on
    /// a GPU.
    pub gpu: Option<usize>,
}

/// The frozen plan of a run.
#[derive(Debug, Clone)]
pub struct Plan {
    pub pipeline_name: String,
    pub digest: String,
    pub plate_root: PathBuf,
    pub plate_name: String,
    pub plate_format: hcsflow_plate::Format,
    /// Plate rows and columns (96-well: 8 × 12).
    pub plate_size: (u32, u32),
    pub out: PathBuf,
    pub device: Device,
    pub device_reason: String,
    pub steps: Vec<StepPlan>,
    /// The plate-wide steps (`scope = "plate"`), in pipeline order: each runs
    /// once, before any well.
    pub plate_steps: Vec<PlateStepPlan>,
    /// Names of disabled steps (listed by the dry run, not run).
    pub disabled: Vec<String>,
    pub wells: Vec<WellPlan>,
    /// Plane height, width and dtype of the plate.
    pub plane: (usize, usize, DType),
    pub pixel_size_um: Option<f64>,
    /// Images the plate declares but does not have, in well order; what a run
    /// does with them is `missing_policy` (never [`MissingPolicy::Error`]
    /// when this is not empty: compile refuses such a run).
    pub missing: Vec<MissingPlane>,
    pub missing_policy: MissingPolicy,
    /// Channel number → name, from the plate metadata (OME-Zarr channel labels).
    pub channel_names: BTreeMap<u32, String>,
    /// Stage positions by (well, site), µm, injected into functions' call context.
    pub stage_positions: BTreeMap<(String, u32), (f64, f64)>,
    /// Grid cell (row, column, 0-based) by site.
    pub site_cells: BTreeMap<u32, (u32, u32)>,
    /// Site grid rows and columns.
    pub site_grid: (u32, u32),
}

impl Plan {
    /// Spreads the wells that run on a GPU over the adapters `gpus`
    /// (`--device gpu:0,1`), round-robin in plan order
    /// ([`hcsflow_core::assign_adapters`]): the wells workers start one after
    /// the other land on different adapters. Each such well's GPU calls then
    /// run on its adapter ([`WellPlan::gpu`]); wells without GPU calls are
    /// left alone. The plan text and the run report name each well's adapter.
    pub fn spread_over_gpus(&mut self, gpus: &[usize]) -> Result<(), AssignError> {
        let adapters: Vec<AdapterLoad> = gpus.iter().map(|&index| AdapterLoad { index, free_bytes: None }).collect();
        let on_gpu: Vec<&mut WellPlan> = self.wells.iter_mut().filter(|w| w.gpu.is_some()).collect();
        let bytes: Vec<u64> = on_gpu.iter().map(|w| w.estimate_bytes).collect();
        let assigned = assign_adapters(&adapters, &bytes, Spread::RoundRobin)?;
        for (w, gpu) in on_gpu.into_iter().zip(assigned) {
            w.gpu = Some(gpu);
        }
        Ok(())
    }
}

/// OUT must be a folder or not exist yet, and then its nearest existing
/// ancestor must be a folder (it is created): otherwise a configuration error
/// naming what is in the way (not "File exists (os error 17)" at run time).
fn check_out_is_a_folder(out: &Path) -> Result<(), PipelineError> {
    let config = |message: String, fix: &str| PipelineError::Config { message, fix: fix.into() };
    for p in out.ancestors().filter(|p| !p.as_os_str().is_empty()) {
        match std::fs::metadata(p) {
            Ok(m) if m.is_dir() => return Ok(()),
            Ok(_) if p == out => {
                return Err(config(
                    format!("output folder {} exists and is not a folder", out.display()),
                    "choose a folder (created if missing)",
                ))
            }
            Ok(_) => {
                return Err(config(
                    format!("output folder {}: {} is not a folder", out.display(), p.display()),
                    "choose another output folder",
                ))
            }
            // Missing, or below a file (then the loop reaches the file).
            Err(e) if matches!(e.kind(), std::io::ErrorKind::NotFound | std::io::ErrorKind::NotADirectory) => {}
            Err(e) => return Err(config(format!("output folder {}: {}: {e}", out.display(), p.display()), "choose another output folder")),
        }
    }
    Ok(())
}

/// A plane as compile tracks it through the steps.
#[derive(Debug, Clone)]
struct Flow {
    key: Key,
    rel: PathBuf,
}

/// Compiles `spec` for `plate`. Collects every problem it can find and
/// returns them together ([`PipelineError::Invalid`]) rather than one at a time.
pub fn compile(
    plate: &Plate,
    spec: &PipelineSpec,
    registry: &Registry,
    conversions: &Conversions,
    config: &CompileConfig,
) -> Result<Plan, PipelineError> {
    check_out_dir(plate, spec, &config.out)?;
    let mut errors = Vec::new();
    let mut names = BTreeSet::new();
    let mut steps = Vec::new();
    let mut disabled = Vec::new();
    // Per enabled step: the resolved func, for grouping below.
    let mut funcs: Vec<ResolvedFunc> = Vec::new();
    let mut well_step_before = false;
    for step in &spec.steps {
        if !names.insert(step.name.clone()) {
            errors.push(PipelineError::step(
                &step.name,
                "two steps have this name",
                "give every step a unique name (it names its output folder)",
            ));
        }
        if !step.enabled {
            disabled.push(step.name.clone());
            continue;
        }
        match compile_step(step, plate, registry, conversions, config).and_then(|(plan, func)| {
            check_plate_step(step, &plan, well_step_before)?;
            Ok((plan, func))
        }) {
            Ok((plan, func)) => {
                well_step_before |= plan.plate.is_none();
                steps.push(plan);
                funcs.push(func);
            }
            Err(e) => errors.push(e),
        }
    }
    wire_artifacts(spec, registry, &mut steps, &mut errors);
    if config.require_gpu && errors.is_empty() {
        if let Err(e) = check_require_gpu(&steps, config) {
            errors.push(e);
        }
    }
    if spec.steps.iter().all(|s| !s.enabled) {
        errors.push(PipelineError::Config {
            message: "the pipeline has no enabled step".into(),
            fix: "add a [[steps]] table (see examples/*.toml) or set enabled = true".into(),
        });
    }
    if !errors.is_empty() {
        return Err(flatten(errors));
    }
    let plane = plane_format(plate)?;
    let plane_bytes = (plane.0 * plane.1 * plane.2.size_bytes()) as u64;

    // Per well: the starting planes; the plate-wide steps' samples of them;
    // then each well's stacks, simulated on keys.
    let mut found = GroupsFound::new(steps.len());
    let mut missing = Vec::new();
    let well_planes: Vec<(String, Vec<InputPlane>)> = plate
        .wells()
        .into_iter()
        .map(|well| {
            let inputs = well_inputs(plate, &well);
            missing.extend(missing_planes(plate, &well, &inputs));
            (well, inputs)
        })
        .collect();
    let mut plate_steps = Vec::new();
    for (si, (step, func)) in steps.iter().zip(&funcs).enumerate() {
        let Some(sampling) = step.plate else { continue };
        match plan_plate_step(si, step, func, sampling, plate, &well_planes, (plane.0, plane.1), registry, &spec.digest(), &mut found) {
            Ok(ps) => plate_steps.push(ps),
            Err(e) => errors.push(e),
        }
    }
    if !errors.is_empty() {
        return Err(flatten(errors));
    }
    let context = WellContext { plate, steps: &steps, funcs: &funcs, plate_steps: &plate_steps, plane_bytes };
    let mut wells: Vec<WellPlan> = well_planes.into_iter().map(|(well, inputs)| plan_well(well, inputs, &context, &mut found)).collect();
    let planned_gpu = steps.iter().flat_map(|s| &s.chains).flat_map(|c| &c.calls).find_map(|c| match c.device {
        Device::Gpu(n) => Some(n),
        Device::Cpu => None,
    });
    for w in &mut wells {
        w.gpu = planned_gpu;
    }
    errors.extend(found.wiring_errors.into_values());
    check_group_maps(plate, &steps, &found.seen, &found.unmapped, &mut errors);
    if !errors.is_empty() {
        return Err(flatten(errors));
    }
    if config.missing == MissingPolicy::Error && !missing.is_empty() {
        return Err(missing_error(&missing));
    }
    let plan = Plan {
        pipeline_name: spec.name.clone(),
        digest: spec.digest(),
        plate_root: plate.root.clone(),
        plate_name: plate.metadata.name.clone(),
        plate_format: plate.format,
        plate_size: (plate.metadata.plate_rows, plate.metadata.plate_columns),
        out: config.out.clone(),
        device: config.device,
        device_reason: config.device_reason.clone(),
        steps,
        plate_steps,
        disabled,
        wells,
        plane,
        pixel_size_um: plate.metadata.pixel_size_um,
        missing,
        missing_policy: config.missing,
        channel_names: plate.metadata.channel_names.clone(),
        stage_positions: plate.metadata.stage_positions.iter().map(|p| ((p.well.clone(), p.site), (p.x_um, p.y_um))).collect(),
        site_cells: plate.metadata.site_cells.iter().map(|c| (c.site, (c.row, c.col))).collect(),
        site_grid: (plate.metadata.grid_rows, plate.metadata.grid_cols),
    };
    check_call_shapes(&plan, registry)?;
    Ok(plan)
}

/// What compile learns about the steps' stacks across the plate's wells, for
/// the checks that need all of them.
pub(crate) struct GroupsFound {
    /// Per step: the group values seen across the plate.
    pub(crate) seen: Vec<BTreeSet<u32>>,
    /// Per step: the group values lacking a func map entry.
    pub(crate) unmapped: Vec<BTreeSet<u32>>,
    /// Per (step, consumed artifact): the first wiring problem found.
    wiring_errors: BTreeMap<(usize, String), PipelineError>,
}

/// What [`plan_well`] plans a well against.
struct WellContext<'a> {
    plate: &'a Plate,
    steps: &'a [StepPlan],
    funcs: &'a [ResolvedFunc],
    plate_steps: &'a [PlateStepPlan],
    plane_bytes: u64,
}

impl GroupsFound {
    fn new(steps: usize) -> GroupsFound {
        GroupsFound { seen: vec![BTreeSet::new(); steps], unmapped: vec![BTreeSet::new(); steps], wiring_errors: BTreeMap::new() }
    }
}

/// The plan of one well: starting from its `inputs`, each step's stacks,
/// simulated on keys (grouping, the chain or map entry of each stack, its
/// output planes, the producer stack of each artifact it consumes).
fn plan_well(well: String, inputs: Vec<InputPlane>, context: &WellContext<'_>, found: &mut GroupsFound) -> WellPlan {
    let (steps, plane_bytes) = (context.steps, context.plane_bytes);
    let start: Vec<Flow> = inputs.iter().map(|i| Flow { key: i.key, rel: i.rel.clone() }).collect();
    let mut current = start.clone();
    let mut well_steps: Vec<WellStepPlan> = Vec::new();
    let mut peak_planes = start.len();
    for (si, (step, func)) in steps.iter().zip(context.funcs).enumerate() {
        if step.plate.is_some() {
            // Runs before the wells, on the plate; the wells' flow passes it by.
            continue;
        }
        let input = match step.input_source {
            InputSource::PipelineStart => start.clone(),
            InputSource::Previous => current,
        };
        let mut groups: Vec<GroupPlan> = Vec::new();
        let mut output = Vec::new();
        for members in group(&input, &step.variable) {
            let mut scope = members[0].key;
            for c in &step.variable {
                scope[c.index()] = VARIABLE;
            }
            let value = step.group_by.map(|c| members[0].key[c.index()]);
            if let Some(v) = value {
                found.seen[si].insert(v);
            }
            let action = choose_action(step, func, value, &mut found.unmapped[si]);
            let outputs: Vec<Flow> = match action {
                Action::Skip => Vec::new(),
                Action::Passthrough => members.clone(),
                Action::Chain(ci) if step.chains[ci].reduces => {
                    let mut key = members[0].key;
                    for c in &step.variable {
                        key[c.index()] = COLLAPSED;
                    }
                    vec![Flow { key, rel: collapse_rel(&members[0].rel, &step.variable) }]
                }
                Action::Chain(_) => members.clone(),
            };
            let consumer = Consumer { step_index: si, step, action, scope, well: &well };
            let sources = step
                .consumes
                .iter()
                .map(|input| match input.from_step.and_then(|from| context.plate_steps.iter().find(|p| p.step == from)) {
                    Some(producer) => resolve_plate_source(&consumer, input, context, producer, found),
                    None => resolve_artifact_source(&consumer, input, steps, &well_steps, found),
                })
                .collect();
            groups.push(GroupPlan {
                scope,
                sources,
                inputs: members.iter().map(|m| m.key).collect(),
                action,
                outputs: outputs.iter().map(|f| OutPlane { key: f.key, rel: f.rel.clone() }).collect(),
            });
            output.extend(outputs);
        }
        output.sort_by_key(|f| f.key);
        peak_planes = peak_planes.max(input.len() + output.len());
        well_steps.push(WellStepPlan { step: si, groups });
        current = output;
    }
    let input_bytes = inputs.len() as u64 * plane_bytes;
    let largest_stack = well_steps.iter().flat_map(|s| s.groups.iter().map(|g| g.inputs.len())).max().unwrap_or(0) as u64;
    WellPlan {
        well,
        inputs,
        steps: well_steps,
        input_bytes,
        // Planes held (a step's input and output) + one stack and its result in flight per group.
        estimate_bytes: (peak_planes as u64 + 2 * largest_stack) * plane_bytes,
        gpu: None,
    }
}

/// What a stack of `step` with group value `value` goes through; a value
/// without a func map entry is added to `unmapped`.
pub(crate) fn choose_action(step: &StepPlan, func: &ResolvedFunc, value: Option<u32>, unmapped: &mut BTreeSet<u32>) -> Action {
    match (func, value) {
        (ResolvedFunc::Single, _) => Action::Chain(0),
        (ResolvedFunc::Map(map), Some(v)) => match map.get(&v) {
            Some(&ci) => Action::Chain(ci),
            None => {
                unmapped.insert(v);
                match step.missing_groups {
                    MissingGroups::Skip => Action::Skip,
                    MissingGroups::Passthrough | MissingGroups::Error => Action::Passthrough,
                }
            }
        },
        (ResolvedFunc::Map(_), None) => Action::Chain(0), // refused in compile_step
    }
}

/// A stack that may consume artifacts, as [`resolve_artifact_source`] sees it.
struct Consumer<'a> {
    step_index: usize,
    step: &'a StepPlan,
    action: Action,
    scope: Key,
    well: &'a str,
}

/// The stack of the producer step (an index into its groups in this well,
/// `well_steps`) whose `input` artifact the `consumer` stack gets: the one
/// stack producing it whose scope covers the consumer's. `None` when the
/// artifact is optional and unproduced, when this stack's chain does not
/// consume it (another map entry does), or when no stack or several stacks
/// qualify (then a wiring error is recorded in `found`).
fn resolve_artifact_source(
    consumer: &Consumer<'_>,
    input: &ArtifactInput,
    steps: &[StepPlan],
    well_steps: &[WellStepPlan],
    found: &mut GroupsFound,
) -> Option<usize> {
    let from = input.from_step?;
    let producer = &steps[from];
    let produces = |g: &GroupPlan| match g.action {
        Action::Chain(ci) => producer.chains[ci].produces().any(|p| p == input.name),
        _ => false,
    };
    let candidates: Vec<usize> = well_steps
        .iter()
        .find(|ws| ws.step == from)
        .map(|ws| {
            ws.groups.iter().enumerate().filter(|(_, g)| produces(g) && scopes_match(&g.scope, &consumer.scope)).map(|(i, _)| i).collect()
        })
        .unwrap_or_default();
    // When this stack's chain consumes it, even optionally, a producer step exists and must cover it.
    let consumed = matches!(consumer.action, Action::Chain(ci)
        if consumer.step.chains[ci].calls.iter().any(|c| c.artifacts.consumes.iter().any(|d| d.name == input.name)));
    let (step, well, scope) = (consumer.step, consumer.well, scope_text(&consumer.scope));
    let error = match candidates.as_slice() {
        [one] => return Some(*one),
        _ if !consumed => return None,
        [] => PipelineError::step(
            &step.name,
            format!("no '{}' artifact of step '{}' covers the stack at {scope} of well {well}", input.name, producer.name),
            format!(
                "step '{}' must run on stacks that contain this one's (same or collapsed components, same variable components {})",
                producer.name,
                producer.variable.iter().map(|c| c.to_string()).collect::<Vec<_>>().join(", ")
            ),
        ),
        _ => PipelineError::step(
            &step.name,
            format!(
                "{} stacks of step '{}' could provide '{}' for the stack at {scope} of well {well}",
                candidates.len(),
                producer.name,
                input.name
            ),
            "make the producer step's stacks cover this step's (e.g. the same group_by)",
        ),
    };
    found.wiring_errors.entry((consumer.step_index, input.name.clone())).or_insert(error);
    None
}

/// The plate-wide group (an index into `producer`'s groups) whose result the
/// `consumer` stack gets as its `input` planes artifact: the one group that
/// [covers](plate_covers) the stack (same channel). None or several is a
/// wiring error naming the channel and what the producer covers.
fn resolve_plate_source(
    consumer: &Consumer<'_>,
    input: &ArtifactInput,
    context: &WellContext<'_>,
    producer: &PlateStepPlan,
    found: &mut GroupsFound,
) -> Option<usize> {
    let producer_step = &context.steps[producer.step];
    let produces = |a: &Action| match a {
        Action::Chain(ci) => producer_step.chains[*ci].produces().any(|p| p == input.name),
        _ => false,
    };
    let candidates: Vec<usize> = producer
        .groups
        .iter()
        .enumerate()
        .filter(|(_, g)| produces(&g.action) && plate_covers(&g.scope, &consumer.scope))
        .map(|(i, _)| i)
        .collect();
    let consumed = matches!(consumer.action, Action::Chain(ci)
        if consumer.step.chains[ci].calls.iter().any(|c| c.artifacts.consumes.iter().any(|d| d.name == input.name)));
    let (step, well) = (consumer.step, consumer.well);
    // What the producer groups by, as the consumer has it ("channel 2 (GFP)").
    let scope = match producer_step.group_by {
        Some(c) => format!("{c} {}", describe_values(context.plate, c, &BTreeSet::from([consumer.scope[c.index()]]))),
        None => plate_scope_text(&context.plate.metadata.channel_names, &consumer.scope),
    };
    let error = match candidates.as_slice() {
        [one] => return Some(*one),
        _ if !consumed => return None,
        [] => PipelineError::step(
            &step.name,
            format!(
                "the plate-wide step '{}' has no '{}' for {scope} (the stack at {} of well {well}); it has results for: {}",
                producer_step.name,
                input.name,
                scope_text(&consumer.scope),
                covered_text(context.plate, producer, producer_step.group_by)
            ),
            format!(
                "make step '{}' fit {scope} too (its func map or missing_groups), or group this step as that step (group_by = \"{}\")",
                producer_step.name,
                producer_step.group_by.map(|c| c.name()).unwrap_or("none")
            ),
        ),
        _ => PipelineError::step(
            &step.name,
            format!(
                "{} results of the plate-wide step '{}' could serve the stack at {} of well {well}: a stack gets one",
                candidates.len(),
                producer_step.name,
                scope_text(&consumer.scope)
            ),
            format!(
                "give this step stacks of one {} (group_by and variable_components as step '{}')",
                producer_step.group_by.map(|c| c.name()).unwrap_or("group"),
                producer_step.name
            ),
        ),
    };
    found.wiring_errors.entry((consumer.step_index, input.name.clone())).or_insert(error);
    None
}

/// Func map keys must be group values of this plate (`seen`, per step), and
/// groups without an entry (`unmapped`) follow the step's `missing_groups`.
fn check_group_maps(
    plate: &Plate,
    steps: &[StepPlan],
    seen: &[BTreeSet<u32>],
    unmapped: &[BTreeSet<u32>],
    errors: &mut Vec<PipelineError>,
) {
    for (si, step) in steps.iter().enumerate() {
        let Some(group_by) = step.group_by else { continue };
        for chain in &step.chains {
            if let (Some(label), Some(v)) = (&chain.label, chain.group_value) {
                if !seen[si].contains(&v) {
                    errors.push(PipelineError::step(
                        &step.name,
                        format!("func map key '{label}' is not a {group_by} of this step's input"),
                        format!("use one of: {}", describe_values(plate, group_by, &seen[si])),
                    ));
                }
            }
        }
        if step.missing_groups == MissingGroups::Error && !unmapped[si].is_empty() && !step.chains.iter().all(|c| c.label.is_none()) {
            errors.push(PipelineError::step(
                &step.name,
                format!("func map has no entry for {group_by} {}", describe_values(plate, group_by, &unmapped[si])),
                "add entries for them, or set missing_groups = \"passthrough\" (pass them on unchanged) or \"skip\" (drop them)",
            ));
        }
    }
}

/// A producer stack covers a consumer stack when, component by component,
/// both vary, or the producer's value is collapsed (it holds for every value),
/// or both are the same fixed value.
fn scopes_match(producer: &Key, consumer: &Key) -> bool {
    producer.iter().zip(consumer).all(|(&p, &c)| match (Slot::of(p), Slot::of(c)) {
        (Slot::Variable, Slot::Variable) => true,
        (Slot::Variable, _) => false,
        (Slot::Collapsed, _) => true,
        (p, c) => p == c,
    })
}

/// "channel 2, z collapsed" for error messages.
pub(crate) fn scope_text(scope: &Key) -> String {
    let names = ["site", "channel", "z", "t"];
    let parts: Vec<String> = scope
        .iter()
        .zip(names)
        .filter_map(|(&v, n)| match Slot::of(v) {
            Slot::Variable => None,
            Slot::Collapsed => Some(format!("{n} collapsed")),
            Slot::Value(v) => Some(format!("{n} {v}")),
        })
        .collect();
    if parts.is_empty() {
        "the whole well".into()
    } else {
        parts.join(", ")
    }
}

/// Wires each consumed artifact to its producer step: the one named in
/// `artifacts_from`, else the latest earlier enabled step producing it.
fn wire_artifacts(spec: &PipelineSpec, registry: &Registry, steps: &mut [StepPlan], errors: &mut Vec<PipelineError>) {
    let producers_of = |name: &str, before: usize, steps: &[StepPlan]| -> Vec<usize> {
        (0..before).filter(|&i| steps[i].produces.iter().any(|p| p == name)).collect()
    };
    let all_producers = |name: &str| -> Vec<&'static str> {
        registry.functions().filter(|f| f.artifacts.produces.iter().any(|d| d.name == name)).map(|f| f.spec.name).collect()
    };
    for si in 0..steps.len() {
        let Some(step_spec) = spec.steps.iter().find(|s| s.name == steps[si].name) else { continue };
        for (artifact, _) in step_spec.artifacts_from.iter().filter(|(a, _)| !steps[si].consumes.iter().any(|c| &c.name == *a)) {
            errors.push(PipelineError::step(
                &steps[si].name,
                format!("artifacts_from names '{artifact}', which no function of this step consumes"),
                match steps[si].consumes.iter().map(|c| c.name.as_str()).collect::<Vec<_>>() {
                    v if v.is_empty() => "remove artifacts_from".to_string(),
                    v => format!("this step consumes: {}", v.join(", ")),
                },
            ));
        }
        for ci in 0..steps[si].consumes.len() {
            let name = steps[si].consumes[ci].name.clone();
            let optional = steps[si]
                .chains
                .iter()
                .flat_map(|c| &c.calls)
                .flat_map(|c| &c.artifacts.consumes)
                .filter(|d| d.name == name)
                .all(|d| d.optional);
            let from = match step_spec.artifacts_from.get(&name) {
                Some(wanted) => match steps.iter().position(|s| &s.name == wanted) {
                    Some(i) if i >= si => {
                        errors.push(PipelineError::step(
                            &steps[si].name,
                            format!("artifacts_from: step '{wanted}' does not run before this one"),
                            "name an earlier step",
                        ));
                        continue;
                    }
                    Some(i) if !steps[i].produces.contains(&name) => {
                        errors.push(PipelineError::step(
                            &steps[si].name,
                            format!("artifacts_from: step '{wanted}' does not produce '{name}'"),
                            match producers_of(&name, si, steps).last() {
                                Some(&p) => format!("step '{}' does", steps[p].name),
                                None => format!("'{name}' is produced by: {}", all_producers(&name).join(", ")),
                            },
                        ));
                        continue;
                    }
                    Some(i) => Some(i),
                    None => {
                        let disabled = spec.steps.iter().any(|s| &s.name == wanted && !s.enabled);
                        errors.push(PipelineError::step(
                            &steps[si].name,
                            format!(
                                "artifacts_from: {}",
                                if disabled { format!("step '{wanted}' is disabled") } else { format!("no step is named '{wanted}'") }
                            ),
                            "name an earlier enabled step",
                        ));
                        continue;
                    }
                },
                // An argument standing in for the artifact, given: no default wiring.
                None if instead_given(&steps[si], &name) => None,
                None => producers_of(&name, si, steps).last().copied(),
            };
            if let Err(e) = check_artifact_kind(&steps[si], &name, from, steps) {
                errors.push(e);
                continue;
            }
            if let Err(e) = check_instead(&steps[si], &name, from.map(|f| steps[f].name.as_str()), &all_producers(&name)) {
                errors.push(e);
                continue;
            }
            if from.is_none() && !optional {
                errors.push(PipelineError::step(
                    &steps[si].name,
                    format!("its function needs the '{name}' artifact, but no earlier enabled step produces it"),
                    format!("add a step before it with a function that produces '{name}' ({})", all_producers(&name).join(", ")),
                ));
            }
            if from.is_some() {
                // The artifact arrives: no call of this step works around its absence.
                for w in steps[si].chains.iter_mut().flat_map(|c| &mut c.host_work) {
                    if w.as_ref().is_some_and(|w| w.without == name) {
                        *w = None;
                    }
                }
            }
            steps[si].consumes[ci].from_step = from;
        }
    }
}

/// A call that would run on the host, found by `--require-gpu`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct HostCall {
    pub step: String,
    pub function: String,
    /// Why it runs on the host: the run's device, the step's `device = "cpu"`,
    /// or the host work the GPU implementation does.
    pub why: String,
}

impl std::fmt::Display for HostCall {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "step '{}': {} ({})", self.step, self.function, self.why)
    }
}

/// `--require-gpu`: every call of every step (plate-wide ones included) runs
/// on the GPU, with none of its work on the host; otherwise the error names
/// each step and function that would not (once per step and function).
fn check_require_gpu(steps: &[StepPlan], config: &CompileConfig) -> Result<(), PipelineError> {
    let mut calls: Vec<HostCall> = Vec::new();
    for step in steps {
        for chain in &step.chains {
            for (call, work) in chain.calls.iter().zip(&chain.host_work) {
                let why = if call.device == Device::Cpu {
                    if config.device == Device::Cpu {
                        format!("the run's device is cpu: {}", config.device_reason)
                    } else {
                        "the step sets device = \"cpu\"".to_string()
                    }
                } else if let Some(w) = work {
                    format!("on {} it {} on the host: no '{}' from an earlier step", call.device, w.work, w.without)
                } else {
                    continue;
                };
                let found = HostCall { step: step.name.clone(), function: call.function.to_string(), why };
                if !calls.contains(&found) {
                    calls.push(found);
                }
            }
        }
    }
    if calls.is_empty() {
        return Ok(());
    }
    let fix = if config.device == Device::Cpu {
        "run on a GPU (--device gpu; --allow-software-gpu for lavapipe/llvmpipe), or drop --require-gpu"
    } else {
        "remove device = \"cpu\" from these steps and use functions with a GPU implementation (`hcsflow functions`), \
         add the step producing the missing artifact, or drop --require-gpu"
    };
    Err(PipelineError::HostCalls { device: config.device, calls, fix: fix.to_string() })
}

/// The calls of `step` consuming artifact `name`, with their declaration of it.
fn consuming<'a>(
    step: &'a StepPlan,
    name: &'a str,
) -> impl Iterator<Item = (&'a hcsflow_core::CallPlan, &'a hcsflow_core::ArtifactDecl)> + 'a {
    step.chains
        .iter()
        .flat_map(|c| &c.calls)
        .flat_map(move |call| call.artifacts.consumes.iter().filter(move |d| d.name == name).map(move |d| (call, d)))
}

/// The text argument that stands in for artifact `name` in `call`, if the call gives it.
fn instead_value<'a>(call: &'a hcsflow_core::CallPlan, decl: &hcsflow_core::ArtifactDecl) -> Option<(&'static str, &'a str)> {
    let arg = decl.instead?;
    match call.args.get(arg) {
        Some(hcsflow_core::ArgValue::Str(v)) if !v.is_empty() => Some((arg, v.as_str())),
        _ => None,
    }
}

/// True when every call of `step` consuming `name` gives the argument that stands in for it.
fn instead_given(step: &StepPlan, name: &str) -> bool {
    let mut calls = consuming(step, name).peekable();
    calls.peek().is_some() && calls.all(|(call, decl)| instead_value(call, decl).is_some())
}

/// A planes artifact comes from a plate-wide step, and a plate-wide step's
/// tables are not consumed by the wells.
fn check_artifact_kind(step: &StepPlan, name: &str, from: Option<usize>, steps: &[StepPlan]) -> Result<(), PipelineError> {
    let Some(producer) = from.map(|f| &steps[f]) else { return Ok(()) };
    let planes = consuming(step, name).any(|(_, d)| d.kind == hcsflow_core::ArtifactKind::Planes);
    match (planes, producer.plate.is_some()) {
        (true, false) => Err(PipelineError::step(
            &step.name,
            format!(
                "'{name}' is the result of step '{}', which runs per well; such a result reaches the wells from a plate-wide step",
                producer.name
            ),
            format!("set scope = \"plate\" on step '{}' (one result per group across the plate)", producer.name),
        )),
        (false, true) => Err(PipelineError::step(
            &step.name,
            format!(
                "step '{}' is plate-wide: its '{name}' table is written under OUT/{}/ but does not reach the wells",
                producer.name, producer.name
            ),
            format!("run step '{}' per well (remove scope = \"plate\") to consume its '{name}' here", producer.name),
        )),
        _ => Ok(()),
    }
}

/// For an artifact an argument can stand in for (`basic_correct`'s
/// `flatfield` file for the `basic_profiles` of a plate-wide fit): exactly one
/// of the two per call. `from`: the producer step wired, if any.
fn check_instead(step: &StepPlan, name: &str, from: Option<&str>, producers: &[&str]) -> Result<(), PipelineError> {
    for (call, decl) in consuming(step, name) {
        let Some(arg) = decl.instead else { continue };
        match (from, instead_value(call, decl)) {
            (Some(producer), Some((_, value))) => {
                return Err(PipelineError::step(
                    &step.name,
                    format!("{} gets '{name}' from step '{producer}' and also {arg} = '{value}'; it takes one of the two", call.function),
                    format!("remove the {arg} argument, or remove artifacts_from = {{ {name} = \"{producer}\" }} to use the file"),
                ))
            }
            (None, None) => {
                return Err(PipelineError::step(
                    &step.name,
                    format!("{} needs '{name}' from an earlier plate-wide step, or the argument {arg}, and has neither", call.function),
                    format!(
                        "add an earlier step with scope = \"plate\" and a function producing '{name}' ({}), or pass {arg} = \"<file>\"",
                        producers.join(", ")
                    ),
                ))
            }
            _ => {}
        }
    }
    Ok(())
}

pub(crate) fn flatten(mut errors: Vec<PipelineError>) -> PipelineError {
    if errors.len() == 1 {
        errors.remove(0)
    } else {
        PipelineError::Invalid(errors)
    }
}

/// How a step's `func` selects chains.
pub(crate) enum ResolvedFunc {
    /// One chain for every stack.
    Single,
    /// Group value → index into `StepPlan::chains`.
    Map(BTreeMap<u32, usize>),
}

fn compile_step(
    step: &StepSpec,
    plate: &Plate,
    registry: &Registry,
    conversions: &Conversions,
    config: &CompileConfig,
) -> Result<(StepPlan, ResolvedFunc), PipelineError> {
    let name = step.name.as_str();
    check_step_name(name)?;
    let mut variable = Vec::new();
    for c in &step.variable_components {
        let c: Component = c.parse().map_err(|e: String| {
            PipelineError::step(name, format!("variable_components: {e}"), "e.g. variable_components = [\"z_index\"]")
        })?;
        if !variable.contains(&c) {
            variable.push(c);
        }
    }
    let group_by = match step.group_by.as_str() {
        "none" | "" => None,
        g => Some(
            g.parse::<Component>()
                .map_err(|e| PipelineError::step(name, format!("group_by: {e}"), "group_by = \"channel\" (default) or \"none\""))?,
        ),
    };
    if let Some(g) = group_by.filter(|g| variable.contains(g)) {
        return Err(PipelineError::step(
            name,
            format!("group_by = \"{g}\" is also a variable component: a stack spans several {g} values, so it has no single group value"),
            format!("remove \"{g}\" from variable_components, or set group_by to another component or \"none\""),
        ));
    }
    let output: OutputDType = step.dtype.parse().map_err(|e: hcsflow_core::dtype::UnknownDType| {
        PipelineError::step(name, format!("dtype: {e}"), "dtype = \"input\", \"u8\", \"u16\" or \"f32\"")
    })?;
    let dtype = DTypePolicy { output, conversion: if step.stretch { DTypeConversion::Stretch } else { DTypeConversion::Clip } };
    // A plate-wide step's results are always written (as TIFF, under OUT/<step>/), outside the wells' outputs.
    let materialize: BTreeSet<Materialize> = match step.scope {
        Scope::Well => step.materialize.iter().copied().collect(),
        Scope::Plate => BTreeSet::new(),
    };
    // `device = "cpu"` pins a step to the host (functions without a GPU
    // implementation in a GPU run): explicit in the file and in the plan,
    // never a silent fallback.
    let pinned;
    let config = match step.device.as_deref() {
        None => config,
        Some("cpu") => {
            pinned = CompileConfig { device: Device::Cpu, ..config.clone() };
            &pinned
        }
        Some(other) => {
            return Err(PipelineError::step(
                name,
                format!("device = \"{other}\" is not a step device"),
                "use device = \"cpu\" to run this step on the host, or remove the key to use the run's --device",
            ))
        }
    };
    let func = FuncSpec::parse(name, &step.func)?;
    let mut errors = Vec::new();
    let (chains, resolved) = match func {
        FuncSpec::Chain(calls) => match compile_chain(name, &calls, registry, conversions, config) {
            Ok(c) => (vec![c], ResolvedFunc::Single),
            Err(e) => return Err(e),
        },
        FuncSpec::Map(map) => {
            let Some(g) = group_by else {
                return Err(PipelineError::step(
                    name,
                    "func is a map but group_by = \"none\"",
                    "set group_by to the component the map is keyed by (default \"channel\")",
                ));
            };
            let mut chains = Vec::new();
            let mut by_value: BTreeMap<u32, usize> = BTreeMap::new();
            for (label, calls) in &map {
                let value = match resolve_group_key(plate, g, label) {
                    Ok(v) => v,
                    Err(fix) => {
                        errors.push(PipelineError::step(name, format!("func map key '{label}' is not a {g} of this plate"), fix));
                        continue;
                    }
                };
                match compile_chain(name, calls, registry, conversions, config) {
                    Ok(mut c) => {
                        if let Some(&other) = by_value.get(&value) {
                            let other_label = chains.get(other).and_then(|c: &ChainPlan| c.label.clone()).unwrap_or_default();
                            errors.push(PipelineError::step(
                                name,
                                format!("func map keys '{other_label}' and '{label}' both mean {g} {value}"),
                                "keep one of them",
                            ));
                            continue;
                        }
                        c.label = Some(label.clone());
                        c.group_value = Some(value);
                        by_value.insert(value, chains.len());
                        chains.push(c);
                    }
                    Err(e) => errors.push(e),
                }
            }
            if !errors.is_empty() {
                return Err(flatten(errors));
            }
            (chains, ResolvedFunc::Map(by_value))
        }
    };
    let mut produces: Vec<String> = Vec::new();
    let mut consumes: Vec<ArtifactInput> = Vec::new();
    for chain in &chains {
        for p in chain.produces() {
            if !produces.iter().any(|n| n == p) {
                produces.push(p.to_string());
            }
        }
        for d in chain.calls.iter().flat_map(|c| &c.artifacts.consumes) {
            if !consumes.iter().any(|c| c.name == d.name) {
                consumes.push(ArtifactInput { name: d.name.to_string(), from_step: None });
            }
        }
    }
    Ok((
        StepPlan {
            produces,
            consumes,
            name: name.to_string(),
            variable,
            group_by,
            input_source: step.input_source,
            missing_groups: step.missing_groups,
            chains,
            materialize,
            dtype,
            out_dir: config.out.join(name),
            plate: match step.scope {
                Scope::Well => None,
                Scope::Plate => Some(PlateSampling {
                    sample: usize::try_from(step.sample.unwrap_or(DEFAULT_SAMPLE)).unwrap_or(usize::MAX),
                    seed: step.seed.unwrap_or(0),
                }),
            },
        },
        resolved,
    ))
}

/// What a plate-wide step (`scope = "plate"`) cannot be, and the keys that
/// only plate-wide steps take. `well_step_before`: an enabled per-well step
/// comes earlier in the pipeline.
fn check_plate_step(spec: &StepSpec, step: &StepPlan, well_step_before: bool) -> Result<(), PipelineError> {
    let name = spec.name.as_str();
    if step.plate.is_none() {
        if spec.sample.is_some() || spec.seed.is_some() {
            return Err(PipelineError::step(
                name,
                "`sample` and `seed` choose the planes of a plate-wide step, and this step runs per well",
                "add scope = \"plate\" to fit on a sample of the whole plate, or remove sample and seed",
            ));
        }
        return Ok(());
    }
    if spec.sample == Some(0) {
        return Err(PipelineError::step(name, "sample = 0 samples no plane", "sample at least 1 plane per group (default 200)"));
    }
    for call in step.chains.iter().flat_map(|c| &c.calls) {
        if call.per_plane() {
            return Err(PipelineError::step(
                name,
                format!(
                    "{} ({}) works plane by plane: on a plate-wide sample it would only process the sampled planes, which no well uses",
                    call.function, call.contract
                ),
                "run it per well (remove scope = \"plate\"); plate-wide steps take functions of the whole stack (pure_3d, volumetric_to_slice), e.g. basic_fit",
            ));
        }
        if let Some(d) = call.artifacts.consumes.first() {
            return Err(PipelineError::step(
                name,
                format!(
                    "{} consumes the '{}' artifact; a plate-wide step runs before the wells and cannot consume one",
                    call.function, d.name
                ),
                "run it per well (remove scope = \"plate\")",
            ));
        }
    }
    if spec.materialize.contains(&Materialize::Zarr) {
        return Err(PipelineError::step(
            name,
            "a plate-wide step's results are not images of wells and cannot go into the OME-Zarr plate",
            "remove \"zarr\" from materialize (its results are always written as TIFF under OUT/<step>/)",
        ));
    }
    if spec.input_source == InputSource::Previous && well_step_before {
        return Err(PipelineError::step(
            name,
            "a plate-wide step runs before the wells and reads the plate's original images, not the previous step's output",
            "set input_source = \"pipeline_start\" (or move the step before the per-well steps)",
        ));
    }
    Ok(())
}

/// A step name names its output folder `OUT/<name>`: it must be one plain
/// path component, and not a name hcsflow itself writes in OUT (the run
/// manifest, the CSV summaries, OME-Zarr plates, hidden lock and temporary files).
fn check_step_name(name: &str) -> Result<(), PipelineError> {
    let fix = "use letters, digits, '-' and '_'";
    if name.is_empty() || name == "." || name == ".." || name.contains(['/', '\\']) {
        return Err(PipelineError::step(name, "bad step name (it names the step's output folder)", fix));
    }
    if name.starts_with('.') {
        return Err(PipelineError::step(
            name,
            "step names starting with '.' are reserved for hcsflow's hidden files in the output folder (lock and temporary files)",
            format!("remove the leading '.', e.g. '{}'", name.trim_start_matches('.')),
        ));
    }
    let reserved = [
        (MANIFEST_NAME, "the run manifest"),
        (SUMMARY_NAME, "the output summary"),
        (ARTIFACTS_NAME, "the artifact summary"),
        (RUN_REPORT_NAME, "the run report"),
        (REPORT_HTML_NAME, "the QC report"),
        (REPORT_MQC_NAME, "the QC report's MultiQC file"),
    ];
    if let Some((file, what)) = reserved.iter().find(|(file, _)| name.eq_ignore_ascii_case(file)) {
        return Err(PipelineError::step(
            name,
            format!("the step's output folder would be OUT/{file}, which is {what} hcsflow writes"),
            format!("rename the step, e.g. '{}_step'", file.split('.').next().unwrap_or("my")),
        ));
    }
    if name.to_ascii_lowercase().ends_with(".ome.zarr") {
        return Err(PipelineError::step(
            name,
            "step names ending in '.ome.zarr' are reserved for the OME-Zarr plates hcsflow writes in the output folder",
            format!("rename the step, e.g. '{}'", &name[..name.len() - ".ome.zarr".len()]),
        ));
    }
    Ok(())
}

fn compile_chain(
    step: &str,
    calls: &[CallSpec],
    registry: &Registry,
    conversions: &Conversions,
    config: &CompileConfig,
) -> Result<ChainPlan, PipelineError> {
    let mut memory = MemoryType::Host;
    let mut planned = Vec::new();
    let mut reduces = false;
    let mut reduced_before = Vec::new();
    for call in calls {
        let plan_err = |e: PlanError| {
            let fix = match &e {
                PlanError::UnknownFunction { .. } => "check the name; `hcsflow functions` lists every function".to_string(),
                PlanError::Args(_) => format!("`hcsflow functions {}` lists its arguments, types and ranges", call.name),
                PlanError::NoImplementation { device: Device::Cpu, .. } => {
                    "use a function with a host, numpy, torch or jax implementation (`hcsflow functions`)".to_string()
                }
                PlanError::NoImplementation { .. } => {
                    "run with --device cpu, or use functions that have a GPU implementation (`hcsflow functions`)".to_string()
                }
                PlanError::Conversion { error, .. } if error.method == "host round-trip" => {
                    "set --allow-host-round-trip, or chain functions with matching memory types".to_string()
                }
                PlanError::Conversion { .. } => {
                    "install what the reason names, or use a function of a memory type this build has".to_string()
                }
            };
            match e {
                PlanError::Conversion { function, error } => {
                    PipelineError::Route { step: step.to_string(), function, error: Box::new(error), fix }
                }
                e => PipelineError::step(step, e.to_string(), fix),
            }
        };
        let function = registry.get(&call.name).map_err(plan_err)?;
        let args = function.validate_args(call.args.clone()).map_err(|e| plan_err(PlanError::Args(e)))?;
        let plan = registry.plan_call(&call.name, args, memory, config.device, conversions, config.policy).map_err(plan_err)?;
        reduced_before.push(reduces);
        reduces |= plan.contract == Contract::VolumetricToSlice;
        memory = plan.implementation.memory_out;
        planned.push(plan);
    }
    let route_out = conversions.plan(memory, MemoryType::Host, config.device.runtime(), config.policy).map_err(|e| {
        PipelineError::step(step, format!("copying the result to the host: {e}"), "use functions whose output this build can download")
    })?;
    let mut produced = BTreeSet::new();
    for call in &planned {
        for d in &call.artifacts.produces {
            if !produced.insert(d.name) {
                return Err(PipelineError::step(
                    step,
                    format!("two functions of the chain produce the artifact '{}'", d.name),
                    "split the chain into two steps",
                ));
            }
        }
    }
    let host_work = planned
        .iter()
        .map(|call| {
            let Some(w) = call.implementation.host_work else { return Ok(None) };
            let route =
                conversions.plan(call.implementation.memory_in, MemoryType::Host, config.device.runtime(), config.policy).map_err(|e| {
                    PipelineError::step(
                        step,
                        format!(
                            "{}: without '{}' it {} on the host, and its input cannot get there: {e}",
                            call.function, w.without, w.work
                        ),
                        format!("add a step before it that produces '{}'", w.without),
                    )
                })?;
            Ok(Some(PlannedHostWork { without: w.without, work: w.work, route }))
        })
        .collect::<Result<Vec<_>, PipelineError>>()?;
    Ok(ChainPlan { label: None, group_value: None, calls: planned, route_out, reduces, reduced_before, host_work })
}

/// Runs every call's argument check ([`hcsflow_core::ArgCheck`]) with the
/// shape of the stack it will get, before any pixel is read: depth from the
/// group's planes, plane size from the plate for the first step and, for later
/// calls and steps, from the previous call's output shape
/// ([`hcsflow_core::Function::output_shape`]). Where compile cannot know a
/// shape (a function whose output size only the run knows, or a stack mixing
/// plane sizes) the shape-dependent checks of the calls after it are skipped;
/// the registry runs the same check on the real stack at run time. Each call
/// is reported once, with the first stack it fails on.
fn check_call_shapes(plan: &Plan, registry: &Registry) -> Result<(), PipelineError> {
    let (plate_h, plate_w, _) = plan.plane;
    // Per (step, chain, call): the first failure.
    let mut errors: BTreeMap<(usize, usize, usize), PipelineError> = BTreeMap::new();
    // Stacks follow from the planes' keys alone: a well with the same keys as
    // one already followed has the same stacks and shapes.
    let mut followed: BTreeSet<Vec<Key>> = BTreeSet::new();
    for well in &plan.wells {
        if !followed.insert(well.inputs.iter().map(|i| i.key).collect()) {
            continue;
        }
        // (height, width) of each plane, by key; None where compile cannot know it.
        let start: BTreeMap<Key, Option<(usize, usize)>> = well.inputs.iter().map(|i| (i.key, Some((plate_h, plate_w)))).collect();
        let mut current = start.clone();
        for ws in &well.steps {
            let step = &plan.steps[ws.step];
            let input = match step.input_source {
                InputSource::PipelineStart => &start,
                InputSource::Previous => &current,
            };
            let mut next: BTreeMap<Key, Option<(usize, usize)>> = BTreeMap::new();
            for g in &ws.groups {
                let sizes: Vec<Option<(usize, usize)>> = g.inputs.iter().map(|k| input.get(k).copied().flatten()).collect();
                let plane = match sizes.first() {
                    Some(&Some(first)) if sizes.iter().all(|s| *s == Some(first)) => Some(first),
                    _ => None,
                };
                let out_plane = match g.action {
                    Action::Skip => None,
                    Action::Passthrough => {
                        next.extend(g.outputs.iter().zip(&sizes).map(|(o, s)| (o.key, *s)));
                        continue;
                    }
                    Action::Chain(ci) => {
                        let chain = &step.chains[ci];
                        let mut shape = plane.map(|(h, w)| StackShape::new(g.inputs.len(), h, w));
                        for (k, call) in chain.calls.iter().enumerate() {
                            let (Some(s), Ok(function)) = (shape, registry.get(call.function)) else {
                                shape = None;
                                continue;
                            };
                            if let Err(e) = function.check_args(&call.args, &s) {
                                errors.entry((ws.step, ci, k)).or_insert_with(|| {
                                    let entry = chain.label.as_ref().map(|l| format!("func map entry '{l}': ")).unwrap_or_default();
                                    let context = format!(
                                        "the stack at {} of well {} (the plate's planes are {plate_h}×{plate_w})",
                                        scope_text(&g.scope),
                                        well.well
                                    );
                                    match e {
                                        ArgError::Invalid { function, name, problem, fix, shape } => PipelineError::step(
                                            &step.name,
                                            format!(
                                                "{entry}{function}: {}: {problem} (checked against {shape}: {context})",
                                                blamed(name.as_deref())
                                            ),
                                            fix,
                                        ),
                                        other => PipelineError::step(
                                            &step.name,
                                            format!("{entry}{other} ({context})"),
                                            format!("`hcsflow functions {}` lists its arguments", call.function),
                                        ),
                                    }
                                });
                                // Later calls would be checked against a shape this call never returns.
                                shape = None;
                                continue;
                            }
                            shape = function.output_shape(&call.args, &s);
                        }
                        shape.map(|s| (s.height, s.width))
                    }
                };
                next.extend(g.outputs.iter().map(|o| (o.key, out_plane)));
            }
            current = next;
        }
    }
    if errors.is_empty() {
        Ok(())
    } else {
        Err(flatten(errors.into_values().collect()))
    }
}

/// The group value a map key means: a number, or (for channels) a channel name.
fn resolve_group_key(plate: &Plate, component: Component, key: &str) -> Result<u32, String> {
    if let Ok(v) = key.trim().parse::<u32>() {
        return Ok(v);
    }
    if component == Component::Channel {
        if let Some((&c, _)) = plate.metadata.channel_names.iter().find(|(_, n)| n.eq_ignore_ascii_case(key.trim())) {
            return Ok(c);
        }
    }
    Err(format!("use one of: {}", describe_values(plate, component, &plate_values(plate, component))))
}

fn plate_values(plate: &Plate, component: Component) -> BTreeSet<u32> {
    plate.images.iter().map(|i| key_of(i.site, i.channel, i.z_index, i.timepoint)[component.index()]).collect()
}

/// "1 (DAPI), 2 (GFP)" for channels; plain numbers otherwise; "collapsed" for 0.
pub(crate) fn describe_values(plate: &Plate, component: Component, values: &BTreeSet<u32>) -> String {
    let v: Vec<String> = values
        .iter()
        .map(|&v| match (v, component) {
            (v, _) if Slot::of(v) == Slot::Collapsed => "(collapsed by an earlier step)".to_string(),
            (v, Component::Channel) => match plate.metadata.channel_names.get(&v) {
                Some(n) => format!("{v} ({n})"),
                None => v.to_string(),
            },
            (v, _) => v.to_string(),
        })
        .collect();
    if v.is_empty() {
        "(none)".into()
    } else {
        v.join(", ")
    }
}

fn key_of(site: u32, channel: u32, z: u32, t: u32) -> Key {
    [site, channel, z, t]
}

/// The planes of `well`: its images and the images the plate declares missing.
fn well_inputs(plate: &Plate, well: &str) -> Vec<InputPlane> {
    let rel = |p: &Path| -> PathBuf {
        p.strip_prefix(&plate.root).map(Path::to_path_buf).unwrap_or_else(|_| p.file_name().map(PathBuf::from).unwrap_or_default())
    };
    let mut v: Vec<InputPlane> = plate
        .images
        .iter()
        .filter(|i| i.well == well)
        .map(|i| InputPlane {
            key: key_of(i.site, i.channel, i.z_index, i.timepoint),
            path: Some(i.path.clone()),
            at: i.at.clone(),
            rel: i.rel(&plate.root),
        })
        .collect();
    let present: BTreeSet<Key> = v.iter().map(|i| i.key).collect();
    for m in plate.missing.iter().filter(|m| m.well == well) {
        let key = key_of(m.site, m.channel, m.z_index, m.timepoint);
        if key.contains(&0) || present.contains(&key) {
            continue;
        }
        let name = m.path.as_deref().map(rel).unwrap_or_else(|| m.placeholder_rel());
        v.push(InputPlane { key, path: None, at: None, rel: name });
    }
    v.sort_by_key(|i| i.key);
    v
}

/// The planes of `inputs` (a well's, from [`well_inputs`]) that have no file,
/// with where and why, as the plate lists them.
fn missing_planes(plate: &Plate, well: &str, inputs: &[InputPlane]) -> Vec<MissingPlane> {
    inputs
        .iter()
        .filter(|i| i.path.is_none())
        .map(|i| {
            let m = plate.missing.iter().find(|m| m.well == well && key_of(m.site, m.channel, m.z_index, m.timepoint) == i.key);
            MissingPlane {
                well: well.to_string(),
                key: i.key,
                expected: m.and_then(|m| m.path.clone()),
                reason: m.map(|m| m.reason.clone()).unwrap_or_else(|| "no image file found".into()),
            }
        })
        .collect()
}

/// How many missing images [`missing_error`] lists by name.
const MISSING_LISTED: usize = 10;

/// The refusal under [`MissingPolicy::Error`]: the first missing images, their
/// count, and the two ways to run anyway.
fn missing_error(missing: &[MissingPlane]) -> PipelineError {
    let wells: BTreeSet<&str> = missing.iter().map(|m| m.well.as_str()).collect();
    let mut message = format!(
        "{} image(s) the plate declares are missing, in {} well(s); a missing image would become a plane of zeros and change the results:",
        missing.len(),
        wells.len()
    );
    for m in missing.iter().take(MISSING_LISTED) {
        message.push_str(&format!("\n      {m}"));
    }
    if missing.len() > MISSING_LISTED {
        message.push_str(&format!("\n      … and {} more (`hcsflow inspect` lists them all)", missing.len() - MISSING_LISTED));
    }
    PipelineError::Config {
        message,
        fix: "restore the files, or run with --missing skip-well (run the other wells; these are recorded failed and \
              re-run by --resume once the files are back) or --missing fill (use planes of zeros, reported per well)"
            .into(),
    }
}

/// Groups planes by every component not in `variable`; each group ordered by
/// the variable components (in the order listed, numerically). Groups come in
/// numeric order of their fixed components.
fn group(planes: &[Flow], variable: &[Component]) -> Vec<Vec<Flow>> {
    let mut groups: BTreeMap<Key, Vec<Flow>> = BTreeMap::new();
    for p in planes {
        let mut fixed = p.key;
        for c in variable {
            fixed[c.index()] = VARIABLE;
        }
        groups.entry(fixed).or_default().push(p.clone());
    }
    groups
        .into_values()
        .map(|mut g| {
            g.sort_by_key(|f| variable.iter().map(|c| f.key[c.index()]).collect::<Vec<_>>());
            g
        })
        .collect()
}

/// The output name of a reduced stack: its first plane's name; when z was
/// reduced, the plate's name for a z-reduced stack ([`z_reduced_rel`]).
fn collapse_rel(rel: &Path, variable: &[Component]) -> PathBuf {
    if !variable.contains(&Component::ZIndex) {
        return rel.to_path_buf();
    }
    z_reduced_rel(rel)
}

/// Plane height, width and dtype from the metadata, else from the first image's header.
fn plane_format(plate: &Plate) -> Result<(usize, usize, DType), PipelineError> {
    let m = &plate.metadata;
    if let (Some(w), Some(h), Some(d)) = (m.image_width, m.image_height, m.dtype) {
        return Ok((h as usize, w as usize, d));
    }
    let first = plate.images.first().ok_or_else(|| PipelineError::Config {
        message: format!("{}: the plate has no images", plate.root.display()),
        fix: "check the plate folder (`hcsflow inspect`)".into(),
    })?;
    match hcsflow_plate::image_format(first) {
        Ok((h, w, dtype, _)) => Ok((h, w, dtype)),
        Err(ImageError::Tiff(e)) => Err(PipelineError::Image { path: first.path.clone(), source: Box::new(e) }),
        Err(ImageError::Zarr(e)) => Err(PipelineError::Zarr { path: first.path.clone(), source: Box::new(e) }),
    }
}

/// `path` made absolute and resolved as far as it exists (the rest appended).
fn resolve(path: &Path) -> PathBuf {
    let abs = if path.is_absolute() {
        path.to_path_buf()
    } else {
        std::env::current_dir().map(|d| d.join(path)).unwrap_or_else(|_| path.to_path_buf())
    };
    let mut existing = abs.clone();
    let mut rest = Vec::new();
    while !existing.exists() {
        match (existing.file_name().map(|n| n.to_os_string()), existing.parent()) {
            (Some(n), Some(p)) => {
                rest.push(n);
                existing = p.to_path_buf();
            }
            _ => break,
        }
    }
    let mut out = existing.canonicalize().unwrap_or(existing);
    for n in rest.into_iter().rev() {
        out.push(n);
    }
    out
}

/// The input plate is read-only: no output may land inside it.
fn check_out_dir(plate: &Plate, spec: &PipelineSpec, out: &Path) -> Result<(), PipelineError> {
    check_out_is_a_folder(out)?;
    let root = resolve(&plate.root);
    let out_abs = resolve(out);
    let inside = |p: &Path| p.starts_with(&root);
    if inside(&out_abs) {
        return Err(PipelineError::Config {
            message: format!(
                "output folder {} is inside the input plate {}; the input plate is never written",
                out.display(),
                plate.root.display()
            ),
            fix: "choose an output folder outside the plate".into(),
        });
    }
    for step in spec.steps.iter().filter(|s| s.enabled) {
        let dir = out_abs.join(&step.name);
        if root.starts_with(&dir) {
            return Err(PipelineError::step(
                &step.name,
                format!("its output folder {} would contain the input plate {}", dir.display(), plate.root.display()),
                "rename the step or choose another output folder",
            ));
        }
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::{scope_text, scopes_match, Slot, COLLAPSED, VARIABLE};

    #[test]
    fn slots_name_the_two_marks_of_a_key() {
        assert_eq!(Slot::of(COLLAPSED), Slot::Collapsed);
        assert_eq!(Slot::of(VARIABLE), Slot::Variable);
        assert_eq!(Slot::of(3), Slot::Value(3));
        assert_eq!([Slot::of(3).value(), Slot::Collapsed.value(), Slot::Variable.value()], [Some(3), None, None]);
        assert_eq!(scope_text(&[2, VARIABLE, COLLAPSED, 1]), "site 2, z collapsed, t 1");
        assert_eq!(scope_text(&[VARIABLE; 4]), "the whole well");
    }

    #[test]
    fn a_producer_stack_covers_a_consumer_by_slot() {
        // Both vary; collapsed covers any value; equal values match.
        assert!(scopes_match(&[VARIABLE, 1, COLLAPSED, 1], &[VARIABLE, 1, 3, 1]));
        // A varying producer component does not cover a fixed consumer one.
        assert!(!scopes_match(&[VARIABLE, 1, 1, 1], &[2, 1, 1, 1]));
        // Different values do not match.
        assert!(!scopes_match(&[1, 1, 1, 1], &[1, 2, 1, 1]));
    }
}
