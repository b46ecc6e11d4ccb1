"""The job watchdog: nothing a job started outlives it, even when its launcher is SIGKILLed.

Ranks carry PR_SET_PDEATHSIG, so they die with their launcher, but a rank's own children (a
subprocess, a multiprocessing worker, a grandchild that changed its process group) would be
orphaned and live on. So every rank leads its own session (session id = its pid) and every
process it starts stays in that session unless it calls ``setsid()`` itself: the session, not
the parent chain (which ends at init once a parent dies), is what is killed.

The watchdog is a small process the launcher starts before any rank, in a session of its own
(neither the launcher's death, a Ctrl-C in the terminal, nor a signal to the launcher's process
group reaches it). It reads a stream socket the launcher holds the other end of. Each rank
registers itself on it (``+<pid> <starttime>``) before it can run any code of its own (from a
``preexec_fn``, or first thing in a ``launch.spawn`` rank), and the launcher forgets a rank
(``-<pid>``) once it has cleaned up that rank's session itself. When the socket reaches EOF --
the launcher ended, normally or by any signal, SIGKILL included -- the watchdog SIGKILLs every
process whose session id is a registered rank's, again and again until none is left (a dying
process may have forked), then exits. ``starttime`` (field 22 of /proc/<pid>/stat) guards
against pid reuse: a session whose leader pid now belongs to a younger process is not the job's.
The launcher also names its mark in the job's socket directory (``d<path>``, see
``hccl_py/rundir.py``): once the ranks are gone, the watchdog removes the sockets there
that nobody listens on (SIGKILLed ranks leave theirs), the mark, and the directory if it is empty,
as ``rundir.remove_job`` does at a normal end. If the watchdog dies with the launcher, the next
launcher's ``rundir.sweep_abandoned`` does it.

Limit: a descendant that calls ``setsid()`` (a daemon) leaves the session and is not found.

Standard library only, and started as a script (``python -I -S _watchdog.py``) so it starts in
milliseconds and never imports hccl_py; the launcher imports the same functions from here.
"""

from __future__ import annotations

import os
import shutil
import signal
import socket
import stat
import subprocess
import sys
import time
from collections.abc import Mapping

KILL_PATIENCE_S = 30.0  # how long to keep killing before reporting survivors (D-state processes)
SWEEP_PATIENCE_S = 5.0  # the launcher's own sweep of a rank's session; what survives is left to the watchdog
_RESCAN_S = 0.01


# ---------------------------------------------------------------------------------- /proc


def _stat_fields(pid: int | str) -> list[bytes] | None:
    """Fields of /proc/<pid>/stat after the command name (field 3 on), ``None`` if gone."""
    try:
        fd = os.open(f"/proc/{pid}/stat", os.O_RDONLY)
    except OSError:
        return None
    try:
        data = os.read(fd, 4096)
    except OSError:
        return None
    finally:
        os.close(fd)
    # The command name is in parentheses and may itself contain spaces and ')'.
    return data[data.rfind(b")") + 2 :].split()


def start_time(pid: int | str = "self") -> int | None:
    """Field 22 of /proc/<pid>/stat (start time in clock ticks since boot): with the pid, it
    names one process for good. ``None`` if the process is gone."""
    fields = _stat_fields(pid)
    return None if fields is None else int(fields[19])


def session_members(sessions: Mapping[int, int | None]) -> list[int]:
    """Live (not zombie) processes whose session id is a key of ``sessions`` ({leader pid:
    leader start time}). A session whose leader pid is alive with another start time belongs
    to a process that reused the pid: it is skipped."""
    if not sessions:
        return []
    mine = os.getpid()
    found = []
    reused: dict[int, bool] = {}
    for entry in os.listdir("/proc"):
        if not entry.isdigit() or int(entry) == mine:
            continue
        fields = _stat_fields(entry)
        if fields is None or fields[0] in (b"Z", b"X"):
            continue  # gone, or dead already (a zombie cannot fork or run)
        sid = int(fields[3])
        if sid not in sessions:
            continue
        if sid not in reused:
            leader_start = start_time(sid)
            reused[sid] = leader_start is not None and sessions[sid] is not None and leader_start != sessions[sid]
        if not reused[sid]:
            found.append(int(entry))
    return found


def kill_sessions(sessions: Mapping[int, int | None], patience_s: float = KILL_PATIENCE_S) -> list[int]:
    """SIGKILL every process of these sessions until a scan finds none; the survivors (pids)
    if some are still there after ``patience_s`` (a process stuck in the kernel), else ``[]``."""
    deadline = time.monotonic() + patience_s
    while True:
        members = session_members(sessions)
        if not members or time.monotonic() >= deadline:
            return members
        for pid in members:
            try:
                os.kill(pid, signal.SIGKILL)
            except (ProcessLookupError, PermissionError):
                pass
        time.sleep(_RESCAN_S)


def remove_job_files(mark: bytes | str) -> None:
    """The launcher that wrote ``mark`` is gone and its ranks with it: remove the mark, its flight
    folder, the sockets of its job directory that nobody listens on, and the directory if it is
    then empty (``rundir.remove_job``'s clean-up, here without importing hccl_py). A socket that
    still listens (another launcher's rank of the same job) stays."""
    folder = os.path.dirname(mark)
    pid = os.path.basename(mark).rsplit(b"." if isinstance(mark, bytes) else ".", 1)[-1]
    flight = os.path.join(folder, (b"flight." if isinstance(mark, bytes) else "flight.") + pid)  # rundir.FLIGHT_DIR
    shutil.rmtree(flight, ignore_errors=True)
    try:
        os.unlink(mark)
        names = os.listdir(folder)
    except OSError:
        return
    for name in names:
        path = os.path.join(folder, name)
        try:
            if stat.S_ISSOCK(os.lstat(path).st_mode) and not _listening(path):
                os.unlink(path)
        except OSError:
            pass
    try:
        os.rmdir(folder)
    except OSError:
        pass


def _listening(path: bytes | str) -> bool:
    """Whether a live datagram socket is bound at ``path`` (a dead process's refuses)."""
    probe = socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM)
    try:
        probe.connect(path)
        return True
    except (ConnectionRefusedError, FileNotFoundError):
        return False
    except OSError:
        return True  # cannot tell: leave it alone
    finally:
        probe.close()


def supported() -> bool:
    """Sessions can be scanned here (Linux /proc)."""
    return os.path.isdir("/proc/self") and os.path.exists("/proc/self/stat")


# --------------------------------------------------------------------------- launcher side


class Watchdog:
    """The launcher's end: starts the watchdog process and speaks its protocol.

    Example::

        dog = Watchdog.start()
        subprocess.Popen(cmd, start_new_session=True, preexec_fn=dog.register_self)
        ...
        dog.forget(pid)      # after cleaning up that rank's session ourselves
        dog.close()          # EOF: the watchdog sweeps what is left and exits
    """

    def __init__(self, process: subprocess.Popen[bytes], sock: socket.socket):
        self.process = process
        self._sock = sock
        self.pid = process.pid
        self.owner = os.getpid()  # the process whose life the watchdog follows

    @classmethod
    def start(cls) -> Watchdog:
        """Start the watchdog process (this file, ``python -I -S``, in a session of its own so signals
        meant for the launcher's group miss it) and return the launcher's end of its socket."""
        ours, theirs = socket.socketpair(socket.AF_UNIX, socket.SOCK_STREAM)
        try:
            process = subprocess.Popen(
                [sys.executable, "-I", "-S", os.path.abspath(__file__)],
                stdin=theirs.fileno(),
                stdout=subprocess.DEVNULL,
                start_new_session=True,  # out of reach of signals meant for the launcher's group
            )
        except BaseException:
            ours.close()
            raise
        finally:
            theirs.close()
        return cls(process, ours)

    def fileno(self) -> int:
        """The launcher's end of the socket (non-inheritable: exec closes it in every child)."""
        return self._sock.fileno()

    def register_self(self) -> None:
        """Register the calling process as a rank; safe in a ``preexec_fn`` (after ``setsid``,
        before ``exec``): one send, no SIGPIPE if the watchdog is gone."""
        register(self._sock)

    def detach(self) -> None:
        """In a rank forked from the launcher, after :meth:`register_self`: close this process's copy
        of the launcher's end, so the watchdog's EOF still means "the launcher is gone"."""
        self._sock.close()

    def remove_at_end(self, mark: str) -> None:
        """When the launcher ends, however it ends, and the ranks are gone: remove the dead sockets
        of the job directory holding the launcher's ``mark`` (``rundir.claim_job``), the mark, and
        the directory if that leaves it empty."""
        if "\n" not in mark:
            _send(self._sock, b"d" + os.fsencode(mark) + b"\n")

    def forget(self, pid: int) -> None:
        """This rank's session has been cleaned up: never sweep its pid (it may be reused)."""
        _send(self._sock, f"-{pid}\n".encode())

    def sweep(self, sessions: Mapping[int, int | None], patience_s: float = SWEEP_PATIENCE_S) -> None:
        """The launcher's own clean-up of ranks that exited: SIGKILL what their sessions ({leader
        pid: start time}) still hold, then forget them. Sessions with survivors after
        ``patience_s`` stay registered: the watchdog sweeps them when the launcher ends."""
        if not kill_sessions(sessions, patience_s):
            for pid in sessions:
                self.forget(pid)

    def close(self, wait_s: float = KILL_PATIENCE_S + 5.0) -> None:
        """EOF to the watchdog, which sweeps every session still registered; wait for it."""
        if self._sock.fileno() >= 0:
            self._sock.close()
        try:
            self.process.wait(wait_s)
        except subprocess.TimeoutExpired:
            pass  # it keeps going on its own; it exits once its sweep ends


def register(sock: socket.socket) -> None:
    """Send ``+<pid> <starttime>`` for the calling process on ``sock``."""
    pid = os.getpid()
    _send(sock, f"+{pid} {start_time(pid) or 0}\n".encode())


def _send(sock: socket.socket, message: bytes) -> None:
    try:
        sock.send(message, socket.MSG_NOSIGNAL)  # a few bytes: one atomic write
    except OSError:
        pass  # the watchdog is gone: ranks still die with the launcher (PDEATHSIG)


# --------------------------------------------------------------------------- watchdog side


def main() -> int:
    """Read registrations from fd 0 until EOF, then sweep the registered sessions."""
    for signum in (signal.SIGINT, signal.SIGHUP, signal.SIGPIPE):
        signal.signal(signum, signal.SIG_IGN)
    sessions: dict[int, int | None] = {}
    marks: list[bytes] = []  # the launcher's marks in job socket directories (remove_at_end)
    pending = b""
    while True:
        try:
            data = os.read(0, 65536)
        except InterruptedError:
            continue
        except OSError:
            data = b""
        if not data:
            break
        pending += data
        *lines, pending = pending.split(b"\n")
        for line in lines:
            try:
                if line.startswith(b"+"):
                    pid, start = line[1:].split()
                    sessions[int(pid)] = int(start) or None
                elif line.startswith(b"-"):
                    sessions.pop(int(line[1:]), None)
                elif line.startswith(b"d"):
                    marks.append(line[1:])
            except ValueError:
                continue  # a torn line cannot happen on one socket; ignore rather than die
    survivors = kill_sessions(sessions)
    for mark in marks:
        remove_job_files(mark)
    if survivors:
        try:
            print(
                f"hccl-launch watchdog: processes {survivors} of the job's ranks survived SIGKILL "
                f"for {KILL_PATIENCE_S:g} s",
                file=sys.stderr,
                flush=True,
            )
        except OSError:
            pass  # nobody reads our stderr any more
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
