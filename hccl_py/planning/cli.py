"""hccl-sim: modeled time of collectives on a cluster, without processes or data.

    hccl-sim allreduce --preset 64x8p-roce --bytes 256M --algo ring     # one call
    hccl-sim allreduce --preset 2x8p-roce -b 8 -e 1G -f 2               # a sweep in HCCL Test's columns
    hccl-sim sendrecv --preset 2x8p-roce --src 0 --dst 8 --bytes 1G     # one send between two ranks
    hccl-sim alltoallv --preset 2x8p-roce --bytes 1M --skew 1.2         # all-to-all-v, MoE-skewed counts
    hccl-sim alltoallv --preset 2x8p-roce --counts counts.json          # ... of your own counts matrix
    hccl-sim batchsendrecv --preset 2x8p-roce --bytes 1G                # a ring exchange in one batch
    hccl-sim validate                                                   # the model against public measurements

One call prints modeled time, algbw and busbw (nccl-tests' bus factors, ``hccl_py.collectives``),
the algorithm (``auto``: what HCCL's rules choose, with the rule) and the simulator's own wall
time and peak memory. A sweep prints HCCL Test's table (``data_size(Bytes): | aveg_time(us): |
alg_bandwidth(GB/s): | check_result:``, data_size as HCCL Test means it: the buffer of allreduce,
broadcast and reduce, the whole gathered output / reduced input of allgather and reduce_scatter),
so it lays beside a real sweep line by line; check_result is NULL (nothing was checked).
``alltoallv`` takes a counts matrix (``--counts FILE``: JSON, ``counts[i][j]`` elements from rank
i to rank j) or makes one (``--bytes`` per pair, ``--skew S``: rank j receives ``∝ 1/(j+1)^S``,
the same total) and prints every algorithm's time, as ``all_to_all_vc`` and as ``all_to_all_v``
(which first gathers the counts), and auto's choice. ``batchsendrecv``: every rank sends
``--bytes`` to rank+1 and receives from rank-1 in one ``batch_send_recv``.
``--figures FILE`` takes a figures JSON (``hccl-calibrate`` writes one); ``--rank-table FILE``
builds the cluster from a rank table instead of a preset.
"""

from __future__ import annotations

import argparse
import json
import resource
import sys
import time

from topology import PRESETS, RankTable, Topology, TopologyError
from topology.cli import quiet_on_closed_pipe
from topology.units import parse_size

from .. import env
from ..algorithms.alltoallv import as_matrix, skewed_counts
from ..algorithms.hierarchical import TWO_LEVEL, schedule_for
from ..algorithms.registry import algos_for
from ..choice.names import hier_levels, is_continuous
from ..choice.select import alltoallv_auto, explain_auto
from ..collectives import COLLECTIVES, DATA_COLLECTIVES, CallSpec
from ..collectives import collective as lookup
from ..dtypes import DTYPE_SPELLINGS, ITEMSIZE_BY_NAME, SHORT_DTYPE_NAMES
from ..errors import HcclError
from ..modeled.cost_model import CostModel
from ..modeled.simulator import simulate_batch, simulate_p2p, without_cyclic_gc
from .calls import alltoallv_algos, prepare_alltoallv, simulate_call
from .fidelity import format_checks, situation, sureness, validate

P2P = ("sendrecv", "send", "p2p")
BATCH = ("batchsendrecv", "batch_send_recv")
HCCL_TEST_HEADER = "data_size(Bytes): | aveg_time(us): | alg_bandwidth(GB/s): | check_result:"


def _size(text: str) -> int:
    try:
        return parse_size(text, minimum=0)
    except ValueError as err:
        raise argparse.ArgumentTypeError(str(err)) from None


def build_parser() -> argparse.ArgumentParser:
    """The argument parser of ``hccl-sim`` (``hccl-sim validate`` has its own)."""
    parser = argparse.ArgumentParser(
        prog="hccl-sim",
        description="Modeled time of collectives on a cluster, no processes. "
        "'hccl-sim validate' holds the model against public measurements.",
    )
    names = [alias for c in DATA_COLLECTIVES for alias in (c, *COLLECTIVES[c].aliases)] + list(P2P) + list(BATCH)
    parser.add_argument(
        "collective",
        choices=names,
        help="a collective (alltoallv: --counts, or --bytes per pair and "
        "--skew), sendrecv (one send between --src and --dst) or batchsendrecv (a ring exchange)",
    )
    where = parser.add_mutually_exclusive_group(required=True)
    where.add_argument("--preset", help=f"topology preset, e.g. 2x8p-roce ({', '.join(sorted(PRESETS))}, NxMp-roce)")
    where.add_argument("--rank-table", metavar="FILE", help="a rank table (JSON); --wiring names its servers' preset")
    parser.add_argument("--wiring", default=None, help="server preset of a --rank-table (default: as hccl-launch)")
    parser.add_argument(
        "--figures",
        metavar="FILE",
        default=None,
        help="figures JSON overriding link/card figures (hccl-calibrate writes one)",
    )
    sizes = parser.add_mutually_exclusive_group(required=True)
    sizes.add_argument(
        "--bytes",
        type=_size,
        help="one call: message size per rank (allgather: per rank's input; "
        "alltoallv: per pair; batchsendrecv: what each rank sends)",
    )
    sizes.add_argument("-b", "--minbytes", type=_size, help="sweep from this data_size (HCCL Test's -b)")
    sizes.add_argument(
        "--counts", metavar="FILE", help="alltoallv: JSON n x n matrix, counts[i][j] = elements rank i sends rank j"
    )
    parser.add_argument(
        "-e", "--maxbytes", type=_size, default=None, help="sweep up to this data_size (HCCL Test's -e)"
    )
    parser.add_argument("-f", "--stepfactor", type=int, default=2, help="sweep multiplication factor (HCCL Test's -f)")
    parser.add_argument(
        "--deterministic",
        choices=("false", "true", "strict"),
        default=None,
        help="HCCL_DETERMINISTIC for auto's choice (default: the environment's, else false)",
    )
    parser.add_argument(
        "--algo",
        default="auto",
        help="ring, tree, hd, mesh, rd/oneshot (allreduce), hier:<inner>/<outer> "
        "(on the partition by server), or auto (HCCL's rules)",
    )
    parser.add_argument("--dtype", default="fp32", choices=sorted(SHORT_DTYPE_NAMES))
    parser.add_argument("--op", default="sum", choices=["sum", "prod", "max", "min"])
    parser.add_argument("--root", type=int, default=0)
    parser.add_argument("--src", type=int, default=0, help="sendrecv: the sending rank")
    parser.add_argument("--dst", type=int, default=1, help="sendrecv: the receiving rank")
    parser.add_argument(
        "--skew",
        type=float,
        default=0.0,
        help="alltoallv with --bytes: Zipf exponent of the receivers "
        "(rank j gets a share ∝ 1/(j+1)^S of every row, total as uniform; MoE routing, e.g. 1.2)",
    )
    return parser


def main(argv: list[str] | None = None) -> int:
    """Run ``hccl-sim``: one call, a sweep, a send between two ranks or ``validate``; exit
    status 0, or 2 for bad input."""
    quiet_on_closed_pipe(argv)
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
        v = args.collective not in P2P + BATCH and lookup(args.collective).name == "alltoallv"
        if (args.counts is not None or args.skew) and not v:
            raise ValueError("--counts and --skew are for alltoallv")
        if v:
            return _alltoallv(args, topology, wall_start)
        if args.collective in P2P:
            return _p2p(args, topology, wall_start, sizes if args.minbytes is not None else None)
        if args.collective in BATCH:
            return _batch(args, topology, wall_start, sizes if args.minbytes is not None else None)
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
    """ValueError unless ``algo`` names an algorithm of ``collective``: auto, a flat one, or any
    two-level name the library builds (every name ``auto`` prints among them)."""
    if algo == "auto" or algo in algos_for(collective):
        return
    if hier_levels(algo) is not None and collective in TWO_LEVEL:
        try:
            schedule_for(collective, ((0, 1), (2, 3)), *hier_levels(algo))
        except HcclError as err:
            raise ValueError(f"{collective} has no algorithm {algo!r}: {err}") from None
        return
    raise ValueError(
        f"{collective} has no algorithm {algo!r}; use one of {', '.join(algos_for(collective))}, "
        "hier:<inner>/<outer> or auto"
    )


def _dtype_args(args) -> tuple[str, int]:
    """(numpy's dtype name, its size in bytes) for ``--dtype``."""
    dtype = DTYPE_SPELLINGS[args.dtype]
    return dtype, ITEMSIZE_BY_NAME[dtype]


def _call_args(args):
    """(the collective's description, dtype name, itemsize) of a command line, its ``--algo`` checked."""
    spec = lookup(args.collective)
    _check_algo(spec.name, args.algo)
    return (spec, *_dtype_args(args))


def _deterministic(args) -> str:
    """--deterministic, else HCCL_DETERMINISTIC from the environment (checked), else false."""
    return args.deterministic if args.deterministic is not None else env.deterministic()


def _one(args, topology: Topology, wall_start: float) -> int:
    spec, dtype, itemsize = _call_args(args)
    collective = spec.name
    n = topology.num_ranks
    count = spec.message_elements(args.bytes, itemsize, n)
    if count == 0:
        least = next(b for b in (itemsize, itemsize * n) if spec.message_elements(b, itemsize, n))
        raise ValueError(
            f"--bytes {args.bytes} gives {collective} on {n} ranks no whole {args.dtype} element to move; "
            f"give at least {least} bytes"
        )
    model = CostModel(topology)
    request = CallSpec.of(collective, count, dtype=dtype, op=args.op, root=args.root, algo=args.algo)
    call = simulate_call(request, topology, cost_model=model, deterministic=_deterministic(args))
    wall_s = time.perf_counter() - wall_start
    nbytes = spec.in_count(n, count) * itemsize
    algbw = nbytes / call.time_s if call.time_s > 0 else float("inf")
    busbw = algbw * spec.bus_factor(n)
    peak_mib = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024
    print(f"{collective} {args.dtype} {nbytes} bytes on {topology.name} ({n} ranks), algo {call.algo}")
    if args.algo == "auto":
        choice = explain_auto(model, request, tuple(range(n)), deterministic=_deterministic(args))
        print(f"  auto: {choice.rule}")
    print(f"  modeled time  {call.time_s * 1e6:14.3f} us")
    print(f"  algbw         {algbw / 1e9:14.3f} GB/s")
    print(f"  busbw         {busbw / 1e9:14.3f} GB/s")
    print(f"  how sure      {sureness(situation(topology, collective), args.bytes, args.figures)}")
    print(f"  simulated {call.how} in {wall_s:.2f} s wall, peak memory {peak_mib:.0f} MiB")
    return 0


def _sweep(args, topology: Topology, sizes: list[int]) -> int:
    spec, dtype, itemsize = _call_args(args)
    collective = spec.name
    n = topology.num_ranks
    model = CostModel(topology)
    print(
        f"# hccl-sim: {collective} {args.dtype} op {args.op} on {topology.name} ({n} ranks), algo {args.algo}; "
        "modeled, nothing checked"
    )
    print(f"the minbytes is {sizes[0]}, maxbytes is {sizes[-1]}, iters is 1, warmup_iters is 0")
    print(HCCL_TEST_HEADER)
    where = situation(topology, collective)
    for size in sizes:
        count = spec.test_elements(size, itemsize, n)
        if count == 0:
            print(f"{size:<18}| {'-':>14} | {'-':>20} | NULL   # below one element per rank")
            continue
        request = CallSpec.of(collective, count, dtype=dtype, op=args.op, root=args.root, algo=args.algo)
        call = simulate_call(request, topology, cost_model=model, deterministic=_deterministic(args))
        algbw = size / call.time_s / 1e9
        sure = sureness(where, size, args.figures, short=True)
        print(f"{size:<18}| {call.time_s * 1e6:>14.2f} | {algbw:>20.5f} | NULL   # {call.algo}; {sure}")
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
        print(
            f"# hccl-sim: send rank {args.src} -> rank {args.dst} on {topology.name} over {kinds}; modeled, nothing checked"
        )
        print(f"the minbytes is {sizes[0]}, maxbytes is {sizes[-1]}, iters is 1, warmup_iters is 0")
        print(HCCL_TEST_HEADER)
        where = situation(topology, "p2p", args.src, args.dst)
        for size in sizes:
            t = simulate_p2p(topology, args.src, args.dst, size, cost_model=model).time_s
            sure = sureness(where, size, args.figures, short=True)
            print(f"{size:<18}| {t * 1e6:>14.2f} | {size / t / 1e9:>20.5f} | NULL   # {sure}")
        return 0
    t = simulate_p2p(topology, args.src, args.dst, args.bytes, cost_model=model).time_s
    print(
        f"send {args.bytes} bytes rank {args.src} -> rank {args.dst} on {topology.name} ({topology.num_ranks} ranks) "
        f"over {kinds}"
    )
    print(f"  modeled time  {t * 1e6:14.3f} us")
    print(f"  bandwidth     {args.bytes / t / 1e9:14.3f} GB/s")
    print(f"  how sure      {sureness(situation(topology, 'p2p', args.src, args.dst), args.bytes, args.figures)}")
    print(f"  simulated in {time.perf_counter() - wall_start:.2f} s wall")
    return 0


def _counts(args, n: int) -> tuple[tuple[int, ...], ...]:
    """The counts matrix of ``hccl-sim alltoallv``: ``--counts FILE`` or made from ``--bytes`` and ``--skew``."""
    if args.minbytes is not None:
        raise ValueError("alltoallv takes --bytes per pair or --counts, not a sweep")
    if args.counts is None:
        per_pair = args.bytes // _dtype_args(args)[1]
        if per_pair < 1:
            raise ValueError(f"--bytes {args.bytes} is less than one {args.dtype} element per pair")
        return skewed_counts(n, per_pair, args.skew)
    if args.skew:
        raise ValueError("--skew makes a matrix from --bytes; --counts gives one")
    try:
        with open(args.counts) as f:
            counts = json.load(f)
    except (OSError, ValueError) as err:
        raise ValueError(f"--counts {args.counts}: {err}") from None
    shaped = (
        isinstance(counts, list) and len(counts) == n and all(isinstance(row, list) and len(row) == n for row in counts)
    )
    if not shaped or not all(isinstance(c, int) and not isinstance(c, bool) and c >= 0 for row in counts for c in row):
        raise ValueError(
            f"--counts {args.counts}: need a {n} x {n} JSON matrix of non-negative ints (one row, one "
            f"column per rank of {args.preset or args.rank_table})"
        )
    return as_matrix(counts)


def _alltoallv(args, topology: Topology, wall_start: float) -> int:
    n = topology.num_ranks
    matrix = _counts(args, n)
    itemsize = _dtype_args(args)[1]
    algos = alltoallv_algos(topology)
    if args.algo != "auto" and args.algo not in algos:
        raise ValueError(f"alltoallv has no algorithm {args.algo!r}; use one of {', '.join(algos)} or auto")
    model = CostModel(topology)
    chosen = {
        "all_to_all_v": alltoallv_auto(topology, tuple(range(n)), exchange=True),
        "all_to_all_vc": alltoallv_auto(topology, tuple(range(n))),
    }
    # all_to_all_v first gathers every rank's [ok, send counts, receive counts] (int64), then exchanges;
    # the continuous pipeline exchanges the counts in its first step instead
    gather = simulate_call(CallSpec.of("allgather", 1 + 2 * n, dtype="int64"), topology, cost_model=model)
    shown = algos if args.algo == "auto" else (args.algo,)
    vc, v = {}, {}
    with without_cyclic_gc():
        for algo in shown:
            call = prepare_alltoallv(topology, matrix, algo, itemsize=itemsize, cost_model=model)
            vc[algo] = call.run()
            if not is_continuous(algo):  # the continuous pipeline's all_to_all_v is its vc (counts inside)
                v[algo] = call.run(gather.result.end_clocks)
            del call  # one algorithm's schedules held at a time
    total = sum(map(sum, matrix)) * itemsize
    received = [sum(row[j] for row in matrix) * itemsize for j in range(n)]
    hot = max(range(n), key=received.__getitem__)
    if args.counts is None:
        made = f"{args.bytes // itemsize * itemsize} bytes per pair" + (
            f", Zipf skew {args.skew:g}" if args.skew else ", uniform"
        )
    else:
        made = f"counts from {args.counts}"
    print(f"alltoallv {args.dtype} {total // n} bytes per rank on average on {topology.name} ({n} ranks), {made}")
    if total:
        print(f"  rank {hot} receives the most: {received[hot]} bytes, {received[hot] * n / total:.2f}x the average")
    width = max(10, *(len(a) + 2 for a in algos))
    print(
        f"  {'algo':<{width}}{'all_to_all_vc (us)':>20}{'all_to_all_v (us)':>20}{'algbw (GB/s)':>15}{'busbw (GB/s)':>15}"
    )
    for algo in shown:
        # from the call, counts exchange included; the continuous pipeline exchanges counts in its first step
        t_v = vc[algo].time_s if is_continuous(algo) else max(v[algo].end_clocks) - min(gather.result.start_clocks)
        algbw = total / n / t_v if t_v > 0 else float("inf")
        picked = [call for call, c in chosen.items() if c.algo == algo] if args.algo == "auto" else []
        mark = "" if not picked else "   <- auto" if len(picked) == 2 else f"   <- auto ({picked[0]})"
        print(
            f"  {algo:<{width}}{vc[algo].time_s * 1e6:>20.3f}{t_v * 1e6:>20.3f}{algbw / 1e9:>15.3f}"
            f"{algbw * (n - 1) / n / 1e9:>15.3f}{mark}"
        )
    if args.algo == "auto":
        for call, c in chosen.items():
            print(f"  auto ({call}): {c.algo}: {c.rule} (as the communicator's auto; HCCL_ALGO can name one)")
    print(
        f"  all_to_all_v: its counts exchange (allgather of {1 + 2 * n} int64 per rank, {gather.algo}, "
        f"{gather.time_s * 1e6:.3f} us), then the data exchange (the continuous pipeline: no allgather, each rank "
        "sends its counts inside its server in the first step); all_to_all_vc: the data exchange alone"
    )
    print("  algbw = average bytes per rank / all_to_all_v time; busbw = algbw * (n-1)/n")
    print(f"  how sure: {sureness(situation(topology, 'alltoallv'), max(total // n, 1), args.figures)}")
    peak_mib = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024
    print(f"  simulated rank by rank in {time.perf_counter() - wall_start:.2f} s wall, peak memory {peak_mib:.0f} MiB")
    return 0


def _batch(args, topology: Topology, wall_start: float, sizes: list[int] | None) -> int:
    n = topology.num_ranks
    if n < 2:
        raise ValueError(f"a ring exchange needs two ranks or more; {topology.name} has {n}")
    model = CostModel(topology)

    def ring(nbytes: int):
        return simulate_batch(topology, [(r, (r + 1) % n, nbytes) for r in range(n)], cost_model=model)

    what = f"batch_send_recv ring exchange on {topology.name} ({n} ranks): every rank sends to rank+1, receives from rank-1"
    if sizes is not None:
        print(f"# hccl-sim: {what}; modeled, nothing checked")
        print(f"the minbytes is {sizes[0]}, maxbytes is {sizes[-1]}, iters is 1, warmup_iters is 0")
        print(HCCL_TEST_HEADER)
        where = situation(topology, "batch_send_recv")
        for size in sizes:
            t = ring(size).time_s
            sure = sureness(where, size, args.figures, short=True)
            print(f"{size:<18}| {t * 1e6:>14.2f} | {size / t / 1e9:>20.5f} | NULL   # {sure}")
        return 0
    result = ring(args.bytes)
    t = result.time_s
    last = max(range(n), key=result.end_clocks.__getitem__)
    kinds = " -> ".join(topology.link(u, v).kind for u, v in topology.route((last - 1) % n, last).hops)
    print(f"{what}, {args.bytes} bytes each")
    print(f"  modeled time  {t * 1e6:14.3f} us")
    print(f"  bandwidth     {args.bytes / t / 1e9:14.3f} GB/s per rank")
    print(f"  last to finish: rank {last}, receiving from rank {(last - 1) % n} over {kinds}")
    print(f"  how sure      {sureness(situation(topology, 'batch_send_recv'), args.bytes, args.figures)}")
    print(f"  simulated in {time.perf_counter() - wall_start:.2f} s wall")
    return 0


def validate_main(argv: list[str]) -> int:
    """``hccl-sim validate``: every public measurement beside the model's prediction; exit 1 when a
    held row drifts beyond its stated tolerance."""
    parser = argparse.ArgumentParser(
        prog="hccl-sim validate",
        description="The model held against public measurements of real HCCL and Ascend cards.",
    )
    parser.add_argument(
        "--table", metavar="FILE", default=None, help="measurements JSON (default: the one shipped with hccl-py)"
    )
    parser.add_argument(
        "--figures", metavar="FILE", default=None, help="figures JSON to validate instead of the default table"
    )
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
