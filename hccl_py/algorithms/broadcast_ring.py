"""Pipelined chain broadcast along the ring, starting at the root.

The chain is root, root+1, ..., root+size-1. The buffer is cut into K = size chunks so that the
chain pipelines: in step t the rank at chain position d >= 1 receives chunk t-d+1 from its
predecessor while forwarding chunk t-d to its successor. With K = size the pipeline takes
2*size-2 steps of count/size elements each, which costs about what one ring allreduce does
(latency 2*(size-1) hops, each rank sending ~count elements); more chunks would trade latency
for bandwidth, fewer the other way.

Steps: the pipeline is size + K - 2 = 2*size - 2 steps long, each rank active in at most K + 1
of them (fewer when count < size); a rank idles (empty steps) until the first chunk reaches it,
so step t is the same moment of the pipeline on every rank. Sent per non-tail rank: count elements; received per non-root
rank: count. TMP: none. The root only reads its buffer.
"""

from __future__ import annotations

from functools import lru_cache

from ._common import absolute, finish, relative
from .schedule import OUT, Recv, Region, Schedule, Send, Step, chunk_bounds


@lru_cache(maxsize=256)
def schedule(rank: int, size: int, count: int, root: int = 0) -> Schedule:
    """Ring (chain) broadcast: the buffer, cut into size chunks, pipelined from the root along root,
    root+1, ... over 2*size-2 steps; returns the Schedule of rank ``rank``."""
    chunks = chunk_bounds(count, size)
    d = relative(rank, root, size)
    prev, nxt = absolute(d - 1, root, size), absolute(d + 1, root, size)
    steps = []
    for t in range(size + len(chunks) - 2):
        sends = (Send(nxt, Region(OUT, *chunks[t - d])),) if d < size - 1 and 0 <= t - d < len(chunks) else ()
        recvs = (Recv(prev, Region(OUT, *chunks[t - d + 1])),) if d > 0 and 0 <= t - d + 1 < len(chunks) else ()
        steps.append(Step(sends=sends, recvs=recvs))
    return finish(steps, aligned=True)
