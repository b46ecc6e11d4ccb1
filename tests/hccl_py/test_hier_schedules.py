"""Hierarchical schedules (algorithms/hierarchical.py), played in one process: the same results
as the flat algorithms on many partitions (uneven too), sizes, ops and level algorithms; the
factory's caching and errors; which links each level's bytes take; the algo-name plumbing."""

from __future__ import annotations

import numpy as np
import pytest

from hccl_py.algorithms.hierarchical import HIER_COLLECTIVES, format_partition, schedule_for
from hccl_py.algorithms.playback import play
from hccl_py.algorithms.registry import ALL_ALGOS, SCHEDULES, algos_for, get_schedule
from hccl_py.algorithms.schedule import TMP
from hccl_py.choice import names as algo_names
from hccl_py.errors import HcclNotSupportedError, HcclParamError
from hccl_py.modeled.simulator import simulate
from topology import Topology

PARTITIONS = [
    [[0, 1], [2, 3]],
    [[1, 2], [0, 3]],
    [[3, 0, 2], [1]],
    [[0], [1], [2], [3]],
    [[0, 1, 2, 3]],
    [[0, 1, 2], [3, 4]],
    [[4, 1], [0, 2, 3]],
    [[0, 3], [1, 4], [2]],
    [[0, 1, 2], [3, 4, 5]],
    [[0, 2, 4], [1, 3, 5]],
    [[0, 1, 2, 3], [4, 5, 6, 7]],
    [[0, 4], [1, 5], [2, 6], [3, 7]],
    [[5, 2, 7], [0], [6, 1, 3, 4]],
]
LEVELS = [("ring", "ring"), ("hd", "mesh"), ("tree", "hd"), ("mesh", "tree")]
COUNTS = [1, 2, 5, 13, 24]


def _reference(collective, inputs, op, root):
    ufunc = {"sum": np.add, "max": np.maximum, "min": np.minimum}[op]
    size = len(inputs)
    if collective == "broadcast":
        return [inputs[root]] * size
    if collective == "allgather":
        return [np.concatenate(inputs)] * size
    total = ufunc.reduce(np.stack(inputs))
    if collective == "allreduce":
        return [total] * size
    if collective == "reduce":
        return [total if r == root else inputs[r] for r in range(size)]
    block = len(total) // size
    return [total[r * block : (r + 1) * block] for r in range(size)]


def _inputs(collective, size, count, dtype, seed):
    rng = np.random.default_rng(seed)
    n = count * size if collective == "reduce_scatter" else count
    if np.dtype(dtype).kind == "f":
        return [rng.standard_normal(n).astype(dtype) for _ in range(size)]
    return [rng.integers(-100, 100, n).astype(dtype) for _ in range(size)]


@pytest.mark.parametrize("partition", PARTITIONS, ids=format_partition)
@pytest.mark.parametrize("collective", HIER_COLLECTIVES)
def test_hierarchical_equals_the_flat_result_exactly_for_integers(collective, partition):
    size = sum(map(len, partition))
    roots = sorted({0, size - 1, size // 2}) if collective in ("broadcast", "reduce") else [0]
    for inner, outer in LEVELS:
        fn = schedule_for(collective, partition, inner, outer)
        for count in COUNTS:
            for root in roots:
                inputs = _inputs(collective, size, count, np.int64, count)
                outs = play(collective, fn, size, inputs, root=root, op="sum")
                for r, (got, want) in enumerate(zip(outs, _reference(collective, inputs, "sum", root))):
                    assert np.array_equal(got, want), (collective, partition, inner, outer, count, root, r)


@pytest.mark.parametrize(
    "partition", [[[0, 1], [2, 3, 4]], [[0, 2, 4], [1, 3, 5]], [[6, 1, 3], [0, 2], [4, 5, 7]]], ids=format_partition
)
@pytest.mark.parametrize("collective", ["allreduce", "reduce", "reduce_scatter"])
def test_float_results_match_and_are_identical_on_every_rank(collective, partition):
    size = sum(map(len, partition))
    fn = schedule_for(collective, partition, "ring", "hd")
    for count in (7, 64):
        inputs = _inputs(collective, size, count, np.float32, count + 1)
        for op in ("max", "min"):  # exact
            outs = play(collective, fn, size, inputs, root=1, op=op)
            for got, want in zip(outs, _reference(collective, inputs, op, 1)):
                assert np.array_equal(got, want)
        outs = play(collective, fn, size, inputs, root=1, op="sum")
        for got, want in zip(outs, _reference(collective, inputs, "sum", 1)):
            np.testing.assert_allclose(got, want, rtol=1e-5, atol=1e-5)
        if collective == "allreduce":
            assert all(np.array_equal(outs[0], o) for o in outs)  # bit-identical on every rank


def test_factory_is_cached_and_checks_its_arguments():
    fn = schedule_for("allreduce", [[1, 2], [0, 3]])
    assert schedule_for("allreduce", ((1, 2), (0, 3)), "ring", "ring") is fn  # per-function caches keep working
    assert fn.partition == ((1, 2), (0, 3)) and fn.__name__ == "hier[1,2;0,3]:ring/ring"
    assert get_schedule("allreduce", fn) is fn  # the registry passes schedule functions through
    with pytest.raises(HcclParamError) as info:
        schedule_for("allreduce", [[0, 1], [1, 2]])
    assert (info.value.arg, info.value.field, info.value.value, info.value.rule) == (
        "partition",
        "groups[1]",
        1,
        "unique",
    )
    with pytest.raises(HcclParamError) as info:
        fn(0, 5, 10, 0)
    assert (info.value.arg, info.value.value, info.value.rule, info.value.expected) == ("size", 5, "const", 4)
    with pytest.raises(HcclParamError) as info:
        schedule_for("barrier", [[0], [1]])
    assert (info.value.arg, info.value.value, info.value.rule) == ("collective", "barrier", "choices")
    with pytest.raises(HcclNotSupportedError):
        schedule_for("allgather", [[0], [1]], "ring", "rd")  # rd is allreduce-only
    assert fn(0, 4, 0, 0).steps == ()


def test_aligned_partitions_work_in_place_without_staging_copies():
    # equal groups and a count divisible by the group size: no staging area; the only local copy
    # puts the rank's reduced chunk back in place (the allgather's own block)
    sched = schedule_for("allreduce", [[0, 1], [2, 3]])(1, 4, 64)
    assert sum(c.src.count for step in sched.steps for c in step.copies) == 64 // 2
    assert sched.tmp_count <= 32 + 32  # the held chunk plus the sub-schedules' scratch
    uneven = schedule_for("allreduce", [[0, 1, 2], [3]])(1, 4, 64)  # staged: copied in and out
    assert sum(c.src.count for step in uneven.steps for c in step.copies) > 64
    # consecutive groups put allgather's columns out of order: staged, then copied out
    staged = schedule_for("allgather", [[0, 1], [2, 3]])(0, 4, 8)
    assert any(c.src.buf == TMP for step in staged.steps for c in step.copies)
    inplace = schedule_for("allgather", [[0, 2], [1, 3]])(0, 4, 8)
    assert sum(c.src.count for step in inplace.steps for c in step.copies) == 8  # only IN into its own block


def test_the_slow_level_carries_the_least_data():
    # 2 servers of 8 (RoCE between them): per rank, hierarchical allreduce sends 2(k-1)/k * n/m
    # elements across servers (k = 2 groups, m = 8); the flat ring sends most of its bytes there
    topo = Topology.preset("2x8p-roce")
    count = 1 << 16
    servers = [list(range(8)), list(range(8, 16))]

    def cross_server(fn):
        total = 0
        for rank in range(16):
            for step in fn(rank, 16, count, 0).steps:
                total += sum(s.src.count for s in step.sends if topo.server_of(s.peer) != topo.server_of(rank))
        return total / 16

    assert cross_server(schedule_for("allreduce", servers)) == 2 * (2 - 1) / 2 * count / 8
    assert cross_server(get_schedule("allreduce", "ring")) >= count / 8
    hier = simulate("allreduce", schedule_for("allreduce", servers), topo, count * 64).time_s
    assert hier < simulate("allreduce", "ring", topo, count * 64).time_s


def test_mixed_4p_fast_pair_beats_hccl_auto_grouping():
    # the effect of issue 7: with ACS the PCIe pairs share the switch uplink; the {1,2} HCCS pair does not
    topo = Topology.preset("mixed-4p")
    t = {
        name: simulate("allreduce", schedule_for("allreduce", p), topo, 16 << 20).time_s
        for name, p in (("auto", [[0, 1], [2, 3]]), ("fast", [[1, 2], [0, 3]]))
    }
    assert t["fast"] < 0.8 * t["auto"]


def test_algo_names_resolve_to_hier_levels():
    assert "hier" in ALL_ALGOS and not any(a == "hier" for _, a in SCHEDULES)
    assert "hier" not in algos_for("allreduce")  # auto and the flat sweeps are unchanged
    auto = lambda: "ring"  # noqa: E731
    assert algo_names.resolve("allreduce", "hier", auto, {}) == "hier:ring/ring"
    assert algo_names.resolve("allgather", "HIER:fullmesh/H-D_R", auto, {}) == "hier:mesh/hd"
    assert algo_names.resolve("allreduce", "auto", auto, {"*": "hier:ring/hd"}) == "hier:ring/hd"
    assert algo_names.parse_hccl_algo("level0:ring;level1:H-D_R") == {"*": "hier:ring/hd"}
    assert algo_names.parse_hccl_algo("level0:NA;level1:ring") == {"*": "level1:ring"}  # level 1 alone: auto's level 0
    assert algo_names.parse_hccl_algo("allreduce=level0:fullmesh;level1:ring") == {"allreduce": "hier:mesh/ring"}
    with pytest.raises(HcclNotSupportedError):
        algo_names.resolve("allgather", "hier:ring/rd", auto, {})
    with pytest.raises(HcclNotSupportedError):
        algo_names.resolve("barrier", "hier", auto, {})


# ------------------------------------------------------------------------------- HCCL's pipeline
EQUAL = [p for p in PARTITIONS if len({len(g) for g in p}) == 1] + [[[0, 1, 2, 3, 4, 5]], [[5, 0], [3, 1], [2, 4]]]


@pytest.mark.parametrize("partition", EQUAL, ids=format_partition)
@pytest.mark.parametrize("collective", ["allgather", "reduce_scatter", "allreduce"])
def test_pipeline_equals_the_flat_result(collective, partition):
    size = sum(map(len, partition))
    fn = schedule_for(collective, partition, "mesh", "pipeline")
    for count in (*COUNTS, 3 * size + 1):
        inputs = _inputs(collective, size, count, np.int64, count)
        for op in ("sum", "max"):
            outs = play(collective, fn, size, inputs, op=op)
            for r, (got, want) in enumerate(zip(outs, _reference(collective, inputs, op, 0))):
                assert np.array_equal(got, want), (collective, partition, count, op, r)
    if collective == "allreduce":  # float sums: one order, so every rank ends bit-identical
        outs = play(collective, fn, size, _inputs(collective, size, 29, np.float32, 3), op="sum")
        assert all(o.tobytes() == outs[0].tobytes() for o in outs)


def test_pipeline_overlaps_the_levels_and_refuses_what_hccl_has_not():
    m, g = 2, 4
    partition = [[0, 1, 2, 3], [4, 5, 6, 7]]
    fn = schedule_for("allgather", partition, "mesh", "pipeline")
    steps = fn(0, 8, 10).steps
    assert len(steps) == m  # m steps, not m - 1 across plus the mesh after
    first = steps[0]
    assert [s.peer for s in first.sends] == [4, 1, 2, 3] and [r.peer for r in first.recvs] == [4, 1, 2, 3]
    assert len(steps[-1].sends) == g - 1  # the drain step: no ring transfer, the mesh only
    with pytest.raises(HcclParamError) as info:
        schedule_for("broadcast", partition, "mesh", "pipeline")
    assert info.value.collective == "broadcast"
    with pytest.raises(HcclParamError):
        schedule_for("allgather", partition, "ring", "pipeline")  # level 0 of HCCL's pipeline is the mesh
    with pytest.raises(HcclParamError) as info:
        schedule_for("allgather", [[0, 1, 2], [3]], "mesh", "pipeline")
    assert info.value.rule == "equal groups"
    with pytest.raises(HcclParamError) as info:
        fn(0, 4, 10)  # the partition serves 8 ranks
    assert (info.value.arg, info.value.value, info.value.expected) == ("size", 4, 8)
    assert fn.__name__ == "hier[0,1,2,3;4,5,6,7]:mesh/pipeline" and fn.outer == "pipeline"


# --------------------------------------------------- whole buffers (HCCL's small-count allreduce)
@pytest.mark.parametrize("partition", EQUAL, ids=format_partition)
def test_whole_buffer_allreduce_equals_numpy_and_is_bit_identical(partition):
    size = sum(map(len, partition))
    for inner, outer in (("rd", "rd"), ("rd", "nhr"), ("rd", "ring"), ("oneshot", "hd")):
        fn = schedule_for("allreduce", partition, inner, outer)
        for count in (0, 1, 5, 37):
            inputs = _inputs("allreduce", size, count, np.int64, count)
            for op in ("sum", "max"):
                for got, want in zip(
                    play("allreduce", fn, size, inputs, op=op), _reference("allreduce", inputs, op, 0)
                ):
                    assert np.array_equal(got, want), (partition, inner, outer, count, op)
        outs = play("allreduce", fn, size, _inputs("allreduce", size, 29, np.float32, 5), op="sum")
        assert all(o.tobytes() == outs[0].tobytes() for o in outs)
    steps = schedule_for("allreduce", [[0, 1, 2, 3], [4, 5, 6, 7]], "rd", "rd")(0, 8, 10).steps
    assert [[s.peer for s in st.sends] for st in steps if st.sends] == [[1], [2], [4]]  # doubling inside, then across
    with pytest.raises(HcclParamError) as info:
        schedule_for("allreduce", [[0, 1, 2], [3]], "rd", "rd")
    assert info.value.rule == "equal groups"


# ------------------------------------------------- across first (HCCL's small-count reduce_scatter)
@pytest.mark.parametrize("partition", EQUAL, ids=format_partition)
def test_reduce_scatter_across_first_equals_numpy(partition):
    """hier:<inner>/<outer>-first: the outer reduce-scatter of the whole input among same-index
    ranks, then the inner one in every group; groups in any order and of any member order."""
    size = sum(map(len, partition))
    for inner, outer in (("hd", "ring-first"), ("nhr", "nhr-first"), ("mesh", "hd-first"), ("ring", "mesh-first")):
        fn = schedule_for("reduce_scatter", partition, inner, outer)
        assert fn.across_first and fn.outer == outer.removesuffix("-first")
        for count in (0, 1, 5, 13):
            inputs = _inputs("reduce_scatter", size, count, np.int64, count)
            for op in ("sum", "max"):
                got = play("reduce_scatter", fn, size, inputs, op=op)
                for r, want in enumerate(_reference("reduce_scatter", inputs, op, 0)):
                    assert np.array_equal(got[r], want), (partition, inner, outer, count, op, r)
    steps = schedule_for("reduce_scatter", [[0, 1, 2, 3], [4, 5, 6, 7]], "hd", "ring-first")(0, 8, 10).steps
    assert [[s.peer for s in st.sends] for st in steps if st.sends][0] == [4]  # across servers first
    with pytest.raises(HcclParamError):
        schedule_for("allgather", [[0, 1], [2, 3]], "mesh", "ring-first")
    with pytest.raises(HcclParamError):
        schedule_for("reduce_scatter", [[0, 1, 2], [3]], "hd", "ring-first")
    assert algo_names.resolve("reduce_scatter", "hier:hd/ring-first", None, {}) == "hier:hd/ring-first"
    with pytest.raises(HcclNotSupportedError):
        algo_names.resolve("allreduce", "hier:hd/ring-first", None, {})
