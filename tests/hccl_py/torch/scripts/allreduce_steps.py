"""A few all_reduce steps on the "hccl" backend; prints each rank's sums and modeled clock.

python allreduce_steps.py [STEPS]     # under hccl-launch, torchrun, or RANK/WORLD_SIZE/MASTER_* by hand
"""

import sys

import torch
import torch.distributed as dist

import hccl_py.torch

dist.init_process_group("hccl")
rank, world = dist.get_rank(), dist.get_world_size()
sums = []
for step in range(int(sys.argv[1]) if len(sys.argv) > 1 else 3):
    t = torch.full((1024,), float(rank + step))
    dist.all_reduce(t)
    sums.append(t[0].item())
print(f"rank {rank}/{world} sums {sums} clock {hccl_py.torch.communicator().clock!r}", flush=True)
dist.destroy_process_group()
