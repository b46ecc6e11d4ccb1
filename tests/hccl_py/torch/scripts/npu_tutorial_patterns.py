"""What pytorch/examples' DDP, FSDP2 and tensor-parallel tutorials do that the npu device got wrong
(issue 26), on small models: migrated the way Ascend documents (``import torch_npu`` and
``transfer_to_npu`` first, before torch; the script keeps saying "cuda" and "nccl"), or on the CPU
and gloo when no torch_npu is importable, with the same seeds::

    hccl-npu --devices 2 torchrun --nproc-per-node 2 npu_tutorial_patterns.py OUT   # npu
    torchrun --nproc-per-node 2 npu_tutorial_patterns.py OUT                         # CPU, gloo

Each rank writes its losses to OUT.<rank>.json. On the npu it also trains tensor-parallel attention
(heads sharded over the ranks), which CPU/gloo cannot (torch has no DTensor rule for the CPU's
attention kernel), against the same block in this process on the CPU.
"""

try:  # the first lines, before torch, as Ascend's migration guide puts them
    import torch_npu  # noqa: F401
    from torch_npu.contrib import transfer_to_npu  # noqa: F401

    ON_NPU = True
except ImportError:
    ON_NPU = False

import copy  # noqa: E402
import json  # noqa: E402
import os  # noqa: E402
import sys  # noqa: E402

import torch  # noqa: E402
import torch.distributed as dist  # noqa: E402
import torch.nn as nn  # noqa: E402
import torch.nn.functional as F  # noqa: E402
from torch.distributed.device_mesh import init_device_mesh  # noqa: E402
from torch.distributed.fsdp import fully_shard  # noqa: E402
from torch.distributed.tensor.parallel import ColwiseParallel, RowwiseParallel, parallelize_module  # noqa: E402
from torch.nn.parallel import DistributedDataParallel as DDP  # noqa: E402

rank = int(os.environ["LOCAL_RANK"])
device_type = "cuda" if ON_NPU else "cpu"  # transfer_to_npu: "cuda" is the npu
here = torch.device(f"npu:{rank}") if ON_NPU else torch.device("cpu")


class Block(nn.Module):
    """LayerNorm and causal attention, as the tutorials' transformers (npu runs the CPU's fused kernels)."""

    def __init__(self, dim: int = 16, heads: int = 4):
        super().__init__()
        self.heads = heads
        self.norm = nn.LayerNorm(dim)
        self.wq, self.wk, self.wv, self.wo = (nn.Linear(dim, dim) for _ in range(4))

    def forward(self, x):
        b, length, dim = x.shape
        h = self.norm(x)
        q, k, v = (w(h).view(b, length, self.heads, -1).transpose(1, 2) for w in (self.wq, self.wk, self.wv))
        y = F.scaled_dot_product_attention(q, k, v, is_causal=True)
        return x + self.wo(y.transpose(1, 2).contiguous().view(b, length, dim))

    def reset_parameters(self):
        for module in (self.norm, self.wq, self.wk, self.wv, self.wo):
            module.reset_parameters()


# No set_device, as the FSDP2 and tensor-parallel examples: DeviceMesh picks the card from LOCAL_RANK.
dist.init_process_group("nccl" if ON_NPU else "gloo")
mesh = init_device_mesh(device_type, (int(os.environ["WORLD_SIZE"]),))
losses = {}

# FSDP2 as its example: built on meta, sharded, to_empty, then initialised by DTensor random ops.
torch.manual_seed(0)
with torch.device("meta"):
    model = nn.Sequential(Block(), Block())
for block in model:
    fully_shard(block)
fully_shard(model)
model.to_empty(device=device_type)
for block in model:
    block.reset_parameters()
assert {p.device for p in model.parameters()} == {here}, {p.device for p in model.parameters()}
optim = torch.optim.Adam(model.parameters(), lr=1e-2)
losses["fsdp2"] = []
for _ in range(3):
    loss = model(torch.randn(4, 8, 16, device=device_type)).square().mean()
    loss.backward()
    torch.nn.utils.clip_grad_norm_(model.parameters(), max_norm=1.0)
    optim.step()
    optim.zero_grad()
    losses["fsdp2"].append(loss.item())

# DDP as its tutorial: the optimizer made before model.to(rank), a snapshot read back with map_location="cuda:N".
torch.manual_seed(1)
net = nn.Sequential(nn.Linear(16, 8), nn.ReLU(), nn.Linear(8, 1))
optim = torch.optim.SGD(net.parameters(), lr=0.1)
weight = net[0].weight
net = net.to(rank if ON_NPU else "cpu")
assert net[0].weight is weight and weight.device == here, weight.device  # the optimizer's parameter moved
ddp = DDP(net, device_ids=[rank] if ON_NPU else None)
losses["ddp"] = []
for step in range(3):
    torch.manual_seed(10 + step + rank)
    x, y = torch.randn(8, 16).to(here), torch.randn(8, 1).to(here)
    optim.zero_grad()
    loss = F.mse_loss(ddp(x), y)
    loss.backward()
    optim.step()
    losses["ddp"].append(loss.item())
snapshot = f"{sys.argv[1]}.snapshot.pt"
if rank == 0:
    torch.save(net.state_dict(), snapshot)
dist.barrier()
state = torch.load(snapshot, map_location=f"cuda:{rank}" if ON_NPU else "cpu")
assert all(t.device == here and torch.equal(t, net.state_dict()[k]) for k, t in state.items())

if ON_NPU:  # tensor-parallel attention: heads over the ranks, against the block in one process on the CPU
    torch.manual_seed(2)
    reference = Block()
    tp = parallelize_module(
        copy.deepcopy(reference).to(device_type),
        mesh,
        {
            "wq": ColwiseParallel(use_local_output=False),
            "wk": ColwiseParallel(use_local_output=False),
            "wv": ColwiseParallel(use_local_output=False),
            "wo": RowwiseParallel(),
        },
    )
    optims = [torch.optim.SGD(m.parameters(), lr=0.1, foreach=False) for m in (tp, reference)]  # norm: plain tensors
    losses["tp"], losses["tp_reference"] = [], []
    for step in range(3):
        torch.manual_seed(20 + step)  # the same batch on every rank
        x = torch.randn(2, 8, 16)
        for module, opt, key, inp in (
            (tp, optims[0], "tp", x.to(device_type)),
            (reference, optims[1], "tp_reference", x),
        ):
            loss = module(inp).square().mean()
            loss.backward()
            opt.step()
            opt.zero_grad()
            losses[key].append(loss.item())

with open(f"{sys.argv[1]}.{rank}.json", "w") as f:
    json.dump(losses, f)
dist.destroy_process_group()
