"""hcsflow: high-content-screening pipelines on a Rust engine.

The engine is the same one the ``hcsflow`` command line runs: this package is a
thin front end over it. Call any built-in function on a numpy array
(:mod:`hcsflow.functions`), build pipelines whose steps mix built-ins and your
own numpy/torch/jax functions (:class:`Pipeline`, :class:`FunctionStep`,
:mod:`hcsflow.memory`), run them on a plate or print their plan; every error
is a subclass of :class:`HcsflowError`.
"""

from __future__ import annotations

import json
import os
from typing import Any, Callable

from . import _hcsflow, functions, memory
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
from .pipeline import FunctionStep, Pipeline
from .plate import Plate, open_plate

__all__ = [
    "ArrayError",
    "CompileError",
    "DeviceUnavailableError",
    "FunctionError",
    "FunctionStep",
    "HcsflowError",
    "MemoryConversionError",
    "Pipeline",
    "Plate",
    "PlateError",
    "__version__",
    "call",
    "functions",
    "function_names",
    "memory",
    "open_plate",
    "run",
    "stack_slices",
    "synth_plate",
    "unstack_slices",
]


def call(name: str, array: Any, *, device: str = "cpu", dtype: str = "input", stretch: bool = False,
         allow_software_gpu: bool = False, allow_host_round_trip: bool = False, **kwargs: Any) -> Any:
    """Run the built-in function ``name`` on ``array`` (3D ``[Z, Y, X]``; uint8,
    uint16 or float32; numpy, or a torch/jax CPU array through DLPack) with its
    arguments as keywords, and return the result as a new numpy array.
    ``hcsflow functions`` (or :func:`function_names`) lists the functions;
    their arguments, types and ranges are those of the CLI. ``dtype``
    (``"input"``, ``"u8"``, ``"u16"``, ``"f32"``) and ``stretch`` are
    ``hcsflow apply``'s ``--dtype`` and ``--stretch``.
    """
    return _hcsflow.call(name, array, device=device, dtype=dtype, stretch=stretch,
                         allow_software_gpu=allow_software_gpu, allow_host_round_trip=allow_host_round_trip, **kwargs)


def _tqdm_progress() -> Callable[[dict[str, Any]], Any] | None:
    """A progress callback drawing a tqdm bar of finished wells, if tqdm is installed."""
    try:
        from tqdm import tqdm
    except ImportError:
        return None
    import threading

    bar: dict[str, Any] = {}
    lock = threading.Lock()  # events come from the engine's worker threads

    def progress(event: dict[str, Any]) -> None:
        if event["event"] != "finished":
            return
        with lock:
            if "bar" not in bar:
                bar["bar"] = tqdm(total=event["total"], unit="well", desc="hcsflow")
            bar["bar"].update(1)
            if event["done"] == event["total"]:
                bar["bar"].close()

    return progress


def run(plate: str | os.PathLike[str], pipeline: str | os.PathLike[str] | Pipeline, out: str | os.PathLike[str], *,
        device: str = "auto", workers: int | None = None, resume: bool = False, overwrite: bool = False,
        dry_run: bool = False, allow_software_gpu: bool = False, allow_host_round_trip: bool = False,
        progress: Callable[[dict[str, Any]], Any] | bool | None = None,
        max_memory: str | int | None = None, gpu_memory: str | int | None = None) -> Any:
    """Run ``pipeline`` (a :class:`Pipeline`, or a pipeline file whose Python
    functions are named ``module:function``) on ``plate`` into ``out``, as
    ``hcsflow run`` does. With ``dry_run`` return the plan text, every
    conversion route included (nothing is read or written). Otherwise return
    the summary: a dict with ``total``, ``completed``, ``skipped``, ``failed``
    (``{"well", "error"}`` each; a Python exception's traceback is in
    ``error``), ``not_started``, ``out`` and the run ``report``. Failed wells
    are reported there, not raised; problems found before any well runs raise.

    ``progress``: a callable receives one dict per event as wells run:
    ``{"event": "started" | "step" | "finished" | "skipped", "well": ..., ...}``
    (``step`` adds ``step``, ``index``, ``steps``; ``finished`` adds ``done``,
    ``total``, ``seconds``, ``error``), and, before any well, per plate-wide
    step ``{"event": "plate_step_started", "step", "groups", "planes"}`` and
    ``{"event": "plate_step_finished", "step", "seconds", "reused", "error"}``
    (``reused``: re-read from an earlier run). It runs on the engine's worker threads,
    holding the GIL for the call only; an exception it raises is reported as
    unraisable and the run goes on. ``None`` (the default) draws a tqdm bar
    when tqdm is installed; ``False`` reports nothing.

    ``max_memory`` / ``gpu_memory``: ``hcsflow run``'s ``--max-memory`` (the
    wells in flight) and ``--gpu-memory`` (one GPU call on one stack), as bytes
    or a size such as ``"4G"``; a bad size raises ``ValueError``. A
    ``max_memory`` below one well's estimated peak warns (``ResourceWarning``):
    such a well runs alone and may go over it.
    """
    if not isinstance(pipeline, Pipeline):
        pipeline = Pipeline.load(pipeline)
    if progress is None:
        progress = None if dry_run else _tqdm_progress()
    elif progress is False or progress is True:
        progress = _tqdm_progress() if progress else None
    result = _hcsflow.run(os.fspath(plate), pipeline.to_json(), pipeline.origin, os.fspath(out), device=device,
                          workers=workers, resume=resume, overwrite=overwrite, dry_run=dry_run,
                          allow_software_gpu=allow_software_gpu, allow_host_round_trip=allow_host_round_trip,
                          progress=progress, max_memory=None if max_memory is None else str(max_memory),
                          gpu_memory=None if gpu_memory is None else str(gpu_memory))
    return result if dry_run else json.loads(result)
