"""Mesh gather (HCCL's GatherMesh template, which its Reduce uses; HCCL has no Gather operator):
every rank sends its IN to the root at once, the root receiving each on a stream of its own
(hcomm ``temp_gather/gather_mesh.cc``); it copies its own into block ``root`` of OUT and receives
block j from rank j.

Steps: 1. Received by the root: (size-1) * count elements; sent per rank: count. TMP: none.
"""

from __future__ import annotations

from functools import lru_cache

from ._common import finish
from .schedule import IN, OUT, Copy, Recv, Region, Schedule, Send, Step


@lru_cache(maxsize=256)
def schedule(rank: int, size: int, count: int, root: int = 0) -> Schedule:
    """Mesh gather: in one step every rank sends its IN to the root, which receives block j of OUT from
    rank j; returns the Schedule of rank ``rank``."""
    mine = Region(IN, 0, count)
    if rank != root:
        return finish([Step(sends=(Send(root, mine),))])
    peers = [(root + s) % size for s in range(1, size)]
    return finish([Step(copies=(Copy(mine, Region(OUT, root * count, count)),),
                        recvs=tuple(Recv(j, Region(OUT, j * count, count)) for j in peers))])
