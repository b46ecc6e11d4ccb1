"""Sub-communicators (split, create_group) and point-to-point, across processes."""

from __future__ import annotations

import numpy as np
import pytest

from tests.mp import run_ranks


def _split_and_groups() -> dict:
    import hccl_py

    comm = hccl_py.init()
    rank, size = comm.rank, comm.size
    out = {}
    # split by parity, ordered by descending key: rank order inside is reversed
    sub = comm.split(color=rank % 2, key=-rank)
    members = [r for r in range(size) if r % 2 == rank % 2]
    assert sub.size == len(members)
    assert sub.rank == sorted(members, reverse=True).index(rank)
    x = np.full(5, rank, np.int64)
    sub.all_reduce(x)
    out["split_sum"] = int(x[0])
    # color None: takes part, gets None
    none = comm.split(color=None if rank == 0 else 1, key=rank)
    out["none"] = none is None
    # create_group: every rank calls it, None outside
    grp = comm.create_group([2, 0])
    if rank in (0, 2):
        assert grp.size == 2 and grp.rank == [2, 0].index(rank)
        y = np.array([rank], np.int32)
        g = grp.all_gather(y)
        out["group"] = g.ravel().tolist()
    else:
        assert grp is None
    # sub-communicators and the world interleave without cross-talk
    for i in range(20):
        a = np.full(3, i + rank, np.float64)
        comm.all_reduce(a, algo="ring")
        b = np.full(3, rank, np.float64)
        sub.all_reduce(b, op="max", algo="mesh")
        assert a[0] == sum(i + r for r in range(size))
        assert b[0] == max(members)
    # a nested split
    nested = sub.split(color=0, key=rank)
    z = np.ones(2, np.int32)
    nested.all_reduce(z)
    out["nested"] = int(z[0])
    sub.destroy()
    comm.barrier()
    return out


@pytest.mark.timeout(60)
def test_split_create_group_and_interleaving():
    results = run_ranks(_split_and_groups, 4, timeout=50)
    assert [r["split_sum"] for r in results] == [0 + 2, 1 + 3, 0 + 2, 1 + 3]
    assert [r["none"] for r in results] == [True, False, False, False]
    assert results[0]["group"] == [2, 0] and results[2]["group"] == [2, 0]
    assert "group" not in results[1] and "group" not in results[3]
    assert [r["nested"] for r in results] == [2, 2, 2, 2]


def _p2p() -> list:
    import hccl_py

    comm = hccl_py.init()
    rank, size = comm.rank, comm.size
    right, left = (rank + 1) % size, (rank - 1) % size
    got = []
    for count in (0, 1, 1000, 1_500_000):  # inline, and streamed through slots
        x = np.arange(count, dtype=np.float32) + rank
        y = np.empty(count, np.float32)
        if rank % 2 == 0:  # even ranks send first: no rank waits on a receiver that is sending
            comm.send(x, dst=right)
            comm.recv(y, src=left)
        else:
            comm.recv(y, src=left)
            comm.send(x, dst=right)
        assert np.array_equal(y, np.arange(count, dtype=np.float32) + left), count
        got.append(count)
    # many small messages in a row to one peer, received in order
    if rank == 0:
        for i in range(50):
            comm.send(np.array([i], np.int64), dst=1)
    elif rank == 1:
        z = np.empty(1, np.int64)
        assert [int(comm.recv(z, src=0)[0]) for _ in range(50)] == list(range(50))
    comm.barrier()
    return got


@pytest.mark.timeout(60)
def test_send_recv_ring_of_messages():
    results = run_ranks(_p2p, 4, timeout=50)
    assert all(r == [0, 1, 1000, 1_500_000] for r in results)


def _p2p_mismatch() -> dict:
    import hccl_py

    comm = hccl_py.init()
    try:
        if comm.rank == 0:
            comm.send(np.zeros(10, np.float32), dst=1)
            comm.barrier()  # the sender learns here at the latest (or already in send)
        else:
            comm.recv(np.zeros(12, np.float32), src=0)
    except hccl_py.HcclError as err:
        return {"class": type(err).__name__, "code": int(err.code), "rank": err.rank, "message": err.message}
    return {"class": None}


@pytest.mark.timeout(60)
def test_recv_of_a_different_size_is_refused():
    results = run_ranks(_p2p_mismatch, 2, timeout=50)
    for rank, r in enumerate(results):  # both sides hear of it, the receiver's buffer is never written
        assert (r["class"], r["code"], r["rank"]) == ("HcclParamError", 1, rank), r
        # The executor's mismatch error has no fields for the two calls yet: the message names both.
        assert "call mismatch" in r["message"] and "count=12" in r["message"] and "count=10" in r["message"], r
    # the receiver found it: its own call is the receive, the sender's the send
    assert (
        "rank 1 called recv(count=12, dtype=float32, src=0) but rank 0 called send(count=10" in results[1]["message"]
    ), results[1]


def _partitions() -> dict:
    import hccl_py

    comm = hccl_py.init()
    out = {}
    auto = comm.create_groups("auto")
    out["auto"] = list(auto.world_ranks)
    manual = comm.create_groups("1,2;0,3")
    out["manual"] = list(manual.world_ranks)
    x = np.full(2, comm.rank, np.int32)
    manual.all_reduce(x)
    out["manual_sum"] = int(x[0])
    listed = comm.create_groups([[3, 2, 1, 0]])
    out["listed"] = (listed.rank, listed.size)
    for bad in ([[0, 1], [1, 2, 3]], [[0, 1]], "0,1;2,x"):
        try:
            comm.create_groups(bad)
        except hccl_py.HcclParamError as err:
            out.setdefault("errors", []).append(
                {k: getattr(err, k) for k in ("arg", "field", "rule", "value", "holder", "missing_ranks")}
            )
    try:  # ranks disagree: rank 3 passes another partition
        comm.create_groups([[0, 1], [2, 3]] if comm.rank != 3 else [[0, 3], [1, 2]])
    except hccl_py.HcclParamError as err:
        out["disagree"] = {k: getattr(err, k) for k in ("arg", "rule", "ranks")}
    return out


@pytest.mark.timeout(60)
def test_create_groups_from_a_partition_in_one_call():
    results = run_ranks(_partitions, 4, env={"HCCL_PY_TOPOLOGY": "mixed-4p"}, timeout=50)
    assert [r["auto"] for r in results] == [[0, 1], [0, 1], [2, 3], [2, 3]]  # HCCL's rule misses the 1-2 bridge
    assert [r["manual"] for r in results] == [[0, 3], [1, 2], [1, 2], [0, 3]]
    assert [r["manual_sum"] for r in results] == [3, 3, 3, 3]
    assert [r["listed"] for r in results] == [(3, 4), (2, 4), (1, 4), (0, 4)]
    none = dict.fromkeys(("arg", "field", "rule", "value", "holder", "missing_ranks"))
    for r in results:
        assert r["errors"] == [
            {
                **none,
                "arg": "groups",
                "field": "groups[1]",
                "rule": "unique",
                "value": 1,
                "holder": "groups[0]",
            },  # rank 1 twice
            {**none, "arg": "groups", "field": "groups", "rule": "complete", "missing_ranks": [2, 3]},
            {**none, "arg": "groups", "field": "groups[1]", "rule": "type", "value": "x"},
        ], r["errors"]
        assert r["disagree"] == {"arg": "groups", "rule": "agree", "ranks": [3]}  # rank 3 passed another partition
