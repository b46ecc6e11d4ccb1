"""HCCL's continuous pipeline for AlltoAllV: its state machine as the template runs it, results
against the numpy reference for every partition shape, skewed and empty counts, one loop or
several (a small CCL buffer), and the rules of ``schedule.py``."""

from __future__ import annotations

import numpy as np
import pytest

from hccl_py.algorithms import alltoall_staged, alltoallv_continuous
from hccl_py.algorithms.alltoallv import VSchedule, as_matrix
from hccl_py.algorithms.alltoallv_continuous import block_elements, iterations
from hccl_py.algorithms.playback import check, play
from hccl_py.errors import HcclParamError

PARTITIONS = [
    ((0, 1), (2, 3)),  # two servers: ping-pong blocks
    ((0, 1, 2, 3), (4, 5, 6, 7)),
    ((0, 1), (2, 3), (4, 5)),  # three servers
    ((0, 1, 2), (3, 4, 5), (6, 7, 8), (9, 10, 11)),
    ((0, 2), (1, 3)),  # groups not in rank order
    ((3, 1), (0, 2)),  # ... nor members
]


def reference(xs, counts):
    size = len(counts)
    return [
        np.concatenate([xs[i][sum(counts[i][:r]) : sum(counts[i][:r]) + counts[i][r]] for i in range(size)])
        for r in range(size)
    ]


def test_the_state_machine_runs_three_stages_one_step_apart():
    # 4 servers, 2 loops: alltoallv_continuous_pipeline.cc RunAsync, one RDMA step at a time
    steps = iterations(3, 2)
    assert [(s["copy"], s["inter"], s["intra"]) for s in steps] == [
        ((0, 1), None, None),
        ((0, 2), (0, 1), None),
        ((0, 3), (0, 2), (0, 1)),
        ((1, 1), (0, 3), (0, 2)),
        ((1, 2), (1, 1), (0, 3)),
        ((1, 3), (1, 2), (1, 1)),
        (None, (1, 3), (1, 2)),
        (None, None, (1, 3)),
    ]
    assert [s["l0_write"] for s in steps] == [None, 0, None, None, 1, None, None, None]
    assert [s["l0_copy"] for s in steps] == [None, None, 0, None, None, 1, None, None]
    assert [s["self_copy"] for s in steps] == [False, True] + [False] * 6
    assert all(s["sdma"] for s in steps)
    assert len(iterations(1, 3)) == 3 + 2 and len(iterations(5, 1)) == 5 + 2  # (M-1) x loops + 2


def test_blocks_follow_the_split_buffer_rule():
    # 16 ranks on 2 servers: 32 blocks of (200 MB - 16*16*8) / 32 rounded down to 16 KB
    assert block_elements(16, 2, 1) == (200 * 2**20 - 2048) // 32 // 16384 * 16384
    assert block_elements(16, 4, 2) == (200 * 2**20 - 2048) // 16 // 16384 * 16384 // 2
    tiny = 8 * 4 * 4 + 128 * 8  # too small for 16 KB blocks: 128 B
    assert block_elements(4, 2, 4, tiny) == 32


@pytest.mark.parametrize("partition", PARTITIONS, ids=str)
def test_counts_per_pair_match_numpy(partition):
    size = sum(map(len, partition))
    rng = np.random.default_rng(size)
    name = f"hier:mesh/{alltoall_staged.CONTINUOUS}"
    cases = [as_matrix(rng.integers(0, 5, (size, size))) for _ in range(2)]
    cases.append(as_matrix(np.zeros((size, size), dtype=int)))  # nothing to move: loop count 0
    cases.append(as_matrix([[40 if j == 0 else (i + j) % 3 for j in range(size)] for i in range(size)]))  # a hot rank
    for counts in cases:
        xs = [np.arange(sum(counts[r]), dtype=np.int64) + 1000 * r for r in range(size)]
        fn = VSchedule(name, counts, staged=(partition, "mesh", alltoall_staged.CONTINUOUS), itemsize=8)
        for r, (out, want) in enumerate(zip(play("alltoallv", fn, size, xs), reference(xs, counts))):
            assert np.array_equal(out, want), (partition, counts, r)


@pytest.mark.parametrize("partition", [PARTITIONS[0], PARTITIONS[2], PARTITIONS[5]], ids=str)
def test_loops_of_a_small_buffer_match_numpy(partition):
    size = sum(map(len, partition))
    servers = len(partition)
    blocks = size * (2 if servers == 2 else 1)
    buffer = 8 * size * size + 128 * blocks  # blocks of 128 bytes: 16 int64 elements
    rng = np.random.default_rng(7)
    for counts in (
        as_matrix(rng.integers(0, 60, (size, size))),
        as_matrix([[50 if (i, j) == (1, 0) else 3 for j in range(size)] for i in range(size)]),
    ):
        fn = _SmallBuffer(counts, partition, buffer)
        check("alltoallv", fn, size, 0)
        xs = [np.arange(sum(counts[r]), dtype=np.int64) + 1000 * r for r in range(size)]
        for r, (out, want) in enumerate(zip(play("alltoallv", fn, size, xs), reference(xs, counts))):
            assert np.array_equal(out, want), (partition, counts, r)
        assert len(fn(0, size).steps) > (servers - 1) + 2  # several loops


class _SmallBuffer:
    """The continuous pipeline with a CCL buffer of ``buffer`` bytes, as a schedule function."""

    def __init__(self, counts, partition, buffer):
        self.counts, self.partition, self.buffer = counts, partition, buffer

    def __call__(self, rank, size, count=0, root=0):
        from hccl_py.algorithms._common import packed_displacements

        counts = self.counts
        return alltoallv_continuous.schedule_v(
            rank,
            counts,
            packed_displacements(counts[rank]),
            packed_displacements([row[rank] for row in counts]),
            self.partition,
            8,
            self.buffer,
        )

    def buffer_counts(self, rank):
        return sum(self.counts[rank]), sum(row[rank] for row in self.counts)


def test_every_step_with_sdma_work_follows_a_handshake_with_the_whole_server():
    partition = ((0, 1, 2, 3), (4, 5, 6, 7))
    counts = as_matrix([[2] * 8] * 8)
    fn = VSchedule("hier:mesh/continuous", counts, staged=(partition, "mesh", "continuous"), itemsize=4)
    steps = fn(5, 8).steps
    assert len(steps) == 2 * 3  # 3 steps (M - 1 + 2), each after its handshake
    for i, (shake, work) in enumerate(zip(steps[::2], steps[1::2])):
        assert sorted(s.peer for s in shake.sends) == sorted(r.peer for r in shake.recvs) == [4, 6, 7]
        # the first carries the rank's receive counts and a flag (8 x 8 + 4 bytes in float32 elements)
        assert all(s.src.count == (1 if i else -(-(8 * 8 + 4) // 4)) for s in shake.sends) and not shake.copies
        assert work.copies or work.sends


def test_it_needs_servers_of_two_or_more_and_an_element_size():
    with pytest.raises(HcclParamError):
        VSchedule("hier:mesh/continuous", ((1, 1), (1, 1)), staged=(((0,), (1,)), "mesh", "continuous"), itemsize=4)(
            0, 2
        )
    with pytest.raises(ValueError):
        VSchedule("hier:mesh/continuous", ((1,) * 4,) * 4, staged=(((0, 1), (2, 3)), "mesh", "continuous"))


def test_a_buffer_too_small_for_the_counts_table_fails_as_hccl_does():
    from hccl_py.choice.hccl_rules import staged_alltoall
    from hccl_py.errors import HcclMemoryError
    from topology import Topology

    assert alltoallv_continuous.fits(5112, 639) and not alltoallv_continuous.fits(5120, 640)  # 200 MB: 8 N^2 + 128 N
    with pytest.raises(HcclMemoryError) as info:
        block_elements(5120, 640, 4)
    assert info.value.code == 3 and "SplitBuffer" in str(info.value)
    big = Topology.preset("640x8p-roce")
    assert "hier:mesh/continuous@groups" not in staged_alltoall(big, tuple(range(5120)), counts=True)
    assert "hier:mesh/continuous@groups" in staged_alltoall(Topology.preset("2x8p-roce"), tuple(range(16)), counts=True)
