"""Runs a schedule (``algorithms/schedule.py``) through a transport.

One ``Engine`` per process holds the transport, the mailbox of slices that arrived before the
receive they belong to was posted (a peer may be a step or a call ahead), and the notices peers
sent. ``Engine.run`` executes one rank's schedule of one call: it matches messages FIFO per
ordered pair, applies receives in schedule order where destinations overlap (so the reduction
order never depends on arrival order), checks that every peer's call is the same call, and
bounds every wait by the call's deadline.
"""

from __future__ import annotations

import time
from collections import deque
from dataclasses import dataclass
from enum import IntEnum
from typing import Sequence

import numpy as np

from .algorithms.schedule import Schedule
from .cost_model import StepCost, step_end
from .device import Device
from .dtypes import DTYPES_BY_CODE, ReduceOp
from .errors import HcclError, HcclParamError, HcclRemoteError, HcclTimeoutError
from .transport.base import KIND_NOTICE, CallSignature, Incoming, Transport

LIVENESS_CHECK_S = 0.5  # how often a blocked wait checks that the peers it waits for still live
P2P_SEQ_BIT = 1 << 62  # point-to-point messages count in their own sequence space


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


def describe_call(sig: CallSignature, algo_names: tuple[str, ...]) -> str:
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

    def peer_label(self, world_peer: int) -> str:
        comm_peer = self.world_ranks.index(world_peer)
        return f"{comm_peer}" if comm_peer == world_peer else f"{comm_peer} (world rank {world_peer})"


class _PendingSend:
    __slots__ = ("peer", "data", "pos", "msg_index", "slice_elems", "sent_empty", "stamps")

    def __init__(self, peer: int, data: np.ndarray, msg_index: int, slice_elems: int, stamps: tuple[float, float]):
        self.stamps = stamps  # modeled (sent_at, arrival)
        self.peer = peer
        self.data = data
        self.pos = 0
        self.msg_index = msg_index
        self.slice_elems = slice_elems
        self.sent_empty = False

    @property
    def done(self) -> bool:
        return self.pos >= self.data.size and (self.data.size > 0 or self.sent_empty)


class _PendingRecv:
    __slots__ = ("peer", "dst", "reduce_with", "msg_index", "applied", "before", "seen_empty", "sent_at", "arrival")

    def __init__(self, peer: int, dst: np.ndarray, reduce_with: np.ndarray | None, msg_index: int, before: "_PendingRecv | None"):
        self.peer = peer
        self.dst = dst
        self.reduce_with = reduce_with
        self.msg_index = msg_index
        self.applied = 0
        self.before = before  # the receive into the same destination that must be applied first
        self.seen_empty = False
        self.sent_at = 0.0  # modeled stamps of the message, from its first slice
        self.arrival = 0.0

    @property
    def done(self) -> bool:
        return self.applied >= self.dst.size and (self.dst.size > 0 or self.seen_empty)


def _waiting(t0: float, recvs: list[_PendingRecv], recv_s: Sequence[float]) -> float:
    """Modeled seconds of a step spent waiting for peers that started their side late (a slow or
    busy card), as opposed to moving data: the part of each wait before the sender even sent."""
    t = t0
    waited = 0.0
    for recv, cost in zip(recvs, recv_s):
        if recv.arrival > t:
            waited += min(recv.arrival - t, max(0.0, recv.sent_at - t))
            t = recv.arrival
        t += cost
    return waited


class Engine:
    """The per-process executor state: transport, mailbox, notices."""

    def __init__(self, transport: Transport | None):
        self.transport = transport
        self._mailbox: dict[tuple[int, int, int, int], deque[Incoming]] = {}
        self._notices: dict[int, list[tuple[int, str]]] = {}
        self._abandoned: set[int] = set()

    # -- notices: a peer telling a communicator that a call failed -------------------------------
    def pending_notice(self, comm_id: int) -> tuple[int, str] | None:
        notes = self._notices.get(comm_id)
        return notes[0] if notes else None

    def clear_notices(self, comm_id: int) -> None:
        self._notices.pop(comm_id, None)

    def notify(self, ctx: CallContext, error: HcclError) -> None:
        """Tell every other member of the communicator that this call failed, and why."""
        if self.transport is None:
            return
        text = f"{int(error.code)}|{error.message}"
        for world_peer in ctx.world_ranks:
            if world_peer != self.transport.world_rank:
                self.transport.notify(world_peer, ctx.comm_id, ctx.seq, text)

    def _dispatch(self, incoming: list[Incoming]) -> None:
        for inc in incoming:
            if inc.comm_id in self._abandoned:
                self.transport.release(inc)
                continue
            if inc.kind == KIND_NOTICE:
                self._notices.setdefault(inc.comm_id, []).append((inc.seq, bytes(inc.payload).decode(errors="replace")))
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
            step_costs: Sequence[StepCost], device: Device) -> None:
        """Execute ``schedule`` for this rank; ``bufs`` are flat IN, OUT and TMP arrays.

        ``step_costs`` (from the cost model) advance ``device.clock`` step by step with the same
        arithmetic as the simulator: see ``cost_model.step_end``.
        """
        with np.errstate(all="ignore"):  # overflow and NaN are the user's data, as on the device
            self._run(ctx, schedule, bufs, ufunc, step_costs, device)

    def _run(self, ctx: CallContext, schedule: Schedule, bufs, ufunc, step_costs, device: Device) -> None:
        deadline = None if ctx.timeout_s is None else time.monotonic() + ctx.timeout_s
        sent: dict[int, int] = {}
        received: dict[int, int] = {}
        world = ctx.world_ranks
        for index, step in enumerate(schedule.steps):
            cost = step_costs[index]
            for copy in step.copies:
                src, dst = copy.src, copy.dst
                np.copyto(bufs[dst.buf][dst.offset : dst.end], bufs[src.buf][src.offset : src.end])
            t0 = device.clock + cost.copy_s
            if not step.sends and not step.recvs:
                device.clock = t0
                device.time.comm_s += cost.copy_s
                continue
            sends = []
            for send, send_s in zip(step.sends, cost.send_s):
                peer = world[send.peer]
                msg_index = sent.get(peer, 0)
                sent[peer] = msg_index + 1
                data = bufs[send.src.buf][send.src.offset : send.src.end]
                slice_elems = max(1, self.transport.max_slice_bytes(peer) // data.itemsize)
                sends.append(_PendingSend(peer, data, msg_index, slice_elems, (t0, t0 + send_s)))
            recvs = []
            last_into: dict[tuple[int, int], _PendingRecv] = {}
            for recv in step.recvs:
                peer = world[recv.peer]
                msg_index = received.get(peer, 0)
                received[peer] = msg_index + 1
                dst = recv.dst
                rw = recv.reduce_with
                state = _PendingRecv(
                    peer,
                    bufs[dst.buf][dst.offset : dst.end],
                    None if rw is None else bufs[rw.buf][rw.offset : rw.end],
                    msg_index,
                    last_into.get((dst.buf, dst.offset)),
                )
                last_into[(dst.buf, dst.offset)] = state
                recvs.append(state)
            self._run_step(ctx, index, len(schedule.steps), sends, recvs, ufunc, deadline)
            start = device.clock
            device.clock = end = step_end(t0, cost.send_s, [r.arrival for r in recvs], cost.recv_s)
            waited = _waiting(t0, recvs, cost.recv_s)
            device.time.wait_s += waited
            device.time.comm_s += end - start - waited

    def _run_step(self, ctx, index, nsteps, sends, recvs, ufunc, deadline) -> None:
        try:
            self._progress_step(ctx, index, nsteps, sends, recvs, ufunc, deadline)
        except HcclRemoteError:
            # A peer that failed first may have told us why before it went: that is the root cause.
            self._dispatch(self.transport.progress(0.0))
            if self._notices.get(ctx.comm_id):
                self._raise_notice(ctx)
            raise

    def _progress_step(self, ctx, index, nsteps, sends, recvs, ufunc, deadline) -> None:
        transport = self.transport
        sig = ctx.sig
        fields_head = (transport.world_rank, ctx.comm_id, ctx.seq)
        sig_fields = (sig.op, sig.algo, sig.dtype, sig.redop, sig.count, sig.root)
        mailbox = self._mailbox
        last_liveness = time.monotonic()
        while True:
            progressed = False
            for send in sends:
                if send.done:
                    continue
                data = send.data
                total = data.size
                while not send.done:
                    n = min(total - send.pos, send.slice_elems)
                    fields = (*fields_head, send.msg_index, *sig_fields, total, send.pos, n)
                    if not transport.try_send(send.peer, fields, send.stamps, data[send.pos : send.pos + n]):
                        break
                    send.pos += n
                    send.sent_empty = True
                    progressed = True
            self._dispatch(transport.progress(0.0))
            for recv in recvs:
                if recv.done:
                    continue
                box = mailbox.get((ctx.comm_id, ctx.seq, recv.peer, recv.msg_index))
                while box:
                    inc = box[0]
                    if inc.sig != sig or inc.msg_count != recv.dst.size:
                        self._mismatch(ctx, inc)
                    end = inc.offset + inc.nelem
                    if recv.before is not None and recv.before.applied < end:
                        break  # the earlier receive into this destination goes first
                    box.popleft()
                    if not recv.seen_empty:
                        recv.sent_at, recv.arrival = inc.sent_at, inc.arrival
                    if inc.nelem:
                        incoming = inc.array(recv.dst.dtype)
                        dst = recv.dst[inc.offset : end]
                        if recv.reduce_with is None:
                            np.copyto(dst, incoming)
                        else:
                            ufunc(recv.reduce_with[inc.offset : end], incoming, out=dst)
                    transport.release(inc)
                    recv.applied = end
                    recv.seen_empty = True
                    progressed = True
                if not box and box is not None:
                    del mailbox[(ctx.comm_id, ctx.seq, recv.peer, recv.msg_index)]
            notice = self._notices.get(ctx.comm_id)
            if notice:
                self._raise_notice(ctx)
            if all(s.done for s in sends) and all(r.done for r in recvs):
                transport.flush()  # release the peers' slots now, not at our next call
                return
            if progressed:
                continue
            now = time.monotonic()
            if deadline is not None and now >= deadline:
                self._timeout(ctx, index, nsteps, sends, recvs)
            wait = LIVENESS_CHECK_S if deadline is None else min(LIVENESS_CHECK_S, deadline - now)
            self._dispatch(transport.progress(wait))
            now = time.monotonic()
            if now - last_liveness >= LIVENESS_CHECK_S:
                last_liveness = now
                self._check_liveness(ctx, sends, recvs)

    # -- failures ----------------------------------------------------------------------------
    def _waiting_on(self, sends, recvs) -> list[int]:
        return sorted({s.peer for s in sends if not s.done} | {r.peer for r in recvs if not r.done})

    def _timeout(self, ctx, index, nsteps, sends, recvs) -> None:
        peers = self._waiting_on(sends, recvs)
        labels = ", ".join(ctx.peer_label(p) for p in peers)
        raise HcclTimeoutError(
            f"{ctx.what}: timed out after {ctx.timeout_s:g} s (HCCL_EXEC_TIMEOUT) in step {index + 1} of {nsteps}. "
            f"Waiting peer rank(s): {labels}. Check that those ranks reached this call "
            f"(a rank that skipped it, or hangs or crashed before it, causes this); this communicator is now aborted"
        )

    def _check_liveness(self, ctx, sends, recvs) -> None:
        for peer in self._waiting_on(sends, recvs):
            if not self.transport.peer_alive(peer):
                raise HcclRemoteError(
                    f"{ctx.what}: peer rank {ctx.peer_label(peer)} exited while this rank waited for it; "
                    f"see that rank's own error for the root cause"
                )

    def _mismatch(self, ctx: CallContext, inc: Incoming) -> None:
        mine = describe_call(ctx.sig, ctx.algo_names)
        theirs = describe_call(inc.sig, ctx.algo_names)
        if inc.sig == ctx.sig:
            theirs += f" with a different schedule ({inc.msg_count} elements in message {inc.msg_index}, expected another size)"
        error = HcclParamError(
            f"{ctx.what}: call mismatch: rank {ctx.comm_rank} called {mine} but rank {ctx.peer_label(inc.src)} called {theirs}. "
            f"Every rank of a communicator must make the same calls in the same order"
        )
        self.notify(ctx, error)
        raise error

    def _raise_notice(self, ctx: CallContext) -> None:
        seq, text = self._notices[ctx.comm_id][0]
        code, _, message = text.partition("|")
        if code == str(int(HcclParamError.code)):
            raise HcclParamError(message)
        raise HcclRemoteError(f"{ctx.what}: a peer reported: {message}")
