"""alltoallv in hccl-bench: alltoall's data through all_to_all_v with equal counts (as HCCL's
alltoallv_test), MPI's Alltoallv beside it, gloo refused at its column; the modeled column is
the simulator's all_to_all_v, counts exchange included."""

from __future__ import annotations

import json

import pytest

from benchmarks.collectives import get
from benchmarks.config import BenchConfig
from tests.benchmarks.test_bench_alltoall import _data, _has, _run


def test_alltoallv_is_alltoalls_data_with_counts_per_pair():
    from benchmarks.peers import get_backend
    from benchmarks.peers.hccl import unsupported_reason

    v, a2a = get("alltoallv"), get("alltoall")
    assert all(v.counts(nbytes, 4, n) == a2a.counts(nbytes, 4, n) for nbytes in (8, 100, 4096) for n in (2, 3, 8))
    assert (v.title, v.bus_factor(4), v.rooted, v.reduces, v.in_place) == ("AlltoAllV", 0.75, False, False, False)
    cfg = BenchConfig(collective="alltoallv")
    assert get_backend("gloo").unsupported(cfg) == "no torch.distributed binding for alltoallv"
    assert get_backend("mpi").unsupported(cfg.replace(dtype="bf16")) is None and "Alltoallv" in get_backend("mpi").mode(
        v
    )
    assert "all_to_all_v" in get_backend("hccl").mode(v)
    assert unsupported_reason(cfg.replace(algo="mesh")) is None
    assert "pairwise, mesh" in unsupported_reason(cfg.replace(algo="ring"))


@pytest.mark.timeout(90)
@pytest.mark.usefixtures("no_leaks")
def test_console_script_alltoallv(tmp_path):
    from hccl_py.choice.select import alltoallv_auto
    from hccl_py.collectives import CallSpec
    from hccl_py.engine.context import load_topology
    from hccl_py.planning.calls import simulate_alltoallv, simulate_call

    mpi = _has("mpi4py")
    out_json = tmp_path / "v.json"
    proc = _run(
        f"alltoallv -n 2 -b 8 -e 4K -f 8 -w 1 -i 2 --repeats 1 --timeout 60 --no-progress --json {out_json}"
        + (" --vs mpi,gloo" if mpi else " --vs gloo")
    )
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert "# hccl-bench alltoallv (AlltoAllV): 2 ranks" in proc.stdout and "# skipping gloo:" in proc.stdout
    assert [int(r[0]) for r in _data(proc.stdout)][:4] == [8, 64, 512, 4096]
    doc = json.loads(out_json.read_text())
    hccl = doc["implementations"]["hccl"]
    assert hccl["status"] == "ok" and [r["wrong"] for r in hccl["rows"]] == [0] * 4
    topo = load_topology(2)
    gather = simulate_call(
        CallSpec.of("allgather", 5, itemsize=8, dtype="int64"), topo
    )  # [ok, 2 send, 2 receive counts]
    for row in hccl["rows"]:
        matrix = [[row["count"] // 2] * 2] * 2
        algo = alltoallv_auto(topo, (0, 1)).algo  # 2 ranks: pairwise
        v = simulate_alltoallv(topo, matrix, algos=[algo], start_clocks=gather.result.end_clocks)[algo]
        assert row["extra"]["modeled_us"] == pytest.approx(max(v.end_clocks) * 1e6, rel=1e-9)
    if mpi:
        assert "Alltoallv(" in proc.stdout
        assert [r["wrong"] for r in doc["implementations"]["mpi"]["rows"]] == [0] * 4
