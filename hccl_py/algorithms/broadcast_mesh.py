"""Full-mesh broadcast: the root sends its whole buffer to every other rank, in one step.

Steps: 1. Sent by the root: (size-1) * count elements in size-1 concurrent messages; received per
non-root rank: count. TMP: none. The root only reads its buffer.
"""

from __future__ import annotations

from functools import lru_cache

from ._common import finish
from .schedule import OUT, Recv, Region, Schedule, Send, Step


@lru_cache(maxsize=256)
def schedule(rank: int, size: int, count: int, root: int = 0) -> Schedule:
    """Mesh broadcast: in one step the root sends its buffer to every other rank; returns the
    Schedule of rank ``rank``."""
    whole = Region(OUT, 0, count)
    if rank == root:
        return finish([Step(sends=tuple(Send(j, whole) for j in range(size) if j != root))])
    return finish([Step(recvs=(Recv(root, whole),))])
