"""Halving-doubling allreduce (Rabenseifner): recursive-halving reduce-scatter, then
recursive-doubling allgather, over p = the largest power of two <= size.

Fold (size not a power of two, see ``_fold``): each extra sends its buffer to its proxy, which
reduces it in. Core, on p newranks with OUT cut into p chunks: log2(p) halving steps, each
sending the half not kept to the partner and reducing the partner's copy of the half kept,
leave newrank v with chunk v reduced; log2(p) doubling steps swap the reduced ranges back.
Unfold: each proxy sends the result to its extra. Every element is computed by one rank and
then copied, so all ranks end bit-identical.

Steps: 2*log2(p), plus 2 for the fold when size != p. Sent per core rank: 2*(p-1)/p * count
elements (as many received); proxies also receive and send count in the fold; extras send and
receive count. TMP: none (in place).
"""

from __future__ import annotations

from functools import lru_cache
from typing import Iterator

import numpy as np

from ._common import chunk_prefix, finish, span
from ._fold import Fold, doubling, halving
from .schedule import OUT, Recv, Region, Schedule, Send, Step, StepFlows, chunk_bounds


@lru_cache(maxsize=256)
def schedule(rank: int, size: int, count: int, root: int = 0) -> Schedule:
    """Halving-doubling (Rabenseifner) allreduce: log2(p) recursive-halving reduce-scatter steps, then
    log2(p) recursive-doubling allgather steps, with extras folded onto proxies when size is not a power
    of two; returns the Schedule of rank ``rank``."""
    fold = Fold(size)
    whole = Region(OUT, 0, count)
    if fold.is_extra(rank):
        return finish([Step(sends=(Send(rank - 1, whole),)), Step(recvs=(Recv(rank - 1, whole),))])
    chunks = chunk_bounds(count, fold.p)
    v, extra = fold.newrank(rank), fold.extra_of(rank)
    steps = []
    if extra is not None:
        steps.append(Step(recvs=(Recv(extra, whole, reduce_with=whole),)))
    for partner, sent, kept in halving(v, fold.p):
        peer, acc = fold.first(partner), span(OUT, chunks, *kept)
        sends = (Send(peer, span(OUT, chunks, *sent)),)
        steps.append(Step(sends=sends, recvs=(Recv(peer, acc, reduce_with=acc),)))
    for partner, mine, theirs in doubling(v, fold.p):
        peer = fold.first(partner)
        sends = (Send(peer, span(OUT, chunks, *mine)),)
        steps.append(Step(sends=sends, recvs=(Recv(peer, span(OUT, chunks, *theirs)),)))
    if extra is not None:
        steps.append(Step(sends=(Send(extra, whole),)))
    return finish(steps)


def flows(size: int, count: int, root: int = 0) -> Iterator[StepFlows]:
    """Every rank's steps at once (see ``StepFlows``); needs a power-of-two ``size`` (no fold)
    and ``count >= size`` so no step is empty."""
    if size < 2 or size & (size - 1) or count < size:
        raise ValueError("hd flows need a power-of-two size >= 2 and count >= size")
    prefix = chunk_prefix(count, size)
    v = np.arange(size)

    def block(owner: np.ndarray, dist: int) -> np.ndarray:  # elements in the aligned block of `dist` chunks
        lo = owner - owner % dist
        return prefix[lo + dist] - prefix[lo]

    partners = {}  # the same arrays in both phases: the simulator routes each pattern once
    dist = size // 2
    while dist:  # halving: send the partner's half, reduce the partner's copy of ours
        partner = partners[dist] = v ^ dist
        yield StepFlows(partner, block(partner, dist), partner, True)
        dist //= 2
    dist = 1
    while dist < size:  # doubling: swap the reduced ranges
        partner = partners[dist]
        yield StepFlows(partner, block(v, dist), partner, False)
        dist *= 2
