"""Nothing a job started outlives it: a rank's children, children in other process groups and
orphaned grandchildren are gone after the job, whether it ends normally, on SIGTERM, or with its
launcher (hccl-launch, or the caller of launch.spawn) SIGKILLed.

Every rank starts a family (tests/launch/scripts/family.py) and records its pids in files; the
orphans cannot be found from the launcher's process tree, so the files are the record.
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
from pathlib import Path

import pytest

from tests.launch.scripts.family import start_family
from tests.mp import assert_gone, block_forever, descendants, kill_all, read_pids, run_ranks, wait_for_files

ROOT = Path(__file__).resolve().parents[2]
FAMILY = Path(__file__).resolve().parent / "scripts" / "family.py"
MEMBERS = 4  # the rank, a child in its group, a child in another group, an orphaned grandchild

pytestmark = pytest.mark.usefixtures("no_leaks")


def _env() -> dict[str, str]:
    return {
        **os.environ,
        "PYTHONPATH": os.pathsep.join([str(ROOT), os.environ.get("PYTHONPATH", "")]).rstrip(os.pathsep),
    }


def _launcher(pid_dir: Path, *args: str) -> list[str]:
    return [sys.executable, "-m", "launch.cli", "-n", "2", str(FAMILY), "--pid-dir", str(pid_dir), *args]


def _families(pid_dir: Path, ranks: int) -> set[int]:
    pids = read_pids(wait_for_files(pid_dir, "family_*.pids", ranks))
    assert len(pids) == ranks * MEMBERS
    return pids


def _stop(proc: subprocess.Popen, pids: set[int]) -> None:
    """Cleanup whatever happened: the process, and any family member that survived."""
    if proc.poll() is None:
        proc.kill()
    proc.wait()
    kill_all(pids)


@pytest.mark.timeout(90)
def test_sigkilled_launcher_leaves_nothing(tmp_path: Path) -> None:
    launcher = subprocess.Popen(
        _launcher(tmp_path), env=_env(), cwd=ROOT, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL
    )
    pids: set[int] = set()
    try:
        pids = _families(tmp_path, 2)
        pids |= descendants(launcher.pid)  # the ranks, their children, the launcher's helpers
        launcher.kill()  # no chance to clean up: the ranks' PDEATHSIG and the watchdog must
        launcher.wait()
        assert_gone(pids)
    finally:
        _stop(launcher, pids)


@pytest.mark.timeout(90)
def test_sigterm_to_the_launcher_leaves_nothing(tmp_path: Path) -> None:
    launcher = subprocess.Popen(
        _launcher(tmp_path), env=_env(), cwd=ROOT, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True
    )
    pids: set[int] = set()
    try:
        pids = _families(tmp_path, 2) | descendants(launcher.pid)
        launcher.send_signal(signal.SIGTERM)
        _, err = launcher.communicate(timeout=60)
        assert launcher.returncode == 128 + signal.SIGTERM, err
        assert_gone(pids)
    finally:
        _stop(launcher, pids)


@pytest.mark.timeout(90)
def test_ranks_that_exit_normally_leave_nothing(tmp_path: Path) -> None:
    done = subprocess.run(
        _launcher(tmp_path, "--then", "exit"), env=_env(), cwd=ROOT, capture_output=True, text=True, timeout=60
    )
    pids = _families(tmp_path, 2)
    try:
        assert done.returncode == 0, done.stderr
        assert_gone(pids)
    finally:
        kill_all(pids)


def _family_rank(pid_dir: str, then: str) -> list[int]:
    pids = start_family(int(os.environ["RANK_ID"]), pid_dir)
    if then == "block":
        block_forever()
    return pids


@pytest.mark.timeout(90)
def test_spawn_ranks_that_return_leave_nothing(tmp_path: Path) -> None:
    pids = {p for family in run_ranks(_family_rank, 2, str(tmp_path), "exit", timeout=60) for p in family}
    try:
        assert len(pids) == 2 * MEMBERS
        assert_gone(pids)
    finally:
        kill_all(pids)


CALLER = """
import sys
import launch
from tests.launch.test_no_orphans import _family_rank
launch.spawn(_family_rank, 2, args=(sys.argv[1], "block"))
"""


@pytest.mark.timeout(90)
def test_sigkilled_spawn_caller_leaves_nothing(tmp_path: Path) -> None:
    caller = subprocess.Popen(
        [sys.executable, "-c", CALLER, str(tmp_path)],
        env=_env(),
        cwd=ROOT,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )
    pids: set[int] = set()
    try:
        pids = _families(tmp_path, 2)
        pids |= descendants(caller.pid)  # forkserver, resource tracker, watchdog, ranks, children
        caller.kill()
        caller.wait()
        assert_gone(pids)
    finally:
        _stop(caller, pids)
