"""Every built-in function of the engine as a Python callable.

``hcsflow.functions.gaussian_blur(stack, sigma=2.0)`` is
``hcsflow.call("gaussian_blur", stack, sigma=2.0)``: the function's arguments
are keywords, checked by the engine (names, types, ranges) exactly as
``hcsflow apply --arg`` checks them. Each callable's docstring lists its
arguments with their defaults, as ``hcsflow functions`` prints them.
"""

from __future__ import annotations

import json
from typing import Any, Callable

from . import _hcsflow

_CATALOGUE: dict[str, dict[str, Any]] = {f["name"]: f for f in json.loads(_hcsflow.catalogue_json())}


def _docstring(spec: dict[str, Any]) -> str:
    lines = [spec["doc"], "", f"Contract: {spec['contract']}; memory types: {', '.join(spec['memory_types'])}."]
    if spec["args"]:
        lines += ["", "Keyword arguments:"]
        for arg in spec["args"]:
            kind = arg["type"]
            if kind == "choice":
                kind = " | ".join(repr(c) for c in arg["choices"])
            lines.append(f"    {arg['name']} ({kind}, default {arg['default']!r}): {arg['doc']}")
    lines += ["", "device: 'cpu' (default), 'auto', 'gpu' or 'gpu:N'."]
    return "\n".join(lines)


def _make(name: str) -> Callable[..., Any]:
    def function(array: Any, *, device: str = "cpu", dtype: str = "input", stretch: bool = False,
                 allow_software_gpu: bool = False, allow_host_round_trip: bool = False, **kwargs: Any) -> Any:
        return _hcsflow.call(name, array, device=device, dtype=dtype, stretch=stretch,
                             allow_software_gpu=allow_software_gpu, allow_host_round_trip=allow_host_round_trip,
                             **kwargs)

    function.__name__ = function.__qualname__ = name
    function.__module__ = __name__
    function.__doc__ = _docstring(_CATALOGUE[name])
    return function


for _name in _CATALOGUE:
    globals()[_name] = _make(_name)

__all__ = sorted(_CATALOGUE)


def __getattr__(name: str) -> Any:
    names = ", ".join(__all__)
    raise AttributeError(f"hcsflow.functions has no function {name!r}; it has: {names}")
