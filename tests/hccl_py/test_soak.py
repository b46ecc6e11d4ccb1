"""Soak: 10,000 mixed collectives of random sizes, dtypes, ops, algorithms and communicators on 4
ranks, every result checked; no leaks of processes, shared memory or descriptors; bounded memory."""

from __future__ import annotations

import os
import resource

import numpy as np
import pytest

from hccl_py.algorithms.registry import algos_for
from tests.mp import run_ranks

CALLS = 10_000
DTYPES = [np.int8, np.int32, np.int64, np.float16, np.float32, np.float64]
OPS = ["sum", "max", "min"]


def _inputs(i: int, rank: int, count: int, dtype) -> np.ndarray:
    # Small integers: every dtype sums them exactly, so results compare bit for bit.
    return (((np.arange(count) + i + 3 * rank) % 5) - 2).astype(dtype)


def _soak(calls: int) -> dict:
    import hccl_py

    fds_before = len(os.listdir("/proc/self/fd"))
    world = hccl_py.init()
    rank = world.rank
    parity = world.split(color=rank % 2, key=rank)
    trio = world.create_group([0, 1, 2])
    comms = [world, parity, trio]
    rng = np.random.default_rng(2024)  # the same sequence of calls on every rank
    wrong = 0
    done = 0
    for i in range(calls):
        which = int(rng.integers(0, 3))
        collective = ["allreduce", "allgather", "broadcast", "reduce", "reduce_scatter"][int(rng.integers(0, 5))]
        algo = rng.choice((*algos_for(collective), "auto"))
        dtype = DTYPES[int(rng.integers(0, len(DTYPES)))]
        op = OPS[int(rng.integers(0, len(OPS)))]
        count = int(rng.choice([0, 1, 7, 64, 1000, 20_000])) if rng.random() < 0.98 else 300_000
        root_draw = int(rng.integers(0, 64))  # drawn by every rank, in the trio or not: same sequence
        comm = comms[which]
        if which == 1:
            members = [r for r in range(world.size) if r % 2 == rank % 2]
        elif which == 2:
            members = [0, 1, 2]
        else:
            members = list(range(world.size))
        if comm is None:
            continue  # rank 3 is not in the trio
        size, me = comm.size, comm.rank
        root = root_draw % size
        inputs = [_inputs(i, r, count * (size if collective == "reduce_scatter" else 1), dtype) for r in members]
        x = inputs[me].copy()
        ufunc = {"sum": np.add, "max": np.maximum, "min": np.minimum}[op]
        if collective == "allreduce":
            comm.all_reduce(x, op=op, algo=algo)
            ok = np.array_equal(x, ufunc.reduce(np.stack(inputs), axis=0))
        elif collective == "allgather":
            ok = np.array_equal(comm.all_gather(x, algo=algo), np.stack(inputs))
        elif collective == "broadcast":
            comm.broadcast(x, root=root, algo=algo)
            ok = np.array_equal(x, inputs[root])
        elif collective == "reduce":
            comm.reduce(x, root=root, op=op, algo=algo)
            ok = np.array_equal(x, ufunc.reduce(np.stack(inputs), axis=0) if me == root else inputs[me])
        else:
            part = comm.reduce_scatter(x, op=op, algo=algo)
            ok = np.array_equal(part, np.split(ufunc.reduce(np.stack(inputs), axis=0), size)[me])
        wrong += not ok
        done += 1
    world.barrier()
    peak_rss_mib = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024
    for comm in (parity, trio):
        if comm is not None:
            comm.destroy()
    world.destroy()
    return {
        "wrong": wrong,
        "done": done,
        "peak_rss_mib": peak_rss_mib,
        "fds_leaked": len(os.listdir("/proc/self/fd")) - fds_before,
    }


@pytest.mark.timeout(300)
@pytest.mark.usefixtures("no_leaks")
def test_ten_thousand_mixed_collectives(capsys):
    results = run_ranks(_soak, 4, CALLS, timeout=280)
    with capsys.disabled():
        print("\nsoak: peak RSS per rank (MiB): " + ", ".join(f"{r['peak_rss_mib']:.0f}" for r in results))
    assert sum(r["done"] for r in results) >= 3 * CALLS  # rank 3 sits out the trio's calls
    assert [r["wrong"] for r in results] == [0, 0, 0, 0]
    assert [r["fds_leaked"] for r in results] == [0, 0, 0, 0]
    assert all(r["peak_rss_mib"] < 600 for r in results)
