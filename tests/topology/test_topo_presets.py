"""Preset wiring, routes (structural == latency-shortest), and the 4096-rank scale."""

import re
from collections import Counter
from itertools import combinations

import networkx as nx
import pytest

from topology import PRESETS, RankTable, Topology, TopologyError, default_preset
from topology.figures import CARD_MODELS, LEVEL1_PORTS, LINK_KINDS, LinkSpec


def kinds(topo, a, b):
    return [topo.link(u, v).kind for u, v in topo.route(a, b).hops]


def test_every_listed_preset_builds():
    for name in PRESETS:
        topo = Topology.preset(name)
        assert topo.num_ranks >= 4 and topo.name == name


def test_ascend910_8p_has_two_hccs_islands_joined_over_pcie():
    topo = Topology.preset("ascend910-8p")
    assert [topo.island_of(r) for r in range(8)] == [0, 0, 0, 0, 1, 1, 1, 1]
    assert {topo.card(r).name for r in range(8)} == {"ascend910"}
    for a, b in combinations(range(4), 2):
        assert kinds(topo, a, b) == ["HCCS"] and kinds(topo, a + 4, b + 4) == ["HCCS"]
    route = topo.route(0, 5)
    assert [h for h in route.hops] == [("card0", "s0.pcie0"), ("s0.pcie0", "s0.pcie1"), ("s0.pcie1", "card5")]
    assert kinds(topo, 0, 5) == ["PCIE", "HOST", "PCIE"]
    assert route.bandwidth_Bps == topo.link_kinds["HOST"].bandwidth_Bps
    assert route.latency_s == pytest.approx(2 * topo.link_kinds["PCIE"].latency_s + topo.link_kinds["HOST"].latency_s)
    hccs = topo.link_kinds["HCCS"]
    assert topo.route(0, 1).bandwidth_Bps == hccs.bandwidth_Bps and topo.route(0, 1).latency_s == hccs.latency_s


def test_ascend910_8p_first_four_cards_are_one_island():
    topo = Topology.preset("ascend910-8p", n=4)
    assert topo.num_ranks == 4 and topo.num_islands == 1
    assert {topo.island_of(r) for r in range(4)} == {0}
    assert "s0.pcie1" not in topo.graph


def test_ascend910b_8p_is_a_full_mesh():
    topo = Topology.preset("ascend910b-8p")
    assert {topo.island_of(r) for r in range(8)} == {0}
    for a, b in combinations(range(8), 2):
        assert kinds(topo, a, b) == ["HCCS_910B"]
    assert topo.card(3).name == "ascend910b"


def test_pcie_4p_is_all_pcie():
    topo = Topology.preset("pcie-4p")
    assert [topo.island_of(r) for r in range(4)] == [None] * 4
    for a, b in combinations(range(4), 2):
        assert kinds(topo, a, b) == ["PCIE", "PCIE"]
    assert topo.card(0).name == "ascend310p"


def test_mixed_4p_has_one_fast_pair_1_2_and_no_island():
    topo = Topology.preset("mixed-4p")
    assert [topo.island_of(r) for r in range(4)] == [None] * 4
    assert kinds(topo, 1, 2) == ["HCCS"]
    for a, b in [(0, 1), (2, 3), (0, 2), (0, 3), (1, 3)]:  # ACS: up to the root complex and back down
        assert topo.route(a, b).hops == (
            (f"card{a}", "s0.pcie0"),
            ("s0.pcie0", "s0.rc0"),
            ("s0.rc0", "s0.pcie0"),
            ("s0.pcie0", f"card{b}"),
        ), (a, b)
        assert kinds(topo, a, b) == ["PCIE"] * 4
    fast, slow = topo.route(1, 2), topo.route(0, 1)
    assert fast.latency_s < slow.latency_s


def test_2x8p_roce_goes_card_nic_fabric_leaf_fabric_nic_card():
    topo = Topology.preset("2x8p-roce")
    assert topo.num_servers == 2 and topo.server_of(8) == 1 and topo.device_of(11) == 3
    # the server's ports share the fitted ports' worth of bandwidth (figures.LEVEL1_PORTS)
    assert topo.route(3, 12).hops == (
        ("card3", "s0.nic3"),
        ("s0.nic3", "s0.fabric"),
        ("s0.fabric", "leaf0"),
        ("leaf0", "s1.fabric"),
        ("s1.fabric", "s1.nic4"),
        ("s1.nic4", "card12"),
    )
    assert kinds(topo, 3, 12) == ["ROCE200", "ROCE200", "ROCE200_UPLINK", "ROCE200_UPLINK", "ROCE200", "ROCE200"]
    port = topo.link_kinds["ROCE200"]
    assert topo.route(3, 12).bandwidth_Bps == port.bandwidth_Bps  # one flow: its port's bandwidth
    assert topo.route(3, 12).latency_s == pytest.approx(4 * port.latency_s)  # one RDMA operation (a send)
    assert topo.route(3, 12).step_latency_s == pytest.approx(4 * port.step_latency_s)  # one cross-server step
    fabric = topo.link("s0.fabric", "leaf0").bandwidth_Bps
    assert fabric == pytest.approx(LEVEL1_PORTS * port.bandwidth_Bps)
    # eight flows of one step, one per NPU, share it: each gets 1/8 of the fabric, not a port each
    load = Counter(hop for r in range(8) for hop in topo.route(r, r + 8).hops)
    share = min(topo.link(*hop).bandwidth_Bps / load[hop] for hop in topo.route(0, 8).hops)
    assert share == pytest.approx(fabric / 8)
    # the uplink is the cluster's network, not a server count: four servers go through it too
    four = Topology.preset("4x8p-roce")
    assert four.route(3, 12).hops == (
        ("card3", "s0.nic3"),
        ("s0.nic3", "s0.fabric"),
        ("s0.fabric", "leaf0"),
        ("leaf0", "s1.fabric"),
        ("s1.fabric", "s1.nic4"),
        ("s1.nic4", "card12"),
    )
    # a figures file with a non-blocking fabric (8 ports' worth) gives every NPU its own port's share
    full = Topology.preset(
        "2x8p-roce",
        figures=(
            {**LINK_KINDS, "ROCE200_UPLINK": LinkSpec("ROCE200_UPLINK", 8 * port.bandwidth_Bps, 0.0)},
            CARD_MODELS,
        ),
    )
    share = min(full.link(*hop).bandwidth_Bps / load[hop] for hop in full.route(0, 8).hops)
    assert share == pytest.approx(port.bandwidth_Bps)
    assert kinds(topo, 8, 9) == ["HCCS_910B"]
    assert "spine" not in topo.graph


def test_routes_are_directed_and_mirror():
    topo = Topology.preset("2x8p-roce")
    forward, back = topo.route(2, 13), topo.route(13, 2)
    assert back.hops == tuple((v, u) for u, v in reversed(forward.hops))
    assert back.latency_s == forward.latency_s


def test_island_ids_are_unique_across_the_cluster():
    topo = Topology.preset("2x8p-roce-910")
    assert [topo.island_of(r) for r in (0, 4, 8, 12, 15)] == [0, 1, 2, 3, 3]
    assert topo.card(0).name == "ascend910" and kinds(topo, 0, 8) == ["ROCE100"] * 4


def test_many_servers_get_leaves_and_a_spine():
    topo = Topology.preset("64x8p-roce")
    assert sum(1 for _, t in topo.graph.nodes(data="type") if t == "leaf") == 2
    assert "spine" not in {n for u, v in topo.route(0, 255).hops for n in (u, v)}  # servers 0 and 31 share leaf0
    route = topo.route(0, 511)
    assert route.hops[3:5] == (("leaf0", "spine"), ("spine", "leaf1"))  # after the card, its port, its uplink
    # the trunk carries the whole leaf's downlink bandwidth: never the bottleneck of one flow
    assert topo.link("leaf0", "spine").bandwidth_Bps == 256 * topo.link_kinds["ROCE200"].bandwidth_Bps
    assert route.bandwidth_Bps == topo.link_kinds["ROCE200"].bandwidth_Bps


def test_route_to_self_is_empty_and_routes_are_cached():
    topo = Topology.preset("ascend910-8p")
    assert topo.route(3, 3).hops == () and topo.route(3, 3).latency_s == 0.0
    assert topo.route(0, 6) is topo.route(0, 6)


def test_host_route_is_the_cards_pcie_link_and_the_acs_uplink():
    pcie = LINK_KINDS["PCIE"]
    for name, rank, root in (
        ("ascend910b-8p", 5, "s0.pcie0"),
        ("ascend910-8p", 5, "s0.pcie1"),
        ("2x8p-roce", 9, "s1.pcie0"),
    ):
        route = Topology.preset(name).host_route(rank)
        assert route.hops == ((f"card{rank}", root),), name
        assert (route.latency_s, route.bandwidth_Bps) == (pcie.latency_s, pcie.bandwidth_Bps), name
    route = Topology.preset("mixed-4p").host_route(2)  # behind a switch with ACS: its uplink to the root complex too
    assert route.hops == (("card2", "s0.pcie0"), ("s0.pcie0", "s0.rc0"))
    assert route.latency_s == pytest.approx(2 * pcie.latency_s) and route.bandwidth_Bps == pcie.bandwidth_Bps
    with pytest.raises(TopologyError):
        Topology.preset("pcie-4p").host_route(4)


def test_bad_ranks_and_links():
    topo = Topology.preset("pcie-4p")
    for call in (
        lambda: topo.route(0, 4),
        lambda: topo.card(-1),
        lambda: topo.server_of(True),
        lambda: topo.island_of(9),
    ):
        with pytest.raises(TopologyError) as info:
            call()
        assert info.value.field == "rank"
    with pytest.raises(TopologyError) as info:
        topo.link("card0", "card3")
    assert info.value.field == "link"


def _shortest_paths_agree(topo):
    """Routes between servers are the latency-shortest paths of the whole graph; routes inside a
    server are the shortest paths of that server's own cards and PCIe roots (HCCL keeps
    intra-server traffic on HCCS/PCIe unless HCCL_INTRA_ROCE_ENABLE is set)."""

    def latency(u, v, data):
        return data["spec"].latency_s

    inside = [
        topo.graph.subgraph(
            n for n, d in topo.graph.nodes(data=True) if d.get("server") == s and d["type"] in ("card", "pcie")
        )
        for s in range(topo.num_servers)
    ]
    for a in range(topo.num_ranks):
        dist, paths = nx.single_source_dijkstra(topo.graph, topo.card_node(a), weight=latency)
        local_dist, local_paths = nx.single_source_dijkstra(
            inside[topo.server_of(a)], topo.card_node(a), weight=latency
        )
        dist.update(local_dist)
        paths.update(local_paths)
        for b in range(topo.num_ranks):
            if a == b:
                continue
            route = topo.route(a, b)
            nodes = [route.hops[0][0]] + [v for _, v in route.hops]
            assert nodes == paths[topo.card_node(b)], (topo.name, a, b)
            assert route.latency_s == pytest.approx(dist[topo.card_node(b)], rel=1e-12)
            assert route.bandwidth_Bps == min(topo.link(u, v).bandwidth_Bps for u, v in route.hops)


@pytest.mark.parametrize(
    "name, n",
    [
        ("ascend910-8p", None),
        ("ascend910-8p", 6),
        ("ascend910b-8p", None),
        ("pcie-4p", None),  # not mixed-4p: ACS
        ("2x8p-roce", None),
        ("2x8p-roce-910", None),
        ("3x4p-roce-910", 10),
        ("34x2p-roce", None),
    ],
)
def test_structural_routes_are_latency_shortest_paths(name, n):
    _shortest_paths_agree(Topology.preset(name, n=n))


def _route_topologies():
    yield Topology.preset("ascend910-8p")
    yield Topology.preset("mixed-4p")
    yield Topology.preset("2x8p-roce-910")
    yield Topology.preset("34x2p-roce")  # two leaves and a spine
    yield Topology.preset("3x4p-roce-910", n=10)  # a server short of cards
    table = RankTable.generate(Topology.preset("2x4p-roce"))
    yield Topology.from_rank_table(table, preset="pcie-4p")  # host NICs: PCIe and HOST hops on the way out
    yield Topology.from_rank_table(table, preset="ascend910-8p")  # two PCIe roots: some ranks cross the host link first
    from topology.presets import TEMPLATES

    servers = [[(0, 0), (1, 1), (2, 4), (3, 5)], [(4, 5), (5, 4), (6, 1), (7, 0)]]  # ranks and devices in another order
    yield Topology("devices reordered", TEMPLATES["ascend910-8p"], servers)


@pytest.mark.parametrize("topo", list(_route_topologies()), ids=lambda t: t.name)
def test_route_ids_are_the_routes_as_arrays(topo):
    """``route_ids``, the simulator's numpy routes, give every pair the hops and step latency (a
    collective step's) of ``route``, bit for bit, whatever order the pairs come in."""
    import numpy as np

    n = topo.num_ranks
    pairs = [(a, b) for a in range(n) for b in range(n)]
    order = np.random.default_rng(5).permutation(len(pairs))
    src = np.array([pairs[i][0] for i in order])
    dst = np.array([pairs[i][1] for i in order])
    hops, latency = topo.route_ids(src, dst)
    bandwidth = topo.hop_bandwidths()
    assert bandwidth[0] == float("inf") and hops.shape[1] == len(pairs)
    for f, (a, b) in enumerate(zip(src.tolist(), dst.tolist())):
        route = topo.route(a, b)
        ids = [int(i) for i in hops[:, f] if i]
        assert len(ids) == len(route.hops) and latency[f] == route.step_latency_s, (topo.name, a, b)
        assert [bandwidth[i] for i in ids] == [topo.link(u, v).bandwidth_Bps for u, v in route.hops]
        assert len(set(ids)) == len(ids)
    # one id per directed link, whichever call numbered it (shared links are counted by id)
    again, _ = topo.route_ids(dst, src)
    named: dict = {}
    for ids_of, (a, b) in [(hops[:, f], p) for f, p in enumerate(zip(src.tolist(), dst.tolist()))] + [
        (again[:, f], p) for f, p in enumerate(zip(dst.tolist(), src.tolist()))
    ]:
        for hop, i in zip(topo.route(a, b).hops, [int(i) for i in ids_of if i]):
            assert named.setdefault(i, hop) == hop
    assert len(named) == len(set(named.values()))


def test_route_ids_reject_ranks_out_of_range():
    topo = Topology.preset("2x4p-roce")
    for src, dst in (([-1], [0]), ([0], [8]), ([0, 1], [2, -1])):
        with pytest.raises(TopologyError) as info:
            topo.route_ids(src, dst)
        assert (info.value.field, info.value.rule) == ("rank", "range")


def test_intra_server_traffic_stays_inside_the_server():
    # Card 0 -> 4 of a 910 server: HCCL's default intra-server path is PCIe (HCCL_INTRA_PCIE_ENABLE
    # default), even where the RoCE loop card->NIC->leaf->NIC->card would be faster (figures
    # that make it so: a slow host path).
    slow_host = {"links": {"HOST": {"latency_s": 1e-4, "bandwidth_Bps": 1e9}}}
    from topology.figures import figures_from_dict

    topo = Topology.preset("2x8p-roce-910", figures=figures_from_dict(slow_host))
    assert kinds(topo, 0, 4) == ["PCIE", "HOST", "PCIE"]
    roce_loop = 4 * topo.link_kinds["ROCE100"].latency_s
    assert roce_loop < topo.route(0, 4).latency_s


def test_structural_routes_from_rank_table_with_host_nics():
    # Two pcie-4p servers: cross-server traffic leaves through the host NIC.
    table = RankTable.generate(Topology.preset("2x4p-roce"))
    topo = Topology.from_rank_table(table, preset="pcie-4p")
    assert kinds(topo, 0, 5) == ["PCIE", "HOST", "ROCE100", "ROCE100", "HOST", "PCIE"]
    _shortest_paths_agree(topo)


def test_n_selects_the_first_cards_and_fills_servers_in_order():
    topo = Topology.preset("2x8p-roce", n=12)
    assert topo.num_ranks == 12 and topo.server_ranks(1) == [8, 9, 10, 11]
    with pytest.raises(TopologyError) as info:
        Topology.preset("ascend910-8p", n=9)
    assert (info.value.field, info.value.value, info.value.rule, info.value.expected) == ("n", 9, "range", "1..8")
    for bad in (0, -1, 2.0, True):
        with pytest.raises(TopologyError):
            Topology.preset("pcie-4p", n=bad)


@pytest.mark.parametrize("name", ["bogus", "0x8p-roce", "2x9p-roce", "2x0p-roce", "2x8p-roce-310", "100000x8p-roce", 5])
def test_unknown_or_impossible_presets(name):
    with pytest.raises(TopologyError) as info:
        Topology.preset(name)
    assert info.value.field == "preset"


def test_default_preset():
    assert [default_preset(n) for n in (1, 4, 8)] == ["ascend910-8p"] * 3
    assert (
        default_preset(9) == "2x8p-roce" and default_preset(16) == "2x8p-roce" and default_preset(4096) == "512x8p-roce"
    )
    for bad in (0, -3, 1.5):
        with pytest.raises(TopologyError):
            default_preset(bad)


def test_512x8p_roce_builds_and_routes_ring_and_hd_partners():
    # (How fast is for benchmarks: a test on a shared machine asserts only what was built.)
    topo = Topology.preset("512x8p-roce")
    assert topo.num_ranks == 4096 and topo.num_servers == 512
    n = topo.num_ranks
    for r in range(n):
        topo.route(r, (r + 1) % n)
        topo.route(r, (r - 1) % n)
        for k in range(12):  # halving-doubling partners
            topo.route(r, r ^ (1 << k))
    assert len(topo.route(0, 4095).hops) == 8  # card, port, uplink, leaf, spine and back
    assert topo.route(7, 8).hops[0] == ("card7", "s0.nic7")


def test_describe_lists_ranks_kinds_and_links():
    text = Topology.preset("mixed-4p").describe()
    assert text.splitlines()[0].startswith("mixed-4p: 4 ranks on 1 server")
    assert "rank  server  device  card" in text and "island" in text
    assert "HCCS" in text and "24.9" in text and re.search(r"card1 +card2 +HCCS +10\.7 +2\.60", text)
    big = Topology.preset("64x8p-roce").describe()
    assert "only the summary above is shown" in big and big.count("\n") > 512


def test_from_rank_table_uses_the_table_and_the_wiring():
    table = RankTable.generate(Topology.preset("2x8p-roce-910"))
    topo = Topology.from_rank_table(table, preset="ascend910-8p")
    assert topo.num_ranks == 16 and topo.island_of(12) == 3 and kinds(topo, 0, 5) == ["PCIE", "HOST", "PCIE"]
    assert topo.to_rank_table() is table
    default = Topology.from_rank_table(table)  # more than one server: 910B wiring
    assert default.card(0).name == "ascend910b" and kinds(default, 0, 5) == ["HCCS_910B"]
    single = Topology.from_rank_table(RankTable.generate(Topology.preset("ascend910b-8p", n=4)))
    assert single.card(0).name == "ascend910"  # one server: like default_preset(4)


def test_from_rank_table_keeps_device_ids_and_rank_order():
    doc = {
        "version": "1.0",
        "server_count": "1",
        "status": "completed",
        "server_list": [
            {"server_id": "s", "device": [{"device_id": "5", "rank_id": "1"}, {"device_id": "4", "rank_id": "0"}]}
        ],
    }
    topo = Topology.from_rank_table(RankTable.from_dict(doc))
    assert [topo.device_of(r) for r in range(2)] == [4, 5]
    assert topo.island_of(0) == topo.island_of(1) == 0 and kinds(topo, 0, 1) == ["HCCS"]


def test_from_rank_table_rejects_devices_the_wiring_lacks():
    table = RankTable.generate(Topology.preset("ascend910-8p"))
    with pytest.raises(TopologyError) as info:
        Topology.from_rank_table(table, preset="pcie-4p")
    assert info.value.field == "server_list[0].device[4].device_id"
    with pytest.raises(TopologyError):
        Topology.from_rank_table({"version": "1.0"})  # type: ignore[arg-type]


def test_numpy_integer_ranks_are_accepted():
    np = pytest.importorskip("numpy")
    topo = Topology.preset("ascend910-8p")
    assert topo.route(np.int64(0), np.int32(5)) == topo.route(0, 5)
    assert topo.server_of(np.int64(7)) == 0 and topo.card(np.uint8(1)).name == "ascend910"


def test_topology_error_pickles_with_its_field():
    import pickle

    err = pickle.loads(pickle.dumps(TopologyError("bad rank", "rank", value=9, rule="range")))
    assert isinstance(err, ValueError) and err.field == "rank" and err.code == 1 and str(err) == "bad rank"
    assert (err.value, err.rule, err.holder) == (9, "range", None)  # every field survives; unset ones read None
