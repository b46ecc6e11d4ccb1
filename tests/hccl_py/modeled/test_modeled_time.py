"""Modeled time: the emulator's clocks equal the simulator's to the last bit, are deterministic,
and follow HCCL's closed forms on uniform topologies."""

from __future__ import annotations

import json
import math

import numpy as np
import pytest

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
