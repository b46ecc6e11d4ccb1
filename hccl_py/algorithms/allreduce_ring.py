"""Ring allreduce: ring reduce-scatter, then ring allgather (gloo's allreduce_ring_chunked, NCCL's ring).

OUT is cut into ``size`` chunks (``chunk_bounds``). Reduce-scatter, steps 0 .. size-2: rank r
sends chunk r-s to r+1 and folds chunk r-s-1 from r-1 into OUT (``OUT = OUT op incoming``);
after it, rank r holds chunk r+1 fully reduced. Allgather, size-1 more steps: the reduced chunks
travel once more round the ring and are copied. Each result element is computed by exactly one
rank and then copied, so every rank ends bit-identical.

Steps: 2*(size-1). Sent per rank: 2*(size-1)/size * count elements (as many received).
TMP: none (in place).
"""

from __future__ import annotations

from functools import lru_cache
from typing import Iterator

import numpy as np

from ._common import finish, ring_indices
from .schedule import OUT, Recv, Region, Schedule, Send, Step, StepFlows, chunk_bounds


@lru_cache(maxsize=256)
def schedule(rank: int, size: int, count: int, root: int = 0) -> Schedule:
    """Ring allreduce: reduce-scatter then allgather round the ring, size-1 steps each; returns the
    Schedule of rank ``rank``."""
    chunks = chunk_bounds(count, size)
    right, left = (rank + 1) % size, (rank - 1) % size
    steps = []
    for shift in (0, 1):
        for sent, got in _moving(rank, size, count, shift):
            if shift == 0:
                acc = Region(OUT, *chunks[got])
                recv = Recv(left, acc, reduce_with=acc)
            else:
                recv = Recv(left, Region(OUT, *chunks[got]))
            steps.append(Step(sends=(Send(right, Region(OUT, *chunks[sent])),), recvs=(recv,)))
    return finish(steps)


def _moving(rank: int, size: int, count: int, shift: int) -> list[tuple[int, int]]:
    """``ring_indices`` of one trip, without the steps in which both chunks are empty (``finish``
    leaves those out): with fewer elements than ranks only chunks 0 .. count-1 hold any, so a rank
    of 65,536 builds a few steps, not 131,070."""
    if count >= size:
        return ring_indices(rank, size, shift)
    steps = {(rank + shift - j) % size for j in range(count)} | {(rank + shift - j - 1) % size for j in range(count)}
    return [((rank + shift - s) % size, (rank + shift - s - 1) % size) for s in sorted(steps) if s < size - 1]


def flows(size: int, count: int, root: int = 0) -> Iterator[StepFlows]:
    """Every rank's steps at once (see ``StepFlows``); needs ``count >= size`` so no step is empty."""
    if count < size or size < 2:
        raise ValueError("ring flows need count >= size >= 2")
    chunks = np.array([n for _, n in chunk_bounds(count, size)])
    ranks = np.arange(size)
    right, left = (ranks + 1) % size, (ranks - 1) % size
    twice = np.concatenate([chunks, chunks])  # rank r's chunk (r + shift - s) mod size is a window of it
    for shift, reduce in ((0, True), (1, False)):
        for s in range(size - 1):
            start = (shift - s) % size
            counts = chunks if count % size == 0 else twice[start : start + size]  # equal chunks: one array
            yield StepFlows(right, counts, left, reduce)
