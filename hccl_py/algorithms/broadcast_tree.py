"""Binomial-tree broadcast from the root (ranks numbered relative to the root).

Each rank receives the whole buffer from its parent, then sends it to its children, farthest
(largest subtree) first, so that the number of ranks holding the data doubles every step.

Steps: ceil(log2 size). Sent per rank: count elements per child (the root: ceil(log2 size) *
count); received per non-root rank: count. TMP: none. The root only reads its buffer.
"""

from __future__ import annotations

from functools import lru_cache

from ._common import absolute, finish, relative
from ._trees import children, parent
from .schedule import OUT, Recv, Region, Schedule, Send, Step


@lru_cache(maxsize=256)
def schedule(rank: int, size: int, count: int, root: int = 0) -> Schedule:
    """Binomial-tree broadcast: receive the buffer from the parent, then send it to each child, farthest
    first; returns the Schedule of rank ``rank``."""
    whole = Region(OUT, 0, count)
    v = relative(rank, root, size)
    steps = []
    if v:
        steps.append(Step(recvs=(Recv(absolute(parent(v), root, size), whole),)))
    steps += [Step(sends=(Send(absolute(c, root, size), whole),)) for c in reversed(children(v, size))]
    return finish(steps)
