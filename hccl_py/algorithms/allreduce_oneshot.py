"""One-shot allreduce: every rank sends its whole buffer to every other rank, then folds.

HCCL's small-message allreduce inside a full-mesh server (a "one-shot" mesh executor): one
round of messages instead of the reduce-scatter + allgather pair of ``mesh``, paid for with
(size-1) full buffers sent per rank. It wins while latency dominates, which the cost model
decides (``algo="auto"``).

Step 1: rank r sends OUT to every peer and receives peer j's buffer into TMP block j.
Step 2 (local): the fold x0 op x1 op ... op x(size-1), left to right, with rank r's own term
read from OUT, the running value in TMP block 0 and the last operation writing OUT. Every rank
evaluates the same expression in the same order, so all end bit-identical.

Steps: 2 (one exchange, one local). Sent per rank: (size-1) * count elements (as many received).
TMP: size * count (block r unused).
"""

from __future__ import annotations

from functools import lru_cache

from ._common import finish
from .schedule import OUT, TMP, Copy, Recv, Region, Schedule, Send, Step


@lru_cache(maxsize=256)
def schedule(rank: int, size: int, count: int, root: int = 0) -> Schedule:
    if size == 1 or count == 0:
        return finish([])
    mine = Region(OUT, 0, count)
    term = [mine if j == rank else Region(TMP, j * count, count) for j in range(size)]
    peers = [j for j in range(size) if j != rank]
    exchange = Step(sends=tuple(Send(j, mine) for j in peers), recvs=tuple(Recv(j, term[j]) for j in peers))
    running = Region(TMP, 0, count)
    fold = []
    acc = term[0]
    for j in range(1, size):
        dst = mine if j == size - 1 else running
        fold.append(Copy(term[j], dst, reduce_with=acc))
        acc = dst
    return finish([exchange, Step(copies=tuple(fold))])
