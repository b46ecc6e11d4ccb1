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

Tests never assert how long something took (speed is for benchmarks). Waits here are liveness
bounds: generous, and only reached when something is broken. To make a rank deterministically
late, have it wait for something that never comes (``block_forever``) or for a file another rank
writes (``wait_for_file``), never sleep a guessed time.
"""

from __future__ import annotations

import json
import multiprocessing.forkserver
import multiprocessing.resource_tracker
import os
import select
import signal
import socket
import subprocess
import sys
import time
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import Any

import launch
from launch.spawn import helper_pids as spawn_helper_pids

__all__ = [
    "run_ranks",
    "run_plain",
    "shm_entries",
    "job_dirs",
    "child_pids",
    "descendants",
    "process_state",
    "is_gone",
    "describe_pid",
    "mp_helper_pids",
    "wait_until",
    "wait_for_files",
    "wait_for_file",
    "read_pids",
    "assert_gone",
    "kill_all",
    "block_forever",
    "store_barrier",
    "run_as_nobody",
    "LIVENESS_S",
]

LIVENESS_S = 10.0  # how long a wait for something that must happen may take before the test fails


def run_ranks(
    fn: Callable[..., Any], nprocs: int, *args: Any, env: Mapping[str, str] | None = None, timeout: float = 60
) -> list[Any]:
    """``fn(*args)`` on ``nprocs`` ranks (``launch.spawn``); return values in rank order.

    ``env`` adds/overrides rank environment variables (e.g. ``{"HCCL_EXEC_TIMEOUT": "2"}``);
    ``timeout`` (seconds) bounds the whole call and raises ``launch.SpawnError`` naming the ranks
    that had not finished. Keep it below the test's ``@pytest.mark.timeout`` so the error says
    which rank hung instead of pytest-timeout's stack dump.
    """
    result = launch.spawn(fn, nprocs, args=args, env=env, timeout=timeout)
    assert isinstance(result, list)
    return result


ROOT = Path(__file__).resolve().parents[1]


def free_port() -> int:
    """A TCP port on 127.0.0.1 that was free a moment ago."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def run_plain(
    script,
    nprocs: int,
    *,
    env: Mapping[str, str] | None = None,
    timeout: float,
    port: int | None = None,
    ranks: range | None = None,
) -> list[subprocess.CompletedProcess]:
    """Start ``nprocs`` copies of ``script`` as torchrun would set them up (RANK, WORLD_SIZE,
    MASTER_ADDR, MASTER_PORT), without any launcher: rank 0 hosts the store. Returns each rank's
    completed process (stdout and stderr as text). ``timeout`` bounds the whole run; a rank
    still running then is killed and shows returncode -9. ``ranks`` starts only those ranks
    (of a world of ``nprocs``) on ``port``, e.g. to start one job in two halves.
    """
    port = free_port() if port is None else port
    procs = []
    for rank in range(nprocs) if ranks is None else ranks:
        rank_env = {
            **os.environ,
            **(env or {}),
            "RANK": str(rank),
            "WORLD_SIZE": str(nprocs),
            "MASTER_ADDR": "127.0.0.1",
            "MASTER_PORT": str(port),
            "PYTHONPATH": str(ROOT),
        }
        procs.append(
            subprocess.Popen(
                [sys.executable, str(script)], env=rank_env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True
            )
        )
    deadline = time.monotonic() + timeout
    results = []
    try:
        for proc in procs:
            try:
                out, err = proc.communicate(timeout=max(deadline - time.monotonic(), 0.1))
            except subprocess.TimeoutExpired:
                proc.kill()
                out, err = proc.communicate()
            results.append(subprocess.CompletedProcess(proc.args, proc.returncode, out, err))
    finally:
        for proc in procs:
            if proc.poll() is None:
                proc.kill()
                proc.wait()
    return results


STOP_GRACE_S = 5.0  # after SIGTERM, how long a timed-out command's processes get before SIGKILL


def run_command(
    cmd: list[str], *, timeout: float, env: Mapping[str, str] | None = None, cwd=None
) -> subprocess.CompletedProcess[str]:
    """``subprocess.run(cmd, capture_output=True, text=True, timeout=...)``, with the command in
    a session of its own so that a timeout stops every process it started, not only the first
    (hccl-npu execs its command, whose mp.spawn children or torchrun workers would be orphaned).
    SIGTERM first: multiprocessing's resource trackers ignore it, outlive their users and unlink
    their semaphores; SIGKILL for what is left after ``STOP_GRACE_S``. Then ``TimeoutExpired``
    is raised, as subprocess.run raises it."""
    proc = subprocess.Popen(
        cmd, env=env, cwd=cwd, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, start_new_session=True
    )
    try:
        out, err = proc.communicate(timeout=timeout)
    except subprocess.TimeoutExpired:
        _stop_session(proc.pid)
        out, err = proc.communicate()
        raise subprocess.TimeoutExpired(cmd, timeout, output=out, stderr=err) from None
    finally:
        if proc.poll() is None:  # interrupted (KeyboardInterrupt, pytest-timeout): stop it all the same
            _stop_session(proc.pid)
            proc.wait()
    return subprocess.CompletedProcess(cmd, proc.returncode, out, err)


def _stop_session(leader: int) -> None:
    """SIGTERM the process group of ``leader``, then SIGKILL whatever still runs after the grace."""
    try:
        os.killpg(leader, signal.SIGTERM)
    except ProcessLookupError:
        return
    deadline = time.monotonic() + STOP_GRACE_S
    while time.monotonic() < deadline:
        try:
            os.killpg(leader, 0)
        except ProcessLookupError:
            return
        time.sleep(0.05)
    try:
        os.killpg(leader, signal.SIGKILL)
    except ProcessLookupError:
        pass


def shm_entries() -> set[str]:
    """Names in /dev/shm now (POSIX shared memory and named semaphores)."""
    try:
        return set(os.listdir("/dev/shm"))
    except FileNotFoundError:
        return set()


def job_dirs() -> set[str]:
    """The job socket directories in this user's run directory now (HCCL_PY_RUN_DIR)."""
    from hccl_py import rundir

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
        fields = stat[stat.rfind(b")") + 2 :].split()
        parents[int(entry)] = int(fields[1])
    return parents


def mp_helper_pids() -> set[int]:
    """Long-lived helpers of this process (multiprocessing's forkserver and resource tracker,
    launch.spawn's watchdog): not leaks."""
    helpers = set(spawn_helper_pids())
    forkserver_pid = getattr(multiprocessing.forkserver._forkserver, "_forkserver_pid", None)
    tracker_pid = getattr(multiprocessing.resource_tracker._resource_tracker, "_pid", None)
    for pid in (forkserver_pid, tracker_pid):
        if pid:
            helpers.add(pid)
    return helpers


def descendants(root: int) -> set[int]:
    """Pids of every live descendant of ``root`` (children, grandchildren, ...), from /proc.

    An orphan (its parent died) is re-parented to init and is no longer found here: to follow
    such a process, have it record its pid in a file.
    """
    children: dict[int, list[int]] = {}
    for pid, ppid in _ppid_map().items():
        children.setdefault(ppid, []).append(pid)
    found: set[int] = set()
    todo = [root]
    while todo:
        for child in children.get(todo.pop(), []):
            if child not in found:
                found.add(child)
                todo.append(child)
    return found


def child_pids(include_helpers: bool = False) -> set[int]:
    """Pids of every descendant of this process (children, grandchildren, ...), from /proc.

    The long-lived helpers (``mp_helper_pids``) are left out unless ``include_helpers``, but
    ranks forked by the forkserver are included (they are its children).
    """
    found = descendants(os.getpid())
    return found if include_helpers else found - mp_helper_pids()


def process_state(pid: int) -> str | None:
    """The /proc state letter of ``pid`` ("R", "S", "Z" for a zombie, ...), ``None`` if gone."""
    try:
        with open(f"/proc/{pid}/stat", "rb") as f:
            stat = f.read()
    except OSError:
        return None
    return stat[stat.rfind(b")") + 2 :].split()[0].decode()


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


def wait_until(predicate: Callable[[], Any], what: str, within: float = LIVENESS_S) -> Any:
    """Poll ``predicate`` until it returns something true and return that; fail naming ``what``
    after ``within`` seconds (a liveness bound, not a timing assertion)."""
    deadline = time.monotonic() + within
    while True:
        value = predicate()
        if value:
            return value
        if time.monotonic() >= deadline:
            raise AssertionError(f"not within {within:g} s: {what}")
        time.sleep(0.02)


def wait_for_files(folder: Path, pattern: str, n: int, within: float = 30.0) -> list[Path]:
    """The ``n`` files matching ``pattern`` in ``folder`` (sorted), once all exist. Writers
    should write a temporary name and rename, so a file that exists is complete."""

    def found() -> list[Path] | None:
        files = sorted(Path(folder).glob(pattern))
        return files if len(files) >= n else None

    return wait_until(found, f"{n} files {pattern} in {folder}", within)


def wait_for_file(path: str | os.PathLike[str], within: float | None = None) -> None:
    """Block until ``path`` exists (forever if ``within`` is None): a rank that must be late
    waits here for a file another rank writes when it is done."""
    deadline = None if within is None else time.monotonic() + within
    while not os.path.exists(path):
        if deadline is not None and time.monotonic() >= deadline:
            raise TimeoutError(f"{path} did not appear within {within:g} s")
        time.sleep(0.02)


def block_forever() -> None:
    """Wait for a signal, forever: a rank that must never finish on its own (SIGINT still
    raises KeyboardInterrupt, SIGTERM still ends it)."""
    while True:
        signal.pause()


def read_pids(files: list[Path]) -> set[int]:
    """Every pid listed (one per line) in ``files``."""
    return {int(line) for f in files for line in f.read_text().split()}


def kill_all(pids: set[int] | list[int]) -> None:
    """SIGKILL whichever of ``pids`` still run (cleanup after a failed assertion, so survivors
    cannot disturb later tests)."""
    for pid in pids:
        if not is_gone(pid):
            try:
                os.kill(pid, signal.SIGKILL)
            except (ProcessLookupError, PermissionError):
                pass


def assert_gone(pids: set[int] | list[int], within: float = LIVENESS_S) -> None:
    """Every process of ``pids`` ends within ``within`` seconds (a liveness bound); otherwise
    fail naming the survivors, after killing them."""
    deadline = time.monotonic() + within
    while not all(is_gone(p) for p in pids) and time.monotonic() < deadline:
        time.sleep(0.05)
    survivors = sorted(p for p in pids if not is_gone(p))
    if survivors:
        described = "; ".join(describe_pid(p) for p in survivors)
        kill_all(survivors)
        raise AssertionError(f"processes survived: {described}")


def store_barrier(name: str, ranks: list[int] | range, rank: int | None = None, within: float = 60.0) -> None:
    """Inside a rank started by ``run_ranks`` or hccl-launch (it hosts the store): wait until
    every rank of ``ranks`` has reached the barrier ``name``. Use it before a call whose own
    timeout must not include the ranks' start-up (e.g. ``hccl_py.init()`` under a short
    HCCL_CONNECT_TIMEOUT)."""
    from hccl_py.rendezvous.store import StoreClient

    me = int(os.environ["RANK"]) if rank is None else rank
    with StoreClient.from_env(timeout_s=within) as store:
        store.set(f"tests.mp/barrier/{name}/{me}", b"1")
        store.wait([f"tests.mp/barrier/{name}/{r}" for r in ranks], timeout_s=within)


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
