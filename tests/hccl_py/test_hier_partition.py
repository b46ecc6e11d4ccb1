"""Partition strategies (hccl_py/planning/partition.py): enumeration, the workloads' definitions, optimized
at least as good as every manual grouping (the mixed-4p effect of issue 7), the link-graph
heuristic for clusters too large to enumerate, and the ACS uplink sharing behind mixed-4p."""

from __future__ import annotations

from collections import Counter
from itertools import combinations

import pytest

from hccl_py.algorithms.hierarchical import schedule_for
from hccl_py.errors import HcclParamError
from hccl_py.modeled.cost_model import CostModel, transfer_s
from hccl_py.modeled.simulator import simulate
from hccl_py.parallel.workload import DpInferWorkload
from hccl_py.planning.partition import (
    CollectiveWorkload,
    auto,
    bell,
    canonical,
    equal_partition_count,
    equal_partitions,
    evaluate,
    heuristic_candidates,
    manual,
    optimize,
    pair_bandwidth,
    parse_workload,
    set_partitions,
)
from topology import Topology, TopologyError


def test_enumerations_are_complete_canonical_and_distinct():
    for n in range(1, 7):
        parts = list(set_partitions(n))
        assert len(parts) == len(set(parts)) == bell(n)
        assert all(canonical(p) == p for p in parts)
    eq = list(equal_partitions(8))
    assert len(eq) == len(set(eq)) == equal_partition_count(8) == 142
    assert all(len({len(g) for g in p}) == 1 and sorted(r for g in p for r in g) == list(range(8)) for p in eq)


def test_ranks_sharing_the_acs_uplink_split_its_bandwidth():
    # mixed-4p: two PCIe flows at once (0->1, 2->3) share the switch uplink; the HCCS pair does not
    topo = Topology.preset("mixed-4p")
    pcie = topo.link_kinds["PCIE"].bandwidth_Bps
    nbytes = 1 << 20
    both = Counter(topo.route(0, 1).hops) + Counter(topo.route(2, 3).hops)
    assert transfer_s(topo, 0, 1, nbytes, both, collective=True) == pytest.approx(
        topo.route(0, 1).step_latency_s + nbytes / (pcie / 2)
    )
    with_hccs = Counter(topo.route(0, 3).hops) + Counter(topo.route(1, 2).hops)
    assert transfer_s(topo, 0, 3, nbytes, with_hccs, collective=True) == pytest.approx(
        topo.route(0, 3).step_latency_s + nbytes / pcie
    )
    bw = pair_bandwidth(topo)
    assert bw[1, 2] == topo.link_kinds["HCCS"].bandwidth_Bps and bw[0, 1] < bw[1, 2] / 2


def test_dp_infer_is_compute_then_a_hierarchical_allgather_of_the_outputs():
    topo = Topology.preset("mixed-4p")
    w = DpInferWorkload(batch_per_card=8)
    compute = w.compute_s(topo, 0)
    assert w.count() == 8 * 128 * 256  # per-token hidden states of the card's share
    assert DpInferWorkload(batch_per_card=8, output="logits").count() == 8 * 10
    part = ((1, 2), (0, 3))
    gather = simulate(
        "allgather", schedule_for("allgather", part), topo, w.count(), itemsize=2, start_clocks=[compute] * 4
    )
    assert w.time_s(topo, part, CostModel(topo)) == max(gather.end_clocks) > compute
    assert w.one_card_s(topo) == 4 * compute  # one card, the same batches back to back
    assert "dp-infer" in w.describe(topo) and "hidden states" in w.describe(topo)


@pytest.mark.parametrize("workload", ["dp-infer", "allreduce:64M", "allgather:4M", "reduce_scatter:16M"])
def test_optimized_is_at_least_as_good_as_every_manual_grouping_on_mixed_4p(workload):
    topo = Topology.preset("mixed-4p")
    w = parse_workload(workload)
    model = CostModel(topo)
    best = optimize(topo, w, model=model)
    assert best.method == "exhaustive" and best.evaluated == 15
    manual_times = {p: evaluate(topo, w, manual(p, 4), model) for p in ("0,1;2,3", "1,2;0,3", "0,2;1,3", "0,1,2,3")}
    assert best.time_s <= min(manual_times.values())
    # the user's effect: HCCL's auto grouping {0,1},{2,3} loses to the fast pair {1,2} grouped by hand
    assert auto(topo) == ((0, 1), (2, 3))
    assert manual_times["1,2;0,3"] < manual_times["0,1;2,3"]
    assert (1, 2) in best.partition


def test_dp_infer_speedups_on_mixed_4p_show_the_reported_gap():
    topo = Topology.preset("mixed-4p")
    w = DpInferWorkload()
    one = w.one_card_s(topo)
    speed_auto = one / evaluate(topo, w, auto(topo))
    speed_fast = one / evaluate(topo, w, [[1, 2], [0, 3]])
    assert 2.0 < speed_auto < speed_fast < 4.0  # a user saw 3.2x vs 3.6x; the model gives 2.33x vs 2.63x
    assert abs(speed_fast / speed_auto - 3.6 / 3.2) < 0.05  # the seed's effect: 1.125


def test_eight_ranks_search_equal_groups_and_find_the_islands():
    topo = Topology.preset("ascend910-8p")
    best = optimize(topo, CollectiveWorkload("allreduce", 16 << 20))
    assert best.method == "exhaustive" and best.evaluated == 142 and "equal groups" in best.detail
    islands = ((0, 1, 2, 3), (4, 5, 6, 7))
    assert best.time_s <= evaluate(topo, CollectiveWorkload("allreduce", 16 << 20), islands)
    # With HCCL's own figure for the 910's HCCS (10 GiB/s per link, below the host path's 12 GB/s)
    # grouping by island gains nothing over one ring through all 8 cards, the 8P ring HCCL runs there.
    assert best.partition == ((0, 1, 2, 3, 4, 5, 6, 7),)


def test_large_clusters_use_the_link_graph_heuristic():
    topo = Topology.preset("2x8p-roce")
    named = heuristic_candidates(topo)
    assert named["auto"] == canonical(auto(topo))
    assert {"matching level 1", "kernighan-lin level 1", "louvain"} <= set(named)
    assert named["louvain"] == ((0, 1, 2, 3, 4, 5, 6, 7), (8, 9, 10, 11, 12, 13, 14, 15))  # communities = servers
    assert all(
        a // 8 == b // 8 for g in named["matching level 1"] for a, b in combinations(g, 2)
    )  # pairs stay in a server
    w = CollectiveWorkload("allreduce", 16 << 20)
    best = optimize(topo, w)
    assert best.method == "heuristic" and "winner" in best.detail
    assert best.time_s <= evaluate(topo, w, auto(topo))
    assert optimize(topo, w, budget=10).partition == best.partition  # deterministic


def test_workload_and_partition_errors():
    with pytest.raises(HcclParamError):
        parse_workload("allreduce")
    with pytest.raises(HcclParamError):
        parse_workload("alltoall:1M")
    with pytest.raises(HcclParamError):
        parse_workload("allreduce:0")
    with pytest.raises(HcclParamError):
        DpInferWorkload(output="pixels")
    assert parse_workload("reducescatter:1M").collective == "reduce_scatter"
    assert manual("1,2;0,3", 4) == ((1, 2), (0, 3))
    with pytest.raises(TopologyError) as info:
        manual("0,1;1,2,3", 4)
    assert (info.value.field, info.value.value, info.value.rule, info.value.holder) == (
        "groups[1]",
        1,
        "unique",
        "groups[0]",
    )
