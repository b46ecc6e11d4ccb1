"""Asynchronous calls on this rank's engine: one progress thread drives them, queue by queue
(a stream's calls in order; calls of different streams interleave), ends them and runs their
callbacks. A mixin of :class:`~hccl_py.engine.executor.Engine`, whose state it uses.
"""

from __future__ import annotations

import threading
import time
from collections import deque
from typing import Callable

from ..errors import HcclError, HcclRemoteError
from .plan import P2P_SEQ_BIT
from .run import LIVENESS_CHECK_S, BatchRun, CallRun, errstate_of

# The thread that drives a process's transport and ends its asynchronous calls (callbacks run on it).
PROGRESS_THREAD_NAME = "hccl-py-progress"
POLL_WITHOUT_WAKE_S = (
    0.002  # the progress thread's longest wait on a transport it cannot wake (a new call waits that long)
)


def on_progress_thread() -> bool:
    """Whether the calling thread is this process's progress thread, which ends asynchronous calls
    and runs their callbacks (such code must not wait for a call to end)."""
    return threading.current_thread().name == PROGRESS_THREAD_NAME


class QueuedCall:
    """A queued call: how to start it, how to tell its caller, its run once started."""

    __slots__ = ("key", "start", "finish", "run")

    def __init__(self, key, start, finish):
        self.key = key
        self.start = start
        self.finish = finish
        self.run: CallRun | BatchRun | None = None


class Progress:
    """The Engine's asynchronous calls (see the module doc)."""

    def inline(self) -> bool:
        """Whether a blocking call may run on the caller's thread now: no asynchronous call is
        outstanding (else it queues behind them, as a call on a stream does). Waits the moment
        the progress thread takes to step back from the transport after its last call."""
        if not self._outstanding and not self._driving:  # the common case, without the lock: only
            return True  # this thread submits, so neither can change under it
        with self._cv:
            while self._driving and not self._outstanding:
                self._cv.wait()
            return not self._outstanding

    def submit(
        self,
        key,
        start: Callable[[], "CallRun | BatchRun"],
        finish: Callable[["CallRun | BatchRun | None", HcclError | None], None],
    ) -> None:
        """Queue a call: ``start()`` builds its run when it reaches the head of queue ``key``
        (calls of one queue run one after the other, in issue order; queues progress
        concurrently); ``finish(run, error)`` is called once it ends, on the progress thread."""
        with self._cv:
            queue = self._queues.get(key)
            if queue is None:
                queue = self._queues[key] = deque()
            queue.append(QueuedCall(key, start, finish))
            self._outstanding += 1
            if len(queue) == 1:
                self._ready.append(queue[0])
            if self._thread is None:
                self._thread = threading.Thread(target=self._progress_loop, name=PROGRESS_THREAD_NAME, daemon=True)
                self._thread.start()
            self._cv.notify_all()
        if self._driving and self._wake is not None:
            self._wake()  # it may sleep in the transport's poll: a new call must not wait for that

    def defer(self, fn: Callable[[], None]) -> None:
        """Run ``fn`` on the thread that drives the transport: now when no call is outstanding,
        else on the progress thread between two of its passes (e.g. abandoning a communicator)."""
        with self._cv:
            if self._outstanding or self._driving:
                self._deferred.append(fn)
                return
        fn()

    def _progress_loop(self) -> None:
        transport = self.transport
        active: list[QueuedCall] = []
        while True:
            with self._cv:
                for job in self._ready:
                    active.append(job)
                self._ready.clear()
                while not active and not self._ready:
                    self._driving = False
                    self._cv.notify_all()
                    self._cv.wait()
                    active.extend(self._ready)
                    self._ready.clear()
                self._driving = True
                deferred, self._deferred = self._deferred, []
            for fn in deferred:
                fn()
            finished = []
            for job in active:
                if job.run is None:
                    try:
                        job.run = job.start()
                    except HcclError as err:
                        finished.append((job, err))
                        continue
                try:
                    with errstate_of(job.run):
                        if job.run.advance():
                            if self.mailbox and not job.run.ctx.seq & P2P_SEQ_BIT:
                                self.check_strays(job.run.ctx, finished=True)
                            finished.append((job, None))
                except HcclRemoteError as err:
                    finished.append((job, self._explain(job.run, err)))
                except HcclError as err:
                    finished.append((job, err))
            if finished:
                for job, error in finished:
                    active.remove(job)
                    self._finish(job, error)
                continue
            now = time.monotonic()
            wait = LIVENESS_CHECK_S if self._wake is not None else POLL_WITHOUT_WAKE_S
            for job in list(active):
                try:
                    self._watch(job.run, now)
                except HcclError as err:
                    active.remove(job)
                    self._finish(job, err)
                    continue
                if job.run.deadline is not None:
                    wait = min(wait, max(job.run.deadline - now, 0.0))
            if not active:
                continue
            try:
                incoming = transport.progress(wait)
            except HcclRemoteError as err:  # every run waiting on that peer learns it in its advance
                incoming = []
                for job in list(active):
                    if err.peer is not None and err.peer in job.run.waiting_on():
                        active.remove(job)
                        self._finish(job, self._explain(job.run, err))
            if incoming:
                self._dispatch(incoming)

    def _finish(self, job: "QueuedCall", error: HcclError | None) -> None:
        """A queued call ended: let its queue's next call start, then tell its caller."""
        with self._cv:
            queue = self._queues[job.key]
            queue.popleft()
            if queue:
                self._ready.append(queue[0])
            else:
                del self._queues[job.key]
            self._outstanding -= 1
        try:
            job.finish(job.run, error)
        finally:
            with self._cv:
                self._cv.notify_all()
