"""Small helpers over numpy arrays and torch tensors for the list-based Ray API."""

from __future__ import annotations

from typing import Any, Sequence


def _is_torch(x: Any) -> bool:
    return type(x).__module__.startswith("torch")


def empty_stack(like: Any, n: int) -> Any:
    """A new contiguous array of shape (n, *like.shape) and like's dtype."""
    if _is_torch(like):
        import torch

        return torch.empty((n, *like.shape), dtype=like.dtype)
    import numpy as np

    return np.empty((n, *like.shape), dtype=like.dtype)


def concat(arrays: Sequence[Any]) -> Any:
    """The arrays, flattened and concatenated into one new contiguous array."""
    if _is_torch(arrays[0]):
        import torch

        return torch.cat([a.reshape(-1) for a in arrays]).contiguous()
    import numpy as np

    return np.ascontiguousarray(np.concatenate([np.ravel(a) for a in arrays]))


def copy_into(dst: Any, src: Any) -> None:
    """dst[...] = src (same number of elements)."""
    if _is_torch(dst):
        dst.copy_(src.reshape(dst.shape))
    else:
        dst[...] = src.reshape(dst.shape)
