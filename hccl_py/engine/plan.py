"""A call resolved for execution: its context on this rank (:class:`CallContext`, with the
bits of its sequence number's space) and its schedule's steps with world ranks, message numbers
and receive order resolved (:func:`plan_steps` -> :class:`StepPlan`, once per call shape), which
:class:`~hccl_py.engine.run.CallRun` walks::

    plans = plan_steps(schedule, world=(0, 1, 2, 3), slice_bytes=lambda peer: 1 << 20)
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import NamedTuple

import numpy as np

from ..algorithms.schedule import Schedule, message_numbers
from ..collectives import OpKind
from ..transport.base import CallSignature

P2P_SEQ_BIT = 1 << 62  # point-to-point messages count in their own sequence space
# A refusal (a call one rank rejected before any byte moved) travels as a notice whose seq carries
# these bits beside the call's own number: the communicator stays usable (see ``Engine.refuse``).
REFUSAL_BIT = 1 << 60
RECV_SIDE_BIT = 1 << 61  # in a point-to-point refusal: the refusing rank was the receiving side
SECONDARY_BIT = 1 << 59  # the refusal reports an earlier refusal late (never reported late in turn)


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


def run_copies(copies: tuple, bufs, ufunc) -> None:
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
