"""The collectives hccl-bench measures, one thin file each (as nccl-tests' all_reduce.cu ...).

get("allreduce").bus_factor(4)     # 1.5
"""

from __future__ import annotations

from . import allgather, allreduce, alltoall, alltoallv, broadcast, gather, reduce, reducescatter, scatter
from .base import Case, Collective

__all__ = ["COLLECTIVES", "Case", "Collective", "get"]

COLLECTIVES: dict[str, Collective] = {
    m.COLLECTIVE.name: m.COLLECTIVE
    for m in (allreduce, allgather, broadcast, reduce, reducescatter, alltoall, alltoallv, scatter, gather)
}


def get(name: str) -> Collective:
    """The collective named ``name``; ValueError listing the choices otherwise."""
    try:
        return COLLECTIVES[name]
    except KeyError:
        raise ValueError(f"unknown collective {name!r}; use one of {', '.join(COLLECTIVES)}") from None
