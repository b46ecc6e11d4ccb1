"""hccl-sim: modeled time of one collective on a cluster, without processes or data.

    hccl-sim allreduce --preset 64x8p-roce --bytes 256M --algo ring

prints modeled time, algbw and busbw (nccl-tests factors: 2(n-1)/n for allreduce, (n-1)/n for
allgather and reduce-scatter, 1 for broadcast and reduce), plus the simulator's own wall time
and peak memory.
"""

from __future__ import annotations

import argparse
import resource
import sys
import time

from topology import PRESETS, Topology, TopologyError

from .algorithms.registry import COLLECTIVES, algos_for
from .algo_select import fastest
from .cost_model import CostModel
from .simulator import can_simulate_flows, simulate, simulate_flows

DTYPE_BYTES = {"int8": 1, "uint8": 1, "fp16": 2, "bf16": 2, "int16": 2, "fp32": 4, "int32": 4, "fp64": 8, "int64": 8}
BUSBW_FACTOR = {
    "allreduce": lambda n: 2 * (n - 1) / n,
    "allgather": lambda n: (n - 1) / n,
    "reduce_scatter": lambda n: (n - 1) / n,
    "broadcast": lambda n: 1.0,
    "reduce": lambda n: 1.0,
}


def parse_bytes(text: str) -> int:
    """'256M' -> 268435456; K, M, G are powers of 1024, as nccl-tests reads them."""
    text = text.strip().upper().removesuffix("B")
    scale = {"K": 1 << 10, "M": 1 << 20, "G": 1 << 30}.get(text[-1:], 1)
    number = text[:-1] if text[-1:] in "KMG" else text
    try:
        value = int(float(number) * scale)
    except ValueError:
        raise argparse.ArgumentTypeError(f"{text!r} is not a size like 8, 64K, 256M or 1G") from None
    if value < 0:
        raise argparse.ArgumentTypeError("size must be >= 0")
    return value


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="hccl-sim", description="Modeled time of one collective on a cluster, no processes.")
    parser.add_argument("collective", choices=[c.replace("_", "") for c in COLLECTIVES] + list(COLLECTIVES))
    parser.add_argument("--preset", required=True, help=f"topology preset, e.g. 2x8p-roce ({', '.join(sorted(PRESETS))}, NxMp-roce)")
    parser.add_argument("--bytes", type=parse_bytes, required=True, help="message size per rank (allgather: per rank's input)")
    parser.add_argument("--algo", default="auto", help="ring, tree, hd, mesh, rd (allreduce), or auto")
    parser.add_argument("--dtype", default="fp32", choices=sorted(DTYPE_BYTES))
    parser.add_argument("--root", type=int, default=0)
    return parser


def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    collective = {c.replace("_", ""): c for c in COLLECTIVES}.get(args.collective, args.collective)
    wall_start = time.perf_counter()
    try:
        topology = Topology.preset(args.preset)
    except TopologyError as err:
        print(f"hccl-sim: {err}", file=sys.stderr)
        return 2
    itemsize = DTYPE_BYTES[args.dtype]
    count = args.bytes // itemsize
    if collective == "reduce_scatter":
        count //= topology.num_ranks
    n = topology.num_ranks
    model = CostModel(topology)
    algo = args.algo
    if algo == "auto":
        algo = fastest(model, collective, count, itemsize, tuple(range(n)), args.root)
    elif algo not in algos_for(collective):
        print(f"hccl-sim: {collective} has no algorithm {algo!r}; use one of {', '.join(algos_for(collective))} or auto", file=sys.stderr)
        return 2
    if can_simulate_flows(collective, algo, n, count):
        result, how = simulate_flows(collective, algo, topology, count, itemsize=itemsize), "all ranks at once (flows)"
    else:
        result, how = simulate(collective, algo, topology, count, itemsize=itemsize, root=args.root, cost_model=model), "rank by rank"
    wall_s = time.perf_counter() - wall_start
    nbytes = count * itemsize * (n if collective == "reduce_scatter" else 1)
    algbw = nbytes / result.time_s if result.time_s > 0 else float("inf")
    busbw = algbw * BUSBW_FACTOR[collective](n)
    peak_mib = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024
    print(f"{collective} {args.dtype} {nbytes} bytes on {topology.name} ({n} ranks), algo {algo}")
    print(f"  modeled time  {result.time_s * 1e6:14.3f} us")
    print(f"  algbw         {algbw / 1e9:14.3f} GB/s")
    print(f"  busbw         {busbw / 1e9:14.3f} GB/s")
    print(f"  simulated {how} in {wall_s:.2f} s wall, peak memory {peak_mib:.0f} MiB")
    return 0


if __name__ == "__main__":
    sys.exit(main())
