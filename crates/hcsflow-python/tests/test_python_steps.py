"""Users' Python functions as pipeline steps: memory-type decorators, the
routes the compiler plans for them (zero-copy shown by pointer equality),
results checked against the same computation done by hand in numpy, and the
errors. torch, jax (CPU) and pyclesperanto (on pocl, an OpenCL device on the
CPU) are test dependencies (.ci/requirements-oracles.txt, scripts/test);
tensorflow and cupy are not installed here, so their refusals are what is
tested."""

import importlib.util
import json
import subprocess
import sys
import threading
from pathlib import Path

import jax.numpy as jnp
import numpy as np
import pytest
import tifffile
import torch

import hcsflow
from hcsflow import FunctionStep, Pipeline
from hcsflow.memory import jax as jax_fn
from hcsflow.memory import memory_types
from hcsflow.memory import numpy as numpy_fn
from hcsflow.memory import torch as torch_fn

SEEN: dict[str, list] = {}


def seen(key, value):
    SEEN.setdefault(key, []).append(value)


@numpy_fn
def plus_one(a):
    seen("numpy_in_base", type(a.base).__name__)
    seen("numpy_in", a.ctypes.data)
    out = a.astype(np.float32) + 1
    seen("numpy_out", out.ctypes.data)
    return out


@jax_fn
def times_three(x):
    seen("jax_in", x.unsafe_buffer_pointer())
    return x * 3.0


@torch_fn
def minus_quarter(t):
    seen("torch_in", t.data_ptr())
    out = t - 0.25
    seen("torch_out", out.data_ptr())
    return out


def raw_planes(plate: Path, well: str, z: int) -> list[np.ndarray]:
    """The plate's planes of `well` (one site, one channel), read by hand."""
    return [tifffile.imread(plate / "TimePoint_1" / f"ZStep_{k}" / f"Synth_Plate_1_{well}.tif") for k in range(1, z + 1)]


def mixed_pipeline() -> Pipeline:
    return Pipeline([
        FunctionStep("max_projection", name="max_z", variable_components=["z_index"]),
        FunctionStep([plus_one, minus_quarter, times_three], name="python", variable_components=["site"],
                     dtype="float32"),
        FunctionStep(("max_projection", {}), name="builtin_again", variable_components=["site"],
                     materialize=["tiff"]),
    ], name="mixed")


def test_a_mixed_pipeline_plans_every_route_and_equals_numpy_by_hand(tmp_path):
    plate, out = tmp_path / "plate", tmp_path / "out"
    hcsflow.synth_plate(plate, wells=["A01", "B02"], grid=(1, 1), z=3, size=96, seed=5)
    plan = hcsflow.run(plate, mixed_pipeline(), out, device="cpu", dry_run=True)
    routes = [line.strip() for line in plan.splitlines() if "route" in line]
    assert routes == [
        "route into max_projection: host → host (identity, none)",
        "route out: host → host (identity, none)",
        "route into test_python_steps:plus_one: host → numpy (zero-copy, numpy view)",
        "route into test_python_steps:minus_quarter: numpy → torch (zero-copy, dlpack)",
        "route into test_python_steps:times_three: torch → jax (zero-copy, dlpack; jax copies a buffer not 64-byte aligned)",
        "route out: jax → host (host copy, copy)",
        "route into max_projection: host → host (identity, none)",
        "route out: host → host (identity, none)",
    ], plan
    SEEN.clear()
    summary = hcsflow.run(plate, mixed_pipeline(), out, device="cpu", workers=1, progress=False)
    assert summary["failed"] == [] and sorted(summary["completed"]) == ["A01", "B02"]
    for well in ("A01", "B02"):
        planes = raw_planes(plate, well, 3)
        want = (np.max(planes, axis=0).astype(np.float32) + 1 - np.float32(0.25)) * np.float32(3.0)
        (tif,) = [p for p in (out / "builtin_again").rglob("*.tif") if well in p.name]
        got = tifffile.imread(tif)
        assert got.dtype == np.float32
        np.testing.assert_array_equal(got, want)
    # Zero copies, by pointer equality: the stack reached numpy as a view of
    # the engine's buffer, numpy's result is torch's input, torch's result
    # (64-byte aligned, as torch allocates) jax's.
    assert SEEN["numpy_in_base"] == ["PySliceContainer"] * 2
    assert SEEN["torch_in"] == SEEN["numpy_out"]
    assert SEEN["jax_in"] == SEEN["torch_out"]
    # The engine's buffers are 64-byte aligned (JAX shares only those).
    assert all(p % 64 == 0 for p in SEEN["numpy_in"])


@pytest.mark.parametrize("dtype", [np.uint8, np.uint16, np.float32])
def test_results_are_shared_with_numpy_torch_and_jax_without_copies(dtype):
    a = (np.random.default_rng(1).random((3, 64, 80)) * 200).astype(dtype)
    r = hcsflow.call("max_projection", a)
    ptr = r.ctypes.data
    assert ptr % 64 == 0, "result buffers are 64-byte aligned"
    assert np.from_dlpack(r).ctypes.data == ptr
    t = torch.from_dlpack(r)
    assert t.data_ptr() == ptr
    j = jnp.from_dlpack(r)
    assert j.unsafe_buffer_pointer() == ptr
    np.testing.assert_array_equal(np.asarray(j), a.max(axis=0, keepdims=True))
    # And back: a torch CPU tensor through DLPack to numpy, the same memory.
    assert np.from_dlpack(t).ctypes.data == ptr


def test_a_python_exception_fails_its_well_only(tmp_path):
    plate, out = tmp_path / "plate", tmp_path / "out"
    hcsflow.synth_plate(plate, wells=["A01", "B02", "C03"], grid=(1, 1), z=2, size=32)
    calls = []
    lock = threading.Lock()

    def check(n):
        if n == 2:
            raise ValueError("boom on purpose")

    @numpy_fn
    def fails_on_second_call(a):
        with lock:
            calls.append(1)
            n = len(calls)
        try:
            check(n)
        except ValueError:
            raise  # re-raised: the traceback still runs from the step's call to the raise
        return a

    pipeline = Pipeline([FunctionStep(fails_on_second_call, name="py", variable_components=["z_index"])])
    summary = hcsflow.run(plate, pipeline, out, device="cpu", workers=3, progress=False)
    assert len(summary["failed"]) == 1 and len(summary["completed"]) == 2
    error = summary["failed"][0]["error"]
    assert "ValueError: boom on purpose" in error and "Traceback" in error
    assert 'raise ValueError("boom on purpose")' in error  # the traceback's source line
    assert "in fails_on_second_call" in error and "in check" in error  # every frame from the step's call
    manifest = json.loads((out / "run_manifest.json").read_text())
    failed = summary["failed"][0]["well"]
    assert "boom on purpose" in manifest["wells"][failed]["error"]


def run_one(tmp_path, func, **step):
    plate = tmp_path / "plate"
    if not plate.exists():
        hcsflow.synth_plate(plate, wells=["A01"], grid=(1, 1), z=2, size=32)
    pipeline = Pipeline([FunctionStep(func, name="py", variable_components=["z_index"], **step)])
    return hcsflow.run(plate, pipeline, tmp_path / "out", device="cpu", overwrite=True, progress=False)


def test_what_a_function_returns_is_checked(tmp_path):
    @numpy_fn
    def flat(a):
        return a[0]

    summary = run_one(tmp_path, flat)
    assert "test_python_steps:test_what_a_function_returns_is_checked.<locals>.flat: expected a 3D [Z, Y, X] stack, " \
           "got shape [32, 32]" in summary["failed"][0]["error"]

    @torch_fn
    def says_torch_returns_numpy(t):
        return t.numpy()

    summary = run_one(tmp_path, says_torch_returns_numpy)
    assert "returned numpy.ndarray, but its output memory type is torch" in summary["failed"][0]["error"]

    @numpy_fn
    def float64(a):
        return a.astype(np.float64)

    summary = run_one(tmp_path, float64)
    assert "returned a float64 array; hcsflow stacks are uint8, uint16 or float32" in summary["failed"][0]["error"]


def test_pure_2d_functions_get_one_plane_at_a_time(tmp_path):
    shapes = []

    @numpy_fn(contract="pure_2d")
    def per_plane(p):
        shapes.append(p.shape)
        return p.max() - p

    plate, out = tmp_path / "plate", tmp_path / "out"
    hcsflow.synth_plate(plate, wells=["A01"], grid=(1, 1), z=3, size=32)
    pipeline = Pipeline([FunctionStep(per_plane, variable_components=["z_index"], materialize=["tiff"])])
    summary = hcsflow.run(plate, pipeline, out, device="cpu", progress=False)
    assert summary["failed"] == []
    assert shapes == [(32, 32)] * 3
    want = np.stack([p.max() - p for p in raw_planes(plate, "A01", 3)])
    np.testing.assert_array_equal(np.stack(raw_planes(out / "per_plane", "A01", 3)), want)


def test_unknown_memory_types_and_contracts_are_refused():
    with pytest.raises(hcsflow.CompileError, match=r"unknown memory type 'numpyy' \(did you mean 'numpy'\?\)"):
        memory_types(input_type="numpyy", output_type="numpy")
    with pytest.raises(hcsflow.CompileError, match="unknown contract 'flexible'"):
        numpy_fn(contract="flexible")


def plan_of(tmp_path, func, device="cpu", **kwargs):
    plate = tmp_path / "plate"
    hcsflow.synth_plate(plate, wells=["A01"], grid=(1, 1), z=2, size=32)
    pipeline = Pipeline([FunctionStep(func, name="py", variable_components=["z_index"])])
    return hcsflow.run(plate, pipeline, tmp_path / "out", device=device, dry_run=True, **kwargs)


def test_libraries_that_are_not_installed_are_refused_at_plan_time(tmp_path):
    assert importlib.util.find_spec("tensorflow") is None, "this test checks the refusal without tensorflow"

    @hcsflow.memory.tensorflow
    def tf_step(t):
        return t

    with pytest.raises(hcsflow.MemoryConversionError) as e:
        plan_of(tmp_path, tf_step)
    assert (e.value.source_type, e.value.target_type, e.value.method) == ("host", "tensorflow", "dlpack")
    assert e.value.reason == "tensorflow is not installed in this Python environment (pip install tensorflow)"
    assert "fix: install what the reason names" in str(e.value)


def test_a_pyclesperanto_step_runs_on_its_opencl_device_through_push_and_pull(tmp_path):
    import pyclesperanto as cle

    devices = []

    @hcsflow.memory.pyclesperanto
    def doubled(x):
        devices.append(type(x).__module__)
        return cle.multiply_image_and_scalar(x, scalar=2.0)

    plate, out = tmp_path / "plate", tmp_path / "out"
    hcsflow.synth_plate(plate, wells=["A01"], grid=(1, 1), z=2, size=48)
    pipeline = Pipeline([FunctionStep(doubled, variable_components=["z_index"], dtype="float32",
                                      materialize=["tiff"])])
    plan = hcsflow.run(plate, pipeline, out, device="cpu", dry_run=True)
    assert "route into test_python_steps:test_a_pyclesperanto_step_runs_on_its_opencl_device_through_push_and_pull" \
           ".<locals>.doubled: host → pyclesperanto (device copy, push)" in plan, plan
    assert "route out: pyclesperanto → host (device copy, pull)" in plan
    summary = hcsflow.run(plate, pipeline, out, device="cpu", progress=False)
    assert summary["failed"] == [], summary
    assert devices and devices[0].startswith("pyclesperanto")
    got = np.stack(raw_planes(out / "doubled", "A01", 2))
    np.testing.assert_array_equal(got, np.stack(raw_planes(plate, "A01", 2)).astype(np.float32) * 2)


def test_cupy_and_gpu_placement_are_refused(tmp_path):
    @hcsflow.memory.cupy
    def cupy_step(x):
        return x

    with pytest.raises(hcsflow.CompileError, match="cupy arrays live on a CUDA GPU .* this build has no CUDA runtime"):
        plan_of(tmp_path, cupy_step)

    # torch has CPU tensors, but none on a wgpu device: refused, not moved to the CPU.
    with pytest.raises(hcsflow.CompileError, match=r"torch has no tensors on gpu:0 \(wgpu buffers\)"):
        plan_of(tmp_path / "gpu", minus_quarter, device="gpu:0", allow_software_gpu=True)


def test_the_four_func_forms_and_module_function_names(tmp_path, monkeypatch):
    module = tmp_path / "my_steps.py"
    module.write_text(
        "from hcsflow.memory import numpy\n"
        "@numpy\n"
        "def scale(a, factor=2):\n"
        "    return (a * factor).astype(a.dtype)\n"
    )
    monkeypatch.syspath_prepend(str(tmp_path))
    plate, out = tmp_path / "plate", tmp_path / "out"
    hcsflow.synth_plate(plate, wells=["A01"], grid=(1, 1), channels=2, z=2, size=32)
    toml = tmp_path / "pipeline.toml"
    toml.write_text(
        '[[steps]]\nname = "per_channel"\nvariable_components = ["z_index"]\ngroup_by = "channel"\n'
        'materialize = ["tiff"]\n'
        '[steps.func]\n'
        '"1" = { name = "my_steps:scale", args = { factor = 3 } }\n'
        '"2" = ["max_projection", "my_steps:scale"]\n'
    )
    pipeline = Pipeline.load(toml)
    step = pipeline.steps[0]
    import my_steps
    assert step.func["1"] == (my_steps.scale, {"factor": 3}) and step.func["2"] == ["max_projection", my_steps.scale]
    plan = hcsflow.run(plate, pipeline, out, device="cpu", dry_run=True)
    assert "my_steps:scale(factor=3) (pure_3d, numpy → numpy on cpu)" in plan, plan
    summary = hcsflow.run(plate, pipeline, out, device="cpu", progress=False)
    assert summary["failed"] == [], summary
    def planes(root, channel):
        return np.stack([tifffile.imread(root / "TimePoint_1" / f"ZStep_{k}" / f"Synth_Plate_1_A01_w{channel}.tif")
                         for k in (1, 2)])

    # Channel 1: scale by 3 on each z plane; channel 2: max over z, then scale by 2 (one plane).
    result = out / "per_channel"
    np.testing.assert_array_equal(planes(result, 1), planes(plate, 1) * 3)
    projected = tifffile.imread(result / "TimePoint_1" / "Synth_Plate_1_A01_w2.tif")
    np.testing.assert_array_equal(projected, planes(plate, 2).max(axis=0) * 2)
    # The same file from `python -m hcsflow run`, the module found from the working directory.
    done = subprocess.run([sys.executable, "-m", "hcsflow", "run", str(plate), str(toml), str(tmp_path / "out2"),
                           "--device", "cpu"], capture_output=True, text=True, cwd=tmp_path)
    assert done.returncode == 0, done.stderr
    assert "1 of 1 well(s) complete" in done.stderr


def test_a_python_function_never_shadows_a_builtin():
    with pytest.raises(hcsflow.CompileError, match="'module:function', not 'max_projection'"):
        hcsflow._hcsflow.register_function("max_projection", lambda a: a, "numpy", "numpy")
    with pytest.raises(hcsflow.CompileError, match="not a memory type of Python functions"):
        hcsflow._hcsflow.register_function("m:f", lambda a: a, "wgpu", "numpy")
