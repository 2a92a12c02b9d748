"""The Mega Flex pipeline from Python (examples/mega_flex.py) is the pipeline of
examples/mega_flex.toml: the same steps and arguments, the same plan, and, run
on a small synthetic plate, the same outputs byte for byte."""

import importlib.util
from pathlib import Path

import hcsflow

REPO = Path(__file__).resolve().parents[3]
TOML = REPO / "examples" / "mega_flex.toml"

#: A short N2V2 training of a small network (the example's takes minutes). Six steps leave it
#: untrained: its output dips below 0 in places, which the example's Richardson–Lucy clips
#: (``negative = "clip"``) and counts in the well's notes (this test compares the two front ends,
#: not the denoising).
QUICK_N2V = {"epochs": 2, "steps_per_epoch": 3, "patch_size": 16, "batch_size": 4, "features": 4,
             "tile_size": 64, "tile_overlap": 16, "seed": 1}


def example():
    spec = importlib.util.spec_from_file_location("mega_flex_example", REPO / "examples" / "mega_flex.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def plate(tmp_path):
    path = tmp_path / "plate"
    hcsflow.synth_plate(path, wells=["A01"], grid=(2, 2), channels=2, z=5, size=64, seed=3)
    return path


def test_the_python_pipeline_is_the_toml_pipeline(tmp_path):
    built = example().mega_flex().to_dict()
    loaded = hcsflow.Pipeline.load(TOML).to_dict()
    assert [s["name"] for s in built["steps"]] == [s["name"] for s in loaded["steps"]]
    # The file's steps come back with the engine's defaults filled in; every key the Python
    # step sets has the file's value.
    for ours, theirs in zip(built["steps"], loaded["steps"]):
        assert {k: theirs.get(k) for k in ours} == ours, ours["name"]
    assert (built["name"], built["description"]) == (loaded["name"], loaded["description"])

    # The engine compiles both to the same plan (the same digest), except for where it came from.
    p = plate(tmp_path)
    plans = [hcsflow.run(p, pipeline, tmp_path / "out", device="cpu", dry_run=True)
             for pipeline in (example().mega_flex(), str(TOML))]
    strip = [[line for line in plan.splitlines() if not line.startswith("pipeline:")] for plan in plans]
    assert "digest" in plans[0]
    assert strip[0] == strip[1]


def test_the_python_pipeline_writes_what_the_toml_pipeline_writes(tmp_path):
    p = plate(tmp_path)
    toml = TOML.read_text().replace(
        "epochs = 2, steps_per_epoch = 100, patch_size = 64, batch_size = 16, seed = 1",
        ", ".join(f"{k} = {v}" for k, v in QUICK_N2V.items()))
    assert toml != TOML.read_text(), "the example's N2V2 arguments changed: update QUICK_N2V's replacement"
    quick_toml = tmp_path / "mega_flex_quick.toml"
    quick_toml.write_text(toml)

    runs = {}
    for name, pipeline in [("python", example().mega_flex(n2v=QUICK_N2V)), ("toml", str(quick_toml))]:
        summary = hcsflow.run(p, pipeline, tmp_path / name, device="cpu", workers=1, progress=False)
        assert summary["failed"] == [] and summary["completed"] == ["A01"], summary
        runs[name] = {f.relative_to(tmp_path / name): f.read_bytes()
                      for f in sorted((tmp_path / name).rglob("*.tif"))}
    assert len(runs["python"]) >= 4 * 2 * 5 * 2, sorted(runs["python"])  # corrected + denoised + ... per plane
    assert runs["python"].keys() == runs["toml"].keys()
    for name in runs:
        manifest = (tmp_path / name / "run_manifest.json").read_text()
        assert "values below 0 set to 0" in manifest, name
    for path, data in runs["python"].items():
        assert data == runs["toml"][path], path
