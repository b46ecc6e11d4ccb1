"""Ring allgather.

Rank r copies IN into block r of OUT; in steps s = 0 .. size-2 it sends block r-s to r+1 and
receives block r-s-1 from r-1 (what arrives in one step leaves in the next). The first step sends
its own block straight from IN, so the local copy shares that step (and need not precede the send).

Steps: size-1. Sent per rank: (size-1) * count elements (as many received). TMP: none.
"""

from __future__ import annotations

from functools import lru_cache
from typing import Iterator

import numpy as np

from ._common import block_bounds, finish, ring_indices
from .schedule import IN, OUT, Copy, Recv, Region, Schedule, Send, Step, StepFlows


@lru_cache(maxsize=256)
def schedule(rank: int, size: int, count: int, root: int = 0) -> Schedule:
    """Ring allgather: size-1 steps, each sending the block last received (its own first) to the right
    neighbour and receiving the next from the left; returns the Schedule of rank ``rank``."""
    blocks = block_bounds(count, size)
    right, left = (rank + 1) % size, (rank - 1) % size
    own = Copy(Region(IN, 0, count), Region(OUT, *blocks[rank]))
    steps = []
    for sent, got in ring_indices(rank, size, shift=0):
        first = not steps
        src = Region(IN, 0, count) if first else Region(OUT, *blocks[sent])
        steps.append(
            Step(
                copies=(own,) if first else (),
                sends=(Send(right, src),),
                recvs=(Recv(left, Region(OUT, *blocks[got])),),
            )
        )
    if not steps:  # a single rank
        steps.append(Step(copies=(own,)))
    return finish(steps)


def flows(size: int, count: int, root: int = 0) -> Iterator[StepFlows]:
    """Every rank's steps at once (see ``StepFlows``); needs ``size >= 2`` and ``count >= 1``."""
    if size < 2 or count < 1:
        raise ValueError("ring allgather flows need size >= 2 and count >= 1")
    ranks = np.arange(size)
    right, left = (ranks + 1) % size, (ranks - 1) % size
    counts = np.full(size, count)
    own = (count,)  # the first step copies IN into the rank's own block
    for s in range(size - 1):
        yield StepFlows(right, counts, left, False, copies=own if s == 0 else ())
