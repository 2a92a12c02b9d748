"""Memory-type decorators for users' functions, named as in OpenHCS.

A pipeline step may run a Python function of yours. Declare which array
library it takes and returns, and the engine plans, before the run, how each
stack gets there and back::

    from hcsflow.memory import numpy, torch, memory_types

    @numpy
    def background(stack):            # receives a numpy array [Z, Y, X]
        return stack - stack.min(axis=(1, 2), keepdims=True)

    @torch(contract="pure_2d")         # called once per plane, with a 2D tensor
    def blur(plane): ...

    @memory_types(input_type="numpy", output_type="torch")
    def to_tensor(stack): ...

A decorator sets ``input_memory_type``, ``output_memory_type``, ``contract``
and ``oom_recovery`` on the function and returns the function itself, so it
stays callable as before. A function without a decorator is taken as
``@numpy``. Functions receive arrays already on the step's device (CPU
tensors with ``--device cpu``), take no device argument, and must return a
3D ``[Z, Y, X]`` array of their output type (``pure_2d``: a 2D plane) in
uint8, uint16 or float32.

``contract``: ``pure_3d`` (default: the whole stack, any number of planes
back), ``pure_2d`` (one plane at a time, as many planes back) or
``volumetric_to_slice`` (the whole stack, one plane back). ``oom_recovery``
is recorded for GPU runtimes; on the CPU there is nothing to recover.
"""

from __future__ import annotations

import difflib
from typing import Any, Callable, TypeVar

from ._hcsflow import CompileError

#: The memory types a Python function may declare.
MEMORY_TYPES = ("numpy", "torch", "cupy", "jax", "tensorflow", "pyclesperanto")
#: The contracts a Python function may declare.
CONTRACTS = ("pure_3d", "pure_2d", "volumetric_to_slice")

F = TypeVar("F", bound=Callable[..., Any])


def _check(kind: str, value: str, allowed: tuple[str, ...]) -> str:
    if value not in allowed:
        close = difflib.get_close_matches(str(value), allowed, n=1)
        hint = f" (did you mean '{close[0]}'?)" if close else ""
        raise CompileError(f"unknown {kind} '{value}'{hint}: expected one of {', '.join(allowed)}")
    return value


def memory_types(*, input_type: str, output_type: str, contract: str = "pure_3d",
                 oom_recovery: bool = False) -> Callable[[F], F]:
    """Declares the memory types a function takes (``input_type``) and
    returns (``output_type``); unknown names raise :class:`CompileError`."""
    _check("memory type", input_type, MEMORY_TYPES)
    _check("memory type", output_type, MEMORY_TYPES)
    _check("contract", contract, CONTRACTS)

    def decorate(func: F) -> F:
        func.input_memory_type = input_type  # type: ignore[attr-defined]
        func.output_memory_type = output_type  # type: ignore[attr-defined]
        func.contract = contract  # type: ignore[attr-defined]
        func.oom_recovery = oom_recovery  # type: ignore[attr-defined]
        return func

    return decorate


def _library(name: str) -> Callable[..., Any]:
    def decorator(func: Any = None, *, input_type: str = name, output_type: str = name,
                  contract: str = "pure_3d", oom_recovery: bool = False) -> Any:
        decorate = memory_types(input_type=input_type, output_type=output_type, contract=contract,
                                oom_recovery=oom_recovery)
        return decorate(func) if func is not None else decorate

    decorator.__name__ = decorator.__qualname__ = name
    decorator.__doc__ = (f"Declares a function on {name} arrays: ``@{name}`` or "
                         f"``@{name}(input_type=..., output_type=..., contract=..., oom_recovery=...)``.")
    return decorator


numpy = _library("numpy")
torch = _library("torch")
cupy = _library("cupy")
jax = _library("jax")
tensorflow = _library("tensorflow")
pyclesperanto = _library("pyclesperanto")


def declared(func: Callable[..., Any]) -> tuple[str, str, str]:
    """The (input type, output type, contract) of a function: its decorator's,
    or numpy and ``pure_3d`` for an undecorated one."""
    return (getattr(func, "input_memory_type", "numpy"), getattr(func, "output_memory_type", "numpy"),
            getattr(func, "contract", "pure_3d"))
