"""python -m benchmarks.rank_cpu: per-rank wall and CPU per call, and the summed cProfile table."""

from __future__ import annotations

import re

import pytest

from benchmarks.rank_cpu import main


@pytest.mark.timeout(120)
@pytest.mark.usefixtures("no_leaks")
def test_every_rank_reports_and_the_profile_names_the_step_loop(capsys):
    assert main(["-n", "3", "--bytes", "1K", "--calls", "30", "--profile", "--top", "40"]) == 0
    out = capsys.readouterr().out
    ranks = re.findall(r"^\s+(\d)\s+([\d.]+)\s+([\d.]+)\s+([\d.]+)$", out, re.M)
    assert [int(r[0]) for r in ranks] == [0, 1, 2], out
    assert all(float(wall) > 0 for _, wall, _, _ in ranks), out
    assert "cores busy over the" in out
    assert "function calls a call" in out and "_apply_arrivals" in out and "advance" in out, out
