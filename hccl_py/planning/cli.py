"""hccl-sim: modeled time of one collective on a cluster, without processes or data.

    hccl-sim allreduce --preset 64x8p-roce --bytes 256M --algo ring

prints modeled time, algbw and busbw (nccl-tests' bus factors, ``hccl_py.collectives``), plus
the simulator's own wall time and peak memory.
"""

from __future__ import annotations

import argparse
import resource
import sys
import time

from topology import PRESETS, Topology, TopologyError

from topology.units import parse_size

from ..algorithms.registry import algos_for
from ..algo_select import fastest
from ..collectives import COLLECTIVES, DATA_COLLECTIVES
from ..collectives import collective as lookup
from ..cost_model import CostModel
from .simulator import can_simulate_flows, simulate, simulate_flows

DTYPE_BYTES = {"int8": 1, "uint8": 1, "fp16": 2, "bf16": 2, "int16": 2, "fp32": 4, "int32": 4, "fp64": 8, "int64": 8}


def _size(text: str) -> int:
    try:
        return parse_size(text, minimum=0)
    except ValueError as err:
        raise argparse.ArgumentTypeError(str(err)) from None


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="hccl-sim", description="Modeled time of one collective on a cluster, no processes.")
    names = [alias for c in DATA_COLLECTIVES if c != "alltoallv" for alias in (c, *COLLECTIVES[c].aliases)
             if not alias.startswith("all_to_all_v")]  # counts per pair need a matrix, not a size
    parser.add_argument("collective", choices=names)
    parser.add_argument("--preset", required=True, help=f"topology preset, e.g. 2x8p-roce ({', '.join(sorted(PRESETS))}, NxMp-roce)")
    parser.add_argument("--bytes", type=_size, required=True, help="message size per rank (allgather: per rank's input)")
    parser.add_argument("--algo", default="auto", help="ring, tree, hd, mesh, rd (allreduce), or auto")
    parser.add_argument("--dtype", default="fp32", choices=sorted(DTYPE_BYTES))
    parser.add_argument("--root", type=int, default=0)
    return parser


def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    spec = lookup(args.collective)
    collective = spec.name
    wall_start = time.perf_counter()
    try:
        topology = Topology.preset(args.preset)
    except TopologyError as err:
        print(f"hccl-sim: {err}", file=sys.stderr)
        return 2
    itemsize = DTYPE_BYTES[args.dtype]
    n = topology.num_ranks
    count = spec.message_elements(args.bytes, itemsize, n)
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
    nbytes = spec.in_count(n, count) * itemsize
    algbw = nbytes / result.time_s if result.time_s > 0 else float("inf")
    busbw = algbw * spec.bus_factor(n)
    peak_mib = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024
    print(f"{collective} {args.dtype} {nbytes} bytes on {topology.name} ({n} ranks), algo {algo}")
    print(f"  modeled time  {result.time_s * 1e6:14.3f} us")
    print(f"  algbw         {algbw / 1e9:14.3f} GB/s")
    print(f"  busbw         {busbw / 1e9:14.3f} GB/s")
    print(f"  simulated {how} in {wall_s:.2f} s wall, peak memory {peak_mib:.0f} MiB")
    return 0


if __name__ == "__main__":
    sys.exit(main())
