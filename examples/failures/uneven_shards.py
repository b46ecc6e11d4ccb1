"""Load imbalance from uneven shards, and the fix.

    hccl-launch -n 4 examples/failures/uneven_shards.py            # shard sizes 1:2:3:4
    hccl-launch -n 4 examples/failures/uneven_shards.py --balanced  # equal shards

A batch of 400 samples is split over the ranks; each sample costs the same modeled compute.
Split unevenly, the ranks with small shards wait for the one with the largest at every
all-reduce; split evenly, the waiting disappears and the same work finishes sooner.
"""

import sys

import numpy as np

import hccl_py as hccl

BATCH, FLOPS_PER_SAMPLE, STEPS = 400, 2e9, 10

comm = hccl.init()
if "--balanced" in sys.argv:
    shards = [BATCH // comm.size] * comm.size
else:
    weights = np.arange(1, comm.size + 1)
    shards = (BATCH * weights // weights.sum()).tolist()
grads = np.ones(1 << 18, np.float32)
for _ in range(STEPS):
    comm.device.run(flops=shards[comm.rank] * FLOPS_PER_SAMPLE, nbytes=0)
    comm.all_reduce(grads)
comm.barrier()
t = comm.device.time
table = comm.all_gather(np.array([t.compute_s, t.wait_s, comm.clock]))
if comm.rank == 0:
    print(f"shards {shards}")
    print(f"{'rank':>4} {'samples':>8} {'compute ms':>11} {'waiting ms':>11}")
    for r, (compute, wait, _) in enumerate(table):
        print(f"{r:>4} {shards[r]:>8} {compute * 1e3:11.1f} {wait * 1e3:11.1f}")
    print(
        f"modeled time {table[:, 2].max() * 1e3:.1f} ms; waiting is {table[:, 1].sum() / table[:, 2].sum() * 100:.0f}% of all card time"
    )
