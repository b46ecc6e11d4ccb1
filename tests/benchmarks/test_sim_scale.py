"""The cluster-scale benchmark runs hccl-sim for real, one process per case, and reports each
case's algorithm, how it was simulated, wall time and peak memory."""

from __future__ import annotations

import json

import pytest

from benchmarks.sim_scale import main


@pytest.mark.timeout(120)
def test_sim_scale_times_each_case_and_says_how_it_ran(capsys, tmp_path):
    out_json = tmp_path / "scale.json"
    args = ["--preset", "4x8p-roce", "--collective", "allreduce,alltoall", "-b", "8", "-e", "8M", "-f", "1024"]
    assert main([*args, "--json", str(out_json)]) == 0
    out = capsys.readouterr().out
    cases = json.loads(out_json.read_text())["cases"]
    assert [(c["collective"], c["size_bytes"]) for c in cases] == [
        (name, size) for name in ("allreduce", "alltoall") for size in (8, 8192, 8 << 20)
    ]
    # 8 B of all-to-all over 32 ranks is no whole element per pair: refused by hccl-sim, not a case
    assert [c["status"] for c in cases] == ["ok", "ok", "ok", "n/a", "ok", "ok"]
    ran = [c for c in cases if c["status"] == "ok"]
    assert all(c["wall_s"] > 0 and c["peak_bytes"] > 10**6 and c["how"] in ("flows", "rank by rank") for c in ran)
    assert cases[0]["algo"] == "hier:rd/rd@server"  # HCCL's small-count allreduce across 4 servers
    assert "# 5 of 5 within target (1 left out: a size that gives some rank no whole element)" in out


@pytest.mark.timeout(60)
def test_a_failing_case_is_reported_with_its_error_and_fails_the_run(capsys):
    assert main(["--preset", "4x8p-roce", "--collective", "allreduce", "--algo", "nosuch", "-b", "8", "-e", "8"]) == 1
    out = capsys.readouterr().out
    assert "nosuch" in out and "<- over target" in out
