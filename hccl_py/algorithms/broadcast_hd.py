"""Halving-doubling broadcast (van de Geijn): scatter by recursive halving from the root, then
recursive-doubling allgather; for any size (ranks relative to the root, folded as in ``_fold``;
the root is always a core rank).

The buffer is cut into p chunks. Scatter: a binomial scatter over the p newranks - newrank v
receives the chunks of its subtree [v, v + lowbit(v)) from its parent, then passes the upper
halves on to its children, farthest first. Allgather: log2(p) doubling steps; a transfer is
left out when the receiver already holds those chunks from the scatter (the partner's range
lies inside its subtree), so every core rank receives each chunk exactly once and the root
never writes its buffer. Unfold: each proxy sends the whole buffer to its extra.

Steps: 2*log2(p), plus 1 when size != p. Received per non-root core rank: count elements
(once each); sent by the root: about 2*(p-1)/p * count; by proxies count more for the extra.
TMP: none.
"""

from __future__ import annotations

from functools import lru_cache

from ._common import absolute, finish, relative, span
from ._fold import Fold, doubling
from ._trees import children, lowbit, parent, subtree
from .schedule import OUT, Recv, Region, Schedule, Send, Step, chunk_bounds


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

    if fold.is_extra(u):
        return finish([Step(recvs=(Recv(absolute(u - 1, root, size), whole),))])
    chunks = chunk_bounds(count, p)
    v = fold.newrank(u)
    steps = []
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
    return finish(steps)
