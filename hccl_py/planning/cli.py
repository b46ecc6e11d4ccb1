"""hccl-sim: modeled time of collectives on a cluster, without processes or data.

    hccl-sim allreduce --preset 64x8p-roce --bytes 256M --algo ring     # one call
    hccl-sim allreduce --preset 2x8p-roce -b 8 -e 1G -f 2               # a sweep in HCCL Test's columns
    hccl-sim sendrecv --preset 2x8p-roce --src 0 --dst 8 --bytes 1G     # one send between two ranks
    hccl-sim validate                                                   # the model against public measurements

One call prints modeled time, algbw and busbw (nccl-tests' bus factors, ``hccl_py.collectives``),
the algorithm (``auto``: what HCCL's rules choose, with the rule) and the simulator's own wall
time and peak memory. A sweep prints HCCL Test's table (``data_size(Bytes): | aveg_time(us): |
alg_bandwidth(GB/s): | check_result:``, data_size as HCCL Test means it: the buffer of allreduce,
broadcast and reduce, the whole gathered output / reduced input of allgather and reduce_scatter),
so it lays beside a real sweep line by line; check_result is NULL (nothing was checked).
``--figures FILE`` takes a figures JSON (``hccl-calibrate`` writes one); ``--rank-table FILE``
builds the cluster from a rank table instead of a preset.
"""

from __future__ import annotations

import argparse
import resource
import sys
import time

from topology import PRESETS, RankTable, Topology, TopologyError
from topology.units import parse_size

from ..algo_select import explain_auto, hier_levels
from ..algorithms.registry import algos_for
from ..collectives import COLLECTIVES, DATA_COLLECTIVES
from ..collectives import collective as lookup
from ..cost_model import CostModel
from ..errors import HcclError
from .simulator import simulate_call, simulate_p2p

DTYPE_BYTES = {"int8": 1, "uint8": 1, "fp16": 2, "bf16": 2, "int16": 2, "fp32": 4, "int32": 4, "fp64": 8, "int64": 8}
DTYPE_NAMES = {"int8": "int8", "uint8": "uint8", "fp16": "float16", "bf16": "bfloat16", "int16": "int16", "fp32": "float32",
               "int32": "int32", "fp64": "float64", "int64": "int64"}
P2P = ("sendrecv", "send", "p2p")
HCCL_TEST_HEADER = "data_size(Bytes): | aveg_time(us): | alg_bandwidth(GB/s): | check_result:"


def _size(text: str) -> int:
    try:
        return parse_size(text, minimum=0)
    except ValueError as err:
        raise argparse.ArgumentTypeError(str(err)) from None


def build_parser() -> argparse.ArgumentParser:
    """The argument parser of ``hccl-sim`` (``hccl-sim validate`` has its own)."""
    parser = argparse.ArgumentParser(prog="hccl-sim", description="Modeled time of collectives on a cluster, no processes. "
                                     "'hccl-sim validate' holds the model against public measurements.")
    names = [alias for c in DATA_COLLECTIVES if c != "alltoallv" for alias in (c, *COLLECTIVES[c].aliases)
             if not alias.startswith("all_to_all_v")] + list(P2P)  # counts per pair need a matrix, not a size
    parser.add_argument("collective", choices=names, help="a collective, or sendrecv (one send between --src and --dst)")
    where = parser.add_mutually_exclusive_group(required=True)
    where.add_argument("--preset", help=f"topology preset, e.g. 2x8p-roce ({', '.join(sorted(PRESETS))}, NxMp-roce)")
    where.add_argument("--rank-table", metavar="FILE", help="a rank table (JSON); --wiring names its servers' preset")
    parser.add_argument("--wiring", default=None, help="server preset of a --rank-table (default: as hccl-launch)")
    parser.add_argument("--figures", metavar="FILE", default=None, help="figures JSON overriding link/card figures (hccl-calibrate writes one)")
    sizes = parser.add_mutually_exclusive_group(required=True)
    sizes.add_argument("--bytes", type=_size, help="one call: message size per rank (allgather: per rank's input)")
    sizes.add_argument("-b", "--minbytes", type=_size, help="sweep from this data_size (HCCL Test's -b)")
    parser.add_argument("-e", "--maxbytes", type=_size, default=None, help="sweep up to this data_size (HCCL Test's -e)")
    parser.add_argument("-f", "--stepfactor", type=int, default=2, help="sweep multiplication factor (HCCL Test's -f)")
    parser.add_argument("--algo", default="auto", help="ring, tree, hd, mesh, rd/oneshot (allreduce), hier:<inner>/<outer> "
                                                       "(on the partition by server), or auto (HCCL's rules)")
    parser.add_argument("--dtype", default="fp32", choices=sorted(DTYPE_BYTES))
    parser.add_argument("--op", default="sum", choices=["sum", "prod", "max", "min"])
    parser.add_argument("--root", type=int, default=0)
    parser.add_argument("--src", type=int, default=0, help="sendrecv: the sending rank")
    parser.add_argument("--dst", type=int, default=1, help="sendrecv: the receiving rank")
    return parser


def main(argv: list[str] | None = None) -> int:
    """Run ``hccl-sim``: one call, a sweep, a send between two ranks or ``validate``; exit
    status 0, or 2 for bad input."""
    argv = list(sys.argv[1:] if argv is None else argv)
    if argv and argv[0] == "validate":
        return validate_main(argv[1:])
    args = build_parser().parse_args(argv)
    wall_start = time.perf_counter()
    try:
        topology = _topology(args)
    except (TopologyError, HcclError, OSError) as err:
        print(f"hccl-sim: {err}", file=sys.stderr)
        return 2
    if args.minbytes is not None:
        if args.maxbytes is None or args.maxbytes < args.minbytes or args.stepfactor < 2:
            print("hccl-sim: a sweep needs -b <= -e and -f >= 2 (as HCCL Test)", file=sys.stderr)
            return 2
        sizes = []
        size = args.minbytes
        while size <= args.maxbytes:
            sizes.append(size)
            size *= args.stepfactor
    try:
        if args.collective in P2P:
            return _p2p(args, topology, wall_start, sizes if args.minbytes is not None else None)
        if args.minbytes is not None:
            return _sweep(args, topology, sizes)
        return _one(args, topology, wall_start)
    except (HcclError, ValueError) as err:
        print(f"hccl-sim: {err}", file=sys.stderr)
        return 2


def _topology(args) -> Topology:
    if args.rank_table:
        return Topology.from_rank_table(RankTable.load(args.rank_table), preset=args.wiring, figures=args.figures)
    return Topology.preset(args.preset, figures=args.figures)


def _check_algo(collective: str, algo: str) -> None:
    if algo == "auto" or algo in algos_for(collective):
        return
    if hier_levels(algo) is not None:
        inner, outer = hier_levels(algo)
        if inner in algos_for("allgather") and outer in algos_for(collective):
            return
    raise ValueError(f"{collective} has no algorithm {algo!r}; use one of {', '.join(algos_for(collective))}, "
                     "hier:<inner>/<outer> or auto")


def _one(args, topology: Topology, wall_start: float) -> int:
    spec = lookup(args.collective)
    collective = spec.name
    _check_algo(collective, args.algo)
    itemsize = DTYPE_BYTES[args.dtype]
    dtype = DTYPE_NAMES[args.dtype]
    n = topology.num_ranks
    count = spec.message_elements(args.bytes, itemsize, n)
    model = CostModel(topology)
    call = simulate_call(collective, topology, count, algo=args.algo, itemsize=itemsize, root=args.root, dtype=dtype,
                         op=args.op, cost_model=model)
    wall_s = time.perf_counter() - wall_start
    nbytes = spec.in_count(n, count) * itemsize
    algbw = nbytes / call.time_s if call.time_s > 0 else float("inf")
    busbw = algbw * spec.bus_factor(n)
    peak_mib = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024
    print(f"{collective} {args.dtype} {nbytes} bytes on {topology.name} ({n} ranks), algo {call.algo}")
    if args.algo == "auto":
        choice = explain_auto(model, collective, count, itemsize, tuple(range(n)), args.root, dtype, args.op)
        print(f"  auto: {choice.rule}")
    print(f"  modeled time  {call.time_s * 1e6:14.3f} us")
    print(f"  algbw         {algbw / 1e9:14.3f} GB/s")
    print(f"  busbw         {busbw / 1e9:14.3f} GB/s")
    print(f"  simulated {call.how} in {wall_s:.2f} s wall, peak memory {peak_mib:.0f} MiB")
    return 0


def _sweep(args, topology: Topology, sizes: list[int]) -> int:
    spec = lookup(args.collective)
    collective = spec.name
    _check_algo(collective, args.algo)
    itemsize = DTYPE_BYTES[args.dtype]
    dtype = DTYPE_NAMES[args.dtype]
    n = topology.num_ranks
    model = CostModel(topology)
    print(f"# hccl-sim: {collective} {args.dtype} op {args.op} on {topology.name} ({n} ranks), algo {args.algo}; "
          "modeled, nothing checked")
    print(f"the minbytes is {sizes[0]}, maxbytes is {sizes[-1]}, iters is 1, warmup_iters is 0")
    print(HCCL_TEST_HEADER)
    for size in sizes:
        count = spec.test_elements(size, itemsize, n)
        if count == 0:
            print(f"{size:<18}| {'-':>14} | {'-':>20} | NULL   # below one element per rank")
            continue
        call = simulate_call(collective, topology, count, algo=args.algo, itemsize=itemsize, root=args.root, dtype=dtype,
                             op=args.op, cost_model=model)
        algbw = size / call.time_s / 1e9
        print(f"{size:<18}| {call.time_s * 1e6:>14.2f} | {algbw:>20.5f} | NULL   # {call.algo}")
    return 0


def _p2p(args, topology: Topology, wall_start: float, sizes: list[int] | None) -> int:
    for rank in (args.src, args.dst):
        if not 0 <= rank < topology.num_ranks:
            raise ValueError(f"rank {rank} is not in 0..{topology.num_ranks - 1} of {topology.name}")
    if args.src == args.dst:
        raise ValueError("--src and --dst must be two different ranks")
    model = CostModel(topology)
    route = topology.route(args.src, args.dst)
    kinds = " -> ".join(topology.link(u, v).kind for u, v in route.hops)
    if sizes is not None:
        print(f"# hccl-sim: send rank {args.src} -> rank {args.dst} on {topology.name} over {kinds}; modeled, nothing checked")
        print(f"the minbytes is {sizes[0]}, maxbytes is {sizes[-1]}, iters is 1, warmup_iters is 0")
        print(HCCL_TEST_HEADER)
        for size in sizes:
            t = simulate_p2p(topology, args.src, args.dst, size, cost_model=model).time_s
            print(f"{size:<18}| {t * 1e6:>14.2f} | {size / t / 1e9:>20.5f} | NULL")
        return 0
    t = simulate_p2p(topology, args.src, args.dst, args.bytes, cost_model=model).time_s
    print(f"send {args.bytes} bytes rank {args.src} -> rank {args.dst} on {topology.name} ({topology.num_ranks} ranks) "
          f"over {kinds}")
    print(f"  modeled time  {t * 1e6:14.3f} us")
    print(f"  bandwidth     {args.bytes / t / 1e9:14.3f} GB/s")
    print(f"  simulated in {time.perf_counter() - wall_start:.2f} s wall")
    return 0


def validate_main(argv: list[str]) -> int:
    """``hccl-sim validate``: every public measurement beside the model's prediction; exit 1 when a
    held row drifts beyond its stated tolerance."""
    from .fidelity import format_checks, validate

    parser = argparse.ArgumentParser(prog="hccl-sim validate",
                                     description="The model held against public measurements of real HCCL and Ascend cards.")
    parser.add_argument("--table", metavar="FILE", default=None, help="measurements JSON (default: the one shipped with hccl-py)")
    parser.add_argument("--figures", metavar="FILE", default=None, help="figures JSON to validate instead of the default table")
    args = parser.parse_args(argv)
    try:
        checks = validate(args.table, args.figures)
    except (TopologyError, HcclError, OSError, ValueError, KeyError) as err:
        print(f"hccl-sim validate: {err}", file=sys.stderr)
        return 2
    print(format_checks(checks))
    return 0 if all(c.ok for c in checks) else 1


if __name__ == "__main__":
    sys.exit(main())
