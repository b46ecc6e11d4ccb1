"""Modeled time: the emulator's clocks equal the simulator's to the last bit, are deterministic,
and follow HCCL's closed forms on uniform topologies."""

from __future__ import annotations

import json
import math

import numpy as np
import pytest
from hypothesis import HealthCheck, event, given, settings
from hypothesis import strategies as st

from hccl_py.algorithms.registry import algos_for
from hccl_py.collectives import CallSpec
from hccl_py.modeled.cost_model import CostModel
from hccl_py.modeled.simulator import simulate
from tests.mp import run_ranks
from topology import Topology

COLLECTIVES = ("allreduce", "allgather", "broadcast", "reduce", "reduce_scatter", "alltoall", "scatter", "gather")

PRESET = "ascend910-8p"  # two HCCS islands joined over PCIe: links differ, shares matter
COUNTS = (1, 37, 100_000)


def _calls(size: int):
    for collective in COLLECTIVES:
        for algo in algos_for(collective):
            for count in COUNTS:
                yield collective, algo, count, (count + 1) % size


def _clocked_calls(size: int) -> list:
    import hccl_py

    comm = hccl_py.init()
    clocks = []
    for collective, algo, count, root in _calls(size):
        x = np.ones(count * (size if collective in ("reduce_scatter", "alltoall", "scatter") else 1), np.float32)
        start = comm.clock
        if collective == "allreduce":
            comm.all_reduce(x, algo=algo)
        elif collective == "allgather":
            comm.all_gather(x, algo=algo)
        elif collective == "broadcast":
            comm.broadcast(x, root=root, algo=algo)
        elif collective == "reduce":
            comm.reduce(x, root=root, algo=algo)
        elif collective == "alltoall":
            comm.all_to_all(x, algo=algo)
        elif collective == "scatter":
            comm.scatter(x, root=root, algo=algo)
        elif collective == "gather":
            comm.gather(x, root=root, algo=algo)
        else:
            comm.reduce_scatter(x, algo=algo)
        clocks.append((start, comm.clock))
        if collective == "broadcast":
            comm.device.run(flops=1e9 * (comm.rank + 1), nbytes=0)  # uneven compute: clocks diverge
    return clocks


@pytest.mark.timeout(120)
@pytest.mark.parametrize("size", [2, 3, 5, 8])
def test_simulator_equals_emulator_to_the_last_bit(size):
    env = {"HCCL_PY_TOPOLOGY": PRESET}
    per_rank = run_ranks(_clocked_calls, size, size, env=env, timeout=100)
    again = run_ranks(_clocked_calls, size, size, env=env, timeout=100)
    assert again == per_rank  # deterministic: same program, same topology, same clocks
    topo = Topology.preset(PRESET, n=size)
    model = CostModel(topo)
    for i, (collective, algo, count, root) in enumerate(_calls(size)):
        starts = [per_rank[r][i][0] for r in range(size)]
        ends = [per_rank[r][i][1] for r in range(size)]
        result = simulate(collective, algo, topo, count, itemsize=4, root=root, start_clocks=starts, cost_model=model)
        assert list(result.end_clocks) == ends, (collective, algo, count)


def _v_matrices(size: int) -> tuple[tuple, tuple]:
    """all_to_all_v's matrix (MoE-skewed receivers, rows varied) and all_to_all_vc's (zeros in it)."""
    from hccl_py.algorithms.alltoallv import skewed_counts

    skewed = tuple(tuple(c + i for c in row) for i, row in enumerate(skewed_counts(size, 5_000, 1.2)))
    return skewed, tuple(tuple(((i * j) % 3) * 37 for j in range(size)) for i in range(size))


def _clocked_v_and_batch_calls(size: int) -> list:
    import hccl_py

    comm = hccl_py.init()
    r = comm.rank
    skewed, sparse = _v_matrices(size)
    out = []
    for call in ("v", "vc", "batch"):
        comm.device.run(flops=1e9 * (r + 1), nbytes=0)  # uneven compute: the calls start at different clocks
        start = comm.clock
        if call == "v":
            row, column = skewed[r], [m[r] for m in skewed]
            got = comm.all_to_all_v(
                np.arange(sum(row), dtype=np.float32) + 1e5 * r,
                row,
                None,
                np.zeros(sum(column), np.float32),
                column,
                None,
            )
            want = np.concatenate(
                [
                    np.arange(sum(skewed[i][:r]), sum(skewed[i][: r + 1]), dtype=np.float32) + 1e5 * i
                    for i in range(size)
                ]
            )
            assert np.array_equal(got, want)
        elif call == "vc":
            comm.all_to_all_vc(
                np.ones(sum(sparse[r]), np.float32), sparse, np.zeros(sum(m[r] for m in sparse), np.float32)
            )
        else:
            comm.batch_send_recv(
                [
                    ("recv", np.zeros(3000, np.float32), (r - 1) % size),
                    ("send", np.ones(3000, np.float32), (r + 1) % size),
                ]
            )
        records = comm._rc.recorder.records
        out.append((start, comm.clock, [records[-2].algo, records[-1].algo]))
    return out


@pytest.mark.timeout(120)
@pytest.mark.parametrize("preset, size", [(PRESET, 3), (PRESET, 8), ("2x4p-roce", 8)])
def test_all_to_all_v_vc_and_batch_send_recv_equal_the_simulator(preset, size):
    """all_to_all_v (its counts exchange, an allgather of int64, then the data), all_to_all_vc and a
    batch_send_recv ring exchange end at the simulator's clocks to the last bit; auto runs the
    algorithm HCCL's all-to-all rule names (across 910B servers: the continuous pipeline for
    all_to_all_v, the two-level pipeline for all_to_all_vc)."""
    from hccl_py.algorithms.alltoallv import VSchedule
    from hccl_py.choice.names import hier_levels, partition_of
    from hccl_py.choice.select import alltoallv_auto, auto
    from hccl_py.modeled.simulator import simulate_batch
    from hccl_py.planning.calls import simulate_alltoallv

    per_rank = run_ranks(_clocked_v_and_batch_calls, size, size, env={"HCCL_PY_TOPOLOGY": preset}, timeout=100)
    topo = Topology.preset(preset, n=size)
    model = CostModel(topo)
    ranks = tuple(range(size))
    skewed, sparse = _v_matrices(size)
    (v, vc, batch) = [[per_rank[r][i] for r in ranks] for i in range(3)]
    # all_to_all_v: the counts exchange ([ok, send counts, receive counts] in int64), then the data exchange
    gather_algo, v_algo = v[0][2]
    assert {tuple(c[2]) for c in v} == {(gather_algo, v_algo)}
    assert gather_algo == auto(model, CallSpec.of("allgather", 1 + 2 * size, itemsize=8, dtype="int64"), ranks)
    assert v_algo == alltoallv_auto(topo, ranks, exchange=True).algo
    if preset == "2x4p-roce":
        assert (
            v_algo == "hier:mesh/continuous@groups" and alltoallv_auto(topo, ranks).algo == "hier:mesh/pipeline@groups"
        )
    if hier_levels(gather_algo) is not None:  # across servers: HCCL's two-level allgather
        from hccl_py.algorithms.hierarchical import schedule_for
        from hccl_py.choice.names import server_partition

        gather_algo = schedule_for(
            "allgather",
            partition_of(topo, gather_algo, ranks) or server_partition(topo, ranks),
            *hier_levels(gather_algo),
        )
    gathered = simulate(
        "allgather",
        gather_algo,
        topo,
        1 + 2 * size,
        itemsize=8,
        dtype="int64",
        start_clocks=[c[0] for c in v],
        cost_model=model,
    )
    # the continuous pipeline exchanges counts in its own first step: the gather costs no modeled time
    data_start = [c[0] for c in v] if v_algo == "hier:mesh/continuous@groups" else gathered.end_clocks
    levels = hier_levels(v_algo)  # 8 ranks: the staged one
    staged = None if levels is None else (partition_of(topo, v_algo, ranks), *levels)
    data = simulate(
        "alltoallv",
        VSchedule(v_algo, skewed, staged=staged, itemsize=4),
        topo,
        0,
        itemsize=4,
        start_clocks=data_start,
        cost_model=model,
    )
    assert list(data.end_clocks) == [c[1] for c in v]
    for algo in ("pairwise", "mesh"):  # the same through simulate_alltoallv
        assert simulate_alltoallv(topo, skewed, algos=[algo], start_clocks=gathered.end_clocks, cost_model=model)[
            algo
        ] == simulate("alltoallv", VSchedule(algo, skewed), topo, 0, start_clocks=gathered.end_clocks, cost_model=model)
    # all_to_all_vc: the data exchange alone
    vc_algo = vc[0][2][-1]
    assert {c[2][-1] for c in vc} == {vc_algo} == {alltoallv_auto(topo, ranks).algo}
    result = simulate_alltoallv(topo, sparse, algos=[vc_algo], start_clocks=[c[0] for c in vc], cost_model=model)[
        vc_algo
    ]
    assert list(result.end_clocks) == [c[1] for c in vc]
    # batch_send_recv: every rank sends 3000 float32 to rank+1 and receives from rank-1, in one batch
    ring = simulate_batch(
        topo, [(r, (r + 1) % size, 3000 * 4) for r in ranks], start_clocks=[c[0] for c in batch], cost_model=model
    )
    assert list(ring.end_clocks) == [c[1] for c in batch]


def _uniform_parameters(topo: Topology, op: str) -> tuple[float, float, float, float, float]:
    """HCCL's alpha-beta-gamma on a uniform topology, plus hccl-py's fixed costs: (launch, alpha,
    beta, gamma, gamma0) with gamma0 the fixed cost of one vector-unit reduction (0 inline)."""
    route = topo.route(0, 1)
    card = topo.card(0)
    inline = card.reduces_inline("float32", op)
    gamma = 0.0 if inline else 1.0 / card.vector_bandwidth_Bps
    gamma0 = 0.0 if inline else card.reduce_launch_s
    return card.launch_overhead_s, route.step_latency_s, 1.0 / route.bandwidth_Bps, gamma, gamma0


@pytest.mark.parametrize("op", ["sum", "prod"])  # the 910B reduces sum inline, prod on the vector unit
@pytest.mark.parametrize("p", [2, 4, 8])
def test_ring_allreduce_follows_hccl_closed_form(p, op):
    topo = Topology.preset("ascend910b-8p", n=p)  # HCCS full mesh: every pair alike
    n = 4 * 1024 * 1024 * p  # bytes, divisible into p chunks
    launch, alpha, beta, gamma, gamma0 = _uniform_parameters(topo, op)
    expected = launch + 2 * (p - 1) * alpha + 2 * (p - 1) / p * n * beta + (p - 1) * gamma0 + (p - 1) / p * n * gamma
    got = simulate("allreduce", "ring", topo, n // 4, itemsize=4, op=op).time_s
    assert math.isclose(got, expected, rel_tol=1e-9)


@pytest.mark.parametrize("op", ["sum", "prod"])
@pytest.mark.parametrize("p", [2, 4, 8])
def test_mesh_allreduce_follows_hccl_closed_form(p, op):
    topo = Topology.preset("ascend910b-8p", n=p)
    n = 4 * 1024 * 1024 * p
    launch, alpha, beta, gamma, gamma0 = _uniform_parameters(topo, op)
    expected = launch + 2 * alpha + 2 / p * n * beta + (p - 1) * gamma0 + (p - 1) / p * n * gamma
    got = simulate("allreduce", "mesh", topo, n // 4, itemsize=4, op=op).time_s
    assert math.isclose(got, expected, rel_tol=1e-9)


@pytest.mark.parametrize("p", [2, 4, 8])
def test_mesh_allgather_follows_hccl_closed_form(p):
    topo = Topology.preset("ascend910b-8p", n=p)
    n = 4 * 1024 * 1024 * p  # the gathered output
    launch, alpha, beta, _, _ = _uniform_parameters(topo, "sum")
    card = topo.card(0)
    own_copy = 2 * (n // p) / card.hbm_bandwidth_Bps  # a rank's own block, IN -> OUT
    expected = launch + own_copy + alpha + 1 / p * n * beta  # HCCL: alpha + n/p beta
    got = simulate("allgather", "mesh", topo, n // p // 4, itemsize=4).time_s
    assert math.isclose(got, expected, rel_tol=1e-9)


def test_auto_is_the_argmin_of_the_model():
    from hccl_py.choice.argmin import fastest

    topo = Topology.preset("ascend910-8p")
    model = CostModel(topo)
    ranks = tuple(range(8))

    def times(count):
        return {
            a: simulate("allreduce", a, topo, count, itemsize=4, cost_model=model).time_s
            for a in algos_for("allreduce")
        }

    large, small = times(64 << 20 >> 2), times(2)
    assert fastest(model, "allreduce", 64 << 20 >> 2, 4, ranks) == min(large, key=large.get) == "ring"
    assert fastest(model, "allreduce", 2, 4, ranks) == min(small, key=small.get)
    assert fastest(model, "allreduce", 2, 4, ranks) == "oneshot"  # latency-bound: one round of messages
    assert fastest(model, "allreduce", 1 << 20, 4, ranks) != "oneshot"  # 4 MiB: sending 7 full buffers is not


def _stats_and_trace(trace_dir: str) -> dict:
    import os

    import hccl_py

    os.environ["HCCL_PY_TRACE_DIR"] = trace_dir
    comm = hccl_py.init()
    x = np.ones(1000, np.float32)
    for _ in range(3):
        comm.all_reduce(x, algo="ring")
    comm.all_gather(x)
    stats = comm.stats()
    out = {
        "calls": stats.calls,
        "nbytes": stats.nbytes,
        "modeled": stats.modeled_s,
        "wall": stats.wall_s,
        "allreduce_calls": stats.by_op["allreduce"].calls,
        "clock": comm.clock,
    }
    comm.destroy()
    return out


@pytest.mark.timeout(60)
def test_stats_and_chrome_trace(tmp_path):
    results = run_ranks(_stats_and_trace, 2, str(tmp_path), timeout=50)
    for r in results:
        assert r["calls"] == 4 and r["allreduce_calls"] == 3
        assert r["nbytes"] == 3 * 4000 + 4000
        assert 0 < r["modeled"] <= r["clock"]
        assert r["wall"] > 0
    trace = json.loads((tmp_path / "rank_1.trace.json").read_text())
    spans = [e for e in trace["traceEvents"] if e["ph"] == "X"]
    assert {e["tid"] for e in spans} == {0, 1}  # modeled and wall timelines
    assert [e["name"] for e in spans if e["tid"] == 0] == [
        "allreduce #1",
        "allreduce #2",
        "allreduce #3",
        "allgather #4",
    ]
    assert all(e["pid"] == 1 for e in spans)


def test_device_memory_and_roofline():
    from hccl_py.errors import HcclMemoryError
    from hccl_py.modeled.card import Device

    card = Topology.preset("ascend910-8p").card(0)
    dev = Device(card, rank=0)
    a = dev.empty((1000, 1000), np.float32)
    assert dev.used_bytes == 4_000_256  # rounded up to 512 bytes
    with pytest.raises(HcclMemoryError) as info:
        dev.malloc(card.hbm_bytes, "weights")
    assert info.value.code == 3
    err = info.value
    assert (err.allocation, err.capacity, err.peak, err.rank) == ("weights", card.hbm_bytes, 4_000_256, 0)
    assert err.requested == card.hbm_bytes and err.free == card.hbm_bytes - 4_000_256
    del a
    assert dev.used_bytes == 0 and dev.peak_bytes == 4_000_256
    x = np.ones((64, 128), np.float32)
    w = np.ones((128, 32), np.float32)
    y = dev.matmul(x, w)
    assert np.array_equal(y, x @ w)
    flops = 2 * 64 * 32 * 128
    rate = card.peak_flops("float32") * card.matmul_efficiency  # FP32 operands: the FP32 rate
    expected = max(flops / rate, (x.nbytes + w.nbytes + y.nbytes) / card.hbm_bandwidth_Bps) + card.launch_overhead_s
    assert dev.clock == pytest.approx(expected) and dev.time.compute_s == dev.clock
    big = np.ones((1, 4096), np.float16), np.ones((4096, 4096), np.float16)  # one row: a whole 16-row tile of work
    start = dev.clock
    dev.matmul(*big)
    tile = 2 * 16 * 4096 * 4096 / (card.peak_flops("float16") * card.matmul_efficiency)
    memory = (big[0].nbytes + big[1].nbytes + 4096 * 2) / card.hbm_bandwidth_Bps
    assert dev.clock - start == pytest.approx(max(tile, memory) + card.launch_overhead_s)


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

    topo = Topology.preset(PRESET, n=4)
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


def test_hccl_sim_takes_every_two_level_name_auto_prints(capsys):
    """What ``auto`` prints can be given back as ``--algo`` (the pipelines, across-first,
    whole-buffer levels); a name the library cannot build is refused with its reason."""
    from hccl_py.planning.cli import main

    for collective, algo in (
        ("allreduce", "hier:mesh/pipeline"),
        ("allgather", "hier:mesh/pipeline@groups"),
        ("reduce_scatter", "hier:hd/ring-first"),
        ("allreduce", "hier:reducebcast/nhr"),
        ("allreduce", "hier:rd/rd"),
        ("alltoall", "hier:mesh/pipeline@groups"),
        ("alltoall", "hier:pairwise/mesh"),
        ("broadcast", "hier:mesh/hd@server"),
    ):
        assert main([collective, "--preset", "2x4p-roce", "--bytes", "64K", "--algo", algo]) == 0, algo
        assert f"algo {algo}" in capsys.readouterr().out
    assert (
        main(["alltoall", "--preset", "2x4p-roce", "--bytes", "16"]) == 2
    )  # 16 B over 8 ranks: no fp32 element a block
    assert "give at least 32 bytes" in capsys.readouterr().err
    for collective, algo, reason in (
        ("alltoall", "hier:mesh/continuous", "AlltoAllV"),
        ("allgather", "hier:mesh/ring-first", "reduce_scatter"),
        ("allreduce", "hier:bogus/ring", "bogus"),
    ):
        assert main([collective, "--preset", "2x4p-roce", "--bytes", "64K", "--algo", algo]) == 2
        err = capsys.readouterr().err
        assert f"no algorithm {algo!r}" in err and reason in err


def test_hccl_sim_cli(capsys):
    from hccl_py.planning.cli import main

    assert main(["allreduce", "--preset", "2x8p-roce", "--bytes", "64M", "--algo", "ring"]) == 0
    out = capsys.readouterr().out
    assert "allreduce fp32 67108864 bytes on 2x8p-roce (16 ranks), algo ring" in out
    assert "modeled time" in out and "busbw" in out and "peak memory" in out
    assert main(["allreduce", "--preset", "2x8p-roce", "--bytes", "8", "--algo", "auto"]) == 0
    out = capsys.readouterr().out
    assert "algo hier:rd/rd@server" in out and "SmallCountDeterministicExecutor" in out  # HCCL below 512 KB
    assert main(["allreduce", "--preset", "2x8p-roce", "--bytes", "1M", "--algo", "hier:mesh/hd"]) == 0
    assert main(["allgather", "--preset", "nope", "--bytes", "8"]) == 2
    assert main(["allgather", "--preset", "mixed-4p", "--bytes", "8", "--algo", "fastest"]) == 2


def test_hccl_sim_sweep_prints_hccl_tests_columns(capsys):
    from hccl_py.planning.cli import main

    assert main(["allgather", "--preset", "ascend910b-8p", "-b", "8K", "-e", "1M", "-f", "2"]) == 0
    lines = capsys.readouterr().out.splitlines()
    assert lines[2] == "data_size(Bytes): | aveg_time(us): | alg_bandwidth(GB/s): | check_result:"
    rows = [line.split("|") for line in lines[3:]]
    assert [int(r[0]) for r in rows] == [8192 << i for i in range(8)]
    for r in rows:  # alg_bandwidth = data_size / aveg_time, as HCCL Test prints it
        assert float(r[2]) == pytest.approx(int(r[0]) / float(r[1]) / 1e3, rel=1e-3)
        assert r[3].split()[0] == "NULL"
    times = [float(r[1]) for r in rows]
    assert times == sorted(times) and times[0] > 15  # small messages are not free: launch + a step
    assert main(["allreduce", "--preset", "mixed-4p", "-b", "1M", "-e", "8"]) == 2


def test_hccl_sim_sendrecv_and_figures(tmp_path, capsys):
    import json as _json

    from hccl_py.modeled.simulator import simulate_p2p
    from hccl_py.planning.cli import main

    assert main(["sendrecv", "--preset", "2x8p-roce", "--src", "0", "--dst", "8", "--bytes", "1G"]) == 0
    out = capsys.readouterr().out
    topo = Topology.preset("2x8p-roce")
    expected = simulate_p2p(topo, 0, 8, 1 << 30).time_s
    assert f"{expected * 1e6:14.3f} us" in out and "ROCE200" in out
    route, card = topo.route(0, 8), topo.card(0)
    assert expected == pytest.approx(card.launch_overhead_s + route.latency_s + (1 << 30) / route.bandwidth_Bps)
    figures = tmp_path / "f.json"
    figures.write_text(_json.dumps({"links": {"ROCE200": {"bandwidth_Bps": 1e9}}}))
    assert (
        main(
            [
                "sendrecv",
                "--preset",
                "2x8p-roce",
                "--src",
                "0",
                "--dst",
                "8",
                "--bytes",
                "1G",
                "--figures",
                str(figures),
            ]
        )
        == 0
    )
    assert "bandwidth              1.0" in capsys.readouterr().out
    assert main(["sendrecv", "--preset", "2x8p-roce", "--src", "3", "--dst", "3", "--bytes", "1"]) == 2
    assert main(["sendrecv", "--preset", "2x8p-roce", "--src", "0", "--dst", "99", "--bytes", "1"]) == 2


def test_hccl_sim_alltoallv_and_batchsendrecv(tmp_path, capsys):
    from hccl_py.algorithms.alltoallv import skewed_counts
    from hccl_py.modeled.simulator import simulate_batch
    from hccl_py.planning.calls import simulate_alltoallv, simulate_call
    from hccl_py.planning.cli import main

    topo = Topology.preset("2x8p-roce")
    n = topo.num_ranks
    assert main(["alltoallv", "--preset", "2x8p-roce", "--bytes", "1M", "--skew", "1.2"]) == 0
    out = capsys.readouterr().out
    matrix = skewed_counts(n, (1 << 20) // 4, 1.2)
    assert {sum(row) for row in matrix} == {n << 18} and matrix[0][0] > matrix[0][1] > matrix[0][-1]  # total as uniform
    vc = simulate_alltoallv(topo, matrix)
    gather = simulate_call(CallSpec.of("allgather", 1 + 2 * n, itemsize=8, dtype="int64"), topo)
    v = simulate_alltoallv(topo, matrix, start_clocks=gather.result.end_clocks)
    for algo in ("pairwise", "mesh"):
        (row,) = [line.split() for line in out.splitlines() if line.split()[:1] == [algo]]
        assert float(row[1]) == pytest.approx(vc[algo].time_s * 1e6, abs=1e-3)
        assert float(row[2]) == pytest.approx(max(v[algo].end_clocks) * 1e6, abs=1e-3) and float(row[2]) > float(row[1])
    piped, staged = "hier:mesh/pipeline@groups", "hier:mesh/pairwise@groups"  # HCCL's two-level all-to-alls
    assert f"auto (all_to_all_vc): {piped}: 910B, 2 servers" in out and "Zipf skew 1.2" in out
    assert "rank 0 receives the most" in out
    (row,) = [line.split() for line in out.splitlines() if line.split()[:1] == [piped]]
    assert float(row[1]) == pytest.approx(vc[piped].time_s * 1e6, abs=1e-3) and row[-2:] == ["auto", "(all_to_all_vc)"]
    continuous = "hier:mesh/continuous@groups"  # AlltoAllV's: HCCL's continuous pipeline
    assert f"auto (all_to_all_v): {continuous}: 910B, 2 servers of 8, AlltoAllV: RunAlltoAllVContinuousPipeline" in out
    (row,) = [line.split() for line in out.splitlines() if line.split()[:1] == [continuous]]
    assert float(row[2]) == float(row[1]) == pytest.approx(vc[continuous].time_s * 1e6, abs=1e-3)  # no allgather first
    assert row[-2:] == ["auto", "(all_to_all_v)"]
    (row,) = [line.split() for line in out.splitlines() if line.split()[:1] == [staged]]
    assert float(row[1]) == pytest.approx(vc[staged].time_s * 1e6, abs=1e-3)
    assert vc[staged].time_s > vc[piped].time_s  # the pipeline overlaps the levels
    counts = tmp_path / "counts.json"
    counts.write_text(json.dumps([[j + i for j in range(n)] for i in range(n)]))
    assert main(["all_to_all_vc", "--preset", "2x8p-roce", "--counts", str(counts), "--algo", "pairwise"]) == 0
    out = capsys.readouterr().out
    assert (
        f"counts from {counts}" in out
        and "pairwise" in out
        and "mesh" not in out.split("algo", 1)[1].split("all_to_all_v:")[0]
    )
    (row,) = [line.split() for line in out.splitlines() if line.split()[:1] == ["pairwise"]]  # the one algorithm timed
    alone = simulate_alltoallv(topo, [[j + i for j in range(n)] for i in range(n)], algos=["pairwise"])["pairwise"]
    assert float(row[1]) == pytest.approx(alone.time_s * 1e6, abs=1e-3)
    counts.write_text("[[1, 2], [3, 4]]")
    assert main(["alltoallv", "--preset", "2x8p-roce", "--counts", str(counts)]) == 2  # 2 x 2 on 16 ranks
    assert main(["alltoallv", "--preset", "2x8p-roce", "-b", "8", "-e", "64"]) == 2
    assert main(["allreduce", "--preset", "2x8p-roce", "--bytes", "8", "--skew", "1"]) == 2
    assert main(["batchsendrecv", "--preset", "2x8p-roce", "--bytes", "1G"]) == 0
    ring = simulate_batch(topo, [(r, (r + 1) % n, 1 << 30) for r in range(n)])
    assert f"{ring.time_s * 1e6:14.3f} us" in capsys.readouterr().out
    assert main(["batch_send_recv", "--preset", "2x8p-roce", "-b", "1K", "-e", "1M", "-f", "32"]) == 0
    assert len(capsys.readouterr().out.splitlines()) == 3 + 3


def _v_algos() -> list:
    import hccl_py

    comm = hccl_py.init()
    n = comm.size
    counts = [1 + (comm.rank + j) % 3 for j in range(n)]
    column = [1 + (i + comm.rank) % 3 for i in range(n)]
    comm.all_to_all_v(np.ones(sum(counts), np.float32), counts, None, np.zeros(sum(column), np.float32), column, None)
    comm.all_to_all_vc(np.ones(2 * n, np.float32), [[2] * n] * n, np.zeros(2 * n, np.float32))
    algos = [r.algo for r in comm._rc.recorder.records if r.op in ("alltoallv", "all_to_all_v", "all_to_all_vc")]
    # named explicitly, the continuous pipeline's counts exchange costs no modeled time either
    comm.all_to_all_v(
        np.ones(sum(counts), np.float32),
        counts,
        None,
        np.zeros(sum(column), np.float32),
        column,
        None,
        algo="hier:mesh/continuous",
    )
    gather = comm._rc.recorder.records[-2]
    return algos, gather.op, gather.modeled_end - gather.modeled_start


@pytest.mark.timeout(120)
def test_hccl_algo_level1_pipeline_gives_all_to_all_v_the_continuous_pipeline():
    """HCCL_ALGO naming level 1's pipeline for all-to-all: AlltoAllV still tries the continuous
    pipeline first (alltoall_operator.cc L287, L738), AlltoAllVC runs the two-level one."""
    env = {"HCCL_PY_TOPOLOGY": "2x2p-roce", "HCCL_ALGO": "alltoall=level0:NA;level1:pipeline"}
    per_rank = run_ranks(_v_algos, 4, env=env, timeout=100)
    for algos, gather_op, gather_s in per_rank:
        assert algos[-2:] == ["hier:mesh/continuous@groups", "hier:mesh/pipeline"], algos
        assert gather_op == "allgather" and gather_s == 0.0


def _small_allreduce() -> tuple:
    import hccl_py

    comm = hccl_py.init()
    x = np.arange(16384, dtype=np.float32) % 7 + comm.rank  # 64 KB, sums exact
    got = comm.all_reduce(x.copy())
    assert np.array_equal(got, (np.arange(16384, dtype=np.float32) % 7) * comm.size + comm.size * (comm.size - 1) / 2)
    record = comm._rc.recorder.records[-1]
    return record.algo, record.modeled_end - record.modeled_start


@pytest.mark.timeout(120)
def test_hccl_deterministic_reaches_the_communicators_auto():
    """HCCL_DETERMINISTIC=true: a 64 KB allreduce on one 910B server of 8 runs recursive doubling
    (HCCL's deterministic small-count template), not the reduce-broadcast, and its modeled time is
    the simulator's under the same setting."""
    from hccl_py.planning.calls import simulate_call

    topo = Topology.preset("ascend910b-8p")
    for mode, algo in (("false", "reducebcast"), ("true", "rd")):
        per_rank = run_ranks(
            _small_allreduce, 8, env={"HCCL_PY_TOPOLOGY": "ascend910b-8p", "HCCL_DETERMINISTIC": mode}, timeout=100
        )
        expected = simulate_call(CallSpec.of("allreduce", 16384), topo, deterministic=mode)
        assert expected.algo == algo
        assert {a for a, _ in per_rank} == {algo}
        assert max(t for _, t in per_rank) == pytest.approx(expected.time_s, rel=1e-12)


def _auto_calls() -> list:
    import hccl_py

    comm = hccl_py.init()
    out = []
    for collective, count in (("allreduce", 1000), ("allgather", 300), ("allreduce", 1 << 16)):
        x = np.ones(count, np.float32)
        start = comm.clock
        if collective == "allreduce":
            comm.all_reduce(x)
        else:
            comm.all_gather(x)
        out.append((comm._rc.recorder.records[-1].algo, start, comm.clock))
    return out


@pytest.mark.timeout(120)
def test_auto_runs_hccls_two_level_choice_in_the_emulator_as_in_the_simulator():
    from hccl_py.algorithms.hierarchical import schedule_for
    from hccl_py.choice.names import hier_levels, server_partition
    from hccl_py.choice.select import auto

    preset, size = "2x2p-roce", 4
    per_rank = run_ranks(_auto_calls, size, env={"HCCL_PY_TOPOLOGY": preset}, timeout=100)
    topo = Topology.preset(preset)
    model = CostModel(topo)
    ranks = tuple(range(size))
    for i, (collective, count) in enumerate((("allreduce", 1000), ("allgather", 300), ("allreduce", 1 << 16))):
        algo = auto(model, CallSpec.of(collective, count), ranks)
        assert algo == "hier:mesh/ring@server" and {per_rank[r][i][0] for r in ranks} == {algo}
        fn = schedule_for(collective, server_partition(topo, ranks), *hier_levels(algo))
        starts = [per_rank[r][i][1] for r in ranks]
        result = simulate(collective, fn, topo, count, itemsize=4, start_clocks=starts, cost_model=model)
        assert list(result.end_clocks) == [per_rank[r][i][2] for r in ranks]


def _two_level_auto_calls(size: int) -> list:
    """scatter, gather and all-to-all under auto on two servers (their two-level algorithms),
    results checked against numpy here, clocks returned."""
    import hccl_py

    comm = hccl_py.init()
    r = comm.rank
    out = []
    for collective in ("scatter", "gather", "alltoall"):
        comm.device.run(flops=1e9 * (r + 1), nbytes=0)  # uneven compute: the calls start at different clocks
        start = comm.clock
        if collective == "scatter":
            table = np.arange(size * 37, dtype=np.float32) + 1000 * 5
            got = comm.scatter(table if r == 5 else None, root=5, out=np.empty(37, np.float32))
            assert np.array_equal(got, table[r * 37 : (r + 1) * 37])
        elif collective == "gather":
            got = comm.gather(np.full(37, r, np.float32), root=2)
            if r == 2:
                assert np.array_equal(got, np.repeat(np.arange(size, dtype=np.float32), 37).reshape(size, 37))
        else:
            x = np.arange(size * 37, dtype=np.float32) + 1000 * r
            got = comm.all_to_all(x)
            want = np.concatenate([np.arange(r * 37, (r + 1) * 37, dtype=np.float32) + 1000 * i for i in range(size)])
            assert np.array_equal(got, want)
        out.append((start, comm.clock))
    return out


@pytest.mark.timeout(120)
def test_two_level_scatter_gather_and_alltoall_under_auto_equal_the_simulator():
    from hccl_py.choice.names import schedule_fn
    from hccl_py.choice.select import auto
    from hccl_py.planning.calls import simulate_call

    preset, size = "2x4p-roce", 8
    per_rank = run_ranks(_two_level_auto_calls, size, size, env={"HCCL_PY_TOPOLOGY": preset}, timeout=100)
    topo = Topology.preset(preset)
    model = CostModel(topo)
    ranks = tuple(range(size))
    for i, (collective, count, root) in enumerate((("scatter", 37, 5), ("gather", 37, 2), ("alltoall", 37, 0))):
        algo = auto(model, CallSpec.of(collective, count, root=root), ranks)
        assert algo in ("hier:mesh/ring@server", "hier:mesh/pipeline@groups"), (
            collective,
            algo,
        )  # two-level, by HCCL's rules
        result = simulate_call(
            CallSpec.of(collective, count, root=root, algo=algo), topo, cost_model=model, world_ranks=ranks
        )
        starts = [per_rank[r][i][0] for r in ranks]
        exact = simulate(
            collective,
            schedule_fn(topo, collective, algo, ranks),
            topo,
            count,
            itemsize=4,
            root=root,
            start_clocks=starts,
            cost_model=model,
        )
        assert list(exact.end_clocks) == [per_rank[r][i][1] for r in ranks], collective
        assert result.algo == algo


def _level1_auto_calls(size: int, counts: tuple) -> list:
    """allreduce, allgather and reduce_scatter of ``counts`` elements under auto, results checked
    against numpy here; (algo, start, end) returned."""
    import hccl_py

    comm = hccl_py.init()
    r = comm.rank
    out = []
    for collective, count in zip(("allreduce", "allgather", "reduce_scatter"), counts):
        comm.device.run(flops=1e9 * (r % 3 + 1), nbytes=0)  # uneven compute: the calls start at different clocks
        start = comm.clock
        if collective == "allreduce":
            base = (np.arange(count) % 1000).astype(np.float32)  # sums stay exact in float32
            got = comm.all_reduce(base * (r + 1))
            assert np.array_equal(got, base * (size * (size + 1) // 2))
        elif collective == "allgather":
            got = comm.all_gather(np.full(count, r, np.float32))
            assert np.array_equal(
                np.asarray(got).reshape(size, count),
                np.repeat(np.arange(size, dtype=np.float32), count).reshape(size, count),
            )
        else:
            base = (np.arange(size * count) % 1000).astype(np.float32)
            got = comm.reduce_scatter(base + r)
            want = (base * size + size * (size - 1) // 2)[r * count : (r + 1) * count]
            assert np.array_equal(got, want)
        out.append((comm._rc.recorder.records[-1].algo, start, comm.clock))
    return out


@pytest.mark.timeout(120)
@pytest.mark.parametrize(
    "preset, size, algos, counts",
    [
        # four servers: NHR across (> 256 KiB per device); a reduce_scatter below 512 KB in all: NHR across first, then inside
        (
            "4x2p-roce",
            8,
            ("hier:mesh/nhr@server", "hier:mesh/nhr@server", "hier:nhr/nhr-first@server"),
            (140_001, 37, 37),
        ),
        ("5x1p-roce", 5, ("nhr",) * 3, (140_001, 37, 37)),
        ("2x4p-roce", 8, ("hier:mesh/pipeline@server",) * 3, ((1 << 21) + 3, 8197, 8197)),  # >= 1 MB a slice, >= 32 KB
        (
            "2x4p-roce",
            8,
            ("hier:rd/rd@server", "hier:mesh/ring@server", "hier:hd/ring-first@server"),
            (1001, 37, 37),
        ),  # small count
    ],
)
def test_hccls_level1_choices_under_auto_move_the_right_data_and_equal_the_simulator(preset, size, algos, counts):
    from hccl_py.choice.names import schedule_fn
    from hccl_py.choice.select import auto

    per_rank = run_ranks(_level1_auto_calls, size, size, counts, env={"HCCL_PY_TOPOLOGY": preset}, timeout=100)
    topo = Topology.preset(preset)
    model = CostModel(topo)
    ranks = tuple(range(size))
    for i, (collective, count, algo) in enumerate(zip(("allreduce", "allgather", "reduce_scatter"), counts, algos)):
        assert auto(model, CallSpec.of(collective, count), ranks) == algo
        assert {per_rank[r][i][0] for r in ranks} == {algo}  # what the emulator ran
        starts = [per_rank[r][i][1] for r in ranks]
        exact = simulate(
            collective,
            schedule_fn(topo, collective, algo, ranks),
            topo,
            count,
            itemsize=4,
            start_clocks=starts,
            cost_model=model,
        )
        assert list(exact.end_clocks) == [per_rank[r][i][2] for r in ranks], collective


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
    from hccl_py.algorithms.registry import algos_for

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
