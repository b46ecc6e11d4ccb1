"""One call's walk on this rank: :class:`CallRun` enters, progresses and closes a call's steps
(:mod:`.plan`) over the engine's transport, :class:`BatchRun` progresses several point-to-point
runs as one call, and :func:`errstate_of` keeps numpy's warnings off where a float reduction's
overflow is the user's data. :meth:`Engine.run <hccl_py.engine.executor.Engine.run>` drives them."""

from __future__ import annotations

import contextlib
import time
from typing import Sequence

import numpy as np

from ..modeled.card import Device
from ..modeled.cost_model import StepCost, step_end
from ..transport.base import KIND_INLINE, new_header
from .plan import P2P_SEQ_BIT, RECV_SIDE_BIT, CallContext, StepPlan, run_copies

LIVENESS_CHECK_S = 0.5  # how often a blocked wait checks that the peers it waits for still live
_NONE: list = []  # an empty list never appended to: "nothing pending" without allocating
# A collective that has waited this long for a peer sends it a probe: an empty slice with the
# call's signature under PROBE_INDEX, which no receive takes. A peer whose call of that number has
# another signature finds it as it finds any stray (a mismatch on every rank), so ranks that
# disagree so that nobody sends (each its own root of a reduce) do not wait for HCCL_EXEC_TIMEOUT;
# a peer in the same call drops it. Once per call: a slow peer costs one small message.
PROBE_AFTER_S = 1.0


class PendingSend:
    """A send the transport could not take whole at once (no free slot yet, or several slices)."""

    __slots__ = ("peer", "data", "pos", "msg_index", "stamps", "done")

    def __init__(self, peer: int, data: np.ndarray, msg_index: int, stamps: tuple[float, float]):
        self.peer = peer
        self.data = data
        self.pos = 0
        self.msg_index = msg_index
        self.stamps = stamps  # modeled (sent_at, arrival)
        self.done = False


class PendingRecv:
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
        before: "PendingRecv | None",
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
        engine,  # the Engine that drives it (executor.py, which imports this module)
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
        self.sending: list[PendingSend] = _NONE
        self.receiving: list[PendingRecv] = _NONE  # the current step's receives not yet applied
        self.recvs: list[PendingRecv] = _NONE  # all the current step's receives, in schedule order
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
        if engine.refusals and self.ctx.comm_id in engine.refusals:
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
            if self.receiving and engine.mailbox and self._apply_arrivals():
                progressed = True
            if engine.held_notices and self.ctx.comm_id in engine.held_notices:
                engine.raise_notice(self.ctx)
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
            run_copies(plan.copies, bufs, ufunc)
        if plan.late_copies:
            if self.late_ok is None:
                self.late_ok = bufs[0] is not bufs[1] and not np.may_share_memory(bufs[0], bufs[1])
            if not self.late_ok:
                run_copies(plan.late_copies, bufs, ufunc)
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
                    PendingRecv(
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
            self.engine.post_sends(self.head, self.ctx.sig, plan, bufs, t0, send_costs) if plan.sends else _NONE
        )
        if self.late_ok and plan.late_copies:
            run_copies(plan.late_copies, bufs, ufunc)
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
                header = new_header((KIND_INLINE, *head, send.msg_index, *sig, total, send.pos, n, -1, *send.stamps))
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
        mailbox, transport, ufunc, ctx = engine.mailbox, engine.transport, self.ufunc, self.ctx
        sig = ctx.sig
        progressed = False
        for recv in self.receiving:
            key = recv.key
            box = mailbox.get(key)
            while box:
                inc = box[0]
                count = recv.count
                if inc.sig != sig or inc.msg_count != count:
                    engine.raise_mismatch(ctx, inc)
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


class QuietFloats:
    """``np.errstate(all="ignore")`` for the executor's reductions, at a tenth of its cost (a
        fresh errstate object costs microseconds per call): numpy 2 keeps the error state in a
        context variable (``var``), set here to a state made once (``ignore``; the engine's fast path
    sets it itself). Falls back to np.errstate elsewhere."""

    __slots__ = ("token", "fallback")

    try:
        from numpy._core._ufunc_config import _extobj_contextvar as var
        from numpy._core._ufunc_config import _make_extobj

        ignore = _make_extobj(all="ignore")
    except ImportError:  # numpy 1.x
        var = None

    def __enter__(self):
        if self.var is not None:
            self.token = self.var.set(self.ignore)
        else:
            self.fallback = np.errstate(all="ignore")
            self.fallback.__enter__()

    def __exit__(self, *exc):
        if self.var is not None:
            self.var.reset(self.token)
        else:
            self.fallback.__exit__(*exc)


_NULL = contextlib.nullcontext()


def quiet_floats(ufunc, dtype: np.dtype) -> bool:
    """Whether reductions with ``ufunc`` on ``dtype`` run with numpy's warnings off: overflow and
    NaN in float sums and products are the user's data, as on the device; integer errors stay
    as numpy has them."""
    return (ufunc is np.add or ufunc is np.multiply) and np.dtype(dtype).kind not in "iu"


def errstate_of(run: "CallRun | BatchRun"):
    """numpy's error state for ``run``'s reductions (see :func:`quiet_floats`)."""
    first = run.runs[0] if isinstance(run, BatchRun) else run
    return QuietFloats() if quiet_floats(first.ufunc, first.bufs[0].dtype) else _NULL
