"""Full-mesh reduce-scatter: every rank sends block j of IN to rank j, in one step.

The owner reduces its own IN block with the incoming blocks in rank order into OUT (the first
receive reads IN, the later ones accumulate in OUT; receives listed by peer rank), so the
result never depends on arrival order.

Steps: 1. Sent per rank: (size-1) * count elements in size-1 concurrent messages (as many
received). TMP: none; IN is never written.
"""

from __future__ import annotations

from functools import lru_cache
from typing import Iterator

import numpy as np

from ._common import block_bounds, finish, mesh_lanes
from .schedule import IN, OUT, Copy, Recv, Region, Schedule, Send, Step, StepFlows


@lru_cache(maxsize=256)
def schedule(rank: int, size: int, count: int, root: int = 0) -> Schedule:
    """Mesh reduce-scatter: in one step the rank sends block j of IN to rank j and reduces the incoming
    blocks into OUT in rank order; returns the Schedule of rank ``rank``."""
    blocks = [Region(IN, *b) for b in block_bounds(count, size)]
    mine = Region(OUT, 0, count)
    peers = [j for j in range(size) if j != rank]
    if not peers:
        return finish([Step(copies=(Copy(blocks[rank], mine),))])
    step = Step(
        sends=tuple(Send(j, blocks[j]) for j in peers),
        recvs=tuple(Recv(j, mine, reduce_with=mine if i else blocks[rank]) for i, j in enumerate(peers)),
    )
    return finish([step])


def flows(size: int, count: int, root: int = 0) -> Iterator[StepFlows]:
    """Every rank's step at once (see ``StepFlows``: one lane per peer); needs ``size >= 2`` and
    ``count >= 1``."""
    if size < 2 or count < 1:
        raise ValueError("mesh reduce_scatter flows need size >= 2 and count >= 1")
    peers, lanes = mesh_lanes(size)
    yield StepFlows(peers, np.full(peers.shape, count), peers, True, recv_lane=lanes)
