"""``torch.distributed`` backend ``"accord"``, for CPU and CUDA tensors::

    import torch.distributed as dist
    dist.init_process_group("accord")          # under torchrun, `accord run`, or with store=/init_method=

The backend registers itself through the ``torch.distributed.backends`` entry point (or on
``import accord.torch``). It bootstraps from torch's own store: rank 0 of each group starts
Accord's store in its process and posts its address and a fresh token in torch's store, where
the other ranks read it, so there is nothing else to start. Every group (``new_group``) is an
Accord communicator of its own; ``split_group`` is refused by torch (this backend does not
offer torch's backend-level splitting).

Deadlines: the ``timeout`` given to ``init_process_group`` / ``new_group``; where none is given,
``ACCORD_TIMEOUT`` if set, else torch's default (30 minutes). A lost rank or a desync fails the
calls at once whatever the deadline.

Every collective and message returns a ``Work`` (``wait(timeout)``, ``is_completed()``,
``get_future()``); the operation runs in the background from the call on (host tensors on a
thread of Accord's, CUDA tensors on the current stream), in the order the calls were made.
Failures raise :class:`AccordDistError`, a ``torch.distributed.DistBackendError`` carrying
Accord's message (which rank is missing, which calls disagree) and the original error as
``__cause__`` and ``accord_error``.
"""

from __future__ import annotations

import datetime
import json
import os
import threading
from typing import Any, Callable, List, Optional

import torch
import torch.distributed as dist
from torch.futures import Future

from . import AccordError, StoreServer, _arrays, _multi, advertised_host, init_from_store

BACKEND = "accord"

_OPS = {
    dist.ReduceOp.SUM: "sum",
    dist.ReduceOp.PRODUCT: "prod",
    dist.ReduceOp.MIN: "min",
    dist.ReduceOp.MAX: "max",
    dist.ReduceOp.AVG: "avg",
    dist.ReduceOp.BAND: "band",
    dist.ReduceOp.BOR: "bor",
    dist.ReduceOp.BXOR: "bxor",
}


class AccordDistError(dist.DistBackendError):
    """An Accord failure inside a torch.distributed call (timeout naming the missing rank,
    desync naming both calls, a peer lost...). ``accord_error`` is Accord's exception."""

    def __init__(self, error: BaseException):
        super().__init__(str(error))
        self.accord_error = error


def _torch_error(e: BaseException) -> BaseException:
    return AccordDistError(e) if isinstance(e, AccordError) else e


def _op(reduce_op: Any) -> str:
    op = getattr(reduce_op, "op", reduce_op)
    for k, v in _OPS.items():
        if op == k:
            return v
    raise ValueError(f"reduce op {reduce_op} is not supported by backend 'accord' (use SUM, PRODUCT, MIN, MAX, AVG, BAND, BOR or BXOR)")


def _seconds(timeout: Any) -> Optional[float]:
    if timeout is None:
        return None
    s = timeout.total_seconds() if isinstance(timeout, datetime.timedelta) else float(timeout)
    return s if s > 0 else None


class Work(dist._Work):
    """One operation: done once Accord's request finished and ``finish`` (the copies a
    list-based call makes into its outputs) ran, on ``stream`` for CUDA tensors (the stream
    that was current at the call)."""

    def __init__(self, request: Any = None, result: Any = None, finish: Optional[Callable[[], None]] = None, stream: Any = None):
        super().__init__()
        self._request, self._result, self._finish, self._stream = request, result, finish, stream
        self._done = request is None and finish is None
        self._error: Optional[BaseException] = None
        self._lock = threading.Lock()
        self._future: Optional[Future] = None

    def _fail(self, e: AccordError, keep: bool) -> BaseException:
        err = _torch_error(e)
        err.__cause__ = e
        if keep:
            self._error = err
        return err

    def _complete(self, timeout: Optional[float] = None) -> None:
        # Wait outside the lock, so a caller's timeout holds while another thread waits too.
        request = self._request
        if request is not None and self._error is None:
            try:
                request.wait(timeout)
            except AccordError as e:
                # A wait that ran out of its own timeout may be retried; anything else is final.
                raise self._fail(e, not (timeout is not None and isinstance(e, TimeoutError))) from e
        with self._lock:
            if self._error is not None:
                raise self._error
            if self._done:
                return
            if self._finish is not None:
                try:
                    if self._stream is not None:
                        with torch.cuda.stream(self._stream):
                            self._finish()
                    else:
                        self._finish()
                except AccordError as e:
                    raise self._fail(e, True) from e
            self._request = None
            self._done = True

    def wait(self, timeout: Any = None) -> bool:
        self._complete(_seconds(timeout))
        return True

    def is_completed(self) -> bool:
        if self._done or self._error is not None:
            return True
        request = self._request
        if request is not None and not request.test():
            return False
        try:
            self._complete()
        except Exception:
            pass
        return True

    def is_success(self) -> bool:
        return self.is_completed() and self._error is None

    def exception(self) -> Optional[BaseException]:
        return self._error

    def result(self) -> Any:
        self._complete()
        return self._result

    def get_future(self) -> Future:
        if self._future is None:
            fut: Future = Future()
            self._future = fut

            def settle() -> None:
                try:
                    self._complete()
                    if self._stream is not None:
                        # The copies into the outputs ran on the caller's stream: the future's
                        # readers may be on any other.
                        self._stream.synchronize()
                    fut.set_result(self._result)
                except BaseException as e:  # noqa: BLE001 - handed to the future
                    fut.set_exception(e)

            if self._done:
                settle()
            else:
                threading.Thread(target=settle, name="accord-torch-future", daemon=True).start()
        return self._future


def _one(tensors: List[torch.Tensor], what: str) -> torch.Tensor:
    if len(tensors) != 1:
        raise ValueError(f"{what}: backend 'accord' takes one tensor per process, not {len(tensors)}")
    return tensors[0]


def _contiguous_out(t: torch.Tensor) -> tuple:
    """An output the call can write (``t``, or a contiguous staging copy) and what to do once
    it is written."""
    if t.is_contiguous():
        return t, None
    staged = t.contiguous()
    return staged, lambda: t.copy_(staged)


def _chain(*fs: Optional[Callable[[], None]]) -> Optional[Callable[[], None]]:
    fs2 = [f for f in fs if f is not None]
    if not fs2:
        return None

    def run() -> None:
        for f in fs2:
            f()

    return run


class ProcessGroup(dist.ProcessGroup):
    """A torch process group over one Accord communicator."""

    # What torch asks of a backend before splitting a group or coalescing a batch of messages.
    supports_splitting = False
    supports_coalescing = False

    def __init__(self, comm: Any, rank: int, size: int):
        super().__init__(rank, size)
        self._comm = comm

    @property
    def communicator(self) -> Any:
        """The Accord communicator underneath (for everything else Accord offers)."""
        return self._comm

    def getBackendName(self) -> str:  # noqa: N802 - torch's name
        return BACKEND

    def _get_backend(self, device: Any) -> Any:  # batch_isend_irecv asks; no coalescing
        return self

    def _run(self, opts: Any, call: Callable[..., Any], *args: Any, result: Any = None, finish: Optional[Callable[[], None]] = None, **kw: Any) -> Work:
        """Start ``call``. torch says whether the caller waits at once (``opts.asyncOp``
        False): then the call runs here, without a thread of its own, and its Work is done.
        Messages (no options) always start in the background, so a batch may post its
        receives before its sends."""
        blocking = opts is not None and getattr(opts, "asyncOp", True) is False
        cuda = next((a for a in args if isinstance(a, torch.Tensor) and a.is_cuda), None)
        stream = torch.cuda.current_stream(cuda.device) if cuda is not None and finish is not None else None
        try:
            if blocking:
                call(*args, **kw)
                if finish is not None:
                    finish()
                return Work(None, result)
            request = call(*args, async_op=True, **kw)
        except AccordError as e:
            raise _torch_error(e) from e
        return Work(request, result, finish, stream)

    # ----- collectives

    def allreduce(self, tensors: List[torch.Tensor], opts: Any = None) -> Work:
        t = _one(tensors, "allreduce")
        op = _op(opts.reduceOp) if opts is not None else "sum"
        return self._run(opts, self._comm.allreduce, t, op=op, result=tensors)

    def allreduce_coalesced(self, tensors: List[torch.Tensor], opts: Any = None) -> Work:
        op = _op(opts.reduceOp) if opts is not None else "sum"
        flat = _arrays.concat(tensors)

        def unpack() -> None:
            at = 0
            for t in tensors:
                n = t.numel()
                t.copy_(flat[at : at + n].view(t.shape))
                at += n

        return self._run(opts, self._comm.allreduce, flat, op=op, result=tensors, finish=unpack)

    def broadcast(self, tensors: List[torch.Tensor], opts: Any = None) -> Work:
        t = _one(tensors, "broadcast")
        root = opts.rootRank if opts is not None else 0
        return self._run(opts, self._comm.broadcast, t, root=root, result=tensors)

    def reduce(self, tensors: List[torch.Tensor], opts: Any = None) -> Work:
        t = _one(tensors, "reduce")
        op = _op(opts.reduceOp) if opts is not None else "sum"
        root = opts.rootRank if opts is not None else 0
        return self._run(opts, self._comm.reduce, t, op=op, root=root, result=tensors)

    def allgather(self, output_tensors: List[List[torch.Tensor]], input_tensors: List[torch.Tensor], opts: Any = None) -> Work:
        t = _one(input_tensors, "allgather")
        outs = _one(output_tensors, "allgather")
        _multi.check_entries(outs, self._comm.size, t, "output_tensor_list")
        stack = _arrays.empty_stack(t, self._comm.size)

        def unpack() -> None:
            for r, o in enumerate(outs):
                o.copy_(stack[r].view(o.shape))

        return self._run(opts, self._comm.allgather, t.contiguous(), stack, result=output_tensors, finish=unpack)

    def all_gather_single(self, output: torch.Tensor, input: torch.Tensor, opts: Any = None) -> Work:
        out, back = _contiguous_out(output)
        return self._run(opts, self._comm.allgather, input.contiguous(), out, result=[output], finish=back)

    _allgather_base = all_gather_single

    def gather(self, output_tensors: List[List[torch.Tensor]], input_tensors: List[torch.Tensor], opts: Any = None) -> Work:
        t = _one(input_tensors, "gather")
        root = opts.rootRank if opts is not None else 0
        if self._comm.rank != root:
            return self._run(opts, self._comm.gather, t.contiguous(), None, root=root, result=output_tensors)
        outs = _one(output_tensors, "gather")
        _multi.check_entries(outs, self._comm.size, t, "gather_list")
        stack = _arrays.empty_stack(t, self._comm.size)

        def unpack() -> None:
            for r, o in enumerate(outs):
                o.copy_(stack[r].view(o.shape))

        return self._run(opts, self._comm.gather, t.contiguous(), stack, root=root, result=output_tensors, finish=unpack)

    def scatter(self, output_tensors: List[torch.Tensor], input_tensors: List[List[torch.Tensor]], opts: Any = None) -> Work:
        t = _one(output_tensors, "scatter")
        root = opts.rootRank if opts is not None else 0
        src = None
        if self._comm.rank == root:
            ins = _one(input_tensors, "scatter")
            _multi.check_entries(ins, self._comm.size, t, "scatter_list")
            src = _arrays.concat(ins)
        out, back = _contiguous_out(t)
        return self._run(opts, self._comm.scatter, src, out, root=root, result=output_tensors, finish=back)

    def reduce_scatter(self, output_tensors: List[torch.Tensor], input_tensors: List[List[torch.Tensor]], opts: Any = None) -> Work:
        t = _one(output_tensors, "reduce_scatter")
        ins = _one(input_tensors, "reduce_scatter")
        _multi.check_entries(ins, self._comm.size, t, "input_list")
        op = _op(opts.reduceOp) if opts is not None else "sum"
        out, back = _contiguous_out(t)
        return self._run(opts, self._comm.reduce_scatter, _arrays.concat(ins), out, op=op, result=output_tensors, finish=back)

    def reduce_scatter_single(self, output: torch.Tensor, input: torch.Tensor, opts: Any = None) -> Work:
        op = _op(opts.reduceOp) if opts is not None else "sum"
        out, back = _contiguous_out(output)
        return self._run(opts, self._comm.reduce_scatter, input.contiguous(), out, op=op, result=[output], finish=back)

    _reduce_scatter_base = reduce_scatter_single

    def alltoall(self, output_tensors: List[torch.Tensor], input_tensors: List[torch.Tensor], opts: Any = None) -> Work:
        send = _arrays.concat(input_tensors)
        recv = torch.empty(sum(t.numel() for t in output_tensors), dtype=send.dtype, device=send.device)

        def unpack() -> None:
            at = 0
            for o in output_tensors:
                o.copy_(recv[at : at + o.numel()].view(o.shape))
                at += o.numel()

        return self._run(
            opts,
            self._comm.alltoallv, send, [t.numel() for t in input_tensors], recv, [t.numel() for t in output_tensors],
            result=output_tensors, finish=unpack,
        )

    def all_to_all_single(self, output: torch.Tensor, input: torch.Tensor, output_split_sizes: List[int], input_split_sizes: List[int], opts: Any = None) -> Work:
        out, back = _contiguous_out(output)
        src = input.contiguous()
        if not output_split_sizes and not input_split_sizes:
            return self._run(opts, self._comm.alltoall, src, out, result=[output], finish=back)
        size = self._comm.size
        row_in = src[0].numel() if src.dim() > 0 and src.shape[0] else 0
        row_out = out[0].numel() if out.dim() > 0 and out.shape[0] else 0
        ins = list(input_split_sizes) or [src.shape[0] // size] * size
        outs = list(output_split_sizes) or [out.shape[0] // size] * size
        return self._run(
            opts,
            self._comm.alltoallv, src, [s * row_in for s in ins], out, [s * row_out for s in outs],
            result=[output], finish=back,
        )

    alltoall_base = all_to_all_single

    def barrier(self, opts: Any = None) -> Work:
        return self._run(opts, self._comm.barrier)

    # ----- messages

    # Messages of CUDA tensors go through host memory: torch's batches (batch_isend_irecv) may
    # post a receive before a send on every rank, which device messages, matched in stream
    # order, cannot take outside one launch group.

    def send(self, tensors: List[torch.Tensor], dst: int, tag: int = 0) -> Work:
        t = _one(tensors, "send")
        data = t.detach().to("cpu", copy=True) if t.is_cuda else t.contiguous()
        return self._run(None, self._comm.send, data, dst, tag=tag, result=tensors)

    def recv(self, tensors: List[torch.Tensor], src: int, tag: int = 0) -> Work:
        t = _one(tensors, "recv")
        if not t.is_cuda:
            out, back = _contiguous_out(t)
            return self._run(None, self._comm.recv, out, src, tag=tag, result=tensors, finish=back)
        host = torch.empty(t.shape, dtype=t.dtype)
        stream = torch.cuda.current_stream(t.device)

        def upload() -> None:
            with torch.cuda.stream(stream):
                t.copy_(host)

        return self._run(None, self._comm.recv, host, src, tag=tag, result=tensors, finish=upload)

    def recv_anysource(self, tensors: List[torch.Tensor], tag: int = 0) -> Work:
        raise ValueError("backend 'accord' receives from a named rank only (recv with src=...)")

    def shutdown(self) -> None:
        self._comm.close()

    def abort(self) -> None:
        self._comm.abort("torch.distributed abort")


_STORE_KEY = "accord/bootstrap"


def _deadline(timeout: Any) -> Optional[float]:
    """Seconds for every call of the group: the ``timeout`` given to ``init_process_group`` /
    ``new_group``; where torch passes only its default (30 min, or NCCL's 10), ``ACCORD_TIMEOUT``
    if set (None: Accord's own default or ``ACCORD_TIMEOUT``)."""
    from torch.distributed import constants

    defaults = {getattr(constants, k, None) for k in ("default_pg_timeout", "default_pg_nccl_timeout")}
    if timeout is None or (timeout in defaults and os.environ.get("ACCORD_TIMEOUT")):
        return None
    return _seconds(timeout)


def _create(store: Any, rank: int, size: int, timeout: Any) -> ProcessGroup:
    """The creator torch calls for every group: Accord's store in rank 0's process, its address
    and a fresh token handed over through torch's store."""
    seconds = _deadline(timeout)
    server = None
    if rank == 0:
        server = StoreServer("0.0.0.0", 0)
        store.set(_STORE_KEY, json.dumps({"address": f"{advertised_host()}:{server.port}", "token": server.token}))
        info = {"address": f"{advertised_host()}:{server.port}", "token": server.token}
    else:
        info = json.loads(store.get(_STORE_KEY))
    try:
        comm = init_from_store(rank, size, info["address"], info["token"], seconds, store=server)
    except AccordError as e:
        raise _torch_error(e) from e
    if rank == 0:
        # Everyone joined: a later group on the same store (after destroy_process_group, torch
        # reuses its prefixes) must not find this store's address.
        try:
            store.delete_key(_STORE_KEY)
        except Exception:  # stores without delete_key: the next rank 0 overwrites the key first
            pass
    return ProcessGroup(comm, rank, size)


def register() -> None:
    """Register backend ``"accord"`` (CPU and CUDA) with ``torch.distributed`` in this process
    (the entry point torch loads does this)."""
    if BACKEND.upper() not in dist.Backend._plugins:
        dist.Backend.register_backend(BACKEND, _create, devices=["cpu", "cuda"])


register()
