"""Pipelined chain reduce towards the root (the reverse of broadcast_ring).

The chain runs root+size-1 -> ... -> root+1 -> root; the buffer is cut into K = size chunks.
With u = the distance from the tail, in step t a rank receives chunk t-u+1 from its predecessor
(one further from the root) and reduces it with its own IN chunk, while forwarding chunk t-u.
The tail sends its IN chunks as they are; middle ranks accumulate in TMP (they must not write
their buffer); the root accumulates in OUT. Each chunk is reduced in chain order from the tail.

Steps: the pipeline is 2*size - 2 steps long, each rank active in at most K + 1 of them (fewer
when count < size); a rank idles (empty steps) until the first chunk reaches it, so step t is the
same moment of the pipeline on every rank. Sent per non-root rank: count elements; received per non-tail rank: count.
TMP: count elements on the middle ranks of the chain, none on root and tail.
"""

from __future__ import annotations

from functools import lru_cache
from typing import Iterator

from ._common import absolute, chain_pattern, chunk_windows, finish, relative
from .schedule import IN, OUT, TMP, Recv, Region, Schedule, Send, Step, StepFlows, chunk_bounds

# the schedules number ranks from the root: flows for root 0 serve any root, rotated (simulator._Rotated)
RELATIVE_TO_ROOT = True


@lru_cache(maxsize=256)
def schedule(rank: int, size: int, count: int, root: int = 0) -> Schedule:
    """Ring (chain) reduce: size chunks pipelined from the chain's tail to the root, each rank reducing what
    it receives with its own IN chunk, over 2*size-2 steps; returns the Schedule of rank ``rank``."""
    chunks = chunk_bounds(count, size)[:count]  # fewer elements than ranks: the empty chunks move nothing
    d = relative(rank, root, size)
    u = size - 1 - d
    towards, away = absolute(d - 1, root, size), absolute(d + 1, root, size)
    acc = OUT if d == 0 else TMP
    src = IN if u == 0 else acc  # the tail forwards its own data; others what they reduced
    steps = []
    for t in range(size + len(chunks) - 2):
        sends = (Send(towards, Region(src, *chunks[t - u])),) if d > 0 and 0 <= t - u < len(chunks) else ()
        recvs = ()
        if u > 0 and 0 <= t - u + 1 < len(chunks):
            chunk = chunks[t - u + 1]
            recvs = (Recv(away, Region(acc, *chunk), reduce_with=Region(IN, *chunk)),)
        steps.append(Step(sends=sends, recvs=recvs))
    return finish(steps, aligned=True)


def flows(size: int, count: int, root: int = 0) -> Iterator[StepFlows]:
    """Every rank's steps at once (``StepFlows.senders``: in step t rank d, u = size-1-d from the
    tail, sends chunk t - u towards the root, which reduces it in); root 0, ``size >= 2`` and
    ``count >= 1`` (K, the chunks that hold elements, in flight)."""
    if size < 2 or count < 1 or root != 0:
        raise ValueError("ring reduce flows need root 0, size >= 2 and count >= 1")
    k = min(count, size)
    send_to, recv_from = chain_pattern(size, towards_root=True)
    sizes = chunk_windows(count, k, size)  # rank d's chunk t - u at t + 1 + d
    for t in range(size + k - 2):
        yield StepFlows(
            send_to,
            sizes[t + 1 : t + 1 + size],
            recv_from,
            True,
            senders=slice(max(1, size - 1 - t), min(size - 1, size - 2 - t + k) + 1),
        )
