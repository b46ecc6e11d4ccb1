"""One-shot allreduce: every rank sends its whole buffer to every other rank, then folds.

HCCL's small-message allreduce inside a full-mesh server (a "one-shot" mesh executor): one
round of messages instead of the reduce-scatter + allgather pair of ``mesh``, paid for with
(size-1) full buffers sent per rank. It wins while latency dominates, which the cost model
decides (``algo="auto"``).

Step 1: rank r sends OUT to every peer and receives peer j's buffer into TMP block j, and
copies its own OUT into TMP block r. Step 2 (local): the fold x0 op x1 op ... op x(size-1),
left to right, every term read from TMP, the running value in TMP block ``size`` and the last
operation writing OUT. Every rank makes the same numpy calls with the same operands in the same
order and the same aliasing (numpy picks its loop by aliasing: a length-1 ``add`` whose output
is its first input keeps the second operand's NaN payload), so all ranks end bit-identical,
NaN payloads and signed zeros included.

Steps: 2 (one exchange, one local). Sent per rank: (size-1) * count elements (as many received).
TMP: (size + 1) * count.
"""

from __future__ import annotations

from functools import lru_cache

from ._common import finish
from .schedule import OUT, TMP, Copy, Recv, Region, Schedule, Send, Step


@lru_cache(maxsize=256)
def schedule(rank: int, size: int, count: int, root: int = 0) -> Schedule:
    """One-shot allreduce: one step exchanging whole buffers into TMP, then a local left-to-right fold into
    OUT; returns the Schedule of rank ``rank`` (no steps for size 1 or count 0)."""
    if size == 1 or count == 0:
        return finish([])
    mine = Region(OUT, 0, count)
    term = [Region(TMP, j * count, count) for j in range(size)]
    peers = [j for j in range(size) if j != rank]
    exchange = Step(
        copies=(Copy(mine, term[rank]),),
        sends=tuple(Send(j, mine) for j in peers),
        recvs=tuple(Recv(j, term[j]) for j in peers),
    )
    running = Region(TMP, size * count, count)
    fold = []
    acc = term[0]
    for j in range(1, size):
        dst = mine if j == size - 1 else running
        fold.append(Copy(term[j], dst, reduce_with=acc))
        acc = dst
    return finish([exchange, Step(copies=tuple(fold))])
