"""Binomial-tree allgather: binomial gather to rank 0, then binomial broadcast of all of OUT.

Rank v copies IN into block v of OUT, receives the blocks of each child's subtree (a subtree is a
contiguous range of ranks, so one contiguous region of OUT), nearest child first, and sends the
blocks of its own subtree to its parent. Rank 0 then holds all of OUT and broadcasts it down the
same tree, farthest child first.

Steps: 2*ceil(log2 size). Sent per rank: (subtree size) * count to the parent in the gather and
size * count per child in the broadcast; rank 0 sends ceil(log2 size) * size * count.
Latency-optimal; the ring or halving-doubling moves far fewer bytes. TMP: none.
"""

from __future__ import annotations

from functools import lru_cache

from ._common import block_bounds, finish, span
from ._trees import children, parent, subtree
from .schedule import IN, OUT, Copy, Recv, Region, Schedule, Send, Step


@lru_cache(maxsize=256)
def schedule(rank: int, size: int, count: int, root: int = 0) -> Schedule:
    """Binomial-tree allgather: gather the subtrees' blocks up to rank 0 (nearest child first), then
    broadcast all of OUT back down (farthest child first); returns the Schedule of rank ``rank``."""
    blocks = block_bounds(count, size)
    whole = Region(OUT, 0, size * count)
    kids = children(rank, size)
    steps = [Step(copies=(Copy(Region(IN, 0, count), Region(OUT, *blocks[rank])),))]
    steps += [Step(recvs=(Recv(c, span(OUT, blocks, *subtree(c, size))),)) for c in kids]
    if rank:
        steps.append(Step(sends=(Send(parent(rank), span(OUT, blocks, *subtree(rank, size))),)))
        steps.append(Step(recvs=(Recv(parent(rank), whole),)))
    steps += [Step(sends=(Send(c, whole),)) for c in reversed(kids)]
    return finish(steps)
