"""Small helpers over numpy arrays, torch tensors (CPU or CUDA) and CuPy arrays for the
list-based Ray API. New arrays are made on the device of the array they are modelled on, so
that a group fed GPU tensors stays on the GPU."""

from __future__ import annotations

import sys
import threading
from typing import Any, Sequence


def is_immutable_scalar(x: Any) -> bool:
    """A Python number or a numpy scalar: nothing can be written into it."""
    if isinstance(x, (int, float, complex)):
        return True
    np = sys.modules.get("numpy")
    return np is not None and isinstance(x, np.generic)


def require_writable(x: Any, what: str) -> None:
    """Refuse an immutable scalar where a call that returns nothing must write its result."""
    if is_immutable_scalar(x):
        raise TypeError(
            f"{what} is a {type(x).__module__}.{type(x).__qualname__} scalar, which cannot be "
            "written in place, and this call returns nothing; pass an array (e.g. "
            "numpy.array(x), a 0-d array) and read the result from it"
        )


def writable(x: Any, what: str) -> None:
    """Make ``x`` ready to be written in place: refuse an immutable scalar, and give a read-only
    numpy array whose memory Ray's object store holds private memory of its own (see
    :func:`detach_from_ray_store`). Anything else read-only is left for the call to refuse."""
    require_writable(x, what)
    np = sys.modules.get("numpy")
    if np is not None and type(x) is np.ndarray and not x.flags.writeable:
        detach_from_ray_store(x)


def detach_from_ray_store(arr: Any) -> bool:
    """Switch ``arr``, a read-only numpy array over Ray's object store (a zero-copy argument of
    a task or actor call), to a private copy of its values, in place, and make it writable.

    Ray deserialises numpy arguments as read-only views of the store: large ones (and
    ``ray.put`` objects) of memory shared by every process of the node that reads the object.
    Writing there, as Ray's gloo backend does, changes the object under every other reader,
    and two actors handed one object would reduce into the same memory. Copying on write
    keeps the store immutable while code written for Ray (``col.allreduce(self.buffer)`` on a
    buffer received as an argument) works as it does with gloo.

    numpy has no call to replace an array's memory, so the array's data and base pointers are
    rewritten where numpy keeps them (``PyArrayObject_fields``, part of numpy's C ABI); the
    layout is checked against what numpy reports first. Returns False, changing nothing, for
    arrays that are not of the store, not C-contiguous, or of a layout that does not check out.
    """
    import ctypes

    import numpy as np

    root = arr
    while isinstance(root, np.ndarray) and root.base is not None:
        root = root.base
    if not type(root).__module__.startswith("ray.") or not arr.flags.c_contiguous:
        return False
    word = ctypes.sizeof(ctypes.c_void_p)
    addr = id(arr)
    # PyObject_HEAD (refcount, type), then data, nd, dimensions, strides, base.
    data_at, nd_at, base_at = addr + 2 * word, addr + 3 * word, addr + 6 * word
    data = ctypes.c_void_p.from_address(data_at)
    base = ctypes.c_void_p.from_address(base_at)
    if (
        data.value != arr.__array_interface__["data"][0]
        or ctypes.c_int.from_address(nd_at).value != arr.ndim
        or base.value != id(arr.base)
    ):
        return False
    private = np.array(arr, order="C", copy=True)
    with _DETACHING:
        # Another thread may have detached it meanwhile: the base it saw is gone then.
        old = arr.base
        if base.value != id(old) or arr.flags.writeable:
            return arr.flags.writeable
        owner = private.view(_owned_view())
        owner._store = old
        ctypes.pythonapi.Py_IncRef(ctypes.py_object(owner))
        data.value = private.__array_interface__["data"][0]
        base.value = id(owner)
        # The array's own reference to the store buffer; `owner._store` keeps one.
        ctypes.pythonapi.Py_DecRef(ctypes.py_object(old))
        arr.flags.writeable = True
    return True


_OWNED_VIEW: Any = None
#: Held while an array's pointers are rewritten: two threads detaching one array would both
#: release the store buffer's reference.
_DETACHING = threading.Lock()


def _owned_view() -> Any:
    """The base a detached array hangs from: a view of its private copy that also keeps the
    store buffer it replaced (buffers exported before the switch still point into it)."""
    global _OWNED_VIEW
    if _OWNED_VIEW is None:
        import numpy as np

        class OwnedView(np.ndarray):
            pass

        _OWNED_VIEW = OwnedView
    return _OWNED_VIEW


def _is_torch(x: Any) -> bool:
    return type(x).__module__.startswith("torch")


def _is_cupy(x: Any) -> bool:
    return type(x).__module__.startswith("cupy")


def empty(like: Any, shape: Sequence[int], dtype: Any = None) -> Any:
    """A new contiguous array of `shape` in like's framework, on like's device, of like's dtype
    unless `dtype` (of that framework) is given."""
    shape = tuple(int(n) for n in shape)
    dtype = like.dtype if dtype is None else dtype
    if _is_torch(like):
        import torch

        return torch.empty(shape, dtype=dtype, device=like.device)
    if _is_cupy(like):
        import cupy

        with like.device:
            return cupy.empty(shape, dtype=dtype)
    import numpy as np

    return np.empty(shape, dtype=dtype)


def empty_stack(like: Any, n: int) -> Any:
    """A new contiguous array of shape (n, *like.shape), like's dtype and device."""
    return empty(like, (n, *like.shape))


def like(x: Any, model: Any) -> Any:
    """``x`` as an array of ``model``'s framework and device (a view where it can be): Ray's
    list-based calls accept lists that mix numpy arrays and tensors, as its gloo backend does."""
    if _is_torch(model):
        if _is_torch(x):
            return x.to(model.device) if x.device != model.device else x
        import torch

        if _is_cupy(x):
            return torch.from_dlpack(x).to(model.device)
        return torch.as_tensor(x, device=model.device)
    if _is_cupy(model):
        import cupy

        if _is_cupy(x):
            if x.device.id == model.device.id:
                return x
            with model.device:
                return cupy.array(x, copy=True)
        with model.device:
            return cupy.asarray(x.detach() if _is_torch(x) else x)
    if _is_torch(x):
        return x.detach().cpu().numpy()
    if _is_cupy(x):
        return x.get()
    return x


def is_host(x: Any) -> bool:
    """Whether ``x`` lives in host memory (numpy, a CPU tensor)."""
    if _is_torch(x):
        return x.device.type == "cpu"
    return not _is_cupy(x)


def numel(x: Any) -> int:
    """Number of elements of a numpy array, torch tensor or CuPy array."""
    return int(x.numel()) if _is_torch(x) else int(x.size)


def concat(arrays: Sequence[Any]) -> Any:
    """The arrays, flattened and concatenated into one new contiguous array (on the first one's
    framework and device)."""
    first = arrays[0]
    arrays = [like(a, first) for a in arrays]
    if _is_torch(first):
        import torch

        return torch.cat([a.reshape(-1) for a in arrays]).contiguous()
    if _is_cupy(first):
        import cupy

        with first.device:
            return cupy.ascontiguousarray(cupy.concatenate([cupy.ravel(a) for a in arrays]))
    import numpy as np

    return np.ascontiguousarray(np.concatenate([np.ravel(a) for a in arrays]))


def copy_into(dst: Any, src: Any) -> None:
    """dst[...] = src (same number of elements; any framework or device)."""
    src = like(src, dst)
    if _is_torch(dst):
        dst.copy_(src.reshape(dst.shape))
    else:
        dst[...] = src.reshape(dst.shape)
