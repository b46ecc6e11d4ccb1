"""Size parsing and sweep generation (-b/-e/-f), the config, busbw factors."""

from __future__ import annotations

import dataclasses

import pytest

from benchmarks.collectives import COLLECTIVES, get
from benchmarks.config import BenchConfig, parse_dtype
from benchmarks.harness import size_plan, sweep_sizes
from topology.units import format_size, parse_size


@pytest.mark.parametrize(
    "text, expected",
    [
        ("8", 8),
        ("64K", 64 << 10),
        ("64k", 64 << 10),
        ("64M", 64 << 20),
        ("1G", 1 << 30),
        ("2KB", 2048),
        ("2KiB", 2048),
        ("1.5M", 3 << 19),
        (" 16 ", 16),
        (32, 32),
    ],
)
def test_parse_size(text, expected):
    assert parse_size(text) == expected


@pytest.mark.parametrize("text", ["", "0", "-8", "8X", "1.3", "K", "1.0000001K"])
def test_parse_size_rejects(text):
    with pytest.raises(ValueError):
        parse_size(text)


def test_format_size():
    assert [format_size(n) for n in (8, 1024, 1536 << 10, 64 << 20, 1 << 30)] == ["8B", "1K", "1.5M", "64M", "1G"]


def test_sweep_like_nccl_tests():
    cfg = BenchConfig(minbytes=8, maxbytes=parse_size("64K"), stepfactor=4)
    assert sweep_sizes(cfg) == [8, 32, 128, 512, 2048, 8192, 32768]
    assert sweep_sizes(BenchConfig(minbytes=8, maxbytes=8, stepfactor=1)) == [8]
    assert sweep_sizes(BenchConfig(minbytes=parse_size("1M"), maxbytes=parse_size("64M"), stepfactor=2)) == [
        1 << 20,
        2 << 20,
        4 << 20,
        8 << 20,
        16 << 20,
        32 << 20,
        64 << 20,
    ]
    # -e is included when reached exactly, and never exceeded
    assert sweep_sizes(BenchConfig(minbytes=3, maxbytes=100, stepfactor=3)) == [3, 9, 27, 81]


def test_size_plan_rounds_to_whole_elements_and_ranks():
    # allgather at n=3, fp32: the gathered size is a multiple of 3*4 bytes, at least one element per rank
    plan = size_plan(BenchConfig(collective="allgather", nranks=3, minbytes=8, maxbytes=1024, stepfactor=4))
    assert [p.nbytes for p in plan] == [12, 24, 120, 504]
    assert all(p.recv_count == 3 * p.send_count == 3 * p.count for p in plan)
    # duplicates after rounding are dropped: 1 and 2 bytes of fp32 are both one element
    plan = size_plan(BenchConfig(minbytes=1, maxbytes=16, stepfactor=2))
    assert [p.nbytes for p in plan] == [4, 8, 16]
    rs = size_plan(
        BenchConfig(collective="reducescatter", nranks=4, dtype="fp64", minbytes=64, maxbytes=64, stepfactor=1)
    )
    assert [(p.nbytes, p.count, p.send_count, p.recv_count) for p in rs] == [(64, 2, 8, 2)]


@pytest.mark.parametrize(
    "name, n, factor",
    [
        ("allreduce", 2, 1.0),
        ("allreduce", 4, 1.5),
        ("allreduce", 8, 1.75),
        ("allgather", 4, 0.75),
        ("reducescatter", 4, 0.75),
        ("allgather", 2, 0.5),
        ("broadcast", 4, 1.0),
        ("reduce", 4, 1.0),
        ("alltoall", 2, 0.5),
        ("alltoall", 8, 0.875),
        ("scatter", 4, 0.75),
        ("gather", 4, 0.75),
    ],
)
def test_busbw_factors_are_nccl_tests(name, n, factor):
    assert get(name).bus_factor(n) == pytest.approx(factor)


def test_collective_flags():
    assert set(COLLECTIVES) == {
        "allreduce",
        "allgather",
        "broadcast",
        "reduce",
        "reducescatter",
        "alltoall",
        "alltoallv",
        "scatter",
        "gather",
    }
    assert [c for c in COLLECTIVES if COLLECTIVES[c].rooted] == ["broadcast", "reduce", "scatter", "gather"]
    assert not any(
        COLLECTIVES[c].in_place or COLLECTIVES[c].reduces for c in ("alltoall", "alltoallv", "scatter", "gather")
    )
    assert not COLLECTIVES["allgather"].reduces and COLLECTIVES["reducescatter"].reduces


def test_config_validation_and_json_round_trip():
    cfg = BenchConfig(collective="reduce", nranks=4, root=3, dtype="bf16", op="max", peers=("mpi", "gloo"))
    assert BenchConfig.from_json(cfg.to_json()) == cfg
    for bad in (
        dict(root=2),
        dict(minbytes=64, maxbytes=8),
        dict(stepfactor=1),
        dict(iters=0),
        dict(op="avg"),
        dict(peers=("nccl",)),
        dict(repeats=0),
    ):
        with pytest.raises(ValueError):
            BenchConfig(**bad)
    with pytest.raises(dataclasses.FrozenInstanceError):
        cfg.nranks = 2  # type: ignore[misc]


def test_dtype_names():
    assert parse_dtype("float").name == parse_dtype("fp32").name == "fp32"
    assert parse_dtype("half").label == "half" and parse_dtype("bfloat16").name == "bf16"
    with pytest.raises(ValueError, match="unknown data type"):
        parse_dtype("fp8")
