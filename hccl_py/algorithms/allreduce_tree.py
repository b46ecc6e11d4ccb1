"""Binomial-tree allreduce: binomial reduce to rank 0, then binomial broadcast from rank 0.

Reduce: each rank receives the whole buffer from its children, nearest first
(``OUT = OUT op incoming``), then sends the sum to its parent. Broadcast: each rank receives the
result from its parent, then sends it to its children, farthest (largest subtree) first. Only
rank 0 computes the final values, so every rank ends bit-identical.

Steps: 2*ceil(log2 size) on the critical path. Sent per rank: count elements * (1 + number of
children); rank 0 sends ceil(log2 size) * count. Latency-optimal, not bandwidth-optimal.
TMP: none (in place).
"""

from __future__ import annotations

from functools import lru_cache

from ._common import finish
from ._trees import children, parent
from .schedule import OUT, Recv, Region, Schedule, Send, Step


@lru_cache(maxsize=256)
def schedule(rank: int, size: int, count: int, root: int = 0) -> Schedule:
    """Binomial-tree allreduce: reduce the whole buffer up the tree to rank 0, then broadcast the result
    back down; returns the Schedule of rank ``rank``."""
    whole = Region(OUT, 0, count)
    kids = children(rank, size)
    steps = [Step(recvs=(Recv(c, whole, reduce_with=whole),)) for c in kids]
    if rank:
        steps.append(Step(sends=(Send(parent(rank), whole),)))
        steps.append(Step(recvs=(Recv(parent(rank), whole),)))
    steps += [Step(sends=(Send(c, whole),)) for c in reversed(kids)]
    return finish(steps)
