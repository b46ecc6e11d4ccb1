"""All-to-all (equal blocks and counts per pair), scatter and gather: every algorithm, every
size, count and root, played in one process against the numpy reference and checked against the
rules of ``schedule.py`` (matching, deadlock freedom, hazards, bounds, IN never written)."""

from __future__ import annotations

import numpy as np
import pytest

from hccl_py.algorithms.alltoallv import VSchedule, as_matrix, digest
from hccl_py.algorithms.playback import check, play
from hccl_py.algorithms.registry import algos_for

SIZES = [*range(1, 10), 13]


@pytest.mark.parametrize("algo", algos_for("alltoall"))
@pytest.mark.parametrize("size", SIZES)
def test_alltoall(algo, size):
    for count in (0, 1, 3, 8):
        xs = [np.arange(size * count, dtype=np.int64) + 1000 * r for r in range(size)]
        outs = play("alltoall", algo, size, xs)
        for r in range(size):
            want = np.concatenate([xs[i][r * count : (r + 1) * count] for i in range(size)]).astype(np.int64)
            assert np.array_equal(outs[r], want), (algo, size, count, r)


@pytest.mark.parametrize("algo", algos_for("alltoallv"))
@pytest.mark.parametrize("size", SIZES)
def test_alltoall_with_counts_per_pair(algo, size):
    rng = np.random.default_rng(size)
    for _ in range(4):
        counts = as_matrix(rng.integers(0, 5, (size, size)))
        xs = [np.arange(sum(counts[r]), dtype=np.int64) + 1000 * r for r in range(size)]
        outs = play("alltoallv", VSchedule(algo, counts), size, xs)
        for r in range(size):
            parts = [xs[i][sum(counts[i][:r]) : sum(counts[i][:r]) + counts[i][r]] for i in range(size)]
            assert np.array_equal(outs[r], np.concatenate(parts)), (algo, size, counts, r)


def test_counts_per_pair_with_the_owners_own_displacements():
    counts = as_matrix([[1, 2, 0], [3, 1, 1], [0, 2, 2]])
    fn = VSchedule("pairwise", counts, owner=1, send_displs=[10, 0, 5], recv_displs=[4, 0, 20])
    assert fn.buffer_counts(1) == (13, 22) and fn.buffer_counts(0) == (3, 4)
    check("alltoallv", fn, 3, 0)  # bounds, matching, hazards with the owner's layout
    assert fn == VSchedule("pairwise", counts) and hash(fn) == hash(VSchedule("pairwise", counts))  # one cost entry
    assert digest(counts) != digest(as_matrix([[1, 2, 0], [3, 1, 1], [0, 2, 1]]))


@pytest.mark.parametrize("algo", algos_for("scatter"))
@pytest.mark.parametrize("size", SIZES)
def test_scatter(algo, size):
    for count in (0, 1, 5):
        for root in range(size):
            xs = [np.arange(size * count, dtype=np.int32) + 100 * r for r in range(size)]
            outs = play("scatter", algo, size, xs, root=root)
            for r in range(size):
                assert np.array_equal(outs[r], xs[root][r * count : (r + 1) * count]), (algo, size, count, root, r)


@pytest.mark.parametrize("algo", algos_for("gather"))
@pytest.mark.parametrize("size", SIZES)
def test_gather(algo, size):
    for count in (0, 1, 5):
        for root in range(size):
            xs = [np.arange(count, dtype=np.int32) + 100 * r for r in range(size)]
            outs = play("gather", algo, size, xs, root=root)
            assert np.array_equal(outs[root], np.concatenate(xs)), (algo, size, count, root)


@pytest.mark.parametrize("collective", ["scatter", "gather"])
def test_only_the_root_has_the_root_only_buffer(collective):
    """A non-root rank of scatter has no IN, of gather no OUT: a schedule that touched them would
    fail the bounds check (the runtime passes empty arrays there)."""
    for algo in algos_for(collective):
        for size in (2, 5, 8):
            check(collective, algo, size, 3, root=size - 1)


# ------------------------------------------------------------------------------------------- NHR
def test_nhr_steps_and_layout_follow_hccls_templates():
    """HCCL's own worked figures (hcomm reduce_scatter_nhr.cc / nonuniform_hierarchical_ring_base.cc):
    ceil(log2 n) steps, c_k blocks a step summing to n - 1, the tree layout, and one message per
    run (one per step for powers of two)."""
    from hccl_py.algorithms import _nhr
    from hccl_py.algorithms.registry import get_schedule

    assert [_nhr.blocks_per_step(6, k) for k in range(_nhr.nsteps(6))] == [3, 1, 1]
    assert [_nhr.blocks_per_step(5, k) for k in range(_nhr.nsteps(5))] == [2, 1, 1]
    assert _nhr.tree_map(5) == (0, 3, 1, 4, 2) and _nhr.tree_map(6) == (0, 3, 1, 4, 2, 5)
    assert _nhr.tree_map(8) == (0, 4, 2, 6, 1, 5, 3, 7) and _nhr.tree_map(12) == (0, 6, 3, 9, 1, 7, 4, 10, 2, 8, 5, 11)
    assert _nhr.rs_step(0, 6, 0) == (5, [5, 3, 1], 1, [0, 4, 2])  # rank 0 -> 5 {5, 3, 1}
    assert _nhr.ag_step(0, 6, 2) == (1, [0, 4, 2], 5, [5, 3, 1])
    for n in (2, 3, 5, 6, 7, 8, 12, 16):
        for collective in ("reduce_scatter", "allgather"):
            fn = get_schedule(collective, "nhr")
            for r in range(n):
                steps = fn(r, n, 10).steps
                assert len(steps) == _nhr.nsteps(n)
                assert sum(s.src.count for st in steps for s in st.sends) == (n - 1) * 10  # (n-1)/n of the data
                assert sum(len(st.sends) for st in steps) == n - 1  # one message per block
        ar = get_schedule("allreduce", "nhr")
        for r in range(n):
            steps = ar(r, n, 64 * n).steps
            assert len(steps) == 2 * _nhr.nsteps(n)
            assert sum(s.src.count for st in steps for s in st.sends) == 2 * (n - 1) * 64
            if n & (n - 1) == 0:
                assert all(len(st.sends) == 1 for st in steps)  # merged into one run a step
    for n in (5, 6, 7, 12, 24):  # the vectorised runs equal the per-rank merge
        for k in range(_nhr.nsteps(n)):
            for send in (True, False):
                lo, hi = _nhr.step_runs(n, k, send)
                for r in range(n):
                    blocks = _nhr.rs_step(r, n, k)[1 if send else 3]
                    want = _nhr.runs([_nhr.tree_map(n)[x] for x in blocks])
                    assert want == [(int(a), int(b)) for a, b in zip(lo[:, r], hi[:, r]) if a >= 0]


def test_tree_allreduce_is_hccls_nhr_one_shot():
    """HCCL's AllReduceNHROneshot (reduce_nhr_oneshot.cc GetStepInfo L196-227, then
    broadcast_nhr_oneshot.cc L175-204, root 0): in reduce step k rank D = j 2^(k+1) receives the
    whole buffer from D + 2^k; in broadcast step k, with j = S-1-k, D = i 2^(j+1) sends to D + 2^j.
    hccl-py's tree allreduce is the same sequence of transfers on every rank."""
    from hccl_py.algorithms import _nhr
    from hccl_py.algorithms.registry import get_schedule

    tree = get_schedule("allreduce", "tree")
    for n in range(2, 18):
        top = _nhr.nsteps(n)
        want = {r: [] for r in range(n)}
        for k in range(top):  # reduce, nearest child first
            pair, grp = 1 << k, 2 << k
            for d in range(n):
                if d % grp == 0 and d + pair < n:
                    want[d].append(("recv", d + pair))
                    want[d + pair].append(("send", d))
        for k in range(top):  # broadcast, farthest child first
            j = top - 1 - k
            pair, grp = 1 << j, 2 << j
            for d in range(n):
                if d % grp == 0 and d + pair < n:
                    want[d].append(("send", d + pair))
                    want[d + pair].append(("recv", d))
        for r in range(n):
            got = [
                (kind, t.peer)
                for st in tree(r, n, 16).steps
                for kind, ts in (("recv", st.recvs), ("send", st.sends))
                for t in ts
            ]
            assert got == want[r], (n, r)
