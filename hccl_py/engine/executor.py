"""Runs a schedule (``algorithms/schedule.py``) through a transport.

One ``Engine`` per process holds the transport, the mailbox of slices that arrived before the
receive they belong to was posted (a peer may be a step or a call ahead), and the notices peers
sent. A schedule is first resolved into ``StepPlan``s (``plan.py``'s ``plan_steps``: world ranks,
message numbers, receive order; once per call shape); a ``CallRun`` (``run.py``) then walks one
call's steps (enter, progress, close), and :meth:`Engine.run` drives it to the end, waiting on
the transport in between; asynchronous calls go through the progress thread (``progress.py``). Messages match FIFO per ordered pair; receives into one destination are applied in
schedule order (so the reduction order never depends on arrival order); every slice is checked
against the call's signature (a peer in another call is a mismatch error on every rank); every
wait is bounded by the call's deadline, and a dead peer is named to every member.
"""

from __future__ import annotations

import math
import os
import threading
import time
import weakref
from collections import deque
from typing import Callable, Sequence

import numpy as np

from ..algorithms.registry import algo_label
from ..algorithms.schedule import Schedule
from ..collectives import BLOCKS_BIT, OpKind, of_kind
from ..dtypes import NAME_BY_CODE, redop_label
from ..errors import (
    CANN_INCONSISTENT,
    CANN_TIMEOUT,
    HcclError,
    HcclParamError,
    HcclRemoteError,
    HcclTimeoutError,
    from_wire,
    to_wire,
)
from ..modeled.card import Device
from ..modeled.cost_model import StepCost
from ..transport.base import KIND_INLINE, KIND_NOTICE, CallSignature, Incoming, Transport, new_header
from ..transport.common import process_exit_code
from .plan import (
    P2P_SEQ_BIT,
    RECV_SIDE_BIT,
    REFUSAL_BIT,
    SECONDARY_BIT,
    CallContext,
    StepPlan,
    plan_steps,
)
from .progress import Progress, QueuedCall
from .run import LIVENESS_CHECK_S, BatchRun, CallRun, PendingSend, QuietFloats, errstate_of

_UNSTAMPED = (0.0, 0.0)
# Headers the engine and its runs write (new_header) carry kind KIND_INLINE and slot -1: a transport
# that sends a slice another way repacks.
# a probe (see run.PROBE_AFTER_S): an empty slice under this message index, which no receive takes
PROBE_INDEX = 0xFFFFFFFF  # the message index of a probe (a schedule's messages count from 0)
_EMPTY = np.empty(0, np.uint8)  # a probe's payload
_SIGNATURES_KEPT = 64  # signatures of a communicator's last calls, to answer a late probe
NOTICE_FLUSH_S = 1.0  # how long a failing rank tries to deliver its notice to peers with full queues
# How long a rank about to close its transport keeps delivering what it still holds for live
# peers (a notice behind a busy peer's full queue): a rank that exits first must not take the
# cause of a failure with it. Waited only when something is held.
LINGER_S = 5.0
_REFUSAL_FLAGS = REFUSAL_BIT | SECONDARY_BIT


# Every engine of this process: in a forked child each is marked ``forked`` (no system call per
# collective): a communicator whose engine belongs to the parent of a fork must not be used.
_engines: "weakref.WeakSet[Engine]" = weakref.WeakSet()


def _mark_forked() -> None:
    for engine in _engines:
        engine.forked = True


os.register_at_fork(after_in_child=_mark_forked)


def describe_call(sig: tuple, caller: int | None = None) -> str:
    """``allreduce(count=4, dtype=float32, op=sum, algo=ring)``: a call as an error names it. A
    send and its receive share one signature (``src`` its sender): ``caller`` (the rank that made
    the call, in the communicator) names the receiving side ``recv``."""
    sig = CallSignature(*sig)
    op = OpKind(sig.op)
    spec = of_kind(op)
    dtype = NAME_BY_CODE.get(sig.dtype, f"dtype#{sig.dtype}")
    # An all-to-all-v's count is a digest of its counts matrix: a name to compare, not a number.
    if spec is not None and spec.name == "alltoallv":
        count = f"counts matrix #{sig.count & 0xFFFFFFFF:08x}"
    elif sig.count & BLOCKS_BIT:  # an all_gather_v / reduce_scatter_v of blocks of other sizes
        count = f"counts #{sig.count & 0xFFFFFFFF:08x}"
    else:
        count = f"count={sig.count}"
    parts = [count, f"dtype={dtype}"]
    if spec is not None and spec.reduces:
        parts.append(f"op={redop_label(sig.redop)}")
    if spec is not None and spec.rooted:
        parts.append(f"root={sig.root}")
    if op is OpKind.SEND:
        parts.append(f"src={sig.root}")
    else:
        parts.append(f"algo={algo_label(sig.algo)}")
    label = "recv" if op is OpKind.SEND and caller is not None and caller != sig.root else op.label
    return f"{label}({', '.join(parts)})"


class ThreadGuard:
    """Held while a call runs: a rank's communicators share one engine, its transport and scratch,
    so one thread at a time (as HCCL's and NCCL's communicators). ``issuing.entry`` takes it on
    every call; ``busy_with`` names the call that holds it in another thread's error."""

    __slots__ = ("busy", "holder", "busy_with")

    def __init__(self) -> None:
        self.busy = threading.Lock()
        self.holder: int | None = None  # the thread holding ``busy`` (a call it makes inside another needs no guard)
        self.busy_with: tuple = ()  # (op, seq, communicator, thread id) of the call holding ``busy``


class Engine(Progress):
    """The per-process executor state: transport, mailbox, notices, and the progress thread of
    asynchronous calls."""

    def __init__(self, transport: Transport | None):
        self.transport = transport
        self.exit_codes: dict[int, int] = {}  # peers found gone -> the code they exited with (read while zombies)
        self.world_rank = transport.world_rank if transport is not None else 0
        self.mailbox: dict[tuple[int, int, int, int], deque[Incoming]] = {}
        self._signatures: dict[int, dict[int, CallSignature]] = {}  # comm id -> {seq: its call's signature}
        self.held_notices: dict[int, list[tuple[int, int, bytes]]] = {}  # comm -> [(seq, world rank, errors.to_wire)]
        self._passed_on: set[int] = set()  # comms whose first notice this rank sent on (pass_on_notice)
        self._abandoned: set[int] = set()
        # Refusals (see ``refuse``): comm -> {call key: (refusing world rank, error in wire form,
        # secondary)} for calls a peer refused; comm -> keys of calls that failed here on a refusal
        # (their slices that still arrive are dropped); notices another thread asked to send.
        self.refusals: dict[int, dict[tuple[int, int], tuple[int, bytes, bool]]] = {}
        self._failed: dict[int, set[tuple[int, int]]] = {}
        # notices and refusals another thread queued for the thread that drives the transport
        self.outbox: list[tuple[int, tuple[int, int] | None, int, tuple[int, ...], bytes]] = []
        self.drop_next_message = False  # fault injection: the next message this rank sends is lost
        self._plans: dict[tuple, tuple[Schedule, list[StepPlan]]] = {}
        # A transport that can stage one block once for several receivers (shm), else None.
        self._send_shared = getattr(transport, "try_send_shared", None)
        self.owner_pid = os.getpid()
        self.forked = False  # True in a child forked from the process that made this engine: it must not be used
        _engines.add(self)
        self.guard = ThreadGuard()
        # Asynchronous calls (see ``submit``): queues of calls, the progress thread that drives them.
        self._cv = threading.Condition()
        self._queues: dict[object, deque[QueuedCall]] = {}  # queue key -> calls in issue order (the head is running)
        self._ready: list[QueuedCall] = []  # heads the progress thread has not picked up yet
        self._outstanding = 0  # calls submitted and not finished
        self._driving = False  # the progress thread is touching the transport
        self._deferred: list[Callable[[], None]] = []
        self._thread: threading.Thread | None = None
        self._wake = getattr(transport, "wake", None)  # interrupts the transport's wait (shm), else None

    # -- notices: a peer telling a communicator that a call failed -------------------------------
    def unsettled(self, comm_id: int) -> bool:
        """Whether a peer's notice or refusal is held for communicator ``comm_id`` (then see
        ``pending_notice`` and ``refused``)."""
        return comm_id in self.held_notices or comm_id in self.refusals

    def pending_notice(self, comm_id: int) -> tuple[int, int, bytes] | None:
        """The first notice a peer sent communicator ``comm_id`` (seq, sender's world rank, the error in
        wire form), or None."""
        notes = self.held_notices.get(comm_id)
        return notes[0] if notes else None

    def clear_notices(self, comm_id: int) -> None:
        """Forget the notices held for communicator ``comm_id``."""
        self.held_notices.pop(comm_id, None)
        self._passed_on.discard(comm_id)

    def pass_on_notice(self, comm_id: int, world_ranks: Sequence[int]) -> None:
        """Send the first notice held for ``comm_id`` on to the other members (not its sender),
        once; called as this rank fails on it. The sender may be off the CPU with the notice still
        queued for a member whose queue is full, while this rank fails and exits: that member
        would then find this rank gone and blame its exit. Passed on, the notice leaves before
        this rank does (``linger``)."""
        notes = self.held_notices.get(comm_id)
        if not notes or comm_id in self._passed_on or self.transport is None:
            return
        self._passed_on.add(comm_id)
        seq, src, body = notes[0]
        for world_peer in world_ranks:
            if world_peer not in (src, self.transport.world_rank):
                try:
                    self.transport.notify(world_peer, comm_id, seq, body)
                except HcclRemoteError:
                    pass  # a gone peer cannot take it; the others have theirs

    def notify(self, ctx: CallContext, error: HcclError) -> None:
        """Tell every other member of the communicator that this call failed, and why."""
        if self.transport is None:
            return
        body = to_wire(error)
        for world_peer in ctx.world_ranks:
            if world_peer != self.transport.world_rank:
                self.transport.notify(world_peer, ctx.comm_id, ctx.seq, body)
        # The caller raises next and may exit: give a full peer queue a moment to take the notice.
        give_up = time.monotonic() + NOTICE_FLUSH_S
        try:
            while not self.transport.flush() and time.monotonic() < give_up:
                self._dispatch(self.transport.progress(0.01))
        except HcclRemoteError:
            pass  # a peer that is gone cannot take it; the others have theirs

    def _dispatch(self, incoming: list[Incoming]) -> None:
        for inc in incoming:
            if inc.comm_id in self._abandoned:
                self.transport.release(inc)
                continue
            if inc.kind == KIND_NOTICE:
                if inc.seq & REFUSAL_BIT:
                    self._note_refusal(inc)
                else:
                    self.held_notices.setdefault(inc.comm_id, []).append((inc.seq, inc.src, bytes(inc.body())))
                continue
            if self._failed:
                failed = self._failed.get(inc.comm_id)
                if (
                    failed is not None
                    and ((inc.seq | RECV_SIDE_BIT, inc.src) if inc.seq & P2P_SEQ_BIT else (inc.seq, -1)) in failed
                ):
                    self.transport.release(inc)  # a slice of a call that failed on a refusal: stale
                    continue
            key = (inc.comm_id, inc.seq, inc.src, inc.msg_index)
            box = self.mailbox.get(key)
            if box is None:
                self.mailbox[key] = box = deque()
            box.append(inc)

    # -- refusals: a call one rank rejected before any byte of it moved ---------------------------
    # The refusing rank spends the call's number and tells every rank that takes part; each of
    # them fails that call (at once if it waits, else when it reaches it) and drops its slices,
    # so every rank's next call pairs with the others' next call. A rank that had already
    # finished its part (it only sends in that call) reports the refusal late: its next call on
    # the communicator fails on every rank with it (a *secondary* refusal, never reported late in
    # turn, so one refusal costs at most one more call).
    def _note_refusal(self, inc: Incoming) -> None:
        seq = inc.seq & ~(_REFUSAL_FLAGS | RECV_SIDE_BIT)
        if seq & P2P_SEQ_BIT:  # the refusing rank's receive is this rank's send, and the other way round
            key = (seq if inc.seq & RECV_SIDE_BIT else seq | RECV_SIDE_BIT, inc.src)
        else:
            key = (seq, -1)
        failed = self._failed.get(inc.comm_id)
        if failed is not None and key in failed:
            return  # this rank failed that call already (it refused it too)
        self.refusals.setdefault(inc.comm_id, {}).setdefault(
            key, (inc.src, bytes(inc.body()), bool(inc.seq & SECONDARY_BIT))
        )

    def refused(self, comm_id: int) -> dict[tuple[int, int], tuple[int, bytes, bool]] | None:
        """Refusals peers sent for calls of communicator ``comm_id`` that this rank has not failed
        yet: {call key: (refusing world rank, error in wire form, secondary)}."""
        return self.refusals.get(comm_id)

    def forget_refusals(self, comm_id: int) -> None:
        """Drop the (emptied) table of refusals held for communicator ``comm_id``."""
        self.refusals.pop(comm_id, None)

    def check_refused(self, ctx: CallContext, key: tuple[int, int]) -> None:
        """Raise the peer's refusal of the call ``key`` (``ctx``), if one arrived."""
        entry = self.refusals[ctx.comm_id].get(key)
        if entry is not None:
            self.fail_key(ctx.comm_id, key)
            raise error_from_refusal(ctx.what, ctx.comm_rank_of(entry[0]), entry[1], ctx.fields())

    def fail_key(self, comm_id: int, key: tuple[int, int]) -> None:
        """Call ``key`` failed on this rank on a refusal: forget its refusal notice and drop its
        slices, those queued and those still to come. On the thread that drives the transport."""
        self._failed.setdefault(comm_id, set()).add(key)
        refused = self.refusals.get(comm_id)
        if refused is not None:
            refused.pop(key, None)
            if not refused:
                del self.refusals[comm_id]
        seq, peer = key
        if seq & P2P_SEQ_BIT:
            if not seq & RECV_SIDE_BIT:
                return  # a send: nothing of it is queued here
            seq &= ~RECV_SIDE_BIT
        stale = [k for k in self.mailbox if k[0] == comm_id and k[1] == seq and (peer < 0 or k[2] == peer)]
        for k in stale:
            for inc in self.mailbox.pop(k):
                self.transport.release(inc)

    def refuse(
        self, comm_id: int, key: tuple[int, int], peers: Sequence[int], error: HcclError, *, secondary: bool = False
    ) -> None:
        """This rank refuses call ``key`` of communicator ``comm_id``: tell ``peers`` (world ranks)
        why. Safe from the caller's thread: sent by the thread that drives the transport."""
        if self.transport is None:
            return
        wire_seq = key[0] | REFUSAL_BIT | (SECONDARY_BIT if secondary else 0)
        body = to_wire(error)
        with self._cv:
            self.outbox.append((comm_id, key, wire_seq, tuple(peers), body))
        self.defer(self.flush_outbox)

    def abort_everywhere(self, comm_id: int, peers: Sequence[int], error: HcclError) -> None:
        """Abort communicator ``comm_id`` on this rank and on ``peers`` (world ranks) with
        ``error``, from any thread: a call of it running here fails at its next step (the notice
        is this rank's own), the peers' at theirs."""
        body = to_wire(error)
        self.held_notices.setdefault(comm_id, []).append((0, self.world_rank, body))
        if self.transport is None:
            return
        with self._cv:  # sent when the thread that holds the communicators lets go (it may drive the transport now)
            self.outbox.append((comm_id, None, 0, tuple(peers), body))

    def flush_later(self) -> None:
        """Send what ``refuse``/``abort_everywhere`` queued, on the thread that drives the transport."""
        if self.outbox:
            self.defer(self.flush_outbox)

    def idle(self) -> bool:
        """No asynchronous call outstanding and the progress thread away from the transport."""
        return not self._outstanding and not self._driving

    def drain(self) -> None:
        """Wait until no asynchronous call is outstanding."""
        with self._cv:
            while self._outstanding:
                self._cv.wait(0.1)

    def flush_outbox(self) -> None:
        """Send the refusals queued by ``refuse``; on the thread that drives the transport."""
        with self._cv:
            queued, self.outbox = self.outbox, []
        if not queued:
            return
        for comm_id, key, wire_seq, peers, body in queued:
            if key is not None:
                self.fail_key(comm_id, key)
            for peer in peers:
                self.transport.notify(peer, comm_id, wire_seq, body)
        give_up = time.monotonic() + NOTICE_FLUSH_S  # the caller may raise and exit next
        try:
            while not self.transport.flush() and time.monotonic() < give_up:
                self._dispatch(self.transport.progress(0.01))
        except HcclRemoteError:
            pass

    def linger(self) -> None:
        """Before the transport closes: deliver what is still queued for live peers (at most
        LINGER_S), so a peer that waits learns this rank's notice rather than only that it left."""
        if self.transport is None:
            return
        transport = self.transport
        give_up = time.monotonic() + LINGER_S
        while time.monotonic() < give_up and any(transport.peer_alive(p) for p in transport.backlog()):
            try:
                if transport.flush():
                    return
                transport.progress(0.01)  # (what arrives now has no call left to take it)
            except HcclRemoteError:
                pass  # a gone peer's datagrams are dropped; the others' still go

    def abandon(self, comm_id: int) -> None:
        """Forget an aborted or destroyed communicator: free the slots of its queued slices now,
        and of any that still arrive later, so a dead communicator never starves a live one."""
        self._abandoned.add(comm_id)
        for key in [k for k in self.mailbox if k[0] == comm_id]:
            for inc in self.mailbox.pop(key):
                self.transport.release(inc)
        self.clear_notices(comm_id)
        self.refusals.pop(comm_id, None)
        self._failed.pop(comm_id, None)

    # -- execution ---------------------------------------------------------------------------
    def call_run(
        self,
        ctx: CallContext,
        schedule: Schedule,
        bufs: tuple[np.ndarray, np.ndarray, np.ndarray | None],
        ufunc,
        step_costs: Sequence[StepCost] | None,
        stream,
        device: Device,
        *,
        blocking: bool,
    ) -> CallRun:
        """A :class:`CallRun` of ``schedule`` (``bufs``: flat IN, OUT and TMP arrays) whose steps
        advance ``stream.clock`` with the cost model's ``step_costs`` (the simulator's own
        arithmetic, ``cost_model.step_end``; ``None``: the clock stays); ``blocking``: its caller
        waits for it (a blocking call that queued behind asynchronous ones)."""
        return CallRun(
            self, ctx, self._plan(schedule, ctx.world_ranks), bufs, ufunc, step_costs, stream, device, blocking=blocking
        )

    def run(self, run: "CallRun | BatchRun") -> None:
        """Drive ``run`` to its end on this thread, blocking: the path of a blocking call while
        no asynchronous call is outstanding (:meth:`inline` says when)."""
        with errstate_of(run):
            self._drive(run)

    def run_call(
        self,
        ctx: CallContext,
        schedule: Schedule,
        bufs: tuple[np.ndarray, np.ndarray, np.ndarray | None],
        ufunc,
        step_costs: Sequence[StepCost] | None,
        device: Device,
        quiet: bool,
    ) -> None:
        """:meth:`call_run` then :meth:`run` on the device's own clock, in one call: the fast
        path of a blocking call (``quiet``: the call reduces floats, see ``quiet_floats``)."""
        run = CallRun(
            self, ctx, self._plan(schedule, ctx.world_ranks), bufs, ufunc, step_costs, device, device, blocking=True
        )
        if quiet:
            token = QuietFloats.var.set(QuietFloats.ignore) if QuietFloats.var is not None else None
            try:
                self._drive(run)
            finally:
                if token is not None:
                    QuietFloats.var.reset(token)
        else:
            self._drive(run)
        if self.mailbox and not ctx.seq & P2P_SEQ_BIT:
            self.check_strays(ctx, finished=True)

    def _plan(self, schedule: Schedule, world: tuple[int, ...]) -> list[StepPlan]:
        """``plan_steps`` of ``schedule``, once per call shape."""
        key = (id(schedule), world)
        cached = self._plans.get(key)
        if cached is not None and cached[0] is schedule:
            return cached[1]
        plans = plan_steps(schedule, world, self.transport.max_slice_bytes if self.transport is not None else None)
        if len(self._plans) > 4096:
            self._plans.clear()
        self._plans[key] = (schedule, plans)
        return plans

    def _drive(self, run: "CallRun | BatchRun") -> None:
        """Advance ``run`` to its end, waiting for the transport in between; every wait bounded
        by the call's deadline, and a peer found dead (twice, half a second apart) named."""
        transport = self.transport
        try:
            while not run.advance():
                now = time.monotonic()
                if self._watch(run, now):
                    continue  # a suspect peer: drain what it sent before concluding
                wait = LIVENESS_CHECK_S if run.deadline is None else min(LIVENESS_CHECK_S, run.deadline - now)
                incoming = transport.progress(wait)
                if incoming:
                    self._dispatch(incoming)
        except HcclRemoteError as err:
            raise self._explain(run, err) from None

    def _watch(self, run: "CallRun | BatchRun", now: float) -> bool:
        """Raise when ``run``'s deadline has passed or a peer it waits for is found dead twice in
        a row; True when a peer looks dead for the first time (drain before concluding: a peer
        that sent its last data and left is not dead to us)."""
        if run.deadline is not None and now >= run.deadline:
            raise self._timeout(run)
        if now - run.last_liveness < LIVENESS_CHECK_S:
            return False
        run.last_liveness = now
        if self.mailbox and not run.ctx.seq & P2P_SEQ_BIT:
            self.check_strays(run.ctx, finished=False)
        if getattr(run, "probe_at", math.inf) <= now:
            self._probe(run)
        dead = [peer for peer in run.waiting_on() if not self.transport.peer_alive(peer)]
        if dead and dead == run.suspects:
            raise self._peer_died(run.ctx, dead)
        for peer in dead:  # read the code at once: its parent (torchrun, hccl-launch) reaps it soon
            self._note_exit_code(peer)
        run.suspects = dead
        return bool(dead)

    def _probe(self, run: "CallRun") -> None:
        """Send the peers ``run`` waits to receive from a probe of its call (see PROBE_AFTER_S)."""
        run.probe_at = math.inf
        ctx = run.ctx
        for peer in sorted({recv.peer for recv in run.receiving}):
            header = new_header((KIND_INLINE, *run.head, PROBE_INDEX, *ctx.sig, 0, 0, 0, -1, 0.0, 0.0))
            try:
                self.transport.try_send(peer, header, _EMPTY)  # a full queue: the peer is busy, not silent
            except HcclRemoteError:
                pass  # a peer that is gone: the liveness check names it, with the call's fields

    def note_signature(self, ctx: CallContext) -> None:
        """Keep the signature of collective ``ctx`` (its communicator's last calls), for a probe
        that comes after this rank's call has ended."""
        kept = self._signatures.get(ctx.comm_id)
        if kept is None:
            kept = self._signatures[ctx.comm_id] = {}
        kept[ctx.seq] = ctx.sig
        kept.pop(ctx.seq - _SIGNATURES_KEPT, None)

    def _note_exit_code(self, peer: int) -> None:
        pid = self.transport.peer_pid(peer)
        code = None if pid is None or peer in self.exit_codes else process_exit_code(pid)
        if code is not None:
            self.exit_codes[peer] = code

    def _explain(self, run: "CallRun | BatchRun", err: HcclRemoteError) -> HcclError:
        """The error a remote failure becomes: a peer that failed first may have told us why
        before it went (that is the root cause); a peer the transport found gone is named to
        every member."""
        ctx = run.ctx
        try:
            self._dispatch(self.transport.progress(0.0))
        except HcclRemoteError:
            pass
        if self.held_notices.get(ctx.comm_id):
            return self._notice_error(ctx)
        if err.op is None and err.peer in ctx.world_ranks:
            return self._peer_died(ctx, [err.peer])
        return err

    def post_sends(self, head: tuple, sig: tuple, plan: StepPlan, bufs, t0: float, send_costs) -> list[PendingSend]:
        """Hand every send of the step to the transport as far as it takes them now (a small
        message whole, at once); what is left, the step's progress loop sends as room appears."""
        try_send = self.transport.try_send
        itemsize = bufs[1].itemsize
        pending = []
        posted = ()
        if plan.fanouts and self._send_shared is not None and not self.drop_next_message:
            posted = self._post_fanouts(head, sig, plan, bufs, t0, send_costs)
        for i, (peer, b, o, e, msg_index, slice_bytes) in enumerate(plan.sends):
            if posted and i in posted:
                continue
            data = bufs[b][o:e]
            stamps = _UNSTAMPED if send_costs is None else (t0, t0 + send_costs[i])
            if self.drop_next_message:
                self.drop_next_message = False  # lost whole: the receiver must time out, never see part of it
                continue
            total = e - o
            if (total * itemsize <= slice_bytes or total <= 1) and try_send(
                peer, new_header((KIND_INLINE, *head, msg_index, *sig, total, 0, total, -1, *stamps)), data
            ):
                continue
            pending.append(PendingSend(peer, data, msg_index, stamps))
        return pending

    def _post_fanouts(self, head: tuple, sig: tuple, plan: StepPlan, bufs, t0: float, send_costs) -> set[int]:
        """Sends of one region to several peers, staged once for all of them where the
        transport can (``try_send_shared``); the indices of the sends it took."""
        posted: set[int] = set()
        for group in plan.fanouts:
            first = plan.sends[group[0]]
            total = first.end - first.start
            peers, headers = [], []
            for i in group:
                send = plan.sends[i]
                peers.append(send.peer)
                stamps = _UNSTAMPED if send_costs is None else (t0, t0 + send_costs[i])
                headers.append(new_header((KIND_INLINE, *head, send.msg_index, *sig, total, 0, total, -1, *stamps)))
            if self._send_shared(peers, headers, bufs[first.buf][first.start : first.end]):
                posted.update(group)
        return posted

    # -- failures ----------------------------------------------------------------------------
    def _timeout(self, run: "CallRun | BatchRun") -> HcclTimeoutError:
        ctx, index, nsteps = run.ctx, run.index, run.nsteps
        peers = run.waiting_on()
        labels = ", ".join(ctx.peer_label(p) for p in peers)
        return HcclTimeoutError(
            f"{ctx.what}: timed out after {ctx.timeout_s:g} s (HCCL_EXEC_TIMEOUT) in step {index + 1} of {nsteps}. "
            f"Waiting peer rank(s): {labels}. Check that those ranks reached this call "
            f"(a rank that skipped it, or hangs or crashed before it, causes this); this communicator is now aborted "
            f"(CANN: {CANN_TIMEOUT} Communication_Error_Timeout)",
            **ctx.fields(step=index + 1, ranks=[ctx.comm_rank_of(p) for p in peers], error_id=CANN_TIMEOUT),
        )

    def _peer_died(self, ctx, dead: list[int]) -> HcclRemoteError:
        self._note_exit_code(dead[0])
        code = self.exit_codes.get(dead[0])
        if code is None:
            how, then = "exited", "see that rank's own error for the root cause"
        elif code == 0:
            how, then = "exited with code 0", "it finished without making this call (a rank that skipped it?)"
        elif code < 0:
            how, then = f"was killed by signal {-code}", "see that rank's own error, or what killed it"
        else:
            how, then = f"exited with code {code}", "see that rank's own error for the root cause"
        fields = {"exit_code": code} if code is not None else {}
        error = HcclRemoteError(
            f"{ctx.what}: peer rank {ctx.peer_label(dead[0])} {how} while rank {ctx.comm_rank} waited for it; "
            f"{then} (CANN: {CANN_TIMEOUT} Communication_Error_Timeout, what Ascend reports when a peer is gone)",
            **ctx.fields(peer=ctx.comm_rank_of(dead[0]), error_id=CANN_TIMEOUT, **fields),
        )
        # Tell every other member at once: a rank blocked on someone else (a ring neighbour that
        # waits for the dead rank) would otherwise learn only when that one gives up, one
        # neighbour per liveness period.
        self.notify(ctx, error)
        return error

    def check_strays(self, ctx: CallContext, *, finished: bool) -> None:
        """Raise a call mismatch for a slice of one of this communicator's collectives up to
        ``ctx``'s that no receive of this rank will take: one of an earlier call (every call
        before took all it expected), one of this call with another signature, or, once the call
        ``finished``, any of it. A peer that made another call (another operation or root) may
        send where this rank expects nothing: the rank that receives its slices finds it here,
        after its call or while it waits, and every rank learns of it."""
        comm_id, seq = ctx.comm_id, ctx.seq
        answered = []
        for key, box in self.mailbox.items():
            if key[0] != comm_id or key[1] & P2P_SEQ_BIT or key[1] > seq or not box:
                continue
            inc = box[0]
            if key[3] == PROBE_INDEX:
                if self._probe_agrees(ctx, inc):
                    answered.append(key)
                    continue
                self.raise_mismatch(ctx, inc, self._signatures.get(comm_id, {}).get(inc.seq, ctx.sig))
            if finished or key[1] < seq or inc.sig != ctx.sig:
                self.raise_mismatch(ctx, inc)
        for key in answered:
            for inc in self.mailbox.pop(key):
                self.transport.release(inc)

    def _probe_agrees(self, ctx: CallContext, probe: Incoming) -> bool:
        """Whether a peer's probe of its call matches this rank's call of that number (this call's,
        or one that ended: its kept signature; one too old to be kept is taken to match)."""
        if probe.seq == ctx.seq:
            return probe.sig == ctx.sig
        mine = self._signatures.get(ctx.comm_id, {}).get(probe.seq)
        return mine is None or probe.sig == mine

    def take_arrivals(self) -> None:
        """Take in what the transport holds now (notices, slices), without waiting. On the
        thread that drives the transport, with no call outstanding."""
        if self.transport is None:
            return
        try:
            self._dispatch(self.transport.progress(0.0))
        except HcclRemoteError:
            pass  # a peer already gone: the next call names it

    def stray_at_close(self, ctx: CallContext, what: str) -> HcclError | None:
        """At a communicator's destroy (``ctx``: its last call's number, no signature): take in
        what has arrived, then the call mismatch a stray slice of one of its collectives shows
        (see ``check_strays``), told to every member; None when there is none. On the thread
        that drives the transport, with no call outstanding."""
        if self.transport is None:
            return None
        for key, box in self.mailbox.items():
            if key[0] == ctx.comm_id and not key[1] & P2P_SEQ_BIT and key[1] <= ctx.seq and box:
                inc = box[0]
                if key[3] == PROBE_INDEX and self._probe_agrees(ctx, inc):
                    continue
                theirs = describe_call(inc.sig, ctx.comm_rank_of(inc.src))
                error = HcclParamError(
                    f"{what}: call mismatch: rank {ctx.peer_label(inc.src)} called {theirs} as its call #{inc.seq}, "
                    f"which sent this rank a message none of this rank's calls took (its call #{inc.seq} was another). "
                    f"Every rank of a communicator must make the same calls in the same order {_INCONSISTENT}",
                    rule="same_call",
                    **{**ctx.fields(peer=ctx.comm_rank_of(inc.src)), "op": "destroy"},
                    error_id=CANN_INCONSISTENT,
                )
                self.notify(ctx, error)
                return error
        return None

    def raise_mismatch(self, ctx: CallContext, inc: Incoming, mine_sig: CallSignature | None = None) -> None:
        """Raise (and tell every member) the call mismatch ``inc`` shows: a slice of another call,
        or a probe (``mine_sig``: this rank's call of the probe's number)."""
        mine = describe_call(ctx.sig if mine_sig is None else mine_sig, ctx.comm_rank)
        theirs = describe_call(inc.sig, ctx.comm_rank_of(inc.src))
        if inc.msg_index == PROBE_INDEX:
            mine += f" as its call #{inc.seq}"
            theirs += f" and waits for rank {ctx.comm_rank}, whose call sends it nothing"
        elif inc.seq != ctx.seq:
            theirs += f" as its call #{inc.seq}, which sent this rank a message its own call #{inc.seq} did not expect"
        elif inc.sig == ctx.sig:
            theirs += f" with a different schedule ({inc.msg_count} elements in message {inc.msg_index}, expected another size)"
        # Both all-to-all-v's, only the matrices differ: say that, not two digests.
        matrices = (
            inc.sig[:1] == ctx.sig[:1] == (int(OpKind.ALLTOALLV),)
            and inc.sig[1:4] == ctx.sig[1:4]
            and inc.sig != ctx.sig
        )
        error = HcclParamError(
            f"{ctx.what}: call mismatch: rank {ctx.comm_rank} called {mine} but rank {ctx.peer_label(inc.src)} called {theirs}. "
            + (
                "The counts matrix must be the same on every rank"
                if matrices
                else "Every rank of a communicator must make the same calls in the same order"
            )
            + f" {_INCONSISTENT}",
            rule="counts_matrix" if matrices else "same_call",
            **ctx.fields(peer=ctx.comm_rank_of(inc.src)),
            error_id=CANN_INCONSISTENT,
        )
        self.notify(ctx, error)
        raise error

    def raise_notice(self, ctx: CallContext) -> None:
        """Raise the error a peer's held notice for ``ctx``'s communicator tells (passed on to the
        other members first)."""
        raise self._notice_error(ctx)

    def _notice_error(self, ctx: CallContext) -> HcclError:
        self.pass_on_notice(ctx.comm_id, ctx.world_ranks)
        seq, src, body = self.held_notices[ctx.comm_id][0]
        return error_from_notice(
            ctx.what, ctx.world_ranks.index(src) if src in ctx.world_ranks else src, body, ctx.fields()
        )


_INCONSISTENT = f"(CANN: {CANN_INCONSISTENT}, the operator's parameters are inconsistent between ranks)"


def error_from_refusal(what: str, refuser: int, body: bytes, here: dict, *, late: bool = False) -> HcclError:
    """The error a peer's refusal raises on this rank: the refusing rank's own error class and
    fields (``rule``, ``arg``, ...), then this rank's call (``here``) and ``refused_by``, the
    refusing rank. ``late``: the refusal concerns an earlier call this rank had finished."""
    theirs = from_wire(body)
    cls = type(theirs) if isinstance(theirs, HcclError) else HcclRemoteError
    # A refusal passed on (a batch's other items, a late report) names the rank that refused first.
    origin = theirs.fields.get("refused_by", refuser)
    reason = theirs.fields.get("reason", theirs.message)
    fields = {**theirs.fields, **here, "refused_by": origin, "reason": reason}
    when = "an earlier call this rank had already done its part in (it only sent)" if late else "this call"
    via = f" (passed on by rank {refuser})" if origin != refuser else ""
    return cls(
        f"{what}: rank {origin} refused {when} before any data moved{via}: {reason}. "
        f"The call fails on every rank; the communicator stays usable",
        **fields,
    )


def error_from_notice(what: str, reporter: int, body: bytes, here: dict) -> HcclError:
    """The error a peer's notice (``errors.to_wire``) raises on this rank: the peer's mismatch
    report as it is (it names both calls), its timeout as a timeout, any other failure as a
    remote error. Fields: the peer's (``peer``: the rank it concerns, e.g. one that died), then
    this rank's call (``here``) and ``reporter``, the rank that sent the notice."""
    theirs = from_wire(body)
    fields = {**theirs.fields, **here, "reporter": reporter}
    if isinstance(theirs, HcclParamError):
        return HcclParamError(theirs.message, **fields)
    if isinstance(theirs, HcclTimeoutError):
        return HcclTimeoutError(f"{what}: rank {reporter} reported: {theirs.message}", **fields)
    return HcclRemoteError(f"{what}: rank {reporter} reported: {theirs.message}", **fields)
