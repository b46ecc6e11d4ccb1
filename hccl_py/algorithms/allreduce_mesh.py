"""Full-mesh allreduce: direct reduce-scatter, then direct allgather (every pair talks directly).

OUT is cut into ``size`` chunks; rank j owns chunk j. Step 1: every rank sends chunk j to rank j
for all j != own, and the owner folds the incoming chunks into its own in rank order
(``OUT = OUT op incoming``, receives listed by peer rank), so the result never depends on
arrival order. Step 2: every owner sends its reduced chunk to all other ranks. Each result
element is computed once, so all ranks end bit-identical.

Steps: 2. Sent per rank: 2*(size-1)/size * count elements (as many received), as size-1
concurrent messages each way in each step. TMP: none (in place).
"""

from __future__ import annotations

from functools import lru_cache
from typing import Iterator

import numpy as np

from ._common import finish, mesh_lanes
from .schedule import OUT, Recv, Region, Schedule, Send, Step, StepFlows, chunk_bounds


@lru_cache(maxsize=256)
def schedule(rank: int, size: int, count: int, root: int = 0) -> Schedule:
    """Mesh allreduce: one step of direct reduce-scatter (chunk j to rank j, reduced in rank order), one of
    direct allgather of the reduced chunks; returns the Schedule of rank ``rank``."""
    chunks = [Region(OUT, *b) for b in chunk_bounds(count, size)]
    mine = chunks[rank]
    peers = [j for j in range(size) if j != rank]
    scatter = Step(
        sends=tuple(Send(j, chunks[j]) for j in peers),
        recvs=tuple(Recv(j, mine, reduce_with=mine) for j in peers),
    )
    gather = Step(sends=tuple(Send(j, mine) for j in peers), recvs=tuple(Recv(j, chunks[j]) for j in peers))
    return finish([scatter, gather])


def flows(size: int, count: int, root: int = 0) -> Iterator[StepFlows]:
    """Every rank's steps at once (see ``StepFlows``: one lane per peer); needs ``count >= size
    >= 2`` so no chunk is empty."""
    if size < 2 or count < size:
        raise ValueError("mesh allreduce flows need count >= size >= 2")
    peers, lanes = mesh_lanes(size)
    chunk = np.array([n for _, n in chunk_bounds(count, size)])
    yield StepFlows(peers, chunk[peers], peers, True, recv_lane=lanes)  # chunk j to its owner j
    mine = np.broadcast_to(chunk, peers.shape)
    yield StepFlows(peers, mine, peers, False, recv_lane=lanes)  # the owner's reduced chunk to all
