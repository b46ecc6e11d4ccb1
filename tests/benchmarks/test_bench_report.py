"""Tables, the ratio table, the JSON document (schema hccl-bench/1) and the plot."""

from __future__ import annotations

import json

import pytest

from benchmarks.config import BenchConfig
from benchmarks.harness import BenchResult, ImplResult, Row
from benchmarks.report import SCHEMA, format_ratios, format_report, to_json


def _impl(name: str, label: str, times: list[float], factor: float = 1.5) -> ImplResult:
    rows = [Row(size, size // 4, t, 0, (t, t * 1.1, t * 0.9), factor) for size, t in zip((8, 1024, 1 << 20), times)]
    return ImplResult(name, label, version=f"{label} 1.0", mode="in place", rows=rows)


def _result() -> BenchResult:
    cfg = BenchConfig(nranks=4, minbytes=8, maxbytes=1 << 20, stepfactor=128, peers=("mpi", "gloo"))
    skipped = ImplResult("gloo", "torch gloo", status="skipped", reason="torch is not installed")
    return BenchResult(
        cfg,
        {
            "hccl": _impl("hccl", "hccl-py", [20.0, 40.0, 400.0]),
            "mpi": _impl("mpi", "MPICH (mpi4py)", [5.0, 20.0, 800.0]),
            "gloo": skipped,
        },
    )


def _data(text: str) -> list[list[str]]:
    return [line.split() for line in text.splitlines() if line.strip() and not line.startswith("#")]


def test_report_columns_like_nccl_tests():
    text = format_report(_result())
    assert "#       size         count      type   redop    root        time     algbw     busbw   #wrong" in text
    rows = _data(text)
    # hccl table (3 rows), mpi table (3 rows), ratio table (3 rows); the skipped gloo has none
    assert len(rows) == 9
    size, count, typ, redop, root, time_us, algbw, busbw, wrong = rows[2]
    assert (size, count, typ, redop, root, wrong) == ("1048576", "262144", "float", "sum", "-1", "0")
    assert float(time_us) == 400.0
    assert float(algbw) == pytest.approx((1 << 20) / 400e-6 / 1e9, abs=0.01)
    assert float(busbw) == pytest.approx(float(algbw) * 1.5, abs=0.01)
    assert "torch gloo" not in text


def test_ratio_table():
    text = format_ratios(_result())
    assert "time/mpi" in text and "busbw/mpi" in text and "gloo" not in text
    ratios = _data(text)
    assert [r[0] for r in ratios] == ["8", "1024", "1048576"]
    assert [float(r[1]) for r in ratios] == [4.0, 2.0, 0.5]  # hccl-py time / MPI time
    assert [float(r[2]) for r in ratios] == [0.25, 0.5, 2.0]  # busbw ratio is the inverse


def test_json_schema():
    doc = json.loads(json.dumps(to_json(_result())))  # really serialisable
    assert doc["schema"] == SCHEMA == "hccl-bench/1"
    assert doc["collective"] == "allreduce" and doc["title"] == "AllReduce" and doc["bus_factor"] == 1.5
    assert doc["config"]["nranks"] == 4 and doc["config"]["peers"] == ["mpi", "gloo"]
    assert {"cores", "python", "platform"} <= set(doc["machine"])
    impls = doc["implementations"]
    assert set(impls) == {"hccl", "mpi", "gloo"}
    assert impls["gloo"]["status"] == "skipped" and impls["gloo"]["reason"] == "torch is not installed"
    assert impls["gloo"]["rows"] == []
    row = impls["hccl"]["rows"][0]
    assert set(row) == {
        "size",
        "count",
        "type",
        "redop",
        "root",
        "time_us",
        "algbw_gbps",
        "busbw_gbps",
        "wrong",
        "times_us",
        "extra",
    }
    assert row["size"] == 8 and row["time_us"] == 20.0 and len(row["times_us"]) == 3
    assert set(doc["ratios"]) == {"mpi"}
    assert doc["ratios"]["mpi"][0] == {"size": 8, "time_ratio": 4.0, "busbw_ratio": 0.25}


def test_plot_draws_a_png(tmp_path):
    pytest.importorskip("matplotlib", reason="matplotlib is not installed (pip install -e '.[bench]')")
    from benchmarks.plot import plot_busbw

    out = tmp_path / "busbw.png"
    plot_busbw(_result(), str(out))
    assert out.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n" and out.stat().st_size > 10_000


def _scaling_results() -> list[BenchResult]:
    """hccl-py and MPICH at 2 ranks; at 4 ranks MPICH failed: it has no scaling column."""
    cfg2 = BenchConfig(nranks=2, minbytes=8, maxbytes=1 << 20, stepfactor=128, peers=("mpi",))
    two = BenchResult(
        cfg2,
        {
            "hccl": _impl("hccl", "hccl-py", [20.0, 40.0, 400.0], factor=1.0),
            "mpi": _impl("mpi", "MPICH (mpi4py)", [5.0, 20.0, 800.0], factor=1.0),
        },
    )
    four = BenchResult(
        cfg2.replace(nranks=4),
        {
            "hccl": _impl("hccl", "hccl-py", [60.0, 200.0, 1000.0]),
            "mpi": ImplResult("mpi", "MPICH (mpi4py)", status="failed", reason="x"),
        },
    )
    return [two, four]


def test_scaling_table_is_each_implementations_time_over_its_own_first():
    from benchmarks.report import format_scaling

    text = format_scaling(_scaling_results())
    header = text.splitlines()[2]
    assert "hccl-py 4/2" in header and "MPICH" not in header  # no column for the run that failed at 4
    assert "busbw factor 1 at -n 2, 1.5 at -n 4" in text
    assert [[float(v) for v in row] for row in _data(text)] == [[8, 3.0], [1024, 5.0], [1048576, 2.5]]


def test_scaling_json_holds_every_world_size_and_the_ratios():
    from benchmarks.report import SCALING_SCHEMA, scaling_to_json

    doc = json.loads(json.dumps(scaling_to_json(_scaling_results())))
    assert doc["schema"] == SCALING_SCHEMA == "hccl-bench-scaling/1"
    assert doc["nranks"] == [2, 4] and [d["schema"] for d in doc["results"]] == [SCHEMA, SCHEMA]
    assert [d["config"]["nranks"] for d in doc["results"]] == [2, 4]
    assert set(doc["scaling"]) == {"hccl"}
    first = doc["scaling"]["hccl"][0]
    assert first["nranks"] == 4 and first["size"] == 8 and first["time_ratio"] == 3.0
    assert first["busbw_ratio"] == pytest.approx(1.5 / 3.0)  # busbw per bus byte: factor 1.5 at 4 ranks


def test_plot_draws_several_world_sizes(tmp_path):
    pytest.importorskip("matplotlib", reason="matplotlib is not installed (pip install -e '.[bench]')")
    from benchmarks.plot import plot_busbw

    out = tmp_path / "scaling.png"
    plot_busbw(_scaling_results(), str(out))
    assert out.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n" and out.stat().st_size > 10_000
