"""Full-mesh allgather: every rank sends its IN to every other rank, in one step.

Steps: 1 (plus the local copy of IN into block ``rank`` of OUT). Sent per rank: (size-1) * count
elements in size-1 concurrent messages (as many received). TMP: none.
"""

from __future__ import annotations

from functools import lru_cache
from typing import Iterator

import numpy as np

from ._common import block_bounds, finish, mesh_lanes
from .schedule import IN, OUT, Copy, Recv, Region, Schedule, Send, Step, StepFlows


@lru_cache(maxsize=256)
def schedule(rank: int, size: int, count: int, root: int = 0) -> Schedule:
    """Mesh allgather: in one step the rank sends its IN to every peer and receives each peer's block of
    OUT; returns the Schedule of rank ``rank``."""
    blocks = [Region(OUT, *b) for b in block_bounds(count, size)]
    own = Region(IN, 0, count)
    peers = [j for j in range(size) if j != rank]
    step = Step(
        copies=(Copy(own, blocks[rank]),),
        sends=tuple(Send(j, own) for j in peers),
        recvs=tuple(Recv(j, blocks[j]) for j in peers),
    )
    return finish([step])


def flows(size: int, count: int, root: int = 0) -> Iterator[StepFlows]:
    """Every rank's step at once (see ``StepFlows``: one lane per peer); needs ``size >= 2`` and
    ``count >= 1``."""
    if size < 2 or count < 1:
        raise ValueError("mesh allgather flows need size >= 2 and count >= 1")
    peers, lanes = mesh_lanes(size)
    yield StepFlows(peers, np.full(peers.shape, count), peers, False, recv_lane=lanes, copies=(count,))
