"""Runs a schedule (``algorithms/schedule.py``) through a transport.

One ``Engine`` per process holds the transport, the mailbox of slices that arrived before the
receive they belong to was posted (a peer may be a step or a call ahead), and the notices peers
sent. A schedule is first resolved into ``StepPlan``s (``plan_steps``: world ranks, message
numbers, receive order; once per call shape); a :class:`CallRun` then walks one call's steps
(enter, progress, close), and :meth:`Engine.run` drives it to the end, waiting on the transport
in between. Messages match FIFO per ordered pair; receives into one destination are applied in
schedule order (so the reduction order never depends on arrival order); every slice is checked
against the call's signature (a peer in another call is a mismatch error on every rank); every
wait is bounded by the call's deadline, and a dead peer is named to every member.
"""

from __future__ import annotations

import contextlib
import math
import os
import threading
import time
import weakref
from collections import deque
from dataclasses import dataclass
from typing import Callable, NamedTuple, Sequence

import numpy as np

from ..algorithms.registry import algo_label
from ..algorithms.schedule import Schedule, message_numbers
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
from ..modeled.cost_model import StepCost, step_end
from ..transport.base import KIND_INLINE, KIND_NOTICE, CallSignature, Incoming, Transport, new_header
from ..transport.common import process_exit_code

_UNSTAMPED = (0.0, 0.0)
# The thread that drives a process's transport and ends its asynchronous calls (callbacks run on it).
PROGRESS_THREAD_NAME = "hccl-py-progress"
# The executor writes kind KIND_INLINE and slot -1: a transport that sends a slice another way repacks.
_make_header = new_header
_NONE: list = []  # an empty list never appended to: "nothing pending" without allocating
LIVENESS_CHECK_S = 0.5  # how often a blocked wait checks that the peers it waits for still live
# A collective that has waited this long for a peer sends it a probe: an empty slice with the
# call's signature under PROBE_INDEX, which no receive takes. A peer whose call of that number has
# another signature finds it as it finds any stray (a mismatch on every rank), so ranks that
# disagree so that nobody sends (each its own root of a reduce) do not wait for HCCL_EXEC_TIMEOUT;
# a peer in the same call drops it. Once per call: a slow peer costs one small message.
PROBE_AFTER_S = 1.0
PROBE_INDEX = 0xFFFFFFFF  # the message index of a probe (a schedule's messages count from 0)
_EMPTY = np.empty(0, np.uint8)  # a probe's payload
_SIGNATURES_KEPT = 64  # signatures of a communicator's last calls, to answer a late probe
POLL_WITHOUT_WAKE_S = (
    0.002  # the progress thread's longest wait on a transport it cannot wake (a new call waits that long)
)
NOTICE_FLUSH_S = 1.0  # how long a failing rank tries to deliver its notice to peers with full queues
# How long a rank about to close its transport keeps delivering what it still holds for live
# peers (a notice behind a busy peer's full queue): a rank that exits first must not take the
# cause of a failure with it. Waited only when something is held.
LINGER_S = 5.0
P2P_SEQ_BIT = 1 << 62  # point-to-point messages count in their own sequence space
# A refusal (a call one rank rejected before any byte moved) travels as a notice whose seq carries
# these bits beside the call's own number: the communicator stays usable (see ``Engine.refuse``).
REFUSAL_BIT = 1 << 60
RECV_SIDE_BIT = 1 << 61  # in a point-to-point refusal: the refusing rank was the receiving side
SECONDARY_BIT = 1 << 59  # the refusal reports an earlier refusal late (never reported late in turn)
_REFUSAL_FLAGS = REFUSAL_BIT | SECONDARY_BIT


# Every engine of this process: in a forked child each is marked ``forked`` (no system call per
# collective): a communicator whose engine belongs to the parent of a fork must not be used.
_engines: "weakref.WeakSet[Engine]" = weakref.WeakSet()


def _mark_forked() -> None:
    for engine in _engines:
        engine.forked = True


os.register_at_fork(after_in_child=_mark_forked)


def on_progress_thread() -> bool:
    """Whether the calling thread is this process's progress thread, which ends asynchronous calls
    and runs their callbacks (such code must not wait for a call to end)."""
    return threading.current_thread().name == PROGRESS_THREAD_NAME


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


@dataclass(slots=True)
class CallContext:
    """One call on one communicator, as the executor and its error messages need it."""

    comm_id: int
    comm_name: str
    seq: int
    sig: CallSignature
    world_ranks: tuple[int, ...]  # comm rank -> world rank
    comm_rank: int
    timeout_s: float | None

    @property
    def what(self) -> str:
        """The call in words for messages: ``allreduce #3 on communicator 'world' (rank 1 of 4)``."""
        op = self.op_label
        seq = self.seq & ~P2P_SEQ_BIT
        return f"{op} #{seq} on communicator '{self.comm_name}' (rank {self.comm_rank} of {len(self.world_ranks)})"

    @property
    def op_label(self) -> str:
        """The operation's name; a point-to-point call's side: "recv" where this rank is not the
        sender (the pair shares one signature, whose root is the sender)."""
        op = OpKind(self.sig.op)
        return "recv" if op is OpKind.SEND and self.comm_rank != self.sig.root else op.label

    def fields(self, **more) -> dict:
        """This call as error fields: rank, op, seq, comm (and ``more``)."""
        return {
            "rank": self.comm_rank,
            "op": self.op_label,
            "seq": self.seq & ~P2P_SEQ_BIT,
            "comm": self.comm_name,
            **more,
        }

    def comm_rank_of(self, world_peer: int) -> int:
        """The communicator rank of world rank ``world_peer`` (ValueError when it is no member)."""
        return self.world_ranks.index(world_peer)

    def peer_label(self, world_peer: int) -> str:
        """``world_peer`` as its communicator rank, with the world rank in brackets when they differ."""
        comm_peer = self.world_ranks.index(world_peer)
        return f"{comm_peer}" if comm_peer == world_peer else f"{comm_peer} (world rank {world_peer})"


class _PendingSend:
    """A send the transport could not take whole at once (no free slot yet, or several slices)."""

    __slots__ = ("peer", "data", "pos", "msg_index", "stamps", "done")

    def __init__(self, peer: int, data: np.ndarray, msg_index: int, stamps: tuple[float, float]):
        self.peer = peer
        self.data = data
        self.pos = 0
        self.msg_index = msg_index
        self.stamps = stamps  # modeled (sent_at, arrival)
        self.done = False


class _PendingRecv:
    """A receive of the current step: where its slices go, how far they have come."""

    __slots__ = (
        "peer",
        "dst",
        "count",
        "reduce_with",
        "incoming_first",
        "key",
        "applied",
        "before",
        "started",
        "done",
        "sent_at",
        "arrival",
    )

    def __init__(
        self,
        peer: int,
        dst: np.ndarray,
        reduce_with: np.ndarray | None,
        key: tuple,
        before: "_PendingRecv | None",
        incoming_first: bool = False,
    ):
        self.peer = peer
        self.dst = dst
        self.count = dst.size
        self.reduce_with = reduce_with
        self.incoming_first = incoming_first  # dst = incoming (op) reduce_with (Recv.incoming_first)
        self.key = key  # the mailbox key of its slices: (comm, seq, sender, message index)
        self.applied = 0
        self.before = before  # the receive into the same destination that must be applied first
        self.started = False  # the first slice (with the message's modeled stamps) has been applied
        self.done = False
        self.sent_at = 0.0
        self.arrival = 0.0


class CopyPlan(NamedTuple):
    """A local copy (``reduce_with`` None) or reduction ``dst = reduce_with (op) src``; regions
    as (buffer, start, end)."""

    src_buf: int
    src_start: int
    src_end: int
    dst_buf: int
    dst_start: int
    dst_end: int
    reduce_with: tuple[int, int, int] | None


class SendPlan(NamedTuple):
    """One send of a step, resolved: elements ``start:end`` of buffer ``buf`` to world rank ``peer``."""

    peer: int  # world rank
    buf: int
    start: int
    end: int
    msg_index: int  # its number among this call's messages to ``peer`` (schedule.message_numbers)
    slice_bytes: int  # the transport's largest slice to ``peer``


class RecvPlan(NamedTuple):
    """One receive of a step, resolved: into elements ``start:end`` of buffer ``buf`` from world rank
    ``peer``, reduced with the ``reduce_with`` region (buffer, start, end) when it is not None."""

    peer: int  # world rank
    buf: int
    start: int
    end: int
    reduce_with: tuple[int, int, int] | None
    incoming_first: bool
    msg_index: int
    before: int  # the earlier receive of the step into the same destination (applied first), or -1


class StepPlan(NamedTuple):
    """One step of a schedule with world ranks, message numbers and receive order resolved."""

    copies: tuple[CopyPlan, ...]  # before the sends (a send reads what they write)
    late_copies: tuple[CopyPlan, ...]  # no send of the step reads them: run once the sends are posted
    sends: tuple[SendPlan, ...]
    fanouts: tuple[tuple[int, ...], ...]  # send indices sending one region to several peers: staged once if small
    recvs: tuple[RecvPlan, ...]


def _copy(copies: tuple, bufs, ufunc) -> None:
    """A step's local copies and reductions, in order."""
    for sb, so, se, db, do, de, rw in copies:
        if rw is None:
            np.copyto(bufs[db][do:de], bufs[sb][so:se])
        else:
            ufunc(bufs[rw[0]][rw[1] : rw[2]], bufs[sb][so:se], out=bufs[db][do:de])


def plan_steps(schedule: Schedule, world: tuple[int, ...], slice_bytes) -> list[StepPlan]:
    """``schedule`` resolved for execution: world ranks, message numbers, receive order, which
    copies can run after the sends, and sends of one region to several peers.
    ``slice_bytes(world peer)`` is the transport's largest slice to that peer."""
    plans = []
    for step, (send_numbers, recv_numbers) in zip(schedule.steps, message_numbers(schedule)):
        sends = tuple(
            SendPlan(world[send.peer], send.src.buf, send.src.offset, send.src.end, k, slice_bytes(world[send.peer]))
            for send, k in zip(step.sends, send_numbers)
        )
        recvs = []
        last_into: dict[tuple[int, int], int] = {}
        for i, (recv, k) in enumerate(zip(step.recvs, recv_numbers)):
            dst, rw = recv.dst, recv.reduce_with
            recvs.append(
                RecvPlan(
                    world[recv.peer],
                    dst.buf,
                    dst.offset,
                    dst.end,
                    None if rw is None else (rw.buf, rw.offset, rw.end),
                    recv.incoming_first,
                    k,
                    last_into.get((dst.buf, dst.offset), -1),
                )
            )
            last_into[(dst.buf, dst.offset)] = i
        copies = [
            CopyPlan(
                c.src.buf,
                c.src.offset,
                c.src.end,
                c.dst.buf,
                c.dst.offset,
                c.dst.end,
                None if c.reduce_with is None else (c.reduce_with.buf, c.reduce_with.offset, c.reduce_with.end),
            )
            for c in step.copies
        ]
        # Copies up to the last one whose destination a send reads must come first; the rest
        # overlap with the peers' reads of what this rank sends (receives still wait for them).
        first = 1 + max(
            (
                i
                for i, c in enumerate(copies)
                if any(
                    send.src.buf == c.dst_buf and send.src.offset < c.dst_end and c.dst_start < send.src.end
                    for send in step.sends
                )
            ),
            default=-1,
        )
        if not step.sends and not step.recvs:
            first = len(copies)  # a copy-only step: nothing to overlap with
        same_region: dict[tuple, list[int]] = {}
        for i, send in enumerate(step.sends):
            same_region.setdefault((send.src.buf, send.src.offset, send.src.end), []).append(i)
        fanouts = tuple(tuple(group) for group in same_region.values() if len(group) > 1)
        plans.append(StepPlan(tuple(copies[:first]), tuple(copies[first:]), sends, fanouts, tuple(recvs)))
    return plans


class CallRun:
    """One call of this rank in flight: which step it is in, what that step still sends and
    receives. :meth:`advance` does everything possible without waiting; the engine's driver
    (:meth:`Engine.run`) waits in between. A step runs in three phases:

    1. enter: local copies, then every send handed to the transport as far as it takes it now,
       then the copies no send reads (``StepPlan.late_copies``);
    2. progress: the rest of the sends as room appears; arrived slices applied into their
       destinations (reduced where the schedule says, in schedule order where destinations
       overlap, so reduction order never depends on arrival order), each checked against the
       call's signature;
    3. close: once every send has left and every receive is applied, the modeled clock moves
       by the cost model's ``step_end`` (the simulator's own arithmetic).
    """

    __slots__ = (
        "engine",
        "ctx",
        "plans",
        "nsteps",
        "bufs",
        "ufunc",
        "costs",
        "stream",
        "device",
        "blocking",
        "index",
        "entered",
        "sending",
        "receiving",
        "recvs",
        "t0",
        "send_costs",
        "late_ok",
        "head",
        "deadline",
        "last_liveness",
        "suspects",
        "probe_at",
    )

    def __init__(  # params: a call's run, built once per call on the call path from what the issuer already holds
        self,
        engine: "Engine",
        ctx: CallContext,
        plans: list[StepPlan],
        bufs,
        ufunc,
        step_costs: Sequence[StepCost] | None,
        stream,
        device: Device,
        *,
        blocking: bool,
    ):
        self.engine = engine
        self.ctx = ctx
        self.plans = plans
        self.nsteps = len(plans)
        self.bufs = bufs
        self.ufunc = ufunc
        self.costs = step_costs
        self.stream = stream  # whose ``clock`` the steps advance: the device (a blocking call), or a Stream
        self.device = device  # where the time goes (device.time, device.waited_for)
        self.blocking = blocking  # the caller waits for it: its waiting also counts in device.blocking_wait_s
        self.index = 0  # the current step
        self.entered = False  # the current step's copies ran and its sends were posted
        self.sending: list[_PendingSend] = _NONE
        self.receiving: list[_PendingRecv] = _NONE  # the current step's receives not yet applied
        self.recvs: list[_PendingRecv] = _NONE  # all the current step's receives, in schedule order
        self.t0 = 0.0  # modeled clock when the step's transfers start (its copies done)
        self.send_costs = None
        self.late_ok = None  # copies after the sends assume IN and OUT apart, as the regions name them
        self.head = (engine.world_rank, ctx.comm_id, ctx.seq)
        now = time.monotonic()
        self.deadline = None if ctx.timeout_s is None else now + ctx.timeout_s
        self.last_liveness = now  # when the peers it waits for were last checked
        self.suspects: list[int] = []  # peers found dead at that check (dead twice: gone)
        self.probe_at = now + PROBE_AFTER_S  # when the peers it waits for are probed (once; inf after)
        if not ctx.seq & P2P_SEQ_BIT:
            engine.note_signature(ctx)

    @property
    def done(self) -> bool:
        """Whether every step has finished."""
        return self.index >= self.nsteps

    @property
    def end_clock(self) -> float:
        """The modeled clock (seconds) of the call's stream: when the call ends, once it is done."""
        return self.stream.clock

    def advance(self) -> bool:
        """Move the call as far as it goes without waiting; True once it is complete."""
        engine = self.engine
        if engine._refused and self.ctx.comm_id in engine._refused:
            engine.check_refused(self.ctx, self.key())  # before its first step: nothing of it moved yet
        while True:
            if not self.entered:
                if self.index >= self.nsteps:
                    return True
                if not self._enter(self.plans[self.index]):
                    continue  # a copy-only step: done already
            progressed = self._push_sends() if self.sending else False
            # Only what the driver already took from the transport (the mailbox): asking the
            # transport is the driver's job, once per wait (each ask is a system call).
            if self.receiving and engine._mailbox and self._apply_arrivals():
                progressed = True
            if engine._notices and self.ctx.comm_id in engine._notices:
                engine._raise_notice(self.ctx)
            # Done once every datagram has left: one still queued for a full peer queue would be
            # lost if this rank exited now. (Flushing also releases the peers' slots at once.)
            if not self.sending and not self.receiving and engine.transport.flush():
                self._close()
                continue
            if not progressed:
                return False

    # -- phase 1: enter the step -------------------------------------------------------------
    def _enter(self, plan: StepPlan) -> bool:
        """Copies and sends of the current step; False when the step had nothing else to do."""
        bufs, ufunc = self.bufs, self.ufunc
        if plan.copies:
            _copy(plan.copies, bufs, ufunc)
        if plan.late_copies:
            if self.late_ok is None:
                self.late_ok = bufs[0] is not bufs[1] and not np.may_share_memory(bufs[0], bufs[1])
            if not self.late_ok:
                _copy(plan.late_copies, bufs, ufunc)
        costs = self.costs
        if costs is None:  # modeled time switched off (HCCL_PY_MODELED_TIME=0)
            cost, t0, send_costs = None, 0.0, None
        else:
            cost = costs[self.index]
            t0 = self.t0 = self.stream.clock + cost.copy_s
            send_costs = self.send_costs = cost.send_s
        if not plan.sends and not plan.recvs:
            if cost is not None:
                self.stream.clock = t0
                self.device.time.comm_s += cost.copy_s
            self.index += 1
            return False
        if plan.recvs:
            comm_id, seq = self.head[1], self.head[2]
            recvs = self.recvs = []
            for peer, b, o, e, rw, first, msg_index, before in plan.recvs:
                recvs.append(
                    _PendingRecv(
                        peer,
                        bufs[b][o:e],
                        None if rw is None else bufs[rw[0]][rw[1] : rw[2]],
                        (comm_id, seq, peer, msg_index),
                        None if before < 0 else recvs[before],
                        first,
                    )
                )
            self.receiving = recvs
        else:
            self.recvs = self.receiving = _NONE
        self.sending = (
            self.engine._post_sends(self.head, self.ctx.sig, plan, bufs, t0, send_costs) if plan.sends else _NONE
        )
        if self.late_ok and plan.late_copies:
            _copy(plan.late_copies, bufs, ufunc)
        self.entered = True
        return True

    # -- phase 2: progress -------------------------------------------------------------------
    def _push_sends(self) -> bool:
        """Slices of the pending sends, as far as the transport takes them; True if any left."""
        transport = self.engine.transport
        head, sig = self.head, self.ctx.sig
        progressed = False
        for send in self.sending:
            data = send.data
            total = data.size
            while True:
                n = min(total - send.pos, transport.max_slice_bytes(send.peer) // data.itemsize or 1)
                header = _make_header((KIND_INLINE, *head, send.msg_index, *sig, total, send.pos, n, -1, *send.stamps))
                if not transport.try_send(send.peer, header, data[send.pos : send.pos + n]):
                    break
                send.pos += n
                progressed = True
                if send.pos >= total:
                    send.done = True
                    break
        if progressed:
            self.sending = [s for s in self.sending if not s.done]
        return progressed

    def _apply_arrivals(self) -> bool:
        """Apply every slice in the mailbox that the step's receives can take now; True if any."""
        engine = self.engine
        mailbox, transport, ufunc, ctx = engine._mailbox, engine.transport, self.ufunc, self.ctx
        sig = ctx.sig
        progressed = False
        for recv in self.receiving:
            key = recv.key
            box = mailbox.get(key)
            while box:
                inc = box[0]
                count = recv.count
                if inc.sig != sig or inc.msg_count != count:
                    engine._mismatch(ctx, inc)
                start = inc.offset
                end = start + inc.nelem
                if recv.before is not None and recv.before.applied < end:
                    break  # the earlier receive into this destination goes first
                box.popleft()
                if not recv.started:
                    recv.started = True
                    recv.sent_at, recv.arrival = inc.sent_at, inc.arrival
                if start < end:
                    whole = start == 0 and end == count  # the message in one slice: no views to cut
                    dst = recv.dst if whole else recv.dst[start:end]
                    if recv.reduce_with is None:
                        inc.copy_into(dst)
                    else:
                        other = recv.reduce_with if whole else recv.reduce_with[start:end]
                        if recv.incoming_first:
                            ufunc(inc.array(dst.dtype), other, out=dst)
                        else:
                            ufunc(other, inc.array(dst.dtype), out=dst)
                transport.release(inc)
                recv.applied = end
                progressed = True
                if end >= count:
                    recv.done = True
            if box is not None and not box:
                del mailbox[key]
        if progressed:
            self.receiving = [r for r in self.receiving if not r.done]
        return progressed

    # -- phase 3: close the step -------------------------------------------------------------
    def _close(self) -> None:
        """Advance the modeled clock over the finished step and move to the next one."""
        if self.costs is not None:
            device = self.device
            times = device.time
            recv_s = self.costs[self.index].recv_s
            end, waited = step_end(self.t0, self.send_costs, self.recvs, recv_s)
            times.comm_s += end - self.stream.clock - waited
            if waited:
                times.wait_s += waited
                if self.blocking:
                    device.blocking_wait_s += waited
                waits: list[float] = []  # who it waited for: the same arithmetic again, rarely needed
                step_end(self.t0, self.send_costs, self.recvs, recv_s, waits)
                for recv, wait in zip(self.recvs, waits):
                    if wait:
                        device.waited_for[recv.peer] = device.waited_for.get(recv.peer, 0.0) + wait
            self.stream.clock = end
        self.index += 1
        self.entered = False

    def waiting_on(self) -> list[int]:
        """World ranks this call waits for now: pending sends and receives, full peer queues."""
        return sorted(
            {s.peer for s in self.sending} | {r.peer for r in self.receiving} | set(self.engine.transport.backlog())
        )

    def key(self) -> tuple[int, int]:
        """The key refusals of this call are kept under (``call_key``)."""
        seq = self.ctx.seq
        if not seq & P2P_SEQ_BIT:
            return (seq, -1)
        plan = self.plans[0]
        if plan.sends:
            return (seq, plan.sends[0].peer)
        return (seq | RECV_SIDE_BIT, plan.recvs[0].peer)


class BatchRun:
    """Several point-to-point runs that progress together as one call (HcclBatchSendRecv): no
    order among them can deadlock. Each has its own stream, all starting at the batch's start;
    the batch ends (``end_clock``) when the last of them does."""

    __slots__ = ("runs", "ctx", "deadline", "last_liveness", "suspects")

    def __init__(self, runs: list[CallRun]):
        self.runs = runs
        self.ctx = runs[0].ctx
        deadlines = [r.deadline for r in runs if r.deadline is not None]
        self.deadline = min(deadlines) if deadlines else None
        self.last_liveness = time.monotonic()
        self.suspects: list[int] = []

    @property
    def index(self) -> int:
        """Steps finished, summed over the batch's runs (for the timeout message: step index + 1 of nsteps)."""
        return sum(r.index for r in self.runs)

    @property
    def nsteps(self) -> int:
        """Steps of all the batch's runs together."""
        return sum(r.nsteps for r in self.runs)

    @property
    def end_clock(self) -> float:
        """The modeled clock (seconds) when the last of the batch's runs ends."""
        return max(r.stream.clock for r in self.runs)

    def advance(self) -> bool:
        """Advance every unfinished run as far as it goes without waiting; True once all are complete."""
        done = True
        for run in self.runs:
            if not run.done and not run.advance():
                done = False
        return done

    def waiting_on(self) -> list[int]:
        """World ranks the unfinished runs wait for now."""
        return sorted({peer for run in self.runs if not run.done for peer in run.waiting_on()})


class _Job:
    """A queued call: how to start it, how to tell its caller, its run once started."""

    __slots__ = ("key", "start", "finish", "run")

    def __init__(self, key, start, finish):
        self.key = key
        self.start = start
        self.finish = finish
        self.run: CallRun | BatchRun | None = None


class _QuietFloats:
    """``np.errstate(all="ignore")`` for the executor's reductions, at a tenth of its cost (a
    fresh errstate object costs microseconds per call): numpy 2 keeps the error state in a
    context variable, set here to a state made once. Falls back to np.errstate elsewhere."""

    __slots__ = ("token", "fallback")

    try:
        from numpy._core._ufunc_config import _extobj_contextvar as _var
        from numpy._core._ufunc_config import _make_extobj

        _ignore = _make_extobj(all="ignore")
    except ImportError:  # numpy 1.x
        _var = None

    def __enter__(self):
        if self._var is not None:
            self.token = self._var.set(self._ignore)
        else:
            self.fallback = np.errstate(all="ignore")
            self.fallback.__enter__()

    def __exit__(self, *exc):
        if self._var is not None:
            self._var.reset(self.token)
        else:
            self.fallback.__exit__(*exc)


_NULL = contextlib.nullcontext()


def quiet_floats(ufunc, dtype: np.dtype) -> bool:
    """Whether reductions with ``ufunc`` on ``dtype`` run with numpy's warnings off: overflow and
    NaN in float sums and products are the user's data, as on the device; integer errors stay
    as numpy has them."""
    return (ufunc is np.add or ufunc is np.multiply) and np.dtype(dtype).kind not in "iu"


def _errstate_of(run: "CallRun | BatchRun"):
    """numpy's error state for ``run``'s reductions (see :func:`quiet_floats`)."""
    first = run.runs[0] if isinstance(run, BatchRun) else run
    return _QuietFloats() if quiet_floats(first.ufunc, first.bufs[0].dtype) else _NULL


class ThreadGuard:
    """Held while a call runs: a rank's communicators share one engine, its transport and scratch,
    so one thread at a time (as HCCL's and NCCL's communicators). ``issuing.entry`` takes it on
    every call; ``busy_with`` names the call that holds it in another thread's error."""

    __slots__ = ("busy", "holder", "busy_with")

    def __init__(self) -> None:
        self.busy = threading.Lock()
        self.holder: int | None = None  # the thread holding ``busy`` (a call it makes inside another needs no guard)
        self.busy_with: tuple = ()  # (op, seq, communicator, thread id) of the call holding ``busy``


class Engine:
    """The per-process executor state: transport, mailbox, notices, and the progress thread of
    asynchronous calls."""

    def __init__(self, transport: Transport | None):
        self.transport = transport
        self.exit_codes: dict[int, int] = {}  # peers found gone -> the code they exited with (read while zombies)
        self.world_rank = transport.world_rank if transport is not None else 0
        self._mailbox: dict[tuple[int, int, int, int], deque[Incoming]] = {}
        self._signatures: dict[int, dict[int, CallSignature]] = {}  # comm id -> {seq: its call's signature}
        self._notices: dict[int, list[tuple[int, int, bytes]]] = {}  # comm -> [(seq, world rank, errors.to_wire)]
        self._passed_on: set[int] = set()  # comms whose first notice this rank sent on (pass_on_notice)
        self._abandoned: set[int] = set()
        # Refusals (see ``refuse``): comm -> {call key: (refusing world rank, error in wire form,
        # secondary)} for calls a peer refused; comm -> keys of calls that failed here on a refusal
        # (their slices that still arrive are dropped); notices another thread asked to send.
        self._refused: dict[int, dict[tuple[int, int], tuple[int, bytes, bool]]] = {}
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
        self._queues: dict[object, deque[_Job]] = {}  # queue key -> calls in issue order (the head is running)
        self._ready: list[_Job] = []  # heads the progress thread has not picked up yet
        self._outstanding = 0  # calls submitted and not finished
        self._driving = False  # the progress thread is touching the transport
        self._deferred: list[Callable[[], None]] = []
        self._thread: threading.Thread | None = None
        self._wake = getattr(transport, "wake", None)  # interrupts the transport's wait (shm), else None

    # -- notices: a peer telling a communicator that a call failed -------------------------------
    def unsettled(self, comm_id: int) -> bool:
        """Whether a peer's notice or refusal is held for communicator ``comm_id`` (then see
        ``pending_notice`` and ``refused``)."""
        return comm_id in self._notices or comm_id in self._refused

    def pending_notice(self, comm_id: int) -> tuple[int, int, bytes] | None:
        """The first notice a peer sent communicator ``comm_id`` (seq, sender's world rank, the error in
        wire form), or None."""
        notes = self._notices.get(comm_id)
        return notes[0] if notes else None

    def clear_notices(self, comm_id: int) -> None:
        """Forget the notices held for communicator ``comm_id``."""
        self._notices.pop(comm_id, None)
        self._passed_on.discard(comm_id)

    def pass_on_notice(self, comm_id: int, world_ranks: Sequence[int]) -> None:
        """Send the first notice held for ``comm_id`` on to the other members (not its sender),
        once; called as this rank fails on it. The sender may be off the CPU with the notice still
        queued for a member whose queue is full, while this rank fails and exits: that member
        would then find this rank gone and blame its exit. Passed on, the notice leaves before
        this rank does (``linger``)."""
        notes = self._notices.get(comm_id)
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
                    self._notices.setdefault(inc.comm_id, []).append((inc.seq, inc.src, bytes(inc.body())))
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
            box = self._mailbox.get(key)
            if box is None:
                self._mailbox[key] = box = deque()
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
        self._refused.setdefault(inc.comm_id, {}).setdefault(
            key, (inc.src, bytes(inc.body()), bool(inc.seq & SECONDARY_BIT))
        )

    def refused(self, comm_id: int) -> dict[tuple[int, int], tuple[int, bytes, bool]] | None:
        """Refusals peers sent for calls of communicator ``comm_id`` that this rank has not failed
        yet: {call key: (refusing world rank, error in wire form, secondary)}."""
        return self._refused.get(comm_id)

    def forget_refusals(self, comm_id: int) -> None:
        """Drop the (emptied) table of refusals held for communicator ``comm_id``."""
        self._refused.pop(comm_id, None)

    def check_refused(self, ctx: CallContext, key: tuple[int, int]) -> None:
        """Raise the peer's refusal of the call ``key`` (``ctx``), if one arrived."""
        entry = self._refused[ctx.comm_id].get(key)
        if entry is not None:
            self.fail_key(ctx.comm_id, key)
            raise error_from_refusal(ctx.what, ctx.comm_rank_of(entry[0]), entry[1], ctx.fields())

    def fail_key(self, comm_id: int, key: tuple[int, int]) -> None:
        """Call ``key`` failed on this rank on a refusal: forget its refusal notice and drop its
        slices, those queued and those still to come. On the thread that drives the transport."""
        self._failed.setdefault(comm_id, set()).add(key)
        refused = self._refused.get(comm_id)
        if refused is not None:
            refused.pop(key, None)
            if not refused:
                del self._refused[comm_id]
        seq, peer = key
        if seq & P2P_SEQ_BIT:
            if not seq & RECV_SIDE_BIT:
                return  # a send: nothing of it is queued here
            seq &= ~RECV_SIDE_BIT
        stale = [k for k in self._mailbox if k[0] == comm_id and k[1] == seq and (peer < 0 or k[2] == peer)]
        for k in stale:
            for inc in self._mailbox.pop(k):
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
        self._notices.setdefault(comm_id, []).append((0, self.world_rank, body))
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
        for key in [k for k in self._mailbox if k[0] == comm_id]:
            for inc in self._mailbox.pop(key):
                self.transport.release(inc)
        self.clear_notices(comm_id)
        self._refused.pop(comm_id, None)
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
        with _errstate_of(run):
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
            token = _QuietFloats._var.set(_QuietFloats._ignore) if _QuietFloats._var is not None else None
            try:
                self._drive(run)
            finally:
                if token is not None:
                    _QuietFloats._var.reset(token)
        else:
            self._drive(run)
        if self._mailbox and not ctx.seq & P2P_SEQ_BIT:
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
        if self._mailbox and not run.ctx.seq & P2P_SEQ_BIT:
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
            header = _make_header((KIND_INLINE, *run.head, PROBE_INDEX, *ctx.sig, 0, 0, 0, -1, 0.0, 0.0))
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
        if self._notices.get(ctx.comm_id):
            return self._notice_error(ctx)
        if err.op is None and err.peer in ctx.world_ranks:
            return self._peer_died(ctx, [err.peer])
        return err

    # -- asynchronous calls: a progress thread drives them, queue by queue ---------------------
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
            queue.append(_Job(key, start, finish))
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
        active: list[_Job] = []
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
                    with _errstate_of(job.run):
                        if job.run.advance():
                            if self._mailbox and not job.run.ctx.seq & P2P_SEQ_BIT:
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

    def _finish(self, job: "_Job", error: HcclError | None) -> None:
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

    def _post_sends(self, head: tuple, sig: tuple, plan: StepPlan, bufs, t0: float, send_costs) -> list[_PendingSend]:
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
                peer, _make_header((KIND_INLINE, *head, msg_index, *sig, total, 0, total, -1, *stamps)), data
            ):
                continue
            pending.append(_PendingSend(peer, data, msg_index, stamps))
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
                headers.append(_make_header((KIND_INLINE, *head, send.msg_index, *sig, total, 0, total, -1, *stamps)))
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
        for key, box in self._mailbox.items():
            if key[0] != comm_id or key[1] & P2P_SEQ_BIT or key[1] > seq or not box:
                continue
            inc = box[0]
            if key[3] == PROBE_INDEX:
                if self._probe_agrees(ctx, inc):
                    answered.append(key)
                    continue
                self._mismatch(ctx, inc, self._signatures.get(comm_id, {}).get(inc.seq, ctx.sig))
            if finished or key[1] < seq or inc.sig != ctx.sig:
                self._mismatch(ctx, inc)
        for key in answered:
            for inc in self._mailbox.pop(key):
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
        for key, box in self._mailbox.items():
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

    def _mismatch(self, ctx: CallContext, inc: Incoming, mine_sig: CallSignature | None = None) -> None:
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

    def _raise_notice(self, ctx: CallContext) -> None:
        raise self._notice_error(ctx)

    def _notice_error(self, ctx: CallContext) -> HcclError:
        self.pass_on_notice(ctx.comm_id, ctx.world_ranks)
        seq, src, body = self._notices[ctx.comm_id][0]
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
