"""The type stubs tell an editor what each call returns: the array it wrote, of the caller's
type, or a Request with async_op=True (checked with mypy on a snippet)."""

import os
import site
import subprocess
import sys
import textwrap

import pytest

SNIPPET = textwrap.dedent(
    """
    import numpy as np
    import accord
    comm = accord.init()
    x = np.ones(3, np.float32)
    reveal_type(comm.allreduce(x))
    reveal_type(comm.allreduce(x, out=np.zeros(3, np.float64)))
    reveal_type(comm.allreduce(x, async_op=True))
    reveal_type(comm.broadcast(2.5))
    reveal_type(comm.gather(x, out=np.zeros(6, np.float32)))
    reveal_type(accord.allgather(x, np.zeros(6, np.float32), group=comm))
    reveal_type(comm.all_gather_object({"a": 1}))
    """
)


def test_stubs_type_the_results(tmp_path):
    pytest.importorskip("mypy", reason="mypy not installed (pip install mypy)")
    f = tmp_path / "snippet.py"
    f.write_text(SNIPPET)
    # mypy finds an installed accord (it ships py.typed) in this Python's site-packages by
    # itself, and refuses them on MYPYPATH; a copy elsewhere (PYTHONPATH) is pointed to.
    where = os.path.dirname(os.path.dirname(__import__("accord").__file__))
    env = dict(os.environ)
    if os.path.realpath(where) not in {os.path.realpath(d) for d in site.getsitepackages()}:
        env["MYPYPATH"] = where
    p = subprocess.run(
        [sys.executable, "-m", "mypy", "--no-incremental", "--ignore-missing-imports", str(f)],
        capture_output=True,
        text=True,
        timeout=300,
        env=env,
    )
    revealed = [line.split("Revealed type is ")[1].strip('"') for line in p.stdout.splitlines() if "Revealed type" in line]
    assert len(revealed) == 7, p.stdout + p.stderr
    assert "float32" in revealed[0] or "32Bit" in revealed[0], revealed[0]
    assert "float64" in revealed[1], revealed[1]
    assert revealed[2] == "accord.Request", revealed[2]
    assert revealed[3] in ("float", "builtins.float"), revealed[3]
    assert "None" in revealed[4] and "ndarray" in revealed[4], revealed[4]
    assert "ndarray" in revealed[5], revealed[5]
    assert revealed[6].startswith(("list", "builtins.list")), revealed[6]
