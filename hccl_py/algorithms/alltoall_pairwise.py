"""Pairwise all-to-all (HCCL's ``pairwise``, MPI's pairwise exchange): size-1 rounds, in round s
rank r sends its block for rank r+s and receives rank r-s's block for it; its own block is a
local copy. One peer per round in each direction, so every link carries one flow per step: the
algorithm of choice when blocks are large or the network is not a full mesh.

Blocks may differ in size (``schedule_v``: AlltoAllV/VC, ``counts[i][j]`` elements from rank i to
rank j, at the displacements each rank gives); ``schedule`` is the equal-block form (AlltoAll):
block j of IN (``count`` elements) goes to rank j, block i of OUT comes from rank i.

Steps: size-1 exchanges (the own-block copy rides in the first). Sent per rank: the sum of its
blocks to others. TMP: none. IN is never written.
"""

from __future__ import annotations

from functools import lru_cache
from typing import Iterator, Sequence

import numpy as np

from ._common import equal_blocks, finish
from .schedule import IN, OUT, Copy, Recv, Region, Schedule, Send, Step, StepFlows


@lru_cache(maxsize=256)
def schedule(rank: int, size: int, count: int, root: int = 0) -> Schedule:
    """Pairwise all-to-all of ``count`` elements per block: size-1 rounds, in round s sending to rank+s and
    receiving from rank-s (``schedule_v`` with equal counts); returns the Schedule of rank ``rank``."""
    return equal_blocks(schedule_v, rank, size, count)


def schedule_v(
    rank: int, counts: Sequence[Sequence[int]], send_displs: Sequence[int], recv_displs: Sequence[int]
) -> Schedule:
    """Rank ``rank``'s rounds for ``counts[i][j]`` elements from i to j; this rank's blocks start at
    ``send_displs[j]`` in IN and ``recv_displs[i]`` in OUT."""
    size = len(counts)
    own = Copy(Region(IN, send_displs[rank], counts[rank][rank]), Region(OUT, recv_displs[rank], counts[rank][rank]))
    steps = [Step(copies=(own,))]
    for s in range(1, size):
        to, frm = (rank + s) % size, (rank - s) % size
        steps.append(
            Step(
                sends=(Send(to, Region(IN, send_displs[to], counts[rank][to])),),
                recvs=(Recv(frm, Region(OUT, recv_displs[frm], counts[frm][rank])),),
            )
        )
    if len(steps) > 1:  # the own-block copy overlaps the first exchange
        steps[1] = Step(copies=steps[0].copies, sends=steps[1].sends, recvs=steps[1].recvs)
        steps.pop(0)
    return finish(steps)


def flows(size: int, count: int, root: int = 0) -> Iterator[StepFlows]:
    """Every rank's steps at once (``StepFlows``): in round s every rank sends rank + s its block
    and receives rank - s's; the own block's copy rides in the first. Needs ``size >= 2`` and
    ``count >= 1``."""
    if size < 2 or count < 1:
        raise ValueError("pairwise all-to-all flows need size >= 2 and count >= 1")
    ranks = np.arange(size)
    blocks = np.full(size, count)
    for s in range(1, size):
        yield StepFlows((ranks + s) % size, blocks, (ranks - s) % size, False, copies=(count,) if s == 1 else ())
