"""What a rank does when SIGTERM stops it (torchrun stopping its workers, mp.spawn stopping the
others after a failure, hccl-launch stopping a hung job): Python's default for SIGTERM ends the
process without running ``atexit`` or ``finally``, so whatever must not outlive the rank (its
socket files in the run directory, its flight record) registers here.

The handler is installed once, from the main thread (only it may install one), the first time
something registers. It runs every registered clean-up, then the handler it replaced: the
user's own, or the default (the process then dies of SIGTERM, as it would have, so a parent
sees the same exit status). A handler the user installs later replaces this one; the next job's
start sweeps what is left (rundir.sweep_dead_jobs).

Example::

    sigterm.on_sigterm(lambda: os.unlink(path))
"""

from __future__ import annotations

import os
import signal
import threading
from collections.abc import Callable

_cleanups: list[Callable[[], None]] = []
_previous: list = []  # the handler ours replaced (once installed)


def on_sigterm(cleanup: Callable[[], None]) -> bool:
    """Run ``cleanup`` (no arguments, quick, never raising) when SIGTERM stops this process;
    whether a handler of ours is in place to do it (not when SIGTERM is ignored, nor from a
    thread other than the main one before the handler was installed)."""
    if cleanup not in _cleanups:
        _cleanups.append(cleanup)
    previous = signal.getsignal(signal.SIGTERM)
    if previous is _handle:
        return True
    # Not ours (yet, or any more: a forked child reset it, or the user installed theirs): wrap
    # what is there now.
    if threading.current_thread() is not threading.main_thread():
        return False
    if previous is signal.SIG_IGN or previous is None:  # ignored, or set from C: leave it
        return False
    _previous[:] = [previous]
    signal.signal(signal.SIGTERM, _handle)
    return True


def forget(cleanup: Callable[[], None]) -> None:
    """``cleanup`` has nothing left to do (its resource was released normally)."""
    if cleanup in _cleanups:
        _cleanups.remove(cleanup)


def _handle(signum, frame) -> None:
    for cleanup in list(_cleanups):
        try:
            cleanup()
        except Exception:  # a clean-up must not keep the process from stopping
            pass
    previous = _previous[0]
    if callable(previous):
        previous(signum, frame)
        return
    signal.signal(signal.SIGTERM, signal.SIG_DFL)
    os.kill(os.getpid(), signal.SIGTERM)
