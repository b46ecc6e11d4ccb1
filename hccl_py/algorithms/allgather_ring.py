"""Ring allgather.

Rank r first copies IN into block r of OUT; then in steps s = 0 .. size-2 it sends block r-s
to r+1 and receives block r-s-1 from r-1 (what arrives in one step leaves in the next).

Steps: size-1 (plus the local copy). Sent per rank: (size-1) * count elements (as many received).
TMP: none.
"""

from __future__ import annotations

from functools import lru_cache

from ._common import block_bounds, finish, ring_indices
from .schedule import IN, OUT, Copy, Recv, Region, Schedule, Send, Step


@lru_cache(maxsize=256)
def schedule(rank: int, size: int, count: int, root: int = 0) -> Schedule:
    blocks = block_bounds(count, size)
    right, left = (rank + 1) % size, (rank - 1) % size
    own = Copy(Region(IN, 0, count), Region(OUT, *blocks[rank]))
    steps = [Step(copies=(own,))]  # a copy-only step; the first ring step sends what it wrote
    for sent, got in ring_indices(rank, size, shift=0):
        sends = (Send(right, Region(OUT, *blocks[sent])),)
        steps.append(Step(sends=sends, recvs=(Recv(left, Region(OUT, *blocks[got])),)))
    return finish(steps)
