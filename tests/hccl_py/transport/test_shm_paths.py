"""Which way a slice travels through the shared-memory transport, and that every way is exact.

A slice of 2 MiB or more goes direct (the receiver reads the sender's buffer, one copy); one of
64 KiB or less rides in the datagram itself; those between through the sender's slots. The
executor runs copies that no send reads after posting the sends, so a rank's own block is copied
while its peers read what it sent.
"""

from __future__ import annotations

import numpy as np
import pytest

from hccl_py.algorithms.registry import get_schedule
from hccl_py.engine.plan import plan_steps
from tests.mp import run_ranks

SMALL = 12_000  # float32 elements: 48 KB per message, inline (above the 16 KiB the bytes are gathered by sendmsg)
MID = 300_000  # 1.2 MB per message, through the slots
LARGE = 600_000  # 2.4 MB per message: read directly


def _paths(collective: str, algo: str, count: int, in_place_gather: bool = False) -> tuple[dict, bool]:
    import hccl_py

    comm = hccl_py.init()
    rank, size = comm.rank, comm.size
    rng = np.random.default_rng(7)
    inputs = [rng.integers(-1000, 1000, count).astype(np.float32) for _ in range(size)]
    transport = comm._engine.transport
    before = dict(transport.sent_by_path)
    if collective == "allgather":
        if in_place_gather:  # torch's all_gather_into_tensor idiom: the input is this rank's block of the output
            out = np.empty(size * count, np.float32)
            x = out[rank * count : (rank + 1) * count]
            x[:] = inputs[rank]
        else:
            x, out = inputs[rank].copy(), np.empty(size * count, np.float32)
        result = comm.all_gather(x, out=out, algo=algo).reshape(-1)
        ok = np.array_equal(result, np.concatenate(inputs))
    else:
        x = inputs[rank].copy()
        comm.all_reduce(x, algo=algo)
        ok = np.array_equal(x, np.sum(inputs, axis=0, dtype=np.float64).astype(np.float32))
    used = {k: v - before[k] for k, v in transport.sent_by_path.items()}
    comm.destroy()
    return used, ok


@pytest.mark.timeout(60)
@pytest.mark.usefixtures("no_leaks")
@pytest.mark.parametrize(
    "algo, count, path",
    [
        ("ring", MID, "slot"),  # one block to one peer per step
        ("mesh", MID, "shared"),  # one block to both peers: staged once, read by both
        ("ring", LARGE, "direct"),
        ("mesh", LARGE, "direct"),
        ("ring", SMALL, None),
        ("mesh", SMALL, None),  # inline: no slot, no ack
    ],
)
def test_slices_take_the_path_their_size_calls_for(algo, count, path):
    results = run_ranks(_paths, 3, "allgather", algo, count, timeout=50)
    for used, ok in results:
        assert ok
        assert (path is None or used[path] > 0) and all(n == 0 for p, n in used.items() if p != path), used


def _inline_bf16_and_full_queues() -> tuple[bool, bool]:
    import ml_dtypes

    import hccl_py

    comm = hccl_py.init()
    rank, size = comm.rank, comm.size
    # bfloat16 has no buffer format of its own: the gathered send goes through a byte view
    inputs = [(np.arange(20_000) % 61 + r).astype(ml_dtypes.bfloat16) for r in range(size)]  # 40 KB each
    x = inputs[rank].copy()
    comm.all_reduce(x, algo="ring")
    expected = np.sum(np.stack(inputs).astype(np.float32), axis=0)  # small integers: exact in bfloat16
    reduced_ok = np.array_equal(x.astype(np.float32), expected)
    # Rank 0 sends more 40 KB messages than rank 1's socket queue holds while rank 1 is not yet
    # receiving: the surplus waits in rank 0's outbox (whole datagrams) until rank 1 drains them.
    messages = [np.full(10_000, i, np.float32) for i in range(24)]
    if rank == 0:
        for m in messages:
            comm.send(m, 1)
        queued_ok = True
    else:
        import time

        time.sleep(0.3)
        got = [comm.recv(np.empty(10_000, np.float32), 0) for _ in messages]
        queued_ok = all(np.array_equal(g, m) for g, m in zip(got, messages))
    comm.destroy()
    return reduced_ok, queued_ok


@pytest.mark.timeout(60)
@pytest.mark.usefixtures("no_leaks")
def test_inline_slices_of_any_dtype_and_past_a_full_queue_arrive_whole():
    for reduced_ok, queued_ok in run_ranks(_inline_bf16_and_full_queues, 2, timeout=50):
        assert reduced_ok and queued_ok


@pytest.mark.timeout(60)
@pytest.mark.usefixtures("no_leaks")
def test_shared_slots_come_back_after_every_reader():
    """Many fan-out calls in a row: a shared slot is free again only once every reader has
    acknowledged it, so the sender never runs out (nor overwrites a slot still being read)."""
    for used, ok, leftover in run_ranks(_fanout_loop, 4, timeout=50):
        assert ok and used["shared"] > 0, used
        assert leftover == (0, [2, 2, 2]), leftover  # no shared slot still owed; every peer's 2 slots free


def _fanout_loop() -> tuple[dict, bool, tuple]:
    import hccl_py

    comm = hccl_py.init()
    transport = comm._engine.transport
    before = dict(transport.sent_by_path)
    ok = True
    for i in range(40):
        x = np.full(MID // 4, comm.rank * 1000 + i, np.float32)
        out = comm.all_gather(x, algo="mesh")
        ok &= all(np.all(out[r] == r * 1000 + i) for r in range(comm.size))
        y = np.full(MID // 4, i if comm.rank == i % comm.size else -1, np.float32)
        comm.broadcast(y, root=i % comm.size, algo="mesh")
        ok &= bool(np.all(y == i))
    used = {k: v - before[k] for k, v in transport.sent_by_path.items()}
    comm.barrier()  # every ack of the last call has arrived by now
    leftover = (len(transport._shared), [len(transport._free[p]) for p in sorted(transport._free)])
    comm.destroy()
    return used, ok, leftover


@pytest.mark.timeout(60)
@pytest.mark.usefixtures("no_leaks")
def test_in_place_allgather_input_inside_output():
    """The input is a view of this rank's block of ``out``: the own-block copy must not run
    after the sends (it would be a self-copy here, but IN and OUT share memory, so the executor
    keeps the schedule's order)."""
    for used, ok in run_ranks(_paths, 3, "allgather", "ring", LARGE, True, timeout=50):
        assert ok


def test_plan_runs_copies_no_send_reads_after_the_sends():
    slice_bytes = lambda peer: 1 << 20  # noqa: E731
    ag = get_schedule("allgather", "ring")(1, 3, 10, 0)
    plan = plan_steps(ag, (0, 1, 2), slice_bytes)
    assert plan[0].copies == () and len(plan[0].late_copies) == 1  # own block IN -> OUT; the send reads IN
    rd = get_schedule("allreduce", "rd")(0, 2, 10, 0)
    rd_plan = plan_steps(rd, (0, 1), slice_bytes)
    assert rd_plan[-1].copies and not rd_plan[-1].late_copies  # copy-only step: nothing to overlap
