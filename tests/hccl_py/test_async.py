"""Asynchronous calls (``async_op=True``): real progress while the caller does something else,
several calls in flight on several communicators, errors at ``wait()``, and modeled time on a
compute stream and communication streams."""

from __future__ import annotations

import json
import math
import os

import numpy as np
import pytest

from tests.mp import LIVENESS_S, run_plain, run_ranks, wait_for_file


def _progress_without_wait(folder: str) -> dict:
    """Rank 0 issues an asynchronous allreduce and then waits for files the others write once
    their *blocking* allreduce has returned: only real progress on rank 0's side lets them."""
    import hccl_py

    comm = hccl_py.init()
    x = np.full(1 << 18, comm.rank + 1, np.float32)  # 1 MiB: many slices through the slots
    if comm.rank == 0:
        work = comm.all_reduce(x, async_op=True)
        for r in range(1, comm.size):
            wait_for_file(os.path.join(folder, f"done{r}"), within=LIVENESS_S * 3)
        completed_before_wait = work.is_completed()
        work.wait()
        return {"completed_before_wait": completed_before_wait, "value": float(x[0])}
    comm.all_reduce(x)
    open(os.path.join(folder, f"done{comm.rank}"), "w").close()
    return {"value": float(x[0])}


@pytest.mark.timeout(90)
@pytest.mark.usefixtures("no_leaks")
def test_an_asynchronous_call_moves_data_while_the_caller_does_something_else(tmp_path):
    results = run_ranks(_progress_without_wait, 3, str(tmp_path), timeout=80)
    assert results[0]["completed_before_wait"] is True
    assert [r["value"] for r in results] == [6.0, 6.0, 6.0]


def _many_in_flight() -> dict:
    import hccl_py

    comm = hccl_py.init()
    n, r = comm.size, comm.rank
    odd = comm.split(color=r % 2, key=r)
    pair = comm.create_group([0, 1])
    works = []
    # Different communicators in different orders on different ranks: they progress concurrently.
    if r == 0:
        works.append(("pair", pair.all_reduce(np.full(64, 2.0), async_op=True)))
        works.append(("world", comm.all_reduce(np.full(64, 1.0), async_op=True)))
    elif r == 1:
        works.append(("world", comm.all_reduce(np.full(64, 1.0), async_op=True)))
        works.append(("pair", pair.all_reduce(np.full(64, 2.0), async_op=True)))
    else:
        works.append(("world", comm.all_reduce(np.full(64, 1.0), async_op=True)))
    works.append(("odd", odd.all_gather(np.full(3, r, np.int32), async_op=True)))
    # Calls of one communicator complete in issue order; mixed operations and sizes.
    series = [comm.all_reduce(np.full(1000, float(i)), async_op=True) for i in range(6)]
    a2a = comm.all_to_all(np.arange(n * 4, dtype=np.int64).reshape(n, 4) + 100 * r, async_op=True)
    done = {name: w.wait() for name, w in works}
    finished_in_order = []
    for i, w in enumerate(series):
        finished_in_order.append(all(s.is_completed() for s in series[:i]) or not w.is_completed())
        assert np.all(w.wait() == i * n)
    got = a2a.wait()
    return {
        "world": float(done["world"][0]),
        "pair": float(done["pair"][0]) if "pair" in done else None,
        "odd": done["odd"][:, 0].tolist(),
        "ordered": all(finished_in_order),
        "a2a": got[:, 0].tolist(),
        "exception": [w.exception() for _, w in works],
    }


@pytest.mark.timeout(90)
def test_calls_on_several_communicators_progress_concurrently_and_in_order_per_communicator():
    results = run_ranks(_many_in_flight, 3, timeout=80)
    for r, res in enumerate(results):
        assert res["world"] == 3.0 and res["ordered"]
        assert res["pair"] == (4.0 if r < 2 else None)
        assert res["odd"] == ([0, 2] if r % 2 == 0 else [1])
        assert res["a2a"] == [r * 4 + 100 * i for i in range(3)]
        assert res["exception"] == [None] * len(res["exception"])


def _errors_at_wait(folder: str) -> dict:
    import hccl_py

    comm = hccl_py.init()
    if comm.rank == 1:  # never joins the second call; stays until rank 0 has its error
        comm.barrier()
        wait_for_file(os.path.join(folder, "seen"), within=LIVENESS_S * 6)
        return {}
    comm.barrier()
    work = comm.all_reduce(np.ones(8, np.float32), async_op=True)
    early = None
    try:
        work.wait(timeout=0.05)
    except hccl_py.HcclTimeoutError as err:
        early = err.timeout_s  # wait's own bound: the call goes on
    try:
        work.wait()
        got = None
    except hccl_py.HcclTimeoutError as err:
        got = {
            "class": type(err).__name__,
            "code": int(err.code),
            "op": err.op,
            "seq": err.seq,
            "ranks": err.ranks,
            "same": work.exception() is err,
            "completed": work.is_completed(),
        }
    try:
        comm.all_reduce(np.ones(8, np.float32))
        after = None
    except hccl_py.HcclInternalError as err:
        after = err.state
    open(os.path.join(folder, "seen"), "w").close()
    return {"early": early, "error": got, "after": after}


@pytest.mark.timeout(90)
def test_a_timeout_surfaces_at_wait_with_the_blocking_calls_fields(tmp_path):
    results = run_ranks(_errors_at_wait, 2, str(tmp_path), env={"HCCL_EXEC_TIMEOUT": "2"}, timeout=80)
    assert results[0]["early"] == 0.05
    assert results[0]["error"] == {
        "class": "HcclTimeoutError",
        "code": 9,
        "op": "allreduce",
        "seq": 2,
        "ranks": [1],
        "same": True,
        "completed": True,
    }
    assert results[0]["after"] == "aborted"


def _overlap(overlap: bool) -> dict:
    """An allreduce and an independent matmul-sized kernel: overlapped, the clock ends at the
    later of the two streams; in sequence, at their sum."""
    import hccl_py

    comm = hccl_py.init()
    x = np.ones(1 << 20, np.float32)
    comm.barrier()
    start = comm.clock
    if overlap:
        work = comm.all_reduce(x, algo="ring", async_op=True)
        comm.device.run(flops=2e10, nbytes=0)
        compute_end = comm.clock
        work.wait()
        comm_end = work.end_clock
    else:
        comm.all_reduce(x, algo="ring")
        comm_end = comm.clock
        comm.device.run(flops=2e10, nbytes=0)
        compute_end = comm.clock
    return {
        "start": start,
        "comm_end": comm_end,
        "compute_end": compute_end,
        "end": comm.clock,
        "exposed": comm.device.time.exposed_s,
    }


@pytest.mark.timeout(90)
def test_overlapped_modeled_time_is_the_later_stream_and_deterministic():
    env = {"HCCL_PY_TOPOLOGY": "ascend910b-8p"}
    together = run_ranks(_overlap, 2, True, env=env, timeout=80)
    again = run_ranks(_overlap, 2, True, env=env, timeout=80)
    apart = run_ranks(_overlap, 2, False, env=env, timeout=80)
    assert together == again  # the same program and topology: the same modeled clocks
    for t, a in zip(together, apart):
        comm_s = a["comm_end"] - a["start"]
        compute_s = a["compute_end"] - a["comm_end"]
        assert math.isclose(t["comm_end"] - t["start"], comm_s, rel_tol=1e-12)  # the communication stream took as long
        assert math.isclose(t["compute_end"] - t["start"], compute_s, rel_tol=1e-12)  # and compute did not wait for it
        assert t["end"] == max(t["comm_end"], t["compute_end"]) < a["end"]
        assert t["exposed"] == max(0.0, t["comm_end"] - t["compute_end"])


def _blocking_behind_async(rounds: int) -> list:
    """An asynchronous allreduce, then a blocking allgather, then the wait: the allgather queues
    behind the allreduce when that is still moving data (wall time decides), else runs at once."""
    import hccl_py

    comm = hccl_py.init()
    x, y = np.ones(1 << 16, np.float32), np.ones(1 << 14, np.float32)
    seen = []
    for _ in range(rounds):
        issued, exposed = comm.clock, comm.device.time.exposed_s
        work = comm.all_reduce(x, async_op=True)
        comm.all_gather(y)  # waits for the allreduce on its stream: the compute stream stands still
        work.wait()  # nothing left to expose
        seen.append((comm.device.time.exposed_s - exposed, work.end_clock - issued, comm.clock))
    return seen


@pytest.mark.timeout(90)
def test_a_blocking_call_queued_behind_an_asynchronous_one_is_not_exposed_communication():
    """Whether a blocking call queues behind an asynchronous one or runs at once depends on wall
    time; its modeled time is the same either way, and so is the exposure: the wait for the
    asynchronous call before it on its stream, never the blocking call itself. The whole queued
    call was counted as exposed, the same call run at once not at all, so hccl-launch's
    ``exposed ms`` changed from run to run."""
    env = {"HCCL_PY_TOPOLOGY": "ascend910b-8p"}
    first = run_ranks(_blocking_behind_async, 2, 20, env=env, timeout=40)
    again = run_ranks(_blocking_behind_async, 2, 20, env=env, timeout=40)
    assert first == again
    # (differences of running sums: equal up to rounding)
    assert all(
        allreduce_s > 0 and math.isclose(exposed, allreduce_s, rel_tol=1e-9)
        for rank in first
        for exposed, allreduce_s, _ in rank
    )


def _traced(folder: str) -> None:
    import hccl_py

    os.environ["HCCL_PY_TRACE_DIR"] = folder
    comm = hccl_py.init()
    work = comm.all_reduce(np.ones(1 << 16, np.float32), async_op=True)
    comm.device.matmul(np.ones((64, 64), np.float32), np.ones((64, 64), np.float32))
    work.wait()
    comm.destroy()


@pytest.mark.timeout(60)
def test_the_trace_shows_the_compute_and_the_communication_stream(tmp_path):
    run_ranks(_traced, 2, str(tmp_path), timeout=50)
    events = json.loads((tmp_path / "rank_0.trace.json").read_text())["traceEvents"]
    spans = {e["tid"]: e for e in events if e["ph"] == "X" and e["tid"] in (0, 2)}
    comm, compute = spans[0], spans[2]
    assert comm["name"] == "allreduce #1" and compute["name"] == "matmul"
    assert compute["ts"] < comm["ts"] + comm["dur"] and comm["ts"] < compute["ts"] + compute["dur"]  # they overlap


def _p2p_any_order() -> list:
    import hccl_py

    comm = hccl_py.init()
    n, r = comm.size, comm.rank
    right, left = (r + 1) % n, (r - 1) % n
    big = np.full(3 << 20, r, np.float32)  # 12 MiB: sends wait for the receiver to drain them
    got = np.empty_like(big)
    works = [comm.send(big, right, async_op=True), comm.recv(got, left, async_op=True)]
    for w in works:
        w.wait()
    batch_in = np.empty(1 << 20, np.float32)
    comm.batch_send_recv([("send", np.full(1 << 20, 10 + r, np.float32), right), ("recv", batch_in, left)])
    w = comm.batch_send_recv(
        [("recv", batch_in, left), ("send", np.full(1 << 20, 20 + r, np.float32), right)], async_op=True
    )
    second = float(w.wait()[0][0])
    return [float(got[0]), float(got[-1]), second]


@pytest.mark.timeout(120)
def test_sends_and_receives_in_any_order_never_deadlock():
    """Every rank sends a large message to its right and receives from its left, sends first:
    as separate asynchronous calls (one queue per peer and direction) and as batches."""
    results = run_ranks(_p2p_any_order, 3, timeout=110)
    for r, res in enumerate(results):
        left = (r - 1) % 3
        assert res == [left, left, 20 + left]


def _every_operation_async() -> dict:
    """Each operation blocking and with ``async_op=True`` on equal inputs: the same results, and
    the handle's contract (is_completed after wait, exception None)."""
    import hccl_py

    comm = hccl_py.init()
    n, r = comm.size, comm.rank

    def inputs():
        return {
            "broadcast": lambda c, **k: c.broadcast(np.arange(5.0) + r, root=1, **k),
            "reduce": lambda c, **k: c.reduce(np.arange(5.0) * (r + 1), root=2, op="max", **k),
            "reduce_scatter": lambda c, **k: c.reduce_scatter(np.arange(3.0 * n) + r, out=np.empty(3), **k),
            "scatter": lambda c, **k: c.scatter(
                np.arange(2.0 * n).reshape(n, 2) if r == 0 else None, root=0, out=np.empty(2), **k
            ),
            "gather": lambda c, **k: c.gather(np.full(2, float(r)), root=1, **k),
            "barrier": lambda c, **k: c.barrier(**k),
            "all_to_all_vc": lambda c, **k: _vc(c, **k),
        }

    def _vc(c, **k):
        counts = [[(i + j) % 3 for j in range(n)] for i in range(n)]  # counts[i][j]: i sends to j
        send = np.arange(sum(counts[r]), dtype=np.int32) + 100 * r
        recv = np.full(sum(counts[i][r] for i in range(n)), -1, np.int32)
        out = c.all_to_all_vc(send, counts, recv, **k)
        return recv if out is None else out

    def value(res):
        return None if res is None else np.asarray(res).tolist()

    got = {}
    for name, call in inputs().items():
        blocking = value(call(comm))
        work = call(comm, async_op=True)
        result = work.wait()
        got[name] = {"same": value(result) == blocking, "completed": work.is_completed(), "exception": work.exception()}
    return got


@pytest.mark.timeout(90)
def test_every_operation_gives_its_blocking_result_asynchronously():
    results = run_ranks(_every_operation_async, 3, timeout=80)
    for rank, res in enumerate(results):
        for name, got in res.items():
            assert got == {"same": True, "completed": True, "exception": None}, (rank, name, got)


DEAD_PEER_AT_WAIT = """
import json, os
import numpy as np
import hccl_py

comm = hccl_py.init()
comm.barrier()
if comm.rank == 2:
    os.kill(os.getpid(), 9)
work = comm.all_reduce(np.ones(16, np.float32), async_op=True)
try:
    work.wait()
    print(json.dumps({"class": None}))
except hccl_py.HcclError as err:
    print(json.dumps({"class": type(err).__name__, "peer": err.peer, "op": err.op, "same": work.exception() is err}))
"""


@pytest.mark.timeout(90)
def test_a_dead_peer_surfaces_at_wait_naming_it(tmp_path):
    """Started without a launcher, so the survivors live to report; HCCL_EXEC_TIMEOUT is beyond
    the test's bound: only noticing rank 2's death passes."""
    script = tmp_path / "dead_peer_at_wait.py"
    script.write_text(DEAD_PEER_AT_WAIT)
    results = run_plain(script, 3, env={"HCCL_EXEC_TIMEOUT": "60"}, timeout=80)
    assert results[2].returncode == -9
    for rank in (0, 1):
        report = json.loads(results[rank].stdout.strip().splitlines()[-1])
        assert report == {"class": "HcclRemoteError", "peer": 2, "op": "allreduce", "same": True}, (rank, report)
