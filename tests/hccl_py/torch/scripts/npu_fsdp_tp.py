"""FSDP2 (fully_shard) and tensor parallel (DTensor: ColwiseParallel, RowwiseParallel) on the npu
device, written as for Ascend: ``init_device_mesh("npu", ...)``. Usage (under hccl-npu and
torchrun): ``npu_fsdp_tp.py OUT_PREFIX``; each rank writes its losses to OUT_PREFIX.<rank>.json."""

import json
import os
import sys

import torch
import torch.distributed as dist
import torch.nn as nn
import torch_npu  # noqa: F401
from torch.distributed.device_mesh import init_device_mesh
from torch.distributed.fsdp import fully_shard
from torch.distributed.tensor.parallel import ColwiseParallel, RowwiseParallel, parallelize_module

rank, world = int(os.environ["RANK"]), int(os.environ["WORLD_SIZE"])
torch.npu.set_device(rank)
mesh = init_device_mesh("npu", (world,))


def mlp() -> nn.Module:
    torch.manual_seed(0)
    return nn.Sequential(nn.Linear(16, 32), nn.ReLU(), nn.Linear(32, 4)).to("npu")


losses = {}
for kind in ("fsdp2", "tp"):
    model = mlp()
    if kind == "fsdp2":
        for layer in model:
            if isinstance(layer, nn.Linear):
                fully_shard(layer, mesh=mesh)
        fully_shard(model, mesh=mesh)
    else:
        parallelize_module(model, mesh, {"0": ColwiseParallel(), "2": RowwiseParallel()})
    assert all(p.device.type == "npu" for p in model.parameters())
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    losses[kind] = []
    for step in range(3):
        torch.manual_seed(100 + step + (rank if kind == "fsdp2" else 0))  # FSDP2: data parallel; TP: one batch
        x = torch.randn(8, 16).to("npu")
        loss = model(x).pow(2).mean()
        loss.backward()
        opt.step()
        opt.zero_grad()
        losses[kind].append(loss.item())
with open(f"{sys.argv[1]}.{rank}.json", "w") as f:
    json.dump(losses, f)
dist.destroy_process_group()
