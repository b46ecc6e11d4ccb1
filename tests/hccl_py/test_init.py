"""Rendezvous, HCCL_CONNECT_TIMEOUT, and nothing left behind."""

from __future__ import annotations

import os

import numpy as np
import pytest

from tests.mp import run_ranks, store_barrier


def _late_rank(late: int, size: int) -> dict:
    import hccl_py

    if int(os.environ["RANK"]) == late:
        return {"late": True}  # never calls init: deterministically later than any timeout
    # The on-time ranks meet first, so HCCL_CONNECT_TIMEOUT does not include their start-up
    # (a slow start of rank 1 must not make rank 0 name it too).
    store_barrier("on-time", [r for r in range(size) if r != late])
    try:
        hccl_py.init()
    except hccl_py.HcclTimeoutError as err:
        return {
            "class": type(err).__name__,
            "code": int(err.code),
            "rank": err.rank,
            "ranks": err.ranks,
            "error_id": err.error_id,
        }
    return {"error": None}


@pytest.mark.timeout(60)
def test_rank_that_never_joins_fails_init_on_the_others_naming_it():
    results = run_ranks(_late_rank, 3, 2, 3, env={"HCCL_CONNECT_TIMEOUT": "3"}, timeout=40)
    assert results[2] == {"late": True}
    for rank, r in enumerate(results[:2]):
        assert r == {"class": "HcclTimeoutError", "code": 9, "rank": rank, "ranks": [2], "error_id": "EI0006"}


def _open_fds() -> int:
    return len(os.listdir("/proc/self/fd"))


def _fds_released() -> tuple[int, int, int]:
    import hccl_py

    before = _open_fds()
    comm = hccl_py.init()
    x = np.ones(300_000, np.float32)
    comm.all_reduce(x)
    sub = comm.split(color=0)
    sub.all_reduce(x)
    during = _open_fds()
    comm.destroy()
    return before, during, _open_fds()


@pytest.mark.timeout(60)
@pytest.mark.usefixtures("no_leaks")
def test_nothing_leaks_processes_shared_memory_or_descriptors():
    shm_before = set(os.listdir("/dev/shm"))
    for before, during, after in run_ranks(_fds_released, 4, timeout=50):
        assert during > before  # sockets and the segment were open ...
        assert after == before  # ... and destroy() closed every one
    assert set(os.listdir("/dev/shm")) == shm_before


def _init_twice() -> bool:
    import hccl_py

    comm = hccl_py.init()
    same = hccl_py.init() is comm
    comm.barrier()
    return same


@pytest.mark.timeout(60)
def test_init_is_idempotent():
    assert run_ranks(_init_twice, 2, timeout=30) == [True, True]


def _many() -> float:
    import hccl_py

    comm = hccl_py.init()
    x = np.ones(3, np.float32)
    comm.all_reduce(x, algo="mesh")  # every rank sends to every other at once
    return float(x[0])


@pytest.mark.timeout(180)
def test_more_ranks_than_a_socket_queue_holds():
    """A unix datagram queue holds ~10 messages (net.unix.max_dgram_qlen): with 16 ranks the
    handshake and mesh traffic overflow it, and must still complete. (16 ranks on 2 loaded cores
    took 32 s once: the bound is generous.)"""
    assert run_ranks(_many, 16, timeout=150) == [16.0] * 16
