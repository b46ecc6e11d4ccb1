"""Binomial-tree allreduce: binomial reduce to rank 0, then binomial broadcast from rank 0.

Reduce: each rank receives the whole buffer from its children, nearest first
(``OUT = OUT op incoming``), then sends the sum to its parent. Broadcast: each rank receives the
result from its parent, then sends it to its children, farthest (largest subtree) first. Only
rank 0 computes the final values, so every rank ends bit-identical.

Steps: 2*ceil(log2 size), in rounds: reduce round j, ranks whose lowest set bit is 2^j send to
v - 2^j; broadcast round j (j from high to low), multiples of 2^(j+1) send to v + 2^j. A rank idles
through the rounds it takes no part in (the schedule is aligned: step k is round k on every
rank, the last ones too), so the cost model shares links among the transfers of one round, the ones that run at
once, and the cluster-scale simulator runs the rounds as flows. Sent per rank: count elements *
(1 + number of children); rank 0 sends ceil(log2 size) * count. Latency-optimal, not
bandwidth-optimal. TMP: none (in place).
"""

from __future__ import annotations

from functools import lru_cache
from typing import Iterator

import numpy as np

from ._common import finish
from .schedule import OUT, Recv, Region, Schedule, Send, Step, StepFlows


def _rounds(size: int) -> int:
    return (size - 1).bit_length()


@lru_cache(maxsize=256)
def schedule(rank: int, size: int, count: int, root: int = 0) -> Schedule:
    """Binomial-tree allreduce: reduce the whole buffer up the tree to rank 0, then broadcast the result
    back down; returns the Schedule of rank ``rank``."""
    whole = Region(OUT, 0, count)
    steps = []
    for j in range(_rounds(size)):  # reduce: children nearest first, then the parent
        bit = 1 << j
        if rank & (2 * bit - 1) == bit:
            steps.append(Step(sends=(Send(rank - bit, whole),)))
        elif rank % (2 * bit) == 0 and rank + bit < size:
            steps.append(Step(recvs=(Recv(rank + bit, whole, reduce_with=whole),)))
        else:
            steps.append(Step())
    for j in reversed(range(_rounds(size))):  # broadcast: from the parent, then children farthest first
        bit = 1 << j
        if rank % (2 * bit) == 0 and rank + bit < size:
            steps.append(Step(sends=(Send(rank + bit, whole),)))
        elif rank & (2 * bit - 1) == bit:
            steps.append(Step(recvs=(Recv(rank - bit, whole),)))
        else:
            steps.append(Step())
    return finish(steps, aligned=True, whole_rounds=True)


def flows(size: int, count: int, root: int = 0) -> Iterator[StepFlows]:
    """Every rank's steps at once, one per round (see ``StepFlows``); ``size >= 2``, ``count >= 1``."""
    if size < 2 or count < 1:
        raise ValueError("tree allreduce flows need size >= 2 and count >= 1")
    ranks = np.arange(size)
    counts = np.full(size, count)
    for j in range(_rounds(size)):
        bit = 1 << j
        senders = ranks[bit :: 2 * bit]
        yield _round(size, senders, senders - bit, counts, reduce=True)
    for j in reversed(range(_rounds(size))):
        bit = 1 << j
        senders = ranks[: size - bit : 2 * bit]
        yield _round(size, senders, senders + bit, counts, reduce=False)


def _round(size: int, senders: np.ndarray, receivers: np.ndarray, counts: np.ndarray, *, reduce: bool) -> StepFlows:
    send_to = np.full(size, -1)
    recv_from = np.full(size, -1)
    send_to[senders] = receivers
    recv_from[receivers] = senders
    return StepFlows(send_to, counts, recv_from, reduce)
