"""Recursive-doubling allgather, for any size (folding as in ``_fold``).

Every rank copies IN into its block of OUT. Fold: each extra sends its IN to its proxy, which
then holds two adjacent blocks. Core: in log2(p) doubling steps newrank v swaps the blocks it
holds with partner v ^ 2^k; the blocks a newrank range stands for are contiguous, so each step
is one message each way. Unfold: each proxy sends its extra all of OUT but the extra's own
block, as at most 2 contiguous regions.

Steps: log2(p), plus 2 when size != p. Sent per core rank: about (size-1) * count elements in
the core (exactly that for size = p); proxies send (size-1) * count more in the unfold.
TMP: none.
"""

from __future__ import annotations

from functools import lru_cache
from typing import Iterator

import numpy as np

from ._common import block_bounds, finish, span
from ._fold import Fold, doubling
from .schedule import IN, OUT, Copy, Recv, Region, Schedule, Send, Step, StepFlows


@lru_cache(maxsize=256)
def schedule(rank: int, size: int, count: int, root: int = 0) -> Schedule:
    """Recursive-doubling allgather: each extra hands its IN to its proxy, log2(p) doubling steps swap the
    blocks held with partner v ^ 2^k, then each proxy sends its extra the rest of OUT; returns the
    Schedule of rank ``rank``."""
    fold = Fold(size)
    blocks = block_bounds(count, size)
    own = Region(IN, 0, count)
    copy_own = Copy(own, Region(OUT, *blocks[rank]))
    if fold.is_extra(rank):
        proxy = rank - 1
        rest = (Recv(proxy, span(OUT, blocks, 0, rank)), Recv(proxy, span(OUT, blocks, rank + 1, size)))
        return finish([Step(copies=(copy_own,), sends=(Send(proxy, own),)), Step(recvs=rest)])
    held_bounds = fold.group_bounds(count)  # newrank v holds the blocks of the ranks it stands for
    extra = fold.extra_of(rank)
    folded = (Recv(extra, Region(OUT, *blocks[extra])),) if extra is not None else ()
    steps = [Step(copies=(copy_own,), recvs=folded)]
    for partner, mine, theirs in doubling(fold.newrank(rank), fold.p):
        peer = fold.first(partner)
        sends = (Send(peer, span(OUT, held_bounds, *mine)),)
        steps.append(Step(sends=sends, recvs=(Recv(peer, span(OUT, held_bounds, *theirs)),)))
    if extra is not None:
        rest = (Send(extra, span(OUT, blocks, 0, extra)), Send(extra, span(OUT, blocks, extra + 1, size)))
        steps.append(Step(sends=rest))
    return finish(steps)


def flows(size: int, count: int, root: int = 0) -> Iterator[StepFlows]:
    """Every rank's steps at once (see ``StepFlows``); needs a power-of-two ``size`` (no fold)
    and ``count >= 1``."""
    if size < 2 or size & (size - 1) or count < 1:
        raise ValueError("hd allgather flows need a power-of-two size >= 2 and count >= 1")
    v = np.arange(size)
    none = np.full(size, -1)
    yield StepFlows(none, np.zeros(size, dtype=np.int64), none, False, copies=(count,))
    dist = 1
    while dist < size:  # swap the aligned range held, doubling it
        partner = v ^ dist
        yield StepFlows(partner, np.full(size, dist * count), partner, False)
        dist *= 2
