"""A script that starts its own ranks (mp.spawn over the cards), as HCCL's sample does: right
under hccl-npu, refused under hccl-launch --npu (which already started one process per card)."""

import sys

import torch
import torch.distributed as dist
import torch.multiprocessing as mp
import torch_npu


def run(rank: int, world: int, port: int) -> None:
    torch_npu.npu.set_device(rank)
    dist.init_process_group("hccl", rank=rank, world_size=world, init_method=f"tcp://127.0.0.1:{port}")
    dist.destroy_process_group()


if __name__ == "__main__":
    mp.spawn(run, args=(torch.npu.device_count(), int(sys.argv[1])), nprocs=torch.npu.device_count(), join=True)
