"""Ranks forked from the warm launcher: hccl-launch's default way to start ranks.

A rank started as a fresh ``python script.py`` spends ~0.2 s of CPU starting the interpreter and
importing numpy, pyzmq and hccl_py before its first line runs; 16 of them on 2 cores spend over
a second of wall time on that alone. The launcher has imported all of it already, so it forks
each rank from itself instead, before it starts any thread or the store (a fork of a
single-threaded process, like multiprocessing's ``fork`` start method):

1. :func:`fork_waiting` forks a child per rank. The child leads its own session, carries
   PR_SET_PDEATHSIG and registers with the watchdog at once (as ``pdeathsig_preexec`` does for an
   exec'd rank), then blocks on its control pipe.
2. Once the store is up, :meth:`Waiting.start` sends the child its environment, argv and target.
   The child takes the rank's environment, standard streams (pipes to the launcher, unbuffered
   as ``PYTHONUNBUFFERED=1`` makes them), ``sys.argv``, ``sys.path`` (the script's folder first,
   then ``PYTHONPATH`` entries the launcher's own path lacks) and default signal handlers, reseeds
   numpy's global generator (Python's ``random`` reseeds itself at fork), runs the target as
   ``python script.py`` or ``python -m module`` would, then exits as the interpreter does: waits
   for non-daemon threads, runs atexit handlers, exit status from ``SystemExit``, 1 after an
   uncaught exception (traceback on stderr), killed by SIGINT after an uncaught
   KeyboardInterrupt.

What differs from an exec'd rank (``hccl-launch --start exec`` restores it): the interpreter's
flags and ``PYTHON*`` settings read at interpreter start-up are the launcher's, modules the
launcher imported are imported already, and string hashes share one seed across ranks.

Example::

    waiting = fork_waiting(4, watchdog)                    # before any thread or the store
    procs = [w.start(env_of(r), ["infer.py"], "infer.py", is_module=False) for r, w in enumerate(waiting)]
"""

from __future__ import annotations

import importlib
import io
import os
import pickle
import signal
import sys
import traceback
from collections.abc import Sequence
from dataclasses import dataclass
from types import TracebackType
from typing import TYPE_CHECKING, BinaryIO

from .proc import set_parent_death_signal

if TYPE_CHECKING:
    from ._watchdog import Watchdog

__all__ = ["WARM_MODULES", "ForkedProcess", "Waiting", "fork_waiting", "warm_up"]


# What every rank imports: loaded once by the launcher (and by launch.spawn's forkserver), found
# loaded by every rank forked from it.
WARM_MODULES = (
    "numpy",
    "zmq",
    "hccl_py",
    "hccl_py.runtime",
    "hccl_py.rendezvous.store",
    "hccl_py.rendezvous.connect",
    "hccl_py.transport.shm",
)


def warm_up() -> None:
    """Import :data:`WARM_MODULES`, so forked ranks find them loaded (the launcher calls this
    once, before forking)."""
    for name in WARM_MODULES:
        importlib.import_module(name)


class ForkedProcess:
    """The launcher's handle on a forked rank, shaped like the parts of ``subprocess.Popen`` the
    supervisor uses: ``pid``, ``stdout``/``stderr`` (binary pipes), ``returncode``, ``poll()``,
    ``wait()`` (negative returncode = killed by that signal)."""

    def __init__(self, pid: int, stdout: BinaryIO, stderr: BinaryIO):
        self.pid = pid
        self.stdout: BinaryIO | None = stdout
        self.stderr: BinaryIO | None = stderr
        self.returncode: int | None = None

    def _reap(self, flags: int) -> int | None:
        if self.returncode is None:
            try:
                pid, status = os.waitpid(self.pid, flags)
            except ChildProcessError:  # reaped elsewhere: nothing more to learn
                self.returncode = 255
                return self.returncode
            if pid:
                self.returncode = os.waitstatus_to_exitcode(status)
        return self.returncode

    def poll(self) -> int | None:
        """The exit status if the rank has exited (reaping it), else ``None``."""
        return self._reap(os.WNOHANG)

    def wait(self) -> int:
        """Block until the rank exits; its exit status."""
        code = self._reap(0)
        assert code is not None
        return code


@dataclass
class Waiting:
    """A forked child waiting for its rank's orders on a control pipe."""

    pid: int
    control: int  # write end of the child's control pipe
    stdout: int  # read ends of its standard output and error
    stderr: int

    def start(self, environ: dict[str, str], argv: list[str], target: str, *, is_module: bool) -> ForkedProcess:
        """Send the child what it runs; it runs it. ``argv`` is the rank's ``sys.argv`` (script
        or module name first)."""
        message = pickle.dumps({"environ": environ, "argv": argv, "target": target, "is_module": is_module})
        try:
            with open(self.control, "wb", closefd=True) as pipe:
                pipe.write(message)
        except BrokenPipeError:
            pass  # the child died already: its exit status tells the supervisor
        return ForkedProcess(self.pid, open(self.stdout, "rb", buffering=0), open(self.stderr, "rb", buffering=0))

    def abandon(self) -> None:
        """Close the launcher's ends without starting the child (it exits on EOF)."""
        for fd in (self.control, self.stdout, self.stderr):
            try:
                os.close(fd)
            except OSError:
                pass


def fork_waiting(count: int, watchdog: Watchdog | None, close: Sequence[int] = ()) -> list[Waiting]:
    """Fork ``count`` children that wait for :meth:`Waiting.start`; each closes the launcher's
    descriptors ``close`` (never used again in the child). Call from the main thread of a
    single-threaded process (PR_SET_PDEATHSIG follows the forking thread)."""
    parent = os.getpid()
    waiting: list[Waiting] = []
    try:
        for _ in range(count):
            control_r, control_w = os.pipe()
            out_r, out_w = os.pipe()
            err_r, err_w = os.pipe()
            sys.stdout.flush()
            sys.stderr.flush()
            pid = os.fork()
            if pid == 0:  # the child: never returns
                inherited = [*close, control_w, out_r, err_r] + [
                    fd for w in waiting for fd in (w.control, w.stdout, w.stderr)
                ]
                _child(parent, watchdog, control_r, out_w, err_w, inherited)
            for fd in (control_r, out_w, err_w):
                os.close(fd)
            waiting.append(Waiting(pid, control_w, out_r, err_r))
    except BaseException:
        for w in waiting:
            w.abandon()
        raise
    return waiting


# ------------------------------------------------------------------------------- the child


def _child(parent: int, watchdog: Watchdog | None, control: int, out_w: int, err_w: int, inherited: list[int]) -> None:
    """The forked child, from fork to exit; never returns into the launcher's code."""
    code = 1
    try:
        signal.set_wakeup_fd(-1)  # the launcher's wake-up pair is closed below, not the rank's
        os.setsid()
        set_parent_death_signal(parent)
        if watchdog is not None:
            watchdog.register_self()
            watchdog.detach()  # the watchdog sees EOF only when the launcher's own end closes
        for fd in inherited:
            os.close(fd)
        with open(control, "rb", closefd=True) as pipe:
            data = pipe.read()
        if not data:  # the launcher gave up on this rank
            os._exit(1)
        orders = pickle.loads(data)
        _become_rank(orders, out_w, err_w)
        code = _run(orders["target"], orders["is_module"])
    except BaseException:  # a failure of this module, not of the rank's program
        try:
            traceback.print_exc()
            sys.stderr.flush()
        finally:
            os._exit(1)
    os._exit(code)


def _become_rank(orders: dict, out_w: int, err_w: int) -> None:
    """Environment, streams, argv, path and signals of ``python script.py`` with the rank's env."""
    null = os.open(os.devnull, os.O_RDONLY)
    for fd, target in ((null, 0), (out_w, 1), (err_w, 2)):
        os.dup2(fd, target)
        os.close(fd)
    environ: dict[str, str] = orders["environ"]
    os.environ.clear()
    os.environ.update(environ)
    encoding = getattr(sys.__stdout__, "encoding", None) or "utf-8"
    sys.stdin = sys.__stdin__ = io.TextIOWrapper(io.BufferedReader(io.FileIO(0, "r", closefd=False)), encoding=encoding)
    # As PYTHONUNBUFFERED=1 (rank_env sets it): no buffer, every write reaches the pipe at once.
    sys.stdout = sys.__stdout__ = io.TextIOWrapper(
        io.FileIO(1, "w", closefd=False),
        encoding=encoding,  # type: ignore[arg-type]
        write_through=True,
    )
    sys.stderr = sys.__stderr__ = io.TextIOWrapper(
        io.FileIO(2, "w", closefd=False),
        encoding=encoding,  # type: ignore[arg-type]
        errors="backslashreplace",
        write_through=True,
    )
    signal.signal(signal.SIGINT, signal.default_int_handler)
    for signum in (signal.SIGTERM, signal.SIGCHLD):  # the launcher's handlers are not the rank's
        signal.signal(signum, signal.SIG_DFL)
    sys.argv = list(orders["argv"])
    target = orders["target"]
    first = os.getcwd() if orders["is_module"] else os.path.dirname(os.path.realpath(target))
    extra = [p for p in environ.get("PYTHONPATH", "").split(os.pathsep) if p and p not in sys.path]
    sys.path[:1] = [first, *extra]
    numpy = sys.modules.get("numpy")
    if numpy is not None and "numpy.random" in sys.modules:
        numpy.random.seed()  # else every rank would draw the launcher's sequence


def _run(target: str, is_module: bool) -> int:
    """Run the target as ``__main__`` and end as the interpreter would; the exit status."""
    import atexit
    import runpy
    import threading

    interrupted = False
    try:
        if is_module:
            runpy.run_module(target, run_name="__main__", alter_sys=True)
        else:
            runpy.run_path(target, run_name="__main__")
        code = 0
    except SystemExit as exc:
        code = _exit_code(exc.code)
    except BaseException as exc:  # KeyboardInterrupt included
        # The hook prints the exception's own traceback, so trim that, not only the argument.
        exc.__traceback__ = _own_frames_dropped(exc.__traceback__, runpy.__file__)
        sys.excepthook(type(exc), exc, exc.__traceback__)
        interrupted = isinstance(exc, KeyboardInterrupt)
        code = 130 if interrupted else 1
    threading._shutdown()  # type: ignore[attr-defined]  # non-daemon threads end first, as at exit
    atexit._run_exitfuncs()
    for stream in (sys.stdout, sys.stderr):
        try:
            stream.flush()
        except (OSError, ValueError):
            pass
    if interrupted:  # as the interpreter does: the parent sees a death by SIGINT
        signal.signal(signal.SIGINT, signal.SIG_DFL)
        os.kill(os.getpid(), signal.SIGINT)
    return code


def _own_frames_dropped(tb: TracebackType | None, runpy_file: str | None) -> TracebackType | None:
    """The traceback from the program's first frame on, as a fresh interpreter prints it (without
    this module's and runpy's frames)."""
    ours = {__file__, runpy_file, "<frozen runpy>"}
    while tb is not None and tb.tb_next is not None and tb.tb_frame.f_code.co_filename in ours:
        tb = tb.tb_next
    return tb


def _exit_code(value: object) -> int:
    """The exit status ``sys.exit(value)`` gives: None is 0, an int is itself, else the value is
    printed to stderr and the status is 1."""
    if value is None:
        return 0
    if isinstance(value, int):
        return value & 0xFF
    print(value, file=sys.stderr)
    return 1
