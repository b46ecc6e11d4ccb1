"""hccl-launch's root-cause report from the ranks' flight recorders, on the failure examples."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
EXAMPLES = ROOT / "examples" / "failures"

pytestmark = pytest.mark.usefixtures("no_leaks")


def _launch(*args: str, env: dict | None = None, timeout: float = 60) -> subprocess.CompletedProcess[str]:
    full_env = {**os.environ, "PYTHONPATH": str(ROOT), **(env or {})}
    return subprocess.run(
        [sys.executable, "-m", "launch.cli", *args],
        env=full_env,
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=timeout,
    )


@pytest.mark.timeout(90)
def test_hang_report_names_the_rank_that_never_entered(tmp_path):
    # A long grace: every rank stopped by the launcher has time to dump its flight recorder.
    # Which waiting ranks hit the timeout themselves before being stopped, and how long they
    # waited in wall time, depends on the machine's load: the checks below do not.
    done = _launch(
        "-n",
        "4",
        "--grace",
        "30",
        "--log-dir",
        str(tmp_path),
        str(EXAMPLES / "hang.py"),
        env={"HCCL_EXEC_TIMEOUT": "2"},
    )
    assert done.returncode == 1
    assert "world: rank 2 never entered allreduce #3 (its last call: allreduce #2, completed)" in done.stderr
    found = json.loads((tmp_path / "diagnosis.json").read_text())
    [world] = found["communicators"]
    assert world["never_entered"] == [{"rank": 2, "last": "allreduce #2, completed"}]
    assert sorted(w["rank"] for w in world["waiting"]) == [0, 1, 3]
    assert any(w["state"] == "failed" and w["error"].startswith("HcclTimeoutError") for w in world["waiting"])
    assert found["first_failure"]["op"] == "allreduce" and found["first_failure"]["seq"] == 3
    assert sorted(p.name for p in (tmp_path / "flight").iterdir()) == [f"flight_rank{r}.json" for r in range(4)]


@pytest.mark.timeout(90)
def test_injected_hang_and_crash_are_diagnosed():
    # The hang is armed on the second call, so that every rank has finished one call together
    # first: on the first, a rank descheduled for longer than the timeout on a busy machine could
    # be stopped before it ever reached the call that hangs (and its report would say so).
    hang = _launch(
        "-n",
        "3",
        "--grace",
        "30",
        "--fault",
        "rank=1,op=allgather,seq=2,action=hang",
        str(ROOT / "examples" / "allreduce.py"),
        env={"HCCL_EXEC_TIMEOUT": "1.5"},
    )
    assert hang.returncode == 1, hang.stderr
    assert "rank 1: injected hang (rank=1,op=allgather,seq=2,action=hang) in allgather #2" in hang.stderr, hang.stderr
    crash = _launch("-n", "3", "--fault", "rank=2,action=crash,at=allgather#2", str(ROOT / "examples" / "allreduce.py"))
    assert crash.returncode == 1, crash.stderr
    assert "rank       : 2" in crash.stderr, crash.stderr  # the root cause is the crashed rank
    assert "rank 2: injected crash (rank=2,action=crash,at=allgather#2) entering allgather #2" in crash.stderr, (
        crash.stderr
    )


_FOUND_TOGETHER = """
import os, signal, time
import numpy as np
import hccl_py

comm = hccl_py.init()
pids = [int(p) for p in comm.all_gather(np.array([os.getpid()], np.int64)).ravel()]
launcher = os.getppid()
if comm.rank == 2:
    os.kill(launcher, signal.SIGSTOP)  # the launcher is off the CPU from here (a busy machine)
try:
    comm.all_gather(np.zeros(1, np.int64))  # rank 2 crashes entering it; rank 0 fails on its death
except hccl_py.HcclError:
    if comm.rank == 0:
        raise
    def dead(pid):  # exited: a zombie until the launcher reaps it
        try:
            return open(f"/proc/{pid}/stat").read().rsplit(")", 1)[1].split()[0] in "ZX"
        except FileNotFoundError:
            return True
    while not (dead(pids[0]) and dead(pids[2])):
        time.sleep(0.01)
    os.kill(launcher, signal.SIGCONT)  # it now finds ranks 0 and 2 gone at one look
"""


@pytest.mark.timeout(90)
def test_the_root_cause_is_the_rank_that_failed_first_when_the_launcher_finds_several_at_once(tmp_path):
    """Rank 2 crashes, rank 0 fails on its death, and the launcher, stopped meanwhile, finds both
    exited at one look: the report blames rank 2, by the ranks' flight records, not rank order."""
    script = tmp_path / "found_together.py"
    script.write_text(_FOUND_TOGETHER)
    done = _launch("-n", "3", "--fault", "rank=2,action=crash,at=allgather#2", str(script))
    assert done.returncode == 1, done.stderr
    assert "rank       : 2" in done.stderr, done.stderr
    assert "rank 0    pid" in done.stderr and "failed on its own too" in done.stderr


@pytest.mark.timeout(60)
def test_malformed_fault_is_rejected_before_any_rank_starts():
    done = _launch("-n", "2", "--fault", "rank=5,action=drop", str(ROOT / "examples" / "allreduce.py"))
    assert done.returncode == 2
    assert "rank 5 is not in this job (ranks 0..1)" in done.stderr
    assert "[0]" not in done.stdout


@pytest.mark.timeout(90)
def test_straggler_and_uneven_shard_examples_report_the_waiting():
    slow = _launch("-n", "4", "--fault", "rank=1,action=slow,factor=1.8", str(EXAMPLES / "straggler.py"))
    assert slow.returncode == 0, slow.stderr
    assert "<- slow card x1.8" in slow.stdout and "rank 1 (" in slow.stdout
    assert "of the throughput lost to waiting" in slow.stdout
    uneven = _launch("-n", "4", str(EXAMPLES / "uneven_shards.py"))
    even = _launch("-n", "4", str(EXAMPLES / "uneven_shards.py"), "--balanced")
    share = lambda out: float(out.rsplit("waiting is ", 1)[1].split("%")[0])  # noqa: E731
    assert share(uneven.stdout) > 20 and share(even.stdout) == 0


@pytest.mark.timeout(90)
def test_connect_timeout_example_names_the_late_rank():
    # Ranks 0 and 1 start one after the other, and their HCCL_CONNECT_TIMEOUT counts from their
    # own init(): it must cover how far apart they start on a loaded machine (10 s does),
    # or rank 0 names rank 1 too. Rank 2 sleeps the timeout + 3 s: it is stopped long before.
    done = _launch(
        "-n", "3", str(EXAMPLES / "connect_timeout.py"), env={"HCCL_CONNECT_TIMEOUT": "10", "RANK_LATE": "2"}
    )
    assert done.returncode == 1
    assert "rank(s) [2] of 3 did not join within 10 s (HCCL_CONNECT_TIMEOUT; CANN: EI0006" in done.stdout
