"""The harness on an in-process reference implementation: checking (#wrong), chunking under a
memory budget, timing reductions, medians, the extra-columns hook."""

from __future__ import annotations

import io

import numpy as np
import pytest

from benchmarks.collectives import COLLECTIVES, Case, get
from benchmarks.collectives.base import pattern, reduced
from benchmarks.config import BenchConfig
from benchmarks.harness import ImplResult, aggregate, count_wrong, run_sweep, size_plan
from benchmarks.report import format_table
from tests.benchmarks.bench_fakes import ExtraComm, FaultyComm, ThreadComm, run_threads


def _cfg(**kw) -> BenchConfig:
    base = dict(nranks=3, minbytes=8, maxbytes=4096, stepfactor=8, warmup=1, iters=3, repeats=1)
    base.update(kw)
    return BenchConfig(**base)


@pytest.mark.parametrize("collective", sorted(COLLECTIVES))
@pytest.mark.parametrize(
    "dtype, op",
    [("fp32", "sum"), ("int8", "sum"), ("bf16", "max"), ("fp16", "prod"), ("int64", "min"), ("uint8", "sum")],
)
def test_reference_implementation_has_no_wrong_results(collective, dtype, op):
    root = 2 if COLLECTIVES[collective].rooted else 0
    cfg = _cfg(collective=collective, dtype=dtype, op=op, root=root)
    rows = run_threads(3, lambda comm: run_sweep(comm, cfg))
    assert [r["wrong"] for r in rows[0]] == [0] * len(size_plan(cfg))
    assert [r["size"] for r in rows[0]] == [p.nbytes for p in size_plan(cfg)]
    assert all(r["time_us"] > 0 for r in rows[0])


def test_int8_sums_wrap_like_every_implementation():
    # 20 ranks of values up to 12 overflow int8: the expected result wraps exactly as np.add does
    stacked = np.stack([np.resize(((np.arange(13) + 7 * r) % 13).astype(np.int8), 30) for r in range(20)])
    assert np.array_equal(reduced(30, 20, "sum", np.dtype(np.int8)), np.add.reduce(stacked, axis=0, dtype=np.int8))


def test_the_check_catches_a_wrong_result():
    cfg = _cfg(collective="allreduce", minbytes=64, maxbytes=64, stepfactor=1, warmup=2, iters=5)
    rows = run_threads(3, lambda comm: run_sweep(comm, cfg), comm_class=FaultyComm)
    # rank 1 flips one element in each of its 7 calls (2 warm-up + 5 timed)
    assert rows[0][0]["wrong"] == 7
    assert rows[1][0]["wrong"] == 7  # the total is the same on every rank


def test_every_iteration_is_checked_also_in_chunks():
    class EveryThird(FaultyComm):
        every = 3

    # 40 bytes per iteration and a 100-byte budget: 2 buffers, so 10 iterations run in 5 chunks
    cfg = _cfg(
        collective="broadcast", root=0, minbytes=40, maxbytes=40, stepfactor=1, warmup=0, iters=10, mem_budget=100
    )
    rows = run_threads(3, lambda comm: run_sweep(comm, cfg), comm_class=EveryThird)
    assert rows[0][0]["buffers"] == 2
    assert rows[0][0]["wrong"] == 3  # calls 3, 6 and 9


def test_check_off_reports_none():
    cfg = _cfg(collective="allgather", check=False)
    rows = run_threads(3, lambda comm: run_sweep(comm, cfg), comm_class=FaultyComm)
    assert {r["wrong"] for r in rows[0]} == {None}


def test_reduce_checks_only_root():
    class BadNonRoot(FaultyComm):
        bad_rank = 0  # not the root: its result is undefined, so it is not checked

    cfg = _cfg(collective="reduce", root=2)
    rows = run_threads(3, lambda comm: run_sweep(comm, cfg), comm_class=BadNonRoot)
    assert {r["wrong"] for r in rows[0]} == {0}


def test_count_wrong():
    expected = pattern(10, 0, np.dtype(np.float32))
    result = expected.copy()
    assert count_wrong(result, expected) == 0
    result[[1, 7]] = np.nan
    assert count_wrong(result, expected) == 2
    assert count_wrong(result[:5], expected) == 10  # a result of the wrong length is all wrong


def test_inputs_differ_per_rank_and_expected_is_not_an_input():
    for name, coll in COLLECTIVES.items():
        cases = [Case(r, 3, 26, np.dtype(np.float32), "sum", 0) for r in range(3)]
        inputs = [coll.init(c)[0] for c in cases]
        assert not np.array_equal(inputs[0], inputs[1]), name
        exp = coll.init(cases[1])[1]
        if exp is not None and exp.size == inputs[1].size:
            assert not np.array_equal(exp, inputs[1]), name


def test_time_is_max_over_ranks_and_median_over_repeats():
    runs = [[{"size": 8, "count": 2, "time_us": t, "wrong": 0, "extra": {}}] for t in (5.0, 1.0, 3.0)]
    (row,) = aggregate(runs, bus_factor=1.5)
    assert row.time_us == 3.0 and row.times_us == (5.0, 1.0, 3.0) and row.wrong == 0
    assert row.algbw == pytest.approx(8 / 3e-6 / 1e9) and row.busbw == pytest.approx(row.algbw * 1.5)

    class SlowRank2(ThreadComm):
        def allreduce_scalar(self, value, how):
            return super().allreduce_scalar(1.0 if self.rank == 2 and how == "max" else 0.0, how)

    cfg = _cfg(minbytes=8, maxbytes=8, stepfactor=1)
    rows = run_threads(3, lambda comm: run_sweep(comm, cfg), comm_class=SlowRank2)
    assert rows[0][0]["time_us"] == 1e6  # rank 2's "1 s" wins the max on every rank


def test_extra_columns_hook():
    cfg = _cfg(collective="allreduce", minbytes=1024, maxbytes=1024, stepfactor=1, iters=4)
    rows = run_threads(3, lambda comm: run_sweep(comm, cfg), comm_class=ExtraComm)
    extra = rows[0][0]["extra"]
    assert extra["fake_us"] == 4.0  # per iteration, max over ranks (rank 2: 2 + 2)
    # the warm-up calls timed one by one: the first, and the mean of the next (every implementation)
    assert set(extra) == {"fake_us", "first_call_us"} and extra["first_call_us"] > 0  # -w 1: no next ones
    (row,) = aggregate([rows[0]], get("allreduce").bus_factor(3), ExtraComm.extra_columns)
    assert row.extra["fake_busbw"] == pytest.approx(1024 / 4e-6 / 1e9 * 4 / 3)
    impl = ImplResult(
        "hccl", "fake", version="fake 1", mode="in place", extra_columns=ExtraComm.extra_columns, rows=[row]
    )
    table = format_table(cfg, impl)
    assert "fake(us)" in table and "fbusbw" in table
    data = [line.split() for line in table.splitlines() if not line.startswith("#")]
    assert data[0][-2:] == ["4.00", f"{row.extra['fake_busbw']:.2f}"]


def test_several_world_sizes_alternate_repeat_by_repeat():
    """-n 2,3: the driver interleaves world sizes and implementations in every repeat, so a slow
    stretch of the machine falls on all of them; a peer refused at one size runs at the others."""
    from benchmarks.harness import run_benchmarks
    from tests.benchmarks.bench_fakes import ThreadBackend

    order: list[tuple[str, int]] = []
    cfgs = [_cfg(nranks=n, repeats=2, maxbytes=64) for n in (2, 3)]
    log = io.StringIO()
    results = run_benchmarks(
        cfgs, [ThreadBackend("hccl", order), ThreadBackend("mpi", order, refuse_nranks=3)], log=log, progress=False
    )
    assert order == [("hccl", 2), ("mpi", 2), ("hccl", 3)] * 2
    assert [r.cfg.nranks for r in results] == [2, 3]
    assert [i.name for i in results[0].ok] == ["hccl", "mpi"] and [i.name for i in results[1].ok] == ["hccl"]
    assert results[1].impls["mpi"].status == "skipped"
    assert log.getvalue() == "# skipping mpi at -n 3: not at 3 ranks\n"
    for result in results:
        for impl in result.ok:
            assert len(impl.runs) == 2 and [r.wrong for r in impl.rows] == [0] * len(impl.rows)
            assert impl.rows[0].bus_factor == get("allreduce").bus_factor(result.cfg.nranks)
