"""Binomial-tree reduce-scatter: binomial reduce of all of IN to rank 0, then binomial scatter.

Reduce: as reduce_tree with root 0 over the whole ``size * count`` elements, accumulated in TMP
(IN is never written). Scatter: rank 0 sends each child the reduced blocks of the child's
subtree (one contiguous region), farthest child first; every rank forwards the sub-ranges to its
own children the same way and copies its block to OUT. Leaves receive straight into OUT. Only
rank 0 computes results, in the binomial-tree order.

Steps: 2*ceil(log2 size). Sent per non-root rank: size * count in the reduce; in the scatter
(subtree size) * count per child. Rank 0 receives ceil(log2 size) * size * count.
TMP: size * count elements on ranks that have children, none on leaves.
"""

from __future__ import annotations

from functools import lru_cache

from ._common import block_bounds, finish, span
from ._trees import children, parent, subtree
from .schedule import IN, OUT, TMP, Copy, Recv, Region, Schedule, Send, Step


@lru_cache(maxsize=256)
def schedule(rank: int, size: int, count: int, root: int = 0) -> Schedule:
    """Binomial-tree reduce-scatter: reduce all of IN up the tree to rank 0 (in TMP), then scatter the
    reduced blocks back down; returns the Schedule of rank ``rank``."""
    blocks = block_bounds(count, size)
    own_in = Region(IN, 0, size * count)
    acc = Region(TMP, 0, size * count)
    mine = Region(OUT, 0, count)
    kids = children(rank, size)
    if not kids:  # a leaf (or size 1): send IN up, receive the own block into OUT
        if rank == 0:
            return finish([Step(copies=(Copy(own_in, mine),))])
        return finish([Step(sends=(Send(parent(rank), own_in),)), Step(recvs=(Recv(parent(rank), mine),))])
    steps = [Step(recvs=(Recv(c, acc, reduce_with=acc if i else own_in),)) for i, c in enumerate(kids)]
    if rank:
        steps.append(Step(sends=(Send(parent(rank), acc),)))
        steps.append(Step(recvs=(Recv(parent(rank), span(TMP, blocks, *subtree(rank, size))),)))
    scatter = [Step(sends=(Send(c, span(TMP, blocks, *subtree(c, size))),)) for c in reversed(kids)]
    scatter[0] = Step(copies=(Copy(Region(TMP, *blocks[rank]), mine),), sends=scatter[0].sends)
    return finish(steps + scatter)
