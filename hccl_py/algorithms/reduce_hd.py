"""Halving-doubling reduce: recursive-halving reduce-scatter, then a binomial gather of the
reduced chunks to the root; for any size (ranks relative to the root, folded as in ``_fold``;
the root is always a core rank).

Fold: each extra sends its buffer to its proxy, which reduces it in. Core, with the buffer cut
into p chunks: log2(p) halving steps leave newrank v with chunk v reduced; then newrank v
receives the reduced chunks of its binomial subtree [v, v + lowbit(v)) from its children,
nearest first, and sends them to its parent. Non-root ranks keep partials in TMP (their
buffer stays untouched), the root works in OUT. Every element is reduced by one rank.

Steps: 2*log2(p), plus 1 when size != p (an idle one for ranks without an extra, so step k is
the same moment on every rank). Sent per core rank: about (p-1)/p * count in the
halving plus its subtree's chunks in the gather; extras send count.
TMP: count elements on non-root core ranks, none on extras and the root.
"""

from __future__ import annotations

from functools import lru_cache
from typing import Iterator

import numpy as np

from ._common import absolute, chunk_prefix, finish, relative, span, without_empty
from ._fold import Fold, halving
from ._trees import children, parent, subtree
from .schedule import IN, OUT, TMP, Recv, Region, Schedule, Send, Step, StepFlows, chunk_bounds

# the schedules number ranks from the root: flows for root 0 serve any root, rotated (simulator._Rotated)
RELATIVE_TO_ROOT = True


@lru_cache(maxsize=256)
def schedule(rank: int, size: int, count: int, root: int = 0) -> Schedule:
    """Halving-doubling reduce: log2(p) recursive-halving reduce-scatter steps, then a binomial gather of
    the reduced chunks to the root, extras folded onto proxies; returns the Schedule of rank ``rank``."""
    fold = Fold(size)
    p = fold.p
    u = relative(rank, root, size)

    def peer(w: int) -> int:  # the rank that plays newrank w
        return absolute(fold.first(w), root, size)

    if fold.is_extra(u):
        return finish([Step(sends=(Send(absolute(u - 1, root, size), Region(IN, 0, count)),))])
    chunks = chunk_bounds(count, p)
    acc = OUT if u == 0 else TMP  # where reduced data goes; on the root IN is OUT (in place)
    src = OUT if u == 0 else IN  # where this rank's partial of the chunks still held lies
    v = fold.newrank(u)
    steps = []
    extra = fold.extra_of(u)
    if extra is not None:
        recv = Recv(absolute(extra, root, size), Region(acc, 0, count), reduce_with=Region(src, 0, count))
        steps.append(Step(recvs=(recv,)))
        src = acc
    elif size != p:  # idle while the proxies take their extras' data in: step k is the same moment everywhere
        steps.append(Step())
    for partner, sent, kept in halving(v, p):
        recv = Recv(peer(partner), span(acc, chunks, *kept), reduce_with=span(src, chunks, *kept))
        steps.append(Step(sends=(Send(peer(partner), span(src, chunks, *sent)),), recvs=(recv,)))
        src = acc
    steps += [Step(recvs=(Recv(peer(c), span(acc, chunks, *subtree(c, p))),)) for c in children(v, p)]
    if v:
        steps.append(Step(sends=(Send(peer(parent(v)), span(acc, chunks, *subtree(v, p))),)))
    return finish(steps, aligned=True)


def flows(size: int, count: int, root: int = 0) -> Iterator[StepFlows]:
    """Every rank's steps at once: halving step d, v sends the half of its range without v to
    v ^ d and reduces in the half with it; gather round w, newranks whose lowest bit is w send
    their subtree's chunks to v - w. Needs root 0, a power-of-two ``size >= 2`` and ``count >= 1``
    (empty chunks move nothing)."""
    if size < 2 or size & (size - 1) or count < 1 or root != 0:
        raise ValueError("hd reduce flows need root 0, a power-of-two size >= 2 and count >= 1")
    p = size
    ranks = np.arange(p)
    prefix = chunk_prefix(count, p)
    dist = p // 2
    while dist:  # recursive halving over the range [lo, lo + 2d) that holds v
        lo = ranks - ranks % (2 * dist)
        upper = ranks - lo >= dist  # v keeps the upper half and sends the lower
        sent_lo = np.where(upper, lo, lo + dist)
        yield without_empty(StepFlows(ranks ^ dist, prefix[sent_lo + dist] - prefix[sent_lo], ranks ^ dist, True))
        dist //= 2
    width = 1
    while width < p:  # binomial gather: v with lowest bit w sends [v, v + w) to v - w
        senders = ranks[width :: 2 * width]
        send_to = np.full(p, -1)
        recv_from = np.full(p, -1)
        send_to[senders] = senders - width
        recv_from[senders - width] = senders
        counts = np.zeros(p, dtype=np.int64)
        counts[senders] = prefix[senders + width] - prefix[senders]
        yield without_empty(StepFlows(send_to, counts, recv_from, False))
        width *= 2
