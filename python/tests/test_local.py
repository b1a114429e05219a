"""In-process checks on a one-rank world (no launcher)."""

import numpy as np
import pytest

import accord


def _one_rank():
    server = accord.StoreServer("127.0.0.1", 0)
    return accord.init_from_store(0, 1, f"127.0.0.1:{server.port}", server.token, timeout=20, store=server)


@pytest.fixture(scope="module")
def comm():
    yield _one_rank()


def test_exception_hierarchy():
    assert issubclass(accord.TimeoutError, TimeoutError)
    assert issubclass(accord.TimeoutError, accord.AccordError)
    assert issubclass(accord.InvalidArgumentError, ValueError)
    assert issubclass(accord.UnsupportedError, TypeError)
    for name in ["DesyncError", "PeerLostError", "AbortedError", "UnauthorizedError", "ProtocolError", "StoreError"]:
        assert issubclass(getattr(accord, name), accord.AccordError)


def test_reduce_op_enum():
    assert [o.name for o in accord.ReduceOp] == ["SUM", "PROD", "MIN", "MAX", "AVG", "BAND", "BOR", "BXOR"]
    assert accord.ReduceOp.SUM == "sum"


def test_in_place_and_buffers(comm):
    x = np.arange(5, dtype=np.float64)
    assert comm.allreduce(x) is x
    b = bytearray(b"\x01\x02\x03")
    comm.allreduce(b)  # buffer protocol
    assert bytes(b) == b"\x01\x02\x03"
    m = memoryview(np.arange(3, dtype=np.int32))
    comm.broadcast(m, root=0)


def test_timeout_property(comm):
    comm.timeout = 12.5
    assert comm.timeout == 12.5
    with pytest.raises(ValueError):
        comm.timeout = -1


def test_request_wait_and_test(comm):
    x = np.ones(100, np.float32)
    r = comm.allreduce(x, async_op=True)
    assert r.wait(timeout=10) is x
    assert r.test()


def test_recv_timeout_is_structured():
    # A communicator of its own: a timeout fails (poisons) the communicator for good.
    comm = _one_rank()
    comm.timeout = 0.3
    with pytest.raises(accord.TimeoutError) as e:
        comm.recv(np.zeros(2, np.float32), 0, tag=9)
    assert isinstance(e.value, TimeoutError)
    assert e.value.waiting_for == [0]


def test_unauthorized_store():
    server = accord.StoreServer("127.0.0.1", 0, token="right")
    with pytest.raises(accord.AccordError) as e:
        accord.init_from_store(0, 1, f"127.0.0.1:{server.port}", "wrong", timeout=3)
    assert isinstance(e.value, (accord.UnauthorizedError, accord.TimeoutError)), e.value
    server.close()


def test_torch_tensors(comm):
    torch = pytest.importorskip("torch", reason="torch not installed")
    t = torch.arange(6, dtype=torch.bfloat16)
    assert comm.allreduce(t) is t
    assert t.tolist() == list(range(6))


def test_numpy_arrays_keep_their_checks_on_the_buffer_path(comm):
    # Every dtype accord reduces comes through numpy's buffer exactly (values, not bytes).
    for dt in [np.int8, np.uint8, np.int16, np.uint16, np.int32, np.uint32, np.int64, np.uint64, np.float16,
               np.float32, np.float64, np.bool_, np.complex64, np.complex128]:
        x = (np.arange(7) - 3 + (1j if np.dtype(dt).kind == "c" else 0)).astype(dt)
        out = np.zeros_like(x)
        assert comm.allreduce(x, op="sum", out=out) is out
        np.testing.assert_array_equal(out, x)
    # A read-only array is a fine input and a refused output.
    ro = np.arange(4, dtype=np.float32)
    ro.flags.writeable = False
    out = np.zeros(4, np.float32)
    comm.allreduce(ro, out=out)
    np.testing.assert_array_equal(out, ro)
    with pytest.raises(ValueError, match="read-only|writable"):
        comm.allreduce(ro)
    # Not contiguous, big-endian and unsupported dtypes are refused, naming the problem.
    with pytest.raises((ValueError, TypeError), match="contiguous"):
        comm.allreduce(np.zeros((4, 4), np.float32)[:, 0])
    with pytest.raises(TypeError, match=r">f4 \(float32, big-endian\).*newbyteorder"):
        comm.allreduce(np.zeros(4, ">f4"))
    with pytest.raises(TypeError, match="float128.*cannot reduce"):
        comm.allreduce(np.zeros(4, np.longdouble))
    # ... though such a dtype moves, as its bytes.
    when = np.array(["2026-11-27T06:00", "NaT"], "datetime64[s]")
    out = np.zeros(2 * comm.size, when.dtype)
    assert comm.allgather(when, out) is out
    np.testing.assert_array_equal(out, np.tile(when, comm.size))

    # A subclass takes the general path and works the same.
    class Tagged(np.ndarray):
        pass

    t = np.arange(3, dtype=np.float32).view(Tagged)
    assert comm.allreduce(t) is t


def test_rank_arguments_out_of_range_name_the_argument(comm):
    x = np.zeros(2, np.float32)
    for call, name in [
        (lambda: comm.broadcast(x, root=-1), "root"),
        (lambda: comm.reduce(x, root=-2), "root"),
        (lambda: comm.gather(x, out=np.zeros(2, np.float32), root=-1), "root"),
        (lambda: comm.scatter(x, np.zeros(2, np.float32), root=-1), "root"),
        (lambda: comm.send(x, -1), "dst"),
        (lambda: comm.recv(x, -1), "src"),
    ]:
        with pytest.raises(ValueError, match=f"{name} must be a rank"):
            call()
    with pytest.raises(ValueError, match="root"):
        comm.broadcast(x, root=comm.size)


def test_close_and_context_manager():
    with _one_rank() as comm:
        x = np.ones(3, np.float32)
        comm.allreduce(x)
    with pytest.raises(ValueError, match="was closed"):
        comm.allreduce(x)
    comm.close()  # again: nothing more
    with pytest.raises(accord.InvalidArgumentError, match="was closed"):
        comm.barrier()


def test_docstrings_say_args_returns_and_raises():
    for name in ["send", "recv", "sendrecv", "barrier", "broadcast", "allreduce", "reduce", "allgather",
                 "gather", "scatter", "reduce_scatter", "alltoall"]:
        doc = getattr(accord.Communicator, name).__doc__ or ""
        for part in ("Args:", "Returns:", "Raises:"):
            assert part in doc, f"Communicator.{name}: no {part}"
        assert "Args:" in (getattr(accord, name).__doc__ or ""), f"accord.{name}"
    for name in ["broadcast_object", "all_gather_object", "gather_object", "scatter_object_list",
                 "send_object", "recv_object", "close"]:
        assert getattr(accord.Communicator, name).__doc__, f"Communicator.{name}"


def test_init_again_after_a_with_block():
    with accord.init("tcp://127.0.0.1:0", rank=0, world_size=1, timeout=20) as c:
        c.barrier()
    assert c.closed and not accord.is_initialized()
    c2 = accord.init("tcp://127.0.0.1:0", rank=0, world_size=1, timeout=20)
    c2.barrier()
    accord.destroy()
    assert c2.closed
