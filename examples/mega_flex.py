"""The Mega Flex pipeline built in Python: the steps, arguments and order of
``examples/mega_flex.toml`` (whose comments say why each step is where it is),
as :class:`hcsflow.FunctionStep` objects, so it can be changed, extended with
your own numpy/torch functions, and run from a notebook.

    python examples/mega_flex.py PLATE OUT [--device auto|cpu|gpu] [--workers N] [--dry-run]

``mega_flex()`` returns the pipeline; the package's tests check that it is the
same pipeline as the TOML file (the same plan, the same outputs).
"""

from __future__ import annotations

import argparse
import sys
from typing import Any, Mapping

import hcsflow
from hcsflow import FunctionStep, Pipeline

#: The N2V2 training of the example: CAREamics' defaults (2 epochs of 100
#: steps, patches of 64², batches of 16), seeded.
N2V_ARGS: Mapping[str, Any] = {"epochs": 2, "steps_per_epoch": 100, "patch_size": 64, "batch_size": 16, "seed": 1}

#: Richardson–Lucy: 4 iterations of a 3D Gaussian PSF (σ_xy 2.5 px, σ_z 0.6
#: planes), the demo plate's optics.
RL_ARGS: Mapping[str, Any] = {"iterations": 4, "sigma_xy": 2.5, "sigma_z": 0.6, "negative": "clip"}


def mega_flex(n2v: Mapping[str, Any] = N2V_ARGS, richardson_lucy: Mapping[str, Any] = RL_ARGS) -> Pipeline:
    """The Mega Flex pipeline. ``n2v`` and ``richardson_lucy`` replace the
    arguments of the denoising and deconvolution steps (e.g. a shorter
    training for a quick look)."""
    correct = ("basic_correct", {"camera_offset": 100})
    steps = [
        # Registration branch: one plate-wide BaSiC fit, then corrected, projected, enhanced
        # tiles whose composite gives the tile positions.
        FunctionStep(("basic_fit", {"working_size": 128, "camera_offset": 100}), name="flatfield",
                     variable_components=["site", "z_index"], scope="plate", sample=200, seed=0, device="cpu"),
        FunctionStep(correct, name="registration_corrected", variable_components=["site"],
                     artifacts_from={"basic_profiles": "flatfield"}, dtype="f32"),
        FunctionStep("max_projection", name="registration_max_z", variable_components=["z_index"]),
        FunctionStep([("sharpen", {"radius": 3.0, "amount": 1.0}),
                      ("stack_percentile_normalize", {"low_percentile": 1.0, "high_percentile": 99.5, "target_max": 1.0}),
                      ("clahe", {"clip_limit": 0.01})],
                     name="enhance", variable_components=["site"], dtype="f32", device="cpu"),
        FunctionStep("composite", name="composite", variable_components=["channel"], group_by="none"),
        FunctionStep("tile_positions", name="positions", variable_components=["site"], group_by="none", device="cpu"),
        # Measurement branch: the raw planes again, corrected, denoised, deconvolved in 3D,
        # projected and assembled at those positions; nuclei on the DAPI mosaic.
        FunctionStep(correct, name="corrected", variable_components=["site"], input_source="pipeline_start",
                     artifacts_from={"basic_profiles": "flatfield"}, dtype="f32", materialize=["tiff"]),
        FunctionStep(("n2v_denoise", dict(n2v)), name="denoised", variable_components=["site", "z_index"],
                     dtype="f32", materialize=["tiff"], device="cpu"),
        FunctionStep(("richardson_lucy", dict(richardson_lucy)), name="deconvolved", variable_components=["z_index"],
                     dtype="f32", materialize=["tiff"], device="cpu"),
        FunctionStep("max_projection", name="max_z", variable_components=["z_index"]),
        FunctionStep(("assemble", {"blend": "linear"}), name="mosaic", variable_components=["site"],
                     artifacts_from={"positions": "positions"}, dtype="f32", materialize=["tiff", "zarr"]),
        FunctionStep({"1": ("segment_nuclei", {"smoothing_sigma": 1.5, "min_area": 40})}, name="nuclei",
                     variable_components=["site"], missing_groups="skip", device="cpu", materialize=["tiff"]),
    ]
    return Pipeline(steps, name="mega_flex",
                    description="BaSiC (plate) → correct → max-Z → sharpen/normalise/equalise → composite → positions; "
                                "correct → N2V2 → RL 3D → max-Z → assemble → nuclei")


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("plate")
    parser.add_argument("out")
    parser.add_argument("--device", default="auto")
    parser.add_argument("--workers", type=int, default=None)
    parser.add_argument("--dry-run", action="store_true", help="print the plan and stop")
    args = parser.parse_args(argv)
    result = hcsflow.run(args.plate, mega_flex(), args.out, device=args.device, workers=args.workers,
                         dry_run=args.dry_run)
    if args.dry_run:
        print(result)
        return 0
    for failure in result["failed"]:
        print(f"{failure['well']}: {failure['error']}", file=sys.stderr)
    print(f"{len(result['completed'])} of {result['total']} wells complete; outputs in {result['out']}")
    return 1 if result["failed"] else 0


if __name__ == "__main__":
    sys.exit(main())
