"""Cutting a stack of blocks into pipeline stages: pure functions.

:func:`balanced_split` minimises the slowest stage (the pipeline's steady-state period), where a
stage's time is its blocks' modeled compute on *its* card plus sending its output to the next
stage over *its* route — so heterogeneous cards and slow links are balanced too. Exhaustive
dynamic programme over contiguous cuts, O(stages x blocks^2); ties go to the earliest cut.

>>> balanced_split([[1, 1, 1, 1, 2, 2]] * 2)         # two stages over six blocks
[0, 4, 6]
>>> split_from_counts([3, 2, 1], 6)
[0, 3, 5, 6]
"""

from __future__ import annotations

from functools import lru_cache
from typing import Sequence

from ..errors import HcclParamError


def stage_times(
    bounds: Sequence[int], costs: Sequence[Sequence[float]], send_s: Sequence[Sequence[float]] | None = None
) -> list[float]:
    """Modeled seconds of each stage for the cut ``bounds`` (``bounds[s]..bounds[s+1]-1`` are
    stage ``s``'s blocks). ``costs[s][j]``: block ``j`` on stage ``s``'s card; ``send_s[s][j]``:
    sending block ``j``'s output from stage ``s`` to stage ``s+1``."""
    times = []
    last = len(bounds) - 2
    for s in range(len(bounds) - 1):
        lo, hi = bounds[s], bounds[s + 1]
        t = sum(costs[s][lo:hi])
        if send_s is not None and s < last:
            t += send_s[s][hi - 1]
        times.append(t)
    return times


def balanced_split(costs: Sequence[Sequence[float]], send_s: Sequence[Sequence[float]] | None = None) -> list[int]:
    """Boundaries ``[0, b1, ..., n]`` of ``len(costs)`` non-empty contiguous stages minimising the
    slowest stage's time (see :func:`stage_times`)."""
    stages = len(costs)
    n = len(costs[0]) if stages else 0
    if stages < 1 or n < stages:
        raise HcclParamError(f"cannot cut {n} blocks into {stages} non-empty pipeline stages; use fewer stages")
    prefix = []
    for row in costs:
        acc = [0.0]
        for c in row:
            acc.append(acc[-1] + float(c))
        prefix.append(acc)

    def stage(s: int, lo: int, hi: int) -> float:
        t = prefix[s][hi] - prefix[s][lo]
        if send_s is not None and s < stages - 1:
            t += float(send_s[s][hi - 1])
        return t

    @lru_cache(maxsize=None)
    def best(s: int, lo: int) -> tuple[float, tuple[int, ...]]:
        if s == stages - 1:
            return stage(s, lo, n), (n,)
        choice = None
        for hi in range(lo + 1, n - (stages - 1 - s) + 1):
            rest, cuts = best(s + 1, hi)
            value = max(stage(s, lo, hi), rest)
            if choice is None or value < choice[0]:
                choice = (value, (hi, *cuts))
        return choice

    return [0, *best(0, 0)[1]]


def split_from_counts(counts: Sequence[int], n: int) -> list[int]:
    """Boundaries from blocks per stage (``[3, 2, 1]`` -> ``[0, 3, 5, 6]``), checked against ``n``."""
    counts = [int(c) for c in counts]
    if any(c < 1 for c in counts) or sum(counts) != n:
        raise HcclParamError(
            f"pipeline split {counts}: every stage needs >= 1 block and they must add up to the model's {n} blocks"
        )
    bounds = [0]
    for c in counts:
        bounds.append(bounds[-1] + c)
    return bounds
