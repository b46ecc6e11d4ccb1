"""hccl-bench partition: the table (auto vs manual vs optimized vs flat), its numbers, --groups,
--json, --plot, several topologies, the 64-card heuristic path and bad arguments."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from benchmarks import cli

ROOT = Path(__file__).resolve().parents[2]


def _rows(text: str) -> dict[str, list[str]]:
    """strategy -> the row's cells after the groups (modeled ms, throughput, speedup, time/best)."""
    rows = {}
    lines = [line for line in text.splitlines() if line and not line.startswith("#")]
    for line in lines[1:]:
        strategy, _, rest = line.partition("  ")
        cells = rest.split()
        if cells[-1] == "*":
            cells = cells[:-1]
        rows[strategy.strip()] = cells[-4:]
    return rows


def test_mixed_4p_dp_infer_table_shows_the_fast_pair_beating_auto(capsys):
    assert cli.main(["partition", "--topology", "mixed-4p", "--workload", "dp-infer"]) == 0
    out = capsys.readouterr().out
    assert (
        "strategy" in out and "modeled ms" in out and "samples/s" in out and "vs 1 card" in out and "time/best" in out
    )
    rows = _rows(out)
    assert set(rows) == {"auto", "manual: fast pair {1,2} together", "manual: interleaved", "optimized", "flat"}
    ms = {k: float(v[0]) for k, v in rows.items()}
    speedup = {k: float(v[2].rstrip("x")) for k, v in rows.items()}
    assert (
        ms["manual: fast pair {1,2} together"] < ms["auto"]
        and speedup["manual: fast pair {1,2} together"] > speedup["auto"]
    )
    assert ms["optimized"] <= min(v for k, v in ms.items() if k.startswith("manual"))
    assert rows["optimized"][3] == "1.000" and float(rows["auto"][3]) > 1.05
    assert "{0,1} {2,3}" in out.splitlines()[3]  # the auto row: HCCL's grouping
    assert "exhaustive: all 15 set partitions of 4 ranks" in out


def test_collective_workload_with_manual_groups_json_and_plot(tmp_path, capsys):
    pytest.importorskip("matplotlib")
    doc, png = tmp_path / "rows.json", tmp_path / "groups.png"
    code = cli.main(
        [
            "partition",
            "--topology",
            "mixed-4p",
            "--workload",
            "allreduce:64M",
            "--groups",
            "1,2;0,3",
            "--groups",
            "0,1,2,3",
            "--json",
            str(doc),
            "--plot",
            str(png),
        ]
    )
    assert code == 0
    out = capsys.readouterr().out
    rows = _rows(out)
    assert set(rows) == {"auto", "manual 1", "manual 2", "optimized", "flat"}
    assert rows["auto"][2] == "-"  # no one-card speedup for a lone collective
    data = json.loads(doc.read_text())
    assert data[0]["topology"] == "mixed-4p" and data[0]["method"] == "exhaustive"
    by = {r["strategy"]: r for r in data[0]["rows"]}
    assert by["manual 1"]["groups"] == [[1, 2], [0, 3]] and by["flat"]["groups"] is None
    assert by["optimized"]["modeled_s"] <= by["manual 1"]["modeled_s"] < by["auto"]["modeled_s"]
    assert png.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n" and png.stat().st_size > 10_000


def test_several_topologies_and_the_64_card_heuristic(capsys):
    assert cli.main(["partition", "--topology", "ascend910-8p,8x8p-roce", "--workload", "allreduce:16M"]) == 0
    out = capsys.readouterr().out
    assert "# ascend910-8p: 8 ranks" in out and "# 8x8p-roce: 64 ranks on 8 servers" in out
    assert "exhaustive over the 142 partitions into equal groups" in out
    assert "heuristic: best of" in out and "Kernighan-Lin" in out
    assert "8 groups of 8: {0,1,2,3,4,5,6,7} ..." in out


@pytest.mark.parametrize(
    "args",
    [
        ["--workload", "allreduce"],
        ["--groups", "0,1;1,2,3"],
        ["--topology", "nope-4p"],
        ["--workload", "dp-infer", "--batch-per-card", "0"],
    ],
)
def test_bad_arguments_exit_2(args, capsys):
    assert (
        cli.main(["partition", "--topology", "mixed-4p", *args] if "--topology" not in args else ["partition", *args])
        == 2
    )
    assert "hccl-bench partition:" in capsys.readouterr().err


@pytest.mark.timeout(60)
def test_console_entry_point_dispatches_the_subcommand():
    env = dict(os.environ)
    env["PYTHONPATH"] = str(ROOT) + (os.pathsep + env["PYTHONPATH"] if env.get("PYTHONPATH") else "")
    proc = subprocess.run(
        [sys.executable, "-m", "benchmarks.cli", "partition", "--workload", "broadcast:1M"],
        capture_output=True,
        text=True,
        timeout=50,
        env=env,
        cwd=ROOT,
    )
    assert proc.returncode == 0, proc.stderr
    assert "# mixed-4p: 4 ranks" in proc.stdout and "optimized" in proc.stdout
