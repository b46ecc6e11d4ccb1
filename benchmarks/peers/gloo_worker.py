"""One torch gloo rank of an hccl-bench run (started by the driver); rank 0 writes the rows.

python -m benchmarks.peers.gloo_worker --config cfg.json --rank 0 --init file:///tmp/x --out rows.json
"""

from __future__ import annotations

import argparse
from pathlib import Path

from ..config import BenchConfig
from ..harness import rank_main
from .base import write_result
from .gloo import GlooRankComm


def main(argv: list[str] | None = None) -> None:
    """Run one gloo rank of a sweep with ``argv`` (see the module doc); rank 0 writes its rows to
    ``--out``."""
    parser = argparse.ArgumentParser(prog="benchmarks.peers.gloo_worker")
    parser.add_argument("--config", required=True, help="BenchConfig as JSON (file)")
    parser.add_argument("--rank", type=int, required=True)
    parser.add_argument("--init", required=True, help="torch.distributed init_method (file:// or tcp://)")
    parser.add_argument("--out", required=True, help="rank 0 writes its rows here (JSON)")
    parser.add_argument("--progress", help="rank 0 appends a byte per finished size")
    args = parser.parse_args(argv)
    cfg = BenchConfig.from_json(Path(args.config).read_text())
    comm = GlooRankComm(args.rank, cfg.nranks, args.init, cfg.timeout_s)
    runs = rank_main(comm, cfg, args.progress)
    if runs is not None:
        write_result(args.out, runs[0])


if __name__ == "__main__":
    main()
