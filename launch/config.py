"""The launch configuration: what ``hccl-launch``'s command line means, as plain data.

Kept apart from argparse (``launch/cli.py``) so the supervisor and tests build it directly::

    cfg = LaunchConfig(nproc=4, target="infer.py", args=("--batch", "8"))
    cfg.command()   # [sys.executable, "infer.py", "--batch", "8"]
"""

from __future__ import annotations

import sys
from dataclasses import dataclass, field
from pathlib import Path

from hccl_py.errors import HcclParamError
from hccl_py.faults import check_ranks, parse_fault


@dataclass(frozen=True)
class LaunchConfig:
    """One hccl-launch job: N ranks of the same program on this host.

    ``target`` is a script path, or a module name when ``is_module`` (``python -m target``).
    ``master_port`` 0 picks a free port for the rendezvous store. ``timeout_s`` ``None`` means no
    wall-clock limit for the whole job; ``grace_s`` is the SIGTERM/SIGINT -> SIGKILL grace.
    """

    nproc: int
    target: str
    args: tuple[str, ...] = ()
    is_module: bool = False
    log_dir: Path | None = None
    grace_s: float = 5.0
    timeout_s: float | None = None
    master_addr: str = "127.0.0.1"
    master_port: int = 0
    topology: str | None = None  # preset name; None: the default for nproc cards
    rank_table: Path | None = None  # an HCCL rank-table JSON (RANK_TABLE_FILE)
    trace_dir: Path | None = None  # every rank writes its Chrome trace here; merged into trace.json
    figures: Path | None = None  # JSON overriding link/card figures (HCCL_PY_FIGURES)
    faults: tuple[str, ...] = ()  # fault specs (HCCL_PY_FAULTS), checked before any rank starts
    python: str = field(default_factory=lambda: sys.executable)

    def __post_init__(self) -> None:
        if self.nproc < 1:
            raise ValueError(f"nproc must be >= 1, got {self.nproc}")
        if self.grace_s < 0:
            raise ValueError(f"grace must be >= 0 seconds, got {self.grace_s}")
        if self.timeout_s is not None and self.timeout_s <= 0:
            raise ValueError(f"timeout must be > 0 seconds, got {self.timeout_s}")
        if not 0 <= self.master_port <= 65535:
            raise ValueError(f"master port must be in 0..65535, got {self.master_port}")
        try:
            check_ranks([parse_fault(spec) for spec in self.faults], self.nproc)
        except HcclParamError as err:
            raise ValueError(err.message) from None

    def modeled_env(self) -> dict[str, str]:
        """Environment that chooses the modeled cluster and the trace output for every rank."""
        out = {}
        if self.topology:
            out["HCCL_PY_TOPOLOGY"] = self.topology
        if self.rank_table is not None:
            out["RANK_TABLE_FILE"] = str(self.rank_table.resolve())
        if self.trace_dir is not None:
            out["HCCL_PY_TRACE_DIR"] = str(self.trace_dir.resolve())
        if self.figures is not None:
            out["HCCL_PY_FIGURES"] = str(self.figures.resolve())
        if self.faults:
            out["HCCL_PY_FAULTS"] = ";".join(self.faults)
        return out

    def command(self) -> list[str]:
        """The argv every rank runs (identical for all ranks; ranks differ only by env)."""
        head = [self.python, "-m", self.target] if self.is_module else [self.python, self.target]
        return [*head, *self.args]
