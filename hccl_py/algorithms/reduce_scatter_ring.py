"""Ring reduce-scatter.

In steps s = 0 .. size-2 rank r sends the partial sum of block r-1-s to r+1 (its own IN block
in step 0, the partial received in step s-1 afterwards) and receives the partial of block
r-2-s from r-1, reducing it with its IN block. The last block received is block r, complete.
Partials alternate between TMP and OUT, arranged so that the last one lands in OUT: one step
sends the slot the previous step filled while receiving into the other, and TMP needs only
``count`` elements. Each element is reduced in ring order starting at the rank after its owner.

Steps: size-1. Sent per rank: (size-1) * count elements (as many received).
TMP: count elements for size >= 3. IN is never written.
"""

from __future__ import annotations

from functools import lru_cache
from typing import Iterator

import numpy as np

from ._common import block_bounds, finish, ring_indices
from .schedule import IN, OUT, TMP, Copy, Recv, Region, Schedule, Send, Step, StepFlows


@lru_cache(maxsize=256)
def schedule(rank: int, size: int, count: int, root: int = 0) -> Schedule:
    """Ring reduce-scatter: size-1 steps, each passing a partial to the right and reducing the one from the
    left with the IN block, the last landing in OUT; returns the Schedule of rank ``rank``."""
    blocks = block_bounds(count, size)
    if size == 1:
        return finish([Step(copies=(Copy(Region(IN, 0, count), Region(OUT, 0, count)),))])
    right, left = (rank + 1) % size, (rank - 1) % size
    steps = []
    partial = None  # where the partial received in the previous step lies
    for s, (sent, got) in enumerate(ring_indices(rank, size, shift=-1)):
        src = partial if partial is not None else Region(IN, *blocks[sent])
        partial = Region(OUT if (size - 2 - s) % 2 == 0 else TMP, 0, count)
        recv = Recv(left, partial, reduce_with=Region(IN, *blocks[got]))
        steps.append(Step(sends=(Send(right, src),), recvs=(recv,)))
    return finish(steps)


def flows(size: int, count: int, root: int = 0) -> Iterator[StepFlows]:
    """Every rank's steps at once (see ``StepFlows``); needs ``size >= 2`` and ``count >= 1``."""
    if size < 2 or count < 1:
        raise ValueError("ring reduce_scatter flows need size >= 2 and count >= 1")
    ranks = np.arange(size)
    right, left = (ranks + 1) % size, (ranks - 1) % size
    counts = np.full(size, count)
    for _ in range(size - 1):
        yield StepFlows(right, counts, left, True)
