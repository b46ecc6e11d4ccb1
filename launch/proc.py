"""Process plumbing of everything that starts ranks: the hccl-launch supervisor, ``launch.spawn``
and hccl-bench's peers.

One home so every path gives ranks exactly the same environment (:func:`rank_env`), the same
death guarantees (:func:`pdeathsig_preexec`) and the same way of being stopped (:func:`stop_all`:
a signal, a grace period, then SIGKILL).
"""

from __future__ import annotations

import ctypes
import ctypes.util
import os
import secrets
import signal
import socket
import subprocess
import time
import uuid
from collections.abc import Callable, Sequence
from typing import TYPE_CHECKING, Any, TypeVar

from hccl_py import env
from hccl_py.transport.tcp import address_family, unbracketed

if TYPE_CHECKING:
    from ._watchdog import Watchdog

PR_SET_PDEATHSIG = 1  # from <linux/prctl.h>
POLL_INTERVAL_S = 0.05  # how often stop_all looks for exits by default

P = TypeVar("P")


def _resolve_prctl() -> Callable[..., int] | None:
    # Resolved once at import, i.e. before any fork: a preexec_fn runs between fork and exec,
    # where loading libraries or taking locks (as ctypes.util.find_library does) can deadlock.
    try:
        libc = ctypes.CDLL(ctypes.util.find_library("c") or "libc.so.6", use_errno=True)
        prctl = libc.prctl
    except (OSError, AttributeError):  # not Linux: no parent-death signal available
        return None
    prctl.argtypes = [ctypes.c_int, ctypes.c_ulong, ctypes.c_ulong, ctypes.c_ulong, ctypes.c_ulong]
    prctl.restype = ctypes.c_int
    return prctl


_PRCTL = _resolve_prctl()


def set_parent_death_signal(expected_parent: int | None = None, sig: int = signal.SIGKILL) -> None:
    """Ask the kernel to send ``sig`` to this process when its parent dies (Linux only).

    Called in the child. If ``expected_parent`` is given and the parent is already gone (it died
    between fork and this call, so the signal will never come), exit at once.
    Note that Linux delivers the signal when the *thread* that forked exits, so parents fork
    from their main thread.
    """
    if _PRCTL is not None:
        _PRCTL(PR_SET_PDEATHSIG, sig, 0, 0, 0)
    if expected_parent is not None and os.getppid() != expected_parent:
        os._exit(128 + sig)


def pdeathsig_preexec(watchdog: Watchdog | None = None) -> Callable[[], None]:
    """A ``preexec_fn`` for ``subprocess.Popen`` that ties the child's life to this process.

    With a ``watchdog`` (and ``start_new_session=True``) the child also registers its session
    there before it execs, so whatever it starts later is swept even if this process is SIGKILLed.
    """
    parent = os.getpid()

    def preexec() -> None:
        set_parent_death_signal(parent)
        if watchdog is not None:
            watchdog.register_self()

    return preexec


def new_job_id() -> str:
    """A fresh job id (``HCCL_PY_JOB_ID``): names one job's sockets and shared-memory segments."""
    return uuid.uuid4().hex[:12]


def new_job_secret() -> str:
    """A fresh job secret (``HCCL_PY_JOB_SECRET``): what every request to the job's store must carry."""
    return secrets.token_hex(16)


def free_port(host: str = "127.0.0.1") -> int:
    """A TCP port on ``host`` that was free a moment ago: what hccl-launch and ``launch.spawn``
    leave to torch as MASTER_PORT (torch's rank 0 binds it for its ``env://`` rendezvous);
    ``host`` may be an IPv6 address (``::1``)."""
    with socket.socket(address_family(host)) as s:
        s.bind((unbracketed(host), 0))
        return s.getsockname()[1]


def rank_env(  # params: one per variable group a rank starts with (HCCL's and torchrun's names)
    rank: int,
    world_size: int,
    store_addr: str,
    store_port: int,
    job_id: str,
    job_secret: str,
    local_rank: int | None = None,
    local_world_size: int | None = None,
    *,
    torch_port: int | None = None,
) -> dict[str, str]:
    """The environment a rank starts with: HCCL/MindSpore names and torchrun names, both; where
    hccl-py's store is (HCCL_PY_STORE_ADDR/PORT), the job's id and store secret; and
    MASTER_ADDR/MASTER_PORT for torch's ``env://`` rendezvous (``torch_port``, a free port the
    launcher chose; the store's port if none is given, for programs that do not use torch).

    Example::

        rank_env(1, 4, "127.0.0.1", 29500, "3f2a9c0d1b2e", new_job_secret(), torch_port=29501)["DEVICE_ID"]   # "1"
    """
    local_rank = rank if local_rank is None else local_rank
    local_world_size = world_size if local_world_size is None else local_world_size
    return {
        env.RANK_ID: str(rank),
        env.RANK_SIZE: str(world_size),
        env.DEVICE_ID: str(local_rank),
        env.RANK: str(rank),
        env.WORLD_SIZE: str(world_size),
        env.LOCAL_RANK: str(local_rank),
        env.LOCAL_WORLD_SIZE: str(local_world_size),
        env.STORE_ADDR: store_addr,
        env.STORE_PORT: str(store_port),
        env.MASTER_ADDR: store_addr,
        env.MASTER_PORT: str(store_port if torch_port is None else torch_port),
        env.JOB_ID: job_id,
        env.JOB_SECRET: job_secret,
        env.STORE_HOSTED: "1",
        "PYTHONUNBUFFERED": "1",
    }


def signal_name(signum: int) -> str:
    """``"SIGKILL"`` for 9; ``"signal 64"`` for numbers without a name."""
    try:
        return signal.Signals(signum).name
    except ValueError:
        return f"signal {signum}"


def describe_returncode(returncode: int) -> str:
    """``"exit code 3"`` or ``"signal SIGKILL (9)"`` for a ``Popen.returncode``-style value."""
    if returncode < 0:
        return f"signal {signal_name(-returncode)} ({-returncode})"
    return f"exit code {returncode}"


def shell_exit_code(returncode: int) -> int:
    """The exit status a shell reports: the code itself, or 128+signum for a signal."""
    return 128 - returncode if returncode < 0 else returncode


# ---------------------------------------------------------------------------------- stopping


def signal_group(proc: subprocess.Popen[bytes], sig: int) -> None:
    """Send ``sig`` to the process group ``proc`` leads (started with ``start_new_session=True``);
    nothing if the group is already gone."""
    try:
        os.killpg(proc.pid, sig)
    except (ProcessLookupError, PermissionError):
        pass


def _popen_exited(proc: subprocess.Popen[bytes]) -> bool:
    return proc.poll() is not None


def _sleep(live: Sequence[Any], timeout_s: float) -> None:
    time.sleep(min(timeout_s, POLL_INTERVAL_S))


def stop_all(
    procs: Sequence[P],
    grace_s: float,
    sig: int = signal.SIGTERM,
    *,
    send: Callable[[Any, int], None] = signal_group,
    exited: Callable[[Any], bool] = _popen_exited,
    wait: Callable[[Sequence[Any], float], None] = _sleep,
    give_up: Callable[[], bool] | None = None,
) -> list[P]:
    """Stop every process of ``procs`` still running: ``sig`` to each, then SIGKILL to those that
    have not exited after ``grace_s`` seconds; those (in order) are returned.

    Defaults fit ``subprocess.Popen`` children that lead their own process group: ``send``
    signals the group, ``exited`` polls. Other callers say how to signal (``send(proc, sig)``),
    how to tell an exit (``exited(proc)``, non-blocking) and how to wait for one
    (``wait(live, timeout_s)``, which may return early); ``give_up()`` true ends the grace at
    once (e.g. a second Ctrl-C). With ``sig`` SIGKILL there is no grace. Exit statuses are
    left to the caller to collect::

        stop_all(popens, grace_s=3.0)                 # SIGTERM, 3 s, SIGKILL
        for p in popens:
            p.wait()
    """
    live = [p for p in procs if not exited(p)]
    for p in live:
        send(p, sig)
    if sig == signal.SIGKILL:
        return []
    deadline = time.monotonic() + grace_s
    while live:
        live = [p for p in live if not exited(p)]
        remaining = deadline - time.monotonic()
        if not live or remaining <= 0 or (give_up is not None and give_up()):
            break
        wait(live, remaining)
    live = [p for p in live if not exited(p)]
    for p in live:
        send(p, signal.SIGKILL)
    return live
