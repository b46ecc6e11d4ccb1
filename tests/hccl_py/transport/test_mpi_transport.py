"""The MPI transport under a real ``mpiexec`` (the mpich wheel's, installed by ``.[mpi]``): the
same results and the same modeled clocks as under hccl-launch, and HCCL_EXEC_TIMEOUT still fires."""

from __future__ import annotations

import importlib.util
import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

SCRIPTS = Path(__file__).resolve().parent / "scripts"
JOB = SCRIPTS / "transport_job.py"


def _mpiexec() -> str | None:
    """The mpiexec beside this interpreter (the mpich wheel's, matching mpi4py), else on PATH."""
    beside = Path(sys.executable).parent / "mpiexec"
    return str(beside) if beside.exists() else shutil.which("mpiexec")


MPIEXEC = _mpiexec()
pytestmark = [
    pytest.mark.skipif(
        importlib.util.find_spec("mpi4py") is None,
        reason="mpi4py is not installed (pip install -e '.[mpi]'; `make test` installs it)",
    ),
    pytest.mark.skipif(
        MPIEXEC is None, reason="no mpiexec next to this Python or on PATH (the mpich wheel brings one)"
    ),
    pytest.mark.usefixtures("no_leaks"),
]


def _env(**extra: str) -> dict[str, str]:
    env = {
        k: v
        for k, v in os.environ.items()
        if not k.startswith(("HCCL_", "PMI_", "OMPI_", "SLURM_"))
        and k not in ("RANK", "WORLD_SIZE", "RANK_ID", "RANK_SIZE")
    }
    env.update(extra)
    return env


def _results(out: Path, n: int) -> list[dict]:
    return [json.loads((out / f"rank_{r}.json").read_text()) for r in range(n)]


@pytest.mark.timeout(90)
def test_mpiexec_gives_the_results_and_clocks_of_hccl_launch(tmp_path: Path) -> None:
    n = 3
    mpi = subprocess.run(
        [MPIEXEC, "-n", str(n), sys.executable, str(JOB), "--out", str(tmp_path / "mpi")],
        env=_env(),
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert mpi.returncode == 0, mpi.stdout + mpi.stderr
    assert "hccl-py: transport mpi (MPICH" in mpi.stderr and f"{n} ranks, 1 host)" in mpi.stderr, mpi.stderr
    assert mpi.stderr.count("hccl-py: transport") == 1  # once per job, by rank 0
    shm = subprocess.run(
        [sys.executable, "-m", "launch.cli", "-n", str(n), str(JOB), "--out", str(tmp_path / "shm")],
        env=_env(),
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert shm.returncode == 0, shm.stdout + shm.stderr
    assert "[0] hccl-py: transport shm (3 ranks, 1 host)" in shm.stderr
    by_mpi, by_shm = _results(tmp_path / "mpi", n), _results(tmp_path / "shm", n)
    assert by_mpi == by_shm  # same digests of every result, same modeled clock after every call
    assert len({r["digest"] for r in by_mpi}) == n and all(len(r["clocks"]) == 14 for r in by_mpi[:1])


# Each rank writes what happened to <out>/rank_<r>.json (mpiexec merges the ranks' stdout, and a
# line may not end where the other rank's begins).
TIMEOUT_PROGRAM = """
import json, os, sys, time, numpy as np, hccl_py
mode, out = sys.argv[1], sys.argv[2]

def report(rank, what):
    with open(os.path.join(out, f"rank_{rank}.json.tmp"), "w") as f:
        json.dump(what, f)
    os.replace(os.path.join(out, f"rank_{rank}.json.tmp"), os.path.join(out, f"rank_{rank}.json"))

comm = hccl_py.init()
try:
    if mode == "skip":                 # rank 1 never enters the allreduce ...
        if comm.rank != 1:
            comm.all_reduce(np.ones(4, np.float32))
        else:                          # ... and stays until rank 0 has its error, however long that takes
            while not os.path.exists(os.path.join(out, "rank_0.json")):
                time.sleep(0.02)
    else:                              # the ranks disagree on the count
        comm.all_reduce(np.ones(4 + comm.rank, np.float32))
    report(comm.rank, {"class": None})
except hccl_py.HcclError as err:
    report(comm.rank, {"class": type(err).__name__, "code": int(err.code),
                       **{k: err.fields.get(k) for k in ("op", "seq", "comm", "ranks")}})
"""


def _reports(out: Path, n: int) -> list[dict]:
    return [json.loads((out / f"rank_{r}.json").read_text()) for r in range(n)]


@pytest.mark.timeout(60)
def test_exec_timeout_fires_under_mpi(tmp_path: Path) -> None:
    done = subprocess.run(
        [MPIEXEC, "-n", "2", sys.executable, "-c", TIMEOUT_PROGRAM, "skip", str(tmp_path)],
        env=_env(HCCL_EXEC_TIMEOUT="1"),
        capture_output=True,
        text=True,
        timeout=40,
    )
    assert done.returncode == 0, done.stdout + done.stderr
    rank0, rank1 = _reports(tmp_path, 2)
    assert rank1 == {"class": None}
    assert rank0 == {"class": "HcclTimeoutError", "code": 9, "op": "allreduce", "seq": 1, "comm": "world", "ranks": [1]}


@pytest.mark.timeout(60)
def test_mismatched_calls_fail_on_every_rank_under_mpi(tmp_path: Path) -> None:
    done = subprocess.run(
        [MPIEXEC, "-n", "2", sys.executable, "-c", TIMEOUT_PROGRAM, "mismatch", str(tmp_path)],
        env=_env(HCCL_EXEC_TIMEOUT="20"),
        capture_output=True,
        text=True,
        timeout=40,
    )
    assert done.returncode == 0, done.stdout + done.stderr
    for report in _reports(tmp_path, 2):
        assert (report["class"], report["code"], report["op"], report["seq"]) == (
            "HcclParamError",
            1,
            "allreduce",
            1,
        ), report


@pytest.mark.timeout(60)
def test_shm_override_under_mpiexec_meets_through_mpi(tmp_path: Path) -> None:
    """HCCL_PY_TRANSPORT=shm under mpiexec: rank 0 hosts the store, its port travels over MPI."""
    done = subprocess.run(
        [MPIEXEC, "-n", "2", sys.executable, str(JOB), "--out", str(tmp_path)],
        env=_env(HCCL_PY_TRANSPORT="shm"),
        capture_output=True,
        text=True,
        timeout=40,
    )
    assert done.returncode == 0, done.stdout + done.stderr
    assert "hccl-py: transport shm (2 ranks, 1 host)" in done.stderr
    assert len(_results(tmp_path, 2)) == 2


NO_INIT_PROGRAM = """
import os, sys, time
from mpi4py import MPI
import hccl_py
done = os.path.join(sys.argv[1], "rank_0.txt")
if MPI.COMM_WORLD.rank == 1:           # in the MPI job, but never calls hccl_py.init() ...
    while not os.path.exists(done):    # ... and stays until rank 0 has its error
        time.sleep(0.02)
    sys.exit(0)
try:
    hccl_py.init()
    outcome = "joined"
except hccl_py.HcclTimeoutError as err:
    outcome = f"{type(err).__name__} {int(err.code)}: {err.message}"
with open(done + ".tmp", "w") as f:
    f.write(outcome)
os.replace(done + ".tmp", done)
"""


@pytest.mark.timeout(60)
def test_connect_timeout_holds_under_mpi(tmp_path: Path) -> None:
    done = subprocess.run(
        [MPIEXEC, "-n", "2", sys.executable, "-c", NO_INIT_PROGRAM, str(tmp_path)],
        env=_env(HCCL_CONNECT_TIMEOUT="1"),
        capture_output=True,
        text=True,
        timeout=40,
    )
    assert done.returncode == 0, done.stdout + done.stderr
    outcome = (tmp_path / "rank_0.txt").read_text()
    assert outcome.startswith("HcclTimeoutError 9: "), outcome
    # (this error has no fields to name the missing ranks: MPI does not say which did not call)
    assert "not every rank of MPI_COMM_WORLD (2 ranks) called hccl_py.init() within HCCL_CONNECT_TIMEOUT" in outcome
