"""Multi-process test helpers shared by every test that needs real ranks.

    from tests.mp import run_ranks

    def _work(scale):                       # module level: ranks import it by name
        import hccl_py
        comm = hccl_py.init()
        return comm.rank * scale

    @pytest.mark.timeout(30)
    @pytest.mark.usefixtures("no_leaks")    # from tests/conftest.py
    def test_work():
        assert run_ranks(_work, 4, 10, timeout=20) == [0, 10, 20, 30]

A failing rank makes ``run_ranks`` raise ``launch.SpawnError`` (the first failure, with the rank's
traceback; ``err.exception`` is the rank's exception object when picklable), after every other
rank has been stopped.
"""

from __future__ import annotations

import json
import multiprocessing.forkserver
import multiprocessing.resource_tracker
import os
import select
import signal
import time
from collections.abc import Callable, Mapping
from typing import Any

import launch

__all__ = ["run_ranks", "shm_entries", "job_dirs", "child_pids", "process_state", "is_gone", "describe_pid",
           "mp_helper_pids", "run_as_nobody"]


def run_ranks(fn: Callable[..., Any], nprocs: int, *args: Any, env: Mapping[str, str] | None = None,
              timeout: float = 60) -> list[Any]:
    """``fn(*args)`` on ``nprocs`` ranks (``launch.spawn``); return values in rank order.

    ``env`` adds/overrides rank environment variables (e.g. ``{"HCCL_EXEC_TIMEOUT": "2"}``);
    ``timeout`` (seconds) bounds the whole call and raises ``launch.SpawnError`` naming the ranks
    that had not finished. Keep it below the test's ``@pytest.mark.timeout`` so the error says
    which rank hung instead of pytest-timeout's stack dump.
    """
    result = launch.spawn(fn, nprocs, args=args, env=env, timeout=timeout)
    assert isinstance(result, list)
    return result


def shm_entries() -> set[str]:
    """Names in /dev/shm now (POSIX shared memory and named semaphores)."""
    try:
        return set(os.listdir("/dev/shm"))
    except FileNotFoundError:
        return set()


def job_dirs() -> set[str]:
    """The job socket directories in this user's run directory now (HCCL_PY_RUN_DIR)."""
    from hccl_py.transport import rundir

    base = rundir.user_dir()
    return {os.path.join(base, name) for name in os.listdir(base) if os.path.isdir(os.path.join(base, name))}


def _ppid_map() -> dict[int, int]:
    parents: dict[int, int] = {}
    for entry in os.listdir("/proc"):
        if not entry.isdigit():
            continue
        try:
            with open(f"/proc/{entry}/stat", "rb") as f:
                stat = f.read()
        except OSError:
            continue  # exited while we looked
        # Fields after the command name; the name itself may contain spaces and ')'.
        fields = stat[stat.rfind(b")") + 2:].split()
        parents[int(entry)] = int(fields[1])
    return parents


def mp_helper_pids() -> set[int]:
    """multiprocessing's long-lived helpers (forkserver, resource tracker): not leaks."""
    helpers = set()
    forkserver_pid = getattr(multiprocessing.forkserver._forkserver, "_forkserver_pid", None)
    tracker_pid = getattr(multiprocessing.resource_tracker._resource_tracker, "_pid", None)
    for pid in (forkserver_pid, tracker_pid):
        if pid:
            helpers.add(pid)
    return helpers


def child_pids(include_helpers: bool = False) -> set[int]:
    """Pids of every descendant of this process (children, grandchildren, ...), from /proc.

    multiprocessing's forkserver and resource tracker are left out unless ``include_helpers``,
    but ranks forked by the forkserver are included (they are its children).
    """
    children: dict[int, list[int]] = {}
    for pid, ppid in _ppid_map().items():
        children.setdefault(ppid, []).append(pid)
    found: set[int] = set()
    todo = [os.getpid()]
    while todo:
        for child in children.get(todo.pop(), []):
            if child not in found:
                found.add(child)
                todo.append(child)
    return found if include_helpers else found - mp_helper_pids()


def process_state(pid: int) -> str | None:
    """The /proc state letter of ``pid`` ("R", "S", "Z" for a zombie, ...), ``None`` if gone."""
    try:
        with open(f"/proc/{pid}/stat", "rb") as f:
            stat = f.read()
    except OSError:
        return None
    return stat[stat.rfind(b")") + 2:].split()[0].decode()


def is_gone(pid: int) -> bool:
    """Whether ``pid`` no longer runs (exited, or a zombie nobody has reaped yet)."""
    return process_state(pid) in (None, "Z", "X")


def describe_pid(pid: int) -> str:
    """``"1234 (python -m foo) state S"`` for failure messages."""
    try:
        with open(f"/proc/{pid}/cmdline", "rb") as f:
            cmd = f.read().replace(b"\0", b" ").decode(errors="replace").strip()
    except OSError:
        cmd = "?"
    return f"{pid} ({cmd[:160]}) state {process_state(pid)}"


NOBODY = 65534


def run_as_nobody(fn: Callable[..., Any], *args: Any, timeout: float = 20) -> Any:
    """``fn(*args)`` in a forked child that first drops to the unprivileged user ``nobody``
    (uid and gid 65534, no supplementary groups): another local user, the attacker of the
    security tests. Its return value must be JSON-serialisable; an exception comes back as
    ``{"error": "Class: message"}``. Needs root (tests skip otherwise): root itself passes every
    permission check. The child only makes system calls (no zmq, no threads) and ``_exit``s.
    """
    read_end, write_end = os.pipe()
    pid = os.fork()
    if pid == 0:  # pragma: no cover - the child
        try:
            os.close(read_end)
            os.setgroups([])
            os.setgid(NOBODY)
            os.setuid(NOBODY)
            result: Any = {"ok": fn(*args)}
        except BaseException as exc:
            result = {"error": f"{type(exc).__name__}: {exc}"}
        try:
            os.write(write_end, json.dumps(result).encode())
        finally:
            os._exit(0)
    os.close(write_end)
    chunks = []
    deadline = time.monotonic() + timeout
    try:
        while (remaining := deadline - time.monotonic()) > 0:
            if not select.select([read_end], [], [], remaining)[0]:
                continue
            chunk = os.read(read_end, 65536)
            if not chunk:
                break
            chunks.append(chunk)
        else:
            os.kill(pid, signal.SIGKILL)
            raise TimeoutError(f"the child running as nobody did not finish within {timeout} s")
    finally:
        os.close(read_end)
        os.waitpid(pid, 0)
    result = json.loads(b"".join(chunks))
    if "error" in result:
        return result
    return result["ok"]
