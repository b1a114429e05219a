import os
import subprocess
import sys

import pytest

HERE = os.path.dirname(os.path.abspath(__file__))


def launch(n, script, timeout=180, extra_env=None, args=()):
    """`python -m accord run -n N python script args...`, bounded; returns the CompletedProcess."""
    env = dict(os.environ, ACCORD_TIMEOUT="60", **(extra_env or {}))
    cmd = [sys.executable, "-m", "accord", "run", "-n", str(n), sys.executable, os.path.join(HERE, script), *args]
    return subprocess.run(cmd, capture_output=True, text=True, timeout=timeout, env=env, cwd="/")


@pytest.fixture
def run_ranks():
    return launch
