"""Which way a slice travels through the shared-memory transport, and that every way is exact.

A slice the receiver copies in goes direct (the receiver reads the sender's buffer, one copy)
from 256 KiB; one it reduces goes through the sender's slots below 2 MiB. The schedule says which
(``receiver_copies``); the executor runs copies that no send reads after posting the sends.
"""

from __future__ import annotations

from types import SimpleNamespace

import numpy as np
import pytest

from hccl_py.algorithms.registry import get_schedule
from hccl_py.algorithms.schedule import receiver_copies
from hccl_py.executor import Engine
from tests.mp import run_ranks

MID = 300_000  # float32 elements: 1.2 MB per message, between the two thresholds


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
@pytest.mark.parametrize("algo", ["ring", "mesh"])
def test_copied_in_slices_go_direct(algo):
    results = run_ranks(_paths, 3, "allgather", algo, MID, timeout=50)
    for used, ok in results:
        assert ok
        assert used["direct"] > 0 and used["slot"] == 0, used


@pytest.mark.timeout(60)
@pytest.mark.usefixtures("no_leaks")
def test_reduced_slices_go_through_slots_copied_ones_direct():
    # Ring allreduce of 3 ranks: the reduce-scatter half's chunks are reduced, the allgather half's copied.
    results = run_ranks(_paths, 3, "allreduce", "ring", 3 * MID, timeout=50)
    for used, ok in results:
        assert ok
        assert used["direct"] > 0 and used["slot"] > 0, used


@pytest.mark.timeout(60)
@pytest.mark.usefixtures("no_leaks")
def test_in_place_allgather_input_inside_output():
    """The input is a view of this rank's block of ``out``: the own-block copy must not run
    after the sends (it would be a self-copy here, but IN and OUT share memory, so the executor
    keeps the schedule's order)."""
    for used, ok in run_ranks(_paths, 3, "allgather", "ring", MID, True, timeout=50):
        assert ok


def test_receiver_copies_follows_the_matching_receive():
    ring_ar = get_schedule("allreduce", "ring")
    # 3 ranks: two reduce-scatter sends (reduced), then two allgather sends (copied).
    assert receiver_copies(ring_ar, 0, 3, 30) == (False, False, True, True)
    assert receiver_copies(get_schedule("allgather", "ring"), 1, 4, 10) == (True, True, True)
    assert all(receiver_copies(get_schedule("broadcast", "tree"), 0, 8, 10))
    reduce_tree = get_schedule("reduce", "tree")
    assert not any(receiver_copies(reduce_tree, 7, 8, 10))


def test_plan_runs_copies_no_send_reads_after_the_sends():
    engine = Engine(SimpleNamespace(max_slice_bytes=lambda peer: 1 << 20))  # all _plan asks of a transport
    ag = get_schedule("allgather", "ring")(1, 3, 10, 0)
    plan = engine._plan(ag, (0, 1, 2), receiver_copies(get_schedule("allgather", "ring"), 1, 3, 10))
    assert plan[0].copies == () and len(plan[0].late_copies) == 1  # own block IN -> OUT; the send reads IN
    assert all(send[5] for step in plan for send in step.sends)  # every send's receiver copies it in
    rd = get_schedule("allreduce", "rd")(0, 2, 10, 0)
    rd_plan = engine._plan(rd, (0, 1), ())
    assert rd_plan[-1].copies and not rd_plan[-1].late_copies  # copy-only step: nothing to overlap
