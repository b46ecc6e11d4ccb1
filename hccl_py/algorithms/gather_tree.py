"""Binomial-tree gather (ranks numbered relative to the root, MPICH's gather): the mirror of
``scatter_tree``.

Each rank puts its IN at TMP block 0, receives each child's subtree blocks (nearest child first)
into the following TMP blocks (a subtree is a contiguous range of relative ranks) and sends its
whole subtree to its parent. The root then copies TMP block v to OUT block of absolute rank v.

Steps: ceil(log2 size) + 1. Received per rank: its children's subtrees ((size-1) * count by the
root). TMP: the subtree's blocks (size * count on the root).
"""

from __future__ import annotations

from functools import lru_cache

from ._common import absolute, finish, relative, span
from ._trees import children, parent, subtree
from .schedule import IN, OUT, TMP, Copy, Recv, Region, Schedule, Send, Step


@lru_cache(maxsize=256)
def schedule(rank: int, size: int, count: int, root: int = 0) -> Schedule:
    """Binomial-tree gather: collect the subtree's blocks in TMP (nearest child first) and send them to the
    parent; the root copies them to OUT. Returns the Schedule of rank ``rank``."""
    v = relative(rank, root, size)
    lo, hi = subtree(v, size)
    blocks = [(b * count, count) for b in range(hi - lo)]
    steps = [Step(copies=(Copy(Region(IN, 0, count), Region(TMP, *blocks[0])),))]
    for c in children(v, size):
        c_lo, c_hi = subtree(c, size)
        steps.append(Step(recvs=(Recv(absolute(c, root, size), span(TMP, blocks, c_lo - lo, c_hi - lo)),)))
    if v:
        steps.append(Step(sends=(Send(absolute(parent(v), root, size), span(TMP, blocks, 0, hi - lo)),)))
    else:
        steps.append(
            Step(
                copies=tuple(
                    Copy(Region(TMP, *blocks[u]), Region(OUT, absolute(u, root, size) * count, count))
                    for u in range(size)
                )
            )
        )
    return finish(steps)
