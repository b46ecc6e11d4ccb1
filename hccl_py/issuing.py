"""Issuing a call: the one path every call takes from the communicator to the engine.

The communicator checks a call's arguments and resolves its shape (a :class:`Call`, once per
shape); :class:`Issuer` then issues it, in one of three forms that share every step here:

* one call, blocking, with nothing asynchronous outstanding: on the caller's thread, now (the
  fast path: no Work, no progress thread);
* one call queued on the engine's queue for its stream (asynchronous, or blocking behind
  asynchronous calls), its shape known now or settled when it reaches the head of the queue
  (``resolve``: an all-to-all-v's data exchange needs the counts the exchange before it returns);
* a batch of point-to-point calls that progress together (``HcclBatchSendRecv``).

Every form writes the flight record, applies injected faults, joins the call's stream (a call
starts after the calls before it there, and not before the compute that issued it), makes the
:class:`~hccl_py.work.Work` and, when the call fails, hands the failure back to the communicator
(``on_failure``: abort, tell peers, dump) without knowing what a communicator is. The thread
guard is the issuer's too: :func:`entry`, the one entry of every call a communicator's program
makes, takes it before any argument is checked, so a refused thread touches no state.
"""

from __future__ import annotations

import dataclasses
import functools
import time
from threading import get_ident
from typing import Callable, NamedTuple

import numpy as np

from .algorithms.schedule import Schedule
from .context import RankContext
from .device import Stream
from .errors import HcclError, HcclInternalError, HcclMemoryError, HcclParamError
from .executor import P2P_SEQ_BIT, BatchRun, CallContext, Engine
from .records import CallRecord
from .work import Work


class Call(NamedTuple):
    """One call shape on one communicator, resolved once (``Communicator._prepare``)."""

    collective: str
    algo: str
    schedule: Schedule
    costs: tuple | None
    ufunc: object
    nbytes: int
    ctx: CallContext  # its seq is set per call
    dtype_name: str = ""  # for the flight record (numpy's dtype.name is slow to compute)
    notify_on_timeout: bool = False  # tell the peers why, when this rank times out (monitored barrier)
    quiet: bool = False  # its reductions run with numpy's float warnings off (executor.quiet_floats)


class Part(NamedTuple):
    """One call of a batch: its shape, flat buffer (sent from or received into) and number."""

    call: Call
    flat: np.ndarray
    seq: int


class Issuer:
    """Issues one communicator's calls (see the module doc). ``closed()`` gives the reason the
    communicator closed, or None; ``on_failure(call, ctx, record, error, clock)`` is told of a
    failed call, ``on_batch_failure(parts, error)`` of a failed batch."""

    def __init__(
        self,
        rc: RankContext,
        engine: Engine,
        comm_id: int,
        name: str,
        world_ranks: tuple[int, ...],
        closed: Callable[[], str | None],
        on_failure: Callable,
        on_batch_failure: Callable,
    ):
        self._rc = rc
        self._engine = engine
        self._comm_id = comm_id
        self._name = name
        self._world_ranks = world_ranks
        self._closed = closed
        self._on_failure = on_failure
        self._on_batch_failure = on_batch_failure
        # The card's streams these calls run on: collectives on one, point-to-point calls on one
        # per peer and direction, batches on another.
        self._streams: dict[object, Stream] = {}

    # -- the thread guard (taken by entry) -------------------------------------------------------
    def holder(self) -> tuple:
        """(op, seq, communicator, thread id) of the call that holds this rank's communicators."""
        return self._engine.busy_with or ("?", 0, "?", 0)

    # -- issuing --------------------------------------------------------------------------------------
    def stream(self, queue) -> Stream:
        """The communication stream of queue ``queue`` (made at its first call)."""
        stream = self._streams.get(queue)
        if stream is None:
            stream = self._streams[queue] = Stream(f"{self._name}:{queue}", self._rc.device.clock)
        return stream

    def issue(self, call: Call, bufs, dtype: np.dtype, result, seq: int, async_op: bool, queue):
        """Run one call. Blocking with no asynchronous call outstanding: on this thread, now.
        Otherwise it joins the engine's queue ``queue`` (calls of one queue run in issue order)
        and runs on the progress thread; an asynchronous call returns its :class:`Work`, a
        blocking one waits for it. Returns ``result`` (or the Work)."""
        engine = self._engine
        stream = self._streams.get(queue) or self.stream(queue)
        if async_op or not engine.inline():
            return self._queued(call, None, bufs, dtype, result, seq, queue, stream, async_op)
        rc = self._rc
        device = rc.device
        record = rc.recorder.enter(
            CallRecord(
                self._name,
                seq & ~P2P_SEQ_BIT,
                call.collective,
                call.algo,
                call.dtype_name or dtype.name,
                call.ctx.sig.count,
                call.nbytes,
                self._world_ranks,
                device.clock,
                time.monotonic(),
            )
        )
        if rc.pending_faults:
            rc.inject(record)  # entering late (a delay) comes before joining the stream, as when queued
        if stream.clock > device.clock:  # a call it follows on its stream ended later: in order
            device.wait_for(stream.clock)
            record.modeled_start = device.clock
        ctx = call.ctx
        ctx.seq = seq
        schedule = call.schedule
        tmp = rc.scratch(schedule.tmp_count, dtype) if schedule.tmp_count else None
        try:
            engine.run_call(ctx, schedule, (bufs[0], bufs[1], tmp), call.ufunc, call.costs, device, call.quiet)
        except HcclError as err:
            self._on_failure(call, ctx, record, err, device.clock)
            raise
        stream.clock = device.clock
        rc.recorder.complete(record, device.clock, time.monotonic())
        return result

    def issue_later(self, what: str, resolve: Callable[[], Call], bufs, dtype: np.dtype, result, seq: int) -> Work:
        """Issue an asynchronous call on the collective queue whose shape ``resolve()`` settles
        when its turn comes (from what the call before it there returned); ``resolve()`` raising
        fails this call alone. Returns its Work."""
        return self._queued(
            None,
            resolve,
            bufs,
            dtype,
            result,
            seq,
            "collective",
            self.stream("collective"),
            True,
            what=f"{what} #{seq}",
        )

    def _queued(
        self,
        call: Call | None,
        resolve,
        bufs,
        dtype: np.dtype,
        result,
        seq: int,
        queue,
        stream: Stream,
        async_op: bool,
        what: str = "",
    ):
        """A Work whose call starts on ``stream`` once the calls before it there have ended, and
        not before the compute that issued it (modeled)."""
        rc = self._rc
        device = rc.device
        ready = device.clock
        engine = self._engine
        work = Work(what or dataclasses.replace(call.ctx, seq=seq).what, result, device, blocking=not async_op)
        begun = None  # (call, its context, its flight record, its scratch) once its shape is known

        def begin(call: Call, on_device: bool):
            nonlocal ready
            ctx = dataclasses.replace(call.ctx, seq=seq)  # its own: the shape's context is shared by calls in flight
            record = rc.recorder.enter(
                CallRecord(
                    self._name,
                    seq & ~P2P_SEQ_BIT,
                    call.collective,
                    call.algo,
                    call.dtype_name or dtype.name,
                    ctx.sig.count,
                    call.nbytes,
                    self._world_ranks,
                    ready,
                    time.monotonic(),
                )
            )
            if rc.pending_faults:  # a delay starts the call later, as on the inline path
                ready += rc.inject(record, on_device=on_device)
            tmp = (
                np.empty(call.schedule.tmp_count, dtype) if call.schedule.tmp_count else None
            )  # calls in flight do not share scratch
            return call, ctx, record, tmp

        if call is not None:
            begun = begin(call, on_device=True)

        def start():
            nonlocal begun
            if begun is None:  # on the progress thread: the card's clock is its own thread's
                begun = begin(resolve(), on_device=False)
            call, ctx, record, tmp = begun
            self._check_open(ctx)
            stream.clock = max(stream.clock, ready)
            record.modeled_start = work._start_clock = stream.clock
            return engine.call_run(
                ctx,
                call.schedule,
                (bufs[0], bufs[1], tmp),
                call.ufunc,
                call.costs,
                stream,
                device,
                blocking=not async_op,
            )

        def finish(run, error):
            if begun is None:  # failed before its shape was known: nothing of it ran
                work._finish(error, stream.clock)
                return
            call, ctx, record, _ = begun
            if error is not None:
                self._on_failure(call, ctx, record, error, stream.clock)
            else:
                rc.recorder.complete(record, stream.clock, time.monotonic())
            work._finish(error, stream.clock)

        engine.submit((self._comm_id, queue), start, finish)
        return work if async_op else work.wait()

    def issue_batch(self, what: str, parts: list[Part], dtypes: list[np.dtype], result, async_op: bool):
        """Run ``parts`` as one call (``HcclBatchSendRecv``): they progress together, each on
        its own stream from the batch's start; the batch ends when the last of them does."""
        rc = self._rc
        device = rc.device
        engine = self._engine
        stream = self.stream("batch")
        records = []
        for part, dtype in zip(parts, dtypes):
            record = rc.recorder.enter(
                CallRecord(
                    self._name,
                    part.seq & ~P2P_SEQ_BIT,
                    part.call.collective,
                    "batch",
                    dtype.name,
                    part.flat.size,
                    part.call.nbytes,
                    self._world_ranks,
                    device.clock,
                    time.monotonic(),
                )
            )
            if rc.pending_faults:
                rc.inject(record)  # a batch's sends and receives are sends and receives to a fault spec too
            records.append(record)
        ready = device.clock
        work = Work(f"{what} ({len(parts)} items)", result, device, blocking=not async_op)

        def start() -> BatchRun:
            for part in parts:
                self._check_open(part.call.ctx)
            begin = work._start_clock = max(stream.clock, ready)
            return BatchRun(
                [
                    engine.call_run(
                        dataclasses.replace(p.call.ctx, seq=p.seq),
                        p.call.schedule,
                        (p.flat, p.flat, None),
                        None,
                        p.call.costs,
                        Stream("batch", begin),
                        device,
                        blocking=not async_op,
                    )
                    for p in parts
                ]
            )

        def finish(run, error) -> float:
            end = run.end_clock if run is not None else stream.clock
            stream.clock = max(stream.clock, end)
            for record in records:
                if error is not None:
                    rc.recorder.fail(record, error, end, time.monotonic())
                else:
                    rc.recorder.complete(record, end, time.monotonic())
            if error is not None:
                self._on_batch_failure(parts, error)
            return end

        if not async_op and engine.inline():
            run = start()
            try:
                engine.run(run)
            except HcclError as err:
                finish(run, err)
                raise
            work._finish(None, finish(run, None))
            return work.wait()  # joins the streams as a queued blocking batch's does
        engine.submit((self._comm_id, "batch"), start, lambda run, error: work._finish(error, finish(run, error)))
        return work if async_op else work.wait()

    def _check_open(self, ctx: CallContext) -> None:
        """A queued call about to start on a communicator that closed meanwhile fails too."""
        reason = self._closed()
        if reason is not None:
            raise HcclInternalError(
                f"{ctx.what}: the communicator {reason}; create a new one", **ctx.fields(state=reason.split()[1])
            )


def entry(scope: str | None):
    """The one entry of every call a program makes on a communicator (collectives, point to
    point, batches, sub-communicators, ``refuse``). It alone takes the thread guard and names its
    holder; and a call this rank refuses before it was issued (bad input, checked before any byte
    moves) is refused on every rank: the refusal spends the call's number and tells the ranks
    that take part (the communicator's ``_refuse``). ``scope`` says which ranks those are:
    ``collective`` (every member), ``alltoallv`` (the same, two numbers: counts and data),
    ``send``/``recv`` (the peer), ``batch`` (each item's peer); ``None``: nothing to refuse.

    The decorated class hands the rest back through its ``_issuer``, ``_seq`` (its last call's
    number), ``_issued`` (counts calls issued), ``_refuse(scope, args, kwargs, err)``,
    ``_collision(name, thread)`` (the error of a second thread) and ``_fields(name)``. The guard
    is written out here, not called, as it runs on every call (``benchmarks/call_overhead.py``)."""

    def wrap(method):
        name = method.__name__.lstrip("_")

        @functools.wraps(method)
        def call(comm, *args, **kwargs):
            engine = comm._issuer._engine
            me = get_ident()
            if engine.holder == me:  # a call made inside another (split's agreement, all_to_all_v's counts)
                return method(comm, *args, **kwargs)
            if not engine.busy.acquire(False):
                raise comm._collision(name, me)
            engine.holder = me
            engine.busy_with = (name, comm._seq + 1, comm.name, me)
            issued = comm._issued
            try:
                return method(comm, *args, **kwargs)
            except HcclError as err:
                if (
                    scope is not None
                    and comm._issued == issued
                    and (isinstance(err, (HcclParamError, HcclMemoryError)) or err.fields.get("late"))
                ):
                    comm._refuse(scope, args, kwargs, err)
                raise
            except MemoryError:  # numpy could not allocate the call's copy or output (e.g. of a zero-stride view)
                err = HcclMemoryError(
                    f"{name} on '{comm.name}': this host cannot allocate the call's buffers (numpy "
                    "MemoryError); pass smaller buffers, or an out= array",
                    **comm._fields(name),
                    rule="host_memory",
                )
                if scope is not None and comm._issued == issued:
                    comm._refuse(scope, args, kwargs, err)
                raise err from None
            finally:
                engine.holder = None
                engine.busy.release()
                if engine.outbox:  # what another thread asked to send meanwhile (refuse, abort)
                    engine.flush_later()

        return call

    return wrap
