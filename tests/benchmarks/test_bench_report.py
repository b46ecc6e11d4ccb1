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
    return BenchResult(cfg, {"hccl": _impl("hccl", "hccl-py", [20.0, 40.0, 400.0]),
                             "mpi": _impl("mpi", "MPICH (mpi4py)", [5.0, 20.0, 800.0]),
                             "gloo": skipped})


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
    assert set(row) == {"size", "count", "type", "redop", "root", "time_us", "algbw_gbps", "busbw_gbps",
                        "wrong", "times_us", "extra"}
    assert row["size"] == 8 and row["time_us"] == 20.0 and len(row["times_us"]) == 3
    assert set(doc["ratios"]) == {"mpi"}
    assert doc["ratios"]["mpi"][0] == {"size": 8, "time_ratio": 4.0, "busbw_ratio": 0.25}


def test_plot_draws_a_png(tmp_path):
    pytest.importorskip("matplotlib", reason="matplotlib is not installed (pip install -e '.[bench]')")
    from benchmarks.plot import plot_busbw

    out = tmp_path / "busbw.png"
    plot_busbw(_result(), str(out))
    assert out.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n" and out.stat().st_size > 10_000
