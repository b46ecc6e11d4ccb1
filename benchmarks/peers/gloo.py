"""torch.distributed with the gloo backend on the CPU (``pip install torch==2.13.0``).

One subprocess per rank, joined through a ``file://`` rendezvous in the run's temporary folder::

    python -m benchmarks.peers.gloo_worker --config cfg.json --rank R --init file:///tmp/.../gloo-init ...

In place where torch has it: ``all_reduce(t)``, ``broadcast(t)``, ``reduce(t)``; out of place
``all_gather_single(out, t)`` and ``reduce_scatter_single(out, t)`` (``*_into_tensor`` /
``*_tensor`` on older torch), ``all_to_all_single(out, t)``, ``scatter(out, blocks, src)`` and
``gather(t, blocks, dst)`` (the root's list of blocks: views of its buffer; None elsewhere).
Tensors are ``torch.from_numpy`` views of the harness's buffers.
"""

from __future__ import annotations

import functools
import importlib.metadata
import sys
import warnings
from collections.abc import Callable
from datetime import timedelta
from pathlib import Path
from typing import Any

import numpy as np

from ..collectives import Collective
from ..config import BFLOAT16, BenchConfig
from ..harness import Backend, RankComm
from .base import importable, read_result, run_workers, worker_env

__all__ = ["GlooBackend", "GlooRankComm"]

# torch.distributed's call per collective (gloo's and the torch "hccl" backend's runs share it)
TORCH_CALLS = {
    "allreduce": "all_reduce(t) in place",
    "allgather": "all_gather_single(out, t)",
    "broadcast": "broadcast(t) in place",
    "reduce": "reduce(t) in place",
    "reducescatter": "reduce_scatter_single(out, t)",
    "alltoall": "all_to_all_single(out, t)",
    "scatter": "scatter(out, [blocks of t] on root / None, src=root)",
    "gather": "gather(t, [blocks of out] on root / None, dst=root)",
}


class GlooRankComm(RankComm):
    """A rank's default torch.distributed process group (gloo), as the harness drives it.
    ``backend``: another torch backend on the same calls (``torch_hccl.py``: "hccl");
    ``init_method`` None: env:// (the launcher's MASTER_ADDR/MASTER_PORT)."""

    def __init__(self, rank: int, size: int, init_method: str | None, timeout_s: float, backend: str = "gloo"):
        import torch
        import torch.distributed as dist

        warnings.filterwarnings("ignore", category=FutureWarning, module="torch")
        torch.set_num_threads(1)  # ranks share the machine's cores, as the other implementations' do
        dist.init_process_group(
            backend, init_method=init_method, rank=rank, world_size=size, timeout=timedelta(seconds=timeout_s)
        )
        self.torch, self.dist = torch, dist
        self.rank, self.size = dist.get_rank(), dist.get_world_size()
        R = dist.ReduceOp
        self._ops = {"sum": R.SUM, "prod": R.PRODUCT, "max": R.MAX, "min": R.MIN}
        self._allgather = getattr(dist, "all_gather_single", None) or dist.all_gather_into_tensor
        self._reduce_scatter = getattr(dist, "reduce_scatter_single", None) or dist.reduce_scatter_tensor

    def _tensor(self, a: np.ndarray) -> Any:
        if a.dtype == BFLOAT16:
            return self.torch.from_numpy(a.view(np.int16)).view(self.torch.bfloat16)
        return self.torch.from_numpy(a)

    def bind(
        self, coll: Collective, send: np.ndarray, recv: np.ndarray | None, op: str, root: int
    ) -> Callable[[], np.ndarray | None]:
        dist = self.dist
        t = self._tensor(send)
        name = coll.name
        if name == "allreduce":
            return functools.partial(dist.all_reduce, t, op=self._ops[op])
        if name == "broadcast":
            return functools.partial(dist.broadcast, t, src=root)
        if name == "reduce":
            return functools.partial(dist.reduce, t, dst=root, op=self._ops[op])
        assert recv is not None
        out = self._tensor(recv)
        if name == "allgather":
            return functools.partial(self._allgather, out, t)
        if name == "reducescatter":
            return functools.partial(self._reduce_scatter, out, t, op=self._ops[op])
        if name == "alltoall":
            return functools.partial(dist.all_to_all_single, out, t)
        at_root = self.rank == root
        if name == "scatter":  # the root's list: views of its send buffer, one block per rank
            blocks = list(t.chunk(self.size)) if at_root else None
            return functools.partial(dist.scatter, out, blocks, src=root)
        if name == "gather":  # the root's list: views of its output buffer
            blocks = list(out.chunk(self.size)) if at_root else None
            return functools.partial(dist.gather, t, blocks, dst=root)
        raise ValueError(f"no gloo binding for {name}")

    def barrier(self) -> None:
        self.dist.barrier()

    def allreduce_scalar(self, value: float, how: str) -> float:
        t = self.torch.tensor([value], dtype=self.torch.float64)
        self.dist.all_reduce(t, op=self._ops[how])
        return float(t.item())

    def close(self) -> None:
        self.dist.destroy_process_group()


class GlooBackend(Backend):
    """torch.distributed gloo (``--vs gloo``): one ``gloo_worker`` process per rank, file:// rendezvous
    in the run's work directory."""

    name = "gloo"
    label = "torch gloo"

    def unavailable(self) -> str | None:
        if not importable("torch"):
            return "torch is not installed (pip install torch==2.13.0, the CPU build)"
        return None

    def unsupported(self, cfg: BenchConfig) -> str | None:
        if cfg.collective not in TORCH_CALLS:
            return f"no torch.distributed binding for {cfg.collective}"
        if cfg.dt.name == "int16":
            return "gloo has no int16"
        return None

    def version(self) -> str:
        return f"torch {importlib.metadata.version('torch')} gloo"

    def mode(self, coll: Collective) -> str:
        return TORCH_CALLS[coll.name]

    def run(self, cfg: BenchConfig, progress_path: str | None, workdir: str) -> list[dict[str, Any]]:
        folder = Path(workdir)
        cfg_path, out_path, init_path = folder / "gloo-config.json", folder / "gloo-rows.json", folder / "gloo-init"
        cfg_path.write_text(cfg.to_json())
        for p in (out_path, init_path):
            p.unlink(missing_ok=True)  # file:// rendezvous needs a fresh file each run
        commands = []
        for rank in range(cfg.nranks):
            cmd = [
                sys.executable,
                "-m",
                "benchmarks.peers.gloo_worker",
                "--config",
                str(cfg_path),
                "--rank",
                str(rank),
                "--init",
                f"file://{init_path}",
                "--out",
                str(out_path),
            ]
            if progress_path:
                cmd += ["--progress", progress_path]
            commands.append(cmd)
        env = worker_env({"OMP_NUM_THREADS": "1"})
        env.setdefault("GLOO_SOCKET_IFNAME", "lo")  # one host: loopback, whatever the hostname resolves to
        run_workers(commands, env, cfg.timeout_s, "gloo")
        return read_result(str(out_path), "gloo")
