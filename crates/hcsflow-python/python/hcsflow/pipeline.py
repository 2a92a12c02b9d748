"""Pipelines built in Python: :class:`Pipeline` and :class:`FunctionStep`.

A ``FunctionStep`` is a ``[[steps]]`` table of a pipeline file, with the same
keys and the same four forms of ``func``, where a function is a built-in's
name or a Python callable (see :mod:`hcsflow.memory`):

a. one function: ``func="max_projection"`` or ``func=my_function``;
b. a function with arguments: ``func=("gaussian_filter", {"sigma": 2.0})`` or
   ``func=(my_function, {"threshold": 10})`` (keywords of the callable);
c. a chain, run in order on the same stack: a list of a and b;
d. one chain per group value (with ``group_by``): ``{"1": ..., "2": ...}``.

``Pipeline.load`` reads a pipeline file; there a Python function is named
``"module:function"`` (imported when the pipeline is loaded), which is also
the name a callable gets in plans and reports.
"""

from __future__ import annotations

import functools
import importlib
import json
import os
from typing import Any, Callable, Mapping, Sequence

from . import _hcsflow
from ._hcsflow import CompileError
from .memory import declared

#: Names this process registered, with the callable each stands for.
_REGISTERED: dict[str, Any] = {}


def _base_name(func: Callable[..., Any]) -> str:
    target = func.func if isinstance(func, functools.partial) else func
    module = getattr(target, "__module__", None) or "__main__"
    return f"{module}:{getattr(target, '__qualname__', type(target).__name__)}"


def _per_plane(func: Callable[..., Any], output_type: str) -> Callable[[Any], Any]:
    """``func`` on 2D planes as a function on a stack: called once per plane,
    the planes stacked again by the output library."""
    def run(stack: Any) -> Any:
        planes = [func(stack[i]) for i in range(stack.shape[0])]
        if output_type == "numpy":
            import numpy as np
            return np.stack(planes)
        if output_type == "torch":
            import torch
            return torch.stack(planes)
        if output_type == "jax":
            import jax.numpy as jnp
            return jnp.stack(planes)
        import tensorflow as tf  # the last library register() allows for pure_2d
        return tf.stack(planes)

    return run


def register(func: Callable[..., Any], kwargs: Mapping[str, Any] | None = None) -> str:
    """Registers a Python function (with ``kwargs`` bound) with the engine and
    returns the name pipelines use for it: ``module:qualname``, followed by
    the bound arguments, and ``#n`` if another callable had that name."""
    if not callable(func):
        raise CompileError(f"func {func!r} is neither a function name nor a callable")
    input_type, output_type, contract = declared(func)
    name = _base_name(func)
    if kwargs:
        name += "(" + ", ".join(f"{k}={v!r}" for k, v in kwargs.items()) + ")"
    key = (func, tuple(sorted((kwargs or {}).items(), key=lambda kv: kv[0])))
    base, n = name, 1
    while name in _REGISTERED and _REGISTERED[name] != key:
        n += 1
        name = f"{base}#{n}"
    bound = functools.partial(func, **kwargs) if kwargs else func
    if contract == "pure_2d":
        if output_type == "pyclesperanto" or output_type == "cupy":
            raise CompileError(f"{name}: pure_2d is not available for {output_type} functions; declare pure_3d")
        bound = _per_plane(bound, output_type)
    doc = ((getattr(func, "__doc__", None) or "").strip().splitlines() or [""])[0]
    _hcsflow.register_function(name, bound, input_type, output_type, contract, doc)
    _REGISTERED[name] = key
    return name


def _import(name: str) -> Callable[..., Any]:
    module, _, attr = name.partition(":")
    try:
        target: Any = importlib.import_module(module)
        for part in attr.split("."):
            target = getattr(target, part)
    except (ImportError, AttributeError) as e:
        raise CompileError(f"function '{name}': cannot import it ({type(e).__name__}: {e})") from e
    return target


def _call_json(call: Any, step: str) -> Any:
    """One call of form a or b as the pipeline file's value."""
    if isinstance(call, tuple):
        if len(call) != 2 or not isinstance(call[1], Mapping):
            raise CompileError(f"step '{step}': a function with arguments is (function, {{name: value}}), got {call!r}")
        func, args = call
        if isinstance(func, str):
            return {"name": func, "args": dict(args)}
        return register(func, dict(args))
    if isinstance(call, str):
        return call
    return register(call)


def _chain_json(chain: Any, step: str) -> Any:
    if isinstance(chain, list):
        return [_call_json(c, step) for c in chain]
    return _call_json(chain, step)


def _call_python(value: Any) -> Any:
    """A call as read from a pipeline file, with ``module:function`` names
    imported (their arguments become the callable's keywords)."""
    if isinstance(value, str):
        return _import(value) if ":" in value else value
    name, args = value["name"], value.get("args", {})
    if ":" in name:
        return (_import(name), args) if args else _import(name)
    return (name, args) if args else name


class FunctionStep:
    """One step: ``func`` run over the stacks its ``variable_components``
    form. Keywords are those of a ``[[steps]]`` table (``group_by``,
    ``input_source``, ``materialize``, ``dtype``, ``device``, ...); ``None``
    leaves the engine's default. ``scope="plate"`` runs the step once, before
    the wells, on a sample of the whole plate (at most ``sample`` planes per
    group, default 200, chosen by ``seed``, default 0), e.g. ``basic_fit``."""

    def __init__(self, func: Any, *, name: str | None = None, variable_components: Sequence[str] | None = None,
                 group_by: str | None = None, input_source: str | None = None,
                 materialize: Sequence[str] | None = None, enabled: bool | None = None,
                 missing_groups: str | None = None, dtype: str | None = None, stretch: bool | None = None,
                 artifacts_from: Mapping[str, str] | None = None, device: str | None = None,
                 scope: str | None = None, sample: int | None = None, seed: int | None = None) -> None:
        self.func = func
        self.name = name
        self.options = {
            "variable_components": list(variable_components) if variable_components is not None else None,
            "group_by": group_by,
            "input_source": input_source,
            "materialize": list(materialize) if materialize is not None else None,
            "enabled": enabled,
            "missing_groups": missing_groups,
            "dtype": dtype,
            "stretch": stretch,
            "artifacts_from": dict(artifacts_from) if artifacts_from is not None else None,
            "device": device,
            "scope": scope,
            "sample": sample,
            "seed": seed,
        }

    def _default_name(self, index: int) -> str:
        first = self.func
        while isinstance(first, (list, tuple)) and first:
            first = first[0]
        if isinstance(first, str):
            return first
        return getattr(first, "__name__", f"step_{index + 1}")

    def to_dict(self, index: int = 0) -> dict[str, Any]:
        """The step as a pipeline file's table; Python functions are registered
        and named."""
        name = self.name or self._default_name(index)
        if isinstance(self.func, dict):
            func: Any = {str(k): _chain_json(v, name) for k, v in self.func.items()}
        else:
            func = _chain_json(self.func, name)
        step = {"name": name, "func": func}
        step.update({k: v for k, v in self.options.items() if v is not None})
        return step

    @classmethod
    def from_dict(cls, step: Mapping[str, Any]) -> FunctionStep:
        """A step from a pipeline file's table (``module:function`` names imported)."""
        step = dict(step)
        func = step.pop("func")
        if isinstance(func, dict) and "name" not in func:
            python_func: Any = {k: ([_call_python(c) for c in v] if isinstance(v, list) else _call_python(v))
                                for k, v in func.items()}
        elif isinstance(func, list):
            python_func = [_call_python(c) for c in func]
        else:
            python_func = _call_python(func)
        return cls(python_func, **step)


class Pipeline:
    """Steps run in order on every well of a plate."""

    def __init__(self, steps: Sequence[FunctionStep], *, name: str = "", description: str = "") -> None:
        self.steps = list(steps)
        self.name = name
        self.description = description
        self.origin = "pipeline built in Python"

    @classmethod
    def load(cls, path: str | os.PathLike[str]) -> Pipeline:
        """Reads a pipeline file (TOML); ``module:function`` names are imported."""
        spec = json.loads(_hcsflow.pipeline_json(os.fspath(path)))
        pipeline = cls([FunctionStep.from_dict(s) for s in spec.get("steps", [])], name=spec.get("name", ""),
                       description=spec.get("description", ""))
        pipeline.origin = os.fspath(path)
        return pipeline

    def to_dict(self) -> dict[str, Any]:
        """The pipeline as a pipeline file's structure (Python functions registered)."""
        return {"name": self.name, "description": self.description,
                "steps": [s.to_dict(i) for i, s in enumerate(self.steps)]}

    def to_json(self) -> str:
        return json.dumps(self.to_dict())
