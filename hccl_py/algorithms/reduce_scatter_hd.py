"""Recursive-halving reduce-scatter, for any size (folding as in ``_fold``).

Fold: each extra sends all of its IN to its proxy, which reduces it into TMP. Core: newrank v
stands for the blocks of ranks first(v) .. first(v+1)-1 (contiguous in IN); in log2(p) halving
steps it sends the blocks of the half not kept to partner v ^ 2^k and reduces the partner's
copy of the half kept. Partials live in TMP (IN is never written); a core rank without an extra
reduces its last step straight into OUT. Unfold: each proxy copies its own block to OUT and
sends the extra's block to the extra. Every element is reduced by one rank.

Steps: log2(p), plus 2 when size != p. Sent per core rank: about (size-1) * count elements
(exactly that for size = p); extras send size * count and receive count.
TMP: size * count elements on core ranks (none on extras, none for size = 2).
"""

from __future__ import annotations

from functools import lru_cache
from typing import Iterator

import numpy as np

from ._common import block_bounds, finish, span
from ._fold import Fold, halving
from .schedule import IN, OUT, TMP, Copy, Recv, Region, Schedule, Send, Step, StepFlows


@lru_cache(maxsize=256)
def schedule(rank: int, size: int, count: int, root: int = 0) -> Schedule:
    """Recursive-halving reduce-scatter: log2(p) halving steps leave each newrank its blocks reduced;
    extras send their IN to a proxy and get their block back. Returns the Schedule of rank ``rank``."""
    fold = Fold(size)
    blocks = block_bounds(count, size)
    every = Region(IN, 0, size * count)
    mine = Region(OUT, 0, count)
    if size == 1:
        return finish([Step(copies=(Copy(every, mine),))])
    if fold.is_extra(rank):
        return finish([Step(sends=(Send(rank - 1, every),)), Step(recvs=(Recv(rank - 1, mine),))])
    held_bounds = fold.group_bounds(count)  # newrank v reduces the blocks of the ranks it stands for
    extra = fold.extra_of(rank)
    v = fold.newrank(rank)
    steps = []
    src = IN  # where this rank's partial of the blocks still held lies
    if extra is not None:
        steps.append(Step(recvs=(Recv(extra, Region(TMP, 0, size * count), reduce_with=every),)))
        src = TMP
    for partner, sent, kept in halving(v, fold.p):
        peer = fold.first(partner)
        acc = mine if kept == (v, v + 1) and extra is None else span(TMP, held_bounds, *kept)
        recv = Recv(peer, acc, reduce_with=span(src, held_bounds, *kept))
        steps.append(Step(sends=(Send(peer, span(src, held_bounds, *sent)),), recvs=(recv,)))
        src = TMP
    if extra is not None:
        own = Copy(Region(TMP, *blocks[rank]), mine)
        steps.append(Step(copies=(own,), sends=(Send(extra, Region(TMP, *blocks[extra])),)))
    return finish(steps)


def flows(size: int, count: int, root: int = 0) -> Iterator[StepFlows]:
    """Every rank's steps at once (see ``StepFlows``); needs a power-of-two ``size`` (no fold)
    and ``count >= 1``."""
    if size < 2 or size & (size - 1) or count < 1:
        raise ValueError("hd reduce_scatter flows need a power-of-two size >= 2 and count >= 1")
    v = np.arange(size)
    dist = size // 2
    while dist:  # halving: send the half not kept (dist blocks), reduce the partner's copy of ours
        partner = v ^ dist
        yield StepFlows(partner, np.full(size, dist * count), partner, True)
        dist //= 2
