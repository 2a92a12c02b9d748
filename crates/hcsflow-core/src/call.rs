//! One call of a registered function on a host stack, outside a pipeline:
//! plan it, run it, bring the result back to host memory. What `hcsflow
//! apply`, benchmarks, tests and a Python front end do around one function.

use crate::{
    Args, Array, CallContext, CallPlan, ConversionError, ConversionPolicy, Conversions, Device, FunctionError, MemoryType, PlanError,
    Registry, Stack,
};

/// Why [`Registry::call`] or [`Registry::run_to_host`] failed, by phase.
#[derive(Debug, thiserror::Error)]
pub enum CallError {
    /// The call could not be planned: unknown function, no implementation
    /// for the device, bad arguments, or no route for the input.
    #[error(transparent)]
    Plan(#[from] PlanError),
    /// The function failed (or the conversion into it, or its argument check
    /// against the stack's shape).
    #[error(transparent)]
    Function(#[from] FunctionError),
    /// The result could not be brought back to host memory as a stack.
    #[error("{function}: bringing the result back to the host: {error}")]
    ToHost { function: String, error: ConversionError },
}

impl Registry {
    /// Runs `name` with `args` on `stack` on `device` and returns the result
    /// in host memory: [`Registry::plan_call`] for input arriving in host
    /// memory, [`Registry::execute`] (which checks the arguments against the
    /// stack's shape), then the route from the implementation's output memory
    /// back to the host. `policy` governs both routes.
    pub fn call(
        &self,
        name: &str,
        args: Args,
        stack: Stack,
        device: Device,
        conversions: &Conversions,
        policy: ConversionPolicy,
    ) -> Result<Stack, CallError> {
        let plan = self.plan_call(name, args, MemoryType::Host, device, conversions, policy)?;
        self.run_to_host(&plan, stack, conversions, policy, &mut CallContext::default())
    }

    /// Runs an already planned call (input in host memory) on `stack` in
    /// `context` ([`Registry::execute_in`]: metadata and artifacts live
    /// there) and returns its result in host memory (the route back allowed
    /// by `policy`).
    pub fn run_to_host(
        &self,
        plan: &CallPlan,
        stack: Stack,
        conversions: &Conversions,
        policy: ConversionPolicy,
        context: &mut CallContext,
    ) -> Result<Stack, CallError> {
        let out = self.execute_in(plan, Array::from(stack), conversions, context)?;
        conversions.to_host_stack(out, policy).map_err(|error| CallError::ToHost { function: plan.function.to_string(), error })
    }
}

impl Conversions {
    /// `array` as a stack in host memory: the route from its memory type to
    /// the host allowed by `policy` (none for a host array), run. An array
    /// that is not 3D is an error too.
    pub fn to_host_stack(&self, array: Array, policy: ConversionPolicy) -> Result<Stack, ConversionError> {
        let route = self.plan(array.memory_type(), MemoryType::Host, array.device().runtime(), policy)?;
        let host = self.execute(&route, array, Device::Cpu)?;
        let shape = host.shape().to_vec();
        host.into_host_stack().ok_or_else(|| ConversionError {
            from: MemoryType::Host,
            to: MemoryType::Host,
            method: "as a stack".into(),
            reason: format!("the array has shape {shape:?}, not [depth, height, width]"),
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::{Contract, FunctionSpec, Implementation};

    fn registry() -> Registry {
        let mut r = Registry::new();
        let spec = FunctionSpec { name: "double", contract: Contract::Pure2d, args: vec![], doc: "x2" };
        r.register(spec, Implementation::host(|s, _, _| Ok(Stack::from_f32_array(s.to_f32().mapv(|v| v * 2.0), s.dtype()))));
        let spec = FunctionSpec { name: "refuse", contract: Contract::Pure2d, args: vec![], doc: "fails" };
        r.register(spec, Implementation::host(|_, _, _| Err(FunctionError::failed("refuse", "no"))));
        r
    }

    #[test]
    fn a_host_call_returns_the_result_on_the_host() {
        let (r, conv) = (registry(), Conversions::default());
        let s = Stack::from_f32_array(ndarray::Array3::from_elem((2, 3, 4), 5.0), crate::DType::U16);
        let args = r.get("double").unwrap().validate_args(vec![]).unwrap();
        let out = r.call("double", args, s, Device::Cpu, &conv, ConversionPolicy::default()).unwrap();
        assert_eq!(out.shape(), [2, 3, 4]);
        assert!(out.to_f32().iter().all(|&v| v == 10.0));
    }

    #[test]
    fn each_phase_keeps_its_error_type() {
        let (r, conv) = (registry(), Conversions::default());
        let s = Stack::zeros(crate::DType::U8, [1, 2, 2]);
        let err = r.call("doubel", Args::default(), s.clone(), Device::Cpu, &conv, ConversionPolicy::default()).unwrap_err();
        assert!(matches!(&err, CallError::Plan(PlanError::UnknownFunction { suggestion: Some(s), .. }) if s == "double"), "{err}");
        let err = r.call("refuse", Args::default(), s, Device::Cpu, &conv, ConversionPolicy::default()).unwrap_err();
        assert!(matches!(&err, CallError::Function(FunctionError::Failed { function, .. }) if function == "refuse"), "{err}");
    }

    #[test]
    fn a_call_says_how_it_may_split_and_what_it_holds_on_a_device() {
        use crate::{one_plane, ArgValue, FunctionDecl, NoArgs, StackShape, ZSplit};
        static PER_PLANE: FunctionDecl<NoArgs> = FunctionDecl::new("per_plane", Contract::Pure2d, "x");
        static FLEX: FunctionDecl<NoArgs> = FunctionDecl::new("flex", Contract::Flexible, "x");
        static WHOLE: FunctionDecl<NoArgs> = FunctionDecl::new("whole", Contract::Pure3d, "x");
        static MAX: FunctionDecl<NoArgs> =
            FunctionDecl::new("max", Contract::VolumetricToSlice, "x").with_output_shape(one_plane).with_chunk_combine();
        static MEAN: FunctionDecl<NoArgs> = FunctionDecl::new("mean", Contract::VolumetricToSlice, "x").with_output_shape(one_plane);
        let mut r = Registry::new();
        for d in [&PER_PLANE, &FLEX, &WHOLE, &MAX, &MEAN] {
            r.add(d.host(|s, _, _| Ok(s.clone())).with_scratch(|shape, _| shape.depth as u64 * 100));
        }
        let conv = Conversions::default();
        let plan = |name: &str, given: Vec<(String, ArgValue)>| {
            let args = r.get(name).unwrap().validate_args(given).unwrap();
            r.plan_call(name, args, MemoryType::Host, Device::Cpu, &conv, ConversionPolicy::default()).unwrap()
        };
        let split = |name: &str| plan(name, vec![]).z_split;
        assert_eq!(split("per_plane"), Some(ZSplit::Planes));
        assert_eq!(split("flex"), None, "flexible on the whole stack");
        assert_eq!(plan("flex", vec![("slice_by_slice".into(), ArgValue::Bool(true))]).z_split, Some(ZSplit::Planes));
        assert_eq!(split("whole"), None);
        assert_eq!(split("max"), Some(ZSplit::Combine));
        assert_eq!(split("mean"), None, "a reduction that does not declare it combines");
        // 3 planes of 10×10 u16 (200 bytes each) in, one f32 plane out (400), 3 × 100 scratch.
        let max = plan("max", vec![]);
        assert_eq!(max.working_set(&StackShape::new(3, 10, 10), crate::DType::U16, &StackShape::new(1, 10, 10)), 600 + 400 + 300);
        // Device planes are whole 32-bit words: 3×3 u8 is 12 bytes, not 9.
        assert_eq!(max.working_set(&StackShape::new(1, 3, 3), crate::DType::U8, &StackShape::new(1, 3, 3)), 12 + 36 + 100);
    }
}
