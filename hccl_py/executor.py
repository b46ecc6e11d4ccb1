"""Runs a schedule (``algorithms/schedule.py``) through a transport.

One ``Engine`` per process holds the transport, the mailbox of slices that arrived before the
receive they belong to was posted (a peer may be a step or a call ahead), and the notices peers
sent. ``Engine.run`` executes one rank's schedule of one call: it matches messages FIFO per
ordered pair, applies receives in schedule order where destinations overlap (so the reduction
order never depends on arrival order), checks that every peer's call is the same call, and
bounds every wait by the call's deadline.
"""

from __future__ import annotations

import os
import threading
import time
from collections import deque
from dataclasses import dataclass
from enum import IntEnum
from typing import NamedTuple, Sequence

import numpy as np

from .algorithms.schedule import Schedule
from .cost_model import StepCost, step_end
from .device import Device
from .dtypes import DTYPES_BY_CODE, ReduceOp
from .errors import HcclError, HcclParamError, HcclRemoteError, HcclTimeoutError, from_wire, to_wire
from .transport.base import KIND_NOTICE, CallSignature, Incoming, Transport

_UNSTAMPED = (0.0, 0.0)
LIVENESS_CHECK_S = 0.5
NOTICE_FLUSH_S = 1.0  # how long a failing rank tries to deliver its notice to peers with full queues  # how often a blocked wait checks that the peers it waits for still live
P2P_SEQ_BIT = 1 << 62  # point-to-point messages count in their own sequence space


# This process's pid, kept current across fork() without a system call per collective: a
# communicator whose engine was made in another process (the parent of a fork) must not be used.
_this_process = [os.getpid()]
os.register_at_fork(after_in_child=lambda: _this_process.__setitem__(0, os.getpid()))


class OpKind(IntEnum):
    ALLREDUCE = 1
    ALLGATHER = 2
    BROADCAST = 3
    REDUCE = 4
    REDUCE_SCATTER = 5
    BARRIER = 6
    SEND = 7

    @property
    def label(self) -> str:
        return self.name.lower()


def describe_call(sig: tuple, algo_names: tuple[str, ...]) -> str:
    sig = CallSignature(*sig)
    op = OpKind(sig.op)
    dtype = DTYPES_BY_CODE.get(sig.dtype, f"dtype#{sig.dtype}")
    parts = [f"count={sig.count}", f"dtype={dtype}"]
    if op in (OpKind.ALLREDUCE, OpKind.REDUCE, OpKind.REDUCE_SCATTER):
        parts.append(f"op={ReduceOp(sig.redop).name.lower()}")
    if op in (OpKind.BROADCAST, OpKind.REDUCE):
        parts.append(f"root={sig.root}")
    if op is OpKind.SEND:
        parts.append(f"src={sig.root}")
    elif 0 <= sig.algo < len(algo_names):
        parts.append(f"algo={algo_names[sig.algo]}")
    return f"{op.label}({', '.join(parts)})"


@dataclass(slots=True)
class CallContext:
    """One call on one communicator, as the executor and its error messages need it."""

    comm_id: int
    comm_name: str
    seq: int
    sig: CallSignature
    world_ranks: tuple[int, ...]  # comm rank -> world rank
    comm_rank: int
    algo_names: tuple[str, ...]
    timeout_s: float | None

    @property
    def what(self) -> str:
        op = OpKind(self.sig.op).label
        seq = self.seq & ~P2P_SEQ_BIT
        return f"{op} #{seq} on communicator '{self.comm_name}' (rank {self.comm_rank} of {len(self.world_ranks)})"

    def fields(self, **more) -> dict:
        """This call as error fields: rank, op, seq, comm (and ``more``)."""
        return {"rank": self.comm_rank, "op": OpKind(self.sig.op).label, "seq": self.seq & ~P2P_SEQ_BIT, "comm": self.comm_name,
                **more}

    def comm_rank_of(self, world_peer: int) -> int:
        return self.world_ranks.index(world_peer)

    def peer_label(self, world_peer: int) -> str:
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
    __slots__ = ("peer", "dst", "reduce_with", "incoming_first", "key", "applied", "before", "started", "done", "sent_at", "arrival")

    def __init__(self, peer: int, dst: np.ndarray, reduce_with: np.ndarray | None, key: tuple, before: "_PendingRecv | None",
                 incoming_first: bool = False):
        self.peer = peer
        self.dst = dst
        self.reduce_with = reduce_with
        self.incoming_first = incoming_first  # dst = incoming (op) reduce_with (Recv.incoming_first)
        self.key = key  # the mailbox key of its slices: (comm, seq, sender, message index)
        self.applied = 0
        self.before = before  # the receive into the same destination that must be applied first
        self.started = False  # the first slice (with the message's modeled stamps) has been applied
        self.done = False
        self.sent_at = 0.0
        self.arrival = 0.0


def _copy(copies: tuple, bufs, ufunc) -> None:
    """A step's local copies and reductions, in order."""
    for sb, so, se, db, do, de, rw in copies:
        if rw is None:
            np.copyto(bufs[db][do:de], bufs[sb][so:se])
        else:
            ufunc(bufs[rw[0]][rw[1]:rw[2]], bufs[sb][so:se], out=bufs[db][do:de])


class _StepPlan(NamedTuple):
    copies: tuple  # (src buf, start, end, dst buf, start, end, reduce_with (buf, start, end) | None), before the sends
    late_copies: tuple  # the same, for copies no send of the step reads: run once the sends are posted
    sends: tuple  # (world peer, buf, start, end, message index, slice bytes)
    fanouts: tuple  # send indices that send one region to several peers, e.g. ((0, 1, 2),): staged once if small
    recvs: tuple  # (world peer, buf, start, end, reduce_with (buf, start, end, incoming first) | None, message index, earlier recv | -1)


class Engine:
    """The per-process executor state: transport, mailbox, notices."""

    def __init__(self, transport: Transport | None):
        self.transport = transport
        self._mailbox: dict[tuple[int, int, int, int], deque[Incoming]] = {}
        self._notices: dict[int, list[tuple[int, int, bytes]]] = {}  # comm -> [(seq, world rank, errors.to_wire)]
        self._abandoned: set[int] = set()
        self.drop_next_message = False  # fault injection: the next message this rank sends is lost
        self._plans: dict[tuple, tuple[Schedule, list[_StepPlan]]] = {}
        # A transport that can stage one block once for several receivers (shm), else None.
        self._send_shared = getattr(transport, "try_send_shared", None)
        self.owner_pid = _this_process[0]
        # Held while a call runs: a rank's communicators share this engine, its transport and
        # scratch, so one thread at a time (as HCCL's and NCCL's communicators).
        self.busy = threading.Lock()
        self.busy_with: tuple = ()  # (op, seq, communicator, thread id) holding ``busy``, for another thread's error

    @property
    def forked(self) -> bool:
        """True in a child forked from the process that made this engine (it must not be used)."""
        return self.owner_pid != _this_process[0]

    # -- notices: a peer telling a communicator that a call failed -------------------------------
    def pending_notice(self, comm_id: int) -> tuple[int, int, bytes] | None:
        notes = self._notices.get(comm_id)
        return notes[0] if notes else None

    def clear_notices(self, comm_id: int) -> None:
        self._notices.pop(comm_id, None)

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
                self._notices.setdefault(inc.comm_id, []).append((inc.seq, inc.src, bytes(inc.payload)))
                continue
            key = (inc.comm_id, inc.seq, inc.src, inc.msg_index)
            box = self._mailbox.get(key)
            if box is None:
                self._mailbox[key] = box = deque()
            box.append(inc)

    def abandon(self, comm_id: int) -> None:
        """Forget an aborted or destroyed communicator: free the slots of its queued slices now,
        and of any that still arrive later, so a dead communicator never starves a live one."""
        self._abandoned.add(comm_id)
        for key in [k for k in self._mailbox if k[0] == comm_id]:
            for inc in self._mailbox.pop(key):
                self.transport.release(inc)
        self.clear_notices(comm_id)

    # -- execution ---------------------------------------------------------------------------
    def run(self, ctx: CallContext, schedule: Schedule, bufs: tuple[np.ndarray, np.ndarray, np.ndarray | None], ufunc,
            step_costs: Sequence[StepCost] | None, device: Device) -> None:
        """Execute ``schedule`` for this rank; ``bufs`` are flat IN, OUT and TMP arrays.

        ``step_costs`` (from the cost model) advance ``device.clock`` step by step with the same
        arithmetic as the simulator: see ``cost_model.step_end``; ``None`` leaves the clock alone.
        """
        if (ufunc is np.add or ufunc is np.multiply) and bufs[0].dtype.kind not in "iu":
            with np.errstate(all="ignore"):  # overflow and NaN are the user's data, as on the device
                self._run(ctx, schedule, bufs, ufunc, step_costs, device)
        else:
            self._run(ctx, schedule, bufs, ufunc, step_costs, device)

    def _plan(self, schedule: Schedule, world: tuple[int, ...]) -> list[_StepPlan]:
        """The schedule with world ranks, message indices and receive ordering resolved: the
        part of the work that is the same on every call with this shape, done once."""
        key = (id(schedule), world)
        cached = self._plans.get(key)
        if cached is not None and cached[0] is schedule:
            return cached[1]
        plans = []
        sent: dict[int, int] = {}
        received: dict[int, int] = {}
        for step in schedule.steps:
            sends = []
            for send in step.sends:
                peer = world[send.peer]
                sends.append((peer, send.src.buf, send.src.offset, send.src.end, sent.get(peer, 0), self.transport.max_slice_bytes(peer)))
                sent[peer] = sends[-1][4] + 1
            recvs = []
            last_into: dict[tuple[int, int], int] = {}
            for i, recv in enumerate(step.recvs):
                peer = world[recv.peer]
                dst, rw = recv.dst, recv.reduce_with
                recvs.append((peer, dst.buf, dst.offset, dst.end, None if rw is None else (rw.buf, rw.offset, rw.end, recv.incoming_first),
                              received.get(peer, 0), last_into.get((dst.buf, dst.offset), -1)))
                received[peer] = recvs[-1][5] + 1
                last_into[(dst.buf, dst.offset)] = i
            copies = [(c.src.buf, c.src.offset, c.src.end, c.dst.buf, c.dst.offset, c.dst.end,
                       None if c.reduce_with is None else (c.reduce_with.buf, c.reduce_with.offset, c.reduce_with.end))
                      for c in step.copies]
            # Copies up to the last one whose destination a send reads must come first; the rest
            # overlap with the peers' reads of what this rank sends (receives still wait for them).
            first = 1 + max((i for i, (_, _, _, db, do, de, _) in enumerate(copies)
                             if any(send.src.buf == db and send.src.offset < de and do < send.src.end for send in step.sends)), default=-1)
            if not step.sends and not step.recvs:
                first = len(copies)  # a copy-only step: nothing to overlap with
            same_region: dict[tuple, list[int]] = {}
            for i, send in enumerate(step.sends):
                same_region.setdefault((send.src.buf, send.src.offset, send.src.end), []).append(i)
            fanouts = tuple(tuple(group) for group in same_region.values() if len(group) > 1)
            plans.append(_StepPlan(copies=tuple(copies[:first]), late_copies=tuple(copies[first:]), sends=tuple(sends),
                                   fanouts=fanouts, recvs=tuple(recvs)))
        if len(self._plans) > 4096:
            self._plans.clear()
        self._plans[key] = (schedule, plans)
        return plans

    def _run(self, ctx: CallContext, schedule: Schedule, bufs, ufunc, step_costs, device: Device) -> None:
        deadline = None if ctx.timeout_s is None else time.monotonic() + ctx.timeout_s
        plans = self._plan(schedule, ctx.world_ranks)
        nsteps = len(plans)
        times = device.time
        head = (self.transport.world_rank if self.transport is not None else 0, ctx.comm_id, ctx.seq)
        comm_seq = (ctx.comm_id, ctx.seq)
        late_ok = None
        for index, plan in enumerate(plans):
            if plan.copies:
                _copy(plan.copies, bufs, ufunc)
            if plan.late_copies:
                if late_ok is None:  # copies after the sends assume IN and OUT apart, as the regions name them
                    late_ok = bufs[0] is not bufs[1] and not np.may_share_memory(bufs[0], bufs[1])
                if not late_ok:
                    _copy(plan.late_copies, bufs, ufunc)
            if step_costs is None:  # modeled time switched off (HCCL_PY_MODELED_TIME=0)
                cost, t0, send_costs = None, 0.0, None
            else:
                cost = step_costs[index]
                t0 = device.clock + cost.copy_s
                send_costs = cost.send_s
            if not plan.sends and not plan.recvs:
                if cost is not None:
                    device.clock = t0
                    times.comm_s += cost.copy_s
                continue
            recvs: list[_PendingRecv] = []
            for peer, b, o, e, rw, msg_index, before in plan.recvs:
                recvs.append(_PendingRecv(peer, bufs[b][o:e], None if rw is None else bufs[rw[0]][rw[1]:rw[2]],
                                          (*comm_seq, peer, msg_index), None if before < 0 else recvs[before],
                                          rw is not None and rw[3]))
            try:
                pending = self._post_sends(head, ctx.sig, plan, bufs, t0, send_costs) if plan.sends else ()
                if late_ok and plan.late_copies:
                    _copy(plan.late_copies, bufs, ufunc)
                self._progress_step(ctx, head, index, nsteps, pending, recvs, ufunc, deadline)
            except HcclRemoteError as err:
                # A peer that failed first may have told us why before it went: that is the root cause.
                self._dispatch(self.transport.progress(0.0))
                if self._notices.get(ctx.comm_id):
                    self._raise_notice(ctx)
                if err.op is None and err.peer in ctx.world_ranks:
                    # From the transport (a send to a peer that is gone): as when the death is
                    # noticed while waiting, name this call and the peer as this communicator
                    # numbers it, and tell every other member at once. Otherwise a neighbour
                    # that sends to this rank after it exits names this rank, not the dead one.
                    error = HcclRemoteError(f"{ctx.what}: {err.message}", **ctx.fields(peer=ctx.comm_rank_of(err.peer)))
                    self.notify(ctx, error)
                    raise error from None
                raise
            if cost is not None:
                end, waited = step_end(t0, send_costs, recvs, cost.recv_s)
                times.comm_s += end - device.clock - waited
                if waited:
                    times.wait_s += waited
                    waits: list[float] = []  # who it waited for: the same arithmetic again, rarely needed
                    step_end(t0, send_costs, recvs, cost.recv_s, waits)
                    for recv, wait in zip(recvs, waits):
                        if wait:
                            device.waited_for[recv.peer] = device.waited_for.get(recv.peer, 0.0) + wait
                device.clock = end

    def _post_sends(self, head: tuple, sig: tuple, plan: _StepPlan, bufs, t0: float, send_costs) -> list[_PendingSend]:
        """Hand every send of the step to the transport as far as it takes them now (a small
        message whole, at once); what is left, the step's progress loop sends as room appears."""
        try_send = self.transport.try_send
        itemsize = bufs[1].itemsize
        pending = []
        posted = ()
        if plan.fanouts and self._send_shared is not None and not self.drop_next_message:
            posted = self._post_fanouts(head, sig, plan, bufs, t0, send_costs)
        for i, (peer, b, o, e, msg_index, slice_bytes) in enumerate(plan.sends):
            if i in posted:
                continue
            data = bufs[b][o:e]
            stamps = _UNSTAMPED if send_costs is None else (t0, t0 + send_costs[i])
            if self.drop_next_message:
                self.drop_next_message = False  # lost whole: the receiver must time out, never see part of it
                continue
            total = e - o
            if (total * itemsize <= slice_bytes or total <= 1) and try_send(peer, (*head, msg_index, *sig, total, 0, total), stamps, data):
                continue
            pending.append(_PendingSend(peer, data, msg_index, stamps))
        return pending

    def _post_fanouts(self, head: tuple, sig: tuple, plan: _StepPlan, bufs, t0: float, send_costs) -> set[int]:
        """Sends of one region to several peers, staged once for all of them where the
        transport can (``try_send_shared``); the indices of the sends it took."""
        posted: set[int] = set()
        for group in plan.fanouts:
            first = plan.sends[group[0]]
            b, o, e = first[1], first[2], first[3]
            total = e - o
            peers, fields, stamps = [], [], []
            for i in group:
                peer, _, _, _, msg_index, _ = plan.sends[i]
                peers.append(peer)
                fields.append((*head, msg_index, *sig, total, 0, total))
                stamps.append(_UNSTAMPED if send_costs is None else (t0, t0 + send_costs[i]))
            if self._send_shared(peers, fields, stamps, bufs[b][o:e]):
                posted.update(group)
        return posted

    def _progress_step(self, ctx, head: tuple, index, nsteps, sending: list[_PendingSend], recvs: list[_PendingRecv], ufunc,
                       deadline) -> None:
        transport = self.transport
        sig = ctx.sig
        mailbox = self._mailbox
        notices = self._notices
        comm_id = ctx.comm_id
        receiving = recvs
        last_liveness = time.monotonic()
        suspects: list[int] = []
        while True:
            progressed = False
            if sending:
                for send in sending:
                    data = send.data
                    total = data.size
                    while True:
                        n = min(total - send.pos, transport.max_slice_bytes(send.peer) // data.itemsize or 1)
                        fields = (*head, send.msg_index, *sig, total, send.pos, n)
                        if not transport.try_send(send.peer, fields, send.stamps, data[send.pos : send.pos + n]):
                            break
                        send.pos += n
                        progressed = True
                        if send.pos >= total:
                            send.done = True
                            break
                if progressed:
                    sending = [s for s in sending if not s.done]
            incoming = transport.progress(0.0)
            if incoming:
                self._dispatch(incoming)
            if receiving and mailbox:
                for recv in receiving:
                    key = recv.key
                    box = mailbox.get(key)
                    while box:
                        inc = box[0]
                        if inc.sig != sig or inc.msg_count != recv.dst.size:
                            self._mismatch(ctx, inc)
                        end = inc.offset + inc.nelem
                        if recv.before is not None and recv.before.applied < end:
                            break  # the earlier receive into this destination goes first
                        box.popleft()
                        if not recv.started:
                            recv.started = True
                            recv.sent_at, recv.arrival = inc.sent_at, inc.arrival
                        if inc.nelem:
                            dst = recv.dst[inc.offset : end]
                            if recv.reduce_with is None:
                                inc.copy_into(dst)
                            elif recv.incoming_first:
                                ufunc(inc.array(dst.dtype), recv.reduce_with[inc.offset : end], out=dst)
                            else:
                                ufunc(recv.reduce_with[inc.offset : end], inc.array(dst.dtype), out=dst)
                        transport.release(inc)
                        recv.applied = end
                        progressed = True
                        if end >= recv.dst.size:
                            recv.done = True
                    if box is not None and not box:
                        del mailbox[key]
                if progressed:
                    receiving = [r for r in receiving if not r.done]
            if notices and comm_id in notices:
                self._raise_notice(ctx)
            # Done once every datagram has left: one still queued for a full peer queue would be
            # lost if this rank exited now. (Flushing also releases the peers' slots at once.)
            if not sending and not receiving and transport.flush():
                return
            if progressed:
                continue
            now = time.monotonic()
            if deadline is not None and now >= deadline:
                self._timeout(ctx, index, nsteps, sending, recvs)
            if now - last_liveness >= LIVENESS_CHECK_S:
                last_liveness = now
                dead = self._dead_peers(sending, recvs)
                if dead and dead == suspects:
                    self._peer_died(ctx, dead)
                suspects = dead
                if dead:
                    # A peer that sent its last data and left is not dead to us: everything it
                    # sent is in our queue already, so drain and apply before concluding.
                    incoming = transport.progress(0.0)
                    if incoming:
                        self._dispatch(incoming)
                    continue
            wait = LIVENESS_CHECK_S if deadline is None else min(LIVENESS_CHECK_S, deadline - now)
            incoming = transport.progress(wait)
            if incoming:
                self._dispatch(incoming)

    # -- failures ----------------------------------------------------------------------------
    def _waiting_on(self, sends, recvs) -> list[int]:
        return sorted({s.peer for s in sends if not s.done} | {r.peer for r in recvs if not r.done} | set(self.transport.backlog()))

    def _timeout(self, ctx, index, nsteps, sends, recvs) -> None:
        peers = self._waiting_on(sends, recvs)
        labels = ", ".join(ctx.peer_label(p) for p in peers)
        raise HcclTimeoutError(
            f"{ctx.what}: timed out after {ctx.timeout_s:g} s (HCCL_EXEC_TIMEOUT) in step {index + 1} of {nsteps}. "
            f"Waiting peer rank(s): {labels}. Check that those ranks reached this call "
            f"(a rank that skipped it, or hangs or crashed before it, causes this); this communicator is now aborted",
            **ctx.fields(step=index + 1, ranks=[ctx.comm_rank_of(p) for p in peers])
        )

    def _dead_peers(self, sends, recvs) -> list[int]:
        return [peer for peer in self._waiting_on(sends, recvs) if not self.transport.peer_alive(peer)]

    def _peer_died(self, ctx, dead: list[int]) -> None:
        error = HcclRemoteError(
            f"{ctx.what}: peer rank {ctx.peer_label(dead[0])} exited while rank {ctx.comm_rank} waited for it; "
            f"see that rank's own error for the root cause",
            **ctx.fields(peer=ctx.comm_rank_of(dead[0]))
        )
        # Tell every other member at once: a rank blocked on someone else (a ring neighbour that
        # waits for the dead rank) would otherwise learn only when that one gives up, one
        # neighbour per liveness period.
        self.notify(ctx, error)
        raise error

    def _mismatch(self, ctx: CallContext, inc: Incoming) -> None:
        mine = describe_call(ctx.sig, ctx.algo_names)
        theirs = describe_call(inc.sig, ctx.algo_names)
        if inc.sig == ctx.sig:
            theirs += f" with a different schedule ({inc.msg_count} elements in message {inc.msg_index}, expected another size)"
        error = HcclParamError(
            f"{ctx.what}: call mismatch: rank {ctx.comm_rank} called {mine} but rank {ctx.peer_label(inc.src)} called {theirs}. "
            f"Every rank of a communicator must make the same calls in the same order",
            **ctx.fields(peer=ctx.comm_rank_of(inc.src))
        )
        self.notify(ctx, error)
        raise error

    def _raise_notice(self, ctx: CallContext) -> None:
        seq, src, body = self._notices[ctx.comm_id][0]
        raise error_from_notice(ctx.what, ctx.world_ranks.index(src) if src in ctx.world_ranks else src, body, ctx.fields())


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
