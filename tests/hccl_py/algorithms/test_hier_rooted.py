"""Two-level scatter and gather (HCCL's Scatter across servers, and its mirror): every partition
shape, level pair, count and root, played in one process against the numpy reference and checked
against the rules of ``schedule.py``; uneven groups are refused."""

from __future__ import annotations

import itertools

import numpy as np
import pytest

from hccl_py.algorithms.hierarchical import schedule_for
from hccl_py.algorithms.playback import play
from hccl_py.errors import HcclParamError

PARTITIONS = [
    ((0, 1, 2, 3), (4, 5, 6, 7)),  # two servers, ranks numbered server by server: in place
    ((0, 1), (2, 3), (4, 5)),
    ((0, 2), (1, 3)),  # groups not runs of ranks: the root stages through TMP
    ((3, 1), (0, 2)),
    ((0,), (1,), (2,)),  # groups of one: the outer level alone
    ((0, 1, 2),),  # one group: the inner level alone
]
LEVELS = list(itertools.product(("ring", "tree", "mesh"), repeat=2))


@pytest.mark.parametrize("partition", PARTITIONS, ids=str)
@pytest.mark.parametrize("inner, outer", LEVELS)
def test_scatter_and_gather(partition, inner, outer):
    size = sum(map(len, partition))
    scatter, gather = schedule_for("scatter", partition, inner, outer), schedule_for("gather", partition, inner, outer)
    for count in (0, 1, 3):
        for root in range(size):
            xs = [np.arange(size * count, dtype=np.int32) + 100 * r for r in range(size)]
            outs = play("scatter", scatter, size, xs, root=root)
            for r in range(size):
                assert np.array_equal(outs[r], xs[root][r * count : (r + 1) * count]), (partition, count, root, r)
            ys = [np.arange(count, dtype=np.int32) + 100 * r for r in range(size)]
            outs = play("gather", gather, size, ys, root=root)
            assert np.array_equal(outs[root], np.concatenate(ys)), (partition, count, root)


def test_uneven_groups_are_refused():
    for collective in ("scatter", "gather"):
        with pytest.raises(HcclParamError) as info:
            schedule_for(collective, ((0, 1, 2), (3, 4)), "mesh", "ring")(0, 5, 4)
        assert info.value.rule == "equal groups" and info.value.collective == collective
