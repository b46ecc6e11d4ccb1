"""Binomial-tree reduce to the root (ranks numbered relative to the root).

Each rank receives the partial results of its children, nearest first, reducing them with its
own data, then sends its partial to its parent. Non-root ranks accumulate in TMP (their buffer
stays untouched); leaves send their IN as it is; the root accumulates in OUT.

Steps: ceil(log2 size). Sent per non-root rank: count elements; received: count per child
(the root: ceil(log2 size) * count). TMP: count elements on non-root ranks that have children.
"""

from __future__ import annotations

from functools import lru_cache

from ._common import absolute, finish, relative
from ._trees import children, parent
from .schedule import IN, OUT, TMP, Recv, Region, Schedule, Send, Step


@lru_cache(maxsize=256)
def schedule(rank: int, size: int, count: int, root: int = 0) -> Schedule:
    """Binomial-tree reduce: reduce the children's partials (nearest first) with the own data, then send to
    the parent; the root accumulates in OUT. Returns the Schedule of rank ``rank``."""
    v = relative(rank, root, size)
    own = Region(IN, 0, count)
    acc = Region(OUT if v == 0 else TMP, 0, count)
    kids = children(v, size)
    steps = [
        Step(recvs=(Recv(absolute(c, root, size), acc, reduce_with=acc if i else own),)) for i, c in enumerate(kids)
    ]
    if v:
        steps.append(Step(sends=(Send(absolute(parent(v), root, size), acc if kids else own),)))
    return finish(steps)
