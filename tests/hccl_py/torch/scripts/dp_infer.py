"""Data-parallel inference, as a torch user writes it for Ascend or anything else: rank 0 holds
the weights and the inputs; it broadcasts the weights, scatters the batch, every rank runs the
model on its share, and the predictions come back with gather, all_gather_into_tensor,
all_reduce and all_gather_object.

    python dp_infer.py OUT.pt      # under a launcher; rank 0 saves what it saw to OUT.pt

With torch_npu importable (the real one, or hccl-py's stand-in under ``hccl-launch --npu``) it
runs on "hccl" with its tensors on the rank's npu; without, on gloo and the CPU. Nothing else differs.
"""

import os
import sys

import torch
import torch.distributed as dist

try:
    import torch_npu  # noqa: F401

    BACKEND, DEVICE = "hccl", f"npu:{os.environ.get('LOCAL_RANK', '0')}"  # as on Ascend: each rank its card
except ImportError:
    BACKEND, DEVICE = "gloo", "cpu"

ROWS_PER_RANK, FEATURES, CLASSES = 6, 32, 10


def main(out_path: str) -> None:
    dist.init_process_group(BACKEND)
    rank, world = dist.get_rank(), dist.get_world_size()
    torch.manual_seed(100 + rank)  # every rank starts with other weights: the broadcast must fix them
    model = (
        torch.nn.Sequential(torch.nn.Linear(FEATURES, 64), torch.nn.GELU(), torch.nn.Linear(64, CLASSES))
        .eval()
        .to(DEVICE)
    )
    for p in model.parameters():
        dist.broadcast(p.data, src=0)

    shard = torch.empty(ROWS_PER_RANK, FEATURES, device=DEVICE)
    if rank == 0:
        torch.manual_seed(1)
        batch = torch.randn(ROWS_PER_RANK * world, FEATURES).to(DEVICE)
        dist.scatter(shard, list(batch.chunk(world)), src=0)
    else:
        dist.scatter(shard, None, src=0)

    with torch.no_grad():
        logits = model(shard)
    preds = logits.argmax(dim=1)

    all_logits = torch.empty(ROWS_PER_RANK * world, CLASSES, device=DEVICE)
    dist.all_gather_into_tensor(all_logits, logits)
    gathered = [torch.empty_like(preds) for _ in range(world)] if rank == 0 else None
    dist.gather(preds, gathered, dst=0)
    histogram = torch.bincount(preds, minlength=CLASSES)
    dist.all_reduce(histogram)
    infos = [None] * world
    dist.all_gather_object(infos, {"rank": rank, "rows": shard.shape[0], "backend": dist.get_backend()})

    if rank == 0:
        torch.save(
            {
                "logits": all_logits.cpu(),
                "preds": torch.cat(gathered).cpu(),
                "histogram": histogram.cpu(),
                "rows": [i["rows"] for i in infos],
                "backends": sorted({i["backend"] for i in infos}),
            },
            out_path,
        )
    dist.destroy_process_group()


if __name__ == "__main__":
    main(sys.argv[1] if len(sys.argv) > 1 else os.devnull)
