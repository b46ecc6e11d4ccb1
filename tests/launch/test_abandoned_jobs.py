"""Sockets of a job whose launcher was SIGKILLed (the launcher cleans up nothing, its ranks die
by PR_SET_PDEATHSIG and leave their socket files) are removed by the launcher's watchdog, or, if
that was killed too, by the next launch; a live job's never are (hccl_py/rundir.py:
claim_job, sweep_abandoned; launch/_watchdog.py)."""

from __future__ import annotations

import os
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
from collections.abc import Iterator
from pathlib import Path

import pytest

from hccl_py import env, rundir
from tests.mp import assert_gone, descendants, job_dirs, read_pids, wait_for_files, wait_until

ROOT = Path(__file__).resolve().parents[2]
SCRIPTS = Path(__file__).resolve().parent / "scripts"


def _env() -> dict[str, str]:
    return {**os.environ, "PYTHONPATH": str(ROOT)}


def _launcher(*args: str) -> list[str]:
    return [sys.executable, "-m", "launch.cli", *args]


def _blocking_job(pid_dir: Path) -> subprocess.Popen:
    """hccl-launch with 2 ranks that init (bind their sockets), write their pids and block."""
    command = _launcher("-n", "2", str(SCRIPTS / "ranks.py"), "--init", "--block", "--pid-dir", str(pid_dir))
    return subprocess.Popen(command, env=_env(), cwd=ROOT, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)


def _another_launch() -> subprocess.CompletedProcess[str]:
    """A one-rank hccl-launch job that runs to its end."""
    return subprocess.run(
        _launcher("-n", "1", str(SCRIPTS / "print_env.py")),
        env=_env(),
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=60,
    )


def _sockets(folder: str) -> list[str]:
    return sorted(n for n in os.listdir(folder) if n.startswith("g"))


def _watchdog_of(launcher: subprocess.Popen) -> int:
    """The pid of the launcher's watchdog (launch/_watchdog.py, a child in a session of its own)."""

    def find() -> int | None:
        for pid in descendants(launcher.pid):
            try:
                with open(f"/proc/{pid}/cmdline", "rb") as f:
                    if b"_watchdog.py" in f.read():
                        return pid
            except OSError:
                pass
        return None

    return wait_until(find, "the launcher's watchdog")


@pytest.mark.timeout(120)
@pytest.mark.usefixtures("no_leaks")
@pytest.mark.parametrize("watchdog_too", [False, True], ids=["launcher", "launcher-and-watchdog"])
def test_the_sockets_of_a_sigkilled_launchers_job_are_removed(tmp_path: Path, watchdog_too: bool) -> None:
    """The watchdog removes them once the ranks are gone; if it was killed too, the next launch.
    The launcher's flight folder lives in the job's directory and goes with it (nothing is left in
    the temporary directory either)."""
    before = job_dirs()
    temporary_before = set(Path(tempfile.gettempdir()).glob("hccl-launch-*"))
    killed = _blocking_job(tmp_path)
    pids: set[int] = set()
    try:
        pids = read_pids(wait_for_files(tmp_path, "rank_*.pid", 2, within=60))
        (job,) = job_dirs() - before
        assert len(_sockets(job)) == 2
        assert [name for name in os.listdir(job) if name.startswith("flight.")] == [f"flight.{killed.pid}"]
        if watchdog_too:
            dog = _watchdog_of(killed)
            os.kill(dog, signal.SIGKILL)
            assert_gone({dog})
        killed.kill()  # no chance to clean up; the ranks die by PDEATHSIG and leave their sockets
        killed.wait()
        assert_gone(pids)
    finally:
        if killed.poll() is None:
            killed.kill()
            killed.wait()
    if not watchdog_too:
        wait_until(lambda: not os.path.exists(job), f"the watchdog removes {job}")
        return
    assert len(_sockets(job)) == 2  # what a SIGKILLed launcher and watchdog leave behind
    done = _another_launch()
    assert done.returncode == 0, done.stderr
    assert not os.path.exists(job), os.listdir(job)
    assert set(Path(tempfile.gettempdir()).glob("hccl-launch-*")) == temporary_before


@pytest.mark.timeout(120)
@pytest.mark.usefixtures("no_leaks")
def test_the_next_launch_leaves_a_live_jobs_sockets_alone(tmp_path: Path) -> None:
    before = job_dirs()
    live = _blocking_job(tmp_path)
    try:
        pids = read_pids(wait_for_files(tmp_path, "rank_*.pid", 2, within=60))
        (job,) = job_dirs() - before
        sockets = _sockets(job)
        done = _another_launch()
        assert done.returncode == 0, done.stderr
        assert _sockets(job) == sockets and len(sockets) == 2
        live.send_signal(signal.SIGINT)
        live.wait(timeout=60)
        assert_gone(pids)
    finally:
        if live.poll() is None:
            live.kill()
            live.wait()


@pytest.fixture
def run_dir(monkeypatch: pytest.MonkeyPatch) -> Iterator[str]:
    """A private run directory of this test alone (short: socket paths are limited to 107 bytes)."""
    path = tempfile.mkdtemp(prefix="hccl-abandon-")
    monkeypatch.setenv(env.RUN_DIR, path)
    yield path
    shutil.rmtree(path, ignore_errors=True)


def _claimed_by_a_dead_process(job_id: str) -> None:
    pid = os.fork()
    if pid == 0:
        os._exit(0 if rundir.claim_job(job_id) else 1)
    _, status = os.waitpid(pid, 0)  # reaped: that pid is gone
    assert os.waitstatus_to_exitcode(status) == 0


def _bound(job_id: str, name: str) -> socket.socket:
    sock = socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM)
    rundir.bind(sock, job_id, name)
    return sock


def _marks(job_id: str) -> set[str]:
    return {n for n in os.listdir(rundir.job_dir(job_id)) if n.startswith(rundir.LAUNCHER_MARK)}


@pytest.mark.timeout(30)
def test_sweep_removes_only_dead_sockets_of_jobs_whose_launchers_are_all_gone(run_dir: str) -> None:
    _claimed_by_a_dead_process("deadjob")
    _bound("deadjob", "g1.0.1").close()  # a socket file nobody listens on (its rank was killed)
    listening = _bound("deadjob", "g1.1.2")  # a rank that still runs: never removed
    assert rundir.claim_job("livejob")  # this process: a live launcher
    _bound("livejob", "g1.0.3").close()
    _claimed_by_a_dead_process("twojobs")
    assert rundir.claim_job("twojobs")  # one of two launchers (two nodes on one host) still runs
    _bound("twojobs", "g1.0.4").close()
    os.mkdir(os.path.join(run_dir, "nomark"))  # a job without a launcher (sweep_stale's business)
    try:
        assert rundir.sweep_abandoned() == []
        assert sorted(os.listdir(os.path.join(run_dir, "deadjob"))) == ["g1.1.2", next(iter(_marks("deadjob")))]
        assert sorted(os.listdir(os.path.join(run_dir, "livejob"))) == ["g1.0.3", f"launcher.{os.getpid()}"]
        assert len(os.listdir(os.path.join(run_dir, "twojobs"))) == 3
        assert os.path.isdir(os.path.join(run_dir, "nomark"))
    finally:
        listening.close()
    assert rundir.sweep_abandoned(keep="deadjob") == []  # kept: it is the caller's own job
    assert rundir.sweep_abandoned() == [os.path.join(run_dir, "deadjob")]
    rundir.remove_job("livejob")  # the launcher's own end: its mark and dead sockets go
    assert not os.path.exists(os.path.join(run_dir, "livejob"))
    rundir.remove_job("twojobs")
    assert rundir.sweep_abandoned() == [os.path.join(run_dir, "twojobs")]


@pytest.mark.timeout(30)
def test_a_mark_from_another_boot_or_a_reused_pid_is_a_dead_launcher(run_dir: str) -> None:
    mark = rundir.claim_job("job")
    assert mark is not None
    boot, namespace, start = Path(mark).read_text().split(" ")
    assert rundir._launcher_alive(mark) is True
    Path(mark).write_text(f"{boot} {namespace} {int(start) + 1}")  # this pid, another process
    assert rundir._launcher_alive(mark) is False
    Path(mark).write_text(f"not-this-boot {namespace} {start}")
    assert rundir._launcher_alive(mark) is False
    Path(mark).write_text(f"{boot} pid:[1] {start}")  # another pid namespace: cannot tell
    assert rundir._launcher_alive(mark) is None
    rundir.remove_job("job")
