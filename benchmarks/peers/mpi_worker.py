"""One MPI rank of an hccl-bench run (started by the driver through mpiexec); rank 0 writes the rows.

mpiexec -n 2 python -m benchmarks.peers.mpi_worker --config cfg.json --out rows.json
"""

from __future__ import annotations

import argparse
from pathlib import Path

from ..config import BenchConfig
from ..harness import rank_main
from .base import write_result
from .mpi import MpiRankComm


def main(argv: list[str] | None = None) -> None:
    """Run one MPI rank of a sweep with ``argv`` (under ``mpiexec``); rank 0 writes its rows to
    ``--out``."""
    parser = argparse.ArgumentParser(prog="benchmarks.peers.mpi_worker")
    parser.add_argument("--config", required=True, help="BenchConfig as JSON (file)")
    parser.add_argument("--out", required=True, help="rank 0 writes its rows here (JSON)")
    parser.add_argument("--progress", help="rank 0 appends a byte per finished size")
    args = parser.parse_args(argv)
    cfg = BenchConfig.from_json(Path(args.config).read_text())
    runs = rank_main(MpiRankComm(), cfg, args.progress)
    if runs is not None:
        write_result(args.out, runs[0])


if __name__ == "__main__":
    main()
