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
