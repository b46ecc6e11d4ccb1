"""torch.distributed on hccl-py's "hccl" backend (``hccl_py.torch``): the torch-facing path.

Ranks start exactly as hccl-py's own (``launch.spawn``: same store, same shared-memory transport,
same modeled cluster), and make the same calls as the gloo peer (``dist.all_reduce(t)`` in place,
``all_gather_single(out, t)``, ...) on ``torch.from_numpy`` views of the harness's buffers. Side by
side with ``hccl`` (``--vs torch-hccl``), the time ratio is what torch's API costs on top of
hccl-py's numpy path: c10d's Python wrapper, the process group, tensor-to-array views::

    hccl-bench allreduce -n 2 -b 8 -e 4M -f 4 --vs torch-hccl --repeats 5
"""

from __future__ import annotations

import importlib.metadata
from typing import Any

from ..collectives import Collective
from ..collectives import get as get_collective
from ..config import BenchConfig
from ..harness import Backend, BackendError, rank_main
from .base import importable
from .gloo import TORCH_CALLS, GlooRankComm
from .hccl import EXTRA_COLUMNS, unsupported_reason

__all__ = ["TorchHcclBackend", "TorchHcclRankComm"]


class TorchHcclRankComm(GlooRankComm):
    """A rank's default torch process group on the "hccl" backend, with hccl-py's modeled columns."""

    extra_columns = EXTRA_COLUMNS

    def __init__(self, rank: int, size: int, timeout_s: float):
        import hccl_py.torch  # registers "hccl"

        super().__init__(rank, size, None, timeout_s, backend="hccl")
        self._comm = hccl_py.torch.communicator()
        self._collective = ""

    def bind(self, coll: Collective, send, recv, op: str, root: int):
        self._collective = coll.spec.name
        return super().bind(coll, send, recv, op, root)

    def _modeled_s(self) -> float:
        by_op = self._comm.stats().by_op.get(self._collective)
        return 0.0 if by_op is None else by_op.modeled_s

    def extra_start(self) -> float:
        return self._modeled_s()

    def extra_stop(self, start: float) -> dict[str, float]:
        return {"modeled_us": (self._modeled_s() - start) * 1e6}


def algo_env(cfg: BenchConfig) -> dict[str, str]:
    """``--algo`` for ranks that call through torch (whose API takes no algorithm): HCCL_ALGO
    naming it for the measured collective (``allreduce=ring``); {} for auto. HcclParamError if
    HCCL_ALGO cannot say it (the two-level ``hier:...`` forms)."""
    if cfg.algo == "auto":
        return {}
    from hccl_py import env
    from hccl_py.choice.names import parse_hccl_algo

    op = get_collective(cfg.collective).spec.name
    text = f"{op}={cfg.algo}"
    if parse_hccl_algo(text) != {op: cfg.algo}:
        from hccl_py.errors import HcclParamError

        raise HcclParamError(f"--algo {cfg.algo}: HCCL_ALGO has no short form for it", arg="algo", value=cfg.algo)
    return {env.HCCL_ALGO: text}


def rank_work(cfg: BenchConfig, progress_path: str | None) -> list[list[dict[str, Any]]] | None:
    """What each spawned rank runs (module level: launch.spawn pickles it by name)."""
    import os

    return rank_main(TorchHcclRankComm(int(os.environ["RANK"]), cfg.nranks, cfg.timeout_s), cfg, progress_path)


class TorchHcclBackend(Backend):
    """torch.distributed on hccl-py's "hccl" backend (``--vs torch-hccl``): ``cfg.nranks`` ranks
    started with ``launch.spawn`` as hccl-py's own, each calling ``dist.*`` on tensor views."""

    name = "torch-hccl"
    label = "torch on hccl-py"
    extra_columns = EXTRA_COLUMNS

    def unavailable(self) -> str | None:
        if not importable("torch"):
            return "torch is not installed (pip install 'hccl-py[torch]', the CPU build of torch 2.13.0)"
        return None

    def unsupported(self, cfg: BenchConfig) -> str | None:
        from hccl_py.errors import HcclError

        if cfg.collective not in TORCH_CALLS:
            return f"no torch.distributed binding for {cfg.collective}"
        reason = unsupported_reason(cfg)
        if reason is None:
            try:
                algo_env(cfg)
            except HcclError as err:
                return f"torch calls cannot choose the algorithm: {err.message}"
        return reason

    def version(self) -> str:
        import hccl_py

        return f"torch {importlib.metadata.version('torch')} + hccl-py {hccl_py.__version__} (backend 'hccl')"

    def mode(self, coll: Collective) -> str:
        return TORCH_CALLS[coll.name]

    def run(self, cfg: BenchConfig, progress_path: str | None, workdir: str) -> list[dict[str, Any]]:
        import launch

        try:
            results = launch.spawn(
                rank_work,
                cfg.nranks,
                args=(cfg, progress_path),
                timeout=cfg.timeout_s,
                env={"OMP_NUM_THREADS": "1", **algo_env(cfg)},
            )
        except launch.SpawnError as err:
            raise BackendError(f"torch on hccl-py: ranks failed: {err}") from err
        assert isinstance(results, list) and results[0] is not None
        return results[0][0]
