"""nvmath-python's process group on Accord: ``nvmath.distributed.initialize(device_id,
ProcessGroup(comm))`` runs under ``accord run``, Ray or Dask without MPI or torch.distributed::

    import accord, accord.nvmath, nvmath.distributed
    comm = accord.init()
    nvmath.distributed.initialize(device_id, accord.nvmath.ProcessGroup(comm))

nvmath uses its process group only to start its own runtime (NVSHMEM, NCCL) and to agree on
setup values; the math runs on nvmath's libraries. Every call here has Accord's deadlines and
desync checks.
"""

from __future__ import annotations

import functools
from typing import Any, Callable, Optional, TypeVar

from . import Communicator, default_group

try:  # nvmath's abstract base, so that nvmath's isinstance checks accept this group
    from nvmath.distributed.process_group import ProcessGroup as _Base
except Exception:  # nvmath-python not installed (or too old): the same protocol, checked by duck typing
    _Base = object  # type: ignore[misc, assignment]

T = TypeVar("T")

#: nvmath's ``ReductionOp`` values (an IntEnum: SUM=0, MIN=1, MAX=2), by value and name.
_OPS = {0: "sum", 1: "min", 2: "max", "SUM": "sum", "MIN": "min", "MAX": "max"}


def _op(op: Any) -> str:
    name = getattr(op, "name", None)
    if name in _OPS:
        return _OPS[name]
    if isinstance(op, str) and op.lower() in ("sum", "min", "max"):
        return op.lower()
    if isinstance(op, int) and op in _OPS:
        return _OPS[op]
    raise ValueError(f"unsupported reduction op {op!r}: nvmath's ReductionOp.SUM, MIN or MAX")


class ProcessGroup(_Base):  # type: ignore[misc, valid-type]
    """nvmath-python's ``ProcessGroup`` interface on an Accord communicator (the default group
    when ``comm`` is None): ``rank``, ``nranks``, ``broadcast_buffer``, ``allreduce_buffer``
    (in place) and ``allreduce_object``."""

    def __init__(self, comm: Optional[Communicator] = None):
        self._comm = comm if comm is not None else default_group()

    @property
    def rank(self) -> int:
        return self._comm.rank

    @property
    def nranks(self) -> int:
        return self._comm.size

    @property
    def communicator(self) -> Communicator:
        """The Accord communicator underneath."""
        return self._comm

    def broadcast_buffer(self, array: Any, *, root: int = 0) -> None:
        """Copy ``root``'s ``array`` into every rank's (in place)."""
        self._comm.broadcast(array, root=root)

    def allreduce_buffer(self, array: Any, *, op: Any) -> None:
        """Reduce ``array`` over the group with ``op`` (nvmath's ``ReductionOp``), in place."""
        self._comm.allreduce(array, op=_op(op))

    def allreduce_object(self, obj: T, *, op: Callable[[T, T], T]) -> T:
        """``op`` folded over every rank's ``obj`` in rank order; every rank gets the same result
        (the objects are pickled: unpickling runs the sender's code)."""
        return functools.reduce(op, self._comm.all_gather_object(obj))
