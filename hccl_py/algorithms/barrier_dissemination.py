"""Dissemination barrier (Hensgen, Finkel and Manber).

In round k = 0 .. ceil(log2 size)-1 rank r sends one element to r + 2^k and receives one from
r - 2^k (mod size). After round k a rank has heard, directly or not, from the 2^(k+1)-1 ranks
before it, so after the last round from all of them: no rank leaves before every rank arrived.
The element is sent from TMP[0] and received into TMP[1] so that no receive writes what a send
of the same step reads; its value is meaningless (the executor uses dtype uint8).

Steps: ceil(log2 size). Sent per rank: ceil(log2 size) one-element messages. TMP: 2 elements.
"""

from __future__ import annotations

from functools import lru_cache

from ._common import finish
from .schedule import TMP, Recv, Region, Schedule, Send, Step


@lru_cache(maxsize=256)
def schedule(rank: int, size: int, count: int = 0, root: int = 0) -> Schedule:
    """Dissemination barrier: ceil(log2 size) rounds, in round k one element to rank + 2^k and one from
    rank - 2^k (``count`` and ``root`` unused); returns the Schedule of rank ``rank``."""
    steps = []
    dist = 1
    while dist < size:
        sends = (Send((rank + dist) % size, Region(TMP, 0, 1)),)
        steps.append(Step(sends=sends, recvs=(Recv((rank - dist) % size, Region(TMP, 1, 1)),)))
        dist *= 2
    return finish(steps)
