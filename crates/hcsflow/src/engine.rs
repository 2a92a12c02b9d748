//! [`Engine`]: a set of functions and converters, and the calls a front end
//! makes with them: plan a pipeline run and execute it, or plan and run one
//! function on one stack.

use std::collections::BTreeSet;
use std::path::Path;
use std::sync::atomic::AtomicBool;
use std::sync::Arc;

use hcsflow_core::{
    CallContext, CallPlan, ConversionPolicy, Conversions, DTypePolicy, Device, DeviceChoice, MemoryType, Registry, Route, Stack, StackShape,
};
use hcsflow_pipeline::{CompileConfig, PipelineSpec, Plan, Progress, RunSummary};

use crate::device::DeviceOptions;
use crate::error::{Error, OptionsError};
use crate::options::RunOptions;

/// The functions a front end may call and the converters between their
/// memory types. [`Engine::builtin`] has every function of this build;
/// [`Engine::new`] takes any other set (e.g. with functions written in Python).
pub struct Engine {
    registry: Registry,
    conversions: Conversions,
}

/// Writes the QC report from what the run wrote: a failure to write it is a
/// write error of the run (in the summary), never a failed run.
fn write_qc_report(plan: &Plan, summary: &mut RunSummary) {
    if let Err(e) = hcsflow_report::write_report(&plan.out) {
        let message = format!("the QC report {}: {e}", plan.out.join(hcsflow_pipeline::REPORT_HTML_NAME).display());
        summary.report.write_errors.push(message.clone());
        summary.write_errors.push(message);
    }
}

/// The device-memory budget of the run of `plan`: the one asked, else the
/// largest binding of its adapters (the smallest of them, when the wells are
/// spread over several); none when nothing runs on a GPU.
fn gpu_memory(plan: &Plan, options: &RunOptions) -> Option<u64> {
    let gpus: BTreeSet<usize> = plan.wells.iter().filter_map(|w| w.gpu).collect();
    if gpus.is_empty() {
        return None;
    }
    options.gpu_memory.or_else(|| gpus.into_iter().filter_map(|n| crate::device::default_gpu_memory(Device::Gpu(n))).min())
}

/// One function call planned for a device ([`Engine::plan_call`]): host
/// memory in, the chosen implementation, host memory out.
#[derive(Debug, Clone)]
pub struct PreparedCall {
    /// The function, its arguments, implementation and the route into it.
    pub call: CallPlan,
    /// The route of the result back to host memory.
    pub back: Route,
    /// The device chosen, and why.
    pub device: DeviceChoice,
    /// Which copies the routes in and back may make.
    pub policy: ConversionPolicy,
}

impl Engine {
    /// An engine over `registry` and the converters between its memory types.
    pub fn new(registry: Registry, conversions: Conversions) -> Self {
        Engine { registry, conversions }
    }

    /// Every function this build has ([`crate::builtin`]).
    pub fn builtin() -> Self {
        let (registry, conversions) = crate::builtin();
        Engine { registry, conversions }
    }

    pub fn registry(&self) -> &Registry {
        &self.registry
    }

    pub fn conversions(&self) -> &Conversions {
        &self.conversions
    }

    /// Reads the pipeline file and plans it for the plate: [`Engine::plan_spec`]
    /// after [`PipelineSpec::read`]. Any problem with the file (missing, a
    /// folder, not UTF-8, bad TOML) is [`Error::Spec`], found before the plate
    /// is opened.
    pub fn plan(&self, plate: &Path, pipeline: &Path, out: &Path, options: &RunOptions) -> Result<Plan, Error> {
        let spec = PipelineSpec::read(pipeline).map_err(Error::Spec)?;
        self.plan_spec(plate, &spec, out, options)
    }

    /// Plans `spec` for the plate at `plate`, writing to `out`: checks the
    /// options, opens the plate, chooses the device, then compiles; with
    /// several GPU adapters (`gpu:0,1`) the wells are spread over them
    /// ([`Plan::spread_over_gpus`]). Nothing is
    /// read beyond the plate's metadata and nothing is written: every problem
    /// the plan can show (unknown function, bad argument, output folder inside
    /// the plate, missing images under [`MissingPolicy::Error`](hcsflow_pipeline::MissingPolicy::Error), …) is an
    /// error here, before any pixel.
    pub fn plan_spec(&self, plate: &Path, spec: &PipelineSpec, out: &Path, options: &RunOptions) -> Result<Plan, Error> {
        options.check()?;
        let plate =
            hcsflow_plate::open_plate(plate, options.format).map_err(|source| Error::Plate { path: plate.to_path_buf(), source })?;
        let choice = options.device.choose()?;
        let config = CompileConfig {
            device: choice.device,
            device_reason: choice.reason,
            policy: options.device.conversion_policy(),
            out: out.to_path_buf(),
            missing: options.missing,
            require_gpu: options.require_gpu,
        };
        let mut plan = hcsflow_pipeline::compile(&plate, spec, &self.registry, &self.conversions, &config)?;
        if choice.gpus.len() > 1 {
            // The adapters come from one `gpu:N,M` set, checked to exist: none twice, never empty.
            plan.spread_over_gpus(&choice.gpus).map_err(|e| Error::Options(OptionsError::Gpus(e)))?;
        }
        Ok(plan)
    }

    /// Runs a plan: wells in parallel (`options.workers`, within
    /// `options.max_memory`), each well isolated, outputs written atomically,
    /// resumable. `progress` hears of every well and step as it happens (from
    /// worker threads). Setting `cancel` stops starting wells; the wells in
    /// flight finish and the summary says which were not started.
    ///
    /// At the end it writes the QC report (`OUT/report.html`,
    /// `OUT/hcsflow_mqc.json`, [`hcsflow_report`]).
    ///
    /// A failing well is not an error here: it is in the summary
    /// ([`crate::run_problems`]). Errors are what stops the whole run before or
    /// while it starts (output folder locked or not writable, …).
    pub fn execute(
        &self,
        plan: &Plan,
        options: &RunOptions,
        cancel: Arc<AtomicBool>,
        progress: &(dyn Fn(Progress<'_>) + Sync),
    ) -> Result<RunSummary, Error> {
        let run = hcsflow_pipeline::RunOptions {
            workers: options.workers,
            max_memory: options.max_memory,
            resume: options.resume,
            cancel,
            zarr_format: options.zarr_format,
            overwrite: options.overwrite,
            shard: options.shard,
            gpu_memory: gpu_memory(plan, options),
            gpu_memory_firm: options.gpu_memory.is_some(),
        };
        let mut summary = hcsflow_pipeline::execute(plan, &self.registry, &self.conversions, &run, progress)?;
        // A shard writes no plate-level output: its finalize writes the report.
        if options.shard.is_none() {
            write_qc_report(plan, &mut summary);
        }
        Ok(summary)
    }

    /// The plate job of a sharded run ([`hcsflow_pipeline::prepare_shards`]):
    /// creates the OME-Zarr plates and runs the plate-wide steps once, so
    /// that the shards ([`RunOptions::shard`]) only re-read their results.
    /// A plan without plate-wide steps needs no plate job (it does no harm).
    pub fn prepare_shards(&self, plan: &Plan, options: &RunOptions, progress: &(dyn Fn(Progress<'_>) + Sync)) -> Result<(), Error> {
        let run = hcsflow_pipeline::RunOptions { zarr_format: options.zarr_format, overwrite: options.overwrite, ..Default::default() };
        Ok(hcsflow_pipeline::prepare_shards(plan, &self.registry, &self.conversions, &run, progress)?)
    }

    /// Merges the shards of `plan`'s run into one output
    /// ([`hcsflow_pipeline::finalize`]: `run_manifest.json`, summaries,
    /// tables, OME-Zarr plate metadata, run report) and writes the QC report.
    /// Shards that did not run or did not complete are in
    /// [`RunSummary::shard_problems`] and [`crate::run_problems`]; an error is
    /// what stops it before it writes (a shard still running, another run's files).
    pub fn finalize(&self, plan: &Plan, options: &RunOptions) -> Result<RunSummary, Error> {
        let run = hcsflow_pipeline::RunOptions { workers: options.workers, zarr_format: options.zarr_format, ..Default::default() };
        let mut summary = hcsflow_pipeline::finalize(plan, &run)?;
        write_qc_report(plan, &mut summary);
        Ok(summary)
    }

    /// Plans one call of `function` with `args` (`name=value` texts) on a
    /// stack in host memory, for the device `device` chooses: the function and
    /// its arguments are checked ([`Error::Call`], [`Error::Arg`]), the device
    /// chosen ([`Error::Device`]), and the routes in and back to the host
    /// planned ([`Error::Route`]). Nothing is run.
    pub fn plan_call(&self, function: &str, args: &[String], device: &DeviceOptions) -> Result<PreparedCall, Error> {
        let parsed = self.registry.get(function)?.parse_args(args)?;
        let choice = device.choose()?;
        let policy = device.conversion_policy();
        let call = self.registry.plan_call(function, parsed, MemoryType::Host, choice.device, &self.conversions, policy)?;
        let back = self
            .conversions
            .plan(call.implementation.memory_out, MemoryType::Host, choice.device.runtime(), policy)
            .map_err(Error::Route)?;
        Ok(PreparedCall { call, back, device: choice, policy })
    }

    /// Checks the call's arguments against an input of `shape` (e.g. a filter
    /// size larger than the plane), before any pixel is read.
    pub fn check_call(&self, call: &PreparedCall, shape: &StackShape) -> Result<(), Error> {
        Ok(self.registry.check_call(&call.call, shape)?)
    }

    /// Runs a planned call on `input`: the upload (if any), the function, the
    /// download, then `dtype` against the input's dtype. The result is a stack
    /// in host memory.
    ///
    /// ```
    /// use hcsflow::core::{DTypePolicy, Stack};
    ///
    /// let engine = hcsflow::Engine::builtin();
    /// let call = engine.plan_call("max_projection", &[], &hcsflow::DeviceOptions::cpu())?;
    /// let planes = ndarray::Array3::from_shape_fn((3, 4, 5), |(z, y, x)| (z * 100 + y * 10 + x) as u16);
    /// let out = engine.run_call(&call, Stack::from(planes), DTypePolicy::default())?;
    /// assert_eq!(out.shape(), [1, 4, 5]);
    /// # Ok::<(), hcsflow::Error>(())
    /// ```
    pub fn run_call(&self, call: &PreparedCall, input: Stack, dtype: DTypePolicy) -> Result<Stack, Error> {
        let input_dtype = input.dtype();
        let policy = call.policy;
        let stack = self.registry.run_to_host(&call.call, input, &self.conversions, policy, &mut CallContext::default())?;
        Ok(stack.apply_policy(input_dtype, dtype))
    }
}
