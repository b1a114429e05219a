"""Accord: collective communication for distributed CPUs and GPUs.

A thin layer over the Rust core (``accord._native``)::

    import accord, numpy as np
    comm = accord.init()                 # env:// (accord run, torchrun, mpirun + ACCORD_STORE)
    x = np.full(4, comm.rank, np.float32)
    comm.allreduce(x)                    # in place: x now holds the sum over ranks
    accord.allreduce(x, op="max")        # the same through the default group

Arrays are numpy arrays, torch tensors, CuPy arrays, or anything exporting ``__dlpack__``,
``__array_interface__``, ``__cuda_array_interface__`` or the buffer protocol; they must be
C-contiguous, and outputs writable. Every numeric numpy dtype is supported (bool, int8-int64,
uint8-uint64, float16, bfloat16, float32, float64, complex64, complex128): bools reduce as logic
(sum and max are *or*, prod and min *and*), complex numbers sum, multiply and average. Other
fixed-size numpy dtypes (datetime64, strings, structured...) move as their bytes and cannot be
reduced. A numpy scalar or a Python float/int counts as one element;
where a call writes it, the result comes back as a new scalar (``total = comm.allreduce(x.sum())``).
Every call that may wait releases the GIL; ``async_op=True`` returns a :class:`Request`.

CUDA arrays run on NCCL: the first call with CUDA arrays attaches their device to the group (a
collective: every rank makes that call together, each with its own device; one device per
group), and every call is enqueued on the framework's current stream and returns without
waiting for the GPU, like torch.distributed's NCCL backend (``comm.synchronize()`` or
``Request.wait()`` wait for completion). Host and CUDA arrays cannot be mixed in one call.
See python/README.md.

Bootstrapping: :func:`init` (env://, tcp://host:port, file:///path, or ``mpi_comm=``),
:mod:`accord.collective` (Ray), :mod:`accord.dask` (Dask).
"""

from __future__ import annotations

import contextlib
import enum
import os
import secrets
import socket
from typing import Any, Iterator, Optional

from . import _native
from ._errors import (
    AbortedError,
    AccordError,
    ConnectionError,
    DesyncError,
    InvalidArgumentError,
    PeerLostError,
    ProtocolError,
    StoreError,
    TimeoutError,
    UnauthorizedError,
    UnsupportedError,
)
from . import _objects
from ._native import Communicator, Request, StoreServer, dump_flight_records, flush_trace

__version__ = _native.__version__


class ReduceOp(str, enum.Enum):
    """Reduction operators; plain strings (``"sum"``) work everywhere too."""

    SUM = "sum"
    PROD = "prod"
    MIN = "min"
    MAX = "max"
    AVG = "avg"
    BAND = "band"
    BOR = "bor"
    BXOR = "bxor"

    def __str__(self) -> str:
        return self.value


_default: Optional[Communicator] = None


def advertised_host() -> str:
    """The address other machines use to reach a store hosted here: ``ACCORD_STORE_HOST`` if
    set, else this host name's address."""
    host = os.environ.get("ACCORD_STORE_HOST")
    if host:
        return host
    try:
        return socket.gethostbyname(socket.gethostname())
    except OSError:
        return "127.0.0.1"


def init_from_store(
    rank: int,
    world_size: int,
    address: str,
    token: str,
    timeout: Optional[float] = None,
    store: Optional[StoreServer] = None,
) -> Communicator:
    """Join a group whose store someone already runs at ``address`` (``host:port``) with
    ``token``. The rank that runs the store in this process passes it as ``store`` so that the
    communicator keeps it alive. Used by the Ray, Dask and MPI bootstraps."""
    return _native.init(
        f"tcp://{address}",
        rank,
        world_size,
        timeout,
        token=token,
        store_external=True,
        store=store,
    )


def _init_mpi(mpi_comm: Any, timeout: Optional[float]) -> Communicator:
    # Rank 0 starts the store with a fresh random token and sends both over MPI before anyone
    # connects: the job is authenticated, and the secret never appears in an environment.
    rank, size = mpi_comm.Get_rank(), mpi_comm.Get_size()
    server = None
    info: Any = None
    if rank == 0:
        try:
            server = StoreServer("0.0.0.0", 0, secrets.token_hex(32))
            info = (f"{advertised_host()}:{server.port}", server.token)
        except Exception as e:
            # The others wait in the broadcast: tell them why no address comes.
            mpi_comm.bcast(f"rank 0 could not start the rendezvous store: {e}", root=0)
            raise
    info = mpi_comm.bcast(info, root=0)
    if isinstance(info, str):
        raise StoreError(info)
    address, token = info
    return init_from_store(rank, size, address, token, timeout, store=server)


def init(
    method: str = "env://",
    rank: Optional[int] = None,
    world_size: Optional[int] = None,
    timeout: Optional[float] = None,
    mpi_comm: Any = None,
) -> Communicator:
    """Join the job and return the world communicator; it also becomes the default group of
    the module-level functions (:func:`allreduce` ...).

    ``method``: ``env://`` (variables set by ``accord run``, torchrun, or mpirun/Slurm plus
    ``ACCORD_STORE=host:port`` or ``MASTER_ADDR``/``MASTER_PORT``), ``tcp://host:port`` (rank 0
    hosts the store there) or ``file:///shared/path``. ``rank``/``world_size`` override the
    environment. ``timeout`` (seconds) bounds every later call (default ``ACCORD_TIMEOUT`` or
    300); joining has its own deadline, ``ACCORD_JOIN_TIMEOUT`` (default the shorter of 60 s and
    ``timeout``). ``mpi_comm``: an mpi4py communicator; rank and size come from it and rank 0
    starts a store and broadcasts its address and a fresh token over MPI, so nothing else needs
    configuring. Without ``mpi_comm``, every rank needs the same ``ACCORD_TOKEN`` or
    ``ACCORD_TOKEN_FILE`` (``accord run`` sets one); without either the job is unauthenticated
    and a warning says so.
    """
    global _default
    if _default is not None and not _default.closed:
        raise RuntimeError(
            "accord.init() was already called in this process: its world communicator is "
            "accord.default_group(); call accord.destroy() first to join another job"
        )
    if mpi_comm is not None:
        comm = _init_mpi(mpi_comm, timeout)
    else:
        comm = _native.init(method, rank, world_size, timeout)
    _default = comm
    return comm


def is_initialized() -> bool:
    """Whether :func:`init` has set a default group (and it is not closed)."""
    return _default is not None and not _default.closed


def default_group() -> Communicator:
    """The communicator of the last :func:`init`."""
    if _default is None:
        raise RuntimeError("accord is not initialized: call accord.init() first")
    return _default


def destroy() -> None:
    """Close the default group (:meth:`Communicator.close`: peers still waiting for this rank
    are told) and forget it, so that :func:`init` may join another job."""
    global _default
    if _default is not None:
        _default.close()
    _default = None


def get_rank(group: Optional[Communicator] = None) -> int:
    """This process's rank in ``group`` (default: the default group)."""
    return (group or default_group()).rank


def get_world_size(group: Optional[Communicator] = None) -> int:
    """Number of ranks of ``group`` (default: the default group)."""
    return (group or default_group()).size


def _forward(name: str):
    def call(*args: Any, group: Optional[Communicator] = None, **kwargs: Any) -> Any:
        return getattr(group or default_group(), name)(*args, **kwargs)

    call.__name__ = name
    call.__qualname__ = name
    call.__doc__ = (
        f"``Communicator.{name}`` on ``group`` (default: the default group).\n\n"
        + (getattr(Communicator, name).__doc__ or "")
    )
    return call


# Python objects (pickled) through the collectives: methods of Communicator and functions of
# the default group, like the array operations.
for _name in _objects.__all__:
    setattr(Communicator, _name, getattr(_objects, _name))

send = _forward("send")
recv = _forward("recv")
sendrecv = _forward("sendrecv")
probe = _forward("probe")
iprobe = _forward("iprobe")
barrier = _forward("barrier")
broadcast = _forward("broadcast")
allreduce = _forward("allreduce")
scan = _forward("scan")
exscan = _forward("exscan")
reduce = _forward("reduce")
allgather = _forward("allgather")
allgatherv = _forward("allgatherv")
gather = _forward("gather")
gatherv = _forward("gatherv")
scatter = _forward("scatter")
scatterv = _forward("scatterv")
reduce_scatter = _forward("reduce_scatter")
reduce_scatterv = _forward("reduce_scatterv")
alltoall = _forward("alltoall")
alltoallv = _forward("alltoallv")
broadcast_object = _forward("broadcast_object")
all_gather_object = _forward("all_gather_object")
gather_object = _forward("gather_object")
scatter_object_list = _forward("scatter_object_list")
send_object = _forward("send_object")
recv_object = _forward("recv_object")
split = _forward("split")
subgroup = _forward("subgroup")


@contextlib.contextmanager
def group() -> Iterator[None]:
    """Launch the device operations (CUDA arrays) this thread issues inside the block together
    when it ends, as NCCL's ``ncclGroupStart``/``ncclGroupEnd``: a batch of messages may post
    its receives before its sends on every rank without deadlock. Groups nest; the outermost
    launches. Host operations are not deferred (pass ``async_op=True`` to host messages that
    must not wait for each other). Attach the device first (``Communicator.attach_device``, or
    any earlier call with CUDA arrays): attaching inside a group is refused."""
    _native.group_start()
    try:
        yield
    finally:
        _native.group_end()

__all__ = [
    "AbortedError",
    "AccordError",
    "Communicator",
    "ConnectionError",
    "DesyncError",
    "InvalidArgumentError",
    "PeerLostError",
    "ProtocolError",
    "ReduceOp",
    "Request",
    "StoreError",
    "StoreServer",
    "TimeoutError",
    "UnauthorizedError",
    "UnsupportedError",
    "advertised_host",
    "all_gather_object",
    "allgather",
    "allgatherv",
    "allreduce",
    "alltoall",
    "alltoallv",
    "barrier",
    "broadcast",
    "broadcast_object",
    "default_group",
    "destroy",
    "dump_flight_records",
    "exscan",
    "flush_trace",
    "gather",
    "gather_object",
    "gatherv",
    "group",
    "get_rank",
    "get_world_size",
    "init",
    "init_from_store",
    "iprobe",
    "is_initialized",
    "probe",
    "recv",
    "recv_object",
    "reduce",
    "reduce_scatter",
    "reduce_scatterv",
    "scan",
    "scatter",
    "scatter_object_list",
    "scatterv",
    "send",
    "send_object",
    "sendrecv",
    "split",
    "subgroup",
]
