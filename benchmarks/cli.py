"""``hccl-bench``: nccl-tests / hccl_test-style sweeps of hccl-py's collectives, side by side with
MPI (mpi4py + MPICH) and torch.distributed gloo, or beside torch.distributed on hccl-py's own
"hccl" backend (``--vs torch-hccl``).

    hccl-bench allreduce -n 4 -b 8 -e 64M -f 2 -w 5 -i 20 -d fp32 -o sum --algo ring
    hccl-bench allgather -n 2 -b 1K -e 16M -f 4 --vs mpi,gloo --json ag.json --plot ag.png
    hccl-bench alltoall -n 4 -b 8 -e 16M -f 4 --vs mpi,gloo --algo pairwise
    hccl-bench allreduce -n 2,4 -b 8 -e 16M -f 4 --vs mpi     # and how each scales from 2 to 4 ranks
    hccl-bench allreduce -n 2 -b 8 -e 4M -f 4 --vs torch-hccl --repeats 5   # what torch's API adds to hccl-py
    hccl-bench partition --topology mixed-4p --workload dp-infer     # communication groups (hccl_py/planning/partition_report.py)

It starts its own ranks (launch.spawn, also for torch-hccl; mpiexec; one process per gloo rank). Started as a rank of
a job instead (``hccl-launch -n 4 hccl-bench ...``, ``mpiexec -n 4 hccl-bench ...``), it runs
hccl-py in place on that job's ranks and rank 0 prints.

Exit status: 0, or 1 if any result was wrong, 2 for bad arguments or a failed hccl-py run.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
from collections.abc import Sequence
from pathlib import Path

from hccl_py import env
from topology.units import parse_size

from .collectives import COLLECTIVES
from .config import OPS, PEERS, BenchConfig, parse_dtype

__all__ = ["main", "build_parser", "config_from_args"]

ALGOS = ("auto", "ring", "tree", "hd", "mesh", "pairwise")  # for the help; hccl-py says which a collective has


def _size(text: str) -> int:
    try:
        return parse_size(text)
    except ValueError as err:
        raise argparse.ArgumentTypeError(str(err)) from None


def _nranks(text: str) -> tuple[int, ...]:
    try:
        values = tuple(int(v) for v in text.split(",") if v.strip())
    except ValueError:
        raise argparse.ArgumentTypeError(
            f"-n takes a rank count or a comma-separated list (2,4), not {text!r}"
        ) from None
    if not values:
        raise argparse.ArgumentTypeError("-n needs at least one rank count")
    return tuple(sorted(set(values)))


def _peers(text: str) -> tuple[str, ...]:
    names = tuple(p.strip().lower() for p in text.split(",") if p.strip())
    unknown = [p for p in names if p not in PEERS]
    if unknown:
        raise argparse.ArgumentTypeError(f"unknown peer(s) {', '.join(unknown)}; --vs takes {','.join(PEERS)}")
    return tuple(dict.fromkeys(names))


def build_parser() -> argparse.ArgumentParser:
    """The argparse parser of hccl-bench (``hccl-bench partition ...`` is routed by :func:`main`
    before it)."""
    p = argparse.ArgumentParser(
        prog="hccl-bench",
        description="Measure hccl-py's collectives like nccl-tests (size sweep, algbw/busbw, #wrong), "
        "optionally side by side with MPI (mpi4py+MPICH), torch gloo and torch on hccl-py's "
        "own backend (torch-hccl).",
        epilog="Sizes take K/M/G suffixes (powers of 1024). Example: "
        "hccl-bench allreduce -n 2 -b 8 -e 64M -f 4 --vs mpi,gloo --plot ar.png. "
        "Communication groups: hccl-bench partition --help",
    )
    p.add_argument(
        "collective",
        choices=list(COLLECTIVES),
        help="the collective to measure (alltoallv: alltoall's "
        "data with equal counts per pair, as HCCL's alltoallv_test; hccl-py and --vs mpi, gloo does not run it)",
    )
    p.add_argument(
        "-n",
        "--nranks",
        type=_nranks,
        default=(2,),
        help="ranks (simulated cards), default 2; several (2,4) run the sweep at each, "
        "alternating, and print how each implementation's time scales",
    )
    p.add_argument("-b", "--minbytes", type=_size, default=8, help="smallest size, default 8")
    p.add_argument("-e", "--maxbytes", type=_size, default=64 << 20, help="largest size, default 64M")
    p.add_argument("-f", "--stepfactor", type=int, default=2, help="multiply the size by this per step, default 2")
    p.add_argument("-w", "--warmup", type=int, default=5, help="warm-up iterations per size, default 5")
    p.add_argument("-i", "--iters", type=int, default=20, help="timed iterations per size, default 20")
    p.add_argument(
        "-d",
        "--datatype",
        default="fp32",
        help="fp32 (float), fp16 (half), bf16, fp64 (double), int8, uint8, int16, int32, int64",
    )
    p.add_argument("-o", "--op", default="sum", choices=OPS, help="reduction (reducing collectives), default sum")
    p.add_argument(
        "-r", "--root", type=int, default=0, help="root rank (broadcast, reduce, scatter, gather), default 0"
    )
    p.add_argument(
        "-c",
        "--check",
        type=int,
        default=1,
        choices=(0, 1),
        help="check every iteration's result (1, default) or not (0)",
    )
    p.add_argument(
        "--algo",
        default="auto",
        help=f"hccl-py's algorithm: {', '.join(ALGOS)} (or any other hccl-py has for the collective; "
        "alltoall, alltoallv: pairwise, mesh), default auto",
    )
    p.add_argument(
        "--vs",
        type=_peers,
        default=(),
        metavar="PEERS",
        help="also run these, alternating with hccl-py: mpi, gloo, torch-hccl (torch.distributed on "
        "hccl-py's backend), unmodeled (hccl-py without modeled time), comma-separated",
    )
    p.add_argument(
        "--repeats",
        type=int,
        default=3,
        help="whole sweeps per implementation (alternating); the median per size is reported. Default 3",
    )
    p.add_argument("--json", metavar="FILE", help="write the results as JSON (schema hccl-bench/1)")
    p.add_argument("--plot", metavar="FILE.png", help="draw busbw vs size for every implementation run")
    p.add_argument(
        "--timeout",
        type=float,
        default=900.0,
        help="seconds one implementation's sweep may take before it is stopped, default 900",
    )
    p.add_argument(
        "--mem-budget",
        type=_size,
        default=256 << 20,
        help="per-iteration buffers per rank and size (each iteration gets its own so it "
        "can be checked); beyond it iterations run in chunks. Default 256M",
    )
    p.add_argument("--no-progress", action="store_true", help="no progress bar")
    return p


def config_from_args(args: argparse.Namespace, nranks: int | None = None) -> BenchConfig:
    """The BenchConfig of parsed arguments at ``nranks`` (default: the first -n; running in
    place, the job's size)."""
    return BenchConfig(
        collective=args.collective,
        nranks=args.nranks[0] if nranks is None else nranks,
        minbytes=args.minbytes,
        maxbytes=args.maxbytes,
        stepfactor=args.stepfactor,
        warmup=args.warmup,
        iters=args.iters,
        dtype=parse_dtype(args.datatype).name,
        op=args.op,
        root=args.root,
        check=bool(args.check),
        algo=args.algo,
        peers=tuple(args.vs),
        repeats=args.repeats,
        mem_budget=args.mem_budget,
        timeout_s=args.timeout,
    )


def _check_outputs(args: argparse.Namespace) -> str | None:
    if args.plot:
        from .peers.base import importable

        if not importable("matplotlib"):
            return "--plot needs matplotlib: pip install -e '.[bench]'"
    for path in (args.json, args.plot):
        if path and not Path(path).resolve().parent.is_dir():
            return f"cannot write {path}: no such folder"
    return None


def _emit(results, args: argparse.Namespace) -> int:
    """Print one report per world size (and the scaling table for several); write --json/--plot."""
    from .report import format_report, format_scaling, scaling_to_json, to_json
    from .targets import check_targets, format_targets, targets_to_json

    print("\n#\n".join(format_report(r) for r in results), flush=True)
    if len(results) > 1:
        print("#\n" + format_scaling(results), flush=True)
    verdicts = check_targets(results) if args.vs else []
    if verdicts:
        print("#\n" + format_targets(verdicts), flush=True)
    if args.json:
        doc = to_json(results[0]) if len(results) == 1 else scaling_to_json(results)
        if verdicts:
            doc["targets"] = targets_to_json(verdicts)
        Path(args.json).write_text(json.dumps(doc, indent=1) + "\n")
        print(f"# wrote {args.json}")
    if args.plot:
        from .plot import plot_busbw

        plot_busbw(results, args.plot)
        print(f"# wrote {args.plot}")
    wrong = [r.wrong for result in results for impl in result.ok for r in impl.rows if r.wrong]
    return 1 if wrong else 0


def _world_size_from_env() -> int | None:
    for name in (env.RANK_SIZE, env.WORLD_SIZE, env.PMI_SIZE, env.OMPI_COMM_WORLD_SIZE):
        if os.environ.get(name):
            return int(os.environ[name])
    return None


def _run_in_place(args: argparse.Namespace, env_updates: dict[str, str]) -> int:
    """This process is one rank of a job someone else started: run hccl-py here; rank 0 reports."""
    os.environ.update(env_updates)
    import hccl_py

    from .collectives import get as get_collective
    from .harness import BenchResult, ImplResult, aggregate, make_progress_bar, run_sweep, size_plan
    from .peers.hccl import EXTRA_COLUMNS, HcclBackend, HcclRankComm, unsupported_reason

    size = _world_size_from_env()
    if len(args.nranks) > 1:
        raise ValueError(
            f"-n {','.join(map(str, args.nranks))} starts ranks at each size; as ranks of a "
            f"launcher's job ({size} ranks) hccl-bench runs at that size only"
        )
    cfg = config_from_args(args, nranks=size)
    reason = unsupported_reason(cfg)
    if reason:
        raise ValueError(f"hccl-py cannot run this: {reason}")
    comm = hccl_py.init()
    rc = HcclRankComm(comm, cfg.algo)
    leader = comm.rank == 0
    if leader and cfg.peers:
        print(
            "# --vs is ignored when hccl-bench runs as ranks of a launcher's job; "
            "run hccl-bench directly (it starts every implementation's ranks) to compare",
            flush=True,
        )
    bar = make_progress_bar(len(size_plan(cfg)) * cfg.repeats, leader and not args.no_progress, cfg.collective)
    tick = bar.update if bar is not None else None
    try:
        runs = [run_sweep(rc, cfg, tick if leader else None) for _ in range(cfg.repeats)]
        rc.barrier()
    finally:
        if bar is not None:
            bar.close()
        comm.destroy()
    if not leader:
        return 0
    backend = HcclBackend()
    impl = ImplResult(
        "hccl",
        backend.label,
        version=backend.version(),
        mode=backend.mode(get_collective(cfg.collective)) + " (ranks of a launcher's job)",
        extra_columns=EXTRA_COLUMNS,
        runs=runs,
    )
    impl.rows = aggregate(runs, get_collective(cfg.collective).bus_factor(cfg.nranks), EXTRA_COLUMNS)
    return _emit([BenchResult(cfg, {"hccl": impl})], args)


def main(argv: Sequence[str] | None = None) -> int:
    """Run ``hccl-bench`` with ``argv`` (default ``sys.argv[1:]``); return the exit status: 0, 1 if a
    result was wrong, 2 if a run failed (bad arguments exit 2 from argparse)."""
    argv = sys.argv[1:] if argv is None else list(argv)
    if argv[:1] == ["partition"]:  # hccl-bench partition ...: auto vs manual vs optimized groups, simulated
        from hccl_py.planning.partition_report import main as partition_main

        return partition_main(argv[1:])
    parser = build_parser()
    args = parser.parse_args(argv)
    try:
        parse_dtype(args.datatype)
    except ValueError as err:
        parser.error(str(err))
    problem = _check_outputs(args)
    if problem:
        parser.error(problem)

    from .peers.hccl import in_place_env

    env_updates = in_place_env()
    if env_updates is not None:
        try:
            return _run_in_place(args, env_updates)
        except ValueError as err:
            parser.error(str(err))

    try:
        cfgs = [config_from_args(args, nranks=n) for n in args.nranks]
    except ValueError as err:
        parser.error(str(err))

    from .harness import BackendError, run_benchmarks
    from .peers import backends

    cfg = cfgs[0]
    at = f" at -n {','.join(map(str, args.nranks))}" if len(cfgs) > 1 else ""
    print(
        f"# hccl-bench: running {', '.join(['hccl-py', *cfg.peers])}{at} "
        f"({cfg.repeats} repeat{'s' if cfg.repeats != 1 else ''}, alternating)",
        flush=True,
    )
    try:
        results = run_benchmarks(cfgs, backends(cfg.peers), progress=not args.no_progress)
    except BackendError as err:
        print(f"hccl-bench: {err}", file=sys.stderr)
        return 2
    except KeyboardInterrupt:
        print("hccl-bench: interrupted", file=sys.stderr)
        return 130
    return _emit(results, args)


if __name__ == "__main__":
    sys.exit(main())
