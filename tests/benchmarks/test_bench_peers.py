"""The peers end to end at n=2 on a tiny sweep (mpi4py+MPICH, torch gloo, torch on hccl-py's
"hccl" backend), when installed."""

from __future__ import annotations

import pytest

from benchmarks.config import BenchConfig
from benchmarks.harness import run_benchmark, size_plan
from benchmarks.peers import get_backend

pytestmark = pytest.mark.usefixtures("no_leaks")


def _require(name: str):
    backend = get_backend(name)
    reason = backend.unavailable()
    if reason:
        pytest.skip(f"{name}: {reason}")
    return backend


def _tiny(collective: str, **kw) -> BenchConfig:
    base = dict(
        collective=collective,
        nranks=2,
        minbytes=8,
        maxbytes=4096,
        stepfactor=512,
        warmup=1,
        iters=2,
        repeats=1,
        timeout_s=40,
    )
    base.update(kw)
    return BenchConfig(**base)


@pytest.mark.timeout(60)
@pytest.mark.parametrize(
    "collective, kw",
    [
        ("allreduce", {}),
        ("allgather", {"dtype": "bf16"}),
        ("broadcast", {"root": 1}),
        ("reduce", {"root": 1, "op": "min", "dtype": "int8"}),
        ("reducescatter", {"op": "max", "dtype": "fp16"}),
        ("alltoall", {"dtype": "bf16"}),
        ("scatter", {"root": 1, "dtype": "int8"}),
        ("gather", {"root": 1, "dtype": "fp64"}),
    ],
)
def test_mpi_runs_every_collective(tmp_path, collective, kw):
    backend = _require("mpi")
    cfg = _tiny(collective, **kw)
    rows = backend.run(cfg, None, str(tmp_path))
    assert [r["size"] for r in rows] == [p.nbytes for p in size_plan(cfg)]
    assert [r["wrong"] for r in rows] == [0, 0]
    assert all(r["time_us"] > 0 for r in rows)


def test_mpi_declines_bf16_reductions():
    from benchmarks.peers.mpi import MpiBackend

    assert "bfloat16" in MpiBackend().unsupported(_tiny("allreduce", dtype="bf16"))
    assert MpiBackend().unsupported(_tiny("allgather", dtype="bf16")) is None


@pytest.mark.timeout(90)
@pytest.mark.parametrize(
    "collective, kw",
    [
        ("allreduce", {}),
        ("reducescatter", {"dtype": "bf16", "op": "min"}),
        ("alltoall", {}),
        ("scatter", {"root": 1}),
        ("gather", {"root": 1, "dtype": "int8"}),
    ],
)
def test_gloo_runs(tmp_path, collective, kw):
    backend = _require("gloo")
    cfg = _tiny(collective, **kw)
    rows = backend.run(cfg, None, str(tmp_path))
    assert [r["wrong"] for r in rows] == [0, 0]
    assert all(r["time_us"] > 0 for r in rows)


@pytest.mark.timeout(90)
@pytest.mark.parametrize(
    "collective, kw",
    [
        ("allreduce", {}),
        ("reducescatter", {"op": "min", "dtype": "fp16"}),
        ("alltoall", {"dtype": "bf16"}),
    ],
)
def test_torch_hccl_runs(tmp_path, collective, kw):
    """--vs torch-hccl: the same calls through torch.distributed on hccl-py's backend, so the
    modeled columns equal hccl-py's own (the torch path adds wall time, never modeled time)."""
    backend = _require("torch-hccl")
    cfg = _tiny(collective, **kw)
    rows = backend.run(cfg, None, str(tmp_path))
    assert [r["size"] for r in rows] == [p.nbytes for p in size_plan(cfg)]
    assert [r["wrong"] for r in rows] == [0, 0]
    assert all(r["time_us"] > 0 for r in rows)
    own = get_backend("hccl").run(cfg, None, str(tmp_path))
    assert [r["extra"]["modeled_us"] for r in rows] == [r["extra"]["modeled_us"] for r in own]


def test_torch_hccl_takes_algo_through_hccl_algo():
    from benchmarks.peers.torch_hccl import TorchHcclBackend, algo_env

    assert algo_env(_tiny("reducescatter")) == {}
    assert algo_env(_tiny("reducescatter", algo="ring")) == {"HCCL_ALGO": "reduce_scatter=ring"}
    assert "no algorithm" in TorchHcclBackend().unsupported(_tiny("allreduce", algo="pairwise"))


@pytest.mark.timeout(60)
def test_alternating_repeats_with_mpi(tmp_path, capsys):
    _require("mpi")
    cfg = _tiny("allgather", repeats=2, peers=("mpi",))
    result = run_benchmark(cfg, [get_backend("hccl"), get_backend("mpi")], progress=False, workdir=str(tmp_path))
    assert [i.name for i in result.ok] == ["hccl", "mpi"]
    for impl in result.ok:
        assert len(impl.runs) == 2 and all(len(r.times_us) == 2 for r in impl.rows)
        assert [r.wrong for r in impl.rows] == [0, 0]


@pytest.mark.timeout(60)
def test_unmodeled_peer_is_hccl_py_without_the_clock(tmp_path):
    """--vs unmodeled: the same calls with HCCL_PY_MODELED_TIME=0, so the modeled columns read 0."""
    cfg = _tiny("allreduce")
    modeled = get_backend("hccl").run(cfg, None, str(tmp_path))
    unmodeled = get_backend("unmodeled").run(cfg, None, str(tmp_path))
    assert [r["wrong"] for r in unmodeled] == [0, 0]
    assert all(r["extra"]["modeled_us"] > 0 for r in modeled)
    assert all(r["extra"]["modeled_us"] == 0 for r in unmodeled)
    assert "HCCL_PY_MODELED_TIME=0" in get_backend("unmodeled").version()
