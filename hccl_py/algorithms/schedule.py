"""The schedule: what a collective algorithm *is* in hccl-py.

An algorithm is a pure function ``schedule(rank, size, count, root) -> Schedule`` that lists,
for one rank, the steps of the collective: local copies, then messages sent to and received
from peers. It does no I/O. The same schedule is executed by the runtime (real bytes through a
transport), timed by the cost model and simulated at cluster scale, so those can never disagree.

Buffers are named, not passed: ``IN`` is the caller's input, ``OUT`` the caller's output and
``TMP`` a scratch array of ``Schedule.tmp_count`` elements that the executor provides. For
in-place collectives (allreduce, broadcast, reduce) ``IN`` and ``OUT`` are the *same* array, so
a schedule must stay correct under that aliasing. Offsets and counts are in elements.

Semantics, shared by the executor (``hccl_py/engine/executor.py``) and the in-process player
(``playback.py``):

* A step first runs its ``copies`` in order, then all its sends and receives concurrently; it
  completes when every send has left and every receive has been applied. A copy with
  ``reduce_with`` is a local reduction, ``dst = reduce_with (op) src`` (a one-shot allreduce
  folds what it received with it, in rank order).
* Matching is FIFO per ordered pair within one call: the k-th ``Send`` from rank a to rank b
  (counting over a's steps) is the k-th ``Recv`` from a in b's steps. Their counts are equal.
* A ``Recv`` writes ``dst = incoming`` (``reduce_with is None``) or
  ``dst = reduce_with (op) incoming`` (``incoming (op) reduce_with`` with ``incoming_first``);
  ``reduce_with`` may be ``dst`` itself (accumulate). IEEE sum and max are commutative in value
  but not in bits (which NaN payload survives, +0 or -0), so a result that several ranks
  compute must be computed with the operands in one order everywhere.
* Within one step no receive writes a region that a send of the same step reads, and receives
  whose destinations overlap have identical destinations; those are applied in list order, so
  reduction order (and so float results) never depends on arrival order.
* A zero-count transfer still moves a message (used for synchronisation, e.g. barrier);
  collectives leave empty chunks out on both sides.
"""

from __future__ import annotations

from dataclasses import dataclass
from enum import IntEnum
from functools import lru_cache

import numpy as np


class Buf(IntEnum):
    """The buffers a schedule names: ``IN`` the caller's input, ``OUT`` its output (the same array for
    in-place collectives), ``TMP`` the executor's scratch."""

    IN = 0
    OUT = 1
    TMP = 2


IN, OUT, TMP = Buf.IN, Buf.OUT, Buf.TMP


@dataclass(frozen=True, slots=True)
class Region:
    """``count`` elements of buffer ``buf`` from element ``offset``."""

    buf: Buf
    offset: int
    count: int

    @property
    def end(self) -> int:
        """One past the region's last element."""
        return self.offset + self.count

    def overlaps(self, other: "Region") -> bool:
        """Whether the two regions share an element (same buffer, neither empty)."""
        return (
            self.buf == other.buf
            and self.count > 0
            and other.count > 0
            and self.offset < other.end
            and other.offset < self.end
        )


@dataclass(frozen=True, slots=True)
class Send:
    """Send region ``src`` to rank ``peer``."""

    peer: int  # rank within the communicator
    src: Region


@dataclass(frozen=True, slots=True)
class Recv:
    """Receive from rank ``peer`` into ``dst``: a copy, or with ``reduce_with`` a reduction (operand order
    set by ``incoming_first``)."""

    peer: int
    dst: Region
    reduce_with: Region | None = None  # None: copy; else dst = reduce_with (op) incoming
    # dst = incoming (op) reduce_with instead: two ranks that reduce the same pair of operands
    # (recursive doubling) put them in one order, so NaN payloads and signed zeros agree bit for bit
    incoming_first: bool = False


@dataclass(frozen=True, slots=True)
class Copy:
    """A local copy of ``src`` to ``dst``, or with ``reduce_with`` a local reduction into ``dst``."""

    src: Region
    dst: Region
    reduce_with: Region | None = None  # None: dst = src; else dst = reduce_with (op) src, a local reduction


@dataclass(frozen=True, slots=True)
class Step:
    """One step of a rank: its ``copies`` run first, in order, then its ``sends``
    and ``recvs`` concurrently."""

    copies: tuple[Copy, ...] = ()
    sends: tuple[Send, ...] = ()
    recvs: tuple[Recv, ...] = ()


@dataclass(frozen=True, slots=True)
class Schedule:
    """One rank's part of a collective: its ``steps`` in order and ``tmp_count``, the TMP elements
    the executor must provide."""

    steps: tuple[Step, ...]
    tmp_count: int = 0

    @property
    def peers(self) -> frozenset[int]:
        """Every rank this schedule sends to or receives from."""
        return frozenset(t.peer for s in self.steps for t in (*s.sends, *s.recvs))


def message_numbers(schedule: Schedule) -> tuple[tuple[tuple[int, ...], tuple[int, ...]], ...]:
    """The FIFO matching rule, once: per step, (the number of each send among this rank's sends
    to that peer, the number of each receive among its receives from that peer), counted over
    the whole schedule from 0. The k-th send from a to b meets the k-th receive from a on b; the
    executor (message index in every header), the simulator and the player all number messages
    with this function::

        sends, recvs = message_numbers(schedule)[step]
    """
    sent: dict[int, int] = {}
    received: dict[int, int] = {}
    numbers = []
    for step in schedule.steps:
        send_numbers = []
        for send in step.sends:
            send_numbers.append(sent.get(send.peer, 0))
            sent[send.peer] = send_numbers[-1] + 1
        recv_numbers = []
        for recv in step.recvs:
            recv_numbers.append(received.get(recv.peer, 0))
            received[recv.peer] = recv_numbers[-1] + 1
        numbers.append((tuple(send_numbers), tuple(recv_numbers)))
    return tuple(numbers)


@lru_cache(maxsize=64)
def chunk_bounds(count: int, parts: int) -> tuple[tuple[int, int], ...]:
    """Split ``count`` elements into ``parts`` contiguous (offset, count) chunks whose sizes
    differ by at most one, larger first; some are empty when ``count < parts``. Cached: every
    rank of a call asks for the same split (65,536 of them when simulating)."""
    base, extra = divmod(count, parts)
    bounds = []
    offset = 0
    for i in range(parts):
        n = base + (1 if i < extra else 0)
        bounds.append((offset, n))
        offset += n
    return tuple(bounds)


@dataclass(frozen=True)
class StepFlows:
    """Step k of *every* rank at once, for simulating thousands of ranks without building each
    rank's ``Schedule``.

    One lane: rank r sends ``send_count[r]`` elements to ``send_to[r]`` and receives from
    ``recv_from[r]`` the message that rank sent in the same step (``reduce``: reduced in, else
    copied). Several lanes (2-D arrays, one row per lane, as a full mesh needs): row l of
    ``send_to`` / ``send_count`` is each rank's l-th send of the step, row m of ``recv_from`` its
    m-th receive (in schedule order), which the sender sent in its lane ``recv_lane[m, r]``
    (default: lane m); ``reduce`` may then give one flag per receive lane. -1 in ``send_to`` or
    ``recv_from`` means no such send or receive. ``copies``: element counts of the step's plain
    local copies, in schedule order (they run before the transfers): per rank (an array) or the
    same on every rank (an int). ``repeat``: every lane stands for that many identical messages
    (same peer, same count) listed one after another, as NHR's blocks of one step. A test holds
    every algorithm's flows, simulated, equal to its ``schedule`` simulated rank by rank.

    ``senders`` (a slice of ranks; one lane): only those ranks send this step, each to
    ``send_to[r]``, and each destination receives that one message; ``send_to``, ``send_count``
    and ``recv_from`` then describe the whole pattern (the same arrays from step to step), so a
    chain whose active part moves along it (a pipelined broadcast, a ring scatter) is routed
    once and each step costs only its active ranks.
    """

    send_to: np.ndarray
    send_count: np.ndarray
    recv_from: np.ndarray
    reduce: "bool | tuple[bool, ...]"
    recv_lane: "np.ndarray | None" = None
    copies: "tuple[np.ndarray | int, ...]" = ()
    repeat: int = 1
    senders: "slice | None" = None
