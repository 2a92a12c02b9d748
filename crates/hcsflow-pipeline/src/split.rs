//! A stack's chain on a GPU within a device-memory budget (`--gpu-memory`):
//! calls whose working set fits run whole; a stack too large runs in chunks
//! of planes where its functions allow it ([`ZSplit`]); otherwise the well
//! fails with the sizes. Never a silent CPU fallback: every chunk runs on the
//! call's device.
//!
//! - Before a GPU call, its working set on the stack it gets
//!   ([`CallPlan::working_set`]: input as stored, output, declared scratch) is
//!   compared with the budget. Over it, the call and the splittable calls
//!   after it on the same device (per-plane ones, then at most one reduction
//!   that combines) form a *segment* run chunk by chunk, in the largest
//!   chunks for which every call of the segment fits. Per-plane results are
//!   concatenated; a reduction's chunk results (one plane each) are
//!   concatenated and the reduction runs again on them (itself split if they
//!   are still too large).
//! - A call (or chunk) that fails for lack of device memory
//!   ([`FunctionError::DeviceOutOfMemory`], [`FunctionError::TooLarge`]) is
//!   retried in chunks of half the planes, down to one plane.
//! - A call that cannot split (whole-stack functions, functions with
//!   artifacts), a plane that alone is over the budget, or one plane still out
//!   of memory fails the well with a [`DeviceMemoryError`]: the function, the
//!   bytes asked, the budget and the largest chunk tried.
//!
//! Chunks are cut from the stack in host memory (a stack already on the
//! device is brought back first) and each chunk's result comes back to the
//! host, where the results are concatenated: every copy goes through the
//! conversions, so the transfers in the report count them. Each split is
//! recorded ([`GpuSplit`]) for the run report.

use std::fmt;

use hcsflow_core::{
    Array, CallContext, CallPlan, Contract, ConversionPolicy, Conversions, DType, Device, FunctionError, Registry, RouteKind, Stack,
    StackShape, Table, ZSplit,
};
use serde::{Deserialize, Serialize};

use crate::compile::Key;

/// One stack of a step that ran in chunks on the GPU, for the run report.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct GpuSplit {
    /// The stack (its first input plane, as failures name it).
    pub stack: String,
    /// The calls run chunk by chunk, in order; a reduction that combines
    /// comes last.
    pub functions: Vec<String>,
    /// Planes of the stack the segment received.
    pub planes: usize,
    /// Chunks it ran in.
    pub chunks: usize,
    /// Planes per chunk (the last one may have fewer).
    pub chunk_planes: usize,
    /// Why: the working set over the budget, or the device out of memory
    /// (and each halving).
    pub reason: String,
}

/// A stack that does not fit the device's memory however the executor cuts it.
#[derive(Debug, thiserror::Error)]
#[error(
    "{function} needs {} of GPU memory for {shape} (input, output and scratch){}; {why}{}; fix: a larger --gpu-memory (up to the \
     device's memory), smaller stacks (more variable components), or device = \"cpu\" for the step",
    bytes_text(*asked),
    budget.map(|b| format!(", over the budget of {} (--gpu-memory)", bytes_text(b))).unwrap_or_default(),
    largest_chunk.map(|n| format!("; largest chunk tried: {n} plane{}", if n == 1 { "" } else { "s" })).unwrap_or_else(|| "; no chunk tried".into())
)]
pub struct DeviceMemoryError {
    pub function: String,
    /// The stack the call received.
    pub shape: StackShape,
    /// Bytes the call's working set needs on the whole stack.
    pub asked: u64,
    /// The budget (`None`: none was set, the device itself ran out).
    pub budget: Option<u64>,
    /// Planes of the largest chunk tried, if any.
    pub largest_chunk: Option<usize>,
    pub why: NoFit,
}

/// Why a [`DeviceMemoryError`]'s stack could not be run in chunks.
#[derive(Debug, thiserror::Error)]
pub enum NoFit {
    /// The function does not allow chunks.
    #[error("{function} cannot run in chunks of planes: {reason}")]
    CannotSplit { function: String, reason: String },
    /// One plane (or, for a reduction combining, two) is over the budget.
    #[error("a chunk of {planes} plane{} already needs {}", if *planes == 1 { "" } else { "s" }, bytes_text(*needs))]
    ChunkTooLarge { planes: usize, needs: u64 },
    /// The device ran out of memory on the smallest chunk.
    #[error("the device ran out of memory: {source}")]
    OutOfMemory { source: FunctionError },
}

/// `n` bytes for people: "64.0 KiB", "1.5 GiB" (binary units, like `--gpu-memory`).
pub fn bytes_text(n: u64) -> String {
    const UNITS: [&str; 4] = ["KiB", "MiB", "GiB", "TiB"];
    if n < 1024 {
        return format!("{n} bytes");
    }
    let mut v = n as f64 / 1024.0;
    let mut unit = 0;
    while v >= 1024.0 && unit + 1 < UNITS.len() {
        v /= 1024.0;
        unit += 1;
    }
    format!("{v:.1} {}", UNITS[unit])
}

/// Why `call` cannot run in chunks (it has no [`ZSplit`]).
fn cannot_split(call: &CallPlan) -> String {
    if !call.artifacts.produces.is_empty() || !call.artifacts.consumes.is_empty() {
        return "it produces or consumes tables, which are not merged chunk by chunk".into();
    }
    match call.contract {
        Contract::Pure3d => "it is pure_3d (it sees the whole stack)".into(),
        Contract::Flexible => "it is flexible and runs on the whole stack (slice_by_slice = false)".into(),
        Contract::VolumetricToSlice => "it reduces the whole stack and its result cannot be combined from chunks".into(),
        Contract::Pure2d => "it has no way to split".into(),
    }
}

/// True if `e` says the device had no memory for what the call asked.
fn out_of_device_memory(e: &FunctionError) -> bool {
    matches!(e, FunctionError::DeviceOutOfMemory { .. } | FunctionError::TooLarge { .. })
}

/// The `[Z, Y, X]` shape of `array` (a chain's arrays are stacks).
fn shape_of(array: &Array) -> StackShape {
    match array.shape() {
        [z, y, x] => StackShape::new(*z, *y, *x),
        other => StackShape::new(other.first().copied().unwrap_or(0), 0, 0),
    }
}

/// Why a chain failed: a function's error, or a stack that does not fit.
#[derive(Debug)]
pub(crate) enum ChainError {
    Function(FunctionError),
    Memory(Box<DeviceMemoryError>),
    /// Plan and data disagree (what the text says).
    Failed(String),
}

impl From<FunctionError> for ChainError {
    fn from(e: FunctionError) -> Self {
        ChainError::Function(e)
    }
}

/// The context of call `index` of the chain on a stack whose planes have
/// `keys` (built by the executor: metadata and consumed artifacts).
pub(crate) type ContextFor<'a> = dyn Fn(usize, &[Key]) -> Result<CallContext, ChainError> + 'a;

/// One stack's chain, run within the budget.
pub(crate) struct ChainRun<'a> {
    pub(crate) registry: &'a Registry,
    pub(crate) conversions: &'a Conversions,
    /// Device-memory budget of a GPU call's working set; `None`: no budget
    /// (calls still split when the device runs out of memory).
    pub(crate) budget: Option<u64>,
    /// Whether the budget was asked for ([`crate::RunOptions::gpu_memory_firm`]).
    pub(crate) firm: bool,
    /// The stack, as reports name it.
    pub(crate) at: String,
    /// Artifacts produced, with the keys of the planes of the call that made them.
    pub(crate) made: Vec<(String, Table, Vec<Key>)>,
    pub(crate) notes: Vec<String>,
    pub(crate) splits: Vec<GpuSplit>,
    /// Running chunks (their notes are kept once).
    pub(crate) chunking: bool,
}

/// A segment of calls run chunk by chunk: `calls[start..end]`.
struct Segment {
    start: usize,
    end: usize,
    /// Its last call is a reduction that combines.
    combines: bool,
}

impl ChainRun<'_> {
    /// Runs `calls` on `array`. `keys_of(i)` are the keys of the planes call
    /// `i` receives in a whole run.
    pub(crate) fn run(
        &mut self,
        calls: &[CallPlan],
        mut array: Array,
        keys_of: &dyn Fn(usize) -> Vec<Key>,
        context: &ContextFor<'_>,
    ) -> Result<Array, ChainError> {
        let mut i = 0;
        // The keys of a reduction's chunk results, when it runs again on them.
        let mut partial_keys: Option<Vec<Key>> = None;
        while i < calls.len() {
            let call = &calls[i];
            let keys = partial_keys.take().unwrap_or_else(|| keys_of(i));
            let shape = shape_of(&array);
            let on_gpu = matches!(call.device, Device::Gpu(_));
            if let (true, Some(budget)) = (on_gpu, self.budget) {
                let asked = self.working_set(call, &shape, array.dtype());
                if asked > budget {
                    let fail = |largest_chunk, why| DeviceMemoryError {
                        function: call.function.to_string(),
                        shape,
                        asked,
                        budget: Some(budget),
                        largest_chunk,
                        why,
                    };
                    let segment = self.segment(calls, i);
                    let min = if segment.combines && segment.end - segment.start == 1 { 2 } else { 1 };
                    let chunk = match call.z_split {
                        None => None,
                        Some(_) => self.largest_chunk(calls, &segment, &shape, array.dtype(), budget).filter(|&k| k >= min),
                    };
                    // No chunk fits: a budget asked for fails the stack here;
                    // a default one (a guess at what the device holds) lets
                    // the call run whole, to fail only if the device does.
                    let chunk = match chunk {
                        Some(chunk) => chunk,
                        None if !self.firm => 0,
                        None if call.z_split.is_none() => {
                            let why = NoFit::CannotSplit { function: call.function.to_string(), reason: cannot_split(call) };
                            return Err(ChainError::Memory(Box::new(fail(None, why))));
                        }
                        None => {
                            let needs = self.chunk_needs(calls, &segment, &shape, array.dtype(), min);
                            return Err(ChainError::Memory(Box::new(fail(Some(min), NoFit::ChunkTooLarge { planes: min, needs }))));
                        }
                    };
                    if chunk > 0 {
                        let reason = format!(
                            "{} needs {} on {shape}, over the budget of {}; chunks of {chunk} plane{} fit",
                            call.function,
                            bytes_text(asked),
                            bytes_text(budget),
                            if chunk == 1 { "" } else { "s" }
                        );
                        let (out, next_keys) = self.run_chunks(calls, &segment, array, &keys, chunk, reason, asked, context)?;
                        array = out;
                        i = self.after(&segment, next_keys, &mut partial_keys);
                        continue;
                    }
                }
            }
            // Whole. A GPU call that may split is given its input on the
            // device and keeps a handle to it (no copy), to retry in chunks
            // if the device runs out of memory.
            let retain = on_gpu && call.z_split.is_some() && shape.depth > 1;
            let (result, retained) = self.call_retaining(calls, i, array, &keys, context, retain);
            match result {
                Ok(out) => {
                    array = out;
                    i += 1;
                }
                Err(ChainError::Function(e)) if out_of_device_memory(&e) && retained.is_some() => {
                    let Some(input) = retained else { return Err(ChainError::Function(e)) };
                    let segment = self.segment(calls, i);
                    let chunk = shape.depth / 2;
                    if segment.combines && segment.end - segment.start == 1 && chunk < 2 {
                        return Err(ChainError::Function(e));
                    }
                    let asked = self.working_set(call, &shape, input.dtype());
                    let reason = format!("{} ran out of device memory on {shape} ({e}); retried in chunks of {chunk}", call.function);
                    let (out, next_keys) = self.run_chunks(calls, &segment, input, &keys, chunk, reason, asked, context)?;
                    array = out;
                    i = self.after(&segment, next_keys, &mut partial_keys);
                }
                Err(e) => return Err(e),
            }
        }
        Ok(array)
    }

    /// The call index after a chunked `segment`: its reduction again (on the
    /// chunk results, whose keys are `next_keys`), or the call after it.
    fn after(&self, segment: &Segment, next_keys: Vec<Key>, partial_keys: &mut Option<Vec<Key>>) -> usize {
        if segment.combines {
            *partial_keys = Some(next_keys);
            segment.end - 1
        } else {
            segment.end
        }
    }

    /// The working set of `call` on `shape` of `dtype` ([`CallPlan::working_set`]
    /// with the function's output shape).
    fn working_set(&self, call: &CallPlan, shape: &StackShape, dtype: DType) -> u64 {
        call.working_set(shape, dtype, &self.output_shape(call, shape))
    }

    /// The shape `call` returns on `shape`: the function's rule, else one
    /// plane for a reduction and the input's shape for the rest.
    fn output_shape(&self, call: &CallPlan, shape: &StackShape) -> StackShape {
        let declared = self.registry.get(call.function).ok().and_then(|f| f.output_shape(&call.args, shape));
        declared.unwrap_or(if call.contract == Contract::VolumetricToSlice { shape.with_depth(1) } else { *shape })
    }

    /// The calls from `start` that can run chunk by chunk together: on the
    /// same device, splitting by planes, and at most one reduction that
    /// combines, last. `calls[start]` splits.
    fn segment(&self, calls: &[CallPlan], start: usize) -> Segment {
        let device = calls[start].device;
        let mut end = start;
        let mut combines = false;
        while end < calls.len() && calls[end].device == device {
            match calls[end].z_split {
                Some(ZSplit::Planes) => end += 1,
                Some(ZSplit::Combine) => {
                    end += 1;
                    combines = true;
                    break;
                }
                None => break,
            }
        }
        Segment { start, end: end.max(start + 1), combines }
    }

    /// The largest working set of the segment's calls on a chunk of `planes`
    /// planes of a stack shaped `shape` (calls after the first get f32 input,
    /// the widest dtype, since their input dtype is only known at run time).
    fn chunk_needs(&self, calls: &[CallPlan], segment: &Segment, shape: &StackShape, dtype: DType, planes: usize) -> u64 {
        let mut input = shape.with_depth(planes);
        let mut dtype = dtype;
        let mut needs = 0;
        for call in &calls[segment.start..segment.end] {
            let output = self.output_shape(call, &input);
            needs = needs.max(call.working_set(&input, dtype, &output));
            input = output;
            dtype = DType::F32;
        }
        needs
    }

    /// The most planes per chunk for which every call of the segment fits
    /// the budget (working sets grow with the planes), if one plane does.
    fn largest_chunk(&self, calls: &[CallPlan], segment: &Segment, shape: &StackShape, dtype: DType, budget: u64) -> Option<usize> {
        let fits = |k: usize| self.chunk_needs(calls, segment, shape, dtype, k) <= budget;
        if shape.depth == 0 || !fits(1) {
            return None;
        }
        // Binary search for the last k that fits in 1..=depth.
        let (mut lo, mut hi) = (1, shape.depth);
        while lo < hi {
            let mid = lo + (hi - lo).div_ceil(2);
            if fits(mid) {
                lo = mid;
            } else {
                hi = mid - 1;
            }
        }
        Some(lo)
    }

    /// Runs the segment on `input` in chunks of `chunk` planes, halving the
    /// chunk when the device runs out of memory. Returns the chunks' results
    /// concatenated on the host, and the keys of their planes.
    #[allow(clippy::too_many_arguments)]
    fn run_chunks(
        &mut self,
        calls: &[CallPlan],
        segment: &Segment,
        input: Array,
        keys: &[Key],
        mut chunk: usize,
        mut reason: String,
        asked: u64,
        context: &ContextFor<'_>,
    ) -> Result<(Array, Vec<Key>), ChainError> {
        let first = &calls[segment.start];
        let shape = shape_of(&input);
        let stack = self.conversions.to_host_stack(input, ConversionPolicy::default()).map_err(FunctionError::from)?;
        let n = stack.depth();
        let min = if segment.combines && segment.end - segment.start == 1 { 2 } else { 1 };
        let largest = chunk;
        let mut parts: Vec<Stack> = Vec::new();
        let mut part_keys: Vec<Key> = Vec::new();
        let mut start = 0;
        let mut chunks = 0;
        self.chunking = true;
        while start < n {
            let len = chunk.min(n - start);
            let chunk_keys: Vec<Key> = if keys.len() == n { keys[start..start + len].to_vec() } else { keys.to_vec() };
            let mut result = Ok(Array::from(stack.planes_range(start..start + len)));
            for i in segment.start..segment.end {
                let keys_i: Vec<Key> = if i > segment.start && calls[i - 1].contract == Contract::VolumetricToSlice {
                    chunk_keys.iter().take(1).copied().collect()
                } else {
                    chunk_keys.clone()
                };
                result = result.and_then(|array| self.call(calls, i, array, &keys_i, context));
            }
            match result {
                Ok(array) => {
                    let host = self.conversions.to_host_stack(array, ConversionPolicy::default()).map_err(FunctionError::from)?;
                    parts.push(host);
                    part_keys.push(chunk_keys.first().copied().unwrap_or_default());
                    start += len;
                    chunks += 1;
                }
                Err(ChainError::Function(e)) if out_of_device_memory(&e) => {
                    if len / 2 < min {
                        return Err(ChainError::Memory(Box::new(DeviceMemoryError {
                            function: first.function.to_string(),
                            shape,
                            asked,
                            budget: self.budget,
                            largest_chunk: Some(largest),
                            why: NoFit::OutOfMemory { source: e },
                        })));
                    }
                    chunk = len / 2;
                    reason.push_str(&format!("; out of device memory on {len} planes, halved to {chunk}"));
                }
                Err(e) => return Err(e),
            }
        }
        self.chunking = false;
        let out = Stack::concat_owned(parts)
            .ok_or_else(|| ChainError::Failed(format!("stack at {}: the chunks' results differ in size or dtype", self.at)))?;
        self.splits.push(GpuSplit {
            stack: self.at.clone(),
            functions: calls[segment.start..segment.end].iter().map(|c| c.function.to_string()).collect(),
            planes: n,
            chunks,
            chunk_planes: chunk,
            reason,
        });
        let next_keys = if segment.combines { part_keys } else { keys.to_vec() };
        Ok((Array::from(out), next_keys))
    }

    /// `array` in the memory `call`'s implementation takes (an upload, in a
    /// `conversion` span like the one a call makes).
    fn to_device(&self, call: &CallPlan, array: Array) -> Result<Array, FunctionError> {
        let route = self.conversions.plan(
            array.memory_type(),
            call.implementation.memory_in,
            call.device.runtime(),
            ConversionPolicy::default(),
        )?;
        if route.kind == RouteKind::Identity {
            return Ok(array);
        }
        Ok(tracing::info_span!("conversion", route = %route).in_scope(|| self.conversions.execute(&route, array, call.device))?)
    }

    /// Runs call `i` on `array` (whole), with its context for `keys`; an
    /// input in another memory type than planned (the host, after chunks)
    /// takes the route from there.
    fn call(&mut self, calls: &[CallPlan], i: usize, array: Array, keys: &[Key], context: &ContextFor<'_>) -> Result<Array, ChainError> {
        self.call_retaining(calls, i, array, keys, context, false).0
    }

    /// [`Self::call`]; with `retain`, the input is first brought to the
    /// call's device and a handle to it returned with the result (to run it
    /// again in chunks).
    fn call_retaining(
        &mut self,
        calls: &[CallPlan],
        i: usize,
        array: Array,
        keys: &[Key],
        context: &ContextFor<'_>,
        retain: bool,
    ) -> (Result<Array, ChainError>, Option<Array>) {
        let planned = &calls[i];
        // The conversion into the call (`route_in`, e.g. an upload) is a
        // "conversion" span inside this one.
        let _in_call =
            tracing::info_span!("call", function = %planned.function, device = %planned.device, route_in = %planned.route_in).entered();
        let (array, retained) = if retain {
            match self.to_device(planned, array) {
                Ok(on_device) => (on_device.clone(), Some(on_device)),
                Err(e) => return (Err(e.into()), None),
            }
        } else {
            (array, None)
        };
        (self.run_call(planned, i, array, keys, context), retained)
    }

    /// Runs `planned` (call `i`) on `array`, planning the route in again if
    /// `array` is not where it was planned to arrive.
    fn run_call(
        &mut self,
        planned: &CallPlan,
        i: usize,
        array: Array,
        keys: &[Key],
        context: &ContextFor<'_>,
    ) -> Result<Array, ChainError> {
        let mut ctx = context(i, keys)?;
        let replanned;
        let call = if array.memory_type() == planned.route_in.source {
            planned
        } else {
            let route_in = self
                .conversions
                .plan(array.memory_type(), planned.implementation.memory_in, planned.device.runtime(), ConversionPolicy::default())
                .map_err(FunctionError::from)?;
            replanned = CallPlan { route_in, ..planned.clone() };
            &replanned
        };
        let out = self.registry.execute_in(call, array, self.conversions, &mut ctx)?;
        let (outputs, notes) = ctx.take_results();
        self.made.extend(outputs.into_iter().map(|(name, table)| (name, table, keys.to_vec())));
        for note in notes {
            // Chunks of one stack say the same things once.
            if !(self.chunking && self.notes.contains(&note)) {
                self.notes.push(note);
            }
        }
        Ok(out)
    }
}

impl fmt::Display for GpuSplit {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(
            f,
            "{}: {} on {} planes in {} chunks of {} ({})",
            self.stack,
            self.functions.join(" → "),
            self.planes,
            self.chunks,
            self.chunk_planes,
            self.reason
        )
    }
}

#[cfg(test)]
mod tests {
    use std::any::Any;
    use std::sync::Arc;

    use hcsflow_core::convert::Converter;
    use hcsflow_core::{ConversionError, DeviceBuffer, FunctionDecl, MemoryType, NoArgs, StackInfo};

    use super::*;

    /// A stack "on gpu:0": wgpu memory held on the host, so that the
    /// executor's splitting is tested without a device.
    #[derive(Debug)]
    struct FakeBuffer(Stack, Vec<usize>);

    fn fake(stack: Stack) -> Array {
        let shape = stack.shape().to_vec();
        Array::Device(Arc::new(FakeBuffer(stack, shape)))
    }

    impl DeviceBuffer for FakeBuffer {
        fn memory_type(&self) -> MemoryType {
            MemoryType::Wgpu
        }
        fn device(&self) -> Device {
            Device::Gpu(0)
        }
        fn shape(&self) -> &[usize] {
            &self.1
        }
        fn dtype(&self) -> DType {
            self.0.dtype()
        }
        fn as_any(&self) -> &dyn Any {
            self
        }
    }

    struct Up;
    struct Down;
    impl Converter for Up {
        fn convert(&self, array: Array, _: Device) -> Result<Array, ConversionError> {
            Ok(fake(array.into_host_stack().unwrap()))
        }
    }
    impl Converter for Down {
        fn convert(&self, array: Array, _: Device) -> Result<Array, ConversionError> {
            let Array::Device(b) = array else { unreachable!() };
            Ok(Array::from(b.as_any().downcast_ref::<FakeBuffer>().unwrap().0.clone()))
        }
    }

    fn on_device(array: &Array) -> Stack {
        let Array::Device(b) = array else { panic!("not on the device") };
        b.as_any().downcast_ref::<FakeBuffer>().unwrap().0.clone()
    }

    /// +1 per plane; out of device memory on more than 4 planes.
    static ADD_ONE: FunctionDecl<NoArgs> = FunctionDecl::new("add_one", Contract::Pure2d, "x");
    /// Whole-stack; asks 1 MiB of scratch.
    static WHOLE: FunctionDecl<NoArgs> = FunctionDecl::new("whole", Contract::Pure3d, "x");

    fn engine() -> (Registry, Conversions) {
        let mut registry = Registry::new();
        registry.add(ADD_ONE.device(MemoryType::Wgpu, |a, _, _| {
            let s = on_device(&a);
            if s.depth() > 4 {
                return Err(FunctionError::out_of_memory("add_one", format!("{} planes", s.depth())));
            }
            let out = Stack::from_f32_array(s.to_f32().mapv(|v| v + 1.0), s.dtype());
            Ok(fake(out))
        }));
        registry.add(WHOLE.device(MemoryType::Wgpu, |a, _, _| Ok(a)).with_scratch(|_, _| 1 << 20));
        let mut conversions = Conversions::default();
        conversions.register(MemoryType::Host, MemoryType::Wgpu, Arc::new(Up));
        conversions.register(MemoryType::Wgpu, MemoryType::Host, Arc::new(Down));
        (registry, conversions)
    }

    fn run(name: &str, budget: Option<u64>, depth: usize) -> (Result<Stack, ChainError>, Vec<GpuSplit>) {
        run_with(name, budget, true, depth)
    }

    /// `firm`: the budget was asked for (else it is the adapter's default).
    fn run_with(name: &str, budget: Option<u64>, firm: bool, depth: usize) -> (Result<Stack, ChainError>, Vec<GpuSplit>) {
        let (registry, conversions) = engine();
        let args = registry.get(name).unwrap().validate_args(vec![]).unwrap();
        let call = registry.plan_call(name, args, MemoryType::Host, Device::Gpu(0), &conversions, ConversionPolicy::default()).unwrap();
        let mut run = ChainRun {
            registry: &registry,
            conversions: &conversions,
            budget,
            firm,
            at: "A01".into(),
            made: Vec::new(),
            notes: Vec::new(),
            splits: Vec::new(),
            chunking: false,
        };
        let stack = Stack::from_vec([depth, 2, 3], (0..depth as u16 * 6).collect()).unwrap();
        let keys = vec![[0u32; 4]; depth];
        let context = |_: usize, keys: &[Key]| {
            Ok(CallContext::new(StackInfo { planes: vec![Default::default(); keys.len()], ..Default::default() }, Default::default()))
        };
        let out = run
            .run(&[call], Array::from(stack), &|_| keys.clone(), &context)
            .map(|a| conversions.to_host_stack(a, ConversionPolicy::default()).unwrap());
        (out, run.splits)
    }

    #[test]
    fn out_of_device_memory_halves_the_chunk_until_it_fits() {
        let (out, splits) = run("add_one", None, 16);
        let out = out.unwrap_or_else(|e| panic!("{e:?}"));
        assert_eq!(out, Stack::from_vec([16, 2, 3], (1..=96u16).collect()).unwrap(), "every plane once, in order");
        assert_eq!(splits.iter().map(|s| (s.planes, s.chunks, s.chunk_planes)).collect::<Vec<_>>(), [(16, 4, 4)]);
        assert!(splits[0].reason.starts_with("add_one ran out of device memory on 16 planes of 2×3 pixels"), "{}", splits[0].reason);
        assert!(
            splits[0].reason.ends_with("retried in chunks of 8; out of device memory on 8 planes, halved to 4"),
            "{}",
            splits[0].reason
        );
    }

    #[test]
    fn a_whole_stack_function_over_the_budget_fails_with_the_sizes() {
        let (out, splits) = run("whole", Some(1 << 20), 4);
        let Err(ChainError::Memory(e)) = out else { panic!("expected a memory error") };
        assert_eq!((e.asked, e.budget, e.largest_chunk), (4 * 12 + 4 * 24 + (1 << 20), Some(1 << 20), None));
        assert!(matches!(e.why, NoFit::CannotSplit { .. }), "{e}");
        assert!(e.to_string().starts_with("whole needs 1.0 MiB of GPU memory for 4 planes of 2×3 pixels"), "{e}");
        assert!(splits.is_empty());
    }

    #[test]
    fn over_a_default_budget_what_cannot_split_runs_whole() {
        // The adapter's default budget is a guess at what the device holds:
        // the call runs whole (here it fits the device), unsplit.
        let (out, splits) = run_with("whole", Some(1 << 20), false, 4);
        assert_eq!(out.unwrap().depth(), 4);
        assert!(splits.is_empty());
    }

    #[test]
    fn chunks_the_estimate_allows_are_halved_when_the_device_runs_out_of_memory() {
        // 36 bytes a plane (12 in, 24 out): the budget allows 8 planes, the
        // fake device takes 4.
        let (out, splits) = run("add_one", Some(8 * 36), 12);
        assert!(out.is_ok(), "{:?}", out.err());
        assert_eq!(splits.iter().map(|s| (s.chunks, s.chunk_planes)).collect::<Vec<_>>(), [(3, 4)]);
        assert!(splits[0].reason.contains("chunks of 8 planes fit; out of device memory on 8 planes, halved to 4"), "{}", splits[0].reason);
    }

    #[test]
    fn sizes_read_as_binary_units() {
        assert_eq!(bytes_text(1000), "1000 bytes");
        assert_eq!(bytes_text(64 << 10), "64.0 KiB");
        assert_eq!(bytes_text(3 << 29), "1.5 GiB");
    }
}
