"""``torch.distributed`` backend ``"accord"``, for CPU and CUDA tensors::

    import torch.distributed as dist
    dist.init_process_group("accord")          # under torchrun, `accord run`, or with store=/init_method=

The backend registers itself through the ``torch.distributed.backends`` entry point (or on
``import accord.torch``). It bootstraps from torch's own store: rank 0 of each group starts
Accord's store in its process and posts its address and a fresh token in torch's store, where
the other ranks read it, so there is nothing else to start. Every group (``new_group``) is an
Accord communicator of its own.

``split_group(split_ranks=[[...], ...])`` splits the parent's communicator (Accord's ``split``,
collective over the parent: no new connections); ranks in no list get torch's non-member
object. torch asks the group for its device types before splitting, and a group that a Python
creator returns has none of its own (torch registers no C++ backend on it), so each group
registers a placeholder C++ ``Backend`` for ``cpu`` and ``cuda`` (its own collectives are never
called: the group's Python methods run them). A torch whose ``Backend`` cannot be subclassed
from Python gets no placeholder; there torch itself refuses ``split_group`` ("its backend does
not support splitting"), and ``new_group`` still works.

Deadlines: the ``timeout`` given to ``init_process_group`` / ``new_group`` / ``split_group``;
where none is given, ``ACCORD_TIMEOUT`` if set, else torch's default (30 minutes). A lost rank
or a desync fails the calls at once whatever the deadline.

Every collective and message returns a ``Work`` (``wait(timeout)``, ``is_completed()``,
``get_future()``). Host tensors: the operation runs on a thread of Accord's from the call on,
in call order, and ``wait()`` blocks until it is done. CUDA tensors: the operation (and the
copies a list-based call makes into its outputs) is enqueued on the stream current at the call,
and ``wait()`` makes the stream current at the wait wait for it, without blocking the host, as
NCCL's ``Work.wait()`` does; it raises at once if the communicator has already failed. Use
``get_future()`` (or synchronize the stream) to block the host.

Messages of CUDA tensors run on the device (NCCL, matched in call order as NCCL's are) once the
group has attached its GPU and when the tag is 0; else they go through host memory, where tags
are honoured and nothing needs the GPU attached (attaching is a step every rank of the group
takes together, which a message between two ranks cannot be). ``batch_isend_irecv`` of CUDA
tensors, where torch coalesces the batch (it calls the group's ``_start_coalescing`` /
``_end_coalescing``), attaches the GPU (every rank of the group takes part in the first batch,
as torch documents for NCCL) and issues its device messages at the batch's end in one launch
group, which that call opens and closes, so receives may come before sends on every rank; it
returns one ``Work`` for the batch. A torch that calls the messages of a batch one by one
instead (2.11 coalesces only groups whose type is exactly ``ProcessGroup``) gets them through
host memory, where posting receives first cannot deadlock; then a message between two ranks
must be a batch message on both sides or a plain one on both. A CUDA operation called while a
launch group (``accord.group()``) is open on the thread is refused: its ``Work`` could not wait
for work the group launches only at its end.

Failures raise :class:`AccordDistError`, a ``torch.distributed.DistBackendError`` carrying
Accord's message (which rank is missing, which calls disagree) and the original error as
``__cause__`` and ``accord_error``.
"""

from __future__ import annotations

import datetime
import json
import os
import sys
import threading
from typing import Any, Callable, List, Optional, Tuple

import torch
import torch.distributed as dist
from torch.futures import Future

from . import AccordError, StoreServer, _arrays, _multi, _native, advertised_host, init_from_store

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
    """One operation, or a batch of them.

    Host tensors: done once Accord's requests finished and ``finish`` (the copies a list-based
    call makes into its outputs) ran; ``wait`` blocks the host. CUDA tensors: the operation and
    its copies are enqueued on the caller's stream, ``event`` is recorded behind them, and
    ``wait`` makes the current stream wait for that event (the requests only say whether the
    communicator failed). A Work of a coalesced batch gets its event when the batch ends
    (``_arm``)."""

    def __init__(
        self,
        requests: Any = (),
        result: Any = None,
        finish: Optional[Callable[[], None]] = None,
        event: Any = None,
        device: Any = None,
        parts: Any = (),
    ):
        super().__init__()
        self._requests = [r for r in requests if r is not None]
        self._result, self._finish, self._event, self._device = result, finish, event, device
        # A batch of host Works (coalesced host messages): each waited for in turn.
        self._parts = list(parts)
        # A device operation of a coalesced batch: how to issue it when the batch ends.
        self._issue: Optional[Callable[[], Any]] = None
        self._cuda = device is not None
        self._done = not self._requests and finish is None and not self._parts and not self._cuda
        self._error: Optional[BaseException] = None
        self._lock = threading.Lock()
        self._future: Optional[Future] = None

    def _arm(self, event: Any) -> None:
        self._event = event

    def _fail(self, e: AccordError, keep: bool) -> BaseException:
        err = _torch_error(e)
        err.__cause__ = e
        if keep:
            self._error = err
        return err

    def _check_requests(self, timeout: Optional[float] = None, block: bool = True) -> None:
        """Raise the requests' failure; with ``block``, wait (at most ``timeout``) for them."""
        for request in self._requests:
            if self._error is not None:
                break
            if not block and not request.test():
                continue
            try:
                request.wait(timeout)
            except AccordError as e:
                # A wait that ran out of its own timeout may be retried; anything else is final.
                raise self._fail(e, not (timeout is not None and isinstance(e, TimeoutError))) from e
        if self._error is not None:
            raise self._error

    def _complete(self, timeout: Optional[float] = None) -> None:
        """Host work: block until done (at most ``timeout`` for Accord's requests)."""
        for part in self._parts:
            part._complete(timeout)
        # Wait outside the lock, so a caller's timeout holds while another thread waits too.
        self._check_requests(timeout)
        with self._lock:
            if self._error is not None:
                raise self._error
            if self._done:
                return
            if self._finish is not None:
                try:
                    self._finish()
                except AccordError as e:
                    raise self._fail(e, True) from e
            self._requests = []
            self._done = True

    def _host_wait_cuda(self) -> None:
        """CUDA work: block the host until it finished on the GPU (the communicator's watchdog
        bounds the requests' wait)."""
        for part in self._parts:
            part._complete()
        self._check_requests()
        if self._event is None:
            raise RuntimeError("this Work belongs to a coalesced batch that has not ended (or whose body raised: it never runs)")
        self._event.synchronize()
        self._done = True

    def wait(self, timeout: Any = None) -> bool:
        if not self._cuda:
            self._complete(_seconds(timeout))
            return True
        for part in self._parts:  # host-staged messages of a batch
            part.wait(timeout)
        # Stream semantics: the caller's current stream waits on the GPU; a failure the
        # communicator already knows of is raised now.
        self._check_requests(block=False)
        if self._event is None:
            raise RuntimeError("this Work belongs to a coalesced batch that has not ended (or whose body raised: it never runs)")
        torch.cuda.current_stream(self._device).wait_event(self._event)
        return True

    def is_completed(self) -> bool:
        if self._done or self._error is not None:
            return True
        if self._cuda:
            if self._failed():
                return True
            if any(not p.is_completed() for p in self._parts):
                return False
            if self._event is None or not self._event.query():
                return False
            self._done = True
            return True
        if any(not p.is_completed() for p in self._parts):
            return False
        if any(not r.test() for r in self._requests):
            return False
        try:
            self._complete()
        except Exception:
            pass
        return True

    def _failed(self) -> bool:
        try:
            self._check_requests(block=False)
        except Exception:
            return True
        return False

    def is_success(self) -> bool:
        return self.is_completed() and self._error is None

    def exception(self) -> Optional[BaseException]:
        return self._error

    def result(self) -> Any:
        if self._cuda:
            self.wait()
        else:
            self._complete()
        return self._result

    def get_future(self) -> Future:
        if self._future is None:
            fut: Future = Future()
            self._future = fut

            def settle() -> None:
                try:
                    if self._cuda:
                        # The future's readers may be on any stream: it completes once the
                        # work (and its copies) finished on the GPU.
                        self._host_wait_cuda()
                    else:
                        self._complete()
                    fut.set_result(self._result)
                except BaseException as e:  # noqa: BLE001 - handed to the future
                    fut.set_exception(e)

            if self._done:
                settle()
            else:
                threading.Thread(target=settle, name="accord-torch-future", daemon=True).start()
        return self._future


def _batch_codes() -> frozenset:
    """The code objects of torch's ``batch_isend_irecv`` (through its decorators' wrappers)."""
    codes = set()
    fn: Any = getattr(dist, "batch_isend_irecv", None)
    while fn is not None and len(codes) < 8:
        code = getattr(fn, "__code__", None)
        if code is not None:
            codes.add(code)
        fn = getattr(fn, "__wrapped__", None)
    return frozenset(codes)


_BATCH_CODES = _batch_codes()


def _in_torch_batch() -> bool:
    """Whether this call comes from torch's ``batch_isend_irecv`` (a few frames up: it calls
    ``isend``/``irecv``, which call the group's ``send``/``recv``)."""
    frame = sys._getframe(1)
    for _ in range(16):
        if frame is None:
            return False
        if frame.f_code in _BATCH_CODES:
            return True
        frame = frame.f_back
    return False


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


def _placeholder_class() -> Any:
    """A C++ ``Backend`` subclass registered on each group for ``cpu`` and ``cuda``, so that torch
    sees the group's device types, name and default backend (``split_group``, its hooks).
    None where torch's ``Backend`` cannot be subclassed from Python."""
    try:
        from torch._C._distributed_c10d import Backend as _C10dBackend

        class _Placeholder(_C10dBackend):
            # Plain attributes: torch reads these through the Python object, and a property
            # inherited from the C++ class would call back into itself.
            supports_splitting = False
            supports_coalescing = False
            _supports_time_estimate = False
            supports_shrinking = False
            supports_reconfigure = False
            supports_window = False

            def getBackendName(self) -> str:  # noqa: N802 - torch's name
                return BACKEND

        return _Placeholder
    except Exception:  # noqa: BLE001 - an older torch: no splitting
        return None


_PLACEHOLDER = _placeholder_class()


class ProcessGroup(dist.ProcessGroup):
    """A torch process group over one Accord communicator."""

    # What torch asks before coalescing a batch (batch_isend_irecv): one Work per batch, its
    # device messages in one launch group.
    supports_coalescing = True

    def __init__(self, comm: Any, rank: int, size: int):
        super().__init__(rank, size)
        self._comm = comm
        self._splittable = False
        # (device, Works) of the batch being coalesced, else None.
        self._coalescing: Optional[tuple] = None
        if _PLACEHOLDER is not None:
            try:
                self._placeholder = _PLACEHOLDER(rank, size)
                for device in ("cpu", "cuda"):
                    self._register_backend(torch.device(device), dist.ProcessGroup.BackendType.CUSTOM, self._placeholder)
                self._set_default_backend(dist.ProcessGroup.BackendType.CUSTOM)
                self._splittable = True
            except Exception:  # noqa: BLE001 - torch refused it: the group works, unsplittable
                pass

    @property
    def supports_splitting(self) -> bool:
        """What torch asks before ``split_group`` (see the module's documentation)."""
        return self._splittable

    @property
    def communicator(self) -> Any:
        """The Accord communicator underneath (for everything else Accord offers)."""
        return self._comm

    def getBackendName(self) -> str:  # noqa: N802 - torch's name
        return BACKEND

    def _get_backend(self, device: Any) -> Any:  # torch asks it what it supports
        return self

    # ----- splitting

    def split_group(
        self,
        new_ranks: List[int],
        timeout: Any = None,
        opts: Any = None,
        group_name: Optional[str] = None,
        group_desc: Optional[str] = None,
        device_types: Any = None,
    ) -> Optional["ProcessGroup"]:
        """The group of ``new_ranks`` (ranks of this group, in the new group's order), split
        from this one; None where this rank is not listed. Collective over this group: torch's
        ``split_group`` calls it on every rank, each with the list holding it (a rank in none
        gets the first list). The lists are disjoint, so the lowest rank of each names it."""
        ranks = [int(r) for r in new_ranks]
        me = self._comm.rank
        member = me in ranks
        try:
            child = self._comm.split(min(ranks) if member else None, ranks.index(me) if member else 0)
        except AccordError as e:
            raise _torch_error(e) from e
        if child is None:
            return None
        seconds = _deadline(timeout)
        if seconds is not None:
            child.timeout = seconds
        pg = ProcessGroup(child, ranks.index(me), len(ranks))
        if group_name is not None:
            pg._set_group_name(group_name)
        if group_desc is not None:
            pg._set_group_desc(group_desc)
        return pg

    def perform_nocolor_split(self, device: Any) -> None:
        """torch's hint, on ranks left out of a ``new_group`` whose parent is bound to a device,
        that the members split the parent: ours never do (each ``new_group`` makes its own
        communicator through torch's store), so nothing is to be done."""

    def eager_connect_single_device(self, device: Any) -> None:
        """Attach the GPU now (``init_process_group(device_id=...)``), as NCCL connects eagerly;
        every rank of the group takes this step together."""
        if device is not None and torch.device(device).type == "cuda":
            self._attach(torch.device(device))

    def _attach(self, device: Any) -> None:
        index = device.index if device.index is not None else torch.cuda.current_device()
        try:
            self._comm.attach_device(index)
        except AccordError as e:
            raise _torch_error(e) from e

    def _device_messages(self, t: torch.Tensor, tag: int) -> bool:
        """Whether a message of ``t`` runs on the device (see the module's documentation): a
        CUDA tensor with tag 0 on the attached GPU, where the engine (NCCL) has messages."""
        if not t.is_cuda or tag != 0 or self._comm.gpu_devices != [t.device.index]:
            return False
        try:
            self._comm.nccl_comm()
        except RuntimeError:  # Accord's own kernels: collectives only
            return False
        return True

    # ----- coalescing (batch_isend_irecv)

    def _start_coalescing(self, device: Any) -> None:
        if self._coalescing is not None:
            # Left by a batch whose body raised before torch ended it (torch's coalescing
            # manager does not end a batch on an error). None of its device messages was
            # issued (they are issued only at the end), so dropping it leaves nothing open.
            self._coalescing = None
        device = torch.device(device)
        if device.type == "cuda":
            # Collective over the group: the first batch attaches (NCCL's first use does too).
            self._attach(device)
        self._coalescing = (device, [])

    def _end_coalescing(self, device: Any) -> Work:
        if self._coalescing is None:
            raise ValueError("backend 'accord': no coalesced batch is open on this group")
        opened, works = self._coalescing
        self._coalescing = None
        if opened.type != "cuda":
            return Work(parts=works)
        device_works = [w for w in works if w._cuda]
        # The batch's device operations are issued now, in one launch group that this call
        # opens and always closes: a batch can never leave a group open on this thread, and
        # receives may come before sends on every rank.
        failure: Optional[BaseException] = None
        try:
            _native.group_start()
        except AccordError as e:
            raise _torch_error(e) from e
        try:
            for w in device_works:
                w._requests = [w._issue()]
                w._issue = None
        except BaseException as e:  # noqa: BLE001 - raised below, after the group ended
            failure = e
        try:
            _native.group_end()
        except AccordError as e:
            failure = failure or e
        if isinstance(failure, AccordError):
            raise _torch_error(failure) from failure
        if failure is not None:
            raise failure
        # The group launched on the current stream: one event behind it (and the copies into
        # the outputs) arms every device Work of the batch; host-staged messages are waited for
        # by the batch's Work.
        stream = torch.cuda.current_stream(opened)
        for w in device_works:
            if w._finish is not None:
                # Copies into the outputs, behind the launch (see _start).
                with torch.cuda.stream(stream):
                    w._finish()
                w._finish = None
        event = torch.cuda.Event()
        event.record(stream)
        for w in device_works:
            w._arm(event)
        requests = [r for w in device_works for r in w._requests]
        return Work(requests, event=event, device=stream.device, parts=[w for w in works if not w._cuda])

    def _abandon_batch(self) -> None:
        # Nothing of a batch's device part was issued yet: forgetting it is enough.
        self._coalescing = None

    def _run(self, opts: Any, call: Callable[..., Any], *args: Any, result: Any = None, finish: Optional[Callable[[], None]] = None, **kw: Any) -> Work:
        """Start ``call``. CUDA tensors: enqueued on the current stream (with ``finish``
        behind it), never blocking the host. Host tensors: torch says whether the caller waits
        at once (``opts.asyncOp`` False): then the call runs here, without a thread of its
        own, and its Work is done; messages (no options) always start in the background, so
        a batch may post its receives before its sends."""
        try:
            work = self._start(opts, call, args, kw, result, finish)
        except BaseException:
            # torch's coalescing manager does not end a batch whose call raised: drop it, so
            # that the next batch starts clean.
            self._abandon_batch()
            raise
        if self._coalescing is not None:
            self._coalescing[1].append(work)
        return work

    def _start(self, opts: Any, call: Callable[..., Any], args: tuple, kw: dict, result: Any, finish: Optional[Callable[[], None]]) -> Work:
        cuda = next((a for a in args if isinstance(a, torch.Tensor) and a.is_cuda), None)
        if cuda is not None:
            if self._coalescing is not None and self._coalescing[0].type == "cuda":
                # Issued when the batch ends (_end_coalescing), inside one launch group that
                # it opens and closes; it runs ``finish`` behind the launch and arms the Work.
                work = Work((), result, finish, device=cuda.device)
                work._issue = lambda: call(*args, async_op=True, **kw)
                return work
            if _native.group_depth() > 0:
                # The library would defer the launch to the group's end, after the event below:
                # waiting on it would not wait for the operation.
                raise ValueError(
                    "backend 'accord': a CUDA operation was called while a launch group "
                    "(accord.group() / group_start) is open on this thread; end the group first "
                    "(batch_isend_irecv batches messages by itself)"
                )
            stream = torch.cuda.current_stream(cuda.device)
            try:
                request = call(*args, async_op=True, **kw)
            except AccordError as e:
                raise _torch_error(e) from e
            if finish is not None:
                # Stream-ordered behind the operation: no host wait.
                with torch.cuda.stream(stream):
                    finish()
            event = torch.cuda.Event()
            event.record(stream)
            return Work([request], result, event=event, device=cuda.device)
        blocking = opts is not None and getattr(opts, "asyncOp", True) is False
        try:
            if blocking:
                call(*args, **kw)
                if finish is not None:
                    finish()
                return Work(result=result)
            request = call(*args, async_op=True, **kw)
        except AccordError as e:
            raise _torch_error(e) from e
        return Work([request], result, finish)

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

    def _coalesced_pairs(self, outputs: List[torch.Tensor], inputs: List[torch.Tensor], factor: Tuple[int, int], what: str) -> None:
        """Check the (output, input) pairs of a coalesced call: one dtype and device, and each
        output `factor[0]`/`factor[1]` the size of its input."""
        if len(outputs) != len(inputs) or not inputs:
            raise ValueError(f"{what}: {len(outputs)} outputs for {len(inputs)} inputs")
        for k, (o, i) in enumerate(zip(outputs, inputs)):
            if o.dtype != inputs[0].dtype or i.dtype != inputs[0].dtype or o.device != i.device:
                raise ValueError(f"{what}: pair {k} mixes dtypes or devices ({i.dtype} on {i.device} -> {o.dtype} on {o.device}); a coalesced call moves one dtype on one device")
            if o.numel() * factor[1] != i.numel() * factor[0]:
                raise ValueError(f"{what}: pair {k}: output of {o.numel()} elements for an input of {i.numel()} over {self._comm.size} ranks")

    def all_gather_single_coalesced(self, outputs: List[torch.Tensor], inputs: List[torch.Tensor], opts: Any = None) -> Work:
        """torch's coalescing manager's all_gather_into_tensor calls, as one allgather."""
        size = self._comm.size
        self._coalesced_pairs(outputs, inputs, (size, 1), "all_gather_into_tensor (coalesced)")
        flat = _arrays.concat(inputs)
        stack = torch.empty((size, flat.numel()), dtype=flat.dtype, device=flat.device)

        def unpack() -> None:
            at = 0
            for o, i in zip(outputs, inputs):
                o.copy_(stack[:, at : at + i.numel()].reshape(o.shape))
                at += i.numel()

        return self._run(opts, self._comm.allgather, flat, stack, result=outputs, finish=unpack)

    def reduce_scatter_single_coalesced(self, outputs: List[torch.Tensor], inputs: List[torch.Tensor], opts: Any = None) -> Work:
        """torch's coalescing manager's reduce_scatter_tensor calls, as one reduce_scatter."""
        size = self._comm.size
        self._coalesced_pairs(outputs, inputs, (1, size), "reduce_scatter_tensor (coalesced)")
        op = _op(opts.reduceOp) if opts is not None else "sum"
        # Rank-major: rank r's block of every input, one after the other.
        flat = torch.cat([i.contiguous().view(size, -1) for i in inputs], dim=1).reshape(-1)
        out = torch.empty(flat.numel() // size, dtype=flat.dtype, device=flat.device)

        def unpack() -> None:
            at = 0
            for o in outputs:
                o.copy_(out[at : at + o.numel()].view(o.shape))
                at += o.numel()

        return self._run(opts, self._comm.reduce_scatter, flat, out, op=op, result=outputs, finish=unpack)

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

    def _batch_on_device(self) -> bool:
        """Whether a CUDA message may run on the device as far as batches go: not when torch's
        ``batch_isend_irecv`` calls it without coalescing (torch 2.11 coalesces only groups
        whose type is exactly ``ProcessGroup``, not this subclass). Such a batch posts each
        message at once, and device messages, matched in call order, would then deadlock a
        batch that posts its receives first on every rank; through host memory they cannot."""
        return self._coalescing is not None or not _in_torch_batch()

    def send(self, tensors: List[torch.Tensor], dst: int, tag: int = 0) -> Work:
        t = _one(tensors, "send")
        if self._device_messages(t, tag) and self._batch_on_device():
            return self._run(None, self._comm.send, t.contiguous(), dst, result=tensors)
        data = t.detach().to("cpu", copy=True) if t.is_cuda else t.contiguous()
        return self._run(None, self._comm.send, data, dst, tag=tag, result=tensors)

    def recv(self, tensors: List[torch.Tensor], src: int, tag: int = 0) -> Work:
        t = _one(tensors, "recv")
        if not t.is_cuda or (self._device_messages(t, tag) and self._batch_on_device()):
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
