"""Ray integration: the ``ray.util.collective`` API on accord, plus gather, scatter and
alltoall (which Ray lacks).

Inside Ray actors::

    from accord import collective as col
    col.init_collective_group(world_size=4, rank=r, group_name="g")
    col.allreduce(arr, group_name="g")

or declare the group from the driver with :func:`create_collective_group` and call the
collectives in the actors (they join on first use). Nobody passes an address: rank 0 starts a
store in its process and publishes ``host:port`` and a random token in Ray's internal key-value
store under the group's name; the other ranks poll for it (bounded by ``timeout``).

Importing this module also registers accord as a backend of Ray's own API when Ray has
``ray.util.collective.register_collective_backend`` (Ray >= 2.5x), so
``ray.util.collective.init_collective_group(..., backend="accord")`` works as well — in every
process that uses it, after ``import accord.collective``.

Tensors may be numpy arrays, torch tensors or CuPy arrays, on the host or on a CUDA device: CUDA
tensors run on NCCL, on the framework's current stream (the group creates its NCCL communicator
for a device on its first call with tensors there, on every rank together), and the staging
arrays of the list-based calls are made on the tensors' device.
"""

from __future__ import annotations

import json
import time
from typing import Any, Dict, List, Optional, Sequence

from . import Communicator, StoreServer, init_from_store
from . import _arrays

_KEY = "accord/collective/{}"
_DECLARED = "accord/collective-declared/{}"
_groups: Dict[str, Communicator] = {}

#: Seconds a rank waits for rank 0's store address (and the rendezvous).
DEFAULT_TIMEOUT = 300.0


def _kv():
    from ray.experimental import internal_kv

    return internal_kv


def _node_ip() -> str:
    import ray

    return ray.util.get_node_ip_address()


def _rendezvous(world_size: int, rank: int, group_name: str, timeout: Optional[float]) -> Communicator:
    kv = _kv()
    timeout = DEFAULT_TIMEOUT if timeout is None else timeout
    key = _KEY.format(group_name)
    if rank == 0:
        server = StoreServer("0.0.0.0", 0)
        info = {"addr": f"{_node_ip()}:{server.port}", "token": server.token}
        kv._internal_kv_put(key, json.dumps(info), overwrite=True)
        return init_from_store(0, world_size, info["addr"], info["token"], timeout, store=server)
    deadline = time.monotonic() + timeout
    while True:
        raw = kv._internal_kv_get(key)
        if raw:
            info = json.loads(raw)
            break
        if time.monotonic() > deadline:
            from ._errors import TimeoutError

            raise TimeoutError(
                f"collective group {group_name!r}: rank {rank} waited {timeout:.0f} s for rank 0 to "
                "publish the group's store address; is rank 0 calling init_collective_group?"
            )
        time.sleep(0.05)
    return init_from_store(rank, world_size, info["addr"], info["token"], timeout)


def init_collective_group(
    world_size: int,
    rank: int,
    backend: str = "accord",
    group_name: str = "default",
    timeout: Optional[float] = None,
) -> None:
    """Join collective group ``group_name`` as ``rank`` of ``world_size`` (inside an actor or
    task; every member calls it)."""
    if str(backend).lower() != "accord":
        raise ValueError(f"accord.collective only provides backend 'accord', not {backend!r}")
    if not group_name:
        raise ValueError("group_name must be a non-empty string")
    if group_name in _groups:
        raise RuntimeError(f"collective group {group_name!r} is already initialized here")
    if not 0 <= rank < world_size:
        raise ValueError(f"rank {rank} is not in a world of size {world_size}")
    _groups[group_name] = _rendezvous(world_size, rank, group_name, timeout)


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
    info = {"world_size": world_size, "ranks": ids, "backend": backend}
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
            init_collective_group(info["world_size"], info["ranks"][me], info["backend"], group_name)
            return _groups[group_name]
    raise RuntimeError(
        f"collective group {group_name!r} is not initialized in this process: call "
        "init_collective_group() here or create_collective_group() in the driver"
    )


def destroy_collective_group(group_name: str = "default") -> None:
    """Leave group ``group_name`` (rank 0 also withdraws the published store address)."""
    g = _groups.pop(group_name, None)
    if g is not None and g.rank == 0:
        kv = _kv()
        kv._internal_kv_del(_KEY.format(group_name))
        kv._internal_kv_del(_DECLARED.format(group_name))


def is_group_initialized(group_name: str = "default") -> bool:
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
    _group(group_name).allreduce(tensor, op=_op(op))


def barrier(group_name: str = "default") -> None:
    _group(group_name).barrier()


def reduce(tensor: Any, dst_rank: int = 0, group_name: str = "default", op: Any = "sum") -> None:
    """Reduce into ``tensor`` on ``dst_rank`` (others unchanged)."""
    _group(group_name).reduce(tensor, op=_op(op), root=dst_rank)


def broadcast(tensor: Any, src_rank: int = 0, group_name: str = "default") -> None:
    """Copy ``tensor`` of ``src_rank`` to every rank, in place."""
    _group(group_name).broadcast(tensor, root=src_rank)


def allgather(tensor_list: List[Any], tensor: Any, group_name: str = "default") -> None:
    """Fill ``tensor_list[r]`` with rank r's ``tensor``."""
    g = _group(group_name)
    if len(tensor_list) != g.size:
        raise ValueError(f"tensor_list has {len(tensor_list)} entries for {g.size} ranks")
    out = _arrays.empty_stack(tensor, g.size)
    g.allgather(tensor, out)
    for r, t in enumerate(tensor_list):
        _arrays.copy_into(t, out[r])


def reducescatter(tensor: Any, tensor_list: List[Any], group_name: str = "default", op: Any = "sum") -> None:
    """Reduce ``tensor_list`` (one entry per rank) over the group; ``tensor`` gets entry
    ``rank`` of the result."""
    g = _group(group_name)
    if len(tensor_list) != g.size:
        raise ValueError(f"tensor_list has {len(tensor_list)} entries for {g.size} ranks")
    g.reduce_scatter(_arrays.concat(tensor_list), tensor, op=_op(op))


def send(tensor: Any, dst_rank: int, group_name: str = "default") -> None:
    _group(group_name).send(tensor, dst_rank)


def recv(tensor: Any, src_rank: int, group_name: str = "default") -> None:
    _group(group_name).recv(tensor, src_rank)


def gather(tensor: Any, gather_list: Optional[List[Any]] = None, dst_rank: int = 0, group_name: str = "default") -> None:
    """``gather_list[r]`` on ``dst_rank`` gets rank r's ``tensor``."""
    g = _group(group_name)
    if g.rank != dst_rank:
        g.gather(tensor, None, root=dst_rank)
        return
    if gather_list is None or len(gather_list) != g.size:
        raise ValueError(f"the destination needs a gather_list of {g.size} tensors")
    out = _arrays.empty_stack(tensor, g.size)
    g.gather(tensor, out, root=dst_rank)
    for r, t in enumerate(gather_list):
        _arrays.copy_into(t, out[r])


def scatter(tensor: Any, scatter_list: Optional[List[Any]] = None, src_rank: int = 0, group_name: str = "default") -> None:
    """``tensor`` on rank r gets ``scatter_list[r]`` of ``src_rank``."""
    g = _group(group_name)
    send_buf = None
    if g.rank == src_rank:
        if scatter_list is None or len(scatter_list) != g.size:
            raise ValueError(f"the source needs a scatter_list of {g.size} tensors")
        send_buf = _arrays.concat(scatter_list)
    g.scatter(send_buf, tensor, root=src_rank)


def alltoall(tensor: Any, out: Any, group_name: str = "default") -> None:
    """Slice j of ``tensor`` goes to rank j; slice i of ``out`` comes from rank i."""
    _group(group_name).alltoall(tensor, out)


def _make_backend():
    from ray.util.collective.collective_group.base_collective_group import BaseGroup

    class AccordGroup(BaseGroup):
        """accord as a backend of ``ray.util.collective`` (name ``"ACCORD"``)."""

        def __init__(self, world_size: int, rank: int, group_name: str):
            super().__init__(world_size, rank, group_name)
            self._comm = _rendezvous(world_size, rank, group_name, None)

        @classmethod
        def backend(cls):
            return "ACCORD"

        @classmethod
        def check_backend_availability(cls) -> bool:
            return True

        def destroy_group(self):
            if self._comm.rank == 0:
                _kv()._internal_kv_del(_KEY.format(self.group_name))
            self._comm = None

        def allreduce(self, tensors, opts=None):
            for t in tensors:
                self._comm.allreduce(t, op=_op(getattr(opts, "reduceOp", "sum")))

        def barrier(self, opts=None):
            self._comm.barrier()

        def reduce(self, tensors, opts=None):
            for t in tensors:
                self._comm.reduce(t, op=_op(getattr(opts, "reduceOp", "sum")), root=getattr(opts, "root_rank", 0))

        def broadcast(self, tensors, opts=None):
            for t in tensors:
                self._comm.broadcast(t, root=getattr(opts, "root_rank", 0))

        def allgather(self, tensor_lists, tensors, opts=None):
            for lst, t in zip(tensor_lists, tensors):
                out = _arrays.empty_stack(t, self._comm.size)
                self._comm.allgather(t, out)
                for r, dst in enumerate(lst):
                    _arrays.copy_into(dst, out[r])

        def reducescatter(self, tensors, tensor_lists, opts=None):
            for t, lst in zip(tensors, tensor_lists):
                self._comm.reduce_scatter(_arrays.concat(lst), t, op=_op(getattr(opts, "reduceOp", "sum")))

        def send(self, tensors, opts):
            for t in tensors:
                self._comm.send(t, opts.dst_rank)

        def recv(self, tensors, opts):
            for t in tensors:
                self._comm.recv(t, opts.src_rank)

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
