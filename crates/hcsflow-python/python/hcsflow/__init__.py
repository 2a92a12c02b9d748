"""hcsflow: high-content-screening pipelines on a Rust engine.

The engine is the same one the ``hcsflow`` command line runs: this package is a
thin front end over it. First slice: call any built-in function on a numpy
array, run a pipeline file on a plate (or print its plan), write a synthetic
plate; every error is a subclass of :class:`HcsflowError`.
"""

from __future__ import annotations

import json
import os
from typing import Any, Callable

from . import _hcsflow, functions
from ._hcsflow import (
    ArrayError,
    CompileError,
    DeviceUnavailableError,
    FunctionError,
    HcsflowError,
    MemoryConversionError,
    PlateError,
    __version__,
    function_names,
    stack_slices,
    synth_plate,
    unstack_slices,
)

__all__ = [
    "ArrayError",
    "CompileError",
    "DeviceUnavailableError",
    "FunctionError",
    "HcsflowError",
    "MemoryConversionError",
    "PlateError",
    "__version__",
    "call",
    "functions",
    "function_names",
    "run",
    "stack_slices",
    "synth_plate",
    "unstack_slices",
]


def call(name: str, array: Any, *, device: str = "cpu", allow_software_gpu: bool = False,
         allow_host_round_trip: bool = False, **kwargs: Any) -> Any:
    """Run the built-in function ``name`` on ``array`` (3D ``[Z, Y, X]``; uint8,
    uint16 or float32) with its arguments as keywords, and return the result as
    a new numpy array. ``hcsflow functions`` (or :func:`function_names`) lists
    the functions; their arguments, types and ranges are those of the CLI.
    """
    return _hcsflow.call(name, array, device=device, allow_software_gpu=allow_software_gpu,
                         allow_host_round_trip=allow_host_round_trip, **kwargs)


def run(plate: str | os.PathLike[str], pipeline: str | os.PathLike[str], out: str | os.PathLike[str], *,
        device: str = "auto", workers: int | None = None, resume: bool = False, overwrite: bool = False,
        dry_run: bool = False, allow_software_gpu: bool = False, allow_host_round_trip: bool = False,
        progress: Callable[[dict[str, Any]], Any] | None = None) -> Any:
    """Run the pipeline file ``pipeline`` (TOML) on ``plate`` into ``out``, as
    ``hcsflow run`` does. With ``dry_run`` return the plan text (nothing is
    read or written). Otherwise return the summary: a dict with ``total``,
    ``completed``, ``skipped``, ``failed`` (``{"well", "error"}`` each),
    ``not_started``, ``out`` and the run ``report``. Failed wells are reported
    there, not raised; problems found before any well runs raise.

    ``progress``, if given, is called with one dict per event as wells run:
    ``{"event": "started" | "step" | "finished" | "skipped", "well": ..., ...}``
    (``step`` adds ``step``, ``index``, ``steps``; ``finished`` adds ``done``,
    ``total``, ``seconds``, ``error``). It runs on the engine's worker threads,
    holding the GIL for the call only; an exception it raises is reported as
    unraisable and the run goes on.
    """
    result = _hcsflow.run(os.fspath(plate), os.fspath(pipeline), os.fspath(out), device=device, workers=workers,
                          resume=resume, overwrite=overwrite, dry_run=dry_run,
                          allow_software_gpu=allow_software_gpu, allow_host_round_trip=allow_host_round_trip,
                          progress=progress)
    return result if dry_run else json.loads(result)
