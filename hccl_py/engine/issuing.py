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
(``on_failure``: abort, tell peers, dump) without knowing what a communicator is. The issuer also
keeps what a communicator agrees on with its peers: its call numbers (:class:`CallCounter`),
whether it is closed, and the refusal and notice protocol (a call refused here fails on every rank
that takes part; a peer's failure reaches this rank's next call). :func:`entry`, the one entry of
every call a communicator's program makes, takes the engine's thread guard before any argument is
checked, so a refused thread touches no state; it reads nothing of the communicator but its
public ``issuer``.
"""

from __future__ import annotations

import dataclasses
import functools
import os
import time
from threading import get_ident
from typing import NamedTuple

import numpy as np

from ..algorithms.schedule import Schedule
from ..collectives import OpKind
from ..collectives import collective as collective_named
from ..errors import HcclError, HcclInternalError, HcclMemoryError, HcclParamError, HcclTimeoutError
from ..modeled.card import Stream
from ..records import CallRecord
from ..transport.base import CallSignature
from ..work import Work
from .context import RankContext
from .executor import error_from_notice, error_from_refusal
from .plan import P2P_SEQ_BIT, RECV_SIDE_BIT, CallContext
from .run import BatchRun


class Call(NamedTuple):
    """One call shape on one communicator, resolved once (``Communicator._prepare``)."""

    collective: str
    algo: str
    schedule: Schedule
    costs: tuple | None
    ufunc: object
    nbytes: int
    ctx: CallContext  # its seq is set per call
    dtype: np.dtype
    dtype_name: str  # for the flight record (numpy's dtype.name is slow to compute)
    notify_on_timeout: bool = False  # tell the peers why, when this rank times out (monitored barrier)
    quiet: bool = False  # its reductions run with numpy's float warnings off (executor.quiet_floats)

    def record(self, seq: int, modeled_start: float, algo: str | None = None) -> CallRecord:
        """The flight record of this call numbered ``seq``, entered at ``modeled_start`` (now, in
        wall time); ``algo`` instead of the call's own (a batch's items say ``batch``)."""
        ctx = self.ctx
        return CallRecord(
            ctx.comm_name,
            seq & ~P2P_SEQ_BIT,
            self.collective,
            algo or self.algo,
            self.dtype_name,
            ctx.sig.count,
            self.nbytes,
            ctx.world_ranks,
            modeled_start,
            time.monotonic(),
        )


class Part(NamedTuple):
    """One call of a batch: its shape, flat buffer (sent from or received into) and number."""

    call: Call
    flat: np.ndarray
    seq: int


def op_of(what: str) -> str:
    """The ``op`` field of an error raised in ``what`` ("all_reduce on 'world'" -> "allreduce", as
    the executor names it; "split on 'world'" -> "split")."""
    name = what.split(" ", 1)[0]
    try:
        return collective_named(name).name
    except HcclParamError:
        return name


@dataclasses.dataclass(slots=True)
class CallCounter:
    """A communicator's call numbers on this rank, which its peers count alike: ``seq`` numbers
    its collectives (the last one's), ``sent``/``received`` its point-to-point calls per peer (comm
    rank) and direction (the n-th send to a peer is its n-th receive from us); ``issued`` counts
    calls issued of any kind (a refusal is an error raised before it moves)."""

    seq: int = 0
    issued: int = 0
    sent: dict = dataclasses.field(default_factory=dict)
    received: dict = dataclasses.field(default_factory=dict)

    def next_p2p(self, sending: bool, peer: int) -> int:
        """The number of the next send to (``sending``) or receive from ``peer``."""
        counters = self.sent if sending else self.received
        counters[peer] = number = counters.get(peer, 0) + 1
        return number


class Issuer:
    """Issues one communicator's calls (see the module doc) and keeps what the communicator agrees
    on with its peers: ``counter`` (its call numbers), ``closed_reason`` (None while usable), the
    refusal and notice protocol, and the failure hand-off (abort, tell peers, dump). Made by the
    communicator; public to the issuing path and to adapters (``comm.issuer``)."""

    def __init__(
        self,
        rc: RankContext,
        comm_id: int,
        name: str,
        world_ranks: tuple[int, ...],
        comm_rank: int,
        timeout_s: float | None,
    ):
        self._rc = rc
        self.engine = rc.engine
        self.guard = rc.engine.guard  # one thread at a time on a rank's communicators (taken by entry)
        self.comm_id = comm_id
        self.name = name
        self.world_ranks = world_ranks
        self.comm_rank = comm_rank
        self.timeout_s = timeout_s  # HCCL_EXEC_TIMEOUT of its calls (None: no limit)
        self.counter = CallCounter()
        self.closed_reason: str | None = None  # "was aborted (...)" or "was destroyed"
        # The card's streams these calls run on: collectives on one, point-to-point calls on one
        # per peer and direction, batches on another.
        self._streams: dict[object, Stream] = {}

    def fields(self, what: str) -> dict:
        """The fields of an error raised in ``what`` ("all_reduce on 'world'"): rank, comm, op."""
        return {"rank": self.comm_rank, "comm": self.name, "op": op_of(what)}

    def context(self, sig: CallSignature, seq: int = 0) -> CallContext:
        """The executor's context of a call of signature ``sig`` (numbered ``seq``, set per call
        otherwise) on this communicator."""
        return CallContext(self.comm_id, self.name, seq, sig, self.world_ranks, self.comm_rank, self.timeout_s)

    # -- closing ------------------------------------------------------------------------------------
    def abort(self, reason: str) -> None:
        """Close the communicator as aborted: its queued slices dropped, later calls fail at once."""
        if self.closed_reason is None:
            self.closed_reason = f"was aborted ({reason})"
            self._abandon()

    def close(self, what: str) -> HcclError | None:
        """Close the communicator as destroyed, once its queued calls have ended; returns a failure
        peers reported that no call of this rank has raised yet (``destroy`` raises it)."""
        if self.closed_reason is not None:
            return None
        self.engine.drain()
        unreported = self._unreported(what)
        self.closed_reason = "was destroyed"
        self._abandon()
        return unreported

    def _abandon(self) -> None:
        engine = self.engine
        if engine.transport is not None:
            engine.defer(lambda: engine.abandon(self.comm_id))

    # -- the refusal and notice protocol ----------------------------------------------------------
    def check_usable(self, what: str) -> None:
        """Raise what keeps the communicator from its next call ``what``: a forked child, a closed
        communicator, a peer's notice of a failed call (the communicator is aborted), a peer's
        refusal of a call this rank had finished. One attribute check in the common case."""
        engine = self.engine
        if engine.forked:  # an attribute, set in a forked child: no system call per collective
            raise HcclInternalError(
                f"{what}: communicator '{self.name}' belongs to process {engine.owner_pid} (rank "
                f"{self.world_ranks[self.comm_rank]}); this process ({os.getpid()}) is a child forked from it and "
                "cannot use it: the sockets and shared memory are the parent's. Run collectives in the rank's own "
                "process; start workers that need their own communicator as ranks (hccl-launch, launch.spawn) or "
                "with multiprocessing's 'spawn' start method",
                **self.fields(what),
                state="forked",
            )
        if self.closed_reason is not None:
            raise HcclInternalError(
                f"{what} on communicator '{self.name}': the communicator {self.closed_reason}; create a new one",
                **self.fields(what),
                state=self.closed_reason.split()[1],
            )
        if not engine.unsettled(self.comm_id):  # the common case: one check per call
            return
        notice = engine.pending_notice(self.comm_id)
        if notice is not None:
            engine.pass_on_notice(self.comm_id, self.world_ranks)
            self.abort("a peer reported a failed call")
            raise self._notice_error(what, notice)
        if engine.refused(self.comm_id) and engine.idle():
            late = self._late_refusal(what)
            if late is not None:
                raise late

    def _notice_error(self, what: str, notice: tuple[int, int, bytes]) -> HcclError:
        seq, src, body = notice
        reporter = self.world_ranks.index(src) if src in self.world_ranks else src
        return error_from_notice(f"{what}: an earlier call failed on a peer", reporter, body, self.fields(what))

    def _unreported(self, what: str) -> HcclError | None:
        """A failure peers reported that no call of this rank has raised yet (a mismatch or a
        refusal of a call it had finished as a sender), or None."""
        engine = self.engine
        if engine.idle():
            engine.take_arrivals()  # a peer's notice may be waiting in the transport
        notice = engine.pending_notice(self.comm_id)
        if notice is not None:
            engine.pass_on_notice(self.comm_id, self.world_ranks)
            return self._notice_error(what, notice)
        if engine.refused(self.comm_id):
            return self._late_refusal(what)
        if engine.idle() and self.counter.seq:
            # A stray of another call (a rank that only sent in its last calls learns here).
            sig = CallSignature(OpKind.BARRIER, 0, 0, 0, 0, 0)
            return engine.stray_at_close(self.context(sig, self.counter.seq), what)
        return None

    def _late_refusal(self, what: str) -> HcclError | None:
        """The error of a peer's refusal of a call this rank had already finished (it only sent
        in it), or None. Refusals of calls not issued yet stay: those calls fail when they run."""
        refused = self.engine.refused(self.comm_id)
        counter = self.counter
        found = None
        for key, (refuser, body, secondary) in list(refused.items()):
            seq, peer = key
            if seq & P2P_SEQ_BIT:
                number = seq & ~(P2P_SEQ_BIT | RECV_SIDE_BIT)
                counters = counter.received if seq & RECV_SIDE_BIT else counter.sent
                issued = number <= counters.get(self.world_ranks.index(peer), 0)
            else:
                issued = seq <= counter.seq
            if not issued:
                continue
            del refused[key]  # done here: reported now (a secondary one was reported by its first refusal)
            if not secondary and found is None:
                found = error_from_refusal(what, self.world_ranks.index(refuser), body, self.fields(what), late=True)
                found.fields["late"] = True
        if not refused:
            self.engine.forget_refusals(self.comm_id)
        return found

    def refuse(self, scope: str, args: tuple, kwargs: dict, err: HcclError) -> None:
        """This rank refused a call before issuing it (:func:`entry`): spend the call's number and
        tell the ranks that take part, so theirs fails too and every rank's next call pairs with
        the others' next call. Nothing to tell when the communicator is closed, or a peer named
        by the call is no rank of it (no peer can be waiting). A refused receive (not in a batch)
        consumes nothing, as MPI's and torch's: it spends no number and tells nobody, and the
        peer's message waits for this rank's next receive from it."""
        if self.closed_reason is not None or scope == "recv":
            return
        secondary = bool(err.fields.get("late"))
        engine = self.engine
        world = self.world_ranks
        counter = self.counter
        if scope in ("collective", "alltoallv"):
            counter.seq += 1
            others = [w for w in world if w != world[self.comm_rank]]
            engine.refuse(self.comm_id, (counter.seq, -1), others, err, secondary=secondary)
            if scope == "alltoallv":
                # its data exchange's number: the others spend it on theirs, which fails with the counts
                counter.seq += 1
            err.fields.setdefault("seq", counter.seq)
            return
        if scope == "batch":
            items = args[0] if args else kwargs.get("items")
            try:
                pairs = [(item[0], item[2]) for item in items]
            except (TypeError, IndexError, KeyError):
                return
        else:
            pairs = [(scope, args[1] if len(args) > 1 else kwargs.get("dst" if scope == "send" else "src"))]
        for kind, peer in pairs:
            if kind not in ("send", "recv") or isinstance(peer, bool) or not isinstance(peer, (int, np.integer)):
                continue
            if not 0 <= peer < len(world) or peer == self.comm_rank:
                continue
            peer = int(peer)
            number = counter.next_p2p(kind == "send", peer)
            key = (P2P_SEQ_BIT | number | (RECV_SIDE_BIT if kind == "recv" else 0), world[peer])
            engine.refuse(self.comm_id, key, [world[peer]], err, secondary=secondary)

    def collision(self, name: str, me: int) -> HcclParamError:
        """A second thread called while this rank's communicators are in use: the ranks cannot agree
        which thread's call comes first, so this communicator is aborted on every rank."""
        op, busy_seq, comm, thread = self.guard.busy_with or ("?", 0, "?", 0)
        reason = (
            f"{name} on communicator '{self.name}' from thread {me} while this rank's communicators were in use by "
            f"thread {thread} ({op} #{busy_seq} on '{comm}')"
        )
        err = HcclParamError(
            f"{reason}: a rank's communicators belong to one thread at a time (as in HCCL and NCCL); communicator "
            f"'{self.name}' is aborted on every rank, because the ranks cannot agree which thread's call comes first. "
            "Call the communicators from one thread, or serialize the calls with a lock, and create a new communicator",
            **self.fields(name),
            rule="thread",
            holder_op=op,
            holder_thread=thread,
            thread=me,
        )
        if self.closed_reason is None:
            self.closed_reason = f"was aborted ({reason})"
            world = self.world_ranks
            self.engine.abort_everywhere(self.comm_id, [w for w in world if w != world[self.comm_rank]], err)
        return err

    def _failed(self, call: "Call", ctx: CallContext, record: CallRecord, err: HcclError, clock: float) -> None:
        """What a failed call leaves behind: its record, an aborted communicator, its peers told
        (monitored barrier), the flight recorder dumped. A call a peer refused leaves only its
        record: the communicator stays usable."""
        rc = self._rc
        rc.recorder.fail(record, err, clock, time.monotonic())
        if "refused_by" in err.fields:
            return
        self.abort(f"{ctx.what} failed: {err.message}")
        if call.notify_on_timeout and isinstance(err, HcclTimeoutError):
            self.engine.notify(ctx, err)
        rc.dump(f"{type(err).__name__} in {ctx.what}")

    def _batch_failed(self, parts: "list[Part]", error: HcclError) -> None:
        """What a failed batch leaves behind (its records are written): when a peer refused one
        item, the others fail with it on both sides and the communicator stays usable; any other
        failure aborts it."""
        if "refused_by" not in error.fields:
            self.abort(f"batch_send_recv on '{self.name}' failed: {error.message}")
            return
        for part in parts:
            sending = part.call.collective == "send"
            first = part.call.schedule.steps[0]
            peer = first.sends[0].peer if sending else first.recvs[0].peer
            key = (part.seq | (0 if sending else RECV_SIDE_BIT), self.world_ranks[peer])
            self.engine.refuse(self.comm_id, key, [self.world_ranks[peer]], error, secondary=True)

    # -- issuing --------------------------------------------------------------------------------------
    def stream(self, queue) -> Stream:
        """The communication stream of queue ``queue`` (made at its first call)."""
        stream = self._streams.get(queue)
        if stream is None:
            stream = self._streams[queue] = Stream(f"{self.name}:{queue}", self._rc.device.clock)
        return stream

    def issue(self, call: Call, bufs, result, async_op: bool = False, seq: int | None = None, queue="collective"):
        """Run one call on ``bufs`` (its flat IN and OUT), numbered ``seq`` (default: the next
        collective number). Blocking with no asynchronous call outstanding: on this thread, now.
        Otherwise it joins the engine's queue ``queue`` (collectives share one; point-to-point
        calls have one per peer and direction; calls of one queue run in issue order) and runs on
        the progress thread; an asynchronous call returns its :class:`Work`, a blocking one waits
        for it. Returns ``result`` (or the Work)."""
        counter = self.counter
        counter.issued += 1
        if seq is None:
            counter.seq += 1
            seq = counter.seq
        engine = self.engine
        stream = self._streams.get(queue) or self.stream(queue)
        if async_op or not engine.inline():
            return self._queued(call, None, bufs, result, seq, queue, async_op)
        rc = self._rc
        device = rc.device
        record = rc.recorder.enter(call.record(seq, device.clock))
        if rc.pending_faults:
            rc.inject(record)  # entering late (a delay) comes before joining the stream, as when queued
        if stream.clock > device.clock:  # a call it follows on its stream ended later: in order
            device.wait_for(stream.clock)
            record.modeled_start = device.clock
        ctx = call.ctx
        ctx.seq = seq
        schedule = call.schedule
        tmp = rc.scratch(schedule.tmp_count, call.dtype) if schedule.tmp_count else None
        try:
            engine.run_call(ctx, schedule, (bufs[0], bufs[1], tmp), call.ufunc, call.costs, device, call.quiet)
        except HcclError as err:
            self._failed(call, ctx, record, err, device.clock)
            raise
        stream.clock = device.clock
        rc.recorder.complete(record, device.clock, time.monotonic())
        return result

    def issue_later(self, what: str, resolve, bufs, result) -> Work:
        """Issue an asynchronous collective whose shape ``resolve()`` (a :class:`Call`) settles when
        its turn comes on the collective queue (from what the call before it there returned);
        ``resolve()`` raising fails this call alone. Returns its Work."""
        counter = self.counter
        counter.issued += 1
        counter.seq += 1
        return self._queued(None, resolve, bufs, result, counter.seq, "collective", True, f"{what} #{counter.seq}")

    def _queued(self, call: Call | None, resolve, bufs, result, seq: int, queue, async_op: bool, what: str = ""):
        """A Work whose call starts on queue ``queue``'s stream once the calls before it there have
        ended, and not before the compute that issued it (modeled)."""
        rc = self._rc
        device = rc.device
        ready = device.clock
        engine = self.engine
        stream = self.stream(queue)
        work = Work(what or dataclasses.replace(call.ctx, seq=seq).what, result, device, blocking=not async_op)
        begun = None  # (call, its context, its flight record, its scratch) once its shape is known

        def begin(call: Call, on_device: bool):
            nonlocal ready
            ctx = dataclasses.replace(call.ctx, seq=seq)  # its own: the shape's context is shared by calls in flight
            record = rc.recorder.enter(call.record(seq, ready))
            if rc.pending_faults:  # a delay starts the call later, as on the inline path
                ready += rc.inject(record, on_device=on_device)
            tmp = (
                np.empty(call.schedule.tmp_count, call.dtype) if call.schedule.tmp_count else None
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
            record.modeled_start = stream.clock
            work.started_at(stream.clock)
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
                work.finish(error, stream.clock)
                return
            call, ctx, record, _ = begun
            if error is not None:
                self._failed(call, ctx, record, error, stream.clock)
            else:
                rc.recorder.complete(record, stream.clock, time.monotonic())
            work.finish(error, stream.clock)

        engine.submit((self.comm_id, queue), start, finish)
        return work if async_op else work.wait()

    def issue_batch(self, what: str, parts: list[Part], result, async_op: bool):
        """Run ``parts`` as one call (``HcclBatchSendRecv``): they progress together, each on
        its own stream from the batch's start; the batch ends when the last of them does."""
        self.counter.issued += 1
        rc = self._rc
        device = rc.device
        engine = self.engine
        stream = self.stream("batch")
        records = []
        for part in parts:
            record = rc.recorder.enter(part.call.record(part.seq, device.clock, algo="batch"))
            if rc.pending_faults:
                rc.inject(record)  # a batch's sends and receives are sends and receives to a fault spec too
            records.append(record)
        ready = device.clock
        work = Work(f"{what} ({len(parts)} items)", result, device, blocking=not async_op)

        def start() -> BatchRun:
            for part in parts:
                self._check_open(part.call.ctx)
            begin = max(stream.clock, ready)
            work.started_at(begin)
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
                self._batch_failed(parts, error)
            return end

        if not async_op and engine.inline():
            run = start()
            try:
                engine.run(run)
            except HcclError as err:
                finish(run, err)
                raise
            work.finish(None, finish(run, None))
            return work.wait()  # joins the streams as a queued blocking batch's does
        engine.submit((self.comm_id, "batch"), start, lambda run, error: work.finish(error, finish(run, error)))
        return work if async_op else work.wait()

    def _check_open(self, ctx: CallContext) -> None:
        """A queued call about to start on a communicator that closed meanwhile fails too."""
        reason = self.closed_reason
        if reason is not None:
            raise HcclInternalError(
                f"{ctx.what}: the communicator {reason}; create a new one", **ctx.fields(state=reason.split()[1])
            )


def entry(scope: str | None, name: str | None = None):
    """The one entry of every call a program makes on a communicator (collectives, point to
    point, batches, sub-communicators, ``refuse``). It alone takes the thread guard and names its
    holder; and a call this rank refuses before it was issued (bad input, checked before any byte
    moves) is refused on every rank: the refusal spends the call's number and tells the ranks
    that take part (:meth:`Issuer.refuse`). ``scope`` says which ranks those are:
    ``collective`` (every member), ``alltoallv`` (the same, two numbers: counts and data),
    ``send``/``recv`` (the peer), ``batch`` (each item's peer); ``None``: nothing to refuse.
    ``name``: what errors call the method (default: its own name).

    The decorated class gives its :class:`Issuer` as ``issuer``. The guard is written out here,
    not called, as it runs on every call (``benchmarks/call_overhead.py``)."""

    def wrap(method):
        label = name or method.__name__.lstrip("_")

        @functools.wraps(method)
        def call(comm, *args, **kwargs):
            issuer = comm.issuer
            guard = issuer.guard
            me = get_ident()
            if guard.holder == me:  # a call made inside another (split's agreement, all_to_all_v's counts)
                return method(comm, *args, **kwargs)
            if not guard.busy.acquire(False):
                raise issuer.collision(label, me)
            counter = issuer.counter
            guard.holder = me
            guard.busy_with = (label, counter.seq + 1, issuer.name, me)
            issued = counter.issued
            try:
                return method(comm, *args, **kwargs)
            except HcclError as err:
                if (
                    scope is not None
                    and counter.issued == issued
                    and (isinstance(err, (HcclParamError, HcclMemoryError)) or err.fields.get("late"))
                ):
                    issuer.refuse(scope, args, kwargs, err)
                raise
            except MemoryError:  # numpy could not allocate the call's copy or output (e.g. of a zero-stride view)
                err = HcclMemoryError(
                    f"{label} on '{issuer.name}': this host cannot allocate the call's buffers (numpy "
                    "MemoryError); pass smaller buffers, or an out= array",
                    **issuer.fields(label),
                    rule="host_memory",
                )
                if scope is not None and counter.issued == issued:
                    issuer.refuse(scope, args, kwargs, err)
                raise err from None
            finally:
                guard.holder = None
                guard.busy.release()
                if issuer.engine.outbox:  # what another thread asked to send meanwhile (refuse, abort)
                    issuer.engine.flush_later()

        return call

    return wrap
