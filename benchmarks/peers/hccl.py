"""hccl-py itself: ranks started with ``launch.spawn`` (or already running under hccl-launch).

Calls as a user writes them: ``all_reduce``/``broadcast``/``reduce`` in place on the buffer,
``all_gather``/``reduce_scatter``/``all_to_all``/``scatter``/``gather`` into the staged output
buffer (``out=``; scatter's other ranks pass ``x=None``, gather's no ``out``), ``all_to_all_v``
with equal counts into it, every call with ``algo=--algo``.

Extra columns (the hook for modeled time): list them in ``EXTRA_COLUMNS`` and fill the measured
ones in ``HcclRankComm.extra_start``/``extra_stop``, e.g. once the communicator reports its
modeled clock::

    EXTRA_COLUMNS = (
        ExtraColumn("modeled_us", "model(us)"),
        ExtraColumn("modeled_busbw", "m.busbw", derive=lambda row: row.busbw_for(row.extra["modeled_us"])),
    )
    def extra_start(self):            return self.comm.stats().modeled_s
    def extra_stop(self, start):      return {"modeled_us": (self.comm.stats().modeled_s - start) * 1e6}
"""

from __future__ import annotations

import functools
import os
from collections.abc import Callable
from typing import Any

import numpy as np

from hccl_py import env as envnames

from ..collectives import Collective
from ..collectives import get as get_collective
from ..config import BenchConfig
from ..harness import Backend, BackendError, ExtraColumn, RankComm, rank_main

__all__ = ["HcclBackend", "HcclRankComm", "EXTRA_COLUMNS"]

# Modeled time of the same calls on the job's topology (hccl-launch --topology / HCCL_PY_TOPOLOGY;
# default: a preset for n cards), next to the measured wall time: per iteration, max over ranks.
EXTRA_COLUMNS: tuple[ExtraColumn, ...] = (
    ExtraColumn("modeled_us", "model(us)"),
    ExtraColumn("modeled_busbw", "m.busbw", derive=lambda row: row.busbw_for(row.extra["modeled_us"])),
)

_CALLS = {
    "allreduce": "all_reduce(x) in place",
    "allgather": "all_gather(x, out=buf)",
    "broadcast": "broadcast(x) in place",
    "reduce": "reduce(x) in place",
    "reducescatter": "reduce_scatter(y, out=buf)",
    "alltoall": "all_to_all(x, out=buf)",
    "alltoallv": "all_to_all_v(x, counts, None, buf, counts, None), equal counts",
    "scatter": "scatter(x on root / None, root, out=buf)",
    "gather": "gather(x, root, out=buf on root)",
}


class HcclRankComm(RankComm):
    """A rank's hccl_py communicator, as the harness drives it."""

    extra_columns = EXTRA_COLUMNS

    def __init__(self, comm: Any, algo: str):
        self.comm = comm
        self.algo = algo
        self.rank = comm.rank
        self.size = comm.size
        self._scalar = np.zeros(1, np.float64)
        self._collective = ""

    def bind(
        self, coll: Collective, send: np.ndarray, recv: np.ndarray | None, op: str, root: int
    ) -> Callable[[], np.ndarray | None]:
        c, algo = self.comm, self.algo
        name = coll.name
        self._collective = coll.spec.name
        if name == "allreduce":
            return functools.partial(c.all_reduce, send, op, algo=algo)
        if name == "broadcast":
            return functools.partial(c.broadcast, send, root, algo=algo)
        if name == "reduce":
            return functools.partial(c.reduce, send, root, op, algo=algo)
        if name == "allgather":
            return functools.partial(c.all_gather, send, out=recv, algo=algo)
        if name == "reducescatter":
            return functools.partial(c.reduce_scatter, send, op, out=recv, algo=algo)
        if name == "alltoall":
            return functools.partial(c.all_to_all, send, out=recv, algo=algo)
        if name == "alltoallv":
            counts = [send.size // self.size] * self.size
            return functools.partial(c.all_to_all_v, send, counts, None, recv, counts, None, algo=algo)
        at_root = self.rank == root
        if name == "scatter":
            return functools.partial(c.scatter, send if at_root else None, root, out=recv, algo=algo)
        if name == "gather":
            return functools.partial(c.gather, send, root, out=recv if at_root else None, algo=algo)
        raise ValueError(f"hccl-py has no benchmark binding for {name}")

    def barrier(self) -> None:
        self.comm.barrier()

    def _modeled_s(self) -> float:
        # Only this collective's own calls: barriers and the harness's scalar reductions excluded;
        # all_to_all_v's counts exchange (an allgather, which the harness never calls) included.
        stats = self.comm.stats().by_op
        ops = (self._collective, "allgather") if self._collective == "alltoallv" else (self._collective,)
        return sum(stats[op].modeled_s for op in ops if op in stats)

    def extra_start(self) -> float:
        return self._modeled_s()

    def extra_stop(self, start: float) -> dict[str, float]:
        return {"modeled_us": (self._modeled_s() - start) * 1e6}

    def allreduce_scalar(self, value: float, how: str) -> float:
        self._scalar[0] = value
        self.comm.all_reduce(self._scalar, how)
        return float(self._scalar[0])


def unsupported_reason(cfg: BenchConfig) -> str | None:
    """Why hccl-py would refuse this run (an algorithm it lacks, an op the dtype cannot take)."""
    from hccl_py.algorithms.registry import algos_for, get_schedule
    from hccl_py.dtypes import ReduceOp, check_op_dtype
    from hccl_py.errors import HcclError

    try:
        name = get_collective(cfg.collective).spec.name
        if cfg.algo != "auto" and name == "alltoallv":
            if cfg.algo not in algos_for(name):
                return f"no algorithm {cfg.algo!r} for alltoallv; use one of {', '.join(algos_for(name))}"
        elif cfg.algo != "auto":
            get_schedule(name, cfg.algo)
        if get_collective(cfg.collective).reduces:
            check_op_dtype(ReduceOp.parse(cfg.op), cfg.dt.np, where=cfg.collective)
    except HcclError as err:
        return err.message
    return None


def rank_work(cfg: BenchConfig, progress_path: str | None, repeats: int = 1) -> list[list[dict[str, Any]]] | None:
    """What each spawned rank runs (module level: launch.spawn pickles it by name)."""
    import hccl_py

    comm = hccl_py.init()
    try:
        return rank_main(HcclRankComm(comm, cfg.algo), cfg, progress_path, repeats)
    finally:
        comm.destroy()


class HcclBackend(Backend):
    """hccl-py itself (always run): ``cfg.nranks`` ranks started with ``launch.spawn``, ``env`` added
    to their environment."""

    name = "hccl"
    label = "hccl-py"
    extra_columns = EXTRA_COLUMNS

    def unavailable(self) -> str | None:
        return None

    def unsupported(self, cfg: BenchConfig) -> str | None:
        return unsupported_reason(cfg)

    def version(self) -> str:
        import hccl_py

        return f"hccl-py {hccl_py.__version__}"

    def mode(self, coll: Collective) -> str:
        return _CALLS[coll.name]

    env: dict[str, str] = {}  # rank environment on top of the caller's

    def run(self, cfg: BenchConfig, progress_path: str | None, workdir: str) -> list[dict[str, Any]]:
        import launch

        try:
            results = launch.spawn(
                rank_work, cfg.nranks, args=(cfg, progress_path), timeout=cfg.timeout_s, env=self.env
            )
        except launch.SpawnError as err:
            raise BackendError(f"hccl-py ranks failed: {err}") from err
        assert isinstance(results, list) and results[0] is not None
        return results[0][0]


def in_place_env() -> dict[str, str] | None:
    """If this process is a rank of a job started by someone else, the env hccl_py.init needs.

    hccl-launch / torchrun: None needed beyond what is set (returns {}). mpiexec (MPICH's
    PMI_RANK/PMI_SIZE, Open MPI's OMPI_COMM_WORLD_*): RANK/WORLD_SIZE from those, MASTER_ADDR
    127.0.0.1 and MASTER_PORT as given, else chosen by rank 0 and shared through mpi4py.
    Not under a launcher: None.
    """
    env = os.environ
    if (envnames.RANK_ID in env and envnames.RANK_SIZE in env) or (envnames.RANK in env and envnames.WORLD_SIZE in env):
        return {}
    for rank_var, size_var in (
        (envnames.PMI_RANK, envnames.PMI_SIZE),
        (envnames.OMPI_COMM_WORLD_RANK, envnames.OMPI_COMM_WORLD_SIZE),
    ):
        if rank_var in env and size_var in env:
            out = {
                envnames.RANK: env[rank_var],
                envnames.WORLD_SIZE: env[size_var],
                envnames.MASTER_ADDR: env.get(envnames.MASTER_ADDR, "127.0.0.1"),
            }
            out[envnames.MASTER_PORT] = env.get(envnames.MASTER_PORT) or _mpi_shared_port()
            return out
    return None


def _mpi_shared_port() -> str:
    try:
        from mpi4py import MPI
    except ImportError:
        raise SystemExit(
            "hccl-bench under mpiexec: set MASTER_PORT for hccl-py's rendezvous "
            "(mpiexec -n 4 -genv MASTER_PORT 29555 hccl-bench ...) or install mpi4py"
        ) from None
    import socket

    port = None
    if MPI.COMM_WORLD.rank == 0:
        with socket.socket() as s:
            s.bind(("127.0.0.1", 0))
            port = s.getsockname()[1]
    return str(MPI.COMM_WORLD.bcast(port, root=0))


class HcclUnmodeledBackend(HcclBackend):
    """hccl-py with the modeled clock switched off (``HCCL_PY_MODELED_TIME=0``): run alternating
    with hccl-py in one invocation, its ratio is what the modeled-time bookkeeping costs, measured
    under the same machine conditions (``--vs unmodeled``)."""

    name = "unmodeled"
    label = "hccl-py, unmodeled"
    env = {envnames.HCCL_PY_MODELED_TIME: "0"}

    def version(self) -> str:
        return f"{super().version()} with HCCL_PY_MODELED_TIME=0"
