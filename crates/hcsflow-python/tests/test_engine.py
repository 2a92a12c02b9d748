"""The engine from Python (first slice): functions on numpy arrays, runs of
pipeline files, and the exception classes, checked against numpy/scipy and
against what the engine writes. scipy and tifffile are oracles
(.ci/requirements-oracles.txt): a missing one fails, as in the Rust tests."""

import json
import sys
from pathlib import Path

import numpy as np
import pytest
import tifffile
from scipy import ndimage

import hcsflow

REPO = Path(__file__).resolve().parents[3]


def test_version_and_functions():
    assert hcsflow.__version__ == "0.1.0"
    names = hcsflow.function_names()
    assert "max_projection" in names and "gaussian_blur" in names
    assert names == sorted(names)


@pytest.mark.parametrize("dtype", [np.uint8, np.uint16, np.float32])
def test_max_projection_is_numpy_max(dtype):
    rng = np.random.default_rng(7)
    a = (rng.random((4, 17, 23)) * 200).astype(dtype)
    out = hcsflow.call("max_projection", a)
    assert out.dtype == a.dtype
    np.testing.assert_array_equal(out, a.max(axis=0, keepdims=True))


def test_gaussian_blur_matches_scipy_with_keyword_arguments():
    rng = np.random.default_rng(3)
    a = rng.random((2, 32, 40)).astype(np.float32)
    out = hcsflow.call("gaussian_blur", a, sigma=1.5, truncate=3.0)
    want = np.stack([ndimage.gaussian_filter(p.astype(np.float64), 1.5, mode="reflect", truncate=3.0) for p in a])
    np.testing.assert_allclose(out, want, atol=1e-5)


def test_list_arguments_and_a_non_contiguous_input():
    a = np.arange(3 * 5 * 6, dtype=np.float32).reshape(3, 5, 6)
    view = a[:, :, ::2]  # not contiguous: copied into a standard stack
    out = hcsflow.call("composite", view, weights=[1.0, 0.0, 1.0])
    np.testing.assert_allclose(out[0], (view[0] + view[2]) / 2, rtol=1e-6)


def test_errors_are_typed():
    a = np.zeros((1, 4, 4), np.uint16)
    with pytest.raises(hcsflow.CompileError, match="max_projection"):
        hcsflow.call("max_projecton", a)  # did you mean
    with pytest.raises(hcsflow.CompileError, match="out of range"):
        hcsflow.call("gaussian_blur", a, sigma=-1)
    with pytest.raises(hcsflow.CompileError, match="sigmaa"):
        hcsflow.call("gaussian_blur", a, sigmaa=1)
    with pytest.raises(hcsflow.ArrayError, match=r"3D array \[Z, Y, X\], got shape \[4, 4\]"):
        hcsflow.call("max_projection", a[0])
    with pytest.raises(hcsflow.ArrayError, match="int64"):
        hcsflow.call("max_projection", np.zeros((1, 2, 2), np.int64))
    with pytest.raises(hcsflow.DeviceUnavailableError):
        hcsflow.call("max_projection", a, device="gpu:99", allow_software_gpu=True)
    with pytest.raises(hcsflow.CompileError, match="needs a stack of images plus a mask plane"):
        hcsflow.call("apply_mask", a)  # one plane: refused from its shape, before running
    with pytest.raises(hcsflow.FunctionError, match="not a square grid"):
        hcsflow.call("assemble", np.zeros((2, 4, 4), np.uint16))  # found while running
    for cls in (hcsflow.CompileError, hcsflow.DeviceUnavailableError, hcsflow.PlateError, hcsflow.FunctionError,
                hcsflow.ArrayError, hcsflow.MemoryConversionError):
        assert issubclass(cls, hcsflow.HcsflowError)


def test_memory_budgets_from_python(tmp_path):
    """max_memory / gpu_memory as the CLI's --max-memory / --gpu-memory: sizes
    parsed the same way, a bad one a ValueError naming the keyword, and a
    budget below one well's estimated peak warned about (ResourceWarning)."""
    import warnings
    plate = tmp_path / "plate"
    hcsflow.synth_plate(plate, wells=["A01", "B02"], grid=(1, 2), z=3, size=32)
    pipeline = REPO / "examples" / "max_z.toml"
    out = tmp_path / "out"
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # no warning under a large budget
        plan = hcsflow.run(plate, pipeline, out, device="cpu", dry_run=True, max_memory="4G", gpu_memory=64 << 20)
    assert "memory: a well needs about" in plan
    with pytest.warns(ResourceWarning, match=r"2 of 2 well\(s\) are estimated to need more than --max-memory 1.0 KiB"):
        hcsflow.run(plate, pipeline, out, device="cpu", dry_run=True, max_memory=1024)
    with pytest.raises(ValueError, match="max_memory"):
        hcsflow.run(plate, pipeline, out, device="cpu", dry_run=True, max_memory="4Q")
    with pytest.raises(ValueError, match="gpu_memory"):
        hcsflow.run(plate, pipeline, out, device="cpu", dry_run=True, gpu_memory="lots")
    assert not out.exists()


def test_a_run_from_python_writes_what_the_plan_says(tmp_path):
    plate = tmp_path / "plate"
    hcsflow.synth_plate(plate, wells=["A01", "B02"], grid=(1, 2), z=3, size=32)
    pipeline = REPO / "examples" / "max_z.toml"
    out = tmp_path / "out"
    plan = hcsflow.run(plate, pipeline, out, device="cpu", dry_run=True)
    assert plan.startswith("plan: pipeline") and "device: cpu" in plan
    assert not out.exists()  # a dry run writes nothing
    summary = hcsflow.run(plate, pipeline, out, device="cpu", workers=1)
    assert sorted(summary["completed"]) == ["A01", "B02"] and summary["failed"] == []
    manifest = json.loads((out / "run_manifest.json").read_text())
    assert sorted(manifest["wells"]) == ["A01", "B02"]
    written = sorted(p for p in out.rglob("*.tif"))
    assert written, "the pipeline materialises TIFFs"
    # Each output plane is the max over z of the plate's planes of its site.
    for tif in written:
        result = tifffile.imread(tif)
        assert result.ndim == 2 and result.dtype == np.uint16
    # Resume: every well is already complete.
    again = hcsflow.run(plate, pipeline, out, device="cpu", resume=True)
    assert sorted(again["skipped"]) == ["A01", "B02"] and again["completed"] == []


def test_run_errors_are_typed(tmp_path):
    pipeline = REPO / "examples" / "max_z.toml"
    with pytest.raises(hcsflow.PlateError, match="no-such-plate"):
        hcsflow.run(tmp_path / "no-such-plate", pipeline, tmp_path / "out")
    plate = tmp_path / "plate"
    hcsflow.synth_plate(plate)
    bad = tmp_path / "bad.toml"
    bad.write_text('[[steps]]\nname = "x"\nfunc = "no_such_function"\n')
    with pytest.raises(hcsflow.CompileError, match="no_such_function"):
        hcsflow.run(plate, bad, tmp_path / "out", device="cpu")
    with pytest.raises(hcsflow.CompileError, match="inside the input plate"):
        hcsflow.run(plate, pipeline, plate / "out", device="cpu")


def test_every_function_is_a_documented_callable():
    from hcsflow import functions

    assert sorted(functions.__all__) == hcsflow.function_names()
    rng = np.random.default_rng(11)
    a = (rng.random((3, 16, 16)) * 1000).astype(np.uint16)
    np.testing.assert_array_equal(functions.max_projection(a), hcsflow.call("max_projection", a))
    np.testing.assert_array_equal(functions.gaussian_blur(a, sigma=2.0), hcsflow.call("gaussian_blur", a, sigma=2.0))
    doc = functions.gaussian_blur.__doc__
    assert "scipy.ndimage.gaussian_filter" in doc and "sigma (float, default 1.0)" in doc, doc
    assert "'linear' | 'none' | 'max'" in functions.assemble.__doc__
    assert functions.max_projection.__name__ == "max_projection"
    with pytest.raises(AttributeError, match="no function 'max_projecton'"):
        functions.max_projecton  # noqa: B018


def test_progress_events_reach_the_callback(tmp_path, monkeypatch):
    plate = tmp_path / "plate"
    hcsflow.synth_plate(plate, wells=["A01", "B02", "C03"], z=2, size=32)
    events = []
    summary = hcsflow.run(plate, REPO / "examples" / "max_z.toml", tmp_path / "out", device="cpu", workers=2,
                          progress=events.append)
    assert sorted(summary["completed"]) == ["A01", "B02", "C03"]
    started = sorted(e["well"] for e in events if e["event"] == "started")
    finished = [e for e in events if e["event"] == "finished"]
    assert started == ["A01", "B02", "C03"]
    assert sorted(e["well"] for e in finished) == started and all(e["error"] is None for e in finished)
    assert sorted(e["done"] for e in finished) == [1, 2, 3] and all(e["total"] == 3 for e in finished)
    steps = [e for e in events if e["event"] == "step"]
    assert {(e["step"], e["index"], e["steps"]) for e in steps} == {("max_z", 0, 1)}

    def broken(event):
        raise RuntimeError("callback")

    # A callback that raises does not stop the run; its exception is reported as unraisable.
    unraisable = []
    monkeypatch.setattr(sys, "unraisablehook", unraisable.append)
    again = hcsflow.run(plate, REPO / "examples" / "max_z.toml", tmp_path / "out2", device="cpu", progress=broken)
    assert len(again["completed"]) == 3
    assert unraisable and all(str(u.exc_value) == "callback" for u in unraisable)


def test_python_m_hcsflow_runs_and_lists_with_the_cli_exit_codes(tmp_path):
    import subprocess

    def hcsflow_m(*args):
        return subprocess.run([sys.executable, "-m", "hcsflow", *map(str, args)], capture_output=True, text=True)

    plate = tmp_path / "plate"
    hcsflow.synth_plate(plate, wells=["A01"], z=2, size=32)
    pipeline = REPO / "examples" / "max_z.toml"
    o = hcsflow_m("run", plate, pipeline, tmp_path / "out", "--device", "cpu", "--dry-run")
    assert o.returncode == 0 and o.stdout.startswith("plan: pipeline"), o.stderr
    o = hcsflow_m("run", plate, pipeline, tmp_path / "out", "--device", "cpu")
    assert o.returncode == 0 and "1 of 1 well(s) complete" in o.stderr, o.stderr
    bad = tmp_path / "bad.toml"
    bad.write_text('[[steps]]\nname = "x"\nfunc = "no_such_function"\n')
    o = hcsflow_m("run", plate, bad, tmp_path / "out2", "--device", "cpu")
    assert o.returncode == 2 and "no_such_function" in o.stderr, o.stderr
    o = hcsflow_m("run", plate, pipeline, tmp_path / "out3", "--device", "gpu:99", "--allow-software-gpu")
    assert o.returncode == 3, o.stderr
    o = hcsflow_m("run", tmp_path / "nowhere", pipeline, tmp_path / "out4")
    assert o.returncode == 1 and "nowhere" in o.stderr, o.stderr
    o = hcsflow_m("functions", "--json")
    assert o.returncode == 0 and [f["name"] for f in json.loads(o.stdout)] == hcsflow.function_names()


def test_stack_and_unstack_slices_round_trip_and_validate():
    slices = [np.full((3, 4), i, np.uint16) for i in range(5)]
    stack = hcsflow.stack_slices(slices, "numpy", 0)
    assert stack.shape == (5, 3, 4) and stack.dtype == np.uint16
    np.testing.assert_array_equal(stack, np.stack(slices))
    back = hcsflow.unstack_slices(stack, "numpy", 0)
    assert len(back) == 5 and all(b.shape == (3, 4) for b in back)
    for b, s in zip(back, slices):
        np.testing.assert_array_equal(b, s)
    with pytest.raises(hcsflow.ArrayError, match="empty"):
        hcsflow.stack_slices([])
    with pytest.raises(hcsflow.ArrayError, match=r"slice 1 is not 2D: it has shape \[1, 3, 4\]"):
        hcsflow.stack_slices([slices[0], slices[1][None]])
    with pytest.raises(hcsflow.ArrayError, match=r"slice 2 has shape \[3, 5\]"):
        hcsflow.stack_slices([slices[0], slices[1], np.zeros((3, 5), np.uint16)])
    with pytest.raises(hcsflow.ArrayError, match="slice 1 has dtype f32"):
        hcsflow.stack_slices([slices[0], np.zeros((3, 4), np.float32)])
    with pytest.raises(hcsflow.ArrayError, match="not 3D"):
        hcsflow.unstack_slices(slices[0])
    with pytest.raises(hcsflow.ArrayError, match="invalid device id -1"):
        hcsflow.stack_slices(slices, "numpy", -1)
    with pytest.raises(hcsflow.CompileError, match="unknown memory type 'numpyy'"):
        hcsflow.stack_slices(slices, "numpyy")
    with pytest.raises(hcsflow.ArrayError, match="int32"):
        hcsflow.stack_slices([np.zeros((2, 2), np.int32)])
    # torch and jax: CPU tensors, through the planned host → torch/jax routes.
    import jax
    import torch

    t = hcsflow.stack_slices(slices, "torch")
    assert isinstance(t, torch.Tensor) and tuple(t.shape) == (5, 3, 4)
    np.testing.assert_array_equal(t.numpy(), np.stack(slices))
    parts = hcsflow.unstack_slices(stack, "jax")
    assert all(isinstance(p, jax.Array) for p in parts) and len(parts) == 5
    np.testing.assert_array_equal(np.asarray(parts[2]), slices[2])
    # cupy has no CPU device and this build no CUDA runtime.
    with pytest.raises(hcsflow.DeviceUnavailableError, match="cupy arrays live on a CUDA GPU"):
        hcsflow.stack_slices(slices, "cupy")


def test_a_plate_opens_with_its_metadata_and_any_stack_reads_as_an_array(tmp_path):
    plate_dir = tmp_path / "plate"
    hcsflow.synth_plate(plate_dir, wells=["A01", "B02"], grid=(2, 2), channels=2, z=3, size=32)
    before = sorted((p, p.stat().st_mtime_ns) for p in plate_dir.rglob("*"))
    plate = hcsflow.open_plate(plate_dir)
    assert plate.format == "imagexpress" and plate.wells == ["A01", "B02"]
    assert plate.sites == [1, 2, 3, 4] and plate.z_indices == [1, 2, 3] and plate.timepoints == [1]
    assert list(plate.channels) == [1, 2] and plate.grid == (2, 2)
    assert plate.pixel_size_um is not None and plate.pixel_size_um > 0
    assert plate.missing == [] and "2 wells × 4 sites × 2 channels × 3 z × 1 t" in repr(plate)
    # The z planes of one site and channel: the plate's files, read by hand with tifffile.
    stack = plate.stack("B02", site=3, channel=2)
    files = sorted((i for i in plate.images if i.well == "B02" and i.site == 3 and i.channel == 2),
                   key=lambda i: i.z_index)
    assert stack.shape == (3, 32, 32) and stack.dtype == np.uint16
    np.testing.assert_array_equal(stack, np.stack([tifffile.imread(i.path) for i in files]))
    # Along the sites instead.
    sites = plate.stack("A01", site=None, z_index=2)
    assert sites.shape == (4, 32, 32)
    np.testing.assert_array_equal(sites[2], tifffile.imread(next(
        i.path for i in plate.images if (i.well, i.site, i.channel, i.z_index) == ("A01", 3, 1, 2))))
    with pytest.raises(hcsflow.CompileError, match="leave exactly one"):
        plate.stack("A01", site=None, channel=None)
    with pytest.raises(hcsflow.PlateError, match="no well 'C07'"):
        plate.stack("C07")
    with pytest.raises(hcsflow.PlateError, match=r"site 9, channel 1, timepoint 1: no image for z_index \[1, 2, 3\]"):
        plate.stack("A01", site=9)
    with pytest.raises(hcsflow.PlateError, match="no-such"):
        hcsflow.open_plate(tmp_path / "no-such")
    assert sorted((p, p.stat().st_mtime_ns) for p in plate_dir.rglob("*")) == before  # nothing written


def test_an_ome_zarr_plate_from_ome_zarr_py_opens_and_stacks_read_its_planes(tmp_path):
    import zarr
    from ome_zarr.format import FormatV05
    from ome_zarr.io import parse_url
    from ome_zarr.writer import write_image, write_plate_metadata, write_well_metadata

    fmt = FormatV05()
    root = zarr.group(store=parse_url(tmp_path / "p.zarr", mode="w", fmt=fmt).store, zarr_format=3)
    write_plate_metadata(root, ["A", "B"], ["1", "2", "3"], ["B/3"], fmt=fmt, name="py")
    well = root.require_group("B").require_group("3")
    write_well_metadata(well, [{"path": "0"}, {"path": "1"}], fmt=fmt)
    data = [np.random.default_rng(f).integers(0, 4000, (2, 4, 16, 12), dtype=np.uint16) for f in range(2)]
    for f in range(2):
        write_image(data[f], well.require_group(str(f)), axes="czyx", fmt=fmt, scale_factors=(2,))
    before = sorted((p, p.stat().st_mtime_ns) for p in (tmp_path / "p.zarr").rglob("*"))
    plate = hcsflow.open_plate(tmp_path / "p.zarr")
    assert plate.format == "ome-zarr" and plate.wells == ["B03"]
    assert plate.sites == [1, 2] and list(plate.channels) == [1, 2] and plate.z_indices == [1, 2, 3, 4]
    assert plate.images[0].at["kind"] == "zarr"
    # z planes of field 1 (site 2), channel 2; then channels of site 1, z 3.
    np.testing.assert_array_equal(plate.stack("B03", site=2, channel=2), data[1][1])
    np.testing.assert_array_equal(plate.stack("B03", site=1, channel=None, z_index=3), data[0][:, 2])
    assert sorted((p, p.stat().st_mtime_ns) for p in (tmp_path / "p.zarr").rglob("*")) == before


def test_engine_log_events_reach_python_logging(tmp_path, caplog):
    plate = tmp_path / "plate"
    hcsflow.synth_plate(plate, wells=["A01"], z=2, size=32)
    out = tmp_path / "out"
    hcsflow.run(plate, REPO / "examples" / "max_z.toml", out, device="cpu", progress=False)
    other = hcsflow.Pipeline([hcsflow.FunctionStep("max_projection", name="other", variable_components=["z_index"])])
    with caplog.at_level("INFO", logger="hcsflow"):
        hcsflow.run(plate, other, out, device="cpu", overwrite=True, progress=False)
    records = [r for r in caplog.records if r.name == "hcsflow"]
    assert any(r.levelname == "INFO" and "--overwrite: removed" in r.getMessage() and str(out) in r.getMessage()
               for r in records), [r.getMessage() for r in records]
    assert all(r.target.startswith("hcsflow") for r in records)


@pytest.mark.parametrize("dtype", [np.uint8, np.uint16, np.float32])
def test_a_contiguous_input_reaches_a_builtin_without_a_copy_and_is_never_written(dtype):
    rng = np.random.default_rng(5)
    a = (rng.random((3, 40, 50)) * 200).astype(dtype)
    # The engine's stack is the numpy buffer itself (pointer equality) ...
    assert hcsflow._hcsflow.shared_address(a) == a.ctypes.data
    np.testing.assert_array_equal(hcsflow.functions.max_projection(a), a.max(axis=0, keepdims=True))
    # ... but a function that overwrites its input in place gets a copy first: the array is untouched.
    before = a.copy()
    out = hcsflow.functions.percentile_normalize(a, low_percentile=1.0, high_percentile=99.0)
    np.testing.assert_array_equal(a, before)
    np.testing.assert_array_equal(out, hcsflow.functions.percentile_normalize(before.copy(), low_percentile=1.0,
                                                                              high_percentile=99.0))
    assert out.ctypes.data != a.ctypes.data
    # Not contiguous (a strided view), or read-only from JAX: strided is copied, read-only is shared.
    assert hcsflow._hcsflow.shared_address(a[:, :, ::2]) is None
    np.testing.assert_array_equal(hcsflow.functions.max_projection(a[:, :, ::2]), a[:, :, ::2].max(axis=0)[None])
    ro = a.copy()
    ro.flags.writeable = False
    assert hcsflow._hcsflow.shared_address(ro) == ro.ctypes.data
    np.testing.assert_array_equal(hcsflow.functions.percentile_normalize(ro, low_percentile=1.0, high_percentile=99.0),
                                  out)


def test_results_export_dlpack_and_the_buffer_protocol_as_the_standard_says():
    r = hcsflow.functions.max_projection(np.arange(2 * 64 * 64, dtype=np.float32).reshape(2, 64, 64))
    ptr = r.ctypes.data
    # Versioned capsules when the consumer asks for DLPack ≥ 1.0, legacy otherwise.
    assert "dltensor_versioned" in repr(r.__dlpack__(max_version=(1, 0)))
    assert "dltensor" in repr(r.__dlpack__()) and "versioned" not in repr(r.__dlpack__())
    assert r.__dlpack_device__() == (1, 0)  # kDLCPU
    assert np.from_dlpack(r, device="cpu").ctypes.data == ptr
    copied = np.from_dlpack(r, copy=True)
    assert copied.ctypes.data != ptr and np.array_equal(copied, r)
    with pytest.raises(BufferError):
        r.__dlpack__(dl_device=(2, 0), copy=False)  # a CUDA device: not reachable without a copy
    with pytest.raises((BufferError, ValueError, RuntimeError)):
        r.__dlpack__(stream=1)  # CPU arrays take no stream
    # The buffer protocol shares the same memory.
    view = memoryview(r)
    assert view.shape == (1, 64, 64) and view.format == "f" and np.frombuffer(view, np.float32).ctypes.data == ptr


def test_torch_and_jax_cpu_arrays_are_imported_through_dlpack_without_a_copy():
    import jax.numpy as jnp
    import torch

    t = torch.arange(2 * 32 * 48, dtype=torch.float32).reshape(2, 32, 48)
    assert hcsflow._hcsflow.shared_address(t) == t.data_ptr()
    np.testing.assert_array_equal(hcsflow.functions.max_projection(t), t.numpy().max(axis=0, keepdims=True))
    j = jnp.asarray(t.numpy().astype(np.uint16))
    assert hcsflow._hcsflow.shared_address(j) == j.unsafe_buffer_pointer()  # read-only in numpy: shared all the same
    np.testing.assert_array_equal(hcsflow.functions.max_projection(j), np.asarray(j).max(axis=0, keepdims=True))
    with pytest.raises(hcsflow.ArrayError, match="int64"):
        hcsflow.functions.max_projection(torch.zeros((1, 4, 4), dtype=torch.int64))


def test_the_dtype_policy_is_the_clis():
    a = np.array([[[0, 100], [200, 1000]], [[50, 60], [70, 80]]], np.uint16)
    mean = hcsflow.functions.mean_projection(a, dtype="f32")
    assert mean.dtype == np.float32
    np.testing.assert_allclose(mean, a.astype(np.float32).mean(axis=0, keepdims=True))
    clipped = hcsflow.functions.mean_projection(a, dtype="u8")  # clip and round into uint8
    np.testing.assert_array_equal(clipped, np.clip(np.round(a.astype(np.float32).mean(axis=0, keepdims=True)), 0, 255))
    stretched = hcsflow.functions.mean_projection(a, dtype="u8", stretch=True)  # min..max over 0..255
    assert stretched.min() == 0 and stretched.max() == 255
    with pytest.raises(hcsflow.CompileError, match="u12"):
        hcsflow.functions.mean_projection(a, dtype="u12")


def test_a_plate_wide_basic_fit_from_python_corrects_every_well(tmp_path):
    # FunctionStep(scope="plate"): one BaSiC fit per channel over every well's tiles, before the
    # wells; each tile corrected with its channel's profiles. The synthetic plate's shading is known.
    plate = tmp_path / "plate"
    hcsflow.synth_plate(plate, wells=["A01", "A02", "B01", "B02"], grid=(3, 3), channels=1, size=128)
    pipeline = hcsflow.Pipeline([
        hcsflow.FunctionStep(("basic_fit", {"working_size": 64, "camera_offset": 100}), name="flatfield", scope="plate",
                             variable_components=["site", "z_index"], sample=30, seed=3, dtype="f32"),
        hcsflow.FunctionStep(("basic_correct", {"camera_offset": 100}), name="corrected", variable_components=["site"],
                             dtype="f32", materialize=["tiff"]),
    ])
    plan = hcsflow.run(plate, pipeline, tmp_path / "dry", device="cpu", dry_run=True)
    assert "flatfield" in plan and "30 of 36" in plan, plan
    events = []
    out = tmp_path / "out"
    summary = hcsflow.run(plate, pipeline, out, device="cpu", workers=2, progress=events.append)
    assert sorted(summary["completed"]) == ["A01", "A02", "B01", "B02"] and summary["failed"] == []
    plate_events = [e for e in events if e["event"].startswith("plate_step")]
    assert [e["event"] for e in plate_events] == ["plate_step_started", "plate_step_finished"], plate_events
    assert plate_events[0] == {"event": "plate_step_started", "step": "flatfield", "groups": 1, "planes": 30}
    assert plate_events[1]["reused"] is False and plate_events[1]["error"] is None
    first_well = min(i for i, e in enumerate(events) if e["event"] == "started")
    assert events.index(plate_events[1]) < first_well, "the fit ends before any well starts"

    flat = tifffile.imread(out / "flatfield" / "channel_1_DAPI.tif")[0].astype(np.float64)
    truth = tifffile.imread(plate / "ground_truth" / "flatfield.tif").astype(np.float64)
    truth = truth[0] if truth.ndim == 3 else truth
    error = np.abs(flat / flat.mean() - truth / truth.mean()) / (truth / truth.mean())
    assert error.mean() < 0.01 and np.percentile(error, 99) < 0.03, (error.mean(), np.percentile(error, 99))

    # A corrected tile is (raw − 100) / flat-field, in f32.
    raw_path = next(p for p in (plate / "TimePoint_1").glob("*_A01_s1.tif"))
    corrected = [p for p in (out / "corrected").rglob("*.tif") if "A01" in p.name and "s1" in p.name]
    assert len(corrected) == 1, sorted(p.name for p in (out / "corrected").rglob("*.tif"))
    want = (tifffile.imread(raw_path).astype(np.float32) - 100) / flat.astype(np.float32)
    np.testing.assert_allclose(tifffile.imread(corrected[0]), want, rtol=1e-5, atol=1e-3)

    # --resume re-reads the finished fit.
    events.clear()
    again = hcsflow.run(plate, pipeline, out, device="cpu", resume=True, progress=events.append)
    assert sorted(again["skipped"]) == ["A01", "A02", "B01", "B02"]
    assert [(e["event"], e.get("reused")) for e in events if e["event"].startswith("plate_step")] == [("plate_step_finished", True)]
