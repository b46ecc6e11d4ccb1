"""The first thing to run: every collective once, on every rank, checked against numpy.

hccl-launch -n 4 examples/allreduce.py
"""

import numpy as np

import hccl_py as hccl

with hccl.init() as comm:
    rank, size = comm.rank, comm.size

    x = np.full(1000, rank, np.float32)
    comm.all_reduce(x)  # in place, sum by default
    assert np.all(x == sum(range(size)))

    gathered = comm.all_gather(np.array([rank, rank * rank], np.int64))  # shape (size, 2)
    assert gathered[:, 1].tolist() == [r * r for r in range(size)]

    y = np.zeros(8, np.float32) if rank else np.arange(8, dtype=np.float32)
    comm.broadcast(y, root=0)
    assert np.array_equal(y, np.arange(8))

    part = comm.reduce_scatter(np.arange(4 * size, dtype=np.int32), op="max")
    assert np.array_equal(part, np.arange(4 * rank, 4 * rank + 4))

    z = np.full(3, rank + 1, np.float64)
    comm.reduce(z, root=size - 1, op="min")

    pairs = comm.split(color=rank % 2, key=rank)  # even ranks and odd ranks
    w = np.ones(4, np.int32)
    pairs.all_reduce(w)

    if rank == size - 1:
        assert np.all(z == 1)  # min over ranks of rank + 1; other ranks' z is left as it was

    comm.barrier()
    print(
        f"rank {rank}/{size}: all_reduce(sum) -> {x[0]:g}, all_gather -> {gathered[:, 0].tolist()}, "
        f"reduce_scatter(max) -> {part.tolist()}, split group of {pairs.size} -> all_reduce {w[0]}"
    )
