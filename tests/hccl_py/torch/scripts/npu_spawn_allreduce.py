"""An allreduce sample in the shape of HCCL's own PyTorch sample: mp.spawn over
torch_npu.npu.device_count() cards, tcp:// rendezvous, tensors on "npu" after set_device(rank).

    hccl-npu --devices 4 python npu_spawn_allreduce.py PORT
"""

import sys

import torch
import torch.distributed as dist
import torch.multiprocessing as mp
import torch_npu


def run(rank: int, world_size: int, port: int) -> None:
    torch_npu.npu.set_device(rank)
    dist.init_process_group(backend="hccl", rank=rank, world_size=world_size, init_method=f"tcp://127.0.0.1:{port}")
    t = torch.arange(world_size, dtype=torch.float32, device="npu")
    dist.all_reduce(t, op=dist.ReduceOp.SUM)
    print(f"[Rank {rank}] Output: {t}", flush=True)
    dist.destroy_process_group()


if __name__ == "__main__":
    n = torch_npu.npu.device_count()
    print(f"Available NPU count: {n}", flush=True)
    mp.spawn(run, args=(n, int(sys.argv[1])), nprocs=n, join=True)
