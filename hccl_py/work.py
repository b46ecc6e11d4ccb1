"""The handle of an asynchronous call (``async_op=True``, torch's name).

A call issued asynchronously moves its data on the rank's progress thread while the caller goes
on; its handle says when it is done and joins the card's streams::

    work = comm.all_reduce(x, async_op=True)     # returns at once; x fills in meanwhile
    y = comm.device.matmul(a, b)                  # compute overlaps the communication
    work.wait()                                   # x is reduced; the compute clock joins the
                                                  # communication stream's (max of both)

Errors (a timeout, a dead peer, a mismatched call) surface at :meth:`wait` with the messages a
blocking call raises; :meth:`exception` returns them without raising. A handle belongs to the
process that issued the call: in a child forked after that, :meth:`wait` raises (the rank's
progress thread, which ends the call, does not run in the child).
"""

from __future__ import annotations

import numbers
import os
import threading
import traceback
from typing import Any

from .errors import HcclError, HcclInternalError, HcclParamError, HcclTimeoutError

_CALLBACKS_LOCK = threading.Lock()  # orders add_done_callback against _finish (rarely contended)

# This process's id, kept current in forked children (os.register_at_fork), so that telling a
# handle issued before a fork costs no system call per wait.
_pid = os.getpid()


def _after_fork_in_child() -> None:
    global _pid
    _pid = os.getpid()


os.register_at_fork(after_in_child=_after_fork_in_child)


class Work:
    """One asynchronous call in flight (see the module doc)."""

    __slots__ = (
        "what",
        "_result",
        "_done",
        "_error",
        "_end_clock",
        "_device",
        "_joined",
        "_callbacks",
        "_blocking",
        "_start_clock",
        "_owner_pid",
        "__weakref__",
    )

    def __init__(self, what: str, result: Any, device, *, blocking: bool = False):
        self.what = what  # "allreduce #3 on communicator 'world' (rank 0 of 4)"
        self._result = result
        self._device = device
        # A blocking call that queued behind asynchronous ones (whether it queued depends on wall
        # time): as when the same call runs at once, the wait for the calls before it on its stream
        # (until ``_start_clock``) is exposed communication, the call itself is not.
        self._blocking = blocking
        self._start_clock = 0.0
        self._done = threading.Event()
        self._error: HcclError | None = None
        self._end_clock = 0.0
        self._joined = False
        self._callbacks: list | None = None
        self._owner_pid = _pid  # the process that issued the call (its progress thread ends it)

    def wait(self, timeout: float | None = None) -> Any:
        """Block until the call is done and return its result (what the blocking call returns);
        raise its HcclError if it failed. ``timeout`` (seconds, a number >= 0; None or inf: no
        bound) bounds this wait only: when it passes, HcclTimeoutError is raised and the call goes
        on (wait again later); 0 only looks. The first successful wait makes the card's compute
        stream wait for the call's end (modeled time)."""
        if self._owner_pid != _pid:
            raise self._forked()
        if timeout is not None:
            timeout = _checked_timeout(self.what, timeout)
        if not self._done.wait(timeout):
            raise HcclTimeoutError(
                f"{self.what}: not done within wait(timeout={timeout:g}); the call goes on, wait again",
                timeout_s=timeout,
            )
        if not self._joined:
            self._joined = True
            device = self._device
            if self._blocking:
                device.wait_for(self._start_clock)
                device.clock = max(device.clock, self._end_clock)
            else:  # the compute stream stands still for it
                device.wait_for(self._end_clock)
        if self._error is not None:
            raise self._error
        return self._result

    def _forked(self) -> HcclInternalError:
        return HcclInternalError(
            f"{self.what}: wait() in process {_pid}, a child forked from process {self._owner_pid} after it issued the "
            "call: the call ends on that process's progress thread, which does not run here, so this wait would never "
            "end. Wait in the process that issued the call (before forking), and start workers that need the result "
            "after it is done, or with multiprocessing's 'spawn' start method",
            state="forked",
            owner_pid=self._owner_pid,
            pid=_pid,
        )

    def is_completed(self) -> bool:
        """True once the call has finished, successfully or not (never blocks)."""
        return self._done.is_set()

    def exception(self) -> HcclError | None:
        """The call's error once it has failed; None while it runs or when it succeeded."""
        return self._error if self._done.is_set() else None

    def add_done_callback(self, fn) -> None:
        """Call ``fn(work)`` once the call has ended, successfully or not: at once if it has,
        else on the progress thread as it ends (keep ``fn`` short; it must not call the
        communicator). Unlike :meth:`wait`, this does not join the card's streams: for adapters
        that complete a future of their own (the torch backend)."""
        with _CALLBACKS_LOCK:
            if not self._done.is_set():
                if self._callbacks is None:
                    self._callbacks = []
                self._callbacks.append(fn)
                return
        fn(self)

    @property
    def end_clock(self) -> float:
        """Modeled seconds on the communication stream when the call ended (0 before)."""
        return self._end_clock

    def peek(self) -> Any:
        """The result of a call that has ended, raising its error; never waits and never joins the
        card's streams (for a call queued after this one that needs what it returned: an
        all-to-all-v's data exchange reads its counts exchange). HcclInternalError while it runs."""
        if not self._done.is_set():
            raise HcclInternalError(f"{self.what}: peek() before the call ended; wait() for it", state="running")
        if self._error is not None:
            raise self._error
        return self._result

    # -- the issuing side (hccl_py.engine.issuing): a call's start and end, written once each ----------------
    def started_at(self, start_clock: float) -> None:
        """The call started on its stream at modeled ``start_clock`` (after the calls before it)."""
        self._start_clock = start_clock

    def finish(self, error: HcclError | None, end_clock: float) -> None:
        """The call ended at modeled ``end_clock``, with ``error`` or None: called once, by the
        thread that ran it (the progress thread for a queued call); wakes the waiters and runs
        the callbacks."""
        self._error = error
        self._end_clock = end_clock
        with _CALLBACKS_LOCK:
            self._done.set()
            callbacks, self._callbacks = self._callbacks, None
        for fn in callbacks or ():
            try:
                fn(self)
            except Exception:  # a callback's bug must not take the progress thread down
                traceback.print_exc()

    def __repr__(self) -> str:
        state = "failed" if self._error is not None else ("done" if self._done.is_set() else "running")
        return f"<Work {self.what}: {state}>"


def _checked_timeout(what: str, timeout) -> float | None:
    """``Work.wait``'s ``timeout`` as seconds for ``threading.Event.wait`` (None: no bound);
    HcclParamError for anything but a number >= 0."""
    if isinstance(timeout, bool) or not isinstance(timeout, numbers.Real):
        raise HcclParamError(
            f"{what}: wait(timeout={timeout!r}): timeout is seconds as a number (e.g. wait(timeout=1.5)), "
            "or None to wait until the call ends",
            arg="timeout",
            value=repr(timeout),
            rule="type",
            expected="number of seconds >= 0, or None",
        )
    seconds = float(timeout)
    if not seconds >= 0:  # negative, or nan
        raise HcclParamError(
            f"{what}: wait(timeout={timeout!r}): timeout must be >= 0 seconds (0 only looks whether the "
            "call is done; None waits until it ends)",
            arg="timeout",
            value=seconds,
            rule="range",
            expected=">= 0",
        )
    return None if seconds > threading.TIMEOUT_MAX else seconds  # inf and beyond what a lock takes: no bound
