//! Plate-wide steps (`scope = "plate"`), compile side: which planes of the
//! whole plate each group samples, the reduction applied as they are read,
//! where the results go, and the checks of the calls against the sample.
//!
//! A plate-wide step groups the plate's original planes *across wells* by the
//! components not in its `variable_components` (for `basic_fit` with
//! `variable_components = ["site"]` and the default `group_by = "channel"`:
//! one group per channel, every well's tiles of it). From each group it
//! samples at most `sample` planes ([`DEFAULT_SAMPLE`](crate::DEFAULT_SAMPLE)
//! by default): each candidate plane gets a rank from a hash of `(seed, well,
//! plane components)`, and the `sample` lowest ranks are taken. The sample is
//! therefore the same whatever the worker count or the order wells are
//! listed in, and a plane in the sample stays in it when other wells are added
//! unless they out-rank it. Planes the plate declares but does not have are
//! never sampled. The sampled planes form one stack in plate order of wells,
//! then numeric order of the variable components.
//!
//! It runs once, before any well ([`crate::execute`]), and its result per group
//! is written to `OUT/<step>/<group>.tif` (e.g. `channel_1_DAPI.tif`) and
//! given to the per-well consumers of its planes artifact whose stacks it
//! covers (same channel).

use std::collections::{BTreeMap, BTreeSet};
use std::path::PathBuf;

use hcsflow_core::{blamed, ArgError, PlaneReduction, Registry, StackShape};
use hcsflow_plate::{cmp_wells, Plate};

use crate::compile::{
    choose_action, describe_values, flatten, Action, GroupsFound, InputPlane, Key, ResolvedFunc, Slot, StepPlan, VARIABLE,
};
use crate::spec::Component;
use crate::PipelineError;

/// How a plate-wide step samples the plate.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct PlateSampling {
    /// At most this many planes per group.
    pub sample: usize,
    /// Chooses the sampled planes (the same seed, the same planes).
    pub seed: u64,
}

/// One plane of a plate-wide sample.
#[derive(Debug, Clone, PartialEq)]
pub struct PlatePlane {
    pub well: String,
    pub key: Key,
    pub path: PathBuf,
    /// Where the plane is in `path` when that holds several ([`InputPlane::at`](crate::InputPlane::at)).
    pub at: Option<hcsflow_plate::PlaneAt>,
}

/// One group of a plate-wide step: its sample and where its result goes.
#[derive(Debug, Clone)]
pub struct PlateGroupPlan {
    /// The group's fixed components; [`VARIABLE`] for the step's variable ones.
    pub scope: Key,
    pub action: Action,
    /// Planes the plate has for this group, across every well.
    pub available: usize,
    /// Wells those planes come from.
    pub wells: usize,
    /// The sampled planes, in stack order.
    pub inputs: Vec<PlatePlane>,
    /// `OUT/<step>/<group name>.tif` (empty for [`Action::Skip`]).
    pub output: PathBuf,
}

/// A plate-wide step of the plan.
#[derive(Debug, Clone)]
pub struct PlateStepPlan {
    /// Index into [`Plan::steps`](crate::Plan::steps).
    pub step: usize,
    pub sampling: PlateSampling,
    /// Applied to every plane as it is read (declared by the first function
    /// of the step's chains); `None`: planes are used at full size.
    pub reduction: Option<PlaneReduction>,
    pub groups: Vec<PlateGroupPlan>,
    /// Digest of the pipeline, the step and its sample: `--resume` re-reads a
    /// finished result only when the manifest records the same.
    pub digest: String,
}

impl PlateStepPlan {
    /// Bytes held while the step runs: the sampled planes of its largest
    /// group (at the reduced size when there is a reduction) plus one full
    /// plane per reading thread.
    pub fn estimate_bytes(&self, plane: (usize, usize), bytes_per_pixel: usize, threads: usize) -> u64 {
        let (h, w) = self.reduction.as_ref().map(|r| r.size).unwrap_or(plane);
        let held = if self.reduction.is_some() { 4 } else { bytes_per_pixel };
        let largest = self.groups.iter().map(|g| g.inputs.len()).max().unwrap_or(0);
        (largest * h * w * held + threads * plane.0 * plane.1 * bytes_per_pixel) as u64
    }
}

/// Plans plate-wide step `si` on every well's original planes (`wells`, in
/// plate order). Records its group values in `found` for the func map checks.
#[allow(clippy::too_many_arguments)]
pub(crate) fn plan_plate_step(
    si: usize,
    step: &StepPlan,
    func: &ResolvedFunc,
    sampling: PlateSampling,
    plate: &Plate,
    wells: &[(String, Vec<InputPlane>)],
    plane: (usize, usize),
    registry: &Registry,
    pipeline_digest: &str,
    found: &mut GroupsFound,
) -> Result<PlateStepPlan, PipelineError> {
    let mut groups: BTreeMap<Key, Vec<(usize, &str, &InputPlane)>> = BTreeMap::new();
    for (wi, (well, inputs)) in wells.iter().enumerate() {
        for input in inputs.iter().filter(|i| i.path.is_some()) {
            let mut scope = input.key;
            for c in &step.variable {
                scope[c.index()] = VARIABLE;
            }
            groups.entry(scope).or_default().push((wi, well, input));
        }
    }
    let plural = component_counts(wells);
    let mut planned = Vec::new();
    let mut errors = Vec::new();
    for (scope, members) in groups {
        let value = step.group_by.map(|c| scope[c.index()]);
        if let Some(v) = value {
            found.seen[si].insert(v);
        }
        let action = choose_action(step, func, value, &mut found.unmapped[si]);
        let available = members.len();
        let well_count = members.iter().map(|m| m.0).collect::<BTreeSet<_>>().len();
        // Lowest ranks first (ties, which a 64-bit hash makes rare, by well and plane).
        let mut ranked: Vec<(u64, &str, &InputPlane)> =
            members.into_iter().map(|(_, well, i)| (sample_rank(sampling.seed, well, &i.key), well, i)).collect();
        ranked.sort_by(|a, b| a.0.cmp(&b.0).then_with(|| cmp_wells(a.1, b.1)).then(a.2.key.cmp(&b.2.key)));
        ranked.truncate(sampling.sample);
        // Stack order: wells in plate order, then the variable components.
        let order = |k: &Key| step.variable.iter().map(|c| k[c.index()]).collect::<Vec<_>>();
        ranked.sort_by(|a, b| cmp_wells(a.1, b.1).then_with(|| order(&a.2.key).cmp(&order(&b.2.key))).then(a.2.key.cmp(&b.2.key)));
        let inputs: Vec<PlatePlane> = ranked
            .into_iter()
            .filter_map(|(_, well, i)| i.path.clone().map(|path| PlatePlane { well: well.to_string(), key: i.key, path, at: i.at.clone() }))
            .collect();
        let group = PlateGroupPlan {
            scope,
            action,
            available,
            wells: well_count,
            output: match action {
                Action::Skip => PathBuf::new(),
                _ => step.out_dir.join(format!("{}.tif", group_name(plate, &scope, &plural))),
            },
            inputs,
        };
        if let Err(e) = check_sample_shapes(plate, step, &group, plane, registry) {
            errors.push(e);
        }
        planned.push(group);
    }
    if !errors.is_empty() {
        return Err(flatten(errors));
    }
    let reduction = step
        .chains
        .first()
        .and_then(|c| c.calls.first())
        .and_then(|call| registry.get(call.function).ok().and_then(|f| f.plane_reduction(&call.args, plane)));
    let digest = plate_digest(pipeline_digest, &step.name, &planned, plane);
    Ok(PlateStepPlan { step: si, sampling, reduction, groups: planned, digest })
}

/// For each component, whether the plate has more than one value of it (a
/// group's file name names only those).
fn component_counts(wells: &[(String, Vec<InputPlane>)]) -> [bool; 4] {
    let mut values: [BTreeSet<u32>; 4] = Default::default();
    for input in wells.iter().flat_map(|(_, inputs)| inputs) {
        for (c, set) in values.iter_mut().enumerate() {
            set.insert(input.key[c]);
        }
    }
    values.map(|s| s.len() > 1)
}

/// The file name of a plate group's result: its fixed components, the
/// channel always (with its name), the others when the plate has several
/// values of them; `plate` when nothing is fixed.
fn group_name(plate: &Plate, scope: &Key, plural: &[bool; 4]) -> String {
    let safe = |s: &str| s.chars().map(|c| if c.is_ascii_alphanumeric() || c == '-' { c } else { '_' }).collect::<String>();
    let mut parts = Vec::new();
    for c in Component::ALL {
        let Slot::Value(v) = Slot::of(scope[c.index()]) else { continue };
        match c {
            Component::Channel => match plate.metadata.channel_names.get(&v) {
                Some(n) if !n.is_empty() => parts.push(format!("channel_{v}_{}", safe(n))),
                _ => parts.push(format!("channel_{v}")),
            },
            c if plural[c.index()] => parts.push(format!("{}_{v}", c.name())),
            _ => {}
        }
    }
    if parts.is_empty() {
        "plate".into()
    } else {
        parts.join("_")
    }
}

/// "channel 2 (GFP), t 1": a plate group's fixed components, channels with
/// their names.
pub fn plate_scope_text(channel_names: &BTreeMap<u32, String>, scope: &Key) -> String {
    let parts: Vec<String> = Component::ALL
        .iter()
        .filter_map(|&c| match (Slot::of(scope[c.index()]), c) {
            (Slot::Value(v), Component::Channel) => Some(match channel_names.get(&v) {
                Some(n) => format!("channel {v} ({n})"),
                None => format!("channel {v}"),
            }),
            (Slot::Value(v), c) => Some(format!("{} {v}", c.name())),
            _ => None,
        })
        .collect();
    if parts.is_empty() {
        "the whole plate".into()
    } else {
        parts.join(", ")
    }
}

/// Every call's argument check against the stack the group's sample makes
/// (depth = sampled planes, the plate's plane size): e.g. `basic_fit` on a
/// channel with a single plane across the plate is refused here.
fn check_sample_shapes(
    plate: &Plate,
    step: &StepPlan,
    group: &PlateGroupPlan,
    plane: (usize, usize),
    registry: &Registry,
) -> Result<(), PipelineError> {
    let Action::Chain(ci) = group.action else { return Ok(()) };
    let chain = &step.chains[ci];
    let mut shape = Some(StackShape::new(group.inputs.len(), plane.0, plane.1));
    for call in &chain.calls {
        let (Some(s), Ok(function)) = (shape, registry.get(call.function)) else { return Ok(()) };
        if let Err(e) = function.check_args(&call.args, &s) {
            let context = format!(
                "the plate-wide sample of {}: {} of {} plane(s) across {} well(s), variable components {}",
                plate_scope_text(&plate.metadata.channel_names, &group.scope),
                group.inputs.len(),
                group.available,
                group.wells,
                step.variable.iter().map(|c| c.to_string()).collect::<Vec<_>>().join(", ")
            );
            let entry = chain.label.as_ref().map(|l| format!("func map entry '{l}': ")).unwrap_or_default();
            return Err(match e {
                ArgError::Invalid { function, name, problem, fix, .. } => {
                    PipelineError::step(&step.name, format!("{entry}{function}: {}: {problem} ({context})", blamed(name.as_deref())), fix)
                }
                other => PipelineError::step(
                    &step.name,
                    format!("{entry}{other} ({context})"),
                    format!("`hcsflow functions {}` lists its arguments", call.function),
                ),
            });
        }
        shape = function.output_shape(&call.args, &s);
    }
    Ok(())
}

/// Whether a plate-wide result of scope `producer` serves a well's stack of
/// scope `consumer`: every component the producer fixed has the same value
/// in the consumer; components the producer varied over (it fitted across
/// them) or collapsed serve any value.
pub(crate) fn plate_covers(producer: &Key, consumer: &Key) -> bool {
    producer.iter().zip(consumer).all(|(&p, &c)| match Slot::of(p) {
        Slot::Variable | Slot::Collapsed => true,
        Slot::Value(v) => Slot::of(c) == Slot::Value(v),
    })
}

/// The plate values of a plate step's groups, for a message ("channel 1 (DAPI), channel 2 (GFP)").
pub(crate) fn covered_text(plate: &Plate, ps: &PlateStepPlan, group_by: Option<Component>) -> String {
    let produced = ps.groups.iter().filter(|g| g.action != Action::Skip);
    match group_by {
        Some(c) => describe_values(plate, c, &produced.map(|g| g.scope[c.index()]).collect()),
        None => produced.map(|g| plate_scope_text(&plate.metadata.channel_names, &g.scope)).collect::<Vec<_>>().join("; "),
    }
}

/// The rank of a plane in the sampling of `seed` (lowest ranks are sampled):
/// SplitMix64 over the seed, the well name and the plane's components, so it
/// depends on nothing else.
fn sample_rank(seed: u64, well: &str, key: &Key) -> u64 {
    fn mix(z: u64) -> u64 {
        let z = z.wrapping_add(0x9E37_79B9_7F4A_7C15);
        let z = (z ^ (z >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
        let z = (z ^ (z >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
        z ^ (z >> 31)
    }
    let mut h = mix(seed);
    for b in well.bytes() {
        h = mix(h ^ u64::from(b));
    }
    for &k in key {
        h = mix(h ^ u64::from(k));
    }
    h
}

/// 64-bit FNV-1a of the pipeline digest, the step name, the plane size and
/// every group's scope and sampled planes (well, components, file).
fn plate_digest(pipeline: &str, step: &str, groups: &[PlateGroupPlan], plane: (usize, usize)) -> String {
    let mut text = format!("{pipeline}\n{step}\n{}x{}\n", plane.0, plane.1);
    for g in groups {
        text.push_str(&format!("{:?} {:?}\n", g.scope, g.action));
        for p in &g.inputs {
            text.push_str(&format!("{} {:?} {}\n", p.well, p.key, p.path.display()));
        }
    }
    format!("{:016x}", fnv1a(text.as_bytes()))
}

/// 64-bit FNV-1a.
pub(crate) fn fnv1a(bytes: &[u8]) -> u64 {
    let mut h: u64 = 0xcbf2_9ce4_8422_2325;
    for &b in bytes {
        h ^= u64::from(b);
        h = h.wrapping_mul(0x0100_0000_01b3);
    }
    h
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::compile::COLLAPSED;

    #[test]
    fn a_plate_result_covers_stacks_of_its_fixed_components() {
        // Fitted across sites and z, for channel 1.
        let fit = [VARIABLE, 1, VARIABLE, 1];
        assert!(plate_covers(&fit, &[VARIABLE, 1, 2, 1]));
        assert!(plate_covers(&fit, &[3, 1, COLLAPSED, 1]));
        assert!(!plate_covers(&fit, &[VARIABLE, 2, 1, 1]), "another channel");
        assert!(!plate_covers(&fit, &[VARIABLE, VARIABLE, 1, 1]), "a stack of several channels");
    }

    #[test]
    fn ranks_depend_on_seed_well_and_plane_only() {
        let r = sample_rank(0, "A01", &[1, 1, 1, 1]);
        assert_eq!(r, sample_rank(0, "A01", &[1, 1, 1, 1]));
        assert_ne!(r, sample_rank(1, "A01", &[1, 1, 1, 1]));
        assert_ne!(r, sample_rank(0, "A02", &[1, 1, 1, 1]));
        assert_ne!(r, sample_rank(0, "A01", &[2, 1, 1, 1]));
    }
}
