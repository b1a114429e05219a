"""Operands of distributed operations: numpy, CuPy and torch arrays alike.

The Rust plans work on C-order arrays. An F-order operand is the C-order array of its
transpose, so it goes through as that transpose with every box reversed, and its result comes
back transposed again: the caller sees the memory order it passed.
"""

from __future__ import annotations

from typing import Any, Sequence, Tuple


def framework(a: Any) -> str:
    """'numpy', 'cupy' or 'torch'; a TypeError for anything else."""
    root = type(a).__module__.split(".")[0]
    if root in ("numpy", "cupy", "torch"):
        return root
    raise TypeError(
        f"operand: expected a numpy.ndarray, cupy.ndarray or torch.Tensor, got {type(a).__name__}"
    )


def transpose(a: Any) -> Any:
    """The array with its axes reversed (a view)."""
    if framework(a) == "torch":
        return a.permute(*reversed(range(a.ndim)))
    return a.T


def _c_contiguous(a: Any) -> bool:
    if framework(a) == "torch":
        return a.is_contiguous()
    return bool(a.flags.c_contiguous)


def orders(a: Any) -> str:
    """The memory orders `a` can be read in: 'C', 'F', or 'CF' for arrays that are both (one
    element thick, or empty); a ValueError for strided views."""
    found = ("C" if _c_contiguous(a) else "") + ("F" if _c_contiguous(transpose(a)) else "")
    if not found:
        raise ValueError(
            f"operand: the array of shape {tuple(a.shape)} is neither C- nor F-contiguous; pass a "
            "contiguous copy (numpy.ascontiguousarray, tensor.contiguous())"
        )
    return found


def agree(told: Sequence[str], rank: int, what: str) -> str:
    """The order every rank can read its operand in, given each rank's `orders` (C if all can);
    a ValueError naming two ranks that cannot agree."""
    for order in "CF":
        if all(order in t for t in told):
            return order
    c = next(r for r, t in enumerate(told) if t == "C")
    f = next(r for r, t in enumerate(told) if t == "F")
    raise ValueError(
        f"{what}: rank {c}'s operand is C-ordered but rank {f}'s F-ordered; every rank must pass "
        "the same memory order"
    )


def c_view(a: Any, order: str) -> Tuple[Any, bool]:
    """A C-order view of `a`, read in `order`, and whether it is the transpose."""
    if order == "C":
        return a, False
    return transpose(a), True


def dtype_name(a: Any) -> str:
    """numpy's name of the operand's dtype ('complex64', 'float32'...)."""
    if framework(a) == "torch":
        return str(a.dtype).replace("torch.", "")
    return str(a.dtype)


def dtype_like(a: Any, name: str) -> Any:
    """The dtype called `name` in `a`'s framework."""
    if framework(a) == "torch":
        import torch

        return getattr(torch, name)
    if framework(a) == "cupy":
        import cupy

        return cupy.dtype(name)
    import numpy

    return numpy.dtype(name)


def check_like(new: Any, old: Any, order: str, hint: str) -> None:
    """A ValueError unless `new` can take `old`'s place in a plan: same local shape, dtype,
    framework and device, readable in `order`. `hint` says what to do instead."""

    def describe(a: Any) -> str:
        return f"{framework(a)} on {getattr(a, 'device', 'cpu')}, shape {tuple(a.shape)}, {dtype_name(a)}"

    same = (
        tuple(new.shape) == tuple(old.shape)
        and dtype_name(new) == dtype_name(old)
        and framework(new) == framework(old)
        and str(getattr(new, "device", "cpu")) == str(getattr(old, "device", "cpu"))
        and order in orders(new)
    )
    if not same:
        raise ValueError(
            f"reset_operand: the new operand ({describe(new)}, order {orders(new)}) differs from "
            f"the planned one ({describe(old)}, order {order}); {hint}"
        )
