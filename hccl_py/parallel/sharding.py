"""How a data-parallel batch is cut over ranks: pure functions from sizes and modeled costs to a
:class:`ShardPlan`. Every rank computes the same plan from the same inputs.

- ``even``: contiguous shares whose sizes differ by at most one sample.
- ``proportional``: contiguous shares proportional to each rank's speed (samples per modeled
  second, from a dry-run estimate on that rank's card), rounded by largest remainder.
- ``work-stealing``: the batch is cut into chunks; each rank starts with an even run of chunks in
  its own deque, works from its head, and when it runs dry steals one chunk from the tail of the
  rank with the most chunks left. Who is idle when is decided in *modeled* time, by replaying
  that protocol with each rank's modeled cost per chunk, so the outcome is what a work-stealing
  runtime would produce on those cards — and the same on every run (wall-clock races never
  decide who gets a chunk).

>>> even_plan(10, 3).counts
(4, 3, 3)
>>> proportional_plan(12, [1.0, 2.0, 1.0]).counts
(3, 6, 3)
>>> plan = work_stealing_plan(8, 2, [[1.0] * 4, [3.0] * 4])   # rank 1 is three times slower
>>> plan.counts, plan.steals
((6, 2), (1, 0))
"""

from __future__ import annotations

import heapq
import math
from collections import deque
from dataclasses import dataclass
from typing import Sequence

from ..errors import HcclParamError

POLICIES = ("even", "proportional", "work-stealing")


@dataclass(frozen=True)
class ShardPlan:
    """``pieces[r]``: the sample ranges ``(start, stop)`` rank ``r`` runs, in its order. For
    work-stealing each piece is a chunk, ``steals[r]`` how many it stole and ``predicted_s[r]``
    when it finishes in the replay (modeled seconds after the start)."""

    policy: str
    pieces: tuple[tuple[tuple[int, int], ...], ...]
    steals: tuple[int, ...] = ()
    predicted_s: tuple[float, ...] = ()
    chunk: int = 0

    @property
    def counts(self) -> tuple[int, ...]:
        """Samples each rank runs."""
        return tuple(sum(b - a for a, b in ranges) for ranges in self.pieces)

    def sizes(self, rank: int) -> list[int]:
        """The sizes of rank ``rank``'s pieces, in its order (what ``forward(x, splits=...)`` takes)."""
        return [b - a for a, b in self.pieces[rank]]


def _contiguous(policy: str, counts: Sequence[int]) -> ShardPlan:
    pieces, at = [], 0
    for c in counts:
        pieces.append(((at, at + c),) if c else ())
        at += c
    return ShardPlan(policy, tuple(pieces))


def even_split(n: int, parts: int) -> list[int]:
    """``n`` items in ``parts`` contiguous shares, the first ``n % parts`` one larger."""
    if parts < 1 or n < 0:
        raise HcclParamError(f"cannot split {n} samples into {parts} parts")
    base, extra = divmod(n, parts)
    return [base + (1 if i < extra else 0) for i in range(parts)]


def even_plan(n: int, ranks: int) -> ShardPlan:
    """Contiguous shares differing by at most one sample."""
    return _contiguous("even", even_split(n, ranks))


def proportional_plan(n: int, speeds: Sequence[float]) -> ShardPlan:
    """Contiguous shares proportional to ``speeds`` (largest remainder; ties to the lower rank)."""
    if not speeds or any(not (s > 0 and math.isfinite(s)) for s in speeds):
        raise HcclParamError(f"proportional split needs positive, finite speeds, got {list(speeds)}")
    total = float(sum(speeds))
    quotas = [n * s / total for s in speeds]
    counts = [int(math.floor(q)) for q in quotas]
    order = sorted(range(len(speeds)), key=lambda r: (-(quotas[r] - counts[r]), r))
    for r in order[: n - sum(counts)]:
        counts[r] += 1
    return _contiguous("proportional", counts)


def chunk_ranges(n: int, chunk: int) -> list[tuple[int, int]]:
    """``[0, n)`` cut into chunks of ``chunk`` samples (the last may be smaller)."""
    if chunk < 1:
        raise HcclParamError(f"chunk must be >= 1 sample, got {chunk}")
    return [(a, min(a + chunk, n)) for a in range(0, n, chunk)]


def work_stealing_plan(n: int, chunk: int, chunk_costs: Sequence[Sequence[float]]) -> ShardPlan:
    """Replay work-stealing in modeled time. ``chunk_costs[r][k]``: modeled seconds rank ``r``
    takes for chunk ``k`` (``k`` over :func:`chunk_ranges`); there are as many ranks as rows.

    Events are taken in order of modeled time (ties: lower rank first). A free rank pops the head
    of its own deque; with its deque empty it steals the tail of the deque holding the most
    chunks (ties: lower rank); with nothing left anywhere it is done.
    """
    chunks = chunk_ranges(n, chunk)
    ranks = len(chunk_costs)
    if ranks < 1 or any(len(row) != len(chunks) for row in chunk_costs):
        raise HcclParamError(f"work-stealing needs one cost per chunk ({len(chunks)}) for every rank")
    deques, at = [], 0
    for share in even_split(len(chunks), ranks):
        deques.append(deque(range(at, at + share)))
        at += share
    order: list[list[int]] = [[] for _ in range(ranks)]
    steals = [0] * ranks
    finish = [0.0] * ranks
    free = [(0.0, r) for r in range(ranks)]
    heapq.heapify(free)
    while free:
        t, r = heapq.heappop(free)
        if deques[r]:
            k = deques[r].popleft()
        else:
            victim = max(range(ranks), key=lambda v: (len(deques[v]), -v))
            if not deques[victim]:
                finish[r] = t
                continue  # nothing left anywhere: this rank is done
            k = deques[victim].pop()
            steals[r] += 1
        order[r].append(k)
        heapq.heappush(free, (t + float(chunk_costs[r][k]), r))
    pieces = tuple(tuple(chunks[k] for k in ks) for ks in order)
    return ShardPlan("work-stealing", pieces, tuple(steals), tuple(finish), chunk)
