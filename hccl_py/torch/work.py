"""torch ``Work`` objects over hccl-py's asynchronous calls (:class:`hccl_py.work.Work`).

As torch documents them (``async_op=True``):

- ``wait()`` blocks until the call is done and returns True; an HCCL failure raises
  ``torch.distributed.DistBackendError`` carrying HCCL's message (its ``__cause__`` is the
  HcclError, with ``.code`` and fields). ``wait(timeout)`` bounds this wait only (the call goes
  on). On the modeled clock, ``wait()`` is where the card's compute stream joins the
  communication stream, as ``work.wait()`` makes the current stream wait on a real device.
- ``get_future()`` is a ``torch.futures.Future`` completed when the call ends (with the output
  tensors, or the DistBackendError), whether or not anyone waits. It does not join the modeled
  streams; ``wait()`` does. ``then(callback)`` runs the callback in the thread that calls
  ``then``, in program order, once the call has ended (``then`` waits for it): NCCL completes a
  work's future when the work is enqueued, so there a callback runs at once in the caller and may
  itself issue collectives and wait for them (DDP's ZeRO hook, ``hook_with_zero_step_interleaved``,
  does); run on the thread that completes calls, such a callback would wait for itself, and
  issued from another thread, its collectives would reach the ranks in different orders. A
  callback added on hccl-py's progress thread (a callback's own ``then``) runs when the call ends.
- ``is_completed()``, ``is_success()``, ``exception()``, ``result()`` as torch's Work.

What an operation does after the data moved (copy a staged tensor back, divide for AVG, copy
the gathered rows into the caller's list) runs when the call ends, before the future completes.

Groups (HCCL's ``HcclGroupStart``/``HcclGroupEnd``, which torch_npu's backend exposes as
``_group_start()``/``_group_end()`` and torch's coalescing manager opens with a device): the
asynchronous calls a thread issues between a start and its end are one group, whatever their
communicator, and complete together, as one launch does on the card: ``wait()`` on any of them
waits for the whole group (and joins the modeled streams at its end), ``is_completed()`` is True
once every call of the group is done. Each call still raises only its own error. The calls are
issued as they are made, in the order every rank makes them; groups nest, the outermost end
closing them all.
"""

from __future__ import annotations

import threading
import time
import weakref
from datetime import timedelta

import torch
import torch.distributed as dist
from torch.futures import Future

from ..engine.progress import on_progress_thread
from ..errors import HcclError, HcclParamError

# Asynchronous calls not waited for yet, for torch.npu.synchronize() (the stand-in waits on them).
_in_flight: weakref.WeakSet = weakref.WeakSet()
_EMPTY: list = []
# This thread's open groups, innermost last, each the HcclWorks issued in it (HCCL's group calls
# are per thread, as NCCL's).
_groups = threading.local()


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
        self._error: BaseException | None = None
        self._finished = threading.Event()
        self._future = InOrderFuture(self._finished)
        self._pending = len(works)
        self._lock = threading.Lock()
        self._group: list | None = None  # the works this one completes with (work.group_end)
        _in_flight.add(self)
        stack = getattr(_groups, "stack", None)
        if stack:
            stack[-1].append(self)
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
        deadline = None if seconds is None else time.monotonic() + seconds
        for member in self._group or (self,):
            member._settle(deadline, timeout)
        _in_flight.discard(self)
        if self._error is not None:
            raise self._error
        return True

    def _settle(self, deadline: float | None, timeout: timedelta | None) -> None:
        """Wait until this call is done (its own error kept for its own ``wait()``), by ``deadline``."""
        for work in self._works:
            try:
                work.wait(_left(deadline))  # joins the card's streams (modeled time)
            except HcclError as err:
                if not work.is_completed():  # wait(timeout) ran out; the call goes on
                    raise backend_error(err, self._what) from err
                break  # the call failed: its error is its own once the rest are done
        if not self._finished.wait(_left(deadline)):
            raise dist.DistBackendError(
                f"hccl-py {self._what}: not done within wait(timeout={timeout}); the call goes on"
            )

    def is_completed(self) -> bool:
        if self._group is None:
            return self._finished.is_set()
        return all(member._finished.is_set() for member in self._group)

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


class InOrderFuture(Future):
    """The future of an asynchronous call whose ``then`` callbacks run in program order, in the
    thread that adds them, once the call has ended (see the module's docstring). ``finished`` is
    set when the call has ended and the future holds its result or error.

    Example: ``dist.all_reduce(t, async_op=True).get_future().then(lambda f: f.value()[0] / 2)``
    returns a future already done, its callback run in this thread."""

    def __init__(self, finished: threading.Event):
        super().__init__()
        self._finished = finished

    def then(self, callback):
        """torch's ``Future.then``, its callback run now, in this thread, after the call ended
        (the call's own HCCL timeout bounds the wait); on the progress thread, when the call ends."""
        if not on_progress_thread():
            self._finished.wait()
        return super().then(callback)


def _left(deadline: float | None) -> float | None:
    return None if deadline is None else max(0.0, deadline - time.monotonic())


class GroupWork(dist.Work):
    """The Work of a closed group (what ``_end_coalescing`` returns): done when all its calls are;
    ``wait()`` raises the first failed call's error."""

    def __init__(self, works: list):
        super().__init__()
        self._works = works

    def wait(self, timeout: timedelta | None = None) -> bool:
        for work in self._works:
            work.wait(timeout)
        return True

    def is_completed(self) -> bool:
        return all(work.is_completed() for work in self._works)

    def is_success(self) -> bool:
        return all(work.is_success() for work in self._works)

    def exception(self):
        return next((work.exception() for work in self._works if work.exception() is not None), None)

    def result(self) -> list:
        return [t for work in self._works for t in work.result()]

    def synchronize(self) -> None:
        self.wait()

    def get_future(self) -> Future:
        futures = [work.get_future() for work in self._works]
        return torch.futures.collect_all(futures).then(lambda done: [t for f in done.value() for t in f.value()])

    def __repr__(self) -> str:
        return f"<GroupWork of {len(self._works)} calls>"


def group_start() -> None:
    """Open a group on this thread (HcclGroupStart): see the module's docstring."""
    stack = getattr(_groups, "stack", None)
    if stack is None:
        stack = _groups.stack = []
    stack.append([])


def group_end() -> dist.Work:
    """Close this thread's innermost group (HcclGroupEnd); its calls then complete together (an
    inner group's join the outer one). Returns the group's Work (the finished Work if it issued
    no asynchronous call)."""
    stack = getattr(_groups, "stack", None)
    if not stack:
        raise HcclParamError(
            "group end without a group start on this thread", arg="group", rule="group_start first", value="end"
        )
    works = stack.pop()
    if stack:
        stack[-1].extend(works)
    else:
        for work in works:
            work._group = works
    return GroupWork(works) if works else DONE


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
