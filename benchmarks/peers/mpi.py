"""mpi4py on MPICH from the ``mpich`` wheel (no system MPI needed): ``pip install -e '.[mpi]'``.

The driver starts the ranks with that wheel's mpiexec (found next to this Python)::

    mpiexec -n N python -m benchmarks.peers.mpi_worker --config cfg.json --out rows.json

Buffer-based calls on numpy arrays, in place where MPI has it: ``Allreduce(IN_PLACE, x)``,
``Bcast(x)``, ``Reduce(IN_PLACE, x)`` on root, ``Allgather(x, out)``,
``Reduce_scatter_block(y, out)``, ``Alltoall(x, out)``, ``Alltoallv`` with equal counts,
``Scatter``/``Gather`` (the buffer that only the root has is ``None`` elsewhere). MPI has no bfloat16 reductions; bf16 copies go as 16-bit words.
"""

from __future__ import annotations

import functools
import importlib.metadata
import shutil
import sys
import sysconfig
from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np

from ..collectives import Collective
from ..collectives import get as get_collective
from ..config import BFLOAT16, BenchConfig
from ..harness import Backend, RankComm
from .base import importable, read_result, run_workers, worker_env

__all__ = ["MpiBackend", "MpiRankComm", "find_mpiexec"]

_CALLS = {
    "allreduce": "Allreduce(IN_PLACE, x)",
    "allgather": "Allgather(x, out)",
    "broadcast": "Bcast(x)",
    "reduce": "Reduce(IN_PLACE, x) on root",
    "reducescatter": "Reduce_scatter_block(y, out)",
    "alltoall": "Alltoall(x, out)",
    "alltoallv": "Alltoallv([x, counts, displs], [out, counts, displs]), equal counts",
    "scatter": "Scatter(x on root / None, out, root)",
    "gather": "Gather(x, out on root / None, root)",
}


def find_mpiexec() -> str | None:
    """The mpiexec beside this interpreter (the mpich wheel's), else one on PATH."""
    for folder in (sysconfig.get_path("scripts"), str(Path(sys.executable).parent)):
        candidate = Path(folder) / "mpiexec"
        if candidate.is_file():
            return str(candidate)
    return shutil.which("mpiexec")


class MpiRankComm(RankComm):
    """A rank's MPI.COMM_WORLD, as the harness drives it."""

    def __init__(self) -> None:
        from mpi4py import MPI

        self.MPI = MPI
        self.comm = MPI.COMM_WORLD
        self.rank = self.comm.Get_rank()
        self.size = self.comm.Get_size()
        self._ops = {"sum": MPI.SUM, "prod": MPI.PROD, "max": MPI.MAX, "min": MPI.MIN}

    def _buf(self, a: np.ndarray) -> Any:
        if a.dtype == BFLOAT16:  # copies only (unsupported() keeps bf16 reductions away)
            return [a.view(np.uint16), self.MPI.UINT16_T]
        return a

    def _vbuf(self, a: np.ndarray, layout: tuple[list[int], list[int]]) -> Any:
        """``a`` with counts and displacements, as MPI's vector collectives take a buffer."""
        if a.dtype == BFLOAT16:
            return [a.view(np.uint16), layout, self.MPI.UINT16_T]
        return [a, layout]

    def bind(
        self, coll: Collective, send: np.ndarray, recv: np.ndarray | None, op: str, root: int
    ) -> Callable[[], np.ndarray | None]:
        c, MPI = self.comm, self.MPI
        mop = self._ops[op]
        name = coll.name
        if name == "allreduce":
            return functools.partial(c.Allreduce, MPI.IN_PLACE, self._buf(send), mop)
        if name == "broadcast":
            return functools.partial(c.Bcast, self._buf(send), root)
        if name == "reduce":
            if self.rank == root:
                return functools.partial(c.Reduce, MPI.IN_PLACE, self._buf(send), mop, root)
            return functools.partial(c.Reduce, self._buf(send), None, mop, root)
        assert recv is not None
        if name == "allgather":
            return functools.partial(c.Allgather, self._buf(send), self._buf(recv))
        if name == "reducescatter":
            return functools.partial(c.Reduce_scatter_block, self._buf(send), self._buf(recv), mop)
        if name == "alltoall":
            return functools.partial(c.Alltoall, self._buf(send), self._buf(recv))
        if name == "alltoallv":
            block = send.size // self.size
            layout = ([block] * self.size, [block * j for j in range(self.size)])
            return functools.partial(c.Alltoallv, self._vbuf(send, layout), self._vbuf(recv, layout))
        at_root = self.rank == root
        if name == "scatter":
            return functools.partial(c.Scatter, self._buf(send) if at_root else None, self._buf(recv), root)
        if name == "gather":
            return functools.partial(c.Gather, self._buf(send), self._buf(recv) if at_root else None, root)
        raise ValueError(f"no MPI binding for {name}")

    def barrier(self) -> None:
        self.comm.Barrier()

    def allreduce_scalar(self, value: float, how: str) -> float:
        return float(self.comm.allreduce(value, op=self._ops[how]))


class MpiBackend(Backend):
    """MPICH through mpi4py (``--vs mpi``): ``cfg.nranks`` ``mpi_worker`` processes under ``mpiexec -n``."""

    name = "mpi"
    label = "MPICH (mpi4py)"

    def unavailable(self) -> str | None:
        if not importable("mpi4py"):
            return "mpi4py is not installed (pip install -e '.[mpi]' brings mpi4py and MPICH)"
        if find_mpiexec() is None:
            return "no mpiexec found (pip install -e '.[mpi]' brings MPICH's)"
        return None

    def unsupported(self, cfg: BenchConfig) -> str | None:
        if cfg.collective not in _CALLS:
            return f"no MPI binding for {cfg.collective}"
        if cfg.dt.name == "bf16" and get_collective(cfg.collective).reduces:
            return "MPI has no bfloat16 reductions"
        return None

    def version(self) -> str:
        def ver(dist: str) -> str | None:
            try:
                return importlib.metadata.version(dist)
            except importlib.metadata.PackageNotFoundError:
                return None

        mpich = ver("mpich")
        return f"{'MPICH ' + mpich if mpich else 'system MPI'} via mpi4py {ver('mpi4py')}"

    def mode(self, coll: Collective) -> str:
        return _CALLS[coll.name]

    def run(self, cfg: BenchConfig, progress_path: str | None, workdir: str) -> list[dict[str, Any]]:
        mpiexec = find_mpiexec()
        assert mpiexec is not None
        cfg_path = Path(workdir) / "mpi-config.json"
        out_path = Path(workdir) / "mpi-rows.json"
        cfg_path.write_text(cfg.to_json())
        out_path.unlink(missing_ok=True)
        cmd = [
            mpiexec,
            "-n",
            str(cfg.nranks),
            sys.executable,
            "-m",
            "benchmarks.peers.mpi_worker",
            "--config",
            str(cfg_path),
            "--out",
            str(out_path),
        ]
        if progress_path:
            cmd += ["--progress", progress_path]
        run_workers([cmd], worker_env(), cfg.timeout_s, "mpi")
        return read_result(str(out_path), "mpi")
