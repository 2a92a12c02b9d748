//! Registry: argument validation messages, contracts applied automatically, device policy.

use hcsflow_core::adapter::{select_device, AdapterInfo, AdapterKind};
use hcsflow_core::{
    ArgError, ArgSpec, ArgValue, Array, Contract, ConversionPolicy, Conversions, DType, Device, DeviceRequest, FunctionError, FunctionSpec,
    Implementation, MemoryType, Registry, Stack,
};
use hcsflow_core::{ArgProblem, FunctionDecl, Runtime, StackShape};
use ndarray::Array3;

fn registry() -> Registry {
    let mut r = Registry::new();
    r.register(
        FunctionSpec {
            name: "scale",
            doc: "multiply by factor",
            contract: Contract::Pure2d,
            args: vec![
                ArgSpec::float("factor", 2.0, Some(0.0), Some(10.0), "multiplier"),
                ArgSpec::int("radius", 1, Some(1), None, "unused radius"),
                ArgSpec::choice("mode", "fast", &["fast", "exact"], "algorithm"),
                ArgSpec::bool("invert", false, "invert"),
            ],
        },
        Implementation::host(|s, args, _| {
            // Records how many planes each call saw in the first pixel.
            let f = match args.get("factor") {
                Some(ArgValue::Float(f)) => *f as f32,
                other => panic!("factor is a declared float argument, got {other:?}"),
            };
            let depth = s.depth() as f32;
            let mut a = s.to_f32().mapv(|v| v * f);
            a[[0, 0, 0]] = depth;
            Ok(Stack::from(a))
        }),
    );
    r.register(
        FunctionSpec { name: "sum_planes", doc: "sum", contract: Contract::Flexible, args: vec![] },
        Implementation::host(|s, _, _| {
            let a = s.to_f32().sum_axis(ndarray::Axis(0)).insert_axis(ndarray::Axis(0));
            Ok(Stack::from(a))
        }),
    );
    r.register(
        FunctionSpec { name: "broken_projection", doc: "returns 2 planes", contract: Contract::VolumetricToSlice, args: vec![] },
        Implementation::host(|s, _, _| Ok(s.clone())),
    );
    r
}

fn texts(v: &[&str]) -> Vec<String> {
    v.iter().map(|s| s.to_string()).collect()
}

#[test]
fn defaults_fill_and_values_parse() {
    let r = registry();
    let f = r.get("scale").unwrap();
    let a = f.parse_args(&texts(&["factor=3", "mode=exact", "invert=true"])).unwrap();
    assert_eq!(a.get("factor"), Some(&ArgValue::Float(3.0)));
    assert_eq!(a.get("radius"), Some(&ArgValue::Int(1)));
    assert_eq!(a.get("mode"), Some(&ArgValue::Str("exact".into())));
    assert_eq!(a.get("invert"), Some(&ArgValue::Bool(true)));
    // An undeclared name has no value (it used to read as 0).
    assert_eq!(a.get("sigma"), None);
    // An integer value for a float argument is accepted as that number.
    let a = f.validate_args(vec![("factor".into(), ArgValue::Int(4))]).unwrap();
    assert_eq!(a.get("factor"), Some(&ArgValue::Float(4.0)));
}

#[test]
fn every_argument_error_has_a_specific_message() {
    let r = registry();
    let f = r.get("scale").unwrap();
    let err = |t: &[&str]| f.parse_args(&texts(t)).unwrap_err().to_string();
    assert_eq!(
        err(&["factr=1"]),
        "scale: unknown argument 'factr' (did you mean 'factor'?); its arguments are: factor, radius, mode, invert"
    );
    assert_eq!(err(&["factor=abc"]), "scale: argument 'factor' expects a number, got 'abc'");
    assert_eq!(err(&["radius=1.5"]), "scale: argument 'radius' expects an integer, got '1.5'");
    assert_eq!(err(&["invert=maybe"]), "scale: argument 'invert' expects true or false, got 'maybe'");
    assert_eq!(err(&["factor=11"]), "scale: argument 'factor' = 11 is out of range: must be [0, 10]");
    assert_eq!(err(&["radius=0"]), "scale: argument 'radius' = 0 is out of range: must be >= 1");
    assert_eq!(err(&["mode=slow"]), "scale: argument 'mode' = 'slow' is out of range: must be one of fast, exact");
    assert_eq!(err(&["factor"]), "malformed argument 'factor': expected name=value");
    let typed = f.validate_args(vec![("mode".into(), ArgValue::Int(1))]).unwrap_err();
    assert!(matches!(typed, ArgError::WrongType { .. }), "{typed:?}");
    let nan = f.validate_args(vec![("factor".into(), ArgValue::Float(f64::NAN))]).unwrap_err();
    assert!(matches!(nan, ArgError::WrongType { .. }), "{nan:?}");
    assert_eq!(r.get("scal").unwrap_err().to_string(), "unknown function 'scal' (did you mean 'scale'?); `hcsflow functions` lists them");
}

fn run(r: &Registry, name: &str, args: &[&str], s: Stack) -> Result<Stack, FunctionError> {
    let conv = Conversions::default();
    let args = r.get(name).unwrap().parse_args(&texts(args)).unwrap();
    let plan = r.plan_call(name, args, MemoryType::Host, Device::Cpu, &conv, ConversionPolicy::default()).unwrap();
    r.execute(&plan, Array::from(s), &conv).map(|a| a.into_host_stack().unwrap())
}

#[test]
fn pure_2d_is_applied_plane_by_plane() {
    let r = registry();
    let s = Stack::from(Array3::<u16>::from_shape_fn((3, 2, 2), |(z, y, x)| (z * 4 + y * 2 + x) as u16));
    let out = run(&r, "scale", &["factor=0.5"], s).unwrap();
    let Stack::F32(a) = out else { panic!() };
    assert_eq!(a.dim(), (3, 2, 2));
    for z in 0..3 {
        assert_eq!(a[[z, 0, 0]], 1.0, "each call saw exactly one plane");
        assert_eq!(a[[z, 1, 1]], (z * 4 + 3) as f32 * 0.5);
    }
}

#[test]
fn flexible_runs_whole_or_per_slice() {
    let r = registry();
    let s = Stack::from(Array3::<u8>::from_elem((4, 2, 3), 2));
    let whole = run(&r, "sum_planes", &[], s.clone()).unwrap();
    assert_eq!(whole.shape(), [1, 2, 3]);
    assert_eq!(whole, Stack::from(Array3::<f32>::from_elem((1, 2, 3), 8.0)));
    let per = run(&r, "sum_planes", &["slice_by_slice=true"], s).unwrap();
    assert_eq!(per, Stack::from(Array3::<f32>::from_elem((4, 2, 3), 2.0)));
}

#[test]
fn contract_violations_are_reported() {
    let r = registry();
    let s = Stack::zeros(DType::U16, [2, 2, 2]);
    let err = run(&r, "broken_projection", &[], s).unwrap_err();
    assert_eq!(err.to_string(), "broken_projection (volumetric_to_slice) returned 2 planes for 2 input planes; expected 1");
}

fn adapter(index: usize, name: &str, kind: AdapterKind) -> AdapterInfo {
    AdapterInfo { index, name: name.into(), backend: "Vulkan".into(), kind, driver: String::new(), driver_info: String::new() }
}

#[test]
fn device_selection_policy() {
    let lavapipe = vec![adapter(0, "llvmpipe", AdapterKind::Software)];
    let mixed = vec![
        adapter(0, "llvmpipe", AdapterKind::Software),
        adapter(1, "Intel UHD", AdapterKind::IntegratedGpu),
        adapter(2, "RTX 4090", AdapterKind::DiscreteGpu),
    ];
    // auto: software adapters never chosen, even when allowed.
    let c = select_device(DeviceRequest::Auto, &lavapipe, true).unwrap();
    assert_eq!(c.device, Device::Cpu);
    assert!(c.reason.contains("software rasterizer"), "{}", c.reason);
    assert_eq!(select_device(DeviceRequest::Auto, &[], false).unwrap().device, Device::Cpu);
    assert_eq!(select_device(DeviceRequest::Auto, &mixed, false).unwrap().device, Device::Gpu(2));
    // gpu: best hardware; software only when allowed.
    assert_eq!(select_device(DeviceRequest::Gpu, &mixed, false).unwrap().device, Device::Gpu(2));
    let err = select_device(DeviceRequest::Gpu, &lavapipe, false).unwrap_err().to_string();
    assert!(err.starts_with("--device gpu: no usable GPU: every adapter found is a software rasterizer."), "{err}");
    assert!(err.contains("gpu:0 llvmpipe — Vulkan, software"), "{err}");
    assert!(err.contains("--allow-software-gpu"), "{err}");
    assert_eq!(select_device(DeviceRequest::Gpu, &lavapipe, true).unwrap().device, Device::Gpu(0));
    let none = select_device(DeviceRequest::Gpu, &[], true).unwrap_err().to_string();
    assert!(none.contains("No GPU adapter was found") && none.contains("mesa-vulkan-drivers"), "{none}");
    // gpu:N
    assert_eq!(select_device(DeviceRequest::GpuIndex(1), &mixed, false).unwrap().device, Device::Gpu(1));
    let err = select_device(DeviceRequest::GpuIndex(0), &mixed, false).unwrap_err().to_string();
    assert!(err.contains("gpu:0 (llvmpipe) is a software rasterizer"), "{err}");
    let err = select_device(DeviceRequest::GpuIndex(7), &mixed, false).unwrap_err().to_string();
    assert!(err.contains("there is no adapter gpu:7"), "{err}");
    // cpu is always fine.
    assert_eq!(select_device(DeviceRequest::Cpu, &[], false).unwrap().device, Device::Cpu);
}

#[test]
fn device_strings_parse_or_fail_clearly() {
    assert_eq!("gpu:3".parse::<DeviceRequest>().unwrap(), DeviceRequest::GpuIndex(3));
    assert_eq!("auto".parse::<DeviceRequest>().unwrap(), DeviceRequest::Auto);
    for bad in ["GPU", "gpu:", "gpu:-1", "cuda", ""] {
        let e = bad.parse::<DeviceRequest>().unwrap_err().to_string();
        assert!(e.starts_with(&format!("bad device '{bad}'")), "{e}");
    }
}

#[test]
fn float_list_arguments_parse_validate_and_display() {
    let mut r = Registry::new();
    r.register(
        FunctionSpec {
            name: "mix",
            doc: "weighted",
            contract: Contract::VolumetricToSlice,
            args: vec![ArgSpec::float_list("weights", vec![], Some(0.0), Some(10.0), 2, "weights")],
        },
        Implementation::host(|s, _, _| Ok(s.clone())),
    );
    let f = r.get("mix").unwrap();
    let ok = |t: &str| match f.parse_args(&texts(&[t])).unwrap().get("weights") {
        Some(ArgValue::FloatList(v)) => v.clone(),
        other => panic!("weights is a declared list argument, got {other:?}"),
    };
    assert_eq!(ok("weights=1,2.5"), vec![1.0, 2.5]);
    assert_eq!(ok("weights=[ 3 , 4 ]"), vec![3.0, 4.0]);
    let err = |t: &str| f.parse_args(&texts(&[t])).unwrap_err().to_string();
    assert_eq!(err("weights=1,a"), "mix: argument 'weights' expects a comma-separated list of numbers, got '1,a'");
    assert_eq!(err("weights=1,11"), "mix: argument 'weights' = [1, 11] (element 11) is out of range: must be every element [0, 10]");
    assert_eq!(err("weights=1"), "mix: argument 'weights' = [1] is out of range: must be a list of at least 2 numbers");
    // A list value from a pipeline file, and NaN inside a list.
    let a = f.validate_args(vec![("weights".into(), ArgValue::FloatList(vec![1.0, 2.0]))]).unwrap();
    assert_eq!(a.get("weights"), Some(&ArgValue::FloatList(vec![1.0, 2.0])));
    let nan = f.validate_args(vec![("weights".into(), ArgValue::FloatList(vec![1.0, f64::NAN]))]).unwrap_err();
    assert!(matches!(nan, ArgError::WrongType { .. }), "{nan:?}");
    let typed = f.validate_args(vec![("weights".into(), ArgValue::Bool(true))]).unwrap_err();
    assert!(matches!(typed, ArgError::WrongType { .. }), "{typed:?}");
    assert_eq!(ArgValue::FloatList(vec![0.5, 2.0]).to_string(), "[0.5, 2]");
}

/// With implementations for two GPU runtimes' memory, a wgpu device gets the
/// wgpu one whatever the registration order (it used to get the first
/// device-memory implementation: here the CUDA one).
#[test]
fn plan_call_picks_the_implementation_of_the_devices_runtime() {
    let mut r = Registry::new();
    let spec = || FunctionSpec { name: "both", doc: "test", contract: Contract::Pure3d, args: vec![] };
    r.register(spec(), Implementation::array(MemoryType::Cuda, MemoryType::Cuda, |a, _, _| Ok(a)));
    r.register(spec(), Implementation::array(MemoryType::Wgpu, MemoryType::Wgpu, |a, _, _| Ok(a)));
    r.register(spec(), Implementation::host(|s, _, _| Ok(s.clone())));
    let c = Conversions::default();
    let plan = |memory, device| r.plan_call("both", Default::default(), memory, device, &c, ConversionPolicy::default()).unwrap();
    assert_eq!(Device::Gpu(0).runtime(), Runtime::Wgpu);
    assert_eq!(plan(MemoryType::Wgpu, Device::Gpu(0)).implementation.memory_in, MemoryType::Wgpu);
    assert_eq!(plan(MemoryType::Host, Device::Cpu).implementation.memory_in, MemoryType::Host);
    // Only a CUDA implementation: a wgpu device has none (and says so).
    let mut r = Registry::new();
    r.register(spec(), Implementation::array(MemoryType::Cuda, MemoryType::Cuda, |a, _, _| Ok(a)));
    let err = r.plan_call("both", Default::default(), MemoryType::Cuda, Device::Gpu(0), &c, ConversionPolicy::default()).unwrap_err();
    assert_eq!(err.to_string(), "both has no implementation for gpu:0 (it has: cuda): cuda arrays live on a CUDA GPU (no CPU device holds them) and this build has no CUDA runtime, so cuda functions cannot run here; use a numpy, torch or jax function instead");
}

hcsflow_core::function_args! {
    /// Arguments of the test function `offset`.
    pub struct OffsetArgs {
        amount: i64 = int(1, Some(0), Some(100), "added to every pixel"),
        planes: i64 = int(0, Some(0), None, "planes to drop from the end"),
    }
}

fn check_offset(args: &OffsetArgs, shape: &StackShape) -> Result<(), ArgProblem> {
    if args.planes as usize >= shape.depth {
        return Err(ArgProblem::new("planes", format!("{} planes of {}", args.planes, shape.depth), "drop fewer"));
    }
    Ok(())
}

static OFFSET: FunctionDecl<OffsetArgs> = FunctionDecl::new("offset", Contract::Pure3d, "adds amount, drops planes (test)")
    .with_check(check_offset)
    .with_output_shape(|a, s| Some(s.with_depth(s.depth - a.planes as usize)));

/// A declared function: its spec comes from the argument struct, its kernel
/// gets the typed values, and its typed check and shape rule run on the
/// validated arguments.
#[test]
fn a_declared_function_reads_its_typed_arguments() {
    let mut r = Registry::new();
    r.add(OFFSET.host(|s, a, _| {
        let kept = s.depth() - a.planes as usize;
        let out = s.to_f32().slice(ndarray::s![..kept, .., ..]).mapv(|v| v + a.amount as f32);
        Ok(Stack::from(out))
    }));
    let f = r.get(OFFSET.name).unwrap();
    let names: Vec<&str> = f.spec.args.iter().map(|a| a.name).collect();
    assert_eq!(names, ["amount", "planes"]);
    let args = f.parse_args(&texts(&["amount=5", "planes=1"])).unwrap();
    assert_eq!(f.output_shape(&args, &StackShape::new(3, 2, 2)), Some(StackShape::new(2, 2, 2)));
    let err = f.check_args(&f.parse_args(&texts(&["planes=3"])).unwrap(), &StackShape::new(3, 2, 2)).unwrap_err();
    assert_eq!(err.to_string(), "offset: argument 'planes': 3 planes of 3 (checked against a stack of 3 planes of 2×2 pixels); drop fewer");
    let c = Conversions::default();
    let plan = r.plan_call("offset", args, MemoryType::Host, Device::Cpu, &c, ConversionPolicy::default()).unwrap();
    let out = r.execute(&plan, Array::from(Stack::from(Array3::<u16>::from_elem((3, 2, 2), 1))), &c).unwrap().into_host_stack().unwrap();
    assert_eq!(out, Stack::from(Array3::<f32>::from_elem((2, 2, 2), 6.0)));
}
