"""Flight records, counters and dumps from Python, and `accord analyze` on a real desync."""

import glob
import json
import os
import subprocess
import sys


def test_flight_record_and_metrics(run_ranks, tmp_path):
    r = run_ranks(3, "worker_observe.py", extra_env={"ACCORD_FLIGHT_DIR": str(tmp_path)}, args=["record"])
    assert r.returncode == 0, r.stdout + r.stderr
    assert r.stdout.count("record ok") == 3, r.stdout
    files = sorted(glob.glob(str(tmp_path / "accord-flight-*-rank*.json")))
    assert len(files) == 3, files
    doc = json.load(open(files[0]))
    assert doc["format"] == "accord-flight/1" and doc["world_size"] == 3 and doc["reason"] == "request"


def test_desync_dumps_every_rank_and_analyze_names_it(run_ranks, tmp_path):
    r = run_ranks(4, "worker_observe.py", extra_env={"ACCORD_FLIGHT_DIR": str(tmp_path)}, args=["wrong-root"])
    assert r.returncode != 0, r.stdout + r.stderr
    files = glob.glob(str(tmp_path / "accord-flight-*-rank*.json"))
    assert len(files) == 4, (files, r.stderr)
    out = subprocess.run(
        [sys.executable, "-m", "accord", "analyze", str(tmp_path)], capture_output=True, text=True, timeout=60
    )
    assert out.returncode == 0, out.stderr
    verdict = [line for line in out.stdout.splitlines() if line.startswith("verdict:")]
    assert verdict == [
        "verdict: ranks disagree on host call #4 of world: ranks 0, 1, 2 called broadcast(f32 x 8, root 0); "
        "rank 3 called broadcast(f32 x 8, root 1)"
    ], out.stdout
    js = json.loads(
        subprocess.run(
            [sys.executable, "-m", "accord", "analyze", str(tmp_path), "--json"], capture_output=True, text=True, timeout=60
        ).stdout
    )
    assert js["missing"] == [] and js["communicators"][0]["host"]["desync"]["seq"] == 4, js
