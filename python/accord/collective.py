"""Ray integration: the ``ray.util.collective`` API on accord, plus gather, scatter and
alltoall (which Ray lacks).

Inside Ray actors::

    from accord import collective as col
    col.init_collective_group(world_size=4, rank=r, group_name="g")
    col.allreduce(arr, group_name="g")

or declare the group from the driver with :func:`create_collective_group` and call the
collectives in the actors (they join on first use). Nobody passes an address: rank 0 starts a
store in its process and publishes ``host:port``, a random token and a random incarnation id in
Ray's internal key-value store under the group's name; the other ranks poll for it. Rank 0
withdraws the entry as soon as the group has formed (or failed to), so a group re-created under
the same name never finds its predecessor's; an entry left behind by a rank 0 that died while
the group formed is recognised by its store no longer answering (or refusing the entry's
token, when another store took the port), and the other ranks keep waiting for the new one
instead of joining it. A group declared from the driver also carries the
declaration's id, and its ranks join only a store published for that declaration.

Every wait (for rank 0's address, the rendezvous, and later every call) is bounded by
``timeout`` seconds, else ``ACCORD_TIMEOUT``, else 300; a timeout raises
:class:`accord.TimeoutError` naming the missing ranks.

Importing this module also registers accord as a backend of Ray's own API when Ray has
``ray.util.collective.register_collective_backend`` (Ray >= 2.5x), so
``ray.util.collective.init_collective_group(..., backend="accord")`` works as well — in every
process that uses it, after ``import accord.collective``, or in every worker without it through
Ray's setup hook: ``ray.init(runtime_env={"worker_process_setup_hook":
"accord.collective.register_ray_backend"})``.

Ray hands actors numpy arguments as read-only views of its object store. A call that writes
such an array in place (both APIs) first switches it to a private copy of its values, so the
stored object and its other readers stay unchanged (:func:`accord._arrays.detach_from_ray_store`);
other read-only arrays are refused.

Tensors may be numpy arrays, torch tensors or CuPy arrays, on the host or on a CUDA device: CUDA
tensors run on NCCL, on the framework's current stream (the group attaches the tensors' device
on its first call with CUDA tensors, on every rank together; one device per group), and the staging
arrays of the list-based calls are made on the tensors' device.

Ray's multi-GPU calls (``allreduce_multigpu`` and the others, here and through backend
``"accord"``) take one tensor per GPU of the process, and every tensor of every process takes
part, as a rank of its own would: the process combines its tensors on the first one's device,
runs one collective between processes and writes each tensor's part back (:mod:`accord._multi`).
Their messages name the GPUs of both sides; messages between GPUs other than 0 and 0 go through
host memory, tagged by the pair, so they never match the wrong receive.
"""

from __future__ import annotations

import contextlib
import datetime
import json
import os
import socket
import time
import uuid
from typing import Any, Dict, Iterator, List, Optional, Sequence

from . import Communicator, StoreServer, init_from_store
from . import _arrays, _multi
from ._errors import StoreError, TimeoutError, UnauthorizedError

_KEY = "accord/collective/{}"
_DECLARED = "accord/collective-declared/{}"
_groups: Dict[str, Communicator] = {}
#: The declaration id each group here was created from (declared groups only).
_declarations: Dict[str, str] = {}

#: Seconds every wait is bounded by when neither ``timeout`` nor ``ACCORD_TIMEOUT`` is given.
DEFAULT_TIMEOUT = 300.0
#: How long a joiner gives a published store to accept a connection before it counts as gone.
_PROBE_S = 2.0


def _kv():
    from ray.experimental import internal_kv

    return internal_kv


def _node_ip() -> str:
    import ray

    return ray.util.get_node_ip_address()


def _resolve_timeout(timeout: Optional[float] = None) -> float:
    """``timeout`` if given, else ``ACCORD_TIMEOUT``, else :data:`DEFAULT_TIMEOUT` (seconds)."""
    source = "timeout"
    if timeout is None:
        env = os.environ.get("ACCORD_TIMEOUT", "").strip()
        if not env:
            return DEFAULT_TIMEOUT
        source = "ACCORD_TIMEOUT"
        try:
            timeout = float(env)
        except ValueError:
            timeout = float("nan")
    if not (timeout > 0 and timeout != float("inf")):
        raise ValueError(f"{source}={timeout!r} is not a positive number of seconds")
    return float(timeout)


def _answers(addr: str, deadline: float) -> bool:
    """Whether a store still listens at ``addr`` (``host:port``). A group whose rank 0 died
    leaves an address where nothing answers."""
    host, port = addr.rsplit(":", 1)
    wait = max(0.05, min(_PROBE_S, deadline - time.monotonic()))
    try:
        with socket.create_connection((host.strip("[]"), int(port)), timeout=wait):
            return True
    except OSError:
        return False


def _withdraw(key: str, incarnation: str) -> None:
    """Delete rank 0's entry unless a newer incarnation has replaced it already (a newer one
    may only appear in the instant between the read and the delete, when the same name is
    created twice at once, which is not supported)."""
    kv = _kv()
    raw = kv._internal_kv_get(key)
    if raw and json.loads(raw).get("incarnation") == incarnation:
        kv._internal_kv_del(key)


def _host(world_size: int, group_name: str, timeout: float, declaration: Optional[str]) -> Communicator:
    """Rank 0: start the store, publish it, and withdraw it once the group has formed or failed."""
    key = _KEY.format(group_name)
    server = StoreServer("0.0.0.0", 0)
    incarnation = uuid.uuid4().hex
    info = {
        "addr": f"{_node_ip()}:{server.port}",
        "token": server.token,
        "incarnation": incarnation,
        "declaration": declaration,
    }
    _kv()._internal_kv_put(key, json.dumps(info), overwrite=True)
    try:
        return init_from_store(0, world_size, info["addr"], info["token"], timeout, store=server)
    except BaseException:
        server.close()  # no one may join a group that failed to form
        raise
    finally:
        _withdraw(key, incarnation)


def _rank0_timeout(message: str, group_name: str, timeout: float) -> TimeoutError:
    """A wait for rank 0 ran out, with the attributes of the core's timeouts."""
    e = TimeoutError(message)
    e.op, e.seq, e.comm, e.waiting_for, e.after, e.hint = "rendezvous", 0, group_name, [0], timeout, ""
    return e


def _find_store(
    rank: int,
    group_name: str,
    timeout: float,
    deadline: float,
    declaration: Optional[str],
    refused: Dict[Optional[str], str],
) -> Dict[str, Any]:
    """Another rank: poll for rank 0's entry of this incarnation of the group, skipping the
    entry of a dead one (its store does not answer), of another declaration, or one in
    ``refused`` (incarnation -> why)."""
    kv = _kv()
    key = _KEY.format(group_name)
    gone: Dict[Optional[str], float] = {}  # incarnation -> when its store last failed to answer
    why = ""
    while True:
        raw = kv._internal_kv_get(key)
        if raw:
            info = json.loads(raw)
            incarnation = info.get("incarnation")
            if declaration is not None and info.get("declaration") != declaration:
                why = "; the address published is of another declaration of the group"
            elif incarnation in refused:
                why = refused[incarnation]
            elif time.monotonic() - gone.get(incarnation, -1e9) < 1.0:
                pass  # checked a moment ago
            elif _answers(info["addr"], deadline):
                return info
            else:
                gone[incarnation] = time.monotonic()
                why = (
                    f"; the address published ({info['addr']}) does not answer: it is that of a "
                    "previous incarnation whose rank 0 is gone"
                )
        if time.monotonic() >= deadline:
            raise _rank0_timeout(
                f"collective group {group_name!r}: rank {rank} waited {timeout:g} s for rank 0 to "
                f"publish the group's store address; is rank 0 calling init_collective_group?{why}",
                group_name,
                timeout,
            )
        time.sleep(0.05)


def _rendezvous(
    world_size: int,
    rank: int,
    group_name: str,
    timeout: Optional[float],
    declaration: Optional[str] = None,
) -> Communicator:
    """Form the group: every wait is bounded by one deadline of ``timeout`` seconds (see
    :func:`_resolve_timeout`), which then bounds every call of the communicator."""
    timeout = _resolve_timeout(timeout)
    deadline = time.monotonic() + timeout
    if rank == 0:
        return _host(world_size, group_name, timeout, declaration)
    refused: Dict[Optional[str], str] = {}
    while True:
        info = _find_store(rank, group_name, timeout, deadline, declaration, refused)
        left = deadline - time.monotonic()
        if left <= 0:
            raise _rank0_timeout(
                f"collective group {group_name!r}: rank {rank} found rank 0's store only as its "
                f"{timeout:g} s ran out",
                group_name,
                timeout,
            )
        try:
            comm = init_from_store(rank, world_size, info["addr"], info["token"], left)
        except UnauthorizedError:
            # Another store listens where a dead incarnation's was: the entry is stale.
            refused[info.get("incarnation")] = (
                f"; the address published ({info['addr']}) is now another store's: it is that of "
                "a previous incarnation whose rank 0 is gone"
            )
            continue
        except StoreError as e:
            # Rank 0 closes its store when its own wait for the group ends unsuccessfully.
            raise StoreError(
                f"collective group {group_name!r}: rank 0 closed the group's store while rank "
                f"{rank} waited for the group to form, so rank 0 gave up (its error names the "
                f"ranks that never joined): {e}"
            ) from e
        comm.timeout = timeout
        return comm


def init_collective_group(
    world_size: int,
    rank: int,
    backend: str = "accord",
    group_name: str = "default",
    timeout: Optional[float] = None,
    _declaration: Optional[str] = None,
    timeout_ms: Optional[float] = None,
) -> None:
    """Join collective group ``group_name`` as ``rank`` of ``world_size`` (inside an actor or
    task; every member calls it). ``timeout`` (seconds), or ``timeout_ms`` (milliseconds, as Ray
    spells its group timeouts; default ``ACCORD_TIMEOUT``, else 300 s) bounds the wait for the
    other members and every later call."""
    if timeout is None and timeout_ms is not None:
        if not timeout_ms > 0:
            raise ValueError(f"timeout_ms must be positive, not {timeout_ms}")
        timeout = timeout_ms / 1000.0
    if str(backend).lower() != "accord":
        raise ValueError(f"accord.collective only provides backend 'accord', not {backend!r}")
    if not group_name:
        raise ValueError("group_name must be a non-empty string")
    if group_name in _groups:
        raise RuntimeError(f"collective group {group_name!r} is already initialized here")
    if not 0 <= rank < world_size:
        raise ValueError(f"rank {rank} is not in a world of size {world_size}")
    _groups[group_name] = _rendezvous(world_size, rank, group_name, timeout, _declaration)
    if _declaration is not None:
        _declarations[group_name] = _declaration


def create_collective_group(
    actors: Sequence[Any],
    world_size: int,
    ranks: Sequence[int],
    backend: str = "accord",
    group_name: str = "default",
) -> None:
    """Declare ``actors`` (with ``ranks``) as group ``group_name`` from the driver; each actor
    joins on its first collective call."""
    if len(actors) != len(ranks):
        raise ValueError(f"{len(actors)} actors but {len(ranks)} ranks")
    if sorted(ranks) != list(range(world_size)):
        raise ValueError(f"ranks must be a permutation of 0..{world_size - 1}, got {list(ranks)}")
    ids = {a._actor_id.hex(): r for a, r in zip(actors, ranks)}
    # A fresh id per declaration: its members join only a store published for it.
    info = {"world_size": world_size, "ranks": ids, "backend": backend, "id": uuid.uuid4().hex}
    _kv()._internal_kv_put(_DECLARED.format(group_name), json.dumps(info), overwrite=True)


declare_collective_group = create_collective_group


def _group(group_name: str) -> Communicator:
    g = _groups.get(group_name)
    if g is not None:
        return g
    raw = _kv()._internal_kv_get(_DECLARED.format(group_name))
    if raw:
        import ray

        info = json.loads(raw)
        me = ray.get_runtime_context().get_actor_id()
        if me in info["ranks"]:
            init_collective_group(
                info["world_size"], info["ranks"][me], info["backend"], group_name, _declaration=info.get("id")
            )
            return _groups[group_name]
    raise RuntimeError(
        f"collective group {group_name!r} is not initialized in this process: call "
        "init_collective_group() here or create_collective_group() in the driver"
    )


def destroy_collective_group(group_name: str = "default") -> None:
    """Leave group ``group_name`` (rank 0 also withdraws the driver's declaration it was created
    from, unless the group has been declared anew since)."""
    g = _groups.pop(group_name, None)
    declaration = _declarations.pop(group_name, None)
    if g is not None:
        # Its connections close now, not whenever the last reference goes.
        g.close()
    if g is not None and g.rank == 0 and declaration is not None:
        kv = _kv()
        key = _DECLARED.format(group_name)
        raw = kv._internal_kv_get(key)
        if raw and json.loads(raw).get("id") == declaration:
            kv._internal_kv_del(key)


def is_group_initialized(group_name: str = "default") -> bool:
    """Whether this process is a member of group ``group_name`` (and has not destroyed it)."""
    return group_name in _groups


def get_rank(group_name: str = "default") -> int:
    """This process's rank in the group, or -1 if it is not a member here."""
    g = _groups.get(group_name)
    return g.rank if g is not None else -1


def get_collective_group_size(group_name: str = "default") -> int:
    """The group's size, or -1 if it is not initialized here."""
    g = _groups.get(group_name)
    return g.size if g is not None else -1


def get_group_handle(group_name: str = "default") -> Communicator:
    """The group's accord Communicator (for everything else accord offers)."""
    return _group(group_name)


_RAY_OPS = {"SUM": "sum", "PRODUCT": "prod", "PROD": "prod", "MIN": "min", "MAX": "max"}


ListMismatchError = _multi.ListMismatchError
_check_list = _multi.check_list


def _op(op: Any) -> str:
    """accord op name from a string, accord.ReduceOp or ray.util.collective.ReduceOp."""
    if isinstance(op, str):
        return op
    name = getattr(op, "name", None)
    if name in _RAY_OPS:
        return _RAY_OPS[name]
    raise ValueError(f"unsupported reduce op {op!r}")


def allreduce(tensor: Any, group_name: str = "default", op: Any = "sum") -> None:
    """Reduce ``tensor`` over the group, in place."""
    _arrays.writable(tensor, "tensor")
    _group(group_name).allreduce(tensor, op=_op(op))


def barrier(group_name: str = "default") -> None:
    """Wait until every member of the group has entered the barrier.

    Raises:
        accord.TimeoutError: a member did not come within the group's timeout (naming it).
    """
    _group(group_name).barrier()


def reduce(tensor: Any, dst_rank: int = 0, group_name: str = "default", op: Any = "sum") -> None:
    """Reduce into ``tensor`` on ``dst_rank`` (others unchanged)."""
    _arrays.writable(tensor, "tensor")
    _group(group_name).reduce(tensor, op=_op(op), root=dst_rank)


def broadcast(tensor: Any, src_rank: int = 0, group_name: str = "default") -> None:
    """Copy ``tensor`` of ``src_rank`` to every rank, in place."""
    _arrays.writable(tensor, "tensor")
    _group(group_name).broadcast(tensor, root=src_rank)


def allgather(tensor_list: List[Any], tensor: Any, group_name: str = "default") -> None:
    """Fill ``tensor_list[r]`` with rank r's ``tensor``."""
    _multi.allgather(_group(group_name), [tensor_list], [tensor])


def reducescatter(tensor: Any, tensor_list: List[Any], group_name: str = "default", op: Any = "sum") -> None:
    """Reduce ``tensor_list`` (one entry per rank) over the group; ``tensor`` gets entry
    ``rank`` of the result."""
    _multi.reducescatter(_group(group_name), [tensor], [tensor_list], _op(op))


def send(tensor: Any, dst_rank: int, group_name: str = "default") -> None:
    """Send ``tensor`` to ``dst_rank`` of the group; it matches that rank's :func:`recv` from
    this one (in order, when several are sent)."""
    _group(group_name).send(tensor, dst_rank)


def recv(tensor: Any, src_rank: int, group_name: str = "default") -> None:
    """Receive into ``tensor`` (same dtype and size as the sender's) what ``src_rank`` of the
    group sent with :func:`send`.

    Raises:
        accord.TimeoutError: nothing came within the group's timeout.
        ValueError: ``tensor`` cannot be written (a read-only array).
    """
    _arrays.writable(tensor, "tensor")
    _group(group_name).recv(tensor, src_rank)


def gather(tensor: Any, gather_list: Optional[List[Any]] = None, dst_rank: int = 0, group_name: str = "default") -> None:
    """``gather_list[r]`` on ``dst_rank`` gets rank r's ``tensor``."""
    g = _group(group_name)
    if g.rank != dst_rank:
        g.gather(tensor, None, root=dst_rank)
        return
    if gather_list is None or len(gather_list) != g.size:
        raise ValueError(f"the destination needs a gather_list of {g.size} tensors")
    _check_list(gather_list, tensor, "gather_list")
    for t in gather_list:
        _arrays.writable(t, "an entry of gather_list")
    out = _arrays.empty_stack(tensor, g.size)
    g.gather(tensor, out, root=dst_rank)
    for r, t in enumerate(gather_list):
        _arrays.copy_into(t, out[r])


def scatter(tensor: Any, scatter_list: Optional[List[Any]] = None, src_rank: int = 0, group_name: str = "default") -> None:
    """``tensor`` on rank r gets ``scatter_list[r]`` of ``src_rank``."""
    _arrays.writable(tensor, "tensor")
    g = _group(group_name)
    send_buf = None
    if g.rank == src_rank:
        if scatter_list is None or len(scatter_list) != g.size:
            raise ValueError(f"the source needs a scatter_list of {g.size} tensors")
        _check_list(scatter_list, tensor, "scatter_list")
        send_buf = _arrays.concat(scatter_list)
    g.scatter(send_buf, tensor, root=src_rank)


def alltoall(tensor: Any, out: Any, group_name: str = "default") -> None:
    """Slice j of ``tensor`` goes to rank j; slice i of ``out`` comes from rank i."""
    _arrays.writable(out, "out")
    _group(group_name).alltoall(tensor, out)


def allreduce_multigpu(tensor_list: List[Any], group_name: str = "default", op: Any = "sum") -> None:
    """Ray's ``allreduce_multigpu``: every tensor of ``tensor_list`` (one per GPU of this
    process) gets the reduction over every tensor of every member."""
    for t in tensor_list:
        _arrays.writable(t, "tensor")
    _multi.allreduce(_group(group_name), list(tensor_list), _op(op))


def reduce_multigpu(tensor_list: List[Any], dst_rank: int = 0, dst_tensor: int = 0, group_name: str = "default", op: Any = "sum") -> None:
    """Ray's ``reduce_multigpu``: tensor ``dst_tensor`` of ``dst_rank`` gets the reduction over
    every tensor of every member."""
    _check_index(tensor_list, dst_tensor, "dst_tensor")
    for t in tensor_list:
        _arrays.writable(t, "tensor")
    _multi.reduce(_group(group_name), list(tensor_list), _op(op), dst_rank, dst_tensor)


def broadcast_multigpu(tensor_list: List[Any], src_rank: int = 0, src_tensor: int = 0, group_name: str = "default") -> None:
    """Ray's ``broadcast_multigpu``: every tensor gets tensor ``src_tensor`` of ``src_rank``."""
    _check_index(tensor_list, src_tensor, "src_tensor")
    for t in tensor_list:
        _arrays.writable(t, "tensor")
    _multi.broadcast(_group(group_name), list(tensor_list), src_rank, src_tensor)


def allgather_multigpu(output_tensor_lists: List[List[Any]], input_tensor_list: List[Any], group_name: str = "default") -> None:
    """Ray's ``allgather_multigpu``: each output list (one per input tensor, of ranks x tensors
    entries) gets every tensor of every member, in (rank, tensor) order."""
    _multi.allgather(_group(group_name), list(output_tensor_lists), list(input_tensor_list))


def reducescatter_multigpu(output_tensor_list: List[Any], input_tensor_lists: List[List[Any]], group_name: str = "default", op: Any = "sum") -> None:
    """Ray's ``reducescatter_multigpu``: output tensor ``i`` of rank ``r`` gets entry
    ``r * len(output_tensor_list) + i`` of the reduction of the input lists over every member."""
    _multi.reducescatter(_group(group_name), list(output_tensor_list), list(input_tensor_lists), _op(op))


def send_multigpu(tensor: Any, dst_rank: int, dst_gpu_index: int, group_name: str = "default", n_elements: int = 0) -> None:
    """Ray's ``send_multigpu``: (the first ``n_elements`` of) ``tensor`` to GPU
    ``dst_gpu_index`` of ``dst_rank``."""
    _multi.send(_group(group_name), tensor, dst_rank, dst_gpu_index, n_elements)


def recv_multigpu(tensor: Any, src_rank: int, src_gpu_index: int, group_name: str = "default", n_elements: int = 0) -> None:
    """Ray's ``recv_multigpu``: (the first ``n_elements`` of) ``tensor`` from GPU
    ``src_gpu_index`` of ``src_rank``."""
    _multi.recv(_group(group_name), tensor, src_rank, src_gpu_index, n_elements)


def synchronize(gpu_id: int) -> None:
    """Block until the work queued on CUDA device ``gpu_id`` has finished (Ray's
    ``synchronize``; torch or CuPy, whichever is installed)."""
    try:
        import torch

        torch.cuda.synchronize(gpu_id)
        return
    except ImportError:
        pass
    import cupy

    cupy.cuda.Device(gpu_id).synchronize()


def _check_index(tensor_list: Sequence[Any], i: int, what: str) -> None:
    if not 0 <= i < len(tensor_list):
        raise ValueError(f"{what} {i} is not an index of the {len(tensor_list)} tensors")


def _call_timeout(opts: Any) -> Optional[float]:
    """Seconds from the ``timeout_ms`` of Ray's per-call options (a ``timedelta``, or a number
    of milliseconds), or None where it is absent or unset (Ray's default is -1 ms)."""
    t = getattr(opts, "timeout_ms", None)
    if isinstance(t, datetime.timedelta):
        seconds = t.total_seconds()
    elif isinstance(t, (int, float)) and not isinstance(t, bool):
        seconds = t / 1000.0
    else:
        return None
    return seconds if seconds > 0 else None


@contextlib.contextmanager
def _bounded(comm: Communicator, opts: Any) -> Iterator[None]:
    """Run one call under the deadline Ray's options give, else under the group's own."""
    seconds = _call_timeout(opts)
    if seconds is None:
        yield
        return
    before = comm.timeout
    comm.timeout = seconds
    try:
        yield
    finally:
        comm.timeout = before


def _make_backend():
    from ray.util.collective.collective_group.base_collective_group import BaseGroup

    class AccordGroup(BaseGroup):
        """accord as a backend of ``ray.util.collective`` (name ``"ACCORD"``). The rendezvous is
        bounded by ``ACCORD_TIMEOUT`` (or ``timeout_ms`` where Ray passes one), each call by
        the ``timeout_ms`` of its options where set, else by the same group timeout."""

        def __init__(self, world_size: int, rank: int, group_name: str, timeout_ms: Optional[float] = None):
            super().__init__(world_size, rank, group_name)
            timeout = timeout_ms / 1000.0 if timeout_ms is not None and timeout_ms > 0 else None
            self._comm = _rendezvous(world_size, rank, group_name, timeout)

        @classmethod
        def backend(cls):
            return "ACCORD"

        @classmethod
        def check_backend_availability(cls) -> bool:
            return True

        def destroy_group(self):
            if self._comm is not None:
                self._comm.close()
            self._comm = None

        # Each call takes Ray's list of tensors: one per GPU of this process in Ray's multi-GPU
        # calls, where every tensor of every process takes part (see accord._multi).
        def allreduce(self, tensors, opts=None):
            for t in tensors:
                _arrays.writable(t, "tensor")
            with _bounded(self._comm, opts):
                _multi.allreduce(self._comm, tensors, _op(getattr(opts, "reduceOp", "sum")))

        def barrier(self, opts=None):
            with _bounded(self._comm, opts):
                self._comm.barrier()

        def reduce(self, tensors, opts=None):
            for t in tensors:
                _arrays.writable(t, "tensor")
            op = _op(getattr(opts, "reduceOp", "sum"))
            with _bounded(self._comm, opts):
                _multi.reduce(self._comm, tensors, op, getattr(opts, "root_rank", 0), getattr(opts, "root_tensor", 0))

        def broadcast(self, tensors, opts=None):
            for t in tensors:
                _arrays.writable(t, "tensor")
            with _bounded(self._comm, opts):
                _multi.broadcast(self._comm, tensors, getattr(opts, "root_rank", 0), getattr(opts, "root_tensor", 0))

        def allgather(self, tensor_lists, tensors, opts=None):
            with _bounded(self._comm, opts):
                _multi.allgather(self._comm, tensor_lists, tensors)

        def reducescatter(self, tensors, tensor_lists, opts=None):
            with _bounded(self._comm, opts):
                _multi.reducescatter(self._comm, tensors, tensor_lists, _op(getattr(opts, "reduceOp", "sum")))

        def send(self, tensors, opts):
            with _bounded(self._comm, opts):
                for t in tensors:
                    _multi.send(self._comm, t, opts.dst_rank, getattr(opts, "dst_gpu_index", 0), getattr(opts, "n_elements", 0))

        def recv(self, tensors, opts):
            with _bounded(self._comm, opts):
                for t in tensors:
                    _multi.recv(self._comm, t, opts.src_rank, getattr(opts, "src_gpu_index", 0), getattr(opts, "n_elements", 0))

    return AccordGroup


def register_ray_backend() -> bool:
    """Register accord as backend ``"accord"`` of ``ray.util.collective`` in this process.
    Returns False where the installed Ray has no backend registry."""
    try:
        from ray.util.collective import backend_registry
    except ImportError:
        return False
    if not hasattr(backend_registry, "register_collective_backend"):
        return False
    if not backend_registry._global_registry.is_registered("ACCORD"):
        backend_registry.register_collective_backend("ACCORD", _make_backend())
    return True


try:
    RAY_BACKEND_REGISTERED = register_ray_backend()
except Exception:  # Ray absent or incompatible: the accord.collective functions still work.
    RAY_BACKEND_REGISTERED = False
