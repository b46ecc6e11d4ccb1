"""Issuing a driver's collectives blocking or asynchronously, and recording both on its timeline.

A card runs HCCL tasks on a communication stream apart from its compute stream. With
``overlap=False`` a driver's collectives block (the compute stream joins each one); with
``overlap=True`` they are issued with ``async_op=True`` and the driver computes something
independent before it waits, so the communication hides behind that compute in modeled time::

    issuer = Issuer(comm, timeline, overlap=True)
    pending = issuer.issue("all_reduce layers.0 attn", comm.all_reduce, partial)
    y = ops.linear(other, w)                 # independent compute: overlaps the all_reduce
    reduced = issuer.wait(pending)           # the compute stream joins the communication stream

The timeline gets the call as a communication segment from its start on the communication
stream to its end (so the trace shows it beside the compute it overlapped) and the part the
compute stream stood still for at ``wait`` (``device.time.exposed_s``) as a wait segment
labelled ``exposed``. A blocking call is recorded as :meth:`Timeline.comm` records it.
"""

from __future__ import annotations

import time
from dataclasses import dataclass
from typing import Any, Callable

from ..communicator import Communicator
from ..errors import HcclParamError
from .model import Ops
from .timeline import Segment, Timeline


@dataclass
class Pending:
    """One issued call: its :class:`~hccl_py.work.Work` (None once waited, or for a blocking call)
    and its result."""

    label: str
    work: Any
    result: Any
    issued_s: float
    wall: float


class Issuer:
    """Issues the collectives of one communicator for a driver (see the module doc)."""

    def __init__(self, comm: Communicator, timeline: Timeline, overlap: bool):
        self.comm = comm
        self.timeline = timeline
        self.overlap = bool(overlap)
        self._stream_end = 0.0  # modeled end of the latest asynchronous call waited for

    def issue(self, label: str, call: Callable[..., Any], *args, **kwargs) -> Pending:
        """``call(*args, **kwargs)`` blocking, or with ``async_op=True`` when overlapping."""
        dev = self.comm.device
        if not self.overlap:
            with self.timeline.comm(label):
                result = call(*args, **kwargs)
            return Pending(label, None, result, dev.clock, time.monotonic())
        before, wall = dev.clock, time.monotonic()
        work = call(*args, async_op=True, **kwargs)
        if dev.clock > before:  # issuing advanced the card's clock (a call that had to wait before it could queue)
            self._segment("wait", f"exposed: issue {label}", before, dev.clock, wall)
        return Pending(label, work, None, dev.clock, wall)

    def wait(self, pending: Pending) -> Any:
        """The call's result; for an asynchronous call the compute stream joins its end."""
        if pending.work is None:
            return pending.result
        dev = self.comm.device
        before, wall = dev.clock, time.monotonic()
        pending.result = pending.work.wait()
        end = pending.work.end_clock
        start = min(max(pending.issued_s, self._stream_end), end)
        self._stream_end = max(self._stream_end, end)
        self._segment("comm", pending.label, start, end, pending.wall)
        if dev.clock > before:
            self._segment("wait", f"exposed: {pending.label}", before, dev.clock, wall)
        pending.work = None
        return pending.result

    def _segment(self, kind: str, label: str, start: float, end: float, wall: float) -> None:
        if end > start:
            self.timeline.segments.append(Segment(kind, label, start, end, wall, time.monotonic()))


class OverlapDriver:
    """What the tensor- and expert-parallel drivers share: the communicator, the model, whether
    collectives overlap compute and in how many chunks a batch is cut (default 2 with overlap,
    else 1), the card's timeline, its kernels and the issuer of the collectives."""

    def __init__(
        self, what: str, comm: Communicator, model, overlap: bool, chunks: int | None, timeline: Timeline | None
    ):
        chunks = (2 if overlap else 1) if chunks is None else int(chunks)
        if chunks < 1:
            raise HcclParamError(f"{what}: chunks must be >= 1, got {chunks}", arg="chunks", value=chunks)
        self.comm = comm
        self.model = model
        self.overlap = bool(overlap)
        self.chunks = chunks
        self.device = comm.device
        self.timeline = timeline if timeline is not None else Timeline(comm.device)
        self.ops = Ops(comm.device)
        self.issuer = Issuer(comm, self.timeline, self.overlap)
