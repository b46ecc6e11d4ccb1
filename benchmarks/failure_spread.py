"""How fast a rank's death reaches every other rank of a job started without a launcher.

``n`` ranks are started torchrun-style (RANK, WORLD_SIZE, MASTER_ADDR, MASTER_PORT; rank 0 hosts
the store), each running ring allreduces in a loop. Once every rank is in the loop, this script
SIGKILLs one rank and notes the wall time; every survivor notes when its HcclRemoteError came and
which rank it names. The spread of one trial is the latest survivor's time minus the kill's;
the figure is the median over ``--trials``::

    python -m benchmarks.failure_spread                 # 8 ranks, kill rank 3, 5 trials
    python -m benchmarks.failure_spread -n 4 --kill 1 --trials 3

Without a launcher nobody stops the other ranks, so each one must find out for itself: the rank
waiting for the dead one notices it (a liveness check every 0.5 s, two in a row) and tells the
others at once (``Engine._peer_died``).
"""

from __future__ import annotations

import argparse
import json
import os
import signal
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from hccl_py import env

ROOT = Path(__file__).resolve().parents[1]

RANK_SCRIPT = """
import json, os, sys, time
import numpy as np
import hccl_py

out = sys.argv[1]
comm = hccl_py.init()
x = np.ones(1024, np.float32)
comm.all_reduce(x)
open(out + ".ready", "w").close()
try:
    while True:
        comm.all_reduce(x, algo="ring")
except hccl_py.HcclError as err:
    noticed = time.monotonic()
    with open(out, "w") as f:
        json.dump({"noticed": noticed, "class": type(err).__name__, "peer": err.peer}, f)
"""


def _free_port() -> int:
    import socket

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def trial(nranks: int, victim: int, timeout_s: float = 60.0) -> dict:
    """One run: start ``nranks``, kill ``victim`` once all are looping; each survivor's report."""
    with tempfile.TemporaryDirectory(prefix="hccl-spread-") as tmp:
        script = Path(tmp) / "rank.py"
        script.write_text(RANK_SCRIPT)
        port = _free_port()
        procs = []
        for rank in range(nranks):
            rank_env = {
                **os.environ,
                env.RANK: str(rank),
                env.WORLD_SIZE: str(nranks),
                env.MASTER_ADDR: "127.0.0.1",
                env.MASTER_PORT: str(port),
                env.HCCL_EXEC_TIMEOUT: str(timeout_s),
                "PYTHONPATH": str(ROOT),
            }
            procs.append(
                subprocess.Popen(
                    [sys.executable, str(script), f"{tmp}/rank{rank}.json"],
                    env=rank_env,
                    stdout=subprocess.DEVNULL,
                    stderr=subprocess.DEVNULL,
                )
            )
        try:
            deadline = time.monotonic() + timeout_s
            while not all(os.path.exists(f"{tmp}/rank{r}.json.ready") for r in range(nranks)):
                if time.monotonic() > deadline:
                    raise RuntimeError("the ranks did not start")
                time.sleep(0.01)
            time.sleep(0.2)  # every rank well inside its loop
            killed = time.monotonic()
            os.kill(procs[victim].pid, signal.SIGKILL)
            for r, proc in enumerate(procs):
                proc.wait(timeout=max(deadline - time.monotonic(), 1.0))
            reports = {}
            for r in range(nranks):
                if r != victim:
                    with open(f"{tmp}/rank{r}.json") as f:
                        reports[r] = json.load(f)
        finally:
            for proc in procs:
                if proc.poll() is None:
                    proc.kill()
                    proc.wait()
    return {
        "spread_s": max(rep["noticed"] for rep in reports.values()) - killed,
        "named": sorted({rep["peer"] for rep in reports.values()}, key=str),
        "per_rank_s": {r: round(rep["noticed"] - killed, 3) for r, rep in reports.items()},
    }


def main(argv: list[str] | None = None) -> int:
    """Run ``python -m benchmarks.failure_spread`` with ``argv``: ``--trials`` trials, then the median
    spread (wall seconds)."""
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("-n", type=int, default=8, help="ranks (default 8)")
    parser.add_argument("--kill", type=int, default=3, help="the rank to SIGKILL (default 3)")
    parser.add_argument("--trials", type=int, default=5, help="runs; the median is reported (default 5)")
    args = parser.parse_args(argv)
    spreads = []
    for i in range(args.trials):
        result = trial(args.n, args.kill)
        spreads.append(result["spread_s"])
        print(
            f"trial {i + 1}: every rank knew after {result['spread_s']:.3f} s; ranks named {result['named']}; "
            f"per rank {result['per_rank_s']}",
            flush=True,
        )
    print(
        f"median spread over {args.trials} trials, {args.n} ranks, rank {args.kill} killed: {statistics.median(spreads):.3f} s"
    )
    return 0


if __name__ == "__main__":
    sys.exit(main())
