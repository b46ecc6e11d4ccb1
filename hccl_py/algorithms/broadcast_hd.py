"""Halving-doubling broadcast (van de Geijn): scatter by recursive halving from the root, then
recursive-doubling allgather; for any size (ranks relative to the root, folded as in ``_fold``;
the root is always a core rank).

The buffer is cut into p chunks. Scatter: a binomial scatter over the p newranks - newrank v
receives the chunks of its subtree [v, v + lowbit(v)) from its parent, then passes the upper
halves on to its children, farthest first. Allgather: log2(p) doubling steps; a transfer is
left out when the receiver already holds those chunks from the scatter (the partner's range
lies inside its subtree), so every core rank receives each chunk exactly once and the root
never writes its buffer. Unfold: each proxy sends the whole buffer to its extra.

Steps: 2*log2(p), plus 1 when size != p; a rank idles (empty steps) until the scatter reaches it,
and an extra until its proxy's last step, so step k is the same moment on every rank. Received per non-root core rank: count elements
(once each); sent by the root: about 2*(p-1)/p * count; by proxies count more for the extra.
TMP: none.
"""

from __future__ import annotations

from functools import lru_cache
from typing import Iterator

import numpy as np

from ._common import absolute, chunk_prefix, finish, relative, span, without_empty
from ._fold import Fold, doubling
from ._trees import children, lowbit, parent, subtree
from .schedule import OUT, Recv, Region, Schedule, Send, Step, StepFlows, chunk_bounds

# the schedules number ranks from the root: flows for root 0 serve any root, rotated (simulator._Rotated)
RELATIVE_TO_ROOT = True


@lru_cache(maxsize=256)
def schedule(rank: int, size: int, count: int, root: int = 0) -> Schedule:
    """Halving-doubling (van de Geijn) broadcast: binomial scatter of p chunks from the root, then a
    recursive-doubling allgather, then each proxy sends the buffer to its extra; returns the
    Schedule of rank ``rank``."""
    fold = Fold(size)
    p = fold.p
    whole = Region(OUT, 0, count)
    u = relative(rank, root, size)

    def peer(w: int) -> int:  # the rank that plays newrank w
        return absolute(fold.first(w), root, size)

    rounds = p.bit_length() - 1  # log2(p): the scatter's rounds, then as many doubling steps
    if fold.is_extra(u):  # idle until its proxy's unfold step
        return finish([Step()] * (2 * rounds) + [Step(recvs=(Recv(absolute(u - 1, root, size), whole),))], aligned=True)
    chunks = chunk_bounds(count, p)
    v = fold.newrank(u)
    # scatter round j moves subtrees of p >> (j+1) newranks: v idles until the round its own comes
    steps = [Step()] * (rounds - lowbit(v, p).bit_length() if v else 0)
    if v:
        steps.append(Step(recvs=(Recv(peer(parent(v)), span(OUT, chunks, *subtree(v, p))),)))
    steps += [Step(sends=(Send(peer(c), span(OUT, chunks, *subtree(c, p))),)) for c in reversed(children(v, p))]
    for partner, mine, theirs in doubling(v, p):
        dist = mine[1] - mine[0]
        # a rank already holds its whole scatter subtree, i.e. the partner's range when dist < lowbit
        sends = (Send(peer(partner), span(OUT, chunks, *mine)),) if dist >= lowbit(partner, p) else ()
        recvs = (Recv(peer(partner), span(OUT, chunks, *theirs)),) if dist >= lowbit(v, p) else ()
        steps.append(Step(sends=sends, recvs=recvs))
    extra = fold.extra_of(u)
    if extra is not None:
        steps.append(Step(sends=(Send(absolute(extra, root, size), whole),)))
    return finish(steps, aligned=True)


def flows(size: int, count: int, root: int = 0) -> Iterator[StepFlows]:
    """Every rank's steps at once: scatter round j, newranks that are multiples of p >> j send the
    subtree of their child p >> (j+1) on; doubling step d, v and v ^ d swap what the other lacks.
    Needs root 0, a power-of-two ``size >= 2`` and ``count >= 1`` (empty chunks move nothing)."""
    if size < 2 or size & (size - 1) or count < 1 or root != 0:
        raise ValueError("hd broadcast flows need root 0, a power-of-two size >= 2 and count >= 1")
    p = size
    ranks = np.arange(p)
    prefix = chunk_prefix(count, p)
    low = np.where(ranks > 0, ranks & -ranks, p)  # lowbit, the root's being p
    width = p // 2
    while width:  # scatter: senders 0, 2w, 4w, ... send the subtree of v + w
        send_to = np.full(p, -1)
        recv_from = np.full(p, -1)
        senders = ranks[:: 2 * width]
        send_to[senders] = senders + width
        recv_from[senders + width] = senders
        counts = np.zeros(p, dtype=np.int64)
        counts[senders] = prefix[senders + 2 * width] - prefix[senders + width]
        yield without_empty(StepFlows(send_to, counts, recv_from, False))
        width //= 2
    dist = 1
    while dist < p:  # doubling: a transfer is left out where the receiver holds the range from the scatter
        partner = ranks ^ dist
        base = ranks - ranks % dist
        yield without_empty(
            StepFlows(
                np.where(dist >= low[partner], partner, -1),
                prefix[base + dist] - prefix[base],
                np.where(dist >= low, partner, -1),
                False,
            )
        )
        dist *= 2
