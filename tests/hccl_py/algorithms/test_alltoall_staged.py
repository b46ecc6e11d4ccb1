"""The staged all-to-all (HCCL's RunAlltoAllVStaged): every partition shape and level pair, equal
blocks and counts per pair, played in one process against the numpy reference and checked
against the rules of ``schedule.py``; its steps and costs do not depend on the owner's layout."""

from __future__ import annotations

import itertools

import numpy as np
import pytest

from hccl_py.algorithms import alltoall_staged
from hccl_py.algorithms.alltoallv import VSchedule, as_matrix
from hccl_py.algorithms.playback import check, play
from hccl_py.errors import HcclParamError

PARTITIONS = [
    ((0, 1, 2, 3), (4, 5, 6, 7)),  # two servers / a 910's two islands
    ((0, 1), (2, 3), (4, 5)),  # three groups
    ((0, 2), (1, 3)),  # groups not in rank order
    ((3, 1), (0, 2)),  # ... nor members
    ((0,), (1,), (2,)),  # groups of one: the flat outer algorithm
    ((0, 1, 2),),  # one group: the flat inner algorithm
]
LEVELS = [*itertools.product(alltoall_staged.LEVEL_ALGOS, repeat=2), ("mesh", alltoall_staged.PIPELINE)]


@pytest.mark.parametrize("partition", PARTITIONS, ids=str)
@pytest.mark.parametrize("inner, outer", LEVELS)
def test_equal_blocks(partition, inner, outer):
    size = sum(map(len, partition))
    fn = alltoall_staged.schedule_for(partition, inner, outer)
    for count in (0, 1, 5):
        xs = [np.arange(size * count, dtype=np.int64) + 1000 * r for r in range(size)]
        outs = play("alltoall", fn, size, xs)
        for r in range(size):
            want = np.concatenate([xs[i][r * count : (r + 1) * count] for i in range(size)])
            assert np.array_equal(outs[r], want), (partition, inner, outer, count, r)


@pytest.mark.parametrize("partition", PARTITIONS, ids=str)
@pytest.mark.parametrize("inner, outer", LEVELS)
def test_counts_per_pair(partition, inner, outer):
    size = sum(map(len, partition))
    rng = np.random.default_rng(size)
    name = f"hier:{inner}/{outer}"
    for _ in range(3):
        counts = as_matrix(rng.integers(0, 5, (size, size)))
        xs = [np.arange(sum(counts[r]), dtype=np.int64) + 1000 * r for r in range(size)]
        outs = play("alltoallv", VSchedule(name, counts, staged=(partition, inner, outer)), size, xs)
        for r in range(size):
            parts = [xs[i][sum(counts[i][:r]) : sum(counts[i][:r]) + counts[i][r]] for i in range(size)]
            assert np.array_equal(outs[r], np.concatenate(parts)), (partition, counts, r)


def test_the_owners_layout_changes_neither_steps_nor_equality():
    partition = ((0, 1), (2, 3))
    counts = as_matrix([[1, 2, 0, 3], [3, 1, 1, 0], [0, 2, 2, 1], [2, 0, 1, 1]])
    staged = (partition, "mesh", "pairwise")
    packed = VSchedule("hier:mesh/pairwise", counts, staged=staged)
    scattered = VSchedule(
        "hier:mesh/pairwise", counts, owner=2, send_displs=[20, 0, 10, 5], recv_displs=[30, 8, 0, 16], staged=staged
    )
    check("alltoallv", scattered, 4, 0)  # bounds, matching, hazards with the owner's layout
    assert [len(s.copies) + len(s.sends) + len(s.recvs) for s in scattered(2, 4).steps] == [
        len(s.copies) + len(s.sends) + len(s.recvs) for s in packed(2, 4).steps
    ]
    assert scattered == packed and hash(scattered) == hash(packed)  # one cost entry
    assert packed != VSchedule("hier:mesh/pairwise", counts, staged=(((0, 2), (1, 3)), "mesh", "pairwise"))


def test_messages_between_groups_carry_a_whole_groups_blocks():
    partition = ((0, 1, 2, 3), (4, 5, 6, 7))
    schedule = alltoall_staged.schedule_for(partition, "mesh", "pairwise")(0, 8, 10)
    across = [send for step in schedule.steps for send in step.sends if send.peer >= 4]
    assert [(s.peer, s.src.count) for s in across] == [(4, 40)]  # one message of 4 blocks to rank 4 only
    inside = [send for step in schedule.steps for send in step.sends if send.peer < 4]
    assert sorted((s.peer, s.src.count) for s in inside) == [(1, 20), (2, 20), (3, 20)]  # 2 blocks each, one step


def test_the_pipeline_overlaps_the_levels_and_sends_each_server_its_blocks_at_once():
    """HCCL's RunAlltoAllVTwoLevelPipeline: G steps; in step s rank (n, l) sends (n+1+s, l) its
    blocks for that whole server in one message while the server's mesh hands round the blocks
    that arrived in the step before."""
    partition = ((0, 1, 2, 3), (4, 5, 6, 7), (8, 9, 10, 11))
    fn = alltoall_staged.schedule_for(partition, "mesh", "pipeline")
    steps = fn(1, 12, 10).steps
    assert len(steps) == 3
    assert [(s.peer, s.src.count) for s in steps[0].sends] == [(5, 40), (2, 10), (3, 10), (0, 10)]
    assert [(s.peer, s.src.count) for s in steps[1].sends] == [(9, 40), (2, 10), (3, 10), (0, 10)]
    assert [s.peer for s in steps[2].sends] == [2, 3, 0]  # the last step: the mesh only
    assert [(r.peer, r.dst.count) for r in steps[0].recvs][0] == (9, 40)  # from server n-1-s
    with pytest.raises(HcclParamError):
        alltoall_staged.schedule_for(partition, "pairwise", "pipeline")  # level 0 of HCCL's pipeline is the mesh
