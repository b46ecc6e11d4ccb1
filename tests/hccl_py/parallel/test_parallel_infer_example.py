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
SMALL = ["--batch", "12", "--microbatches", "3", "--layers", "2", "--d-model", "32", "--heads", "2", "--seq", "8", "--no-progress"]

pytestmark = pytest.mark.usefixtures("no_leaks")


def _infer(tmp_path: Path, *args: str) -> str:
    cmd = [str(LAUNCH), "-n", "4", "--topology", "ascend910-8p", str(ROOT / "examples" / "infer.py"), *SMALL,
           "--trace-dir", str(tmp_path / "trace"), *args]
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
    rows = re.findall(r"^\[0\]\s+(\d)\s+(.+?)\s+(\d+)\s+([\d.]+)\s+([\d.]+)\s+([\d.]+)\s+([\d.]+)\s+([\d.]+)%$", out, re.M)
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
    _check_common(out, tmp_path, ["stage 0, replica 0", "stage 1, replica 0", "stage 0, replica 1", "stage 1, replica 1"])
    groups = re.findall(r"^\[0\] groups\s+(.*)$", out, re.M)
    assert groups[0].startswith("pipelines [[0, 1], [2, 3]]") and groups[1].startswith("data-parallel [[0, 2], [1, 3]]")
    assert "bubble" in _field(out, "pipeline") and "samples per replica [6, 6]" in _field(out, "work")
