"""examples/infer.py end to end through hccl-launch, small sizes: the report's fields, the Chrome
trace and the timeline picture."""

from __future__ import annotations

import json
import re
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[3]
LAUNCH = Path(sys.executable).with_name("hccl-launch")
SMALL = [
    "--batch",
    "12",
    "--microbatches",
    "3",
    "--layers",
    "2",
    "--d-model",
    "32",
    "--heads",
    "2",
    "--seq",
    "8",
    "--no-progress",
]

pytestmark = pytest.mark.usefixtures("no_leaks")


def _infer(tmp_path: Path, *args: str) -> str:
    cmd = [
        str(LAUNCH),
        "-n",
        "4",
        "--topology",
        "ascend910-8p",
        str(ROOT / "examples" / "infer.py"),
        *SMALL,
        "--trace-dir",
        str(tmp_path / "trace"),
        *args,
    ]
    done = subprocess.run(cmd, cwd=tmp_path, capture_output=True, text=True, timeout=60)
    assert done.returncode == 0, done.stdout + done.stderr
    return done.stdout


def _field(out: str, name: str) -> str:
    match = re.search(rf"^\[0\] {name}\s+(.*)$", out, re.M)
    assert match, f"no {name!r} line in:\n{out}"
    return match.group(1)


def _check_common(out: str, tmp_path: Path, roles: list[str]) -> None:
    assert not re.search(r"^\[[123]\]", out, re.M), "only rank 0 prints"
    assert re.match(r"max \|parallel - 1 card\| = \S+ +\(OK", _field(out, "correctness"))
    modeled = _field(out, "modeled")
    assert re.search(r"parallel [\d.]+ ms -> [\d,]+ samples/s;  1 card [\d.]+ ms -> [\d,]+ samples/s", modeled)
    assert re.search(r"speedup [\d.]+x over 1 card, parallel efficiency [\d.]+% on 4 cards", out)
    assert "parallel run" in _field(out, "wall clock") and "not modeled" in out
    rows = re.findall(
        r"^\[0\]\s+(\d)\s+(.+?)\s+(\d+)\s+([\d.]+)\s+([\d.]+)\s+([\d.]+)\s+([\d.]+)\s+([\d.]+)%$", out, re.M
    )
    assert [int(r[0]) for r in rows] == [0, 1, 2, 3] and [r[1] for r in rows] == roles
    assert all(float(r[3]) > 0 and float(r[6]) > 0 for r in rows)  # compute ms, HBM peak MiB
    assert "compute ms" in out and "comm ms" in out and "wait ms" in out
    trace = json.loads((tmp_path / "trace" / "infer_trace.json").read_text())
    kinds = {e.get("cat") for e in trace["traceEvents"] if e["ph"] == "X"}
    assert {"compute", "comm"} <= kinds and {e["pid"] for e in trace["traceEvents"]} == {0, 1, 2, 3}


@pytest.mark.timeout(90)
def test_infer_dp(tmp_path):
    out = _infer(tmp_path, "--mode", "dp", "--policy", "work-stealing", "--chunk", "2")
    _check_common(out, tmp_path, [f"replica {r}" for r in range(4)])
    assert "policy work-stealing: samples per replica [" in _field(out, "work")
    assert "data-parallel [0, 1, 2, 3]" in _field(out, "groups")
    assert "bubble" not in out


@pytest.mark.timeout(90)
def test_infer_pp_with_plot(tmp_path):
    out = _infer(tmp_path, "--mode", "pp", "--model", "mlp", "--hidden", "64,64,64", "--plot", "timeline.png")
    _check_common(out, tmp_path, [f"stage {r}" for r in range(4)])
    assert re.search(r"bubble [\d.]+% .*, 3 micro-batches .*\(p-1\)/\(m\+p-1\) = 50\.0%", _field(out, "pipeline"))
    assert "pipeline [0, 1, 2, 3]" in _field(out, "groups") and "stage 3: layers.3" in _field(out, "stages")
    png = tmp_path / "timeline.png"
    assert png.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n" and png.stat().st_size > 10_000


@pytest.mark.timeout(90)
def test_infer_hybrid(tmp_path):
    out = _infer(tmp_path, "--mode", "hybrid", "--stages", "2")
    _check_common(
        out, tmp_path, ["stage 0, replica 0", "stage 1, replica 0", "stage 0, replica 1", "stage 1, replica 1"]
    )
    groups = re.findall(r"^\[0\] groups\s+(.*)$", out, re.M)
    assert groups[0].startswith("pipelines [[0, 1], [2, 3]]") and groups[1].startswith("data-parallel [[0, 2], [1, 3]]")
    assert "bubble" in _field(out, "pipeline") and "samples per replica [6, 6]" in _field(out, "work")


def _rows(out: str) -> list[tuple[str, ...]]:
    """The per-rank table's rows: rank, role, then the numbers."""
    return [tuple(re.split(r"\s{2,}", line.strip())) for line in re.findall(r"^\[0\]\s+(\d  .+%)$", out, re.M)]


@pytest.mark.timeout(90)
def test_infer_tp_groups_under_data_parallel_overlapped(tmp_path):
    out = _infer(tmp_path, "--mode", "tp", "--tp", "2", "--overlap")
    assert "2 data-parallel replicas x 2 tensor-parallel cards, overlapped" in out
    assert re.match(r"max \|parallel - 1 card\| = \S+ +\(OK", _field(out, "correctness"))
    assert re.search(
        r"heads per card \[1, 1\], MLP hidden per card \[64, 64\]; 8 all_reduces of [\d.]+ KiB per card "
        r"\(2 micro-batches, asynchronous\)",
        _field(out, "work"),
    )
    groups = re.findall(r"^\[0\] groups\s+(.*)$", out, re.M)
    assert groups[0].startswith("tensor-parallel [[0, 1], [2, 3]]") and groups[1].startswith(
        "data-parallel [[0, 2], [1, 3]]"
    )
    assert re.search(r"speedup [\d.]+x over 1 card", out) and "exposed" in _field(out, "overlap")
    rows = _rows(out)
    assert [r[1] for r in rows] == [
        "tp rank 0, replica 0",
        "tp rank 1, replica 0",
        "tp rank 0, replica 1",
        "tp rank 1, replica 1",
    ]
    assert all(len(r) == 9 and float(r[3]) > 0 and float(r[4]) > 0 for r in rows)  # compute, comm, wait, exposed, HBM


@pytest.mark.timeout(90)
def test_infer_ep_skewed_with_capacity(tmp_path):
    out = _infer(
        tmp_path,
        "--mode",
        "ep",
        "--experts",
        "4",
        "--expert-hidden",
        "32",
        "--shared-hidden",
        "32",
        "--router-skew",
        "1.2",
        "--capacity-factor",
        "1.0",
    )
    assert "ep (4 experts over 4 cards)" in out
    assert re.match(r"max \|parallel - 1 card\| = \S+ +\(OK.*routing equal to 1 card's", _field(out, "correctness"))
    assert "3, 3, 3, 3 sequences per card" in _field(out, "work")
    assert re.search(r"skew 1\.2 \(Zipf prior over popularity order \[[\d, ]+\]", _field(out, "router"))
    per_expert = [
        int(v) for v in re.search(r"tokens per expert \[([\d, ]+)\]", _field(out, "experts")).group(1).split(", ")
    ]
    per_card = [int(v) for v in re.search(r"tokens per card \[([\d, ]+)\]", _field(out, "cards")).group(1).split(", ")]
    assert per_card == per_expert and len(per_card) == 4  # one expert per card
    capacity = re.search(
        r"factor 1 -> 48 rows per expert per layer: dropped (\d+) of 384 assignments", _field(out, "capacity")
    )
    assert capacity and int(capacity.group(1)) == 384 - sum(per_expert) > 0  # 12 x 8 tokens x top-2 x 2 layers
    assert re.search(r"per card \[[\d., ]+\] ms \(modeled\); most expert rows on card \d", _field(out, "waiting"))
    assert re.search(r"speedup [\d.]+x over 1 card", out)
    rows = _rows(out)
    assert [r[1] for r in rows] == [f"expert {e}" for e in range(4)] and all(len(r) == 8 for r in rows)
