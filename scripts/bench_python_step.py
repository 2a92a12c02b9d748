"""What a Python step costs in hcsflow, and a plate run with one numpy step
against OpenHCS running the same numpy function on the same plate.

    scripts/bench-python-step.sh            # both parts, results in $WORK/results/python-step.json

Parts (each side runs in its own process, so peak RSS is that process's):
- ``overhead`` (hcsflow's venv): a synthetic plate of many small stacks run
  with a chain of 1 and of 41 identity functions of one memory type; the
  difference divided by the 40 extra calls per stack is the cost of one call
  of a Python step (GIL, conversions, checks). numpy and torch, workers 1 and 2.
- ``hcsflow`` / ``openhcs`` (one per venv): one step running
  :func:`background_scale` on every z stack of OpenHCS's synthetic
  ImageXpress plate, results written to disk; run interleaved by the driver
  (``compare``), which prints medians and the ratio measured in the same run.
"""

from __future__ import annotations

import argparse
import json
import os
import resource
import shutil
import statistics
import subprocess
import sys
import tempfile
import time

import numpy as np


def background_scale(stack):
    """The numpy function both tools run: per plane, subtract its minimum and
    halve (uint16 in, uint16 out)."""
    out = stack.astype(np.float32)
    out -= out.min(axis=(1, 2), keepdims=True)
    out *= 0.5
    return out.astype(np.uint16)


def peak_rss_mib() -> float:
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024


def overhead(a: argparse.Namespace) -> None:
    import hcsflow
    from hcsflow import FunctionStep, Pipeline
    from hcsflow.memory import numpy as numpy_fn, torch as torch_fn

    root = tempfile.mkdtemp(prefix="hcsflow-overhead-")
    plate = os.path.join(root, "plate")
    hcsflow.synth_plate(plate, wells=["A01", "A02", "B01", "B02"], grid=(8, 8), channels=1, z=2, size=64)
    stacks = 4 * 64
    identities = {"numpy": numpy_fn(lambda s: s), "torch": torch_fn(lambda t: t)}
    rows = []
    for memory, identity in identities.items():
        # A first run imports the library (torch: seconds): not timed.
        hcsflow.run(plate, Pipeline([FunctionStep(identity, name="ids", variable_components=["z_index"])]),
                    os.path.join(root, "out"), device="cpu", overwrite=True, progress=False)
        for workers in (1, 2):
            times = {}
            for k in (1, 41):
                runs = []
                for _ in range(a.repeats):
                    pipe = Pipeline([FunctionStep([identity] * k, name="ids", variable_components=["z_index"])])
                    out = os.path.join(root, "out")
                    t0 = time.perf_counter()
                    s = hcsflow.run(plate, pipe, out, device="cpu", workers=workers, overwrite=True, progress=False)
                    runs.append(time.perf_counter() - t0)
                    assert not s["failed"], s["failed"]
                times[k] = statistics.median(runs)
            per_call = (times[41] - times[1]) / (40 * stacks)
            rows.append({"memory": memory, "workers": workers, "stack": [2, 64, 64], "stacks": stacks,
                         "run_1_call_s": round(times[1], 4), "run_41_calls_s": round(times[41], 4),
                         "per_call_us": round(per_call * 1e6, 1)})
    shutil.rmtree(root, ignore_errors=True)
    print(json.dumps({"overhead": rows, "peak_rss_mib": round(peak_rss_mib(), 1)}))


def run_hcsflow(a: argparse.Namespace) -> None:
    import hcsflow
    from hcsflow import FunctionStep, Pipeline
    from hcsflow.memory import numpy as numpy_fn

    step = numpy_fn(background_scale)
    pipe = Pipeline([FunctionStep(step, name="background_scale", variable_components=["z_index"],
                                  materialize=["tiff"])])
    t0 = time.perf_counter()
    s = hcsflow.run(a.plate, pipe, a.out, device="cpu", workers=a.workers, overwrite=True, progress=False)
    seconds = time.perf_counter() - t0
    print(json.dumps({"tool": "hcsflow", "seconds": seconds, "failed": len(s["failed"]),
                      "completed": len(s["completed"]), "workers": a.workers, "peak_rss_mib": round(peak_rss_mib(), 1)}))


def run_openhcs(a: argparse.Namespace) -> None:
    os.environ.setdefault("QT_QPA_PLATFORM", "offscreen")
    from objectstate.lazy_factory import ensure_global_config_context
    from openhcs.constants.constants import VariableComponents
    from openhcs.core.config import GlobalPipelineConfig, LazyProcessingConfig, PipelineConfig
    from openhcs.core.memory import numpy as numpy_func
    from openhcs.core.orchestrator.orchestrator import PipelineOrchestrator
    from openhcs.core.steps.function_step import FunctionStep

    if a.generate:
        from openhcs.demo.synthetic_data import SyntheticMicroscopyGenerator
        SyntheticMicroscopyGenerator(output_dir=a.plate, grid_size=(a.grid, a.grid), tile_size=(a.tile, a.tile),
                                     wavelengths=2, z_stack_levels=3, wells=["A01"],
                                     num_cells=int(50 * (a.tile / 256) ** 2)).generate_dataset()
        print(json.dumps({"generated": a.plate}))
        return
    ensure_global_config_context(GlobalPipelineConfig, GlobalPipelineConfig())
    # OpenHCS resolves a step's function by module and name: the decorated
    # function must be an attribute of an importable module (not __main__).
    sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
    import bench_python_step as module
    module.background_scale = numpy_func(module.background_scale)
    step = FunctionStep(func=module.background_scale, name="background_scale",
                        processing_config=LazyProcessingConfig(variable_components=[VariableComponents.Z_INDEX]))
    from openhcs.core.progress import set_progress_queue

    class Events(list):
        put = list.append

    events = Events()
    set_progress_queue(events)
    t0 = time.perf_counter()
    orch = PipelineOrchestrator(plate_path=a.plate, pipeline_config=PipelineConfig(), progress_callback=None)
    orch.initialize()
    bundle = orch.compile_pipelines(pipeline_definition=[step])
    compile_s = time.perf_counter() - t0
    t0 = time.perf_counter()
    res = orch.execute_compiled_plate(bundle, max_workers=1, progress_queue=events,
                                      progress_context={"execution_id": "bench", "plate_id": a.plate})
    seconds = time.perf_counter() - t0
    print(json.dumps({"tool": "openhcs", "seconds": seconds, "compile_s": compile_s, "wells": len(res or {}),
                      "workers": 1, "peak_rss_mib": round(peak_rss_mib(), 1)}))


def last_json(text: str) -> dict:
    for line in reversed(text.strip().splitlines()):
        if line.startswith("{"):
            return json.loads(line)
    raise RuntimeError(f"no JSON in output: {text[-800:]}")


def same_outputs(openhcs_images: str, ours: str) -> str:
    """Compares every image OpenHCS wrote (`A01_s004_w1_z003_t001.tif`) with
    ours (`TimePoint_1/ZStep_3/A01_s004_w1.tif`): how many, and whether equal."""
    import re

    import tifffile

    equal = differ = 0
    for name in sorted(os.listdir(openhcs_images)):
        m = re.fullmatch(r"(.+)_z(\d+)_t\d+\.tif", name)
        if not m:
            continue
        mine = os.path.join(ours, "TimePoint_1", f"ZStep_{int(m.group(2))}", m.group(1) + ".tif")
        if np.array_equal(tifffile.imread(os.path.join(openhcs_images, name)), tifffile.imread(mine)):
            equal += 1
        else:
            differ += 1
    return f"{equal} images equal, {differ} differ"


def compare(a: argparse.Namespace) -> None:
    me = os.path.abspath(__file__)
    work = tempfile.mkdtemp(prefix="hcsflow-pystep-", dir=a.work)
    plate = os.path.join(work, "plate")

    def side(python: str, *args: str) -> dict:
        done = subprocess.run([python, "-W", "ignore", me, *args], capture_output=True, text=True)
        if done.returncode != 0:
            raise RuntimeError(f"{python} {' '.join(args)} failed:\n{done.stderr[-2000:]}")
        return last_json(done.stdout)

    side(a.openhcs_python, "openhcs", "--plate", plate, "--generate", "--tile", str(a.tile), "--grid", str(a.grid))
    images = [f for _, _, fs in os.walk(plate) for f in fs if f.endswith(".tif")]
    results: dict[str, list] = {"openhcs": [], "hcsflow_1": [], "hcsflow_2": []}
    for _ in range(a.repeats):
        results["openhcs"].append(side(a.openhcs_python, "openhcs", "--plate", plate))
        for w in (1, 2):
            out = os.path.join(work, f"out{w}")
            results[f"hcsflow_{w}"].append(side(a.hcsflow_python, "hcsflow", "--plate", plate, "--out", out,
                                                "--workers", str(w)))
    median = {k: statistics.median(r["seconds"] for r in v) for k, v in results.items()}
    agreement = same_outputs(os.path.join(work, "plate_openhcs", "images"), os.path.join(work, "out1", "background_scale"))
    summary = {
        "plate": {"images": len(images), "tile": a.tile, "grid": a.grid, "channels": 2, "z": 3, "wells": 1},
        "median_s": {k: round(v, 3) for k, v in median.items()},
        "ratio_openhcs_over_hcsflow_1": round(median["openhcs"] / median["hcsflow_1"], 2),
        "ratio_openhcs_over_hcsflow_2": round(median["openhcs"] / median["hcsflow_2"], 2),
        "peak_rss_mib": {k: max(r["peak_rss_mib"] for r in v) for k, v in results.items()},
        "outputs": agreement,
        "runs": results,
    }
    summary["overhead"] = side(a.hcsflow_python, "overhead", "--repeats", str(a.repeats))
    shutil.rmtree(work, ignore_errors=True)
    print(json.dumps(summary, indent=1))


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("part", choices=["compare", "overhead", "hcsflow", "openhcs"])
    ap.add_argument("--plate")
    ap.add_argument("--out")
    ap.add_argument("--workers", type=int, default=1)
    ap.add_argument("--generate", action="store_true")
    ap.add_argument("--tile", type=int, default=1024)
    ap.add_argument("--grid", type=int, default=3)
    ap.add_argument("--repeats", type=int, default=3)
    ap.add_argument("--work", default=tempfile.gettempdir())
    ap.add_argument("--hcsflow-python", default=sys.executable)
    ap.add_argument("--openhcs-python")
    a = ap.parse_args()
    {"compare": compare, "overhead": overhead, "hcsflow": run_hcsflow, "openhcs": run_openhcs}[a.part](a)


if __name__ == "__main__":
    main()
