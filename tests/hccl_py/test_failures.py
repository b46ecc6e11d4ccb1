"""Timeouts, mismatched calls, dead peers: a clear error on every rank involved, never a hang."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest

from tests.mp import run_plain, run_ranks, wait_for_file


def _skip_one(skipper: int, folder: str) -> dict:
    import hccl_py

    comm = hccl_py.init()
    x = np.ones(100, np.float32)
    comm.all_reduce(x)  # everyone takes part once
    if comm.rank == skipper:
        # Never calls the second all_reduce, and stays alive until every other rank has timed
        # out (an exited peer would be noticed as HcclRemoteError instead).
        for r in range(comm.size):
            if r != skipper:
                wait_for_file(Path(folder) / f"timed_out_{r}")
        return {"skipped": True}
    try:
        comm.all_reduce(x, algo="mesh")
    except hccl_py.HcclTimeoutError as err:
        (Path(folder) / f"timed_out_{comm.rank}").touch()
        found = {
            "class": type(err).__name__,
            "code": int(err.code),
            **{k: getattr(err, k) for k in ("rank", "op", "seq", "comm", "ranks")},
        }
        try:
            comm.all_reduce(x)
        except hccl_py.HcclError as again:
            return {**found, "after": type(again).__name__}
        return {**found, "after": "no error"}
    (Path(folder) / f"timed_out_{comm.rank}").touch()
    return {"error": None}


@pytest.mark.timeout(60)
def test_rank_that_skips_a_collective_times_out_the_others(tmp_path):
    results = run_ranks(_skip_one, 4, 2, str(tmp_path), env={"HCCL_EXEC_TIMEOUT": "1.5"}, timeout=50)
    assert results[2] == {"skipped": True}
    for rank in (0, 1, 3):
        r = results[rank]
        assert (r["class"], r["code"], r["rank"], r["op"], r["seq"], r["comm"]) == (
            "HcclTimeoutError",
            9,
            rank,
            "allreduce",
            2,
            "world",
        )
        # The skipper is named. (Mesh folds in rank order, so ranks 0 and 1 also list rank 3,
        # whose chunk arrived but waits behind rank 2's.)
        assert 2 in r["ranks"], r
        assert r["after"] == "HcclInternalError"  # the communicator was aborted


MISMATCHES = {
    "count": (lambda c: c.all_reduce(np.ones(100 if c.rank != 1 else 200, np.float32)), "count=200"),
    "dtype": (lambda c: c.all_reduce(np.ones(100, np.float32 if c.rank != 1 else np.float64)), "dtype=float64"),
    "op": (lambda c: c.all_reduce(np.ones(100, np.float32), op="max" if c.rank == 1 else "sum"), "op=max"),
    "root": (lambda c: c.broadcast(np.ones(100, np.float32), root=1 if c.rank == 1 else 0), "root=1"),
    "collective": (lambda c: (c.all_reduce if c.rank != 1 else c.broadcast)(np.ones(100, np.float32)), "broadcast("),
    # two two-level algorithms: told apart by a checksum of their levels and partition, not both "hier"
    "two-level": (
        lambda c: c.all_reduce(np.ones(100, np.float32), algo="hier:mesh/ring" if c.rank == 1 else "hier:ring/ring"),
        "algo=hier (two-level #",
    ),
}


def _mismatch(kind: str) -> dict:
    import hccl_py

    comm = hccl_py.init()
    call, _ = MISMATCHES[kind]
    try:
        call(comm)
        # A rank that only sends in the mismatched call (a broadcast root) has returned before a
        # receiver could object; it learns at its next call on the communicator.
        comm.barrier()
    except hccl_py.HcclError as err:
        return {
            "class": type(err).__name__,
            "code": int(err.code),
            "rank": err.rank,
            "comm": err.comm,
            "message": err.message,
            "error_id": err.error_id,
        }
    return {"class": None}


@pytest.mark.timeout(60)
@pytest.mark.parametrize("kind", sorted(MISMATCHES))
def test_mismatched_call_raises_param_error_naming_both_calls(kind):
    results = run_ranks(
        _mismatch, 3, kind, env={"HCCL_EXEC_TIMEOUT": "20", "HCCL_ALGO": "allreduce=ring/broadcast=ring"}, timeout=50
    )
    _, fragment = MISMATCHES[kind]
    for rank, r in enumerate(results):
        assert (r["class"], r["code"], r["rank"], r["comm"]) == ("HcclParamError", 1, rank, "world"), (rank, r)
        # The executor's mismatch error has no fields for the two calls yet: the message naming
        # both calls (and the part that differs) is what this checks.
        assert "call mismatch" in r["message"] and fragment in r["message"], (rank, r)
        assert r["error_id"] == "EI0005" and "CANN: EI0005" in r["message"], (rank, r)  # what Ascend's tooling greps


def _bad_reduce_scatter() -> dict:
    import hccl_py

    comm = hccl_py.init()
    y = np.arange(7, dtype=np.float32)
    try:
        comm.reduce_scatter(y)
    except hccl_py.HcclParamError as err:
        found = {k: getattr(err, k) for k in ("arg", "value", "rule", "expected", "op")}
    comm.all_reduce(y)  # rejected input left the communicator usable, and y untouched
    assert np.array_equal(y, 3 * np.arange(7, dtype=np.float32))
    return found


@pytest.mark.timeout(60)
def test_reduce_scatter_size_must_divide_by_the_world():
    for found in run_ranks(_bad_reduce_scatter, 3, timeout=50):
        assert found == {"arg": "y.size", "value": 7, "rule": "divisible", "expected": 3, "op": "reduce_scatter"}


PEER_DIES = """
import json, os, sys, time
import numpy as np
import hccl_py

comm = hccl_py.init()
comm.barrier()
if comm.rank == 1:
    time.sleep(0.3)
    os.kill(os.getpid(), 9)
start = time.monotonic()
try:
    comm.all_reduce(np.ones(10, np.float32), algo="mesh")
    print(json.dumps({"error": None}))
except hccl_py.HcclError as err:
    print(json.dumps({"class": type(err).__name__, "error": str(err), "peer": err.peer}))
"""


@pytest.mark.timeout(60)
def test_dead_peer_is_noticed_long_before_the_timeout(tmp_path):
    """Started without a launcher (rank 0 hosts the store), so the survivors live to report; the
    execution timeout (30 s) is longer than the test's, so only noticing the death passes."""
    script = tmp_path / "peer_dies.py"
    script.write_text(PEER_DIES)
    results = run_plain(script, 3, env={"HCCL_EXEC_TIMEOUT": "30"}, timeout=40)
    assert results[1].returncode == -9
    for rank in (0, 2):
        report = json.loads(results[rank].stdout.strip().splitlines()[-1])
        assert report["class"] == "HcclRemoteError", report
        assert report["peer"] == 1, report


RING_MEMBER_DIES = """
import json, os
import numpy as np
import hccl_py

comm = hccl_py.init()
x = np.ones(1000, np.float32)
try:
    for i in range(1000):
        if i == 5 and comm.rank == 3:
            os.kill(os.getpid(), 9)
        comm.all_reduce(x, algo="ring")
    print(json.dumps({"class": None}))
except hccl_py.HcclError as err:
    print(json.dumps({"class": type(err).__name__, "peer": err.peer}))
"""


@pytest.mark.timeout(90)
def test_every_rank_learns_which_rank_died_not_only_its_neighbour(tmp_path):
    """In a ring only rank 4 waits for rank 3; the others wait for a neighbour that is alive. The
    rank that notices tells every member, so all of them name rank 3 (HCCL_EXEC_TIMEOUT, 60 s,
    is beyond the test's bound: only that notice gets them out). benchmarks/failure_spread.py
    measures how fast it spreads."""
    script = tmp_path / "ring_member_dies.py"
    script.write_text(RING_MEMBER_DIES)
    results = run_plain(script, 6, env={"HCCL_EXEC_TIMEOUT": "60"}, timeout=80)
    assert results[3].returncode == -9
    for rank in (0, 1, 2, 4, 5):
        report = json.loads(results[rank].stdout.strip().splitlines()[-1])
        assert report == {"class": "HcclRemoteError", "peer": 3}, (rank, report, results[rank].stderr[-2000:])
