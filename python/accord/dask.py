"""Dask integration: :class:`Comms` takes raft-dask's ``Comms`` arguments and calls::

    from accord.dask import Comms, local_comm
    comms = Comms(client=client)        # raft-dask's arguments: comms_p2p, client, verbose, ...
    comms.init()                        # every worker joins one accord communicator

    def task(session_id, x):
        comm = local_comm(session_id)   # inside a task, on a worker (also named local_handle)
        comm.allreduce(x)
        return x

    futures = [client.submit(task, comms.sessionId, x, workers=[w], pure=False)
               for w in comms.worker_addresses]
    comms.destroy()                     # also runs when the Comms object is garbage collected

:meth:`Comms.submit` runs ``func(comm, *args)`` on every worker at once and makes accord errors
name the workers behind the ranks they mention (:func:`naming_workers` does it in tasks of your
own).

``init`` asks every worker for its host and GPU (:meth:`Comms.worker_info`), orders the ranks by
host and then GPU as raft-dask does, starts the rendezvous store where ``nccl_root_location``
says (the scheduler by default) and runs the join on every worker at once (``client.run``; the
join runs off the worker's event loop, so the worker keeps answering the scheduler). When every
worker has a GPU (``CUDA_VISIBLE_DEVICES`` set, as dask-cuda does), each attaches it during the
join, so the device engine (NCCL) exists when ``init`` returns. Collectives run inside tasks,
one task per worker, all submitted together so that they run at the same time.

A worker that dies mid-collective makes the survivors' calls raise promptly (accord notices the
broken connections; :class:`accord.PeerLostError` names the rank); the session is then dead:
``destroy`` it (it skips workers the scheduler no longer knows) and ``init`` a new ``Comms`` on
the remaining workers. ``destroy`` is meant for ``finally`` blocks: it is prompt and best effort
even after a worker died (see :meth:`Comms.destroy`).
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import os
import re
import socket
import uuid
import warnings
import weakref
from typing import Any, Callable, Dict, Iterator, List, Optional, Sequence, Tuple, Union

from . import AccordError, Communicator, StoreServer, advertised_host, init_from_store

log = logging.getLogger(__name__)

#: Seconds :meth:`Comms.destroy` gives the scheduler and the workers to drop the communicator.
LEAVE_TIMEOUT = 5.0

#: Where ``nccl_root_location`` may put the rendezvous store (raft-dask's values).
ROOT_LOCATIONS = ("client", "worker", "scheduler")

#: Topic of the worker events that ``verbose=True`` logs (``client.get_events(EVENT_TOPIC)``).
EVENT_TOPIC = "accord.dask"

Gpu = Union[int, str, None]


class _Session:
    """One worker's part of a session: its communicator and who the other ranks are."""

    __slots__ = ("comm", "rank", "workers", "streams_per_handle")

    def __init__(self, comm: Communicator, rank: int, workers: List[str], streams_per_handle: int):
        self.comm = comm
        self.rank = rank
        self.workers = workers  # addresses, by rank
        self.streams_per_handle = streams_per_handle


#: On a worker: its sessions, by session id.
_sessions: Dict[str, _Session] = {}
#: In the process holding a session's store (the scheduler or a worker): the stores, by session.
_stores: Dict[str, StoreServer] = {}


# ------------------------------------------------------------------------------------------------
# What runs on the workers and the scheduler.


def _visible_gpu() -> Gpu:
    """The GPU this process uses: the first entry of ``CUDA_VISIBLE_DEVICES`` (an NVML index, a
    UUID turned into its index when pynvml can, else kept as text), or None when it is unset or
    empty."""
    first = os.environ.get("CUDA_VISIBLE_DEVICES", "").split(",")[0].strip()
    if not first or first.startswith("-"):
        return None
    try:
        return int(first)
    except ValueError:
        pass
    try:
        import pynvml

        pynvml.nvmlInit()
        return int(pynvml.nvmlDeviceGetIndex(pynvml.nvmlDeviceGetHandleByUUID(first.encode())))
    except Exception:
        return first


def _describe() -> Dict[str, Any]:
    return {"hostname": socket.gethostname(), "pid": os.getpid(), "gpu": _visible_gpu()}


def _open_store(session_id: str) -> Tuple[int, str]:
    server = StoreServer("0.0.0.0", 0)
    _stores[session_id] = server
    return server.port, server.token


def _close_store(session_id: str) -> None:
    server = _stores.pop(session_id, None)
    if server is not None:
        server.close()


async def _join(
    session_id: str,
    address: str,
    token: str,
    workers: List[str],
    timeout: Optional[float],
    attach_gpu: bool,
    streams_per_handle: int,
    verbose: bool,
    dask_worker: Any = None,
) -> int:
    rank = workers.index(dask_worker.address)

    def join() -> Communicator:
        comm = init_from_store(rank, len(workers), address, token, timeout)
        if attach_gpu:
            # CUDA_VISIBLE_DEVICES puts this worker's GPU first: device 0 of this process.
            # Attaching is collective: a rank that cannot attach aborts the communicator, so
            # that the others fail now rather than at their deadline.
            try:
                comm.attach_device(0)
            except BaseException as e:
                comm.abort(f"rank {rank} (worker {dask_worker.address}) could not attach its GPU: {e}")
                comm.close()
                raise
        return comm

    # Off the event loop: the worker keeps answering the scheduler while it waits for the others.
    comm = await asyncio.get_running_loop().run_in_executor(None, join)
    _sessions[session_id] = _Session(comm, rank, list(workers), streams_per_handle)
    if verbose:
        gpu = f", GPU {comm.gpu_devices}" if attach_gpu else ""
        dask_worker.log_event(EVENT_TOPIC, f"session {session_id}: joined as rank {rank} of {len(workers)}{gpu}")
    return rank


async def _leave(session_id: str) -> bool:
    session = _sessions.pop(session_id, None)
    if session is None:
        return False
    # Closing tells the peers; off the event loop in case a dead peer makes that slow.
    await asyncio.get_running_loop().run_in_executor(None, session.comm.close)
    return True


def _sessions_here() -> List[str]:
    return list(_sessions)


async def _leave_all(client: Any, session_id: str, workers: List[str], store_on: Optional[str]) -> Tuple[List[str], Dict[str, BaseException]]:
    """Drop the session on those of ``workers`` the scheduler still knows, then close the store
    if it is on the scheduler (``store_on == "scheduler"``) or on a worker (its address).
    Returns the workers skipped as gone and the errors of the others, by address. A dead worker
    is skipped rather than contacted: connecting to it would only fail after the connect timeout
    (30 s)."""
    try:
        ident = await client.scheduler.identity(n_workers=-1)
    except TypeError:  # a scheduler from before identity() took n_workers: it lists all
        ident = await client.scheduler.identity()
    known = ident.get("workers", {})
    gone = [w for w in workers if w not in known]
    alive = [w for w in workers if w in known]
    results = await client._run(_leave, session_id, workers=alive, on_error="return") if alive else {}
    failed = {w: r for w, r in results.items() if isinstance(r, BaseException)}
    if store_on == "scheduler":
        await client._run_on_scheduler(_close_store, session_id)
    elif store_on is not None and store_on in known:
        r = await client._run(_close_store, session_id, workers=[store_on], on_error="return")
        failed.update({w: e for w, e in r.items() if isinstance(e, BaseException)})
    return gone, failed


def _teardown(client: Any, session_id: str, workers: List[str], server: Optional[StoreServer], store_on: Optional[str]) -> None:
    """What :meth:`Comms.destroy` does, also run by the garbage collector: never raises. Holds no
    reference to the ``Comms`` object."""
    close_here = True
    try:
        if getattr(client, "status", None) not in ("running", "connecting"):
            log.warning("accord session %s: the client is closed; workers keep their communicators until they exit", session_id)
            return
        try:
            running: Optional[asyncio.AbstractEventLoop] = asyncio.get_running_loop()
        except RuntimeError:
            running = None
        client_loop: Any = getattr(client.loop, "asyncio_loop", None)
        if running is not None and running is client_loop:
            # Collected on the client's own event loop: blocking it would deadlock. The store
            # stays up until the leave is done, then the task closes it.
            async def leave_then_close() -> None:
                try:
                    await _leave_all(client, session_id, workers, store_on)
                finally:
                    if server is not None:
                        server.close()

            client_loop.create_task(leave_then_close())
            close_here = False
            return
        gone, failed = client.sync(_leave_all, client, session_id, workers, store_on, callback_timeout=LEAVE_TIMEOUT)
        if gone:
            log.warning("accord session %s: workers %s are gone; nothing to drop there", session_id, gone)
        for w, e in failed.items():
            log.warning("accord session %s: worker %s could not drop its communicator: %r", session_id, w, e)
    except Exception as e:
        log.warning(
            "accord session %s: could not drop the communicator on the workers within %g s (%r); "
            "a worker keeps its communicator until it exits",
            session_id, LEAVE_TIMEOUT, e,
        )
    finally:
        if close_here and server is not None:
            server.close()


# ------------------------------------------------------------------------------------------------
# Inside tasks.


def local_comm(session_id: str, dask_worker: Any = None) -> Communicator:
    """This worker's communicator of session ``session_id`` (call it inside a task). ``dask_worker``
    is accepted for raft-dask's ``local_handle`` signature and unused."""
    try:
        return _sessions[session_id].comm
    except KeyError:
        raise RuntimeError(
            f"no accord session {session_id!r} on this worker: was Comms.init() run with this worker?"
        ) from None


local_handle = local_comm

_RANK_IN_TEXT = re.compile(r"\branks? (\d+)")


def _name_workers(e: AccordError, session_id: str, session: _Session) -> None:
    """Add to ``e`` the worker address of each rank it mentions: a ``workers`` attribute
    ({rank: address}) and the same at the end of its message."""
    if getattr(e, "workers", None) is not None:
        return
    ranks = set()
    for attr in ("rank", "peer"):
        v = getattr(e, attr, None)
        if isinstance(v, int):
            ranks.add(v)
    ranks.update(r for r in getattr(e, "waiting_for", None) or () if isinstance(r, int))
    ranks.update(int(m) for m in _RANK_IN_TEXT.findall(str(e.args[0]) if e.args else ""))
    named = {r: session.workers[r] for r in sorted(ranks) if 0 <= r < len(session.workers)}
    setattr(e, "workers", named)
    others = ", ".join(f"rank {r} is worker {a}" for r, a in named.items() if r != session.rank)
    note = f"accord.dask session {session_id}: this is rank {session.rank} (worker {session.workers[session.rank]})"
    if others:
        note += f"; {others}"
    if e.args:
        e.args = (f"{e.args[0]} [{note}]",) + tuple(e.args[1:])
    else:
        e.args = (f"[{note}]",)


@contextlib.contextmanager
def naming_workers(session_id: str) -> Iterator[None]:
    """Inside a task: an :class:`accord.AccordError` leaving the block names the worker address
    of each rank it mentions (in its message and as ``e.workers``, {rank: address}), so that
    the error reaching the client says which worker died or lagged. :meth:`Comms.submit` wraps
    its calls in it."""
    try:
        yield
    except AccordError as e:
        session = _sessions.get(session_id)
        if session is not None:
            try:
                _name_workers(e, session_id, session)
            except Exception:
                pass
        raise


def _call(session_id: str, func: Callable[..., Any], *args: Any) -> Any:
    with naming_workers(session_id):
        return func(local_comm(session_id), *args)


# ------------------------------------------------------------------------------------------------
# The client's side.


def _rank_order(workers: List[str], facts: Dict[str, Dict[str, Any]]) -> List[str]:
    """``workers`` in rank order, as raft-dask ranks them: the hosts in the order their first
    worker appears in ``workers``, and on each host by GPU index (the first entry of
    ``CUDA_VISIBLE_DEVICES``). Workers without a GPU come after those with one; ties keep their
    order in ``workers``."""
    from distributed.comm import get_address_host

    host_pos: Dict[str, int] = {}
    for w in workers:
        host_pos.setdefault(get_address_host(w), len(host_pos))

    def key(item: Tuple[int, str]) -> Tuple[Any, ...]:
        i, w = item
        g = facts[w].get("gpu")
        return (host_pos[get_address_host(w)], g is None, isinstance(g, str), g if isinstance(g, int) else 0, str(g), i)

    return [w for _, w in sorted(enumerate(workers), key=key)]


def _loopback(host: str) -> bool:
    return host in ("127.0.0.1", "localhost", "::1", "")


class Comms:
    """One accord communicator over the workers of a Dask cluster, created with raft-dask's
    ``Comms`` arguments.

    ``comms_p2p``
        raft-dask's switch for UCX point-to-point endpoints. Accord communicators always have
        point-to-point (``send``/``recv`` ...) over their own connections, so this only records
        the wish (``ucx_initialized`` follows it, as in raft-dask).
    ``client``
        The ``distributed.Client``; default: ``distributed.default_client()``.
    ``verbose``
        Log each step: on the client at INFO level (logger ``accord.dask``), on the workers as
        Dask events of topic :data:`EVENT_TOPIC` (``client.get_events("accord.dask")``).
    ``streams_per_handle``
        raft-dask's number of streams of each worker's ``handle_t``. Accord's device engine
        runs on its own stream, so nothing uses it: it is recorded (this attribute, and each
        worker's :meth:`worker_info` entry) for code that reads it back.
    ``nccl_root_location``
        Where the rendezvous store runs, the process every rank first connects to (raft-dask
        puts NCCL's root there): ``"scheduler"`` (default; the scheduler must be able to import
        accord), ``"client"`` (this process) or ``"worker"`` (rank 0's worker). Workers reach it
        at that process's host as seen in the Dask addresses; ``ACCORD_STORE_HOST`` overrides
        the host.
    ``timeout``
        Seconds that the join and then every call of the communicator may wait (accord's
        ``timeout=``; default ``ACCORD_TIMEOUT``, else 300 s).
    ``attach_gpus``
        None (default): each worker attaches its GPU in ``init`` when every worker has one
        (``CUDA_VISIBLE_DEVICES`` set); False: never (the first call with CUDA arrays does);
        True: always, failing ``init`` where a worker has none.
    """

    valid_nccl_placements = ROOT_LOCATIONS

    def __init__(
        self,
        comms_p2p: bool = False,
        client: Any = None,
        verbose: bool = False,
        streams_per_handle: int = 0,
        nccl_root_location: str = "scheduler",
        timeout: Optional[float] = None,
        attach_gpus: Optional[bool] = None,
    ):
        # Accord's first spelling was Comms(client, timeout=...): a Client in the first place
        # is still taken as the client.
        if client is None and not isinstance(comms_p2p, bool) and hasattr(comms_p2p, "scheduler"):
            client, comms_p2p = comms_p2p, False
        if client is None:
            from distributed import default_client

            client = default_client()
        location = str(nccl_root_location).lower()
        if location not in ROOT_LOCATIONS:
            raise ValueError(f"nccl_root_location must be one of: {ROOT_LOCATIONS}, not {nccl_root_location!r}")
        if int(streams_per_handle) < 0:
            raise ValueError(f"streams_per_handle must be 0 or more, not {streams_per_handle}")
        self.client = client
        self.comms_p2p = bool(comms_p2p)
        self.verbose = bool(verbose)
        self.streams_per_handle = int(streams_per_handle)
        self.nccl_root_location = location
        self.timeout = timeout
        self.attach_gpus = attach_gpus
        self.session_id = uuid.uuid4().hex
        self.worker_addresses: List[str] = []
        self.initialized = False
        #: ``host:port`` of the session's rendezvous store, once ``init`` started it.
        self.store_address: Optional[str] = None
        self._worker_info: Dict[str, Dict[str, Any]] = {}
        self._server: Optional[StoreServer] = None
        self._finalizer: Optional[weakref.finalize] = None
        self._say("Initializing comms!")

    def _say(self, msg: str, *args: Any) -> None:
        if self.verbose:
            log.info("accord session %s: " + msg, self.session_id, *args)

    @property
    def sessionId(self) -> str:  # raft-dask spelling
        return self.session_id

    @property
    def nccl_initialized(self) -> bool:  # raft-dask's flag
        return self.initialized

    @property
    def ucx_initialized(self) -> bool:  # raft-dask's flag
        return self.initialized and self.comms_p2p

    def worker_info(self, workers: Sequence[str]) -> Dict[str, Dict[str, Any]]:
        """What each of ``workers`` would be in a session over them, asked from the workers
        (``client.run``), by address in rank order: ``rank``; ``port``, the worker's port
        (raft-dask gives its UCX listener port, present there only with ``comms_p2p``; accord
        connects its ranks itself, so this is the port of the worker's Dask address);
        ``host``, the host of its address; ``hostname``; ``pid``; ``gpu``, the GPU it uses (first
        entry of ``CUDA_VISIBLE_DEVICES``, or None); ``streams_per_handle``.

        Ranks follow the host, in the order that hosts first appear in ``workers``, then the
        GPU index on that host (raft-dask's order); workers without a GPU come last on their
        host, ties keep their order in ``workers``."""
        from distributed.comm import get_address_host_port

        workers = list(dict.fromkeys(workers))
        facts = self.client.run(_describe, workers=workers) if workers else {}
        out: Dict[str, Dict[str, Any]] = {}
        for rank, w in enumerate(_rank_order(workers, facts)):
            host, port = get_address_host_port(w)
            out[w] = {
                "rank": rank,
                "port": port,
                "host": host,
                "hostname": facts[w]["hostname"],
                "pid": facts[w]["pid"],
                "gpu": facts[w]["gpu"],
                "streams_per_handle": self.streams_per_handle,
            }
        return out

    def _store_host(self, process_address: str) -> str:
        """The host at which workers reach a store in the process of ``process_address``."""
        if os.environ.get("ACCORD_STORE_HOST"):
            return os.environ["ACCORD_STORE_HOST"]
        from distributed.comm import get_address_host

        host = get_address_host(process_address) if process_address else ""
        if self.nccl_root_location != "client":
            return "127.0.0.1" if _loopback(host) else host
        # The client's own address is not in the Dask addresses: if the scheduler is on this
        # machine's loopback, so are the workers; otherwise advertise this host.
        return "127.0.0.1" if _loopback(host) else advertised_host()

    def _start_store(self) -> Tuple[str, str, Optional[str]]:
        """Start the session's store where ``nccl_root_location`` says; returns its address,
        its token and where it runs for :func:`_leave_all` (None: in this process)."""
        where = self.nccl_root_location
        if where == "client":
            self._server = StoreServer("0.0.0.0", 0)
            port, token, store_on = self._server.port, self._server.token, None
            host = self._store_host(self.client.scheduler.address if self.client.scheduler is not None else "")
        elif where == "scheduler":
            port, token = self.client.run_on_scheduler(_open_store, self.session_id)
            store_on = "scheduler"
            host = self._store_host(self.client.scheduler.address)
        else:
            root = self.worker_addresses[0]
            port, token = self.client.run(_open_store, self.session_id, workers=[root])[root]
            store_on = root
            host = self._store_host(root)
        if ":" in host:
            host = f"[{host}]"
        return f"{host}:{port}", token, store_on

    def init(self, workers: Optional[Sequence[str]] = None) -> None:
        """Create the communicator on ``workers`` (default: every worker of the scheduler);
        blocks until all have joined, each attaching its GPU when every worker has one (see the
        class). Calling it again warns and does nothing, as raft-dask does."""
        if self.initialized:
            warnings.warn("Comms have already been initialized.")
            return
        if workers is None:
            try:
                workers = list(self.client.scheduler_info(n_workers=-1)["workers"])
            except TypeError:  # a client from before scheduler_info() took n_workers
                workers = list(self.client.scheduler_info()["workers"])
        workers = list(dict.fromkeys(workers))
        if not workers:
            raise ValueError("Comms.init() needs at least one worker")
        info = self.worker_info(workers)
        self._worker_info = info
        self.worker_addresses = list(info)
        with_gpu = [w for w, i in info.items() if i["gpu"] is not None]
        attach = self.attach_gpus
        if attach is None:
            attach = len(with_gpu) == len(info)
            if with_gpu and not attach:
                log.warning(
                    "accord session %s: only %d of %d workers have a GPU; none is attached now "
                    "(the first call with CUDA arrays attaches it, on every rank)",
                    self.session_id, len(with_gpu), len(info),
                )
        elif attach and len(with_gpu) < len(info):
            raise ValueError(
                "attach_gpus=True but these workers have no GPU (CUDA_VISIBLE_DEVICES unset): "
                f"{[w for w in info if info[w]['gpu'] is None]}"
            )
        self._say("ranks %s", {w: i["rank"] for w, i in info.items()})
        address, token, store_on = self._start_store()
        self.store_address = address
        self._say("store at %s (%s)", address, self.nccl_root_location)
        # Drops the workers' communicators and the store on destroy() or when this object is
        # garbage collected, whichever comes first.
        self._finalizer = weakref.finalize(
            self, _teardown, self.client, self.session_id, list(self.worker_addresses), self._server, store_on
        )
        try:
            self.client.run(
                _join, self.session_id, address, token, self.worker_addresses, self.timeout,
                bool(attach), self.streams_per_handle, self.verbose,
                workers=self.worker_addresses,
            )
        except BaseException:
            self._release()
            raise
        self.initialized = True
        self._say("Initialization complete: %d ranks%s", len(info), " with GPUs attached" if attach else "")

    def worker_rank(self, address: str) -> int:
        """The rank of the worker at ``address``."""
        return self.worker_addresses.index(address)

    def submit(self, func: Callable[..., Any], *args: Any) -> List[Any]:
        """Run ``func(comm, *args)`` on every worker of the session at once, ``comm`` being its
        communicator; returns the futures in rank order. ``args`` are the same for every rank
        (Dask futures among them are passed as their results); ``comm.rank`` tells the ranks
        apart. An :class:`accord.AccordError` raised by ``func`` names the workers of the ranks
        it mentions (:func:`naming_workers`)."""
        if not self.initialized:
            raise RuntimeError("Comms.init() was not called")
        return [
            self.client.submit(_call, self.session_id, func, *args, workers=[w], allow_other_workers=False, pure=False)
            for w in self.worker_addresses
        ]

    def _release(self) -> None:
        self.initialized = False
        finalizer, self._finalizer = self._finalizer, None
        if finalizer is not None:
            finalizer()
        self._server = None

    def destroy(self) -> None:
        """Drop the communicator on every worker and stop the store. Runs by itself when the
        ``Comms`` object is garbage collected.

        Prompt and best effort, so that it can run in a ``finally`` block after a failure
        without hiding it: workers the scheduler no longer knows are skipped, the others get
        :data:`LEAVE_TIMEOUT` seconds, and what fails is logged (logger ``accord.dask``) instead
        of raised. The store is always stopped."""
        was = self.initialized
        self._release()
        if was:
            self._say("Destroying comms.")
