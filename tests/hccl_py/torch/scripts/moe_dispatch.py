"""Mixture-of-experts dispatch and combine with all_to_all_single, as a torch user writes it: one
expert per rank, a router picks each token's expert, the ranks exchange token counts, then the
tokens (uneven split sizes, some possibly zero), run the experts, and send the results back.

    python moe_dispatch.py OUT.pt  # under a launcher; rank 0 saves what it saw

With torch_npu importable (hccl-py's stand-in under ``hccl-launch --npu``) it runs on "hccl";
without, on gloo.
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

TOKENS, HIDDEN = 12, 16


def main(out_path: str) -> None:
    dist.init_process_group(BACKEND)
    rank, world = dist.get_rank(), dist.get_world_size()
    torch.manual_seed(0)
    router = torch.randn(HIDDEN, world).to(DEVICE)
    experts = (torch.randn(world, HIDDEN, HIDDEN) / HIDDEN**0.5).to(DEVICE)
    torch.manual_seed(1 + rank)
    tokens = torch.randn(TOKENS, HIDDEN).to(DEVICE)

    choice = (tokens @ router).argmax(dim=1)
    order = torch.argsort(choice, stable=True)
    send = tokens[order]
    send_counts = torch.bincount(choice, minlength=world)
    recv_counts = torch.empty_like(send_counts)
    dist.all_to_all_single(recv_counts, send_counts)

    received = torch.empty(int(recv_counts.sum()), HIDDEN, device=DEVICE)
    dist.all_to_all_single(
        received, send, output_split_sizes=recv_counts.tolist(), input_split_sizes=send_counts.tolist()
    )
    processed = torch.tanh(received @ experts[rank])
    returned = torch.empty_like(send)
    dist.all_to_all_single(
        returned, processed, output_split_sizes=send_counts.tolist(), input_split_sizes=recv_counts.tolist()
    )
    out = torch.empty_like(returned)
    out[order] = returned

    everyone = [torch.empty(TOKENS, HIDDEN, device=DEVICE) for _ in range(world)] if rank == 0 else None
    dist.gather(out, everyone, dst=0)
    counts = [torch.empty_like(send_counts) for _ in range(world)]
    dist.all_gather(counts, send_counts)
    if rank == 0:
        reference = torch.tanh(torch.einsum("th,thk->tk", tokens, experts[choice]))
        torch.save(
            {"out": torch.stack(everyone).cpu(), "counts": torch.stack(counts).cpu(), "reference0": reference.cpu()},
            out_path,
        )
    dist.destroy_process_group()


if __name__ == "__main__":
    main(sys.argv[1] if len(sys.argv) > 1 else os.devnull)
