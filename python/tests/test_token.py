"""The job's token: the warning without one, token files, and the token the MPI bootstrap makes
(through a stand-in for an mpi4py communicator, so this runs without MPI). Each check runs in a
fresh interpreter, since the warning is printed once per process."""

import os
import subprocess
import sys
import textwrap

WARNING = "no job token"


def run_py(code, **env):
    clean = {k: v for k, v in os.environ.items() if not k.startswith("ACCORD_")}
    clean.update(env)
    cmd = [sys.executable, "-c", textwrap.dedent(code)]
    return subprocess.run(cmd, capture_output=True, text=True, timeout=60, env=clean, cwd="/")


ONE_RANK_TWICE = """
    import accord
    for _ in range(2):
        accord.init("tcp://127.0.0.1:0", rank=0, world_size=1, timeout=20).barrier()
        accord.destroy()
    print("OK")
"""


def test_init_without_a_token_warns_once():
    p = run_py(ONE_RANK_TWICE)
    assert p.returncode == 0 and "OK" in p.stdout, p.stderr
    assert p.stderr.count(WARNING) == 1, p.stderr
    assert "unauthenticated" in p.stderr and "ACCORD_TOKEN_FILE" in p.stderr, p.stderr

    p = run_py(ONE_RANK_TWICE, ACCORD_TOKEN="s3cret")
    assert p.returncode == 0 and "OK" in p.stdout, p.stderr
    assert WARNING not in p.stderr, p.stderr


def test_token_file_is_used_and_an_open_one_refused(tmp_path):
    f = tmp_path / "token"
    f.write_text("s3cret\n")
    f.chmod(0o600)
    p = run_py(ONE_RANK_TWICE, ACCORD_TOKEN_FILE=str(f))
    assert p.returncode == 0 and "OK" in p.stdout, p.stderr
    assert WARNING not in p.stderr, p.stderr

    f.chmod(0o644)
    p = run_py(
        """
        import accord
        try:
            accord.init("tcp://127.0.0.1:0", rank=0, world_size=1, timeout=20)
        except accord.InvalidArgumentError as e:
            print("REFUSED:", e)
        """,
        ACCORD_TOKEN_FILE=str(f),
    )
    assert "REFUSED:" in p.stdout, p.stdout + p.stderr
    assert "too open" in p.stdout and f"chmod 600 {f}" in p.stdout, p.stdout


def test_mpi_bootstrap_broadcasts_a_fresh_token():
    p = run_py(
        """
        import accord

        class OneRank:
            "What accord.init uses of an mpi4py communicator, for a world of one."
            def Get_rank(self):
                return 0
            def Get_size(self):
                return 1
            def bcast(self, obj, root=0):
                self.sent = obj
                return obj

        mpi = OneRank()
        accord.init(mpi_comm=mpi, timeout=20).barrier()
        address, token = mpi.sent
        assert len(token) == 64 and int(token, 16) >= 0, token
        try:
            accord.init_from_store(0, 1, address, "guess", timeout=5)
        except accord.UnauthorizedError:
            print("STRANGER-REFUSED")
        print("OK")
        """
    )
    assert p.returncode == 0 and "OK" in p.stdout, p.stdout + p.stderr
    assert "STRANGER-REFUSED" in p.stdout, p.stdout + p.stderr
    assert WARNING not in p.stderr, p.stderr
