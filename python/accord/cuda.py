"""GPU memory every local rank can reach, channels between GPUs, and kernels compiled at run time.

The symmetric heap: :func:`empty_symmetric` allocates an array (CuPy or torch) that every rank of
the communicator on this host maps, so a kernel can read and write a peer's copy directly
(:func:`peer_view` gives that copy as an array). Allocation and :func:`free_symmetric` are
collective: every rank calls them, in the same order, with the same size.

Channels: :func:`memory_channels` connects a symmetric array to the same array on every local
peer and returns a device array of channel handles, one per rank, that kernels use through
``#include <accord/channel.cuh>`` (``put``, ``signal``, ``wait``, ``put_packets`` ...). Every wait
in a kernel is bounded by the communicator's timeout; :meth:`MemoryChannels.check` turns a wait
that timed out into :class:`accord.TimeoutError` naming the rank that never signalled.

Kernels: :class:`KernelBuilder` compiles CUDA C++ with NVRTC (Accord's headers on the include
path, the device's architecture chosen for you, results cached) and :meth:`Kernel.launch` runs it
on the framework's current stream; :func:`pack` lays out the arguments.

Example (the MSCCL++ tutorial, ported: ``python/examples/channels_tutorial.py``)::

    comm = accord.init()
    buf = accord.cuda.empty_symmetric(1024, "int32", array="cupy")
    chans = accord.cuda.memory_channels(buf)
    k = accord.cuda.KernelBuilder(source=SRC, kernel_name="exchange").kernel()
    k.launch(1, 512, accord.cuda.pack(chans, numpy.int32(comm.rank), numpy.int32(comm.size),
                                       numpy.uint64(buf.nbytes)))
"""

from __future__ import annotations

import math
import struct
import sys
from typing import Any, Optional, Sequence, Tuple, Union

from . import _native

Dim = Union[int, Sequence[int]]

__all__ = [
    "KernelBuilder",
    "Kernel",
    "MemoryChannels",
    "empty_symmetric",
    "free_symmetric",
    "include_dir",
    "is_symmetric",
    "memory_channels",
    "pack",
    "peer_view",
    "symmetric_buffer",
]


def include_dir() -> str:
    """The directory holding Accord's CUDA headers (``accord/channel.cuh`` ...), for compilers
    other than :class:`KernelBuilder` (nvcc, CuPy's ``RawModule(options=("-I" + dir,))``)."""
    return _native.cuda_include_dir()


# ------------------------------------------------------------------------------------------------
# The symmetric heap.

# Data pointer -> (native buffer, shape, dtype name, framework) of every live symmetric array.
_HEAP: dict = {}


def _default_comm(comm):
    if comm is not None:
        return comm
    from . import default_group

    return default_group()


def _itemsize(dtype: Any) -> int:
    import numpy as np

    return np.dtype(_numpy_dtype(dtype)).itemsize


def _numpy_dtype(dtype: Any) -> Any:
    """A numpy dtype for a dtype given as a string, numpy dtype or torch dtype."""
    import numpy as np

    if type(dtype).__module__.startswith("torch"):
        name = str(dtype).removeprefix("torch.")
        if name == "bfloat16":
            raise TypeError("bfloat16 symmetric arrays: allocate uint16 and view them as bfloat16")
        return np.dtype(name)
    return np.dtype(dtype)


def _wrap(ptr: int, shape: Tuple[int, ...], dtype: Any, array: str, device: int, owner: Any) -> Any:
    """An array of `array`'s framework over device memory at `ptr` that keeps `owner` alive."""
    np_dtype = _numpy_dtype(dtype)
    if array == "cupy":
        import cupy

        mem = cupy.cuda.UnownedMemory(ptr, math.prod(shape) * np_dtype.itemsize, owner, device)
        return cupy.ndarray(shape, np_dtype, cupy.cuda.MemoryPointer(mem, 0))
    if array == "torch":
        import torch

        class _Cai:
            def __init__(self) -> None:
                self.owner = owner
                self.__cuda_array_interface__ = {
                    "shape": shape,
                    "typestr": np_dtype.str,
                    "data": (ptr, False),
                    "version": 3,
                    "strides": None,
                    "stream": None,
                }

        return torch.as_tensor(_Cai(), device=torch.device("cuda", device))
    raise ValueError(f"array must be 'cupy' or 'torch', not {array!r}")


def _data_ptr(a: Any) -> int:
    cai = getattr(a, "__cuda_array_interface__", None)
    if cai is None:
        raise TypeError(
            f"{type(a).__module__}.{type(a).__qualname__} is not a CUDA array; symmetric arrays "
            "come from accord.cuda.empty_symmetric"
        )
    return cai["data"][0]


def empty_symmetric(
    shape: Union[int, Sequence[int]],
    dtype: Any = "float32",
    array: str = "cupy",
    comm: Optional[_native.Communicator] = None,
) -> Any:
    """An uninitialised array on the symmetric heap of `comm` (default: the default group).

    Collective over `comm`: every rank asks for the same shape and dtype (a different size is an
    error naming the ranks). The array lives on the communicator's GPU (attached on first use:
    the framework's current device) and every rank of this host maps it (see :func:`peer_view`).
    `array` picks the framework: ``"cupy"`` or ``"torch"``.
    """
    comm = _default_comm(comm)
    shape = (shape,) if isinstance(shape, int) else tuple(int(s) for s in shape)
    nbytes = math.prod(shape) * _itemsize(dtype)
    buf = comm.alloc_symmetric(nbytes, _current_device(array))
    a = _wrap(buf.ptr, shape, dtype, array, buf.device, buf)
    _HEAP[buf.ptr] = (buf, shape, dtype, array)
    return a


def _current_device(array: str) -> int:
    if array == "torch":
        import torch

        return torch.cuda.current_device()
    if array == "cupy":
        import cupy

        return cupy.cuda.Device().id
    raise ValueError(f"array must be 'cupy' or 'torch', not {array!r}")


def symmetric_buffer(a: Any) -> Any:
    """The heap allocation behind symmetric array `a`, or a ValueError saying it is not one."""
    ptr = _data_ptr(a)
    entry = _HEAP.get(ptr)
    if entry is None:
        raise ValueError(
            "this array is not on Accord's symmetric heap (an ordinary allocation, a view that "
            "does not start at the allocation, or one already freed): allocate it with "
            "accord.cuda.empty_symmetric"
        )
    return entry[0]


def is_symmetric(a: Any) -> bool:
    """Whether `a` starts a live allocation of the symmetric heap."""
    try:
        return _data_ptr(a) in _HEAP
    except TypeError:
        return False


def peer_view(a: Any, rank: int) -> Any:
    """Symmetric array `a` as rank `rank` holds it, mapped into this process (same shape and
    dtype). `rank` must be a rank of this host (:meth:`Communicator.symmetric_peers`)."""
    buf = symmetric_buffer(a)
    _, shape, dtype, array = _HEAP[buf.ptr]
    return _wrap(buf.peer_ptr(rank), shape, dtype, array, buf.device, buf)


def free_symmetric(a: Any) -> None:
    """Free symmetric array `a` on every rank (collective). Arrays over it, `a` and its peer
    views included, must not be used afterwards."""
    buf = symmetric_buffer(a)
    del _HEAP[buf.ptr]
    buf.free()


# ------------------------------------------------------------------------------------------------
# Channels.


class MemoryChannels:
    """Channels from a symmetric array to the same array on every local peer.

    ``ptr`` is a device array of ``size`` channel handles (``accord::MemoryChannel`` in
    ``<accord/channel.cuh>``), indexed by rank; a rank's own entry and those of ranks on other
    hosts are empty. Pass it to kernels with :func:`pack`. After a kernel that waits on them,
    :meth:`check` raises the error of a wait that timed out.
    """

    def __init__(self, native: Any, owner: Any) -> None:
        self._native = native
        self._owner = owner  # the symmetric array: it must outlive the channels

    @property
    def ptr(self) -> int:
        return self._native.ptr

    @property
    def peers(self) -> list:
        """Ranks that have a channel."""
        return list(self._native.peers)

    def check(self) -> None:
        """Synchronise the device and raise :class:`accord.TimeoutError` if a wait timed out in a
        kernel (naming the rank that never signalled), then clear the error word."""
        self._native.check()

    def free(self) -> None:
        """Free the channels' semaphores on every rank (collective)."""
        self._native.free()

    def __repr__(self) -> str:
        return f"MemoryChannels(ptr=0x{self.ptr:x}, peers={self.peers})"


def memory_channels(a: Any) -> MemoryChannels:
    """Channels from symmetric array `a` to every local peer's copy of it (collective)."""
    return MemoryChannels(symmetric_buffer(a).memory_channels(), a)


# ------------------------------------------------------------------------------------------------
# Kernels.


def pack(*args: Any) -> bytes:
    """Kernel arguments laid out as the kernel's parameter list is in memory (each aligned to
    its size, as the C ABI places them).

    Accepted: CUDA arrays (their device pointer), :class:`MemoryChannels` (the device pointer to
    its handles), numpy scalars (their bytes: ``numpy.int32(rank)``), ``bytes`` (as they are,
    8-byte aligned) and ``ctypes`` values. A plain Python ``int`` or ``float`` is refused: the
    kernel's parameter type decides its width, so say it (``numpy.int32(x)``, ``numpy.uint64(x)``).
    """
    out = bytearray()

    def put(raw: bytes, align: int) -> None:
        out.extend(b"\0" * (-len(out) % align))
        out.extend(raw)

    np = sys.modules.get("numpy")
    for i, a in enumerate(args):
        if isinstance(a, MemoryChannels):
            put(struct.pack("<Q", a.ptr), 8)
        elif hasattr(a, "__cuda_array_interface__"):
            put(struct.pack("<Q", _data_ptr(a)), 8)
        elif np is not None and isinstance(a, np.generic):
            raw = a.tobytes()
            put(raw, min(len(raw), 8))
        elif isinstance(a, (bytes, bytearray, memoryview)):
            put(bytes(a), 8)
        elif type(a).__module__ == "ctypes":
            import ctypes

            put(bytes(a), ctypes.alignment(a))
        elif isinstance(a, (bool, int, float)):
            raise TypeError(
                f"pack: argument {i} is a Python {type(a).__name__}; give its C type, e.g. "
                "numpy.int32(x), numpy.uint64(x), numpy.float32(x)"
            )
        else:
            raise TypeError(f"pack: argument {i} of type {type(a).__qualname__} cannot be packed")
    return bytes(out)


class Kernel:
    """A compiled kernel; :meth:`launch` runs it."""

    def __init__(self, native: Any) -> None:
        self._native = native

    def launch(
        self,
        grid: Dim,
        block: Dim,
        args: Union[bytes, Sequence[Any]] = b"",
        shared_mem: int = 0,
        stream: Any = None,
    ) -> None:
        """Launch on `stream`: a CuPy or torch stream, a raw ``CUstream`` int, or ``None`` for
        the current stream of the framework in use (torch if imported, else CuPy). `args` is
        :func:`pack`'s output or a sequence to pack. As with CuPy's ``RawKernel``, the kernel
        runs with what it is given: arguments that do not match its parameters, or pointers it
        must not write, corrupt memory."""
        if not isinstance(args, (bytes, bytearray)):
            args = pack(*args)
        self._native.launch(_dim3(grid), _dim3(block), bytes(args), shared_mem, _stream(stream))

    @property
    def name(self) -> str:
        return self._native.name


class KernelBuilder:
    """Compile CUDA C++ (a string or a file) with NVRTC, with Accord's headers on the include
    path and the current device's architecture; cached per (source, options, architecture).

    ``KernelBuilder(source=SRC, kernel_name="k").kernel()`` — the kernel must be
    ``extern "C" __global__``. `options` are NVRTC options (``-DNAME=1``, ``-I/dir``).
    Compile errors raise ``ValueError`` with NVRTC's log."""

    def __init__(
        self,
        source: Optional[str] = None,
        kernel_name: str = "",
        file: Optional[str] = None,
        options: Sequence[str] = (),
    ) -> None:
        if (source is None) == (file is None):
            raise ValueError("KernelBuilder needs exactly one of source= and file=")
        if file is not None:
            with open(file) as f:
                source = f.read()
        if not kernel_name:
            raise ValueError("KernelBuilder needs kernel_name=")
        self.source = source
        self.kernel_name = kernel_name
        self.options = list(options)

    def kernel(self, device: Optional[int] = None) -> Kernel:
        """The compiled kernel for `device` (default: the current CUDA device)."""
        if device is None:
            device = _any_current_device()
        return Kernel(_native.compile_kernel(self.source, self.kernel_name, self.options, device))


def _dim3(d: Dim) -> Tuple[int, int, int]:
    if isinstance(d, int):
        return (d, 1, 1)
    d = tuple(int(x) for x in d)
    if not 1 <= len(d) <= 3:
        raise ValueError(f"a launch dimension has 1 to 3 entries, not {len(d)}")
    return d + (1,) * (3 - len(d))


def _any_current_device() -> int:
    if "torch" in sys.modules:
        import torch

        if torch.cuda.is_initialized():
            return torch.cuda.current_device()
    if "cupy" in sys.modules:
        import cupy

        return cupy.cuda.Device().id
    return 0


def _stream(stream: Any) -> int:
    if stream is None:
        if "torch" in sys.modules:
            import torch

            if torch.cuda.is_initialized():
                return torch.cuda.current_stream().cuda_stream
        if "cupy" in sys.modules:
            import cupy

            return cupy.cuda.get_current_stream().ptr
        return 0
    if isinstance(stream, int):
        return stream
    for attr in ("cuda_stream", "ptr"):
        if hasattr(stream, attr):
            return int(getattr(stream, attr))
    raise TypeError(f"not a CUDA stream: {stream!r}")
