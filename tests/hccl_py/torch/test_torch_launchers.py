"""The backend's rendezvous as users start jobs, and hccl-py's diagnosis around torch programs:
torch's env:// by hand (rank 0's TCPStore is the only listener), plain ``hccl_py.init()`` under
torchrun (torchrun's agent store), and a fault injected under hccl-launch (the flight
recorders' report names it)."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

pytest.importorskip("torch")

from tests.mp import run_plain  # noqa: E402

ROOT = Path(__file__).resolve().parents[3]
SCRIPTS = Path(__file__).resolve().parent / "scripts"

pytestmark = pytest.mark.usefixtures("no_leaks")


def _env(**extra: str) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith(("HCCL_PY_STORE", "TORCHELASTIC"))}
    env["PYTHONPATH"] = os.pathsep.join([str(ROOT), env.get("PYTHONPATH", "")]).rstrip(os.pathsep)
    env["OMP_NUM_THREADS"] = "1"
    env.update(extra)
    return env


@pytest.mark.timeout(90)
def test_env_rendezvous_by_hand_meets_through_torchs_store():
    """RANK/WORLD_SIZE/MASTER_ADDR/MASTER_PORT set by hand, no launcher: torch's rank 0 binds
    MASTER_PORT, and hccl-py meets through that c10d store (it listens on nothing itself)."""
    done = run_plain(SCRIPTS / "allreduce_steps.py", 2, env=_env(), timeout=70)
    for rank, proc in enumerate(done):
        assert proc.returncode == 0, proc.stderr[-3000:]
        assert f"rank {rank}/2 sums [1.0, 3.0, 5.0]" in proc.stdout


@pytest.mark.timeout(90)
def test_plain_hccl_py_init_under_torchrun():
    done = subprocess.run(
        [sys.executable, "-m", "torch.distributed.run", "--nproc-per-node", "2", str(SCRIPTS / "plain_init.py")],
        env=_env(),
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=80,
    )
    assert done.returncode == 0, done.stderr[-3000:]
    assert "rank 0/2 sum 3" in done.stdout and "rank 1/2 sum 3" in done.stdout
    # torch's store client, not the adapter: a plain program registers no "hccl" backend
    assert done.stdout.count("adapter loaded: False") == 2, done.stdout


@pytest.mark.timeout(90)
def test_an_injected_crash_in_a_torch_program_is_diagnosed(tmp_path):
    done = subprocess.run(
        [
            sys.executable,
            "-m",
            "launch.cli",
            "-n",
            "2",
            "--log-dir",
            str(tmp_path),
            "--fault",
            "rank=1,op=allreduce,seq=2,action=crash",
            str(SCRIPTS / "allreduce_steps.py"),
        ],
        env=_env(),
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=80,
    )
    assert done.returncode == 1, done.stderr[-3000:]
    report = done.stderr
    assert "Root Cause (first observed failure)" in report and "rank       : 1" in report
    assert "Collective state (from the ranks' flight recorders)" in report, report
    assert "injected crash" in report and "allreduce #2" in report
    assert (tmp_path / "diagnosis.json").is_file()
