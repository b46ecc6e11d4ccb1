"""Shared pytest setup: the repository root on sys.path and the ``no_leaks`` fixture.

Use it on any test that starts processes or creates shared memory::

    @pytest.mark.timeout(30)
    @pytest.mark.usefixtures("no_leaks")      # or: @pytest.mark.no_leaks
    def test_crash_is_cleaned_up(): ...

or for a whole module: ``pytestmark = pytest.mark.usefixtures("no_leaks")``, or for a whole
folder, in its conftest.py::

    @pytest.fixture(autouse=True)
    def _leak_check(no_leaks): ...
"""

from __future__ import annotations

import os
import shutil
import signal
import sys
import tempfile
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
if str(ROOT) not in sys.path:
    # `from tests.mp import run_ranks` and the top-level packages work whatever the cwd; ranks
    # started by launch.spawn inherit this sys.path.
    sys.path.insert(0, str(ROOT))

from tests.mp import child_pids, describe_pid, job_dirs, shm_entries  # noqa: E402  (needs the path above)

# Time for the OS / multiprocessing to reap children and for unlinks to land: a liveness bound,
# waited out only when something is really left behind, so generous for a loaded machine.
LEAK_GRACE_S = 10.0


def pytest_configure(config: pytest.Config) -> None:
    config.addinivalue_line(
        "markers",
        "no_leaks: fail the test if it leaves child processes, new /dev/shm entries or job socket directories behind",
    )
    # This session's own run directory (job sockets, the per-user store secret), inherited by
    # every rank: the user's real one is never touched, and other jobs on a shared machine
    # never show up as this session's leaks.
    os.environ["HCCL_PY_RUN_DIR"] = tempfile.mkdtemp(prefix="hccl-tests-")


def pytest_unconfigure(config: pytest.Config) -> None:
    run_dir = os.environ.pop("HCCL_PY_RUN_DIR", None)
    if run_dir and os.path.basename(run_dir).startswith("hccl-tests-"):
        shutil.rmtree(run_dir, ignore_errors=True)


def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    # @pytest.mark.no_leaks is shorthand for @pytest.mark.usefixtures("no_leaks").
    for item in items:
        if (
            isinstance(item, pytest.Function)
            and item.get_closest_marker("no_leaks") is not None
            and "no_leaks" not in item.fixturenames
        ):
            item.fixturenames.append("no_leaks")


def _in_use_elsewhere(names: set[str], ours: set[int]) -> set[str]:
    """Which /dev/shm ``names`` are mapped or open by processes outside this test's tree.

    The machine is shared: other jobs' segments appear in /dev/shm during our test. A segment
    some live foreign process holds is theirs (or still in use), not a leak of ours.
    """
    held: set[str] = set()
    for entry in os.listdir("/proc"):
        if not entry.isdigit() or int(entry) in ours:
            continue
        try:
            with open(f"/proc/{entry}/maps", "rb") as f:
                maps = f.read()
            for line in maps.splitlines():
                at = line.find(b"/dev/shm/")
                if at >= 0:
                    held.add(line[at + 9 :].split(b" ")[0].decode(errors="replace"))
            for fd in os.listdir(f"/proc/{entry}/fd"):
                target = os.readlink(f"/proc/{entry}/fd/{fd}")
                if target.startswith("/dev/shm/"):
                    held.add(target[9:].split(" ")[0])
        except OSError:
            continue  # exited, or not ours to read
    return names & held


@pytest.fixture
def no_leaks() -> Iterator[None]:
    """After the test: no new child processes, no new /dev/shm entries and no job socket
    directories (``hccl_py/rundir.py``) may remain.

    Waits up to LEAK_GRACE_S for stragglers to be reaped/unlinked, then fails naming them.
    Leaked processes are SIGKILLed so they cannot disturb later tests.
    """
    shm_before = shm_entries()
    kids_before = child_pids()
    dirs_before = job_dirs()
    yield
    deadline = time.monotonic() + LEAK_GRACE_S
    while True:
        kids = child_pids() - kids_before
        # Python's multiprocessing semaphores (sem.mp-*) are left out: any Python program's
        # multiprocessing makes them (torch's mp.spawn, another test worker's pool), an exited
        # program's stay until its resource tracker unlinks them, and nothing tells whose they are.
        # hccl-py's own segments and torch's tensors (torch_*) are checked.
        shm = {name for name in shm_entries() - shm_before if not name.startswith("sem.mp-")}
        if shm:
            shm -= _in_use_elsewhere(shm, {os.getpid(), *child_pids(include_helpers=True)})
        dirs = job_dirs() - dirs_before
        if (not kids and not shm and not dirs) or time.monotonic() >= deadline:
            break
        time.sleep(0.05)
    problems = []
    if kids:
        problems.append("leaked processes: " + "; ".join(describe_pid(p) for p in sorted(kids)))
        for pid in kids:
            try:
                os.kill(pid, signal.SIGKILL)
            except ProcessLookupError:
                pass
    if shm:
        problems.append(f"leaked /dev/shm entries: {sorted(shm)}")
    if dirs:
        problems.append(f"leaked job socket directories: {sorted(dirs)} (with {[os.listdir(d) for d in sorted(dirs)]})")
    if problems:
        pytest.fail("\n".join(problems), pytrace=False)
