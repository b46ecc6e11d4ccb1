"""python -m benchmarks.rank_cpu: per-rank wall and CPU per call, USS, and the summed cProfile table."""

from __future__ import annotations

import re

import pytest

from benchmarks.rank_cpu import main, uss_bytes


@pytest.mark.timeout(120)
@pytest.mark.usefixtures("no_leaks")
def test_every_rank_reports_and_the_profile_names_the_step_loop(capsys):
    assert main(["-n", "3", "--bytes", "1K", "--calls", "30", "--profile", "--top", "40"]) == 0
    out = capsys.readouterr().out
    ranks = re.findall(r"^\s+(\d)\s+([\d.]+)\s+([\d.]+)\s+([\d.]+)\s+([\d.]+)\s+(-?[\d.]+)$", out, re.M)
    assert [int(r[0]) for r in ranks] == [0, 1, 2], out
    assert all(float(r[1]) > 0 for r in ranks), out
    # USS: a python process with numpy and hccl-py holds some private MiB, never hundreds
    assert all(
        1.0 < float(r[4]) < 500.0 and float(r[5]) == pytest.approx(float(r[4]) - 1 / 1024, abs=0.06) for r in ranks
    )
    assert "MiB above the program's own buffer of 1K" in out, out
    assert "cores busy over the" in out
    assert "function calls a call" in out and "_apply_arrivals" in out and "advance" in out, out


def test_uss_counts_pages_this_process_writes():
    import numpy as np

    before = uss_bytes()
    block = np.ones(32 << 20, np.uint8)  # 32 MiB written: private, dirty
    assert uss_bytes() - before >= 30 << 20
    del block
