"""``hccl-launch``: run N ranks of a Python program on this host, torchrun-style.

    hccl-launch -n 4 infer.py --batch 8
    hccl-launch -n 4 -m mypkg.infer --batch 8
    hccl-launch -n 8 --log-dir logs --timeout 600 infer.py
    hccl-launch -n 8 --npu --topology ascend910b-8p bench_collective.py all_reduce   # a script written for Ascend
    hccl-launch --nnodes 2 --node-rank 0 --master-addr 10.0.0.1 --master-port 29500 -n 8 infer.py   # on host 1
    hccl-launch --nnodes 2 --node-rank 1 --master-addr 10.0.0.1 --master-port 29500 -n 8 infer.py   # on host 2

Every rank gets RANK_ID/RANK_SIZE/DEVICE_ID (HCCL names), RANK/WORLD_SIZE/LOCAL_RANK/
LOCAL_WORLD_SIZE (torchrun names), HCCL_PY_STORE_ADDR/HCCL_PY_STORE_PORT (the rendezvous store the
launcher hosts), MASTER_ADDR/MASTER_PORT (a free port for torch's ``env://`` rendezvous: torch
scripts run as under torchrun) and HCCL_PY_JOB_ID. Output lines are prefixed with ``[rank] ``. If a rank fails, the
others are stopped and a root-cause report is printed; the exit status is the failing rank's.
Across nodes, global rank = node_rank * nproc + local rank (or as the rank table places them),
node 0's launcher hosts the store, and ranks use shared memory within a host and TCP across.
"""

from __future__ import annotations

import argparse
import os
import sys
import tempfile
from collections.abc import Mapping, Sequence
from pathlib import Path

from hccl_py import env
from hccl_py.errors import HcclError, HcclParamError
from hccl_py.faults import check_ranks, parse_faults
from hccl_py.job import check_user_settings
from topology import RankTable, Topology, TopologyError

from .config import LaunchConfig
from .npu import check_ready as check_npu_ready
from .supervisor import EXIT_TIMEOUT, Supervisor

__all__ = ["LaunchConfig", "build_parser", "parse_args", "main"]


def build_parser() -> argparse.ArgumentParser:
    """The argparse parser of hccl-launch (options first, then the program and its arguments)."""
    parser = argparse.ArgumentParser(
        prog="hccl-launch",
        description="Run N ranks (one simulated Ascend NPU card each) of a Python program with hccl-py.",
        epilog=(
            f"exit status: 0 if every rank exits 0; the first failing rank's code (128+signal if it "
            f"was killed); {EXIT_TIMEOUT} on --timeout; 130 on Ctrl-C."
        ),
    )
    parser.add_argument(
        "-n",
        "--nproc",
        "--nproc-per-node",
        dest="nproc",
        type=int,
        required=True,
        help="number of ranks (simulated cards) to start on this node",
    )
    parser.add_argument(
        "--nnodes",
        type=int,
        default=1,
        help="number of nodes (hosts), each running one hccl-launch with -n ranks (default 1)",
    )
    parser.add_argument(
        "--node-rank",
        type=int,
        default=0,
        help="this node's index in 0..nnodes-1; node 0 hosts the rendezvous store (default 0)",
    )
    parser.add_argument(
        "-m", "--module", dest="is_module", action="store_true", help="run the target as a module, like `python -m`"
    )
    parser.add_argument(
        "--log-dir",
        type=Path,
        default=None,
        metavar="DIR",
        help="also write each rank's stdout+stderr to DIR/rank_<r>.log",
    )
    parser.add_argument(
        "--grace",
        type=float,
        default=5.0,
        metavar="SECONDS",
        help="time between SIGTERM (or forwarded SIGINT) and SIGKILL when stopping ranks (default 5)",
    )
    parser.add_argument(
        "--timeout",
        type=float,
        default=None,
        metavar="SECONDS",
        help=f"wall-clock limit for the whole job; on expiry all ranks are stopped, exit {EXIT_TIMEOUT}",
    )
    parser.add_argument(
        "--master-addr",
        default="127.0.0.1",
        help="address the rendezvous store binds and ranks connect to; across nodes: node 0's address "
        "(default 127.0.0.1)",
    )
    parser.add_argument(
        "--master-port",
        type=int,
        default=0,
        help="port of the rendezvous store (default: a free port; required with --nnodes > 1)",
    )
    parser.add_argument(
        "--topology",
        default=None,
        metavar="NAME",
        help="modeled cluster preset, e.g. ascend910-8p, mixed-4p, 2x8p-roce (default: one for N cards; see hccl-topo presets)",
    )
    parser.add_argument(
        "--rank-table",
        type=Path,
        default=None,
        metavar="FILE",
        help="HCCL rank-table JSON describing the cluster (with --topology: the server wiring)",
    )
    parser.add_argument(
        "--figures",
        type=Path,
        default=None,
        metavar="FILE",
        help="JSON file overriding any link or card figure of the topology (see hccl-topo show)",
    )
    parser.add_argument(
        "--fault",
        action="append",
        default=[],
        metavar="SPEC",
        help="inject a fault (repeatable), e.g. rank=2,op=allreduce,seq=3,action=hang; "
        "actions: hang, crash, delay, slow, degrade, drop (see hccl_py/faults.py)",
    )
    parser.add_argument(
        "--trace",
        type=Path,
        default=None,
        metavar="DIR",
        help="write a Chrome trace (modeled and wall timelines, one process per rank) to DIR/trace.json",
    )
    parser.add_argument(
        "--npu",
        action="store_true",
        help="run a script written for Ascend (torch_npu, torch.npu, transfer_to_npu) unchanged, as under "
        "hccl-npu: its npu tensors live on hccl-py's simulated npu device, one card per rank, and its ops "
        "and events run on the modeled card's clock (see docs/torch.md)",
    )
    parser.add_argument(
        "--start",
        choices=("fork", "exec"),
        default="fork",
        help="how ranks start: fork = copies of this launcher, which has imported numpy and hccl_py "
        "already (fast); exec = a fresh `python script.py` each, with the interpreter's own start-up "
        "(default fork; see README, Commands)",
    )
    parser.add_argument("target", help="the script to run, or the module name with -m")
    parser.add_argument("args", nargs=argparse.REMAINDER, help="arguments passed to every rank")
    return parser


def parse_args(argv: Sequence[str] | None = None, environ: Mapping[str, str] | None = None) -> LaunchConfig:
    """Turn hccl-launch's command line into a :class:`LaunchConfig` (exits 2 on bad usage).

    What a flag leaves unset is taken from the variable the ranks would read in ``environ``
    (default ``os.environ``): HCCL_PY_TOPOLOGY, RANK_TABLE_FILE, HCCL_PY_FIGURES, HCCL_PY_FAULTS
    and HCCL_PY_TRACE_DIR, so the launcher checks, describes and merges what the ranks use.

    Example: ``parse_args(["-n", "2", "infer.py", "--batch", "8"]).args == ("--batch", "8")``.
    """
    parser = build_parser()
    ns = parser.parse_args(argv)
    environ = os.environ if environ is None else environ
    if not ns.is_module and not Path(ns.target).is_file():
        parser.error(f"script {ns.target!r} not found (use -m for a module)")
    faults = tuple(ns.fault)
    if not faults:
        faults = _env_faults(parser, environ, ns.nproc * ns.nnodes)
    try:
        return LaunchConfig(
            nproc=ns.nproc,
            target=ns.target,
            args=tuple(ns.args),
            is_module=ns.is_module,
            log_dir=ns.log_dir,
            grace_s=ns.grace,
            timeout_s=ns.timeout,
            master_addr=ns.master_addr,
            master_port=ns.master_port,
            topology=ns.topology if ns.topology is not None else _env_value(environ, env.HCCL_PY_TOPOLOGY),
            rank_table=ns.rank_table if ns.rank_table is not None else _env_path(environ, env.RANK_TABLE_FILE),
            trace_dir=ns.trace if ns.trace is not None else _env_path(environ, env.HCCL_PY_TRACE_DIR),
            figures=ns.figures if ns.figures is not None else _env_path(environ, env.HCCL_PY_FIGURES),
            faults=faults,
            nnodes=ns.nnodes,
            node_rank=ns.node_rank,
            npu=ns.npu,
            start=ns.start,
        )
    except ValueError as err:
        parser.error(str(err))
        raise  # unreachable: parser.error exits


def _env_value(environ: Mapping[str, str], name: str) -> str | None:
    value = environ.get(name, "").strip()
    return value or None  # blank: unset, as the ranks read it


def _env_path(environ: Mapping[str, str], name: str) -> Path | None:
    value = _env_value(environ, name)
    return None if value is None else Path(value)


def _env_faults(parser: argparse.ArgumentParser, environ: Mapping[str, str], world_size: int) -> tuple[str, ...]:
    """HCCL_PY_FAULTS's specs (when no --fault is given), checked as the ranks would parse them."""
    text = environ.get(env.HCCL_PY_FAULTS)
    try:
        check_ranks(parse_faults(text), max(world_size, 1))
    except HcclParamError as err:
        parser.error(f"{env.HCCL_PY_FAULTS}={text!r}: {err.message}")
    return tuple(spec.strip() for spec in (text or "").split(";") if spec.strip())


def _from_environment(config: LaunchConfig, *names: str) -> str:
    """`` (from the environment: NAME='value')`` for those of ``names`` the config took from the
    environment (see :func:`parse_args`), to say where a refused value came from."""
    taken = {
        env.HCCL_PY_TOPOLOGY: config.topology,
        env.RANK_TABLE_FILE: config.rank_table,
        env.HCCL_PY_FIGURES: config.figures,
        env.HCCL_PY_TRACE_DIR: config.trace_dir,
    }
    found = [
        f"{name}={os.environ[name]!r}"
        for name in names
        if taken[name] is not None and _env_value(os.environ, name) == str(taken[name])
    ]
    return f" (from the environment: {', '.join(found)})" if found else ""


def check_trace_dir(config: LaunchConfig) -> None:
    """Make the trace folder (``--trace`` or HCCL_PY_TRACE_DIR) and check that files can be
    written there, before any rank starts; HcclParamError saying why not."""
    if config.trace_dir is None:
        return
    try:
        config.trace_dir.mkdir(parents=True, exist_ok=True)
        with tempfile.TemporaryFile(dir=config.trace_dir):
            pass
    except OSError as err:
        raise HcclParamError(
            f"trace folder {config.trace_dir}: cannot write the ranks' traces there: "
            f"{err.strerror or err}" + (f" ({err.filename})" if err.filename else ""),
            arg="--trace",
            value=str(config.trace_dir),
            errno=err.errno,
        ) from None


def describe_cluster(config: LaunchConfig) -> str:
    """The modeled cluster the ranks will see, checked here so a bad name fails before any rank
    starts: 'topology ascend910-8p (default for 4 cards)'."""
    world = config.world_size
    if config.rank_table is not None:
        topo = Topology.from_rank_table(
            RankTable.load(config.rank_table), preset=config.topology, figures=config.figures
        )
        how = f"rank table {config.rank_table}"
    else:
        name = config.topology or config.default_topology()
        topo = Topology.preset(name, n=world, figures=config.figures)
        default = f"{config.nnodes} nodes x {config.nproc} cards" if config.nnodes > 1 else f"{config.nproc} cards"
        how = f"topology {name}" + ("" if config.topology else f" (default for {default})")
    if topo.num_ranks != world:
        what = (
            f"--nnodes {config.nnodes} x -n {config.nproc} = {world}" if config.nnodes > 1 else f"-n is {config.nproc}"
        )
        raise TopologyError(f"{how} has {topo.num_ranks} cards but {what}", field="nproc")
    if config.nnodes > 1:
        ranks = [r for r, _ in config.node_ranks()]
        servers = sorted({topo.server_of(r) for r in ranks})
        where = f"server {servers[0]}" if len(servers) == 1 else f"servers {servers}"
        return f"node {config.node_rank} of {config.nnodes}: ranks {_span(ranks)} of {world}, modeled {where} of {how}"
    return how


def _span(ranks: list[int]) -> str:
    return (
        f"{ranks[0]}-{ranks[-1]}"
        if ranks == list(range(ranks[0], ranks[-1] + 1)) and len(ranks) > 1
        else ",".join(map(str, ranks))
    )


def main(argv: Sequence[str] | None = None) -> int:
    """Entry point of the ``hccl-launch`` console script; returns the exit status."""
    config = parse_args(argv)
    try:
        check_user_settings()  # a bad HCCL_* value fails here once, not in every rank
        if config.npu:
            check_npu_ready()  # torch missing, or a real torch_npu beside: said before any rank starts
    except HcclError as err:
        print(f"hccl-launch: {err}", file=sys.stderr)
        return 2
    try:
        if config.nnodes > 1:
            print(f"hccl-launch: {describe_cluster(config)}", file=sys.stderr, flush=True)
        else:
            print(f"hccl-launch: {config.nproc} ranks on {describe_cluster(config)}", file=sys.stderr, flush=True)
    except TopologyError as err:
        origin = _from_environment(config, env.HCCL_PY_TOPOLOGY, env.RANK_TABLE_FILE, env.HCCL_PY_FIGURES)
        print(f"hccl-launch: {err}{origin}", file=sys.stderr)
        return 2
    try:
        check_trace_dir(config)  # last: a job refused for another reason leaves no folder behind
    except HcclError as err:
        print(f"hccl-launch: {err}{_from_environment(config, env.HCCL_PY_TRACE_DIR)}", file=sys.stderr)
        return 2
    try:
        return Supervisor(config).run()
    except (HcclError, OSError) as err:
        print(f"hccl-launch: {err}", file=sys.stderr)
        return 1


if __name__ == "__main__":
    sys.exit(main())
