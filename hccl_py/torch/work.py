"""torch ``Work`` objects over hccl-py's asynchronous calls (:class:`hccl_py.work.Work`).

As torch documents them (``async_op=True``):

- ``wait()`` blocks until the call is done and returns True; an HCCL failure raises
  ``torch.distributed.DistBackendError`` carrying HCCL's message (its ``__cause__`` is the
  HcclError, with ``.code`` and fields). ``wait(timeout)`` bounds this wait only (the call goes
  on). On the modeled clock, ``wait()`` is where the card's compute stream joins the
  communication stream, as ``work.wait()`` makes the current stream wait on a real device.
- ``get_future()`` is a ``torch.futures.Future`` completed when the call ends (with the output
  tensors, or the DistBackendError), whether or not anyone waits: ``then`` callbacks run on
  hccl-py's progress thread. It does not join the modeled streams; ``wait()`` does.
- ``is_completed()``, ``is_success()``, ``exception()``, ``result()`` as torch's Work.

What an operation does after the data moved (copy a staged tensor back, divide for AVG, copy
the gathered rows into the caller's list) runs when the call ends, before the future completes.
"""

from __future__ import annotations

import threading
import weakref
from datetime import timedelta

import torch.distributed as dist
from torch.futures import Future

from ..errors import HcclError

# Asynchronous calls not waited for yet, for torch.npu.synchronize() (the stand-in waits on them).
_in_flight: weakref.WeakSet = weakref.WeakSet()
_EMPTY: list = []


def backend_error(err: HcclError, what: str) -> RuntimeError:
    """torch's DistBackendError for an HcclError in ``what`` (HCCL's message, class and code); for
    a tensor Ascend's backend refuses, the plain RuntimeError torch_npu raises, with its text."""
    torch_text = getattr(err, "torch_text", None)
    error = (
        RuntimeError(torch_text)
        if torch_text is not None
        else dist.DistBackendError(f"hccl-py {what}: {type(err).__name__}: {err}")
    )
    error.__cause__ = err
    return error


class HcclWork(dist.Work):
    """One asynchronous torch call: one or more hccl-py calls (a coalesced call issues several),
    then ``post`` (run once they have all succeeded), then the future completes with ``result``."""

    def __init__(self, what: str, works: list, result: list, post=None):
        super().__init__()
        self._what = what
        self._works = works
        self._result = result
        self._post = post
        self._future = Future()
        self._error: BaseException | None = None
        self._finished = threading.Event()
        self._pending = len(works)
        self._lock = threading.Lock()
        _in_flight.add(self)
        if not works:
            self._complete()
        for work in works:
            work.add_done_callback(self._one_done)

    # -- completion (progress thread, or at once) ------------------------------------------------
    def _one_done(self, work) -> None:
        with self._lock:
            self._pending -= 1
            if work.exception() is not None and self._error is None:
                self._error = backend_error(work.exception(), self._what)
            last = self._pending == 0
        if last:
            self._complete()

    def _complete(self) -> None:
        if self._error is None and self._post is not None:
            try:
                self._post()
            except Exception as err:  # a failed copy-back: the caller's wait() raises it
                self._error = err
        try:
            if self._error is None:
                self._future.set_result(self._result)
            else:
                self._future.set_exception(self._error)
        finally:
            self._finished.set()  # after the future: wait() returning means get_future() is done too

    # -- torch's Work interface ------------------------------------------------------------------------
    def wait(self, timeout: timedelta | None = None) -> bool:
        seconds = None if timeout is None or timeout <= timedelta(0) else timeout.total_seconds()
        for work in self._works:
            try:
                work.wait(seconds)  # joins the card's streams (modeled time)
            except HcclError as err:
                if not work.is_completed():  # wait(timeout) ran out; the call goes on
                    raise backend_error(err, self._what) from err
                break  # the call failed: its error is ours once the rest are done
        if not self._finished.wait(seconds):
            raise dist.DistBackendError(
                f"hccl-py {self._what}: not done within wait(timeout={timeout}); the call goes on"
            )
        _in_flight.discard(self)
        if self._error is not None:
            raise self._error
        return True

    def is_completed(self) -> bool:
        return self._finished.is_set()

    def is_success(self) -> bool:
        return self._finished.is_set() and self._error is None

    def exception(self):
        return self._error if self._finished.is_set() else None

    def result(self) -> list:
        return self._result

    def synchronize(self) -> None:
        self.wait()

    def get_future(self) -> Future:
        return self._future

    def __repr__(self) -> str:
        state = "failed" if self._error is not None else ("done" if self._finished.is_set() else "running")
        return f"<HcclWork {self._what}: {state}>"


class DoneWork(dist.Work):
    """The Work of a call that already finished on the caller's thread (``async_op=False``: torch
    only waits on it). One shared instance: nothing to allocate on the hot path."""

    def __init__(self):
        super().__init__()
        self._future = None

    def wait(self, timeout: timedelta | None = None) -> bool:
        return True

    def is_completed(self) -> bool:
        return True

    def is_success(self) -> bool:
        return True

    def exception(self):
        return None

    def result(self) -> list:
        return _EMPTY

    def synchronize(self) -> None:
        pass

    def get_future(self) -> Future:
        future = Future()
        future.set_result(_EMPTY)
        return future


DONE = DoneWork()


def synchronize(raise_errors: bool = True) -> None:
    """Wait for every asynchronous call not waited for yet (what ``torch.npu.synchronize()``
    means for the card: its streams joined). ``raise_errors=False``: a failed call is left for
    its own ``wait()`` to raise (a synchronisation the runtime makes by itself, as a memory pool's)."""
    for work in list(_in_flight):
        try:
            work.wait()
        except Exception:
            if raise_errors:
                raise
