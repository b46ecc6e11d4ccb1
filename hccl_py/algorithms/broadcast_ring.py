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
from typing import Iterator

from ._common import absolute, chain_pattern, chunk_windows, finish, relative
from .schedule import OUT, Recv, Region, Schedule, Send, Step, StepFlows, chunk_bounds

# the schedules number ranks from the root: flows for root 0 serve any root, rotated (simulator._Rotated)
RELATIVE_TO_ROOT = True


@lru_cache(maxsize=256)
def schedule(rank: int, size: int, count: int, root: int = 0) -> Schedule:
    """Ring (chain) broadcast: the buffer, cut into size chunks, pipelined from the root along root,
    root+1, ... over 2*size-2 steps; returns the Schedule of rank ``rank``."""
    chunks = chunk_bounds(count, size)[:count]  # fewer elements than ranks: the empty chunks move nothing
    d = relative(rank, root, size)
    prev, nxt = absolute(d - 1, root, size), absolute(d + 1, root, size)
    steps = []
    for t in range(size + len(chunks) - 2):
        sends = (Send(nxt, Region(OUT, *chunks[t - d])),) if d < size - 1 and 0 <= t - d < len(chunks) else ()
        recvs = (Recv(prev, Region(OUT, *chunks[t - d + 1])),) if d > 0 and 0 <= t - d + 1 < len(chunks) else ()
        steps.append(Step(sends=sends, recvs=recvs))
    return finish(steps, aligned=True)


def flows(size: int, count: int, root: int = 0) -> Iterator[StepFlows]:
    """Every rank's steps at once (``StepFlows.senders``: in step t ranks t-K+1 .. t send chunk
    t - d on, K the chunks that hold elements); root 0, ``size >= 2`` and ``count >= 1``."""
    if size < 2 or count < 1 or root != 0:
        raise ValueError("ring broadcast flows need root 0, size >= 2 and count >= 1")
    k = min(count, size)
    send_to, recv_from = chain_pattern(size, towards_root=False)
    backwards = chunk_windows(count, k, size)[::-1]  # rank d's chunk t - d, read as one view per step
    last = len(backwards) - 1
    for t in range(size + k - 2):
        counts = backwards[last - size - t : last - t]
        yield StepFlows(send_to, counts, recv_from, False, senders=slice(max(0, t - k + 1), min(t, size - 2) + 1))
