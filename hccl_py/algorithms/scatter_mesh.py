"""Direct scatter (HCCL's mesh Scatter): the root sends block j of its IN to rank j, all at
once, and copies its own block into OUT.

Steps: 1. Sent by the root: (size-1) * count elements; received per rank: count. TMP: none.
"""

from __future__ import annotations

from functools import lru_cache

from ._common import finish
from .schedule import IN, OUT, Copy, Recv, Region, Schedule, Send, Step


@lru_cache(maxsize=256)
def schedule(rank: int, size: int, count: int, root: int = 0) -> Schedule:
    """Mesh scatter: in one step the root sends block j of its IN to rank j and copies its own; returns the
    Schedule of rank ``rank``."""
    mine = Region(OUT, 0, count)
    if rank != root:
        return finish([Step(recvs=(Recv(root, mine),))])
    peers = [(root + s) % size for s in range(1, size)]
    return finish([Step(copies=(Copy(Region(IN, root * count, count), mine),),
                        sends=tuple(Send(j, Region(IN, j * count, count)) for j in peers))])
