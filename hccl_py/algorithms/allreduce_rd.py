"""Recursive-doubling allreduce (MPICH's small-message allreduce): the whole vector is swapped
with partners v^1, v^2, ..., v^(p/2) among p = the largest power of two <= size, and reduced
after each swap.

Fold (size not a power of two, see ``_fold``): each extra sends its buffer to its proxy, which
reduces it in; at the end the proxy sends the result back. Buffers alternate between OUT and TMP
so that no step's receive writes what its send reads; a last copy brings the result home when
it ends in TMP. Both partners compute ``lower op upper`` (the partial of the
pair's lower half first, ``Recv.incoming_first`` on the upper rank): ``a op b`` and ``b op a``
are equal in value but not in bits (NaN payloads, +0 against -0), so one order keeps every rank
bit-identical.

Steps: log2(p), plus 2 for the fold when size != p. Sent per core rank: log2(p) * count elements:
latency-optimal, bandwidth-poor, so the cost model picks it for small messages only.
TMP: count (when size >= 2).
"""

from __future__ import annotations

from functools import lru_cache
from typing import Iterator

import numpy as np

from ._common import finish
from ._fold import Fold
from .schedule import OUT, TMP, Copy, Recv, Region, Schedule, Send, Step, StepFlows


@lru_cache(maxsize=256)
def schedule(rank: int, size: int, count: int, root: int = 0) -> Schedule:
    """Recursive-doubling allreduce: log2(p) steps each swapping the whole buffer with partner v ^ 2^k
    and reducing it (OUT and TMP alternating), folded when size is not a power of two; returns the
    Schedule of rank ``rank``."""
    fold = Fold(size)
    whole = Region(OUT, 0, count)
    if fold.is_extra(rank):
        return finish([Step(sends=(Send(rank - 1, whole),)), Step(recvs=(Recv(rank - 1, whole),))])
    v, extra = fold.newrank(rank), fold.extra_of(rank)
    steps = []
    if extra is not None:
        steps.append(Step(recvs=(Recv(extra, whole, reduce_with=whole),)))
    held = OUT
    dist = 1
    while dist < fold.p:
        peer = fold.first(v ^ dist)
        mine, into = Region(held, 0, count), Region(TMP if held == OUT else OUT, 0, count)
        # Both partners compute (lower group's partial) op (upper group's): one order, one result.
        upper = bool(v & dist)
        steps.append(Step(sends=(Send(peer, mine),), recvs=(Recv(peer, into, reduce_with=mine, incoming_first=upper),)))
        held = into.buf
        dist *= 2
    home = (Copy(Region(held, 0, count), whole),) if held != OUT else ()
    steps.append(Step(copies=home, sends=(Send(extra, whole),) if extra is not None else ()))
    return finish(steps)


def flows(size: int, count: int, root: int = 0) -> Iterator[StepFlows]:
    """Every rank's steps at once (see ``StepFlows``); needs a power-of-two ``size`` (no fold)
    and ``count >= 1``."""
    if size < 2 or size & (size - 1) or count < 1:
        raise ValueError("rd flows need a power-of-two size >= 2 and count >= 1")
    v = np.arange(size)
    counts = np.full(size, count)
    dist, swaps = 1, 0
    while dist < size:  # swap the whole buffer with v ^ dist and reduce it
        yield StepFlows(v ^ dist, counts, v ^ dist, True)
        dist, swaps = dist * 2, swaps + 1
    if swaps % 2:  # the result ends in TMP: a last copy brings it home
        none = np.full(size, -1)
        yield StepFlows(none, np.zeros(size, dtype=np.int64), none, False, copies=(count,))
