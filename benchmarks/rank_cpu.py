"""Where a rank's CPU and memory go when more ranks than cores share the machine (issue 29's profile).

Launches ``hccl-launch -n N`` of an allreduce loop (this module, run as the rank program) and
prints per rank the wall time and the CPU time (user, system) per call, from ``os.times()``
around the timed calls, so the sum over ranks can be set against the cores, and the rank's
unique memory after the loop (USS: the private pages of ``/proc/self/smaps_rollup``, what ending
the rank would give back) beside the program's own buffer. ``--profile`` runs
the loop under cProfile on every rank and prints the functions by own time summed over the ranks,
per call per rank (cProfile's own cost inflates every figure about 2-3x; the order is what it
shows), and the Python calls per collective::

    python -m benchmarks.rank_cpu -n 8 --bytes 8
    python -m benchmarks.rank_cpu -n 8 --bytes 1M --calls 300 --profile
"""

from __future__ import annotations

import argparse
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from topology.units import format_size, parse_size

_WARMUP = 100
_USS_FIELDS = ("Private_Clean:", "Private_Dirty:")


def uss_bytes() -> int:
    """This process's unique set size in bytes: the pages no other process maps (private, clean
    or dirty, from ``/proc/self/smaps_rollup``); a forked rank's pages still shared with its
    launcher are not counted."""
    total = 0
    with open("/proc/self/smaps_rollup") as f:
        for line in f:
            if line.startswith(_USS_FIELDS):
                total += int(line.split()[1]) * 1024
    return total


def _rank(calls: int, nbytes: int, profile_dir: str | None) -> None:
    """The rank program: warm up, then time ``calls`` allreduces (optionally profiled)."""
    import numpy as np

    import hccl_py

    comm = hccl_py.init()
    x = np.ones(max(nbytes // 4, 1), np.float32)
    for _ in range(_WARMUP):
        comm.all_reduce(x)
    comm.barrier()
    profiler = None
    if profile_dir:
        import cProfile

        profiler = cProfile.Profile()
        profiler.enable()
    wall_start, cpu_start = time.perf_counter(), os.times()
    for _ in range(calls):
        comm.all_reduce(x)
    wall_end, cpu_end = time.perf_counter(), os.times()
    if profiler is not None:
        profiler.disable()
        profiler.dump_stats(os.path.join(profile_dir, f"rank{comm.rank}.prof"))
    per_call = 1e6 / calls
    user_us = (cpu_end.user - cpu_start.user) * per_call
    system_us = (cpu_end.system - cpu_start.system) * per_call
    print(
        f"RANK {comm.rank} {(wall_end - wall_start) * per_call:.1f} {user_us:.1f} {system_us:.1f} {uss_bytes()}",
        flush=True,
    )
    comm.barrier()


def _profile_table(profile_dir: str, nranks: int, calls: int, top: int) -> str:
    import pstats

    stats = pstats.Stats(*(os.path.join(profile_dir, f"rank{r}.prof") for r in range(nranks))).stats
    per = 1e6 / (nranks * calls)
    python_calls = sum(v[1] for v in stats.values()) / (nranks * calls)
    lines = [
        f"# cProfile, own time per call per rank (inflated by the profiler), {python_calls:.0f} function calls a call",
        f"# {'own us':>8}  {'calls':>6}  function",
    ]
    for (path, line, name), (_cc, ncalls, own_s, _cum_s, _callers) in sorted(stats.items(), key=lambda kv: -kv[1][2])[
        :top
    ]:
        where = name if path == "~" else f"{Path(path).name}:{line} {name}"
        lines.append(f"  {own_s * per:8.2f}  {ncalls / (nranks * calls):6.2f}  {where}")
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    """Launch the loop on ``-n`` ranks and print the per-rank table (and the profile), e.g.
    ``main(["-n", "8", "--bytes", "8"])``; the exit status of the job."""
    parser = argparse.ArgumentParser(prog="python -m benchmarks.rank_cpu", description=__doc__.splitlines()[0])
    parser.add_argument("-n", "--nranks", type=int, default=8)
    parser.add_argument("--bytes", default="8", help="allreduce size (float32), e.g. 8, 32K, 1M")
    parser.add_argument("--calls", type=int, default=2000, help="timed calls per rank (after 100 warm-up calls)")
    parser.add_argument("--profile", action="store_true", help="cProfile every rank; print the hottest functions")
    parser.add_argument("--top", type=int, default=25)
    parser.add_argument("--rank-program", nargs=3, help=argparse.SUPPRESS)  # calls, bytes, profile dir ('' = off)
    args = parser.parse_args(argv)
    if args.rank_program:
        calls, nbytes, profile_dir = args.rank_program
        _rank(int(calls), int(nbytes), profile_dir or None)
        return 0
    nbytes = parse_size(args.bytes)
    with tempfile.TemporaryDirectory(prefix="hccl-rank-cpu-") as folder:
        profile_dir = folder if args.profile else ""
        cmd = [sys.executable, "-m", "launch.cli", "-n", str(args.nranks), "-m", "benchmarks.rank_cpu"]
        cmd += ["--rank-program", str(args.calls), str(nbytes), profile_dir]
        done = subprocess.run(cmd, capture_output=True, text=True, timeout=1800)
        if done.returncode != 0:
            sys.stderr.write(done.stdout[-3000:] + done.stderr[-3000:])
            return done.returncode
        rows = sorted(
            (int(f[0]), float(f[1]), float(f[2]), float(f[3]), int(f[4]))
            for f in (line.split("RANK ", 1)[1].split() for line in done.stdout.splitlines() if "RANK " in line)
        )
        buffer_bytes = max(nbytes // 4, 1) * 4  # the rank program's one float32 array
        cores = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else os.cpu_count()
        print(
            f"# allreduce {format_size(nbytes)} float32, {args.nranks} ranks on {cores} cores, {args.calls} calls"
            f"{' under cProfile' if args.profile else ''}; per call, us"
        )
        print(f"# {'rank':>4}  {'wall':>8}  {'user':>7}  {'system':>7}  {'USS MiB':>8}  {'above buffer':>12}")
        for rank, wall, user, system, uss in rows:
            above = (uss - buffer_bytes) / 2**20
            print(f"  {rank:>4}  {wall:8.1f}  {user:7.1f}  {system:7.1f}  {uss / 2**20:8.1f}  {above:12.1f}")
        total = sum(row[2] + row[3] for row in rows)
        wall = max(row[1] for row in rows)
        print(
            f"# CPU summed over ranks {total:.0f} us a call = {total / wall:.2f} cores busy over the "
            f"{wall:.0f} us wall (of {cores})"
        )
        worst = max(row[4] for row in rows)
        print(
            f"# USS per rank at most {worst / 2**20:.1f} MiB: {(worst - buffer_bytes) / 2**20:.1f} MiB above the "
            f"program's own buffer of {format_size(buffer_bytes)}"
        )
        if args.profile:
            print(_profile_table(folder, args.nranks, args.calls, args.top))
    return 0


if __name__ == "__main__":
    sys.exit(main())
