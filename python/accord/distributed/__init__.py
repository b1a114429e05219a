"""Distributed arrays: each rank holds one box of a global array (SPMD), as nvmath-python's
distributed APIs take it, on host (numpy) or GPU (CuPy, torch) memory, under any of Accord's
bootstraps and without NVSHMEM::

    import accord, numpy as np
    from accord.distributed import Slab, Box, redistribute
    comm = accord.init()
    # This rank's rows of a 6 x 4 matrix, split by rows (Slab.X) ...
    a = np.full(Slab.X.shape(comm, (6, 4)), comm.rank, np.float64)
    # ... redistributed by columns.
    b = redistribute(a, Slab.X, Slab.Y)

Distributions: :class:`Box` (this rank's part, ``lower`` inclusive, ``upper`` exclusive),
:class:`Slab` (split along one axis; the first ``n % P`` ranks get one plane more, as nvmath's
``Slab``) and :class:`Block` (split over a process grid: pencils). Boxes may be empty. The
boxes of all ranks must tile the global array; a gap, an overlap or a wrong shape raises
:class:`accord.InvalidArgumentError` naming the ranks, on every rank.

:func:`redistribute` / :class:`Redistribute` move an operand between layouts (one alltoallv,
with strided blocks packed and unpacked); :mod:`accord.distributed.fft` is the distributed FFT
on top. Operands may be C- or F-ordered; results are new arrays in the operand's order,
framework and device. GPU operands run on the framework's current stream, like every CUDA call
of Accord.

Unlike nvmath-python, operands need no symmetric memory and results are not in place.
"""

from __future__ import annotations

from typing import Any, List, Optional, Sequence, Tuple

from .. import _arrays, _native, _objects
from . import _operands

__all__ = [
    "Box",
    "Block",
    "Distribution",
    "Redistribute",
    "Slab",
    "initialize",
    "redistribute",
]

_default_comm: Any = None


def initialize(comm: Any) -> None:
    """Use `comm` for distributed operations that are not given ``comm=`` (otherwise the
    default group of :func:`accord.init`)."""
    global _default_comm
    _default_comm = comm


def communicator(comm: Any = None) -> Any:
    """`comm`, else the one of :func:`initialize`, else accord's default group."""
    if comm is not None:
        return comm
    if _default_comm is not None:
        return _default_comm
    import accord

    return accord.default_group()


class Distribution:
    """How a global array is split among ranks."""

    def box(self, rank: int, size: int, global_shape: Sequence[int]) -> "Box":
        """Rank `rank`'s box of an array of `global_shape` over `size` ranks."""
        raise NotImplementedError

    def shape(self, comm: Any, global_shape: Sequence[int], rank: Optional[int] = None) -> Tuple[int, ...]:
        """The local shape of `rank` (this rank by default) for an array of `global_shape`."""
        comm = communicator(comm)
        r = comm.rank if rank is None else rank
        return self.box(r, comm.size, global_shape).shape

    def _global_shape(self, shapes: List[Tuple[int, ...]]) -> Tuple[int, ...]:
        raise NotImplementedError


class Box(Distribution):
    """This rank's part of the global array: indices ``lower[a] <= i < upper[a]`` on every axis
    (nvmath's ``Box``; ``lower == upper`` on an axis makes it empty)."""

    def __init__(self, lower: Sequence[int], upper: Sequence[int]):
        lower, upper = tuple(lower), tuple(upper)
        if len(lower) != len(upper):
            raise ValueError(f"Box: lower {lower} and upper {upper} have different lengths")
        if not all(isinstance(x, int) and x >= 0 for x in lower + upper):
            raise ValueError(f"Box: coordinates must be integers >= 0, got {lower} and {upper}")
        if any(u < l for l, u in zip(lower, upper)):
            raise ValueError(f"Box: upper {upper} lies below lower {lower}")
        self.lower, self.upper = lower, upper

    @property
    def shape(self) -> Tuple[int, ...]:  # type: ignore[override]
        return tuple(u - l for l, u in zip(self.lower, self.upper))

    @property
    def ndim(self) -> int:
        return len(self.lower)

    def box(self, rank: int, size: int, global_shape: Sequence[int]) -> "Box":
        return self

    def reversed(self) -> "Box":
        return Box(self.lower[::-1], self.upper[::-1])

    def __iter__(self):
        return iter((self.lower, self.upper))

    def __eq__(self, other: object) -> bool:
        return isinstance(other, Box) and (self.lower, self.upper) == (other.lower, other.upper)

    def __hash__(self) -> int:
        return hash((self.lower, self.upper))

    def __repr__(self) -> str:
        return f"Box({list(self.lower)}, {list(self.upper)})"


class Block(Distribution):
    """Split over a process grid: axis ``a`` into ``grid[a]`` parts (the first ``n % p`` one
    plane larger, as slabs are), rank ``r`` holding the part at its row-major grid coordinates.
    ``Block((2, 2, 1))`` over 4 ranks gives pencils along the last axis."""

    def __init__(self, grid: Sequence[int]):
        self.grid = tuple(int(g) for g in grid)
        if not self.grid or min(self.grid) < 1:
            raise ValueError(f"Block: the process grid {self.grid} needs positive entries")

    def _grid(self, size: int, ndim: int) -> Tuple[int, ...]:
        return self.grid

    def box(self, rank: int, size: int, global_shape: Sequence[int]) -> Box:
        grid = self._grid(size, len(global_shape))
        lower, upper = _native.grid_box(list(grid), [int(n) for n in global_shape], rank, size)
        return Box(lower, upper)

    def _coords(self, rank: int, grid: Sequence[int]) -> List[int]:
        coords = []
        for g in reversed(grid):
            coords.append(rank % g)
            rank //= g
        return coords[::-1]

    def _global_shape(self, shapes: List[Tuple[int, ...]]) -> Tuple[int, ...]:
        ndim = len(shapes[0])
        grid = self._grid(len(shapes), ndim)
        if len(grid) != ndim:
            raise ValueError(f"{self}: the grid has {len(grid)} axes but the operand {ndim}")
        coords = [self._coords(r, grid) for r in range(len(shapes))]
        # Along each axis, the ranks at the grid's origin on every other axis hold one part each.
        return tuple(
            sum(s[a] for s, c in zip(shapes, coords) if all(c[b] == 0 for b in range(ndim) if b != a))
            for a in range(ndim)
        )

    def __eq__(self, other: object) -> bool:
        return type(other) is type(self) and other.grid == self.grid  # type: ignore[attr-defined]

    def __hash__(self) -> int:
        return hash(self.grid)

    def __repr__(self) -> str:
        return f"Block({self.grid})"


class Slab(Block):
    """Split along one axis (``Slab.X``: axis 0, ``Slab.Y``: 1, ``Slab.Z``: 2): of ``n`` planes
    over ``P`` ranks, the first ``n % P`` get ``n // P + 1``, the others ``n // P``."""

    X: "Slab"
    Y: "Slab"
    Z: "Slab"

    def __init__(self, partition_dim: int):
        if not isinstance(partition_dim, int) or partition_dim < 0:
            raise ValueError(f"Slab: partition_dim must be an integer >= 0, got {partition_dim}")
        self.partition_dim = partition_dim
        self.grid = ()

    def _grid(self, size: int, ndim: int) -> Tuple[int, ...]:
        if self.partition_dim >= ndim:
            raise ValueError(f"{self}: a {ndim}-d array has no axis {self.partition_dim}")
        return tuple(size if a == self.partition_dim else 1 for a in range(ndim))

    def __eq__(self, other: object) -> bool:
        return isinstance(other, Slab) and other.partition_dim == self.partition_dim

    def __hash__(self) -> int:
        return hash(("slab", self.partition_dim))

    def __repr__(self) -> str:
        return {0: "Slab.X", 1: "Slab.Y", 2: "Slab.Z"}.get(self.partition_dim, f"Slab({self.partition_dim})")


Slab.X, Slab.Y, Slab.Z = Slab(0), Slab(1), Slab(2)


def bind(comm: Any, operand: Any, dist: Distribution, what: str) -> Tuple[Box, Tuple[int, ...], str]:
    """This rank's box, the global shape and the memory order ('C' or 'F') for `operand` laid
    out as `dist`. Collective: the ranks tell each other their local shapes, boxes and orders,
    so that a slab's or block's global shape, a box list's extent and the order are known
    everywhere and checked alike."""
    local_shape = tuple(int(n) for n in operand.shape)
    if not isinstance(dist, Distribution):
        raise TypeError(f"{what}: expected a Box, Slab or Block, got {dist!r}")
    mine = (repr(dist) if not isinstance(dist, Box) else "Box", local_shape,
            tuple(dist.upper) if isinstance(dist, Box) else None, _operands.orders(operand))
    told = [(k, tuple(s), u, o) for k, s, u, o in _objects.all_gather_object(comm, mine)]
    order = _operands.agree([o for *_, o in told], comm.rank, what)
    for r, (kind, s, _, _) in enumerate(told):
        if kind != mine[0]:
            raise ValueError(f"{what}: rank {r} passes a {kind} distribution but rank {comm.rank} a {mine[0]}")
        if len(s) != len(local_shape):
            raise ValueError(f"{what}: rank {r}'s operand has {len(s)} axes but rank {comm.rank}'s has {len(local_shape)}")
    if isinstance(dist, Box):
        if dist.shape != local_shape:
            raise ValueError(
                f"{what}: rank {comm.rank}'s operand has shape {local_shape} but its box {dist} "
                f"has shape {dist.shape}"
            )
        uppers = [u for _, _, u, _ in told]
        if any(len(u) != len(local_shape) for u in uppers):
            raise ValueError(f"{what}: the ranks' boxes have different numbers of axes")
        return dist, tuple(max(u[a] for u in uppers) for a in range(len(local_shape))), order
    shapes = [s for _, s, _, _ in told]
    global_shape = dist._global_shape(shapes)
    for r, s in enumerate(shapes):
        want = dist.box(r, comm.size, global_shape).shape
        if s != want:
            raise ValueError(
                f"{what}: rank {r}'s operand has shape {s} but {dist} of the global shape "
                f"{global_shape} over {comm.size} ranks gives it {want}"
            )
    return dist.box(comm.rank, comm.size, global_shape), global_shape, order


def output_box(comm: Any, dist: Distribution, global_shape: Sequence[int], what: str) -> Box:
    """This rank's box of an output laid out as `dist` over `global_shape`."""
    if isinstance(dist, Box):
        return dist
    if not isinstance(dist, Distribution):
        raise TypeError(f"{what}: expected a Box, Slab or Block, got {dist!r}")
    return dist.box(comm.rank, comm.size, global_shape)


class Redistribute:
    """A planned redistribution (nvmath's ``Redistribute``): plan once, execute on this operand
    and others like it (:meth:`reset_operand`)::

        with Redistribute(a, Slab.X, Slab.Y) as r:
            r.plan()
            b = r.execute()

    ``operand``: this rank's part (numpy, CuPy or torch; C or F order);
    ``input_distribution``/``output_distribution``: :class:`Box`, :class:`Slab` or
    :class:`Block`. Collective: every rank constructs, plans and executes together.
    """

    def __init__(self, operand: Any, input_distribution: Distribution, output_distribution: Distribution, *, comm: Any = None):
        self.comm = communicator(comm)
        self.operand = operand
        self.input_box, global_shape, self._order = bind(self.comm, operand, input_distribution, "redistribute (input)")
        self.output_box = output_box(self.comm, output_distribution, global_shape, "redistribute (output)")
        if self.output_box.ndim != len(operand.shape):
            raise ValueError(
                f"redistribute: the output box {self.output_box} has {self.output_box.ndim} axes "
                f"but the operand {len(operand.shape)}"
            )
        self._plan: Any = None

    def plan(self) -> None:
        """Plan the exchange (collective: the ranks tell each other their boxes, which must tile
        the global array)."""
        c, transposed = _operands.c_view(self.operand, self._order)
        boxes = [self.input_box, self.output_box]
        if transposed:
            boxes = [b.reversed() for b in boxes]
        self._plan = _native.RedistributePlan(self.comm, tuple(boxes[0]), tuple(boxes[1]), c)

    @property
    def global_shape(self) -> Tuple[int, ...]:
        """The global array's shape (known once planned)."""
        self._check_planned()
        shape = tuple(self._plan.global_shape)
        return shape[::-1] if self._order == "F" else shape

    def _check_planned(self) -> None:
        if self._plan is None:
            raise RuntimeError("Redistribute: call plan() first (or it was freed)")

    def reset_operand(self, operand: Any) -> None:
        """Execute on `operand` from now on: same local shape, dtype, memory order and device."""
        _operands.check_like(operand, self.operand, self._order, "make a new plan")
        self.operand = operand

    def execute(self) -> Any:
        """Move the operand; its new local part, in the operand's memory order."""
        self._check_planned()
        c, transposed = _operands.c_view(self.operand, self._order)
        shape = self.output_box.shape[::-1] if transposed else self.output_box.shape
        out = _arrays.empty(c, shape)
        self._plan.execute(self.comm, c, out)
        return _operands.transpose(out) if transposed else out

    def free(self) -> None:
        """Release the plan."""
        self._plan = None

    def __enter__(self) -> "Redistribute":
        return self

    def __exit__(self, *exc: Any) -> None:
        self.free()


def redistribute(operand: Any, input_distribution: Distribution, output_distribution: Distribution, *, comm: Any = None) -> Any:
    """This rank's part of `operand`'s global array laid out as `output_distribution` (see
    :class:`Redistribute`). Collective."""
    with Redistribute(operand, input_distribution, output_distribution, comm=comm) as r:
        r.plan()
        return r.execute()
