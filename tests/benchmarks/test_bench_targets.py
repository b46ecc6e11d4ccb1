"""The targets table (benchmarks/targets.py): worst ratios, bounds, and targets not measured."""

from __future__ import annotations

import pytest

from benchmarks.config import BenchConfig
from benchmarks.harness import BenchResult, ImplResult, Row
from benchmarks.targets import check_targets, format_targets, targets_to_json

MiB = 1 << 20


def _impl(name: str, times: dict[int, float]) -> ImplResult:
    rows = [Row(size, size // 4, t, 0, (t,), 1.0) for size, t in sorted(times.items())]
    return ImplResult(name, name, rows=rows)


def _result(nranks: int, hccl: dict[int, float], mpi: dict[int, float], gloo: dict[int, float] | None = None):
    cfg = BenchConfig(nranks=nranks, minbytes=8, maxbytes=2 * MiB, stepfactor=2, peers=("mpi", "gloo"))
    impls = {"hccl": _impl("hccl", hccl), "mpi": _impl("mpi", mpi)}
    impls["gloo"] = _impl("gloo", gloo) if gloo else ImplResult("gloo", "gloo", status="skipped", reason="no torch")
    return BenchResult(cfg, impls)


def _by_what(verdicts):
    return {v.target.what: v for v in verdicts}


def test_worst_size_decides_and_every_unmeasured_target_says_so():
    results = [
        # n=2: 8 B at 1.5x MPICH's time (met); from 1 MiB busbw 1.4x at 1 MiB but 1.25x at 2 MiB (not met)
        _result(2, {8: 15.0, MiB: 100.0, 2 * MiB: 200.0}, {8: 10.0, MiB: 140.0, 2 * MiB: 250.0}, {8: 30.0, MiB: 90.0}),
        # n=8: 8 B at 4x (not met); no size from 1 MiB
        _result(8, {8: 400.0}, {8: 100.0}),
    ]
    verdicts = check_targets(results)
    got = _by_what(verdicts)
    small2 = got["n=2, 8 B: at most 2x MPICH's time"]
    assert (small2.ratio, small2.nranks, small2.size, small2.met) == (1.5, 2, 8, True)
    big2 = got["n=2, from 1 MiB: busbw at least 1.3x MPICH's"]
    assert big2.ratio == pytest.approx(1.25) and big2.size == 2 * MiB and big2.met is False and big2.measured == 2
    small8 = got["n=8, 8 B: at most 2x MPICH's time"]
    assert small8.ratio == 4.0 and small8.met is False
    assert got["n=8, from 1 MiB: busbw at least 1.2x MPICH's"].met is None  # not measured: never "met"
    assert got["n=16, 8 B: at most 3x MPICH's time"].met is None
    # gloo ran at n=2 only (skipped at n=8): its worst is 1 MiB, slower than gloo there
    gloo = got["every n and size: faster than torch gloo"]
    assert (gloo.ratio, gloo.size, gloo.met, gloo.measured) == (pytest.approx(100 / 90), MiB, False, 2)

    text = format_targets(verdicts)
    lines = {line.split("  ")[1].strip(): line for line in text.splitlines() if not line.startswith("#")}
    assert "met (1 measured)" in lines["n=2, 8 B: at most 2x MPICH's time"]
    assert "NOT MET" in lines["n=8, 8 B: at most 2x MPICH's time"] and "n=8 8B" in text
    assert "not measured in this invocation" in lines["n=16, 2 MiB: at most MPICH's time"]
    rows = {row["target"]: row for row in targets_to_json(verdicts)}
    assert rows["n=16, 2 MiB: at most MPICH's time"]["met"] is None
    assert rows["n=2, from 1 MiB: busbw at least 1.3x MPICH's"]["size"] == 2 * MiB


def test_only_allreduce_has_targets():
    result = _result(2, {8: 15.0}, {8: 10.0})
    other = BenchResult(BenchConfig(collective="allgather", nranks=2, peers=("mpi",)), result.impls)
    assert check_targets([other]) == [] and format_targets([]) == ""


@pytest.mark.parametrize("warmup", [5, 20])
def test_the_first_calls_are_held_against_the_median_when_twenty_were_timed(warmup):
    hccl = ImplResult(
        "hccl", "hccl", rows=[Row(8, 2, 600.0, 0, (600.0,), 1.0, {"first_calls_us": 1440.0, "first_call_us": 25e3})]
    )
    cfg = BenchConfig(nranks=8, minbytes=8, maxbytes=8, stepfactor=1, warmup=warmup, peers=("mpi",))
    got = _by_what(check_targets([BenchResult(cfg, {"hccl": hccl, "mpi": _impl("mpi", {8: 150.0})})]))
    calls = got["n=8, 8 B: calls 2-20 at most 1.5x the median"]
    first = got["n=8, 8 B: the first call at most 20 ms"]
    assert (first.ratio, first.met) == (25.0, False)  # the first call's time needs no -w 20
    text = format_targets(list(got.values()))
    if warmup < 20:
        assert calls.met is None and "the first calls need -w 20" in text
    else:
        assert (calls.ratio, calls.met) == (2.4, False) and "2.40x" in text
    assert "25.00ms" in text
