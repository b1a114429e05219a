"""Small helpers over numpy arrays, torch tensors (CPU or CUDA) and CuPy arrays for the
list-based Ray API. New arrays are made on the device of the array they are modelled on, so
that a group fed GPU tensors stays on the GPU."""

from __future__ import annotations

import sys
from typing import Any, Sequence


def is_immutable_scalar(x: Any) -> bool:
    """A Python number or a numpy scalar: nothing can be written into it."""
    if isinstance(x, (int, float, complex)):
        return True
    np = sys.modules.get("numpy")
    return np is not None and isinstance(x, np.generic)


def require_writable(x: Any, what: str) -> None:
    """Refuse an immutable scalar where a call that returns nothing must write its result."""
    if is_immutable_scalar(x):
        raise TypeError(
            f"{what} is a {type(x).__module__}.{type(x).__qualname__} scalar, which cannot be "
            "written in place, and this call returns nothing; pass an array (e.g. "
            "numpy.array(x), a 0-d array) and read the result from it"
        )


def _is_torch(x: Any) -> bool:
    return type(x).__module__.startswith("torch")


def _is_cupy(x: Any) -> bool:
    return type(x).__module__.startswith("cupy")


def empty_stack(like: Any, n: int) -> Any:
    """A new contiguous array of shape (n, *like.shape), like's dtype and device."""
    if _is_torch(like):
        import torch

        return torch.empty((n, *like.shape), dtype=like.dtype, device=like.device)
    if _is_cupy(like):
        import cupy

        with like.device:
            return cupy.empty((n, *like.shape), dtype=like.dtype)
    import numpy as np

    return np.empty((n, *like.shape), dtype=like.dtype)


def concat(arrays: Sequence[Any]) -> Any:
    """The arrays, flattened and concatenated into one new contiguous array (on their device)."""
    if _is_torch(arrays[0]):
        import torch

        return torch.cat([a.reshape(-1) for a in arrays]).contiguous()
    if _is_cupy(arrays[0]):
        import cupy

        with arrays[0].device:
            return cupy.ascontiguousarray(cupy.concatenate([cupy.ravel(a) for a in arrays]))
    import numpy as np

    return np.ascontiguousarray(np.concatenate([np.ravel(a) for a in arrays]))


def copy_into(dst: Any, src: Any) -> None:
    """dst[...] = src (same number of elements, same device)."""
    if _is_torch(dst):
        dst.copy_(src.reshape(dst.shape))
    else:
        dst[...] = src.reshape(dst.shape)
