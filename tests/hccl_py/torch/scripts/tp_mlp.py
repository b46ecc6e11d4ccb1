"""A tensor-parallel MLP block (Megatron style), as a torch user writes it: the first layer split
by columns, the second by rows, one all_reduce of the partial outputs; then the same block
sequence-parallel (reduce_scatter_tensor of the partial outputs, all_gather_into_tensor back);
then the all_reduce asynchronous, overlapped with the next input's first layer.

    python tp_mlp.py OUT.pt        # under a launcher; rank 0 saves what it saw

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

BATCH, WIDTH = 8, 48


def main(out_path: str) -> None:
    dist.init_process_group(BACKEND)
    rank, world = dist.get_rank(), dist.get_world_size()
    hidden = 4 * WIDTH
    torch.manual_seed(0)
    w1, w2 = torch.randn(WIDTH, hidden).to(DEVICE), torch.randn(hidden, WIDTH).to(DEVICE)
    cols = slice(rank * hidden // world, (rank + 1) * hidden // world)
    w1_part, w2_part = w1[:, cols].contiguous(), w2[cols, :].contiguous()
    xs = torch.randn(3, BATCH, WIDTH).to(DEVICE)  # the same inputs on every rank (same seed)

    def partial(x):
        return torch.relu(x @ w1_part) @ w2_part

    y = partial(xs[0])
    dist.all_reduce(y)

    part = torch.empty(BATCH // world, WIDTH, device=DEVICE)
    dist.reduce_scatter_tensor(part, partial(xs[1]))
    y_sp = torch.empty(BATCH, WIDTH, device=DEVICE)
    dist.all_gather_into_tensor(y_sp, part)

    y_async = partial(xs[2])
    work = dist.all_reduce(y_async, async_op=True)
    h_next = torch.relu(xs[0] @ w1_part)  # overlapped with the reduction
    work.wait()

    if rank == 0:
        torch.save(
            {
                "y": y.cpu(),
                "y_sp": y_sp.cpu(),
                "y_async": y_async.cpu(),
                "h_next": h_next.cpu(),
                "reference": torch.stack([torch.relu(x @ w1) @ w2 for x in xs]).cpu(),
            },
            out_path,
        )
    dist.destroy_process_group()


if __name__ == "__main__":
    main(sys.argv[1] if len(sys.argv) > 1 else os.devnull)
