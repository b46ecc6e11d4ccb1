"""The simulator's all-ranks-at-once path (flows) equals its rank-by-rank walk to the last bit:
flat, two-level and rooted algorithms, any root, degraded links, uneven start clocks, and any
call hypothesis draws."""

from __future__ import annotations

import pytest
from hypothesis import HealthCheck, event, given, settings
from hypothesis import strategies as st

from hccl_py.algorithms.registry import algos_for
from hccl_py.collectives import CallSpec
from hccl_py.modeled.cost_model import CostModel
from hccl_py.modeled.simulator import simulate
from topology import Topology


@pytest.mark.parametrize("collective", ["allreduce", "allgather", "reduce_scatter"])
@pytest.mark.parametrize(
    "algo, sizes",
    [("ring", [2, 3, 5, 8, 16]), ("hd", [2, 4, 8, 16]), ("mesh", [2, 3, 8]), ("nhr", [2, 3, 5, 6, 7, 8, 16])],
)
@pytest.mark.parametrize("preset", ["ascend910-8p", "2x8p-roce"])
def test_all_ranks_at_once_equals_rank_by_rank(collective, algo, sizes, preset):
    from hccl_py.modeled.simulator import can_simulate_flows, simulate_flows

    for size in sizes:
        full = Topology.preset(preset)
        if size > full.num_ranks:
            continue
        topo = Topology.preset(preset, n=size) if preset != "2x8p-roce" or size == 16 else None
        if topo is None:
            continue
        for count in (size, 1000, 4097):
            assert can_simulate_flows(collective, algo, size, count)
            starts = [0.001 * ((r * 7) % 3) for r in range(size)]  # uneven arrival
            for dtype, itemsize, op in (("float32", 4, "sum"), ("float16", 2, "max")):  # inline, vector-unit reductions
                kw = dict(itemsize=itemsize, start_clocks=starts, dtype=dtype, op=op)
                generic = simulate(collective, algo, topo, count, **kw)
                fast = simulate_flows(collective, algo, topo, count, **kw)
                assert fast.end_clocks == generic.end_clocks, (size, count, dtype)
    for size in (2, 4, 8):  # recursive doubling (allreduce only)
        topo = Topology.preset("ascend910-8p", n=size)
        for count in (1, 1000):
            assert can_simulate_flows("allreduce", "rd", size, count)
            generic = simulate("allreduce", "rd", topo, count, itemsize=2, dtype="float16", op="max")
            assert (
                simulate_flows("allreduce", "rd", topo, count, itemsize=2, dtype="float16", op="max").end_clocks
                == generic.end_clocks
            )
    assert not can_simulate_flows("allreduce", "hd", 6, 100)  # folds: rank by rank only
    assert not can_simulate_flows("allreduce", "ring", 8, 3)  # empty steps


@pytest.mark.parametrize(
    "collective, algo",
    [
        ("broadcast", "ring"),
        ("reduce", "ring"),
        ("scatter", "ring"),
        ("gather", "ring"),
        ("scatter", "mesh"),
        ("gather", "mesh"),
    ],
)
def test_rooted_flows_equal_rank_by_rank(collective, algo):
    """The pipelined chains (``StepFlows.senders``) and the mesh scatter / gather against the
    rank-by-rank simulator, bit for bit: exclusive links (the active part costs what it costs in
    the whole pattern), shared PCIe (mixed-4p: whole arrays instead), a degraded link, inline and
    vector-unit reductions."""
    from hccl_py.modeled.simulator import can_simulate_flows, simulate_flows

    for preset in ("ascend910-8p", "2x8p-roce", "mixed-4p", "2x4p-roce-910"):
        full = Topology.preset(preset)
        for size in (2, 3, 5, 8, 16):
            if size > full.num_ranks:
                continue
            topo = Topology.preset(preset, n=size) if size < full.num_ranks else full
            model = CostModel(topo, degraded={(0, 1): 0.5})
            for count in (1, 2, size, 1000, 4097):  # 1, 2: fewer elements than ranks (empty chunks)
                assert can_simulate_flows(collective, algo, size, count)
                starts = [0.001 * ((r * 7) % 3) for r in range(size)]
                for dtype, itemsize, op in (("float32", 4, "sum"), ("float16", 2, "max")):
                    kw = dict(start_clocks=starts, itemsize=itemsize, dtype=dtype, op=op, cost_model=model)
                    generic = simulate(collective, algo, topo, count, **kw)
                    fast = simulate_flows(collective, algo, topo, count, **kw)
                    assert fast.end_clocks == generic.end_clocks, (preset, size, count, dtype)
    assert not can_simulate_flows(collective, algo, 8, 0)


def test_tree_allreduce_flows_equal_rank_by_rank():
    """The binomial-tree allreduce (HCCL's one-shot NHR across servers at up to 256 KiB a card),
    flat at every size from 2 to 9 and 16 (its rounds: a rank idles through the ones it has no
    part in) and as the outer level of the two-level allreduce on 2, 3, 4 and 34 servers, chunked
    and whole-buffer, against rank by rank to the last bit, with uneven starts and a degraded link."""
    from hccl_py.algorithms.hierarchical import schedule_for
    from hccl_py.choice.names import server_partition
    from hccl_py.modeled.simulator import can_simulate_flows, simulate_flows

    for preset in ("ascend910-8p", "2x8p-roce", "mixed-4p"):
        full = Topology.preset(preset)
        for size in (2, 3, 4, 5, 6, 7, 8, 9, 16):
            if size > full.num_ranks:
                continue
            topo = Topology.preset(preset, n=size) if size < full.num_ranks else full
            model = CostModel(topo, degraded={(0, 1): 0.5})
            for count in (1, 1000):
                assert can_simulate_flows("allreduce", "tree", size, count)
                starts = [0.001 * ((r * 7) % 3) for r in range(size)]
                kw = dict(start_clocks=starts, cost_model=model, itemsize=2, dtype="float16", op="max")
                generic = simulate("allreduce", "tree", topo, count, **kw)
                assert simulate_flows("allreduce", "tree", topo, count, **kw).end_clocks == generic.end_clocks
    for preset in ("2x4p-roce", "3x8p-roce", "4x2p-roce", "34x2p-roce"):
        topo = Topology.preset(preset)
        n = topo.num_ranks
        model = CostModel(topo, degraded={(0, n - 1): 0.5})
        for inner in ("mesh", "ring", "rd", "reducebcast"):  # chunked (mesh, ring) and whole-buffer
            fn = schedule_for("allreduce", server_partition(topo, tuple(range(n))), inner, "tree")
            for count in (n, 4097):
                assert can_simulate_flows("allreduce", fn, n, count), (preset, inner, count)
                kw = dict(itemsize=2, start_clocks=[0.001 * ((r * 5) % 3) for r in range(n)], cost_model=model)
                generic = simulate("allreduce", fn, topo, count, dtype="float16", **kw)
                fast = simulate_flows("allreduce", fn, topo, count, dtype="float16", **kw)
                assert fast.end_clocks == generic.end_clocks, (preset, inner, count)
    assert not can_simulate_flows("allreduce", "tree", 8, 0)


@pytest.mark.parametrize("collective", ["broadcast", "reduce"])
def test_hd_broadcast_and_reduce_flows_equal_rank_by_rank(collective):
    """``hd`` broadcast (binomial scatter, doubling) and reduce (halving, binomial gather), all
    ranks at once (power-of-two sizes), against rank by rank: exclusive links, shared PCIe, a
    degraded link, inline and vector-unit reductions."""
    from hccl_py.modeled.simulator import can_simulate_flows, simulate_flows

    for preset in ("ascend910-8p", "2x8p-roce", "mixed-4p", "2x4p-roce-910"):
        full = Topology.preset(preset)
        for size in (2, 4, 8, 16):
            if size > full.num_ranks:
                continue
            topo = Topology.preset(preset, n=size) if size < full.num_ranks else full
            model = CostModel(topo, degraded={(0, 1): 0.5})
            for count in (1, 3, size, 1000, 4097):  # fewer elements than ranks: empty chunks move nothing
                assert can_simulate_flows(collective, "hd", size, count)
                starts = [0.001 * ((r * 7) % 3) for r in range(size)]
                for dtype, itemsize, op in (("float32", 4, "sum"), ("float16", 2, "max")):
                    kw = dict(start_clocks=starts, cost_model=model, itemsize=itemsize, dtype=dtype, op=op)
                    generic = simulate(collective, "hd", topo, count, **kw)
                    fast = simulate_flows(collective, "hd", topo, count, **kw)
                    assert fast.end_clocks == generic.end_clocks, (preset, size, count, dtype)
    assert not can_simulate_flows(collective, "hd", 6, 100)  # folds: rank by rank
    assert not can_simulate_flows(collective, "hd", 8, 0)


def test_flows_serve_any_root_of_the_algorithms_that_number_ranks_from_it():
    """Flows written for root 0 run for any root on the topology seen from the root
    (``simulator._Rotated``), bit for bit as rank by rank, degraded links included; the mesh
    scatter, whose root sends in rank order, takes root 0 only."""
    from hccl_py.algorithms.registry import ROOTED_FLOWS
    from hccl_py.modeled.simulator import can_simulate_flows, simulate_flows

    assert {("broadcast", "ring"), ("broadcast", "hd"), ("gather", "mesh")} <= ROOTED_FLOWS
    assert ("scatter", "mesh") not in ROOTED_FLOWS and not can_simulate_flows("scatter", "mesh", 8, 100, root=3)
    for preset, size in (("2x4p-roce-910", 8), ("mixed-4p", 4), ("ascend910-8p", 5)):
        topo = Topology.preset(preset, n=size) if size < Topology.preset(preset).num_ranks else Topology.preset(preset)
        model = CostModel(topo, degraded={(0, 1): 0.5, (2, 3): 0.7})
        starts = [0.001 * ((r * 7) % 3) for r in range(size)]
        for collective, algo in sorted(ROOTED_FLOWS):
            for root in range(1, size):
                if not can_simulate_flows(collective, algo, size, 1000, root):
                    assert algo == "hd" and size & (size - 1)  # hd's flows: power-of-two sizes
                    continue
                for dtype, itemsize, op in (("float32", 4, "sum"), ("float16", 2, "max")):
                    kw = dict(root=root, start_clocks=starts, cost_model=model, itemsize=itemsize, dtype=dtype, op=op)
                    generic = simulate(collective, algo, topo, 1000, **kw)
                    fast = simulate_flows(collective, algo, topo, 1000, **kw)
                    assert fast.end_clocks == generic.end_clocks, (preset, collective, algo, root, dtype)


def test_chain_steps_are_the_pipelines_moments():
    """Step t of every rank of a chain is the pipeline's step t (idle steps kept before a rank's
    last), so a message's two ends share a step and links are shared among what runs at once."""
    from hccl_py.algorithms.registry import get_schedule
    from hccl_py.algorithms.schedule import message_numbers

    for collective, algo in (
        ("broadcast", "ring"),
        ("reduce", "ring"),
        ("scatter", "ring"),
        ("gather", "ring"),
        ("scatter", "mesh"),
        ("broadcast", "hd"),
        ("reduce", "hd"),
    ):
        fn = get_schedule(collective, algo)
        for size, count in ((5, 5), (6, 20), (4, 4096)):
            schedules = [fn(r, size, count, 0) for r in range(size)]
            sent = {}
            for r, sched in enumerate(schedules):
                for k, (step, (numbers, _)) in enumerate(zip(sched.steps, message_numbers(sched))):
                    for send, n in zip(step.sends, numbers):
                        sent[(r, send.peer, n)] = k
            for r, sched in enumerate(schedules):
                last = sched.steps[-1]
                assert last.sends or last.recvs or last.copies  # idle steps only before the last
                for k, (step, (_, numbers)) in enumerate(zip(sched.steps, message_numbers(sched))):
                    for recv, n in zip(step.recvs, numbers):
                        assert sent[(recv.peer, r, n)] == k, (collective, algo, size, r, k)


def test_the_simulator_pauses_the_cyclic_collector_and_restores_it():
    import gc

    from hccl_py.algorithms.registry import get_schedule

    ring = get_schedule("allreduce", "ring")
    seen = []

    def watched(rank, size, count, root):
        seen.append(gc.isenabled())
        return ring(rank, size, count, root)

    topo = Topology.preset("ascend910-8p", n=4)  # two HCCS islands over PCIe
    assert gc.isenabled()
    paused = simulate("allreduce", watched, topo, 100)
    assert seen == [False] * 4 and gc.isenabled()
    assert paused.end_clocks == simulate("allreduce", "ring", topo, 100).end_clocks

    def broken(rank, size, count, root):
        raise ValueError("no schedule")

    with pytest.raises(ValueError):
        simulate("allreduce", broken, topo, 100)
    assert gc.isenabled()  # resumed after an error too
    gc.disable()
    try:
        simulate("allreduce", watched, topo, 100)
        assert not gc.isenabled()  # a caller's own pause is left as it was
    finally:
        gc.enable()


@pytest.mark.parametrize("preset", ["2x4p-roce", "4x2p-roce", "2x4p-roce-910"])
@pytest.mark.parametrize("collective", ["allreduce", "allgather", "reduce_scatter"])
def test_two_level_flows_equal_rank_by_rank(preset, collective):
    from hccl_py.algorithms.hierarchical import schedule_for
    from hccl_py.choice.names import server_partition
    from hccl_py.modeled.simulator import can_simulate_flows, simulate_flows

    topo = Topology.preset(preset)
    n = topo.num_ranks
    part = server_partition(topo, tuple(range(n)))
    model = CostModel(topo, degraded={(0, n - 1): 0.5})
    for inner, outer in (
        ("mesh", "ring"),
        ("mesh", "hd"),
        ("ring", "hd"),
        ("hd", "ring"),
        ("mesh", "nhr"),
        ("nhr", "ring"),
        ("mesh", "pipeline"),
        ("rd", "rd"),
        ("rd", "nhr"),
        ("rd", "ring"),
        ("reducebcast", "nhr"),
        ("reducebcast", "ring"),
        ("hd", "ring-first"),
        ("nhr", "nhr-first"),
    ):
        if inner in ("rd", "reducebcast") and collective != "allreduce":
            continue  # whole buffers: allreduce only
        if outer.endswith("-first") and collective != "reduce_scatter":
            continue  # across first: reduce_scatter only
        fn = schedule_for(collective, part, inner, outer)
        for count in (n, 1000, 4097):  # 4097: allreduce's staged path (chunks of unequal size)
            assert can_simulate_flows(collective, fn, n, count)
            starts = [0.001 * ((r * 5) % 3) for r in range(n)]
            kw = dict(itemsize=2, start_clocks=starts, cost_model=model, dtype="float16")
            generic = simulate(collective, fn, topo, count, **kw)
            fast = simulate_flows(collective, fn, topo, count, **kw)
            assert fast.end_clocks == generic.end_clocks, (inner, outer, count)


@pytest.mark.parametrize("preset", ["2x4p-roce", "4x2p-roce", "2x4p-roce-910", "3x8p-roce"])
@pytest.mark.parametrize("collective", ["scatter", "gather"])
def test_two_level_scatter_and_gather_flows_equal_rank_by_rank(preset, collective):
    """HCCL's two-level scatter (and its mirrored gather): the root plane's outer algorithm and
    every server's inner one as flows, against rank by rank, with a degraded link."""
    from hccl_py.algorithms.hierarchical import schedule_for
    from hccl_py.choice.names import server_partition
    from hccl_py.modeled.simulator import can_simulate_flows, simulate_flows

    topo = Topology.preset(preset)
    n = topo.num_ranks
    part = server_partition(topo, tuple(range(n)))
    model = CostModel(topo, degraded={(0, n - 1): 0.5})
    for inner in ("mesh", "ring"):
        for outer in ("mesh", "ring"):
            fn = schedule_for(collective, part, inner, outer)
            for count in (1, 7, 1000):
                assert can_simulate_flows(collective, fn, n, count)
                starts = [0.001 * ((r * 5) % 3) for r in range(n)]
                kw = dict(itemsize=2, start_clocks=starts, cost_model=model, dtype="float16")
                generic = simulate(collective, fn, topo, count, **kw)
                fast = simulate_flows(collective, fn, topo, count, **kw)
                assert fast.end_clocks == generic.end_clocks, (inner, outer, count)
    uneven = schedule_for(collective, [[0, 2], [1, 3, 4, 5, 6, 7]], "mesh", "ring")
    assert not can_simulate_flows(collective, uneven, 8, 10)  # unequal groups: rank by rank
    backwards = schedule_for(collective, [[6, 7], [4, 5], [2, 3], [0, 1]], "ring", "ring")
    assert not can_simulate_flows(collective, backwards, 8, 10)  # groups out of order: rank by rank


def test_pairwise_alltoall_flows_equal_rank_by_rank():
    """The flat pairwise all-to-all (HCCL's choice on servers of different NPU counts, or of one
    NPU each) all ranks at once, against rank by rank."""
    from hccl_py.modeled.simulator import can_simulate_flows, simulate_flows

    for preset, n in (("ascend910-8p", 5), ("mixed-4p", None), ("2x4p-roce", None), ("34x1p-roce", None)):
        topo = Topology.preset(preset, n=n)
        size = topo.num_ranks
        model = CostModel(topo, degraded={(0, size - 1): 0.5})
        starts = [0.001 * ((r * 5) % 3) for r in range(size)]
        for count in (1, 7, 1000):
            assert can_simulate_flows("alltoall", "pairwise", size, count)
            generic = simulate("alltoall", "pairwise", topo, count, itemsize=2, start_clocks=starts, cost_model=model)
            fast = simulate_flows(
                "alltoall", "pairwise", topo, count, itemsize=2, start_clocks=starts, cost_model=model
            )
            assert fast.end_clocks == generic.end_clocks, (preset, count)
    assert not can_simulate_flows("alltoall", "pairwise", 8, 0)


@pytest.mark.parametrize("preset", ["2x4p-roce", "4x2p-roce", "2x8p-roce-910", "34x2p-roce"])
def test_staged_alltoall_flows_equal_rank_by_rank(preset):
    """HCCL's staged all-to-all (each level mesh or pairwise) and its pipelined one, all ranks at
    once, against rank by rank: servers and 910 islands as groups, a leaf-spine cluster, groups
    not in rank order, a degraded link, uneven start clocks."""
    from hccl_py.algorithms.hierarchical import schedule_for
    from hccl_py.choice.names import partition_of, server_partition
    from hccl_py.modeled.simulator import can_simulate_flows, simulate_flows

    topo = Topology.preset(preset)
    n = topo.num_ranks
    model = CostModel(topo, degraded={(0, n - 1): 0.5, (1, n // 2 + 1): 0.25})
    starts = [0.001 * ((r * 5) % 3) for r in range(n)]
    partitions = {
        server_partition(topo, tuple(range(n))),
        partition_of(topo, "hier:mesh/pairwise@groups", tuple(range(n))),
    }
    partitions.add(tuple(reversed(server_partition(topo, tuple(range(n))))))  # groups out of rank order
    for part in partitions:
        levels = [
            ("mesh", "pairwise"),
            ("pairwise", "pairwise"),
            ("mesh", "mesh"),
            ("pairwise", "mesh"),
            ("mesh", "pipeline"),
        ]
        for inner, outer in levels if n <= 16 else levels[::4]:
            fn = schedule_for("alltoall", part, inner, outer)
            for count in (1, 7, 1000):
                assert can_simulate_flows("alltoall", fn, n, count)
                generic = simulate("alltoall", fn, topo, count, itemsize=2, start_clocks=starts, cost_model=model)
                fast = simulate_flows("alltoall", fn, topo, count, itemsize=2, start_clocks=starts, cost_model=model)
                assert fast.end_clocks == generic.end_clocks, (part, inner, outer, count)
    if preset == "34x2p-roce":  # a mesh across many groups would be (groups - 1) lanes of every rank: rank by rank
        import hccl_py.algorithms.alltoall_staged as staged

        across = schedule_for("alltoall", server_partition(topo, tuple(range(n))), "mesh", "mesh")
        assert can_simulate_flows("alltoall", across, n, 10)
        old, staged.MESH_LANES_MAX = staged.MESH_LANES_MAX, 33 * n - 1
        try:
            assert not can_simulate_flows("alltoall", across, n, 10)
        finally:
            staged.MESH_LANES_MAX = old
    single = schedule_for("alltoall", (tuple(range(n)),), "mesh", "pairwise")
    assert not can_simulate_flows("alltoall", single, n, 10)  # one group: rank by rank
    assert not can_simulate_flows(
        "alltoall", schedule_for("alltoall", server_partition(topo, tuple(range(n))), "mesh", "pairwise"), n, 0
    )


@pytest.mark.parametrize("preset", ["2x4p-roce", "4x2p-roce", "2x4p-roce-910", "4x8p-roce"])
@pytest.mark.parametrize("collective", ["broadcast", "reduce"])
def test_two_level_broadcast_and_reduce_flows_equal_rank_by_rank(preset, collective):
    """HCCL's two-level broadcast (scatter in the root's server, broadcast across, allgather) and
    reduce (reduce-scatter, reduce across, gather to the root) with root 0, all ranks at once,
    against rank by rank: inline and vector-unit reductions, a degraded link, uneven starts."""
    from hccl_py.algorithms.hierarchical import schedule_for
    from hccl_py.choice.names import server_partition
    from hccl_py.modeled.simulator import can_simulate_flows, simulate_flows

    topo = Topology.preset(preset)
    n = topo.num_ranks
    part = server_partition(topo, tuple(range(n)))
    g = len(part[0])
    model = CostModel(topo, degraded={(0, n - 1): 0.5, (1, g): 0.25})
    starts = [0.001 * ((r * 5) % 3) for r in range(n)]
    outers = ("hd",) if collective == "broadcast" else ("hd", "ring")
    for inner in ("mesh", "ring", "hd"):
        for outer in outers:
            fn = schedule_for(collective, part, inner, outer)
            # fewer elements a chunk than groups (empty chunks); hd: chunks of two sizes too (staged through TMP)
            more = (g, 3 * g, 10 * g + 1, n + 1, 1000 * g + 3) if outer == "hd" else (g, 3 * g)
            for count in (*more, n, 40 * g, 1000 * g):
                assert can_simulate_flows(collective, fn, n, count), (inner, outer, count)
                for dtype, itemsize, op in (("float32", 4, "sum"), ("float16", 2, "max")):
                    kw = dict(start_clocks=starts, cost_model=model, itemsize=itemsize, dtype=dtype, op=op)
                    generic = simulate(collective, fn, topo, count, **kw)
                    fast = simulate_flows(collective, fn, topo, count, **kw)
                    assert fast.end_clocks == generic.end_clocks, (inner, outer, count, dtype)
    assert not can_simulate_flows(collective, schedule_for(collective, part, "mesh", "hd"), n, g - 1)  # an empty chunk
    if collective == "reduce":  # a chain across, chunks of two sizes: rank by rank
        assert not can_simulate_flows(collective, schedule_for(collective, part, "mesh", "ring"), n, 40 * g + 1)
    if collective == "broadcast":
        assert not can_simulate_flows(collective, schedule_for(collective, part, "mesh", "ring"), n, 40 * g)


def test_outer_algorithms_keep_the_two_level_broadcast_and_reduce_aligned():
    """What ``hierarchical_flows._ALIGNED_OUTER`` relies on: a broadcast's every rank runs as many
    steps; a reduce's root runs the most."""
    from hccl_py.algorithms.hierarchical_flows import _ALIGNED_OUTER
    from hccl_py.algorithms.registry import get_schedule

    for collective, algos in _ALIGNED_OUTER.items():
        for algo in algos:
            fn = get_schedule(collective, algo)
            for k in (2, 3, 4, 5, 8, 16, 32) if algo == "ring" else (2, 4, 8, 16, 32):
                for count in (k, 3 * k + 1, 1000, *((1, k // 2 + 1) if algo == "hd" else ())):  # hd: empty chunks too
                    lengths = [len(fn(r, k, count, 0).steps) for r in range(k)]
                    if collective == "broadcast":
                        assert len(set(lengths)) == 1, (algo, k, count, lengths)
                    else:
                        assert lengths[0] == max(lengths), (algo, k, count, lengths)


def test_a_degraded_direction_given_its_own_factor_keeps_it():
    """``degraded={(a, b): f}`` slows both directions; a factor given for (b, a) as well wins there."""
    topo = Topology.preset("2x4p-roce")
    model = CostModel(topo, degraded={(0, 7): 0.5, (7, 0): 0.25, (1, 2): 0.75})
    assert model.degraded == {(0, 7): 0.5, (7, 0): 0.25, (1, 2): 0.75, (2, 1): 0.75}


_FLOW_PRESETS = [
    "2x4p-roce",
    "4x2p-roce",
    "2x4p-roce-910",
    "2x8p-roce-910",
    "3x8p-roce",
    "34x2p-roce",
    "mixed-4p",
    "pcie-4p",
    "ascend910-8p",
    "ascend910b-8p",
]
_FLOW_COLLECTIVES = ["allreduce", "allgather", "reduce_scatter", "broadcast", "reduce", "scatter", "gather", "alltoall"]


@st.composite
def _flow_calls(draw):
    """A call the flow engine may take: preset, collective, a flat or two-level algorithm (or
    auto), count (boundaries around the ranks and groups, and odd ones), root, a degraded link,
    uneven start clocks, dtype and op."""
    from hccl_py.algorithms.hierarchical import LEVELS

    topo = Topology.preset(draw(st.sampled_from(_FLOW_PRESETS)))
    n = topo.num_ranks
    collective = draw(st.sampled_from(_FLOW_COLLECTIVES))
    names = ["auto", *algos_for(collective)]
    if collective in LEVELS:
        inner_of, outer_of = LEVELS[collective]
        inner = draw(st.sampled_from([*algos_for(inner_of[0]), "reducebcast", "rd"]))
        outer = draw(st.sampled_from([*algos_for(outer_of[0]), "pipeline", "ring-first", "nhr-first"]))
        names += [f"hier:{inner}/{outer}", f"hier:{inner}/{outer}@groups"]
    algo = draw(st.sampled_from(names))
    count = draw(st.one_of(st.sampled_from([0, 1, n - 1, n, n + 1, 2 * n, 8, 7, 4097]), st.integers(0, 3000)))
    root = draw(st.sampled_from([0, 0, 1, n - 1, n // 2]))
    a, b = draw(st.integers(0, n - 1)), draw(st.integers(0, n - 1))
    degraded = {(a, b): draw(st.sampled_from([0.25, 0.5]))} if a != b else {}
    starts = [0.001 * ((r * draw(st.integers(0, 7))) % 3) for r in range(n)]
    dtype = draw(st.sampled_from([("float32", 4), ("float16", 2), ("int8", 1), ("bfloat16", 2), ("int64", 8)]))
    op = draw(st.sampled_from(["sum", "max", "min", "prod"]))  # the op decides where a reduction runs (inline or not)
    return topo, collective, algo, count, root, degraded, starts, dtype, op


@settings(max_examples=300, deadline=None, database=None, suppress_health_check=[HealthCheck.too_slow])
@given(call=_flow_calls())
def test_any_call_the_flows_take_equals_rank_by_rank(call):
    """Wherever ``can_simulate_flows`` says yes (what ``simulate_call`` then runs at scale), the
    flows' clocks equal the rank-by-rank walk's to the last bit, on any of the drawn calls
    (4,000 examples, 925 of them as flows, all equal when written; 300 here)."""
    from hccl_py.algorithms.hierarchical import schedule_for
    from hccl_py.algorithms.registry import get_schedule
    from hccl_py.choice.names import hier_levels, partition_of, server_partition
    from hccl_py.choice.select import auto
    from hccl_py.errors import HcclError
    from hccl_py.modeled.simulator import can_simulate_flows, simulate_flows

    topo, collective, algo, count, root, degraded, starts, (dtype, itemsize), op = call
    n = topo.num_ranks
    model = CostModel(topo, degraded=degraded)
    ranks = tuple(range(n))
    try:
        name = (
            auto(model, CallSpec.of(collective, count, itemsize=itemsize, dtype=dtype, op=op, root=root), ranks)
            if algo == "auto"
            else algo
        )
        levels = hier_levels(name)
        fn = (
            name
            if levels is None
            else schedule_for(collective, partition_of(topo, name, ranks) or server_partition(topo, ranks), *levels)
        )
        get_schedule(collective, fn)(0, n, count, root)  # what the library refuses is refused here
    except (HcclError, ValueError):
        event("refused")
        return
    if not can_simulate_flows(collective, fn, n, count, root):
        event("rank by rank only")
        return
    event("flows")
    kw = dict(itemsize=itemsize, start_clocks=starts, cost_model=model, dtype=dtype, op=op, root=root)
    assert (
        simulate_flows(collective, fn, topo, count, **kw).end_clocks
        == simulate(collective, fn, topo, count, **kw).end_clocks
    )
