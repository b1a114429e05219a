"""accord.cuda's host-side helpers, which need no GPU: argument packing and its refusals, launch
dimensions, and the errors a user without a GPU or with an ordinary array gets."""

import ctypes
import struct

import numpy as np
import pytest

import accord.cuda as acuda


class FakeCudaArray:
    def __init__(self, ptr):
        self.__cuda_array_interface__ = {"data": (ptr, False), "shape": (4,), "typestr": "<i4", "version": 3}


def test_pack_aligns_each_argument_as_the_c_abi_does():
    raw = acuda.pack(np.int32(7), FakeCudaArray(0x1000), np.int8(-1), np.uint16(9), np.float64(0.5))
    # int32 at 0, pointer at 8 (aligned), int8 at 16, uint16 at 18, double at 24.
    assert len(raw) == 32
    assert struct.unpack_from("<i", raw, 0) == (7,)
    assert struct.unpack_from("<Q", raw, 8) == (0x1000,)
    assert struct.unpack_from("<b", raw, 16) == (-1,)
    assert struct.unpack_from("<H", raw, 18) == (9,)
    assert struct.unpack_from("<d", raw, 24) == (0.5,)


def test_pack_takes_ctypes_and_raw_bytes():
    raw = acuda.pack(ctypes.c_uint8(3), b"\x01\x02\x03\x04\x05\x06\x07\x08")
    assert raw == b"\x03" + b"\0" * 7 + b"\x01\x02\x03\x04\x05\x06\x07\x08"


@pytest.mark.parametrize("value", [1, 2.5, True])
def test_pack_refuses_python_numbers_and_says_what_to_pass(value):
    with pytest.raises(TypeError, match="numpy.int32"):
        acuda.pack(value)


def test_pack_refuses_what_it_cannot_lay_out():
    with pytest.raises(TypeError, match="argument 0"):
        acuda.pack(object())


def test_launch_dimensions():
    assert acuda._dim3(4) == (4, 1, 1)
    assert acuda._dim3((2, 3)) == (2, 3, 1)
    with pytest.raises(ValueError):
        acuda._dim3((1, 2, 3, 4))


def test_an_ordinary_array_is_not_symmetric():
    assert not acuda.is_symmetric(FakeCudaArray(0x2000))
    with pytest.raises(ValueError, match="symmetric heap"):
        acuda.peer_view(FakeCudaArray(0x2000), 0)
    with pytest.raises(TypeError, match="not a CUDA array"):
        acuda.symmetric_buffer(np.zeros(4))


def test_kernel_builder_needs_one_source_and_a_name():
    with pytest.raises(ValueError, match="exactly one"):
        acuda.KernelBuilder(kernel_name="k")
    with pytest.raises(ValueError, match="kernel_name"):
        acuda.KernelBuilder(source="__global__ void k() {}")
