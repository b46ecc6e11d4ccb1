"""All-to-all with counts per pair: bad counts, displacements and matrices are HcclParamError on
every rank involved, before any byte of data moves, naming the ranks and the values."""

from __future__ import annotations

import numpy as np
import pytest

from tests.mp import run_ranks

BAD_LAYOUTS = {
    "negative count": (lambda r, n: ([-1] + [1] * (n - 1), None), {"arg": "send_counts", "rule": "range"}),
    "too few counts": (lambda r, n: ([1] * (n - 1), None), {"arg": "send_counts", "rule": "length"}),
    "past the buffer": (lambda r, n: ([1] * n, [0] * (n - 1) + [99]), {"arg": "send_displs", "rule": "range"}),
    "overlapping blocks": (
        lambda r, n: ([2] * n, [0, 1] + [2 * j for j in range(2, n)]),
        {"arg": "send_displs", "rule": "overlap"},
    ),
}


def _bad_layout(name: str) -> dict:
    import hccl_py

    comm = hccl_py.init()
    n = comm.size
    send = np.arange(2 * n, dtype=np.float32)
    recv = np.full(2 * n, -7, np.float32)
    counts, displs = ([1] * n, None)
    if comm.rank == 1:
        counts, displs = BAD_LAYOUTS[name][0](comm.rank, n)
    try:
        comm.all_to_all_v(send, counts, displs, recv, [1] * n, None)
        outcome = None
    except hccl_py.HcclParamError as err:
        outcome = {"code": int(err.code), "arg": err.arg, "rule": err.rule, "ranks": err.ranks}
    return {"outcome": outcome, "recv_untouched": bool(np.all(recv == -7))}


@pytest.mark.timeout(60)
@pytest.mark.parametrize("name", sorted(BAD_LAYOUTS))
def test_a_bad_layout_fails_on_every_rank_before_data_moves(name):
    results = run_ranks(_bad_layout, 3, name, timeout=50)
    facts = BAD_LAYOUTS[name][1]
    assert {k: results[1]["outcome"][k] for k in facts} == facts and results[1]["outcome"]["code"] == 1
    for r in (0, 2):  # the others learn it from the exchange of counts, with who it was
        assert results[r]["outcome"] == {"code": 1, "arg": "counts", "rule": "peer", "ranks": [1]}
    assert all(res["recv_untouched"] for res in results)


def _counts_disagree() -> dict:
    import hccl_py

    comm = hccl_py.init()
    n = comm.size
    send_counts = [1] * n
    if comm.rank == 0:
        send_counts[2] = 3  # rank 2 expects 1 element from rank 0
    send = np.arange(sum(send_counts), dtype=np.int32)
    recv = np.full(n, -1, np.int32)
    try:
        comm.all_to_all_v(send, send_counts, None, recv, [1] * n, None)
    except hccl_py.HcclParamError as err:
        after = comm.all_reduce(np.ones(2, np.int32))  # rejected before anything moved: still usable
        return {"mismatches": err.mismatches, "rule": err.rule, "recv": recv.tolist(), "after": after.tolist()}
    return {}


@pytest.mark.timeout(60)
def test_counts_that_disagree_fail_on_every_rank_naming_both_ranks_and_values():
    for res in run_ranks(_counts_disagree, 3, timeout=50):
        assert res["rule"] == "agree"
        assert res["mismatches"] == [[0, 2, 3, 1]]  # rank 0 sends 3 to rank 2, which expects 1
        assert res["recv"] == [-1, -1, -1] and res["after"] == [3, 3]


def _matrices_differ() -> dict:
    import hccl_py

    comm = hccl_py.init()
    n = comm.size
    matrix = [[1] * n for _ in range(n)]
    if comm.rank == 2:
        matrix[0][1] = 2  # rank 2 believes rank 0 sends 2 to rank 1
    row, column = matrix[comm.rank], [m[comm.rank] for m in matrix]
    try:
        comm.all_to_all_vc(np.zeros(sum(row), np.float32), matrix, np.zeros(sum(column), np.float32))
    except hccl_py.HcclParamError as err:
        return {"code": int(err.code), "op": err.op, "peer": err.peer, "rule": err.rule}
    return {}


@pytest.mark.timeout(60)
def test_a_rank_with_another_counts_matrix_is_a_call_mismatch():
    results = run_ranks(_matrices_differ, 3, env={"HCCL_EXEC_TIMEOUT": "30"}, timeout=50)
    assert all(res["code"] == 1 and res["op"] == "alltoallv" and res["rule"] == "counts_matrix" for res in results)
    assert any(res["peer"] == 2 for res in results[:2])  # the ranks that met rank 2's messages name it


def _mismatched_operators() -> dict:
    import hccl_py

    comm = hccl_py.init()
    x = np.arange(comm.size * 2, dtype=np.float32)
    try:
        if comm.rank == 0:
            comm.all_to_all(x)
        else:
            comm.all_gather(x[:2])
    except hccl_py.HcclParamError as err:
        return {"code": int(err.code)}
    return {}


@pytest.mark.timeout(60)
def test_all_to_all_against_another_operator_is_a_mismatch():
    assert run_ranks(_mismatched_operators, 2, env={"HCCL_EXEC_TIMEOUT": "30"}, timeout=50) == [{"code": 1}] * 2


def _shape_checks() -> list:
    import hccl_py

    comm = hccl_py.init()
    out = []
    for call in (
        lambda: comm.all_to_all(np.ones(comm.size + 1)),
        lambda: comm.all_to_all(np.array(1.0, np.float32)),
        lambda: comm.all_to_all(np.ones(comm.size), out=np.ones(comm.size + 1)),
        lambda: comm.scatter(None, root=0),
        lambda: comm.all_to_all_vc(np.ones(4), [[1, 1]], np.ones(4)),
    ):
        try:
            call()
            out.append(None)
        except hccl_py.HcclParamError as err:
            out.append(err.arg)
    return out


@pytest.mark.timeout(60)
def test_shapes_are_checked_up_front():
    for got in run_ranks(_shape_checks, 2, timeout=50):
        assert got == ["x.shape", "x.shape", "out", "x", "counts"]


def _asynchronous_v(folder: str) -> dict:
    """Rank 0 issues its all_to_all_v asynchronously and only then lets the others issue theirs:
    a call that waited for the exchange of counts before returning would never return."""
    import os

    import hccl_py
    from tests.mp import LIVENESS_S, wait_for_file

    comm = hccl_py.init()
    n, r = comm.size, comm.rank
    send_counts = [r + j + 1 for j in range(n)]  # rank r sends r + j + 1 elements to rank j
    recv_counts = [i + r + 1 for i in range(n)]
    send = np.concatenate([np.full(c, 10 * r + j, np.int32) for j, c in enumerate(send_counts)])
    recv = np.full(sum(recv_counts), -1, np.int32)
    flag = os.path.join(folder, "issued")
    if r == 0:
        work = comm.all_to_all_v(send, send_counts, None, recv, recv_counts, None, async_op=True)
        open(flag, "w").close()
    else:
        wait_for_file(flag, within=LIVENESS_S * 3)
        work = comm.all_to_all_v(send, send_counts, None, recv, recv_counts, None, async_op=True)
    got = work.wait()
    wrong = [1] * n
    wrong[(r + 1) % n] = 2  # every rank sends one element too many to the next: all disagree
    failed = comm.all_to_all_v(
        np.zeros(n + 1, np.int32), wrong, None, np.full(n, -1, np.int32), [1] * n, None, async_op=True
    )
    try:
        failed.wait()
        error = None
    except hccl_py.HcclParamError as err:
        error = {"rule": err.rule, "mismatches": err.mismatches}
    after = comm.all_reduce(np.ones(2, np.int32))  # rejected before anything moved: still usable
    return {"same": got is recv, "recv": recv.tolist(), "error": error, "after": after.tolist()}


@pytest.mark.timeout(60)
def test_an_asynchronous_all_to_all_v_returns_at_once_and_fails_at_wait(tmp_path):
    n = 3
    for r, res in enumerate(run_ranks(_asynchronous_v, n, str(tmp_path), timeout=50)):
        expected = np.concatenate([np.full(i + r + 1, 10 * i + r, np.int32) for i in range(n)])
        assert res["same"] and res["recv"] == expected.tolist()
        assert res["error"]["rule"] == "agree"
        assert sorted(res["error"]["mismatches"]) == [[i, (i + 1) % n, 2, 1] for i in range(n)]
        assert res["after"] == [n, n]


def _asynchronous_bad_layout() -> dict:
    import hccl_py

    comm = hccl_py.init()
    n = comm.size
    counts = [1] * n if comm.rank != 1 else [-1] + [1] * (n - 1)
    recv = np.full(n, -7, np.float32)
    try:
        work = comm.all_to_all_v(np.ones(n, np.float32), counts, None, recv, [1] * n, None, async_op=True)
        work.wait()
        outcome = None
    except hccl_py.HcclParamError as err:
        outcome = {"rule": err.rule, "ranks": err.ranks}
    after = comm.all_reduce(np.ones(1, np.int32))  # every rank's call numbers still agree
    return {"outcome": outcome, "recv_untouched": bool(np.all(recv == -7)), "after": int(after[0])}


@pytest.mark.timeout(60)
def test_an_asynchronous_all_to_all_v_with_a_bad_layout_fails_on_every_rank():
    results = run_ranks(_asynchronous_bad_layout, 3, timeout=50)
    assert results[1]["outcome"] == {"rule": "range", "ranks": None}
    assert [results[r]["outcome"] for r in (0, 2)] == [{"rule": "peer", "ranks": [1]}] * 2
    assert all(res["recv_untouched"] and res["after"] == 3 for res in results)
