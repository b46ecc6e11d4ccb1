"""How ranks meet and who belongs to a job (issue 13 items 4 and 8): the job identity, atomic
rank claims, two jobs on one MASTER_PORT, the store secret at init, and staggered re-init."""

from __future__ import annotations

import json
import os
import signal
import socket
import subprocess
import sys
import time
from pathlib import Path

import numpy as np
import pytest

import launch
from hccl_py import env, rundir
from hccl_py.rendezvous.store import StoreServer
from tests.mp import job_dirs, run_ranks

ROOT = Path(__file__).resolve().parents[2]


def test_the_launchers_job_id_wins_else_torchrun_else_slurm() -> None:
    assert env.launcher_job_id({"HCCL_PY_JOB_ID": "a1", "TORCHELASTIC_RUN_ID": "r", "SLURM_JOB_ID": "5"}) == (
        "a1",
        "HCCL_PY_JOB_ID",
    )
    assert env.launcher_job_id({"TORCHELASTIC_RUN_ID": "r7"}) == ("torchrun-r7", "TORCHELASTIC_RUN_ID")
    assert env.launcher_job_id({"TORCHELASTIC_RUN_ID": "none"}) is None  # torchrun's default: not an identity
    assert env.launcher_job_id({"SLURM_JOB_ID": "812", "SLURM_STEP_ID": "0"})[0] == "slurm-812.0"
    assert env.launcher_job_id({"SLURM_JOB_ID": "812"}) is None  # a batch script, not a step
    assert env.launcher_job_id({}) is None


# -- by hand: RANK/WORLD_SIZE/MASTER_* set, rank 0 hosts the store -------------------------------

RANK_SCRIPT = """
import json, os, sys
import numpy as np
import hccl_py
try:
    comm = hccl_py.init()
except hccl_py.HcclError as err:
    print(json.dumps({"class": type(err).__name__, "code": int(err.code), "holder": getattr(err, "holder", None),
                      "store_job_id": getattr(err, "store_job_id", None)}), flush=True)
    sys.exit(3)
print(json.dumps({"ready": os.getpid()}), flush=True)
sys.stdin.readline()  # the test says when to go on
x = np.full(4, comm.rank + 1, np.float32)
comm.all_reduce(x)
print(json.dumps({"sum": float(x[0])}), flush=True)
comm.destroy()
"""


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _by_hand_env(rank: int, size: int, port: int, **extra: str) -> dict[str, str]:
    """A rank started by hand (torchrun style): no launcher variables, this session's run dir."""
    base = {
        k: v
        for k, v in os.environ.items()
        if not k.startswith(("HCCL_", "PMI_", "OMPI_", "SLURM_", "TORCHELASTIC_"))
        and k not in ("RANK", "WORLD_SIZE", "RANK_ID", "RANK_SIZE", "LOCAL_RANK", "LOCAL_WORLD_SIZE")
    }
    return {
        **base,
        "HCCL_PY_RUN_DIR": os.environ["HCCL_PY_RUN_DIR"],
        "RANK": str(rank),
        "WORLD_SIZE": str(size),
        "MASTER_ADDR": "127.0.0.1",
        "MASTER_PORT": str(port),
        "HCCL_CONNECT_TIMEOUT": "20",
        "PYTHONPATH": str(ROOT),
        **extra,
    }


def _reap(procs: list[subprocess.Popen[str]]) -> None:
    """Kill and wait for whichever of ``procs`` still runs (a test's finally: nothing outlives it)."""
    for p in procs:
        if p.poll() is None:
            p.kill()
            p.communicate()


def _start(script: str, rank: int, size: int, port: int, **extra: str) -> subprocess.Popen[str]:
    return subprocess.Popen(
        [sys.executable, "-c", script],
        env=_by_hand_env(rank, size, port, **extra),
        text=True,
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
    )


def _line(proc: subprocess.Popen[str]) -> dict:
    line = proc.stdout.readline()
    assert line, f"no output; stderr: {proc.stderr.read()}"
    return json.loads(line)


@pytest.mark.timeout(90)
@pytest.mark.usefixtures("no_leaks")
def test_a_second_job_on_the_same_port_is_refused_and_the_first_stays_right() -> None:
    port = _free_port()
    first = [_start(RANK_SCRIPT, r, 2, port) for r in range(2)]
    others: list[subprocess.Popen[str]] = []
    try:
        ready = [_line(p)["ready"] for p in first]
        # The second job, started by hand on the same port: its rank 0 cannot host the store;
        # its rank 1 reaches the first job's store and finds rank 1 taken; a rank that names
        # its own job is refused by the store's job id; one with another secret at the handshake.
        others = [
            _start(RANK_SCRIPT, 0, 2, port),
            _start(RANK_SCRIPT, 1, 2, port),
            _start(RANK_SCRIPT, 1, 2, port, HCCL_PY_JOB_ID="second-job"),
            _start(RANK_SCRIPT, 1, 2, port, HCCL_PY_JOB_SECRET="not-the-first-jobs"),
        ]
        outcomes = [_line(p) for p in others]
        for p in others:
            assert p.wait(timeout=20) == 3
        assert [(o["class"], o["code"]) for o in outcomes] == [("HcclConnectError", 11)] * 4, outcomes
        assert outcomes[1]["holder"]["pid"] == ready[1]  # names the process that holds rank 1
        assert outcomes[2]["store_job_id"] not in (None, "second-job")
        for p in first:
            p.stdin.write("go\n")
            p.stdin.flush()
        assert [_line(p) for p in first] == [{"sum": 3.0}, {"sum": 3.0}]
        assert [p.wait(timeout=20) for p in first] == [0, 0]
    finally:
        for p in first + others:
            if p.poll() is None:
                p.kill()
            p.communicate()


def _wrong_store(port: int) -> str:
    import hccl_py
    from hccl_py import env

    os.environ[env.STORE_PORT] = str(port)  # another job's store, which this job's secret opens
    try:
        hccl_py.init()
    except hccl_py.HcclConnectError as err:
        return err.store_job_id
    return "joined"


@pytest.mark.timeout(60)
@pytest.mark.usefixtures("no_leaks")
def test_ranks_refuse_a_store_of_another_job_at_once() -> None:
    with StoreServer(job_id="someone-elses", secret="shared-by-mistake") as other:
        assert (
            run_ranks(_wrong_store, 2, other.port, env={"HCCL_PY_JOB_SECRET": "shared-by-mistake"}, timeout=40)
            == ["someone-elses"] * 2
        )


# -- destroy, then init again, at different moments (like torch's destroy/init_process_group) ----


def _staggered(rounds: int) -> list[float]:
    import hccl_py

    rank = int(os.environ.get("RANK", "0"))
    sums = []
    for g in range(rounds):
        comm = hccl_py.init()
        x = np.full(4, rank + 1 + g, np.float32)
        y = np.full(100_000, rank + 1 + g, np.float32)  # through the shared-memory slots
        comm.all_reduce(x)
        comm.all_reduce(y)
        sums.append(float(x[0]) if x[0] == y[-1] else -1.0)
        comm.destroy()
        time.sleep(0.4 * rank)  # rank 0 is back first and waits for the others
    return sums


@pytest.mark.timeout(90)
@pytest.mark.usefixtures("no_leaks")
def test_staggered_reinit_under_spawn() -> None:
    expected = [6.0 + 3 * g for g in range(3)]
    assert run_ranks(_staggered, 3, 3, timeout=60) == [expected] * 3


@pytest.mark.timeout(90)
@pytest.mark.usefixtures("no_leaks")
def test_staggered_reinit_by_hand_and_rank_0_sweeps_dead_jobs() -> None:
    """Rank 0 hosts the store and keeps it through the generations. It also removes the socket
    directory a crashed job of this user left (no launcher was there to)."""
    stale, dead_sock = rundir.job_dir("crashed-job", create=True), socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM)
    dead_sock.bind(os.path.join(stale, "g1.0.99999"))
    dead_sock.close()
    past = time.time() - 3600
    os.utime(stale, (past, past))
    port = _free_port()
    script = (
        "import json, sys; sys.path.insert(0, %r)\n"
        "from tests.hccl_py.test_rendezvous import _staggered\n"
        "print(json.dumps(_staggered(3)), flush=True)\n"
    ) % str(ROOT)
    procs = [_start(script, r, 3, port) for r in range(3)]
    try:
        outs = [p.communicate(timeout=60) for p in procs]
    finally:
        _reap(procs)
    assert [p.returncode for p in procs] == [0, 0, 0], [err for _, err in outs]
    assert [json.loads(out) for out, _ in outs] == [[6.0, 9.0, 12.0]] * 3
    assert not os.path.exists(stale)


SIGTERMED_SCRIPT = """
import json, os, signal, sys
import numpy as np
import hccl_py
if os.environ["RANK"] == "1":  # a program with its own SIGTERM handler: it still runs, after ours
    def stop(signum, frame):
        print(json.dumps({"own handler": True}), flush=True)
        sys.exit(3)
    signal.signal(signal.SIGTERM, stop)
comm = hccl_py.init()
comm.all_reduce(np.ones(4, np.float32))
print(json.dumps({"ready": os.getpid()}), flush=True)
sys.stdin.readline()  # stopped here, as torchrun stops its workers
"""


@pytest.mark.timeout(90)
@pytest.mark.usefixtures("no_leaks")
def test_ranks_stopped_by_sigterm_remove_their_sockets() -> None:
    """torchrun and mp.spawn stop workers with SIGTERM, which skips Python's clean-up: the ranks'
    socket files must go all the same, and a program's own SIGTERM handler still runs."""
    before = job_dirs()
    port = _free_port()
    procs = [_start(SIGTERMED_SCRIPT, r, 2, port, LOCAL_RANK=str(r)) for r in range(2)]
    try:
        for p in procs:
            _line(p)
        assert len(job_dirs() - before) == 1  # the job's sockets are there while it runs
        for p in procs:
            p.send_signal(signal.SIGTERM)
        outs = [p.communicate(timeout=30) for p in procs]
    finally:
        _reap(procs)
    assert [p.returncode for p in procs] == [-signal.SIGTERM, 3], [err for _, err in outs]
    assert json.loads(outs[1][0]) == {"own handler": True}
    assert job_dirs() == before  # no socket left, no directory


@pytest.mark.timeout(90)
@pytest.mark.usefixtures("no_leaks")
def test_the_first_rank_of_a_host_sweeps_dead_jobs_at_start_whoever_hosts_the_store() -> None:
    """Under torchrun the store is the agent's and LOCAL_RANK 0 is not always rank 0: the first
    rank of the host sweeps: a dead torchrun job's sockets (no launcher mark) and a killed
    launcher's job."""
    stale = {}
    for job, mark in (("sigkilled-torchrun-job", None), ("killed-launcher-job", "launcher.999999")):
        path = rundir.job_dir(job, create=True)
        dead = socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM)
        dead.bind(os.path.join(path, "g1.0.99998"))
        dead.close()
        if mark is not None:
            with open(os.path.join(path, mark), "w") as f:
                f.write("another-boot  1")
        past = time.time() - 3600
        os.utime(path, (past, past))
        stale[job] = path
    port = _free_port()
    procs = [_start(RANK_SCRIPT, r, 2, port, LOCAL_RANK=str(1 - r)) for r in range(2)]
    try:
        for p in procs:
            _line(p)
        for p in procs:
            p.stdin.write("go\n")
            p.stdin.flush()
        outs = [p.communicate(timeout=30) for p in procs]
    finally:
        _reap(procs)
    assert [p.returncode for p in procs] == [0, 0], [err for _, err in outs]
    assert [os.path.exists(path) for path in stale.values()] == [False, False]


def _killed_after_init() -> None:
    import hccl_py

    comm = hccl_py.init()
    if comm.rank == 1:
        os.kill(os.getpid(), signal.SIGKILL)
    comm.all_reduce(np.ones(4, np.float32))


@pytest.mark.timeout(60)
@pytest.mark.usefixtures("no_leaks")
def test_spawn_removes_the_socket_directory_of_killed_ranks() -> None:
    before = job_dirs()
    with pytest.raises(launch.SpawnError):
        run_ranks(_killed_after_init, 2, timeout=40)
    assert job_dirs() == before
