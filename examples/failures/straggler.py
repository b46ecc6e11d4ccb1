"""A straggler in data-parallel work: one slow card holds every step back.

    hccl-launch -n 4 examples/failures/straggler.py                                     # balanced
    hccl-launch -n 4 --fault rank=1,action=slow,factor=1.8 examples/failures/straggler.py

Every rank computes the same work per step, then all-reduces its gradients. With rank 1's card
computing 1.8x slower (in modeled time), the report shows the others *waiting* — time HCCL
would book as communication — which rank they waited for, and how much throughput it cost.
"""

import numpy as np

import hccl_py as hccl

STEPS, FLOPS_PER_STEP, GRADIENT_ELEMENTS = 20, 4e11, 1 << 20

comm = hccl.init()
grads = np.ones(GRADIENT_ELEMENTS, np.float32)
for _ in range(STEPS):
    comm.device.run(flops=FLOPS_PER_STEP, nbytes=0)  # forward + backward of this rank's shard
    comm.all_reduce(grads)
comm.barrier()

t = comm.device.time
waited_for = max(comm.device.waited_for.items(), key=lambda kv: kv[1], default=(-1, 0.0))
mine = np.array([comm.clock, t.compute_s, t.comm_s, t.wait_s, waited_for[0], waited_for[1], comm.device.slow_factor])
table = comm.all_gather(mine)
if comm.rank == 0:
    print(f"{'rank':>4} {'compute ms':>11} {'comm ms':>9} {'waiting ms':>11}  waited most for")
    for r, (clock, compute, comm_s, wait, peer, peer_wait, slow) in enumerate(table):
        who = f"rank {int(peer)} ({peer_wait * 1e3:.1f} ms)" if peer >= 0 and peer_wait > 0 else "-"
        print(
            f"{r:>4} {compute * 1e3:11.1f} {comm_s * 1e3:9.1f} {wait * 1e3:11.1f}  {who}{'   <- slow card x%.1f' % slow if slow > 1 else ''}"
        )
    clock = table[:, 0].max()
    normal_compute = table[table[:, 6] == 1.0][:, 1].min() if (table[:, 6] == 1.0).any() else table[:, 1].min()
    ideal = clock - (table[:, 1].max() - normal_compute)  # the same job if every card were as fast as the fastest
    print(
        f"modeled time {clock * 1e3:.1f} ms for {STEPS} steps; without the straggler {ideal * 1e3:.1f} ms: "
        f"{(1 - ideal / clock) * 100:.0f}% of the throughput lost to waiting"
    )
