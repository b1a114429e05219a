"""Several tensors per process, with Ray's multi-GPU semantics (``allreduce_multigpu`` and
friends): every tensor of every process takes part, as if each were a rank of its own.

Ray's NCCL backend runs one NCCL rank per GPU. Accord's process has one communicator, so a
call with ``k`` tensors first combines them in the process (on the first tensor's device:
the reduction of the ``k``, or their stack), runs the one collective between processes, and
writes each tensor's part back. Global GPU ``g`` of the group is tensor ``g % k`` of process
``g // k`` (Ray's order). One tensor per process is the plain call, unchanged.

Point-to-point messages name GPUs on both sides (``dst_gpu_index``, ``src_gpu_index``); a
message between GPUs other than 0 and 0 travels through host memory with a tag made of the
two indices, so messages to different GPUs of one process never match the wrong receive. So do
messages of CUDA tensors before the group attached its GPU (a collective step: attaching inside
a message would wait for the ranks not in it).
"""

from __future__ import annotations

from typing import Any, List, Sequence

from . import _arrays


class ListMismatchError(ValueError, RuntimeError):
    """A list-based call's tensors disagree with the group (an entry's number of elements, or
    a list's length). A ``ValueError`` like accord's other argument errors, and a
    ``RuntimeError`` as Ray's own backends raise it. Raised before anything is sent."""


def check_list(entries: Sequence[Any], tensor: Any, what: str) -> None:
    """Every entry of ``entries`` holds as many elements as ``tensor``."""
    want = _arrays.numel(tensor)
    for i, t in enumerate(entries):
        if t is not None and _arrays.numel(t) != want:
            raise ListMismatchError(
                f"{what}[{i}] holds {_arrays.numel(t)} elements but the tensor holds {want}: "
                "every entry must have the tensor's number of elements"
            )


def check_entries(entries: Sequence[Any], count: int, tensor: Any, what: str) -> None:
    """``entries`` has ``count`` entries, each holding as many elements as ``tensor``."""
    if len(entries) != count:
        raise ListMismatchError(f"{what} has {len(entries)} entries; this call needs {count}")
    check_list(entries, tensor, what)


def _copy(t: Any) -> Any:
    """A new contiguous array with ``t``'s values, framework and device."""
    out = _arrays.empty_stack(t, 1)[0]
    _arrays.copy_into(out, t)
    return out


def _fold(acc: Any, x: Any, op: str) -> None:
    """acc = op(acc, x), elementwise, in place (x moved to acc's framework and device)."""
    x = _arrays.like(x, acc).reshape(acc.shape)
    if _arrays._is_torch(acc):
        import torch

        fns = {"sum": torch.add, "prod": torch.mul, "min": torch.minimum, "max": torch.maximum}
    elif _arrays._is_cupy(acc):
        import cupy

        fns = {"sum": cupy.add, "prod": cupy.multiply, "min": cupy.minimum, "max": cupy.maximum}
    else:
        import numpy

        fns = {"sum": numpy.add, "prod": numpy.multiply, "min": numpy.minimum, "max": numpy.maximum}
    if op not in fns:
        raise ValueError(f"reduce op {op!r} with several tensors per process: use sum, prod, min or max")
    fns[op](acc, x, out=acc)


def _local(tensors: Sequence[Any], op: str) -> Any:
    """The elementwise reduction of ``tensors`` with ``op``, a new array on the first one's device."""
    acc = _copy(tensors[0])
    for t in tensors[1:]:
        _fold(acc, t, op)
    return acc


def _stack(tensors: Sequence[Any]) -> Any:
    """``tensors`` stacked into a new (len, *shape) array on the first one's device."""
    out = _arrays.empty_stack(tensors[0], len(tensors))
    for i, t in enumerate(tensors):
        _arrays.copy_into(out[i], t)
    return out


def allreduce(comm: Any, tensors: List[Any], op: str) -> None:
    """Every tensor gets the reduction over every tensor of every process."""
    if len(tensors) == 1:
        comm.allreduce(tensors[0], op=op)
        return
    check_list(tensors, tensors[0], "tensors")
    total = _local(tensors, op)
    comm.allreduce(total, op=op)
    for t in tensors:
        _arrays.copy_into(t, total)


def reduce(comm: Any, tensors: List[Any], op: str, root: int, root_tensor: int) -> None:
    """Tensor ``root_tensor`` of process ``root`` gets the reduction over every tensor; the
    others keep their values."""
    if len(tensors) == 1 and root_tensor == 0:
        comm.reduce(tensors[0], op=op, root=root)
        return
    check_list(tensors, tensors[0], "tensors")
    total = _local(tensors, op)
    comm.reduce(total, op=op, root=root)
    if comm.rank == root:
        _arrays.copy_into(tensors[root_tensor], total)


def broadcast(comm: Any, tensors: List[Any], root: int, root_tensor: int) -> None:
    """Every tensor gets tensor ``root_tensor`` of process ``root``."""
    if len(tensors) == 1 and root_tensor == 0:
        comm.broadcast(tensors[0], root=root)
        return
    check_list(tensors, tensors[0], "tensors")
    src = tensors[root_tensor] if comm.rank == root else tensors[0]
    buf = _arrays.like(_copy(src), tensors[0])
    comm.broadcast(buf, root=root)
    for i, t in enumerate(tensors):
        if not (comm.rank == root and i == root_tensor):
            _arrays.copy_into(t, buf)


def allgather(comm: Any, output_lists: List[List[Any]], tensors: List[Any]) -> None:
    """Each list of ``output_lists`` gets every tensor of every process, in (rank, tensor) order."""
    k = len(tensors)
    if len(output_lists) != k:
        raise ListMismatchError(f"{len(output_lists)} output lists for {k} input tensors")
    for j, lst in enumerate(output_lists):
        what = "tensor_list" if k == 1 else f"output_tensor_lists[{j}]"
        check_entries(lst, comm.size * k, tensors[0], what)
        for dst in lst:
            _arrays.writable(dst, f"an entry of {what}")
    check_list(tensors, tensors[0], "tensors")
    mine = tensors[0] if k == 1 else _stack(tensors)
    out = _arrays.empty_stack(tensors[0], comm.size * k)
    comm.allgather(mine, out)
    for lst in output_lists:
        for g, dst in enumerate(lst):
            _arrays.copy_into(dst, out[g])


def reducescatter(comm: Any, tensors: List[Any], input_lists: List[List[Any]], op: str) -> None:
    """Tensor ``i`` of process ``r`` gets entry ``r * k + i`` of the reduction, over every
    process and tensor, of the input lists (``k`` tensors per process, lists of ranks x ``k``)."""
    k = len(tensors)
    if len(input_lists) != k:
        raise ListMismatchError(f"{len(input_lists)} input lists for {k} output tensors")
    for j, lst in enumerate(input_lists):
        what = "tensor_list" if k == 1 else f"input_tensor_lists[{j}]"
        check_entries(lst, comm.size * k, tensors[0], what)
    for t in tensors:
        _arrays.writable(t, "tensor")
    if k == 1:
        comm.reduce_scatter(_arrays.concat(input_lists[0]), tensors[0], op=op)
        return
    # Entry g of this process's contribution: the reduction of entry g of its k lists.
    mine = _arrays.empty_stack(tensors[0], comm.size * k)
    for g in range(comm.size * k):
        _arrays.copy_into(mine[g], _local([lst[g] for lst in input_lists], op))
    out = _arrays.empty_stack(tensors[0], k)
    comm.reduce_scatter(mine, out, op=op)
    for i, t in enumerate(tensors):
        _arrays.copy_into(t, out[i])


def gpu_index(t: Any) -> Any:
    """The CUDA device of ``t``, or None for host memory."""
    if _arrays._is_torch(t):
        return (t.device.index or 0) if t.device.type == "cuda" else None
    if _arrays._is_cupy(t):
        return int(t.device.id)
    return None


def _tag(src_gpu: int, dst_gpu: int) -> int:
    return 1 + src_gpu * 4096 + dst_gpu


def _contiguous(t: Any) -> bool:
    return bool(t.is_contiguous()) if _arrays._is_torch(t) else bool(t.flags.c_contiguous)


def _first(t: Any, n: int) -> Any:
    """The first ``n`` elements of ``t`` (all of them for 0), as a flat view of its memory."""
    if not _contiguous(t):
        raise ValueError("the tensor is not contiguous: pass a contiguous one (e.g. .contiguous())")
    flat = t.reshape(-1)
    if n < 0 or n > _arrays.numel(flat):
        raise ValueError(f"n_elements {n} is not within the tensor's {_arrays.numel(flat)} elements")
    return flat[:n] if n else flat


def _host(t: Any) -> Any:
    """``t``'s values in host memory (a torch CPU tensor for torch, so every torch dtype works;
    numpy otherwise)."""
    if _arrays._is_torch(t):
        return t.detach().to("cpu").contiguous()
    import numpy

    return numpy.ascontiguousarray(_arrays.like(t, numpy.empty(0)))


def _on_device(comm: Any, view: Any) -> Any:
    """Whether a message between GPUs 0 and 0 runs on the device engine: only once the group has
    attached its GPU (a collective step every rank took together, so both ends agree), and for
    CUDA arrays. Before that it goes through host memory: attaching inside a message would wait
    for ranks that are not in it."""
    return bool(comm.gpu_devices) and gpu_index(view) is not None


def _on_attached(comm: Any, view: Any) -> Any:
    """``view``, or a copy of it on the communicator's GPU where it is a CUDA array of another."""
    attached = comm.gpu_devices[0]
    if gpu_index(view) == attached:
        return view
    if _arrays._is_torch(view):
        return view.to(f"cuda:{attached}")
    import cupy

    with cupy.cuda.Device(attached):
        return cupy.array(view, copy=True)


def send(comm: Any, tensor: Any, dst: int, dst_gpu: int, n_elements: int) -> None:
    """Send (the first ``n_elements`` of) ``tensor`` to GPU ``dst_gpu`` of process ``dst``."""
    view = _first(tensor, n_elements)
    src_gpu = gpu_index(tensor) or 0
    if (src_gpu, dst_gpu) == (0, 0) and _arrays.is_host(view):
        comm.send(view, dst)
    elif (src_gpu, dst_gpu) == (0, 0) and _on_device(comm, view):
        comm.send(_on_attached(comm, view), dst)
    else:
        comm.send(_host(view), dst, tag=_tag(src_gpu, dst_gpu))


def recv(comm: Any, tensor: Any, src: int, src_gpu: int, n_elements: int) -> None:
    """Receive (the first ``n_elements`` of) ``tensor`` from GPU ``src_gpu`` of process ``src``."""
    _arrays.writable(tensor, "tensor")
    view = _first(tensor, n_elements)
    dst_gpu = gpu_index(tensor) or 0
    if (src_gpu, dst_gpu) == (0, 0) and _arrays.is_host(view):
        comm.recv(view, src)
        return
    if (src_gpu, dst_gpu) == (0, 0) and _on_device(comm, view):
        staged = _on_attached(comm, view)
        comm.recv(staged, src)
    else:
        staged = _host(view)
        comm.recv(staged, src, tag=_tag(src_gpu, dst_gpu))
    if staged is not view:
        _arrays.copy_into(view, staged)
