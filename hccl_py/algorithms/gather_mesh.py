"""Mesh gather (HCCL's GatherMesh template, which its Reduce uses; HCCL has no Gather operator):
every rank sends its IN to the root at once, the root receiving each on a stream of its own
(hcomm ``temp_gather/gather_mesh.cc``); it copies its own into block ``root`` of OUT and receives
block j from rank j.

Steps: 1. Received by the root: (size-1) * count elements; sent per rank: count. TMP: none.
"""

from __future__ import annotations

from functools import lru_cache
from typing import Iterator

import numpy as np

from ._common import finish, root_lanes
from .schedule import IN, OUT, Copy, Recv, Region, Schedule, Send, Step, StepFlows

# the schedules number ranks from the root: flows for root 0 serve any root, rotated (simulator._Rotated)
RELATIVE_TO_ROOT = True


@lru_cache(maxsize=256)
def schedule(rank: int, size: int, count: int, root: int = 0) -> Schedule:
    """Mesh gather: in one step every rank sends its IN to the root, which receives block j of OUT from
    rank j; returns the Schedule of rank ``rank``."""
    mine = Region(IN, 0, count)
    if rank != root:
        return finish([Step(sends=(Send(root, mine),))])
    peers = [(root + s) % size for s in range(1, size)]
    return finish(
        [
            Step(
                copies=(Copy(mine, Region(OUT, root * count, count)),),
                recvs=tuple(Recv(j, Region(OUT, j * count, count)) for j in peers),
            )
        ]
    )


def flows(size: int, count: int, root: int = 0) -> Iterator[StepFlows]:
    """Every rank's step at once: ranks 1 .. size-1 send the root (0) their block, which it
    receives in rank order (lane j-1 from rank j) after copying its own;
    ``2 <= size <= ROOT_LANES_MAX_SIZE``, ``count >= 1``."""
    if count < 1 or root != 0:
        raise ValueError("mesh gather flows need root 0 and count >= 1")
    send_to, recv_from, lanes = root_lanes("mesh gather", size)
    own = np.zeros(size, dtype=np.int64)
    own[0] = count
    yield StepFlows(send_to, np.full(size, count), recv_from, False, lanes, copies=(own,))
