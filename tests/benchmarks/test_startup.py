"""The start-up benchmark runs both jobs for real and prints the table it documents."""

from __future__ import annotations

import pytest

from benchmarks.peers.mpi import find_mpiexec
from benchmarks.startup import main


@pytest.mark.timeout(120)
def test_startup_prints_import_time_and_both_jobs(capsys):
    assert main(["-n", "2", "--repeats", "1"]) == 0
    out = capsys.readouterr().out
    assert "# import hccl_py:" in out
    row = [line.split() for line in out.splitlines() if line.strip().startswith("2 ")]
    assert len(row) == 1
    ranks, hccl_s, mpi_s, ratio, exec_s = row[0]
    assert float(hccl_s) > 0 and float(exec_s) > 0
    if find_mpiexec() is not None:  # the [mpi] extra: mpiexec ran the same job
        assert float(mpi_s) > 0 and float(ratio) > 0
