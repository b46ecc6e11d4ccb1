"""Binomial-tree scatter (ranks numbered relative to the root, MPICH's scatter).

The root first lays its IN out in relative order in TMP (block of relative rank v at TMP block
v), so that every subtree's blocks are one contiguous region. Each rank receives its subtree's
blocks from its parent into TMP, copies its own block to OUT and sends each child the blocks of
the child's subtree, farthest (largest subtree) first.

Steps: ceil(log2 size) + 1. Sent per rank: the blocks of its children's subtrees ((size-1) *
count by the root). TMP: size * count on the root, the subtree's blocks elsewhere.
"""

from __future__ import annotations

from functools import lru_cache

from ._common import absolute, finish, relative, span
from ._trees import children, parent, subtree
from .schedule import IN, OUT, TMP, Copy, Recv, Region, Schedule, Send, Step


@lru_cache(maxsize=256)
def schedule(rank: int, size: int, count: int, root: int = 0) -> Schedule:
    """Binomial-tree scatter: the root lays IN out in TMP in relative order; each rank receives its
    subtree's blocks, copies its own to OUT, sends each child its subtree (farthest first); returns the
    Schedule of rank ``rank``."""
    v = relative(rank, root, size)
    lo, hi = subtree(v, size)
    # TMP holds the subtree's blocks, relative rank lo first
    blocks = [(b * count, count) for b in range(hi - lo)]
    steps = []
    if v == 0:
        steps.append(
            Step(
                copies=tuple(
                    Copy(Region(IN, absolute(u, root, size) * count, count), Region(TMP, *blocks[u]))
                    for u in range(size)
                )
            )
        )
    else:
        steps.append(Step(recvs=(Recv(absolute(parent(v), root, size), span(TMP, blocks, 0, hi - lo)),)))
    steps.append(Step(copies=(Copy(Region(TMP, *blocks[0]), Region(OUT, 0, count)),)))
    for c in reversed(children(v, size)):
        c_lo, c_hi = subtree(c, size)
        steps.append(Step(sends=(Send(absolute(c, root, size), span(TMP, blocks, c_lo - lo, c_hi - lo)),)))
    return finish(steps)
