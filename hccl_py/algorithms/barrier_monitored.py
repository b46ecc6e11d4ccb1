"""Monitored barrier (torch's ``monitored_barrier``): every rank checks in with rank 0 in one
step, then rank 0 releases everyone in one step. Slower than dissemination (rank 0 handles
size-1 messages twice) but rank 0 waits on all the others *at once*, so when one or more never
arrive its timeout names every missing rank, not only the first.

Rank 0 receives each check-in into its own TMP element: receives into one shared element would
be applied in list order, and a missing rank 1 would then hold up (and be reported with) rank 2.

Steps: 2. Sent per rank: one element (rank 0: size-1 elements). TMP: size elements (uint8).
"""

from __future__ import annotations

from functools import lru_cache

from ._common import finish
from .schedule import TMP, Recv, Region, Schedule, Send, Step

_BYTE = Region(TMP, 0, 1)


def _slot(rank: int) -> Region:
    return Region(TMP, rank, 1)


@lru_cache(maxsize=256)
def schedule(rank: int, size: int, count: int = 0, root: int = 0) -> Schedule:
    """Monitored barrier: every rank checks in with rank 0 in one step, rank 0 releases them all in the
    next (``count`` and ``root`` unused); returns the Schedule of rank ``rank``."""
    if size == 1:
        return Schedule(())
    if rank == 0:
        others = range(1, size)
        return finish(
            [Step(recvs=tuple(Recv(r, _slot(r)) for r in others)), Step(sends=tuple(Send(r, _BYTE) for r in others))]
        )
    return finish([Step(sends=(Send(0, _BYTE),)), Step(recvs=(Recv(0, _BYTE),))])
