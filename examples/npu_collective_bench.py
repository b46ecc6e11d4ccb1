"""A collective benchmark written the way Ascend users write them: torch_npu, transfer_to_npu,
``"nccl"`` in the code, NPU events around each call, torchrun's environment.

On an Ascend server::

    torchrun --nproc-per-node 8 npu_collective_bench.py --op all_reduce

Under hccl-py, unchanged, on CPU tensors, timed by the modeled cluster::

    hccl-launch -n 8 --npu --topology ascend910b-8p examples/npu_collective_bench.py --op all_reduce

Rank 0 prints one row per size: the event time of one call (median over the iterations), the
algorithm bandwidth (bytes / time) and the bus bandwidth (algbw times the collective's bus
factor, as hccl_test and nccl-tests report it). Under hccl-launch --npu the events read the
card's modeled clock, so the table is what the modeled cluster would give, not the speed of
this machine. ``--json FILE`` also writes the rows.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics

import torch
import torch.distributed as dist

try:  # Ascend: the real torch_npu; under hccl-launch --npu, hccl-py's stand-in
    import torch_npu  # noqa: F401
    from torch_npu.contrib import transfer_to_npu  # noqa: F401
except ImportError:
    pass

# bytes each call moves per rank -> bus bandwidth factor (n ranks), as nccl-tests defines them
BUS_FACTOR = {
    "all_reduce": lambda n: 2 * (n - 1) / n,
    "all_gather": lambda n: (n - 1) / n,
    "reduce_scatter": lambda n: (n - 1) / n,
    "all_to_all": lambda n: (n - 1) / n,
    "broadcast": lambda n: 1.0,
}


def parse_sizes(text: str) -> list[int]:
    """'1K,64K,1M' -> bytes (K/M/G are powers of 1024)."""
    units = {"K": 1 << 10, "M": 1 << 20, "G": 1 << 30}
    sizes = []
    for part in text.split(","):
        part = part.strip().upper()
        scale = units.get(part[-1:], 1)
        sizes.append(int(float(part[:-1] if scale > 1 else part) * scale))
    return sizes


def make_call(op: str, nbytes: int, world: int, device: str):
    """The call to time for ``op`` at ``nbytes`` per rank (float32), with its buffers."""
    count = max(world, nbytes // 4 // world * world)
    if op == "all_reduce":
        x = torch.ones(count, device=device)
        return lambda: dist.all_reduce(x, op=dist.ReduceOp.SUM), count * 4
    if op == "broadcast":
        x = torch.ones(count, device=device)
        return lambda: dist.broadcast(x, src=0), count * 4
    if op == "all_gather":
        shard, full = torch.ones(count // world, device=device), torch.empty(count, device=device)
        return lambda: dist.all_gather_into_tensor(full, shard), count * 4
    if op == "reduce_scatter":
        full, shard = torch.ones(count, device=device), torch.empty(count // world, device=device)
        return lambda: dist.reduce_scatter_tensor(shard, full), count * 4
    if op == "all_to_all":
        src, dst = torch.ones(count, device=device), torch.empty(count, device=device)
        return lambda: dist.all_to_all_single(dst, src), count * 4
    raise SystemExit(f"unknown --op {op}; one of {', '.join(BUS_FACTOR)}")


def main() -> None:
    """Time each size with NPU events on every rank; rank 0 prints the slowest rank's medians."""
    parser = argparse.ArgumentParser(description="Ascend-style collective benchmark (torch.distributed + NPU events)")
    parser.add_argument("--op", default="all_reduce", choices=sorted(BUS_FACTOR))
    parser.add_argument("--sizes", default="1K,64K,1M,16M", help="bytes per rank, comma-separated (K/M/G suffixes)")
    parser.add_argument("--iters", type=int, default=10)
    parser.add_argument("--warmup", type=int, default=2)
    parser.add_argument("--json", help="rank 0 writes the rows here")
    args = parser.parse_args()

    local_rank = int(os.environ.get("LOCAL_RANK", "0"))
    torch.cuda.set_device(local_rank)
    dist.init_process_group("nccl")  # "hccl" on Ascend: transfer_to_npu rewrites it
    rank, world = dist.get_rank(), dist.get_world_size()
    device = f"cuda:{local_rank}"
    rows = []
    for nbytes in parse_sizes(args.sizes):
        call, moved = make_call(args.op, nbytes, world, device)
        for _ in range(args.warmup):
            call()
        torch.cuda.synchronize()
        times_ms = []
        for _ in range(args.iters):
            start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
            start.record()
            call()
            end.record()
            end.synchronize()
            times_ms.append(start.elapsed_time(end))
        slowest = torch.tensor([statistics.median(times_ms)], dtype=torch.float64, device=device)
        dist.all_reduce(slowest, op=dist.ReduceOp.MAX)  # the slowest rank's median bounds the collective
        t_us = slowest.item() * 1e3
        algbw = moved / t_us / 1e3 if t_us > 0 else float("inf")  # GB/s
        rows.append(
            {"bytes": moved, "time_us": t_us, "algbw_GBps": algbw, "busbw_GBps": algbw * BUS_FACTOR[args.op](world)}
        )
    if rank == 0:
        print(f"# {args.op} on {world} ranks ({torch.cuda.get_device_name()}), float32, median of {args.iters}")
        print(f"{'bytes':>12} {'time(us)':>12} {'algbw(GB/s)':>12} {'busbw(GB/s)':>12}")
        for r in rows:
            print(f"{r['bytes']:>12} {r['time_us']:>12.2f} {r['algbw_GBps']:>12.2f} {r['busbw_GBps']:>12.2f}")
        if args.json:
            with open(args.json, "w") as f:
                json.dump({"op": args.op, "world": world, "rows": rows}, f, indent=1)
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
