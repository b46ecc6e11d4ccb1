"""One workload run through every transport: the tests compare its results and modeled clocks.

Run by any launcher (``mpiexec -n 3 python transport_job.py --out DIR``, ``hccl-launch -n 3
transport_job.py --out DIR``, two multi-node launchers); each rank checks every result against
numpy and writes ``DIR/rank_<r>.json`` with its modeled clock after each call and a digest of all results.
``workload()`` is also importable, for launch.spawn.
"""

from __future__ import annotations

import argparse
import hashlib
import json
import os

import numpy as np


def _input(case: str, rank: int, count: int, dtype) -> np.ndarray:
    seed = int.from_bytes(hashlib.blake2b(f"{case}/{rank}".encode(), digest_size=8).digest(), "little")
    rng = np.random.default_rng(seed)
    if np.dtype(dtype).kind == "f" or dtype is np.float64:
        return rng.uniform(-4, 4, count).astype(dtype)
    return rng.integers(-100, 100, count).astype(dtype)


def workload() -> dict:
    import hccl_py

    comm = hccl_py.init()
    r, n = comm.rank, comm.size
    ranks = range(n)
    clocks: list[float] = []
    digest = hashlib.blake2b(digest_size=16)

    def done(name: str, got: np.ndarray, want: np.ndarray, exact: bool) -> None:
        ok = np.array_equal(got, want) if exact else np.allclose(got.astype(np.float64), want, rtol=1e-4, atol=1e-4)
        if not ok:
            raise AssertionError(
                f"rank {r}: {name} differs from numpy (max diff {np.max(np.abs(got.astype(np.float64) - want))})"
            )
        digest.update(np.ascontiguousarray(got).tobytes())
        clocks.append(comm.clock)

    for algo in ("ring", "hd", "mesh", "tree", "rd"):
        x = _input(f"ar-{algo}", r, 1000, np.float32)
        comm.all_reduce(x, algo=algo)
        done(
            f"allreduce {algo}",
            x,
            sum(_input(f"ar-{algo}", i, 1000, np.float32).astype(np.float64) for i in ranks),
            False,
        )
    x = _input("max", r, 70_000, np.int32)  # > 16 KiB: slots / credits
    comm.all_reduce(x, op="max", algo="ring")
    done("allreduce max", x, np.max([_input("max", i, 70_000, np.int32) for i in ranks], axis=0), True)
    x = _input("big", r, 600_000, np.float64)  # 4.8 MB: several slices
    comm.all_reduce(x)
    done("allreduce big", x, sum(_input("big", i, 600_000, np.float64) for i in ranks), False)
    g = comm.all_gather(_input("ag", r, 5000, np.int16))
    done("allgather", g, np.stack([_input("ag", i, 5000, np.int16) for i in ranks]), True)
    x = _input("bc", r, 30_000, np.float32)
    comm.broadcast(x, root=n - 1, algo="tree")
    done("broadcast", x, _input("bc", n - 1, 30_000, np.float32), True)
    part = comm.reduce_scatter(_input("rs", r, 2000 * n, np.float32), op="max")
    done(
        "reduce_scatter",
        part,
        np.max([_input("rs", i, 2000 * n, np.float32) for i in ranks], axis=0)[r * 2000 : (r + 1) * 2000],
        True,
    )
    x = _input("red", r, 3000, np.int64)
    comm.reduce(x, root=1, op="sum")
    if r == 1:
        done("reduce", x, sum(_input("red", i, 3000, np.int64) for i in ranks), True)
    x = _input("bf", r, 512, np.float32).astype(hccl_py.bfloat16)
    comm.all_reduce(x, op="max")
    done(
        "allreduce bf16",
        x.astype(np.float32),
        np.max([_input("bf", i, 512, np.float32).astype(hccl_py.bfloat16).astype(np.float32) for i in ranks], axis=0),
        True,
    )
    # point to point around the ring: even ranks send first, odd ranks receive first
    out, got = _input("p2p", r, 50_000, np.float32), np.empty(50_000, np.float32)
    nxt, prv = (r + 1) % n, (r - 1) % n
    for step in ((lambda: comm.send(out, dst=nxt)), (lambda: comm.recv(got, src=prv)))[:: 1 if r % 2 == 0 else -1]:
        step()
    done("send/recv", got, _input("p2p", prv, 50_000, np.float32), True)
    sub = comm.split(color=r % 2, key=r)
    x = np.full(100, r, np.float32)
    sub.all_reduce(x)
    done("split allreduce", x, np.full(100, sum(i for i in ranks if i % 2 == r % 2), np.float64), True)
    comm.barrier()
    clocks.append(comm.clock)
    return {"rank": r, "size": n, "clocks": clocks, "digest": digest.hexdigest()}


if __name__ == "__main__":
    parser = argparse.ArgumentParser()
    parser.add_argument("--out", required=True)
    opts = parser.parse_args()
    result = workload()
    os.makedirs(opts.out, exist_ok=True)
    with open(os.path.join(opts.out, f"rank_{result['rank']}.json"), "w") as f:
        json.dump(result, f)
