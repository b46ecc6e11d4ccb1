"""Tensor-parallel inference written with torch.distributed, run on hccl-py's "hccl" backend.

    hccl-launch -n 4 examples/torch_infer.py
    torchrun --nproc-per-node 4 examples/torch_infer.py

A two-layer MLP (hidden 4x the model width) is split Megatron-style over the ranks: the first
layer by columns (each rank holds hidden/N of it), the second by rows, and one all_reduce sums
the partial outputs. Rank 0 reads a batch, broadcasts it, and checks the sharded result against
the whole model computed on one rank. Every rank prints its card's modeled time (what the same
communication would take on the modeled Ascend cluster) next to the wall time.
"""

from __future__ import annotations

import argparse
import time

import torch
import torch.distributed as dist

import hccl_py.torch  # registers the "hccl" backend


def main() -> None:
    """Run the sharded MLP for --steps batches, check it against the whole model, print the times."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--batch", type=int, default=8)
    parser.add_argument("--width", type=int, default=256)
    parser.add_argument("--steps", type=int, default=4)
    args = parser.parse_args()

    dist.init_process_group("hccl")
    rank, world = dist.get_rank(), dist.get_world_size()
    hidden = 4 * args.width
    if hidden % world:
        raise SystemExit(f"hidden size {hidden} does not split over {world} ranks")
    torch.manual_seed(0)  # every rank builds the same full weights, then keeps its shard
    w1, w2 = torch.randn(args.width, hidden) / args.width**0.5, torch.randn(hidden, args.width) / hidden**0.5
    part = slice(rank * hidden // world, (rank + 1) * hidden // world)
    w1_shard, w2_shard = w1[:, part].contiguous(), w2[part, :].contiguous()

    comm = hccl_py.torch.communicator()  # the hccl-py communicator under the default group
    start_wall, start_modeled = time.perf_counter(), comm.clock
    worst = 0.0
    for step in range(args.steps):
        x = torch.randn(args.batch, args.width) if rank == 0 else torch.empty(args.batch, args.width)
        dist.broadcast(x, src=0)
        y = torch.relu(x @ w1_shard) @ w2_shard  # this rank's share of the output
        dist.all_reduce(y)  # the sum over ranks is the whole layer's output
        expected = torch.relu(x @ w1) @ w2
        worst = max(worst, (y - expected).abs().max().item())
    dist.barrier()
    wall_ms = (time.perf_counter() - start_wall) * 1e3
    modeled_us = (comm.clock - start_modeled) * 1e6
    print(
        f"rank {rank}/{world}: {args.steps} steps, max |error| {worst:.2e}, modeled {modeled_us:.1f} us "
        f"on {comm.topology.name}, wall {wall_ms:.1f} ms",
        flush=True,
    )
    ok = torch.tensor([1 if worst < 1e-3 else 0], dtype=torch.int32)
    dist.all_reduce(ok, op=dist.ReduceOp.MIN)
    if rank == 0:
        print("tensor-parallel output matches the whole model on every rank" if ok.item() else "MISMATCH", flush=True)
    dist.destroy_process_group()
    if not ok.item():
        raise SystemExit(1)


if __name__ == "__main__":
    main()
