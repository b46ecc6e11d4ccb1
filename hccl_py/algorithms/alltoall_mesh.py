"""Mesh all-to-all (HCCL's full-mesh AlltoAll inside a server): in one step every rank sends each
peer its block and receives every peer's block; its own block is a local copy. One step, so the
latency of a single transfer, with every link of a full mesh busy at once: the choice for small
blocks and for servers whose cards are all directly connected.

Blocks may differ in size (``schedule_v``: AlltoAllV/VC, see ``alltoall_pairwise``); ``schedule``
is the equal-block form.

Steps: 1. Sent per rank: the sum of its blocks to others. TMP: none. IN is never written.
"""

from __future__ import annotations

from functools import lru_cache
from typing import Sequence

from ._common import equal_blocks, finish
from .schedule import IN, OUT, Copy, Recv, Region, Schedule, Send, Step


@lru_cache(maxsize=256)
def schedule(rank: int, size: int, count: int, root: int = 0) -> Schedule:
    """Mesh all-to-all of ``count`` elements per block: one step that sends every peer its block
    (``schedule_v`` with equal counts); returns the Schedule of rank ``rank``."""
    return equal_blocks(schedule_v, rank, size, count)


def schedule_v(
    rank: int, counts: Sequence[Sequence[int]], send_displs: Sequence[int], recv_displs: Sequence[int]
) -> Schedule:
    """Rank ``rank``'s one step for ``counts[i][j]`` elements from i to j (displacements as in
    ``alltoall_pairwise.schedule_v``)."""
    size = len(counts)
    peers = [(rank + s) % size for s in range(1, size)]
    own = Copy(Region(IN, send_displs[rank], counts[rank][rank]), Region(OUT, recv_displs[rank], counts[rank][rank]))
    return finish(
        [
            Step(
                copies=(own,),
                sends=tuple(Send(j, Region(IN, send_displs[j], counts[rank][j])) for j in peers),
                recvs=tuple(Recv(i, Region(OUT, recv_displs[i], counts[i][rank])) for i in peers),
            )
        ]
    )
