"""``launch.spawn``: run a Python function on N ranks from Python (tests, notebooks).

The parent hosts the rendezvous store for the call; each rank is a fresh process (forkserver
with numpy, zmq and hccl_py preloaded, never plain fork: a forked copy of a threaded parent, e.g. one holding zmq
contexts, can deadlock) whose environment is exactly what hccl-launch gives its ranks.

Example::

    def work(scale):
        import os
        return int(os.environ["RANK_ID"]) * scale

    launch.spawn(work, 4, args=(10,))          # [0, 10, 20, 30]

Each rank leads its own session and registers it with a watchdog process the caller starts
once (launch/_watchdog.py), so whatever a rank starts is killed when the call ends, and also
when the caller itself is SIGKILLed.

If a rank raises or dies, the others are stopped (SIGTERM, then SIGKILL) and :class:`SpawnError`
describes the first failure, keeping the original exception when it can be pickled::

    try:
        launch.spawn(work_that_times_out, 2)
    except launch.SpawnError as err:
        assert isinstance(err.exception, hccl_py.HcclTimeoutError)
"""

from __future__ import annotations

import atexit
import multiprocessing
import multiprocessing.connection
import os
import pickle
import signal
import socket
import sys
import threading
import time
import traceback
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from multiprocessing import reduction
from multiprocessing.process import BaseProcess
from types import TracebackType
from typing import Any

from hccl_py import env as envnames
from hccl_py import rundir
from hccl_py.rendezvous.store import StoreServer

from . import _watchdog
from .fork import WARM_MODULES
from .proc import (
    describe_returncode,
    free_port,
    new_job_id,
    new_job_secret,
    rank_env,
    set_parent_death_signal,
    stop_all,
)

__all__ = ["spawn", "SpawnContext", "SpawnError"]

DEFAULT_GRACE_S = 3.0
# What every rank imports anyway: loaded once in the forkserver, inherited by each fork.
_FORKSERVER_PRELOAD = list(WARM_MODULES)


class SpawnError(RuntimeError):
    """A spawned job failed; the message is the root cause (the first failure observed).

    Attributes: ``rank`` (``None`` for a timeout), ``exc_type`` (class name of the rank's
    exception, ``None`` if it died without one), ``exc_message``, ``traceback`` (text from the
    rank), ``exception`` (the original exception object when it could be pickled, else
    ``None``), ``exitcode`` (``Popen``-style: negative for a signal), ``unfinished`` (ranks
    still running when the job was stopped).
    """

    def __init__(
        self,
        message: str,
        *,
        rank: int | None = None,
        exc_type: str | None = None,
        exc_message: str | None = None,
        traceback: str | None = None,
        exception: BaseException | None = None,
        exitcode: int | None = None,
        unfinished: Sequence[int] = (),
    ):
        super().__init__(message)
        self.rank = rank
        self.exc_type = exc_type
        self.exc_message = exc_message
        self.traceback = traceback
        self.exception = exception
        self.exitcode = exitcode
        self.unfinished = list(unfinished)


# ------------------------------------------------------------------------------- child side


class _CallerStdio:
    """Pickles as duplicates of the caller's fds 1 and 2 *at spawn time*.

    A forkserver child otherwise writes to whatever stdout the forkserver was started with;
    this way rank output goes where the caller's output goes now (e.g. into pytest's capture
    of the running test, so a failing multi-process test shows its ranks' prints).
    """

    def __reduce__(self) -> tuple[Any, ...]:
        dups = []
        for fd in (1, 2):
            try:
                os.fstat(fd)
                dups.append(reduction.DupFd(fd))
            except OSError:  # the caller has no such stream: leave the child's as it is
                dups.append(None)
        return (_ChildStdio, tuple(dups))


class _ChildStdio:
    def __init__(self, out: Any, err: Any):
        self._dups = ((1, out), (2, err))

    def install(self) -> None:
        for target, dup in self._dups:
            if dup is not None:
                fd = dup.detach()
                os.dup2(fd, target)
                os.close(fd)
        for stream in (sys.stdout, sys.stderr):
            # Line by line, as PYTHONUNBUFFERED gives hccl-launch ranks: a rank that is killed
            # later must not lose what it printed.
            try:
                stream.reconfigure(line_buffering=True)  # type: ignore[union-attr]
            except (AttributeError, ValueError):
                pass


class _WatchdogTicket:
    """Pickles as a duplicate of the caller's end of its watchdog socket (or as nothing)."""

    def __init__(self, watchdog: _watchdog.Watchdog | None):
        self._watchdog = watchdog

    def __reduce__(self) -> tuple[Any, ...]:
        if self._watchdog is None:
            return (_ChildTicket, (None,))
        return (_ChildTicket, (reduction.DupFd(self._watchdog.fileno()),))


class _ChildTicket:
    def __init__(self, dup: Any):
        self._dup = dup

    def register(self) -> None:
        """Lead a new session and register it with the caller's watchdog, then drop the
        socket (a process this rank forks later must not hold it open)."""
        if self._dup is None:
            return
        fd = self._dup.detach()
        self._dup = None
        with socket.socket(fileno=fd) as sock:
            try:
                os.setsid()
            except OSError:
                return  # cannot lead a session: nothing to register
            _watchdog.register(sock)


def _child_main(
    fn: Callable[..., Any],
    args: tuple[Any, ...],
    rank: int,
    env: dict[str, str],
    conn: multiprocessing.connection.Connection,
    stdio: _ChildStdio,
    ticket: _ChildTicket,
) -> None:
    # The parent is the forkserver (or the caller, with "spawn"); the forkserver exits when the
    # caller dies, so either way this rank dies with the caller instead of lingering.
    set_parent_death_signal()
    if os.getppid() == 1:  # parent already gone before the line above took effect
        os._exit(128 + signal.SIGKILL)
    ticket.register()  # before any user code: whatever it starts is in this rank's session
    stdio.install()
    os.environ.clear()
    os.environ.update(env)
    try:
        result = fn(*args)
    except SystemExit as exc:
        if exc.code in (None, 0):
            _send(conn, ("ok", None), rank)
            return
        _send(conn, ("err", _error_record(exc, rank)), rank)
        raise
    except BaseException as exc:  # KeyboardInterrupt too: the parent must hear about it
        _send(conn, ("err", _error_record(exc, rank)), rank)
        conn.close()
        sys.exit(1)
    else:
        _send(conn, ("ok", result), rank)
    conn.close()


def _error_record(exc: BaseException, rank: int) -> dict[str, Any]:
    try:
        pickled: bytes | None = pickle.dumps(exc)
        pickle.loads(pickled)  # must also come back (custom __init__ signatures often do not)
    except Exception:
        pickled = None
    return {
        "rank": rank,
        "exc_type": type(exc).__qualname__,
        "exc_message": str(exc),
        # Skip this wrapper's own frame: the traceback starts in the user's function.
        "traceback": "".join(traceback.format_exception(type(exc), exc, _user_frames(exc.__traceback__))),
        "pickled": pickled,
        "time": time.time(),
        "pid": os.getpid(),
    }


def _user_frames(tb: TracebackType | None) -> TracebackType | None:
    if tb is not None and tb.tb_frame.f_code is _child_main.__code__ and tb.tb_next is not None:
        return tb.tb_next
    return tb


def _send(conn: multiprocessing.connection.Connection, message: tuple[str, Any], rank: int) -> None:
    try:
        conn.send(message)
    except Exception as exc:  # e.g. the return value cannot be pickled
        conn.send(
            (
                "err",
                _error_record(
                    TypeError(
                        f"rank {rank}: could not send {message[0]!r} result to the parent: {type(exc).__name__}: {exc}"
                    ),
                    rank,
                ),
            )
        )


# ------------------------------------------------------------------------------ parent side


@dataclass(eq=False)
class _Child:
    rank: int
    process: BaseProcess
    conn: multiprocessing.connection.Connection
    done: bool = False  # result or error received, or pipe closed
    exited: bool = False  # exit status collected
    result: Any = None
    has_result: bool = False
    error: dict[str, Any] | None = None
    start_time: int | None = None  # /proc start time: with the pid, names the rank's session for good


# Strong references: a context the caller dropped without joining must still be cleaned up.
_live_contexts: set[SpawnContext] = set()

# One watchdog per caller process, started by the first spawn(); it lives as long as the caller.
_watchdog_lock = threading.Lock()
_caller_watchdog: _watchdog.Watchdog | None = None


def _get_watchdog() -> _watchdog.Watchdog | None:
    global _caller_watchdog
    if not _watchdog.supported():
        return None
    with _watchdog_lock:
        dog = _caller_watchdog
        if dog is None or dog.owner != os.getpid() or dog.process.poll() is not None:
            dog = _caller_watchdog = _watchdog.Watchdog.start()
        return dog


def helper_pids() -> set[int]:
    """Long-lived helper processes of this caller (its spawn watchdog): not leaks."""
    dog = _caller_watchdog
    return {dog.pid} if dog is not None and dog.owner == os.getpid() else set()


@atexit.register
def _kill_leftovers() -> None:
    # Runs before multiprocessing's own atexit hook (atexit is LIFO), which would otherwise wait
    # forever for non-daemonic children of an unjoined SpawnContext.
    for context in list(_live_contexts):
        context.terminate(grace_s=0.0)


class SpawnContext:
    """The running ranks of one :func:`spawn` call (returned directly when ``join=False``).

    Example::

        ctx = launch.spawn(work, 4, join=False)
        ...                              # the caller can do other things meanwhile
        results = ctx.join(timeout=60)   # list in rank order, or SpawnError
    """

    def __init__(
        self,
        children: list[_Child],
        store: StoreServer,
        grace_s: float,
        timeout: float | None = None,
        watchdog: _watchdog.Watchdog | None = None,
    ):
        self._children = children
        self._watchdog = watchdog
        # Each rank's session: {pid: start time}, to sweep what the ranks left running.
        self._sessions = {
            c.process.pid: c.start_time for c in children if watchdog is not None and c.process.pid is not None
        }
        self._store: StoreServer | None = store
        self._job_id = store.job_id
        self.grace_s = grace_s
        self.timeout = timeout  # join()'s default: the timeout given to spawn()
        self._pids = [c.process.pid for c in children]
        self._terminated = False
        _live_contexts.add(self)

    @property
    def pids(self) -> list[int | None]:
        """The ranks' process ids, in rank order."""
        return list(self._pids)

    def join(self, timeout: float | None = None) -> list[Any]:
        """Wait for every rank; their return values in rank order, or :class:`SpawnError`.

        ``timeout`` defaults to the one given to :func:`spawn`. Whatever happens (failure,
        timeout, KeyboardInterrupt), no rank is left running afterwards.
        """
        timeout = self.timeout if timeout is None else timeout
        deadline = None if timeout is None else time.monotonic() + timeout
        try:
            while not all(c.exited for c in self._children):
                failure = self._collect(deadline, timeout)
                if failure is not None:
                    raise failure
            return [c.result for c in self._children]
        finally:
            self.terminate()

    def terminate(self, grace_s: float | None = None) -> None:
        """Stop every rank still running (SIGTERM, then SIGKILL after the grace); close the store.

        Idempotent; called by :meth:`join` on its way out.
        """
        if self._terminated:
            return
        self._terminated = True
        stop_all(
            [c.process for c in self._children],
            self.grace_s if grace_s is None else grace_s,
            send=_signal_process,
            exited=lambda p: not p.is_alive(),
            wait=lambda live, timeout_s: multiprocessing.connection.wait([p.sentinel for p in live], timeout_s),
        )
        for c in self._children:
            c.process.join()
            c.conn.close()
            c.process.close()
        # Whatever the ranks started (children, other process groups, orphaned grandchildren)
        # is in their sessions: nothing a job started outlives it.
        if self._sessions and self._watchdog is not None:
            self._watchdog.sweep(self._sessions)
        if self._store is not None:
            self._store.close()
            self._store = None
        rundir.remove_job(self._job_id)  # sockets of ranks that were killed
        _live_contexts.discard(self)

    # -- machinery -------------------------------------------------------------------------

    def _collect(self, deadline: float | None, timeout: float | None) -> SpawnError | None:
        """Wait for the next events; a SpawnError if they (or the deadline) end the job.

        A rank is first watched on its pipe (result or error record), then on its process
        sentinel (its exit status): a rank that sent its result and then crashed still fails.
        """
        waiting: dict[Any, _Child] = {}
        for c in self._children:
            if not c.done:
                waiting[c.conn] = c
            elif not c.exited:
                waiting[c.process.sentinel] = c
        remaining = None if deadline is None else max(0.0, deadline - time.monotonic())
        ready = multiprocessing.connection.wait(list(waiting), remaining)
        if not ready and deadline is not None and time.monotonic() >= deadline:
            return self._timeout_error(timeout)
        failures: list[_Child] = []
        for handle in ready:
            child = waiting[handle]
            if handle is child.conn:
                self._receive(child)
                if child.error is not None:
                    failures.append(child)
            else:
                child.process.join()
                child.exited = True
                if not child.has_result or child.process.exitcode != 0:
                    failures.append(child)
        if not failures:
            return None
        # Several in one batch: a rank that died without a word (crash, os._exit, signal) comes
        # first, since its peers' errors are usually consequences of it; then the error stamped
        # earliest by its rank.
        root = min(failures, key=lambda c: (c.error is not None, c.error["time"] if c.error else 0.0, c.rank))
        return self._failure_error(root)

    def _receive(self, child: _Child) -> None:
        child.done = True
        try:
            kind, payload = child.conn.recv()
        except (EOFError, OSError):
            return  # died without a word (os._exit, signal, crash): its exit status will tell
        except Exception as exc:  # the result arrived but cannot be unpickled here
            child.error = {
                "rank": child.rank,
                "exc_type": type(exc).__qualname__,
                "exc_message": f"rank {child.rank}'s return value could not be unpickled: {exc}",
                "traceback": traceback.format_exc(),
                "pickled": None,
                "time": time.time(),
            }
            return
        if kind == "ok":
            child.result, child.has_result = payload, True
        else:
            child.error = payload

    def _failure_error(self, root: _Child) -> SpawnError:
        unfinished = [c.rank for c in self._children if c is not root and not c.done]
        if root.error is not None:
            err = root.error
            exception = None
            if err["pickled"] is not None:
                try:
                    exception = pickle.loads(err["pickled"])
                except Exception:
                    exception = None
            message = (
                f"rank {root.rank} (pid {root.process.pid}) raised {err['exc_type']}: {err['exc_message']}\n"
                f"--- traceback of rank {root.rank} ---\n{err['traceback'].rstrip()}"
            )
            if unfinished:
                message += f"\n--- ranks {unfinished} were still running and have been stopped"
            return SpawnError(
                message,
                rank=root.rank,
                exc_type=err["exc_type"],
                exc_message=err["exc_message"],
                traceback=err["traceback"],
                exception=exception,
                unfinished=unfinished,
            )
        root.process.join()
        code = root.process.exitcode
        assert code is not None
        if root.has_result:
            what = f"returned its result but then exited with {describe_returncode(code)}"
        elif code == 0:
            what = "exited 0 without returning a result (no Python exception was reported)"
        else:
            what = f"died with {describe_returncode(code)} (no Python exception was reported)"
        message = f"rank {root.rank} (pid {root.process.pid}) {what}"
        if unfinished:
            message += f"; ranks {unfinished} were still running and have been stopped"
        return SpawnError(message, rank=root.rank, exitcode=code, unfinished=unfinished)

    def _timeout_error(self, timeout: float | None) -> SpawnError:
        # Ranks that had not returned; failing that, the ones stuck exiting after they returned.
        unfinished = [c.rank for c in self._children if not c.done] or [c.rank for c in self._children if not c.exited]
        finished = [c.rank for c in self._children if c.rank not in unfinished]
        return SpawnError(
            f"spawn timed out after {timeout:g} s: ranks {unfinished} had not finished "
            f"(finished: {finished}); all were stopped",
            unfinished=unfinished,
        )


def _signal_process(process: BaseProcess, sig: int) -> None:
    """``sig`` to the rank itself (what Process.terminate/kill do, for any signal)."""
    if process.pid is not None and process.exitcode is None:  # not reaped: the pid is still the rank's
        try:
            os.kill(process.pid, sig)
        except ProcessLookupError:
            pass


def _context(start_method: str) -> multiprocessing.context.BaseContext:
    if start_method == "fork":
        raise ValueError("launch.spawn never forks the caller (threads + fork deadlock); use 'forkserver' or 'spawn'")
    ctx = multiprocessing.get_context(start_method)
    if start_method == "forkserver":
        # Only effective before the forkserver's first start; harmless afterwards.
        ctx.set_forkserver_preload(_FORKSERVER_PRELOAD)
    return ctx


def spawn(
    fn: Callable[..., Any],
    nprocs: int,
    args: tuple[Any, ...] = (),
    *,
    env: Mapping[str, str] | None = None,
    timeout: float | None = None,
    join: bool = True,
    start_method: str = "forkserver",
    grace_s: float = DEFAULT_GRACE_S,
) -> list[Any] | SpawnContext:
    """Run ``fn(*args)`` on ``nprocs`` ranks; their return values in rank order.

    ``fn``, ``args`` and the return values must be picklable (define ``fn`` at module level).
    Each rank's environment is the caller's current one plus what hccl-launch sets (RANK_ID,
    RANK_SIZE, DEVICE_ID, RANK, WORLD_SIZE, LOCAL_RANK, LOCAL_WORLD_SIZE, HCCL_PY_STORE_ADDR,
    HCCL_PY_STORE_PORT, MASTER_ADDR/MASTER_PORT (a free port for torch), HCCL_PY_JOB_ID,
    HCCL_PY_JOB_SECRET, HCCL_PY_STORE_HOSTED=1), updated with ``env``
    (a job id or secret given there is the store's too). It is applied
    before ``fn`` runs but after the rank has imported ``launch``/``hccl_py``, so read
    environment variables when called, not at import time. ``timeout`` bounds the whole call (seconds).
    With ``join=False`` the :class:`SpawnContext` is returned at once; call its ``join()``.

    Example: ``spawn(work, 4, args=(10,), env={"HCCL_EXEC_TIMEOUT": "5"}, timeout=60)``.
    """
    if nprocs < 1:
        raise ValueError(f"nprocs must be >= 1, got {nprocs}")
    ctx = _context(start_method)
    watchdog = _get_watchdog()
    overrides = {str(k): str(v) for k, v in (env or {}).items()}
    job_id = overrides.get(envnames.JOB_ID) or new_job_id()
    secret = overrides.get(envnames.JOB_SECRET) or new_job_secret()
    store = StoreServer(job_id=job_id, secret=secret).start()
    children: list[_Child] = []
    torch_port = free_port()
    try:
        for rank in range(nprocs):
            # The caller's environment as it is *now* (the forkserver's is a snapshot from its
            # start, e.g. before a test's monkeypatch.setenv), then the rank's, then overrides.
            child_env = {
                **os.environ,
                **rank_env(rank, nprocs, "127.0.0.1", store.port, job_id, secret, torch_port=torch_port),
            }
            child_env.update(overrides)
            reader, writer = ctx.Pipe(duplex=False)
            process = ctx.Process(
                target=_child_main,
                args=(fn, tuple(args), rank, child_env, writer, _CallerStdio(), _WatchdogTicket(watchdog)),
                name=f"hccl-rank-{rank}",
            )
            try:
                process.start()
            except BaseException:
                reader.close()
                raise
            finally:
                writer.close()  # the child holds the only write end: EOF here means it is gone
            assert process.pid is not None
            children.append(_Child(rank, process, reader, start_time=_watchdog.start_time(process.pid)))
    except BaseException:
        SpawnContext(children, store, grace_s, watchdog=watchdog).terminate(grace_s=0.0)
        raise
    context = SpawnContext(children, store, grace_s, timeout, watchdog)
    if not join:
        return context
    return context.join()
