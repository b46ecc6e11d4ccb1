"""DDP training written for Ascend (the npu device, device_ids, torch.npu), or for the CPU and gloo
when no torch_npu is importable: the same seed, the same losses.

    hccl-npu --devices 2 torchrun --nproc-per-node 2 npu_ddp.py OUT.pt
    torchrun --nproc-per-node 2 npu_ddp.py OUT.pt          # CPU, gloo
"""

import os
import sys

import torch
import torch.distributed as dist
from torch.nn.parallel import DistributedDataParallel as DDP

try:
    import torch_npu  # noqa: F401

    ON_NPU = True
except ImportError:
    ON_NPU = False


def main(out_path: str) -> None:
    rank = int(os.environ["LOCAL_RANK"])
    if ON_NPU:
        torch.npu.set_device(torch.device("npu", rank))
        dist.init_process_group("hccl", device_id=torch.device("npu", rank))
        device = torch.device("npu", rank)
    else:
        dist.init_process_group("gloo")
        device = torch.device("cpu")
    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(16, 32), torch.nn.ReLU(), torch.nn.Linear(32, 4))
    model = model.to(rank) if ON_NPU else model  # an int: the current accelerator's card
    ddp = DDP(model, device_ids=[rank] if ON_NPU else None)
    opt = torch.optim.SGD(ddp.parameters(), lr=0.1)
    torch.manual_seed(1 + rank)
    xs, ys = torch.randn(5, 8, 16), torch.randint(0, 4, (5, 8))
    losses = []
    for x, y in zip(xs, ys):
        opt.zero_grad()
        loss = torch.nn.functional.cross_entropy(ddp(x.to(device)), y.to(device))
        loss.backward()
        opt.step()
        losses.append(loss.item())
    total = torch.tensor(losses, device=device)
    dist.all_reduce(total)
    if dist.get_rank() == 0:
        weights = {k: v.cpu() for k, v in ddp.module.state_dict().items()}
        torch.save({"losses": total.cpu(), "weights": weights, "device": str(next(ddp.parameters()).device)}, out_path)
    dist.destroy_process_group()


if __name__ == "__main__":
    main(sys.argv[1] if len(sys.argv) > 1 else os.devnull)
