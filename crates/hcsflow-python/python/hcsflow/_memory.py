"""The library-specific half of each memory conversion (the engine plans them).

The engine decides, before a run, which conversion brings a stack to a
function and back (``host → torch (zero-copy, dlpack)``, ...); it calls
:func:`convert` for each planned edge and :func:`describe` on every array a
user's function returns. Nothing here chooses a route or falls back to a copy.

Zero-copy is what the libraries' DLPack support gives on the CPU: numpy,
torch and JAX share host buffers (JAX only 64-byte aligned ones: the engine
aligns its buffers; JAX copies a misaligned buffer, which the plan states).
Arrays leave a library for a Rust stack through numpy, which views the
library's buffer, and one copy into the stack.
"""

from __future__ import annotations

from typing import Any

import numpy as np

#: The Python type each memory type's arrays have, for error messages.
_TYPE_NAMES = {
    "numpy": "numpy.ndarray",
    "torch": "torch.Tensor",
    "jax": "jax.Array",
    "tensorflow": "tf.Tensor",
    "cupy": "cupy.ndarray",
    "pyclesperanto": "a pyclesperanto array",
}


def _is(array: Any, memory_type: str) -> bool:
    """True if ``array`` is an array of ``memory_type``'s library."""
    if memory_type == "numpy":
        return isinstance(array, np.ndarray)
    if memory_type == "torch":
        import torch
        return isinstance(array, torch.Tensor)
    if memory_type == "jax":
        import jax
        return isinstance(array, jax.Array)
    if memory_type == "tensorflow":
        import tensorflow as tf
        return bool(tf.is_tensor(array))
    if memory_type == "pyclesperanto":
        return type(array).__module__.startswith("pyclesperanto")
    return False


def describe(array: Any, memory_type: str) -> tuple[list[int], str]:
    """The shape and dtype name (``uint8``, ``float32``, ...) of an array a
    function declared as ``memory_type`` returned; ``TypeError`` if it is not
    an array of that library."""
    if not _is(array, memory_type):
        raise TypeError(f"returned {type(array).__module__}.{type(array).__qualname__}, "
                        f"but its output memory type is {memory_type} ({_TYPE_NAMES[memory_type]})")
    dtype = str(array.dtype)
    if memory_type == "torch":
        dtype = dtype.removeprefix("torch.")
    elif memory_type == "tensorflow":
        dtype = array.dtype.name
    return [int(n) for n in array.shape], dtype


def as_numpy(array: Any) -> Any:
    """numpy's view (no copy) of another library's CPU array, through DLPack;
    a numpy array, or anything without ``__dlpack__``, as it is."""
    if isinstance(array, np.ndarray) or not hasattr(array, "__dlpack__"):
        return array
    if hasattr(array, "detach"):
        array = array.detach()  # a torch tensor that requires grad exports only detached
    return np.from_dlpack(array)


def _to_numpy(array: Any, source: str) -> np.ndarray:
    if source == "pyclesperanto":
        import pyclesperanto as cle
        return np.asarray(cle.pull(array))
    return as_numpy(array)


def convert(array: Any, source: str, target: str) -> Any:
    """``array`` of library ``source`` as an array of ``target`` (``numpy``
    stands for the host): zero-copy through DLPack between host libraries, a
    device copy (``push``/``pull``) to and from pyclesperanto."""
    if target == "numpy":
        return _to_numpy(array, source)
    if target == "torch":
        import torch
        return torch.from_dlpack(_to_numpy(array, source) if source == "pyclesperanto" else array)
    if target == "jax":
        import jax.numpy as jnp
        return jnp.from_dlpack(_to_numpy(array, source) if source in ("pyclesperanto", "torch") else array)
    if target == "tensorflow":
        import tensorflow as tf
        return tf.experimental.dlpack.from_dlpack(_to_numpy(array, source).__dlpack__())
    if target == "pyclesperanto":
        import pyclesperanto as cle
        return cle.push(_to_numpy(array, source))
    raise ValueError(f"no conversion to {target}")
