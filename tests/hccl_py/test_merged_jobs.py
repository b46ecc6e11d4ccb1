"""Issue 27 item 6: two jobs started by hand on one MASTER_PORT never compute with each other's
data. Each job has 2 ranks started as torchrun starts them (RANK, WORLD_SIZE, MASTER_ADDR,
MASTER_PORT; no launcher id); the jobs' values differ, so a rank that met a stranger would sum
to a value that is neither job's. Every rank either fails with HcclConnectError or returns its
own job's sum."""

from __future__ import annotations

import json
import os
import socket
import subprocess
import sys
import time
from pathlib import Path

import pytest

from hccl_py.rendezvous.store import StoreClient, store_address
from tests.mp import LIVENESS_S, free_port, wait_until

ROOT = Path(__file__).resolve().parents[2]
RANK_TIMEOUT_S = 60  # a rank still running then is killed (and the test fails on its -9)

# Imports first, then waits for the test's "go" before init: every process of both jobs exists
# (as it would when both jobs are started at once) while the test chooses who reaches the port first.
RANK_SCRIPT = """
import json, os, sys
import numpy as np
import hccl_py
sys.stdin.readline()
base = float(os.environ["JOB_BASE"])
try:
    comm = hccl_py.init()
    x = np.full(8, base * (comm.rank + 1), np.float32)
    comm.all_reduce(x)
    comm.destroy()
except hccl_py.HcclError as err:
    print(json.dumps({"class": type(err).__name__, "state": err.state, "members": getattr(err, "members", None),
                      "rivals": getattr(err, "rivals", None), "holder": err.holder, "message": err.message}), flush=True)
    sys.exit(3)
print(json.dumps({"sum": float(x[0])}), flush=True)
"""
BASES = {"A": 1.0, "B": 10.0}  # job A sums to 3, job B to 30; a merged pair to 21 or 12
SUMS = {"A": 3.0, "B": 30.0}


def _env(job: str, rank: int, port: int) -> dict[str, str]:
    base = {
        k: v
        for k, v in os.environ.items()
        if not k.startswith(("HCCL_", "PMI_", "OMPI_", "SLURM_", "TORCHELASTIC_"))
        and k not in ("RANK", "WORLD_SIZE", "RANK_ID", "RANK_SIZE", "LOCAL_RANK", "LOCAL_WORLD_SIZE")
    }
    return {
        **base,
        "HCCL_PY_RUN_DIR": os.environ["HCCL_PY_RUN_DIR"],
        "RANK": str(rank),
        "WORLD_SIZE": "2",
        "MASTER_ADDR": "127.0.0.1",
        "MASTER_PORT": str(port),
        "HCCL_CONNECT_TIMEOUT": "30",
        "JOB_BASE": str(BASES[job]),
        "PYTHONPATH": str(ROOT),
    }


class Jobs:
    """Both jobs' four processes, started at once, each waiting for :meth:`go`."""

    def __init__(self, port: int):
        self.port = port
        self.procs = {
            (job, rank): subprocess.Popen(
                [sys.executable, "-c", RANK_SCRIPT],
                env=_env(job, rank, port),
                text=True,
                stdin=subprocess.PIPE,
                stdout=subprocess.PIPE,
                stderr=subprocess.PIPE,
            )
            for job in "AB"
            for rank in range(2)
        }

    def pid(self, job: str, rank: int) -> int:
        return self.procs[(job, rank)].pid

    def go(self, *who: tuple[str, int]) -> None:
        for key in who:
            self.procs[key].stdin.write("go\n")
            self.procs[key].stdin.flush()

    def outcomes(self) -> dict[tuple[str, int], tuple[int, dict, str]]:
        """(exit code, the rank's JSON line, stderr) of each process, once all ended."""
        deadline = time.monotonic() + RANK_TIMEOUT_S
        found = {}
        for key, proc in self.procs.items():
            try:
                out, err = proc.communicate(timeout=max(deadline - time.monotonic(), 0.1))
            except subprocess.TimeoutExpired:
                proc.kill()
                out, err = proc.communicate()
            lines = [line for line in out.splitlines() if line.startswith("{")]
            found[key] = (proc.returncode, json.loads(lines[-1]) if lines else {}, err)
        return found

    def close(self) -> None:
        for proc in self.procs.values():
            if proc.poll() is None:
                proc.kill()
            proc.communicate()


def _listening(port: int) -> bool:
    with socket.socket() as s:
        return s.connect_ex(("127.0.0.1", port)) == 0


def _claimed_by(port: int, rank: int) -> int | None:
    """The pid that holds ``rank``'s slot in the store at ``port`` (None before anyone claims it)."""
    with StoreClient(store_address("127.0.0.1", port), timeout_s=LIVENESS_S) as client:
        key = f"{client.job_id()}/g1/rank/{rank}"
        return json.loads(client.get(key, LIVENESS_S))["pid"] if client.check([key])[0] else None


def _describe(outcomes: dict, jobs: Jobs) -> str:
    """Every process's outcome, for a failing assertion's message."""
    return "\n".join(
        f"job {job} rank {rank} pid {jobs.pid(job, rank)}: exit {code}, {line}, stderr: {err[-600:]!r}"
        for (job, rank), (code, line, err) in outcomes.items()
    )


def _assert_safe(outcomes: dict) -> None:
    """No rank exits 0 with a value that is not its own job's; a rank that fails says why."""
    for (job, rank), (code, line, err) in outcomes.items():
        assert code in (0, 3), f"job {job} rank {rank} exited {code}: {err[-2000:]}"
        if code == 0:
            assert line == {"sum": SUMS[job]}, f"job {job} rank {rank} computed with a stranger: {line}; {outcomes}"
        else:
            assert line["class"] == "HcclConnectError", (job, rank, line, err[-2000:])


@pytest.mark.timeout(120)
@pytest.mark.usefixtures("no_leaks")
def test_ranks_of_two_jobs_that_met_halfway_fail_naming_both_jobs():
    # The merge made deterministic: job A's rank 0 hosts the store, job B's rank 1 takes rank 1,
    # then A's rank 1 and B's rank 0 come (all four were started together).
    jobs = Jobs(free_port())
    try:
        jobs.go(("A", 0))
        wait_until(lambda: _listening(jobs.port), "job A's rank 0 hosts the store")
        jobs.go(("B", 1))
        assert wait_until(lambda: _claimed_by(jobs.port, 1), "job B's rank 1 claims rank 1") == jobs.pid("B", 1)
        jobs.go(("A", 1), ("B", 0))
        outcomes = jobs.outcomes()
    finally:
        jobs.close()
    seen = _describe(outcomes, jobs)
    _assert_safe(outcomes)
    met = [jobs.pid("A", 0), jobs.pid("B", 1)]
    strangers = {jobs.pid("A", 1), jobs.pid("B", 0)}
    for key in (("A", 0), ("B", 1)):  # the two that met: the same error, naming both jobs' processes
        code, line, _ = outcomes[key]
        assert (code, line.get("state")) == (3, "merged"), seen
        assert [m["pid"] for m in line["members"]] == met, seen
        assert {r["pid"] for r in line["rivals"]} <= strangers, seen
        assert line["rivals"] or "Recorded" in line["message"], seen
        assert all(str(pid) in line["message"] for pid in met), seen
        assert any(str(pid) in line["message"] for pid in strangers), seen
        assert "MASTER_PORT" in line["message"] and "HCCL_PY_JOB_ID" in line["message"], seen
    assert (outcomes[("A", 1)][1].get("holder") or {}).get("pid") == jobs.pid("B", 1), seen  # found its slot taken
    assert "cannot bind" in outcomes[("B", 0)][1].get("message", ""), seen  # the second rank 0 found the port taken


@pytest.mark.timeout(200)
@pytest.mark.usefixtures("no_leaks")
@pytest.mark.parametrize("trial", range(3))
def test_two_jobs_started_at_once_on_one_port_never_compute_together(trial):
    jobs = Jobs(free_port())
    try:
        jobs.go(*jobs.procs)
        outcomes = jobs.outcomes()
    finally:
        jobs.close()
    _assert_safe(outcomes)


@pytest.mark.timeout(90)
@pytest.mark.usefixtures("no_leaks")
def test_processes_started_for_the_port_that_end_without_joining_are_no_rivals():
    # Job B's processes end without ever calling init (they would be rivals if they stayed), and
    # job A runs twice on the same port: it computes each time.
    port = free_port()
    for _ in range(2):
        jobs = Jobs(port)
        try:
            jobs.go(("A", 0), ("A", 1))
            for key in (("B", 0), ("B", 1)):  # job B never starts its ranks here: stop them first
                jobs.procs[key].kill()
                jobs.procs[key].communicate()
            outcomes = {k: v for k, v in jobs.outcomes().items() if k[0] == "A"}
        finally:
            jobs.close()
        assert {k: (code, line) for k, (code, line, _) in outcomes.items()} == {
            ("A", 0): (0, {"sum": 3.0}),
            ("A", 1): (0, {"sum": 3.0}),
        }
