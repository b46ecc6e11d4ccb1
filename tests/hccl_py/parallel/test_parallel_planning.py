"""Sharding policies, stage balancing and group layouts: pure functions, one process."""

from __future__ import annotations

import itertools

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from hccl_py import HcclParamError
from hccl_py.parallel import (
    balanced_split,
    even_plan,
    hybrid_partitions,
    proportional_plan,
    split_from_counts,
    stage_times,
    work_stealing_plan,
)
from hccl_py.parallel.sharding import chunk_ranges


def _covered(plan, n):
    seen = sorted(i for ranges in plan.pieces for a, b in ranges for i in range(a, b))
    return seen == list(range(n))


@pytest.mark.parametrize("n,p", [(0, 3), (1, 4), (10, 3), (64, 4), (13, 8)])
def test_even_plan(n, p):
    plan = even_plan(n, p)
    assert _covered(plan, n) and max(plan.counts) - min(plan.counts) <= 1


def test_proportional_plan_follows_speed():
    plan = proportional_plan(64, [1.0, 1.0, 1 / 3, 1.0])
    assert _covered(plan, 64) and sum(plan.counts) == 64
    assert plan.counts == (19, 19, 7, 19)
    with pytest.raises(HcclParamError):
        proportional_plan(8, [1.0, 0.0])


@settings(max_examples=60, deadline=None)
@given(n=st.integers(0, 60), chunk=st.integers(1, 9), costs=st.lists(st.floats(0.1, 5.0), min_size=1, max_size=6))
def test_work_stealing_covers_every_sample_once(n, chunk, costs):
    k = len(chunk_ranges(n, chunk))
    plan = work_stealing_plan(n, chunk, [[c] * k for c in costs])
    assert _covered(plan, n)
    assert plan == work_stealing_plan(n, chunk, [[c] * k for c in costs])  # deterministic
    # Greedy list scheduling: nobody finishes later than the best rank could have with one more chunk.
    best = min(costs)
    assert max(plan.predicted_s, default=0) <= (k / len(costs) + 1) * max(costs) + best


def test_work_stealing_moves_work_off_a_straggler():
    k = len(chunk_ranges(64, 4))
    plan = work_stealing_plan(64, 4, [[1.0] * k, [1.0] * k, [3.0] * k, [1.0] * k])
    assert plan.counts[2] < 16 and sum(plan.steals) > 0
    assert max(plan.predicted_s) < 4 * 3.0  # the even split would leave rank 2 at 4 chunks x 3


def _brute_force(costs, send):
    n, p = len(costs[0]), len(costs)
    best = None
    for cuts in itertools.combinations(range(1, n), p - 1):
        bounds = [0, *cuts, n]
        value = max(stage_times(bounds, costs, send))
        if best is None or value < best:
            best = value
    return best


@settings(max_examples=40, deadline=None)
@given(n=st.integers(1, 8), p=st.integers(1, 4), seed=st.integers(0, 10_000))
def test_balanced_split_is_optimal(n, p, seed):
    if p > n:
        with pytest.raises(HcclParamError):
            balanced_split([[1.0] * n] * p)
        return
    rng = np.random.default_rng(seed)
    costs = rng.uniform(0.1, 2.0, (p, n)).tolist()
    send = rng.uniform(0.0, 0.5, (p, n)).tolist()
    bounds = balanced_split(costs, send)
    assert bounds[0] == 0 and bounds[-1] == n and all(a < b for a, b in zip(bounds, bounds[1:]))
    assert max(stage_times(bounds, costs, send)) == pytest.approx(_brute_force(costs, send))


def test_balanced_split_weighs_slower_cards_and_explicit_splits_are_checked():
    assert balanced_split([[1.0] * 8, [1.0] * 8]) == [0, 4, 8]
    assert balanced_split([[1.0] * 8, [3.0] * 8]) == [0, 6, 8]  # stage 1 is three times slower
    assert split_from_counts([5, 3], 8) == [0, 5, 8]
    for bad in ([4, 3], [8, 0]):
        with pytest.raises(HcclParamError):
            split_from_counts(bad, 8)


def test_hybrid_partitions():
    assert hybrid_partitions(4, 2) == ([[0, 1], [2, 3]], [[0, 2], [1, 3]])
    assert hybrid_partitions(8, 4) == ([[0, 1, 2, 3], [4, 5, 6, 7]], [[0, 4], [1, 5], [2, 6], [3, 7]])
    with pytest.raises(HcclParamError):
        hybrid_partitions(6, 4)


def test_docstring_examples():
    import doctest

    from hccl_py.parallel import balance, groups, sharding

    for module in (sharding, balance, groups):
        assert doctest.testmod(module).failed == 0, module.__name__
