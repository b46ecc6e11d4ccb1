"""The launch configuration: what ``hccl-launch``'s command line means, as plain data.

Kept apart from argparse (``launch/cli.py``) so the supervisor and tests build it directly::

    cfg = LaunchConfig(nproc=4, target="infer.py", args=("--batch", "8"))
    cfg.command()   # [sys.executable, "infer.py", "--batch", "8"]

Several hosts form one job when each runs a launcher with the same ``nnodes``, its own
``node_rank`` and the same master address and port (node 0 hosts the store there)::

    LaunchConfig(nproc=4, target="infer.py", nnodes=2, node_rank=1, master_addr="10.0.0.1", master_port=29500)
"""

from __future__ import annotations

import math
import os
import sys
import threading
from dataclasses import dataclass, field
from pathlib import Path

from hccl_py import env
from hccl_py.errors import HcclParamError
from hccl_py.faults import check_ranks, parse_fault
from topology import RankTable, TopologyError, default_preset

from .npu import NPU_STANDIN, npu_environment  # noqa: F401  (NPU_STANDIN: where --npu's torch_npu is)

START_METHODS = ("fork", "exec")  # how hccl-launch starts ranks (--start)


@dataclass(frozen=True)
class LaunchConfig:
    """One hccl-launch job: N ranks of the same program on this host.

    ``target`` is a script path, or a module name when ``is_module`` (``python -m target``).
    ``master_port`` 0 picks a free port for the rendezvous store. ``timeout_s`` ``None`` means no
    wall-clock limit for the whole job (any other value is finite and > 0); ``grace_s`` is the
    SIGTERM/SIGINT -> SIGKILL grace.
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
    nnodes: int = 1  # launchers (hosts) in the job; nproc ranks each
    node_rank: int = 0  # this launcher's place among them; node 0 hosts the store
    npu: bool = False  # the torch_npu stand-in first on the ranks' path (hccl-launch --npu)
    python: str = field(default_factory=lambda: sys.executable)
    start: str = "fork"  # "fork": ranks forked from the warm launcher (launch/fork.py); "exec": fresh interpreters

    def __post_init__(self) -> None:
        if self.nproc < 1:
            raise ValueError(f"nproc must be >= 1, got {self.nproc}")
        if not (math.isfinite(self.grace_s) and self.grace_s >= 0):
            raise ValueError(f"grace must be a finite number of seconds >= 0, got {self.grace_s}")
        if self.timeout_s is not None and not (math.isfinite(self.timeout_s) and self.timeout_s > 0):
            raise ValueError(
                f"timeout must be a finite number of seconds > 0, got {self.timeout_s} "
                "(for no wall-clock limit, leave --timeout out)"
            )
        if not 0 <= self.master_port <= 65535:
            raise ValueError(f"master port must be in 0..65535, got {self.master_port}")
        if self.nnodes < 1:
            raise ValueError(f"nnodes must be >= 1, got {self.nnodes}")
        if not 0 <= self.node_rank < self.nnodes:
            raise ValueError(
                f"node rank must be in 0..{self.nnodes - 1} (--nnodes {self.nnodes}), got {self.node_rank}"
            )
        if self.start not in START_METHODS:
            raise ValueError(f"start must be one of {', '.join(START_METHODS)}, got {self.start!r}")
        if self.nnodes > 1 and self.master_port == 0:
            raise ValueError(
                "--nnodes > 1 needs --master-port (and --master-addr: node 0's address): "
                "every node's launcher must find node 0's store there"
            )
        try:
            check_ranks([parse_fault(spec) for spec in self.faults], self.world_size)
        except HcclParamError as err:
            raise ValueError(err.message) from None

    @property
    def world_size(self) -> int:
        """Ranks in the whole job: ``nnodes * nproc``."""
        return self.nnodes * self.nproc

    def default_topology(self) -> str:
        """The preset when none is given: one for ``nproc`` cards on one node; across nodes one
        modeled server per node (``2x4p-roce`` for 2 nodes of 4), so ``server_of(rank)`` is the
        rank's node."""
        if self.nnodes > 1 and self.nproc <= 8:
            return f"{self.nnodes}x{self.nproc}p-roce"
        return default_preset(self.world_size)

    def node_ranks(self) -> list[tuple[int, int]]:
        """(world rank, device id) of the ranks this node runs, in local-rank order.

        Without a rank table: ranks ``node_rank * nproc ...`` on devices 0..nproc-1. With one
        across nodes, node k runs the ranks of the table's k-th server (``server_list[k]``) on
        the devices the table gives them, so the table maps ranks to hosts.
        """
        if self.nnodes == 1 or self.rank_table is None:
            base = self.node_rank * self.nproc
            return [(base + i, i) for i in range(self.nproc)]
        table = RankTable.load(self.rank_table)
        if table.server_count != self.nnodes:
            raise TopologyError(
                f"rank table {self.rank_table} has {table.server_count} servers but --nnodes is {self.nnodes}; "
                "each node runs one server's ranks",
                field="nnodes",
                value=self.nnodes,
                rule="const",
                expected=table.server_count,
            )
        server = table.servers[self.node_rank]
        if len(server.devices) != self.nproc:
            raise TopologyError(
                f"rank table {self.rank_table}: server_list[{self.node_rank}] (server_id {server.server_id}) "
                f"has {len(server.devices)} devices but -n is {self.nproc}",
                field="nproc",
                value=self.nproc,
                rule="const",
                expected=len(server.devices),
            )
        return sorted((dev.rank_id, dev.device_id) for dev in server.devices)

    def modeled_env(self) -> dict[str, str]:
        """Environment that chooses the modeled cluster and the trace output for every rank."""
        out = {}
        if self.topology:
            out[env.HCCL_PY_TOPOLOGY] = self.topology
        elif self.nnodes > 1 and self.rank_table is None:
            out[env.HCCL_PY_TOPOLOGY] = self.default_topology()  # ranks would otherwise guess one host
        if self.rank_table is not None:
            out[env.RANK_TABLE_FILE] = str(self.rank_table.resolve())
        if self.trace_dir is not None:
            out[env.HCCL_PY_TRACE_DIR] = str(self.trace_dir.resolve())
        if self.figures is not None:
            out[env.HCCL_PY_FIGURES] = str(self.figures.resolve())
        if self.faults:
            out[env.HCCL_PY_FAULTS] = ";".join(self.faults)
        return out

    def npu_env(self, environ: dict[str, str]) -> dict[str, str]:
        """With ``npu``: what hccl-npu sets (``launch.npu.npu_environment``), each rank's cards being
        its host's LOCAL_WORLD_SIZE. Empty otherwise."""
        return npu_environment(environ) if self.npu else {}

    def forks(self) -> bool:
        """Whether ranks are forked from this (warm) launcher: ``start`` is "fork", they run this
        very interpreter, and the process has no other thread yet (a fork copies only the
        calling thread; otherwise ranks are exec'd)."""
        return (
            self.start == "fork"
            and self.python == sys.executable
            and hasattr(os, "fork")
            and threading.active_count() == 1
        )

    def argv(self) -> list[str]:
        """The rank's ``sys.argv``: the script (or module name) and its arguments."""
        return [self.target, *self.args]

    def command(self) -> list[str]:
        """The argv every rank runs (identical for all ranks; ranks differ only by env)."""
        head = [self.python, "-m", self.target] if self.is_module else [self.python, self.target]
        return [*head, *self.args]
