"""Where the ranks of a job on one host reach each other: pathname unix sockets in a private
directory, so that only this user's processes can reach a rank.

Layout::

    <user dir>/                     0700, ours: $XDG_RUNTIME_DIR/hccl_py, else /tmp/hccl_py-<uid>
                                    (HCCL_PY_RUN_DIR overrides; it must be ours and not writable by others)
        secret                      0600: the per-user store secret (rendezvous/secret.py)
        <job>/                      0700: one directory per job id
            g<gen>[.<host>].<rank>.<pid>    a rank's datagram socket (generation, host tag, local rank, pid)
            launcher.<pid>                  the launcher running the job here (boot id, pid namespace, start time)

The kernel checks the directories' permissions on every ``connect``/``sendto`` by path, so
other users get EACCES before a byte arrives; nothing is checked per message (a connected
datagram socket keeps its peer). Root passes any permission check, as everywhere.

Clean-up: a rank unlinks its own socket on close, and on SIGTERM (torchrun and mp.spawn stop
their workers so), and tries to remove the job directory; hccl-launch and ``launch.spawn`` call
:func:`remove_job` when the job ends (sockets of ranks that were SIGKILLed refuse connections,
so they are recognised as dead). A launcher that is SIGKILLed cleans up nothing, so each
launcher marks its job's directory with :func:`claim_job`. Every job's start, whatever started
it (hccl-launch; the first rank of each host under torchrun, env:// or mpiexec), calls
:func:`sweep_dead_jobs`: the directories of jobs whose launchers are all gone (by pid and start
time), and of unmarked jobs whose sockets all refuse, lose their dead sockets and go.

Example::

    sock = socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM)
    path, inode = bind(sock, "3f2a9c0d1b2e", "g1.0.4242")    # <user dir>/3f2a9c0d1b2e/g1.0.4242
    ...
    unbind(path, inode)
"""

from __future__ import annotations

import errno
import hashlib
import os
import re
import shutil
import socket
import stat
import time

from . import env, sigterm
from .errors import HcclConnectError, HcclSyscallError

UNIX_PATH_MAX = 107  # sun_path is 108 bytes, one for the terminating NUL
BASE_MAX = 64  # longest user dir taken from XDG_RUNTIME_DIR; longer ones fall back to /tmp
STALE_AGE_S = 10.0  # a job directory untouched this long whose sockets all refuse is a dead job's
_SAFE_NAME = re.compile(r"[A-Za-z0-9][A-Za-z0-9_.-]{0,23}")
LAUNCHER_MARK = "launcher."  # <job>/launcher.<pid>: a launcher of the job (see claim_job)
FLIGHT_DIR = "flight."  # <job>/flight.<pid>: where that launcher's ranks dump their flight recorders
_bound: dict[str, tuple[int, int]] = {}  # this process's socket files: path -> (inode, pid that bound it)


def user_dir(create: bool = True) -> str:
    """This user's private directory (created 0700 on first use); HcclSyscallError saying what
    to do when it is not safe (another owner, a symlink, writable by others)."""
    explicit = os.environ.get(env.RUN_DIR)
    if explicit:
        path = os.path.abspath(explicit)
        if create:
            _make_dir(path)
        _check_private(path, f"{env.RUN_DIR}={explicit}", fix=False)
        return path
    path = _default_base()
    if create:
        _make_dir(path)
        _check_private(path, path, fix=True)
    return path


def _default_base() -> str:
    uid = os.geteuid()
    xdg = os.environ.get(env.XDG_RUNTIME_DIR)
    if xdg and os.path.isabs(xdg) and len(xdg) + 8 <= BASE_MAX:
        try:
            st = os.lstat(xdg)
        except OSError:
            st = None
        if st is not None and stat.S_ISDIR(st.st_mode) and st.st_uid == uid:
            return os.path.join(xdg, "hccl_py")
    return f"/tmp/hccl_py-{uid}"


def _make_dir(path: str, variable: str = env.RUN_DIR) -> None:
    try:
        os.mkdir(path, 0o700)
    except FileExistsError:
        pass
    except OSError as err:
        raise HcclSyscallError(
            f"cannot create {path}: {err.strerror}; set {variable} to a directory of yours",
            path=path,
            errno=err.errno,
            variable=variable,
        ) from None


def _check_private(
    path: str,
    what: str,
    *,
    fix: bool,
    variable: str = env.RUN_DIR,
    keeps: str = "job sockets and its secret",
) -> None:
    try:
        st = os.lstat(path)
    except OSError as err:
        raise HcclSyscallError(
            f"{what}: {err.strerror}; set {variable} to a directory of yours",
            path=path,
            errno=err.errno,
            variable=variable,
        ) from None
    problem = None
    if stat.S_ISLNK(st.st_mode) or not stat.S_ISDIR(st.st_mode):
        problem = "is not a directory (a symlink?)"
    elif st.st_uid != os.geteuid():
        problem = f"belongs to uid {st.st_uid}, not to this user (uid {os.geteuid()})"
    elif st.st_mode & (0o077 if fix else 0o022):
        if fix:
            os.chmod(path, 0o700)  # hccl-py's own directory: make it private again
        else:
            problem = f"is writable by other users (mode {stat.S_IMODE(st.st_mode):o})"
    if problem:
        raise HcclSyscallError(
            f"{what} {problem}: hccl-py keeps {keeps} there only if nobody else can "
            f"change it; remove it, or set {variable} to a directory only you can write",
            path=path,
            rule="private",
            variable=variable,
        )


def private_dir(path: str, *, variable: str, keeps: str) -> str:
    """``path`` made if missing (mode 0700, its parents as usual) and checked as the run directory
    is: a directory, not a symlink, this user's, writable by nobody else, in a parent that nobody
    else can rename it out of (writable by others only with the sticky bit, as /tmp). For what
    hccl-py runs or trusts from disk (the npu extension's build cache); HcclSyscallError naming
    ``variable`` otherwise::

        private_dir(os.path.expanduser("~/.cache/hccl-py"), variable="HCCL_PY_CACHE", keeps="compiled code")
    """
    parent = os.path.dirname(os.path.abspath(path))
    if not os.path.lexists(path):
        os.makedirs(parent, exist_ok=True)
        _make_dir(path, variable)
    st = os.stat(parent)
    others_write = st.st_mode & 0o002 or st.st_mode & 0o020 and st.st_gid != os.getegid()
    if others_write and not st.st_mode & stat.S_ISVTX:
        raise HcclSyscallError(
            f"{path}'s directory {parent} is writable by other users (mode {stat.S_IMODE(st.st_mode):o}), who could "
            f"put a directory of theirs in its place: hccl-py keeps {keeps} only where nobody else can; set {variable} "
            "to a directory only you can write",
            path=parent,
            rule="private",
            variable=variable,
        )
    _check_private(path, path, fix=False, variable=variable, keeps=keeps)
    return path


def job_dir_name(job_id: str) -> str:
    """The job's directory name: the id itself when short and plain, else ``h-`` + its hash."""
    if _SAFE_NAME.fullmatch(job_id):
        return job_id
    return "h-" + hashlib.blake2b(job_id.encode(), digest_size=8).hexdigest()


def job_dir(job_id: str, create: bool = False) -> str:
    """``<user dir>/<job>``, created 0700 (and checked to be ours) when ``create``."""
    path = os.path.join(user_dir(create=create), job_dir_name(job_id))
    if create:
        _make_dir(path)
        _check_private(path, path, fix=True)
    return path


def socket_path(job_id: str, name: str) -> str:
    """Where the socket ``name`` (e.g. ``g1.0.4242``) of job ``job_id`` lives."""
    path = os.path.join(user_dir(create=False), job_dir_name(job_id), name)
    if len(path.encode()) > UNIX_PATH_MAX:
        raise HcclSyscallError(
            f"socket path {path!r} is longer than the {UNIX_PATH_MAX} bytes a unix socket "
            f"address holds; set {env.RUN_DIR} to a shorter directory (e.g. /tmp/hccl_py-{os.geteuid()})",
            path=path,
            rule="range",
            expected=f"<= {UNIX_PATH_MAX} bytes",
            variable=env.RUN_DIR,
        )
    return path


def bind(sock: socket.socket, job_id: str, name: str) -> tuple[str, int]:
    """Bind ``sock`` to the socket ``name`` of job ``job_id``; (path, inode of the socket file).

    A file left there by a dead process is replaced; a live one is an HcclConnectError (two
    processes that think they are the same rank of the same job)."""
    for _ in range(3):
        job_dir(job_id, create=True)
        path = socket_path(job_id, name)
        try:
            sock.bind(path)
        except FileNotFoundError:
            continue  # the directory was swept between mkdir and bind: make it again
        except OSError as err:
            if err.errno == errno.EADDRINUSE and not listening(path):
                _unlink(path)
                continue
            raise HcclConnectError(
                f"cannot bind the socket {path}: {err.strerror}"
                + (
                    " (a live process of job {job_id!r} holds it: two jobs with the same HCCL_PY_JOB_ID? give each job its own)".format(
                        job_id=job_id
                    )
                    if err.errno == errno.EADDRINUSE
                    else ""
                ),
                path=path,
                errno=err.errno,
            ) from None
        inode = os.lstat(path).st_ino
        _bound[path] = (inode, os.getpid())
        sigterm.on_sigterm(_unlink_bound)
        return path, inode
    raise HcclConnectError(
        f"cannot bind the socket {name} of job {job_id!r} in {user_dir(create=False)}: "
        "its directory keeps vanishing (is something removing it?)",
        path=socket_path(job_id, name),
    )


def unbind(path: str, inode: int) -> None:
    """Remove our socket file (if it is still ours), then the job directory if it is empty."""
    _bound.pop(path, None)
    try:
        if os.lstat(path).st_ino == inode:
            os.unlink(path)
    except OSError:
        pass
    try:
        os.rmdir(os.path.dirname(path))
    except OSError:
        pass  # other ranks' sockets are still there (or it is gone already)


def _unlink_bound() -> None:
    """At SIGTERM: remove the socket files this process bound and still holds (a child forked
    from a rank inherits the list, not the sockets: it removes nothing)."""
    for path, (inode, pid) in list(_bound.items()):
        if pid == os.getpid():
            unbind(path, inode)


def listening(path: str) -> bool:
    """Whether a live socket is bound at ``path`` (a dead process's file refuses connections)."""
    probe = socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM)
    try:
        probe.connect(path)
        return True
    except (ConnectionRefusedError, FileNotFoundError):
        return False
    except OSError:
        return True  # cannot tell (e.g. a stream socket): leave it alone
    finally:
        probe.close()


def _unlink(path: str) -> None:
    try:
        os.unlink(path)
    except OSError:
        pass


def _dead_sockets(path: str) -> list[str] | None:
    """The entries of a job directory if every one is a socket nobody listens on or the mark of
    a launcher that is gone, else None."""
    try:
        names = os.listdir(path)
    except OSError:
        return None
    dead = []
    for name in names:
        entry = os.path.join(path, name)
        try:
            mode = os.lstat(entry).st_mode
        except OSError:
            continue
        if name.startswith(LAUNCHER_MARK) and stat.S_ISREG(mode):
            if _launcher_alive(entry) is not False:
                return None
        elif not stat.S_ISSOCK(mode) or listening(entry):
            return None
        dead.append(entry)
    return dead


def _ours(path: str) -> bool:
    try:
        st = os.lstat(path)
    except OSError:
        return False
    return stat.S_ISDIR(st.st_mode) and st.st_uid == os.geteuid()


def flight_dir(job_id: str) -> str:
    """This launcher's folder for its ranks' flight recorders, inside the job's directory (private
    to this user, and swept with the job when the launcher is killed): ``<job>/flight.<pid>``."""
    path = os.path.join(job_dir(job_id, create=True), f"{FLIGHT_DIR}{os.getpid()}")
    os.makedirs(path, mode=0o700, exist_ok=True)
    return path


def remove_job(job_id: str) -> None:
    """When a job has ended (hccl-launch, ``launch.spawn``): remove the sockets of its ranks
    that are gone (SIGKILLed ranks leave theirs), this process's launcher mark, and the job
    directory once it is empty. Live sockets stay: another launcher's ranks of the same job may
    still run on this host."""
    try:
        path = os.path.join(user_dir(create=False), job_dir_name(job_id))
    except HcclSyscallError:
        return
    if not _ours(path):
        return
    _unlink(os.path.join(path, f"{LAUNCHER_MARK}{os.getpid()}"))
    try:
        names = os.listdir(path)
    except OSError:
        return
    for name in names:
        entry = os.path.join(path, name)
        try:
            if stat.S_ISSOCK(os.lstat(entry).st_mode) and not listening(entry):
                _unlink(entry)
        except OSError:
            pass
    try:
        os.rmdir(path)
    except OSError:
        pass


def claim_job(job_id: str) -> str | None:
    """A launcher (this process) marks job ``job_id``'s directory as run by it, before any rank
    binds there: ``<job>/launcher.<pid>`` holding this process's boot id, pid namespace and start
    time. :func:`remove_job` removes the mark; if the launcher is killed first, the next launcher's
    :func:`sweep_abandoned` finds the job dead by it. The mark's path, or ``None`` if the run
    directory cannot be used (the ranks report that themselves)."""
    try:
        path = job_dir(job_id, create=True)
    except HcclSyscallError:
        return None
    mark = os.path.join(path, f"{LAUNCHER_MARK}{os.getpid()}")
    try:
        fd = os.open(mark, os.O_WRONLY | os.O_CREAT | os.O_TRUNC | os.O_NOFOLLOW, 0o600)
        try:
            os.write(fd, _identity("self").encode())
        finally:
            os.close(fd)
    except OSError:
        return None
    return mark


def sweep_abandoned(keep: str | None = None) -> list[str]:
    """Called by a launcher as it starts: for every job directory marked by launchers
    (:func:`claim_job`) that are all gone, remove its sockets nobody listens on, the marks, and
    the directory; the directories removed. Jobs with a live launcher, or one this process
    cannot judge (another pid namespace), are left alone, as is job ``keep``; a socket some
    process still listens on is never removed."""
    try:
        base = user_dir(create=False)
        names = os.listdir(base)
    except (HcclSyscallError, OSError):
        return []
    skip = job_dir_name(keep) if keep is not None else None
    removed = []
    for name in names:
        path = os.path.join(base, name)
        if name == skip or not _ours(path):
            continue
        try:
            entries = os.listdir(path)
        except OSError:
            continue
        marks = [e for e in entries if e.startswith(LAUNCHER_MARK)]
        if not marks or any(_launcher_alive(os.path.join(path, m)) is not False for m in marks):
            continue
        left = []
        for entry in entries:
            full = os.path.join(path, entry)
            try:
                if stat.S_ISSOCK(os.lstat(full).st_mode) and not listening(full):
                    _unlink(full)
                elif entry.startswith(FLIGHT_DIR) and stat.S_ISDIR(os.lstat(full).st_mode):
                    shutil.rmtree(full, ignore_errors=True)  # dumps nobody will read: their launcher is gone
                elif entry not in marks:
                    left.append(entry)
            except OSError:
                pass
        if left:
            continue  # a socket still listens (its rank is dying?): the marks stay, a later sweep ends it
        for mark in marks:
            _unlink(os.path.join(path, mark))
        try:
            os.rmdir(path)
            removed.append(path)
        except OSError:
            pass
    return removed


def _identity(pid: int | str) -> str:
    """``"<boot id> <pid namespace> <start time>"`` of a process (``""`` for a part not known):
    with the pid, it names one process for good."""
    try:
        with open("/proc/sys/kernel/random/boot_id") as f:
            boot = f.read().strip()
    except OSError:
        boot = ""
    try:
        namespace = os.readlink(f"/proc/{pid}/ns/pid")
    except OSError:
        namespace = ""
    state = _state_and_start(pid)
    return f"{boot} {namespace} {state[1] if state else ''}"


def _state_and_start(pid: int | str) -> tuple[str, str] | None:
    """(state letter, start time in clock ticks since boot) from /proc/<pid>/stat; None if gone."""
    try:
        with open(f"/proc/{pid}/stat", "rb") as f:
            fields = f.read().rsplit(b")", 1)[1].split()  # the command name may hold spaces and ')'
        return fields[0].decode(), fields[19].decode()  # fields 3 and 22
    except (OSError, IndexError):
        return None


def _launcher_alive(mark: str) -> bool | None:
    """Whether the launcher that wrote ``mark`` still runs: False if it is gone (a zombie, its pid
    reused, or the machine rebooted since), True if it runs, None if this process cannot tell
    (another pid namespace, or a mark it cannot read)."""
    try:
        pid = int(os.path.basename(mark)[len(LAUNCHER_MARK) :])
        with open(mark) as f:
            boot, namespace, start = (f.read().split(" ") + ["", "", ""])[:3]
    except (OSError, ValueError):
        return None
    my_boot, my_namespace, _ = _identity("self").split(" ")
    if boot and my_boot and boot != my_boot:
        return False  # written before this boot
    if not namespace or namespace != my_namespace:
        return None  # its pids are not ours to look up
    now = _state_and_start(pid)
    if now is None or now[0] in ("Z", "X"):
        return False
    return not start.strip() or now[1] == start.strip()


def sweep_dead_jobs(keep: str | None = None) -> list[str]:
    """At a job's start: remove what dead jobs left in the run directory, except job ``keep``
    (:func:`sweep_abandoned`, then :func:`sweep_stale`); the directories removed."""
    return sweep_abandoned(keep) + sweep_stale(keep)


def sweep_stale(keep: str | None = None) -> list[str]:
    """Remove the directories of dead jobs (every socket in them refuses connections and none
    changed for STALE_AGE_S), except job ``keep``; the directories removed. A job started
    without a launcher has nobody to clean up after a crash: this finds it dead."""
    try:
        base = user_dir(create=False)
        names = os.listdir(base)
    except (HcclSyscallError, OSError):
        return []
    skip = job_dir_name(keep) if keep is not None else None
    now = time.time()
    removed = []
    for name in names:
        path = os.path.join(base, name)
        if name == skip or not _ours(path):
            continue
        try:
            if now - os.lstat(path).st_mtime < STALE_AGE_S:
                continue
        except OSError:
            continue
        dead = _dead_sockets(path)
        if dead is None:
            continue
        for entry in dead:
            _unlink(entry)
        try:
            os.rmdir(path)
            removed.append(path)
        except OSError:
            pass
    return removed
