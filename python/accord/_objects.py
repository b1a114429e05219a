"""Python objects through the collectives, as mpi4py's lowercase methods and torch.distributed's
``*_object`` calls have them: each object is pickled into bytes, the byte counts go first (so
every rank can size its buffers), then the bytes, with the array operations underneath (their
deadlines and desync checks included). Results are unpickled copies, the calling rank's own
included.

.. warning::
   Unpickling runs code chosen by whoever made the bytes. Use these calls only between ranks
   you trust: every rank of an Accord job holds its token, and any of them can make every other
   rank run anything through a crafted object.
"""

from __future__ import annotations

import operator
import pickle
from typing import Any, List, Optional, Sequence

__all__ = [
    "broadcast_object",
    "all_gather_object",
    "gather_object",
    "scatter_object_list",
    "send_object",
    "recv_object",
]


def _np() -> Any:
    # numpy only when objects are sent: `import accord` does not need it.
    import numpy

    return numpy


def _dumps(obj: Any) -> Any:
    # A writable copy: the collectives write into the root's buffer in place.
    np = _np()
    return np.frombuffer(bytearray(pickle.dumps(obj, protocol=pickle.HIGHEST_PROTOCOL)), np.uint8)


def _loads(buf: Any) -> Any:
    return pickle.loads(memoryview(buf))


def _split(data: Any, sizes: Any) -> List[Any]:
    np = _np()
    ends = np.cumsum(sizes)
    return [_loads(data[e - s : e]) for s, e in zip(sizes.tolist(), ends.tolist())]


def _all_sizes(comm: Any, data: Any) -> Any:
    """Every rank's byte count, on every rank (the v-operations need the same counts on all)."""
    np = _np()
    sizes = np.zeros(comm.size, np.int64)
    comm.allgather(np.array([data.size], np.int64), out=sizes)
    return sizes


def _root(comm: Any, root: Any) -> int:
    try:
        r = operator.index(root)  # ints, numpy integers
    except TypeError:
        r = None
    if r is None or isinstance(root, bool) or not 0 <= r < comm.size:
        raise ValueError(f"root must be a rank of this communicator (0..{comm.size - 1}), not {root!r}")
    return r


def broadcast_object(comm: Any, obj: Any = None, root: int = 0) -> Any:
    """``obj`` of rank ``root`` on every rank (mpi4py's ``bcast``).

    Args:
        obj: the object to send (read on ``root`` only).
        root: the sending rank.

    Returns:
        On ``root``, ``obj`` itself; elsewhere an unpickled copy of it.

    Raises:
        ValueError: ``root`` is not a rank of the communicator.
        accord.AccordError: as the array collectives do (timeouts, desyncs, lost peers).
    """
    np = _np()
    root = _root(comm, root)
    me = comm.rank
    data = _dumps(obj) if me == root else None
    size = np.array([data.size if data is not None else 0], np.int64)
    comm.broadcast(size, root=root)
    if me != root:
        data = np.empty(int(size[0]), np.uint8)
    comm.broadcast(data, root=root)
    return obj if me == root else _loads(data)


def all_gather_object(comm: Any, obj: Any) -> List[Any]:
    """Every rank's ``obj``, in rank order, on every rank (mpi4py's ``allgather``; torch's
    ``all_gather_object`` fills a list instead).

    Returns:
        A list of ``size`` unpickled objects, this rank's own included.
    """
    np = _np()
    data = _dumps(obj)
    sizes = _all_sizes(comm, data)
    out = np.empty(int(sizes.sum()), np.uint8)
    comm.allgatherv(data, out, counts=sizes.tolist())
    return _split(out, sizes)


def gather_object(comm: Any, obj: Any, root: int = 0) -> Optional[List[Any]]:
    """Every rank's ``obj``, in rank order, on ``root`` (mpi4py's ``gather``).

    Returns:
        On ``root`` a list of ``size`` unpickled objects; ``None`` elsewhere.
    """
    np = _np()
    root = _root(comm, root)
    me = comm.rank
    data = _dumps(obj)
    sizes = _all_sizes(comm, data)
    out = np.empty(int(sizes.sum()), np.uint8) if me == root else None
    comm.gatherv(data, out=out, counts=sizes.tolist(), root=root)
    return _split(out, sizes) if me == root else None


def scatter_object_list(comm: Any, objs: Optional[Sequence[Any]] = None, root: int = 0) -> Any:
    """Object ``r`` of ``objs`` (given on ``root``) to rank ``r`` (mpi4py's ``scatter``; torch's
    ``scatter_object_list`` fills an output list instead).

    Args:
        objs: on ``root``, a sequence of exactly ``size`` objects; ignored elsewhere.

    Returns:
        This rank's object (an unpickled copy, on ``root`` too).

    Raises:
        ValueError: on ``root``, ``objs`` is missing or does not hold one object per rank (the
            other ranks raise too).
    """
    np = _np()
    root = _root(comm, root)
    me, n = comm.rank, comm.size
    bad = None
    if me == root:
        if objs is None or len(objs) != n:
            got = "None" if objs is None else f"{len(objs)} objects"
            bad = f"scatter_object_list: root {root} needs one object per rank ({n}), got {got}"
            sizes, data = np.full(n, -1, np.int64), None
        else:
            parts = [_dumps(o) for o in objs]
            sizes = np.array([p.size for p in parts], np.int64)
            data = np.concatenate(parts)
    else:
        sizes, data = np.zeros(n, np.int64), None
    # Every rank learns every count (scatterv's counts are the same on all ranks), or that the
    # root had no valid list: then every rank raises, none waits.
    comm.broadcast(sizes, root=root)
    if bad is not None:
        raise ValueError(bad)
    if (sizes < 0).any():
        raise ValueError(f"scatter_object_list: root {root} did not pass one object per rank ({n})")
    out = np.empty(int(sizes[me]), np.uint8)
    comm.scatterv(data, out, counts=sizes.tolist(), root=root)
    return _loads(out)


def send_object(comm: Any, obj: Any, dst: int, tag: int = 0) -> None:
    """Send ``obj`` to rank ``dst`` (mpi4py's ``send``): two messages with ``tag``, its byte
    count and its bytes, which :func:`recv_object` with the same tag takes in that order. Two
    threads sending objects to the same rank with the same tag at once may interleave them: use
    a tag per thread."""
    np = _np()
    data = _dumps(obj)
    comm.send(np.array([data.size], np.int64), dst, tag=tag)
    comm.send(data, dst, tag=tag)


def recv_object(comm: Any, src: int, tag: int = 0) -> Any:
    """The object rank ``src`` sent with :func:`send_object` and ``tag`` (mpi4py's ``recv``).

    Returns:
        An unpickled copy of it.
    """
    np = _np()
    size = np.zeros(1, np.int64)
    comm.recv(size, src, tag=tag)
    data = np.empty(int(size[0]), np.uint8)
    comm.recv(data, src, tag=tag)
    return _loads(data)
