"""OpenHCS (pip 'openhcs', 0.8.6 tested) running the Mega Flex steps of examples/mega_flex.toml on CPU,
with its own orchestrator and its own functions where it has them, on an ImageXpress plate written by
`hcsflow synth` (the peer of the `mega_flex` rows of bench/suite.json).

What runs (OpenHCS FunctionSteps, one worker, numpy backends):

  registration: max-Z (create_projection) → sharpen (OpenHCS's unsharp mask, radius 3) →
                stack_percentile_normalize (1–99.5 %) → CLAHE → create_composite →
                ashlar_compute_tile_positions_cpu
  measurement:  from the pipeline start: basic_flatfield_correction_numpy (fit and correct, one call
                per channel over all sites and planes) → Richardson–Lucy 3D on each tile's z-stack
                (--rl-iterations, Gaussian PSF --rl-sigma-xy, --rl-sigma-z) → max-Z →
                assemble_stack_cpu → count_cells_single_channel (watershed) on the DAPI mosaic

Where OpenHCS has no CPU function, the step is what an OpenHCS user would write, a @numpy function in
the pipeline: CLAHE (OpenHCS has it only for CuPy) is skimage's equalize_adapthist; 3D Richardson–Lucy
(OpenHCS's deconvolution is a self-supervised network, CUDA only) is skimage's richardson_lucy.
OpenHCS's registration branch reads the raw planes: its BaSiC fits and corrects in one call, and a
second fit for the registration branch would double its cost (ours corrects both branches with one fit).

N2V2: OpenHCS's n2v2_denoise_torch raises on a CPU tensor ("CUDA required"). `--n2v probe` runs its
own code with only that guard removed (its 31 M-parameter paper U-Net, AdamW, its patch sampler and
its overlapping-patch prediction), outside the orchestrator: one training epoch on one plane and the
prediction of that plane, timed apart, and extrapolates to the plate (one model per channel trained
for the steps of our settings, every plane predicted). `--n2v skip` (default) leaves it out of the
pipeline: in it, on 1024² tiles and two cores, it would take hours.

Usage (the openhcs venv; torch only for --n2v probe):
  python bench_openhcs_mega_flex.py --plate PLATE --grid 3 --overlap 0.15 [--n2v skip|probe]
Prints one JSON line: execute_s (orchestrator execution), compile_s, images, input_MB, MB_per_s,
peak_rss_mib (the whole process), the steps, versions, and with --n2v probe the N2V2 timings.
"""

import argparse
import glob
import inspect
import json
import os
import re
import resource
import shutil
import sys
import tempfile
import time

import numpy as np

# Our settings (examples/mega_flex.toml; scripts/bench_peers.py passes the file's as flags), matched where
# OpenHCS's functions take them.
RL_ITERATIONS, RL_SIGMA_XY, RL_SIGMA_Z = 10, 2.5, 0.6
N2V_STEPS, N2V_PATCH, N2V_BATCH = 200, 64, 16
CLAHE_CLIP = 0.01


def peak_rss_mib():
    """Peak resident set of this process (ru_maxrss is KiB on Linux)."""
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024.0


def versions(*packages):
    import importlib.metadata as md

    out = {}
    for p in packages:
        try:
            out[p] = md.version(p)
        except md.PackageNotFoundError:
            pass
    return out


def gaussian_psf_3d(sigma_xy, sigma_z):
    """A normalised 3D Gaussian PSF, ±3σ per axis (odd sizes), as our richardson_lucy builds it."""
    rz, rxy = max(1, int(np.ceil(3 * sigma_z))), int(np.ceil(3 * sigma_xy))
    z = np.arange(-rz, rz + 1, dtype=np.float64)[:, None, None]
    y = np.arange(-rxy, rxy + 1, dtype=np.float64)[None, :, None]
    x = np.arange(-rxy, rxy + 1, dtype=np.float64)[None, None, :]
    psf = np.exp(-(z**2) / (2 * sigma_z**2) - (y**2 + x**2) / (2 * sigma_xy**2))
    return (psf / psf.sum()).astype(np.float32)


def n2v_cpu_function():
    """OpenHCS's n2v2_denoise_torch with only its CUDA guard removed, compiled in its own module's
    namespace (same U-Net, sampler, masking, optimiser and prediction), undecorated: it takes and
    returns torch tensors on the CPU."""
    import openhcs.processing.backends.enhance.n2v2_processor_torch as mod

    fn = mod.n2v2_denoise_torch
    src = inspect.getsource(getattr(fn, "__wrapped__", fn))
    src = re.sub(r"^@torch_func\n", "", src, flags=re.M)
    guard = re.compile(r"\n\s*if device\.type != \"cuda\":\n\s*raise RuntimeError\([^\n]*\)\n")
    if not guard.search(src):
        raise RuntimeError("OpenHCS's N2V2 source changed: its CUDA guard was not found")
    src = guard.sub("\n", src)
    ns = dict(mod.__dict__)
    exec(compile(src, mod.__file__, "exec"), ns)  # noqa: S102 - OpenHCS's own source, guard removed
    return ns["n2v2_denoise_torch"], mod, ns


def clahe_skimage(stack: np.ndarray, clip_limit: float = CLAHE_CLIP) -> np.ndarray:
    """CLAHE per plane (skimage.exposure.equalize_adapthist), back to the input's u16 scale."""
    from skimage import exposure

    out = np.empty_like(stack)
    for i, plane in enumerate(stack):
        eq = exposure.equalize_adapthist(plane, clip_limit=clip_limit)
        out[i] = np.round(eq * 65535.0).astype(stack.dtype) if stack.dtype == np.uint16 else eq
    return out


def richardson_lucy_3d(
    stack: np.ndarray, iterations: int = RL_ITERATIONS, sigma_xy: float = RL_SIGMA_XY, sigma_z: float = RL_SIGMA_Z
) -> np.ndarray:
    """3D Richardson–Lucy of one tile's z-stack (skimage.restoration.richardson_lucy, clip=False), Gaussian
    PSF; the stack scaled to [0, 1] and back to its dtype."""
    from skimage import restoration

    img = stack.astype(np.float32)
    scale = float(img.max()) or 1.0
    out = restoration.richardson_lucy(img / scale, gaussian_psf_3d(sigma_xy, sigma_z), num_iter=iterations, clip=False)
    out = out * scale
    if np.issubdtype(stack.dtype, np.integer):
        return np.clip(out, 0, np.iinfo(stack.dtype).max).astype(stack.dtype)
    return out.astype(stack.dtype)


def build_functions():
    """The functions an OpenHCS user writes for what OpenHCS lacks on CPU, declared with OpenHCS's memory-type
    decorators and bound under their own names in this module (so the orchestrator can name them)."""
    from openhcs.core.memory import numpy as numpy_func

    mod = sys.modules[__name__]
    fns = {"clahe_skimage": numpy_func(clahe_skimage), "richardson_lucy_3d": numpy_func(richardson_lucy_3d)}
    for name, f in fns.items():
        setattr(mod, name, f)
    return fns


def n2v_epochs_for_our_steps(a, planes, size):
    """OpenHCS's N2V2 trains max_epochs × ceil(patches_per_epoch / batch) steps, patches_per_epoch =
    max(64, min(512, planes·size² / patch²)); the epochs closest to our training steps (--n2v-steps)."""
    per_epoch = max(64, min(512, planes * size * size // (a.n2v_patch**2)))
    steps_per_epoch = -(-per_epoch // a.n2v_batch)
    epochs = max(1, round(a.n2v_steps / steps_per_epoch))
    return epochs, steps_per_epoch


def pipeline_steps(a, fns):
    from openhcs.constants.constants import GroupBy, VariableComponents
    from openhcs.constants.input_source import InputSource
    from openhcs.core.config import LazyProcessingConfig
    from openhcs.core.steps.function_step import FunctionStep
    from openhcs.processing.backends.analysis.cell_counting_cpu import DetectionMethod, count_cells_single_channel
    from openhcs.processing.backends.assemblers.assemble_stack_cpu import assemble_stack_cpu
    from openhcs.processing.backends.enhance.basic_processor_numpy import basic_flatfield_correction_numpy
    from openhcs.processing.backends.pos_gen.ashlar_main_cpu import ashlar_compute_tile_positions_cpu
    from openhcs.processing.backends.processors.numpy_processor import (
        create_composite,
        create_projection,
        sharpen,
        stack_percentile_normalize,
    )

    def cfg(*components, **kw):
        return LazyProcessingConfig(variable_components=list(components), **kw)

    V = VariableComponents
    steps = [
        FunctionStep(func=create_projection, name="registration max-Z", processing_config=cfg(V.Z_INDEX)),
        FunctionStep(func=[(sharpen, {"radius": 3.0, "amount": 1.0}),
                           (stack_percentile_normalize, {"low_percentile": 1.0, "high_percentile": 99.5}),
                           (fns["clahe_skimage"], {"clip_limit": CLAHE_CLIP})],
                     name="enhance (sharpen, normalise, CLAHE)", processing_config=cfg(V.SITE)),
        FunctionStep(func=create_composite, name="composite", processing_config=cfg(V.CHANNEL)),
        FunctionStep(func=(ashlar_compute_tile_positions_cpu, {"overlap_ratio": a.overlap}), name="positions"),
        FunctionStep(func=basic_flatfield_correction_numpy, name="BaSiC fit + correct",
                     processing_config=cfg(V.SITE, V.Z_INDEX, input_source=InputSource.PIPELINE_START)),
    ]
    steps += [
        FunctionStep(func=(fns["richardson_lucy_3d"], {"iterations": a.rl_iterations, "sigma_xy": a.rl_sigma_xy,
                                                       "sigma_z": a.rl_sigma_z}),
                     name="Richardson–Lucy 3D", processing_config=cfg(V.Z_INDEX)),
        FunctionStep(func=create_projection, name="max-Z", processing_config=cfg(V.Z_INDEX)),
        FunctionStep(func=assemble_stack_cpu, name="assemble"),
        FunctionStep(func={"1": (count_cells_single_channel, {
            "min_cell_area": 40, "max_cell_area": 2000, "enable_preprocessing": True, "gaussian_sigma": 1.5,
            "detection_method": DetectionMethod.WATERSHED})},
            name="nuclei (DAPI)", processing_config=cfg(V.SITE, group_by=GroupBy.CHANNEL)),
    ]
    return steps


class _Queue:
    def __init__(self):
        self.events = []

    def put(self, e):
        self.events.append(e)


def run_pipeline(a, plate):
    os.environ.setdefault("QT_QPA_PLATFORM", "offscreen")
    from objectstate.lazy_factory import ensure_global_config_context
    from openhcs.core.config import GlobalPipelineConfig, PipelineConfig
    from openhcs.core.orchestrator.orchestrator import PipelineOrchestrator
    from openhcs.core.progress import set_progress_queue
    import openhcs.processing.func_registry as reg

    fns = build_functions()
    gpc = GlobalPipelineConfig(num_workers=1) if "num_workers" in GlobalPipelineConfig.__dataclass_fields__ \
        else GlobalPipelineConfig()
    ensure_global_config_context(GlobalPipelineConfig, gpc)
    with reg._registry_lock:
        if not reg._registry_initialized:
            reg._auto_initialize_registry()
    steps = pipeline_steps(a, fns)
    names = [getattr(s, "name", None) or "step" for s in steps]  # compilation strips the declarations
    q = _Queue()
    set_progress_queue(q)
    t0 = time.perf_counter()
    orch = PipelineOrchestrator(plate_path=plate, pipeline_config=PipelineConfig(), progress_callback=None)
    orch.initialize()
    bundle = orch.compile_pipelines(pipeline_definition=steps)
    compile_s = time.perf_counter() - t0
    t0 = time.perf_counter()
    res = orch.execute_compiled_plate(bundle, max_workers=1, progress_queue=q,
                                      progress_context={"execution_id": "bench", "plate_id": plate})
    execute_s = time.perf_counter() - t0
    failed = [str(k) for k, r in (res or {}).items()
              if callable(getattr(r, "is_success", None)) and not r.is_success()]
    if failed or not res:
        raise RuntimeError(f"OpenHCS reported failed wells: {failed or 'no results'}: {res}")
    return compile_s, execute_s, names


def n2v_probe(a, plate_images):
    """Time OpenHCS's N2V2 (CUDA guard removed) on one plane of the plate: one epoch of training (its
    own patch count for one plane), then its prediction of the plane, timed apart; extrapolate to the
    plate: one model per channel trained for the epochs closest to our 2 × 100 steps, every plane."""
    import tifffile
    import torch

    cpu_fn, mod, ns = n2v_cpu_function()
    plane = tifffile.imread(plate_images[0]).astype(np.float32)
    predict_s = []
    inner = ns["process_large_slice"]

    def timed_slice(*args, **kw):
        t = time.perf_counter()
        out = inner(*args, **kw)
        predict_s.append(time.perf_counter() - t)
        return out

    ns["process_large_slice"] = timed_slice
    if max(plane.shape) <= 512:  # OpenHCS predicts small planes whole (no process_large_slice to time)
        raise RuntimeError("--n2v probe needs tiles larger than 512² (OpenHCS's patched prediction)")
    _, steps_one_plane = n2v_epochs_for_our_steps(a, 1, plane.shape[0])
    t0 = time.perf_counter()
    cpu_fn(torch.from_numpy(plane[None]), max_epochs=1, batch_size=a.n2v_batch, patch_size=a.n2v_patch)
    total = time.perf_counter() - t0
    s_plane = sum(predict_s)
    s_step = (total - s_plane) / steps_one_plane
    planes = len(plate_images)
    channels = a.channels
    epochs, steps_per_epoch = n2v_epochs_for_our_steps(a, planes // channels, plane.shape[0])
    train_steps = epochs * steps_per_epoch
    est = channels * train_steps * s_step + planes * s_plane
    return {"n2v_s_per_train_step": round(s_step, 3), "n2v_s_per_plane_predict": round(s_plane, 2),
            "n2v_probe_steps": steps_one_plane, "n2v_train_steps_per_model": train_steps,
            "n2v_models": channels, "n2v_planes": planes, "n2v_estimated_plate_s": round(est, 1),
            "n2v_torch_threads": torch.get_num_threads()}


def declare_pixel_size(plate, um):
    """OpenHCS requires a "PixelSizeUM" line in the HTD (its own generator writes one; MetaXpress's HTDs
    and `hcsflow synth`'s carry the pixel size elsewhere): add it to the private copy's HTD."""
    for htd in glob.glob(os.path.join(plate, "*.HTD")) + glob.glob(os.path.join(plate, "*.htd")):
        with open(htd, "rb") as fh:
            text = fh.read()
        if b'"PixelSizeUM"' not in text:
            with open(htd, "ab") as fh:
                fh.write(('' if text.endswith(b"\n") else "\r\n").encode() + f'"PixelSizeUM", {um}\r\n'.encode())


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--plate", required=True, help="ImageXpress plate folder (hcsflow synth); copied, never written")
    ap.add_argument("--grid", type=int, default=3, help="sites per row and column")
    ap.add_argument("--overlap", type=float, default=0.15, help="tile overlap fraction (ASHLAR's overlap_ratio)")
    ap.add_argument("--z", type=int, default=5, help="z planes per site and channel")
    ap.add_argument("--channels", type=int, default=2)
    ap.add_argument("--rl-iterations", type=int, default=RL_ITERATIONS)
    ap.add_argument("--rl-sigma-xy", type=float, default=RL_SIGMA_XY, help="PSF σ in x and y, px")
    ap.add_argument("--rl-sigma-z", type=float, default=RL_SIGMA_Z, help="PSF σ in z, planes")
    ap.add_argument("--n2v-steps", type=int, default=N2V_STEPS,
                    help="our N2V2 training steps per model (epochs × steps)")
    ap.add_argument("--n2v-patch", type=int, default=N2V_PATCH)
    ap.add_argument("--n2v-batch", type=int, default=N2V_BATCH)
    ap.add_argument("--pixel-size", type=float, default=0.65,
                    help="µm per pixel, declared to OpenHCS (hcsflow synth: 0.65)")
    ap.add_argument("--n2v", choices=("skip", "probe"), default="skip",
                    help="skip: run the pipeline without N2V2; probe: only time OpenHCS's N2V2 (its CUDA guard "
                         "removed) on one plane and extrapolate to the plate")
    a = ap.parse_args()

    src = os.path.abspath(a.plate)
    images = sorted(glob.glob(os.path.join(src, "TimePoint_*", "**", "*.tif"), recursive=True))
    if not images:
        sys.exit(f"error: no TimePoint_*/…/*.tif images under {src}")
    import tifffile

    a.size = tifffile.imread(images[0]).shape[-1]
    mb = sum(os.path.getsize(p) for p in images) / 1e6  # uncompressed u16 TIFFs: ≈ pixel bytes
    out = {"op": f"openhcs_mega_flex_{len(images)}planes_{a.size}px", "images": len(images),
           "input_MB": round(mb, 1), "n2v": a.n2v}
    if a.n2v == "probe":
        out.update(n2v_probe(a, images))
    else:
        # OpenHCS writes its outputs beside the plate: it works on a private copy.
        root = tempfile.mkdtemp(prefix="ohcs_mf_", dir=os.environ.get("PEERBENCH_DATA") or None)
        try:
            plate = os.path.join(root, os.path.basename(src.rstrip("/")))
            shutil.copytree(src, plate, ignore=shutil.ignore_patterns("ground_truth"))
            declare_pixel_size(plate, a.pixel_size)
            compile_s, execute_s, names = run_pipeline(a, plate)
        finally:
            if os.environ.get("KEEP") != "1":
                shutil.rmtree(root, ignore_errors=True)
        out.update(compile_s=round(compile_s, 2), execute_s=round(execute_s, 2), MB_per_s=round(mb / execute_s, 2),
                   images_per_s=round(len(images) / execute_s, 2), steps=names)
    out.update(peak_rss_mib=round(peak_rss_mib(), 1), versions=versions("openhcs", "numpy", "scikit-image", "torch"))
    print(json.dumps(out), flush=True)


if __name__ == "__main__":
    main()
