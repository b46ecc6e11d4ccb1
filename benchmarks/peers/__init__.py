"""The implementations hccl-bench measures, behind the harness's two interfaces: driver side
:class:`benchmarks.harness.Backend`, rank side :class:`benchmarks.harness.RankComm`:

- ``hccl``: hccl-py itself, ranks started with launch.spawn (or in place under hccl-launch);
- ``mpi``: mpi4py on the MPICH of the ``mpich`` wheel, ranks started with that wheel's mpiexec;
- ``gloo``: torch.distributed with the gloo backend (CPU), one subprocess per rank;
- ``torch-hccl``: torch.distributed on hccl-py's "hccl" backend (``hccl_py.torch``), ranks as
  hccl-py's: the torch-facing path's cost over hccl-py's numpy path, side by side;
- ``unmodeled``: hccl-py with ``HCCL_PY_MODELED_TIME=0``, to measure what modeled time costs.

    backends(("mpi", "gloo"))    # [HcclBackend(), MpiBackend(), GlooBackend()]
"""

from __future__ import annotations

from collections.abc import Iterable

from ..harness import Backend

__all__ = ["backends", "get_backend"]


def get_backend(name: str) -> Backend:
    """A new driver-side backend by name (hccl, mpi, gloo, torch-hccl, unmodeled)."""
    if name == "hccl":
        from .hccl import HcclBackend

        return HcclBackend()
    if name == "unmodeled":
        from .hccl import HcclUnmodeledBackend

        return HcclUnmodeledBackend()
    if name == "mpi":
        from .mpi import MpiBackend

        return MpiBackend()
    if name == "gloo":
        from .gloo import GlooBackend

        return GlooBackend()
    if name == "torch-hccl":
        from .torch_hccl import TorchHcclBackend

        return TorchHcclBackend()
    raise ValueError(f"unknown implementation {name!r}; use hccl, mpi, gloo, torch-hccl or unmodeled")


def backends(peers: Iterable[str] = ()) -> list[Backend]:
    """hccl-py first, then the peers in the order given."""
    return [get_backend("hccl"), *(get_backend(p) for p in peers)]
