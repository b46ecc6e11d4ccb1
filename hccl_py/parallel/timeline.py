"""A rank's modeled timeline: what its card did when — computing, moving data, or waiting for a
peer — as segments in modeled seconds (wall seconds kept beside them, never mixed).

The drivers record into a :class:`Timeline`; reports sum it, ``plot.py`` draws it, and
:func:`chrome_trace` turns the ranks' timelines into one Chrome trace::

    tl = Timeline(comm.device)
    with tl.compute("layer 3"):
        y = shard.run_blocks(x)
    with tl.comm("send mb 2 -> stage 1"):
        comm.send(y, dst=1)            # the executor splits the call into waiting + transfer
    tl.totals()                        # {'compute': ..., 'comm': ..., 'wait': ...}
"""

from __future__ import annotations

import time
from contextlib import contextmanager
from pathlib import Path
from typing import Iterator, NamedTuple, Sequence

from .. import tracefile
from ..modeled.card import Device

KINDS = ("compute", "comm", "wait")


class Segment(NamedTuple):
    """``kind`` is compute, comm or wait; ``start``/``end`` modeled seconds; ``wall_start``/
    ``wall_end`` seconds of time.monotonic() on this host."""

    kind: str
    label: str
    start: float
    end: float
    wall_start: float
    wall_end: float


class Timeline:
    """Segments of one card, in the order they happened."""

    def __init__(self, device: Device):
        self.device = device
        self.segments: list[Segment] = []

    @contextmanager
    def compute(self, label: str) -> Iterator[None]:
        """Record the block inside as one compute segment."""
        dev = self.device
        start, wall = dev.clock, time.monotonic()
        yield
        if dev.clock > start:
            self.segments.append(Segment("compute", label, start, dev.clock, wall, time.monotonic()))

    @contextmanager
    def comm(self, label: str) -> Iterator[None]:
        """Record a blocking communication call: what the compute stream stood still for before it
        (the asynchronous calls it follows on its stream, exposed) and the modeled waiting the
        executor counted for it (peers not there yet) as a wait segment, then the rest as a comm
        segment. Asynchronous calls still running wait meanwhile too; that is theirs."""
        dev = self.device
        start, waited, wall = dev.clock, dev.blocking_wait_s + dev.time.exposed_s, time.monotonic()
        yield
        end, wall_end = dev.clock, time.monotonic()
        wait = min(max(dev.blocking_wait_s + dev.time.exposed_s - waited, 0.0), end - start)
        if wait > 0:
            self.segments.append(Segment("wait", label, start, start + wait, wall, wall_end))
        if end > start + wait:
            self.segments.append(Segment("comm", label, start + wait, end, wall, wall_end))

    def totals(self, since: float = float("-inf")) -> dict[str, float]:
        """Modeled seconds per kind over segments that start at or after ``since``."""
        sums = dict.fromkeys(KINDS, 0.0)
        for seg in self.segments:
            if seg.start >= since:
                sums[seg.kind] += seg.end - seg.start
        return sums


def chrome_trace(
    timelines: Sequence[Sequence[Segment]], labels: Sequence[str] | None = None, wall_origin: float | None = None
) -> dict:
    """A Chrome-trace document of several ranks' segments: one process per rank with the tracks
    ``compute``, ``communication``, ``waiting`` (modeled time) and ``wall clock``."""
    tids = {"compute": 0, "comm": 1, "wait": 2}
    track_names = ("compute (modeled)", "communication (modeled)", "waiting (modeled)", "wall clock")
    origin = (
        wall_origin if wall_origin is not None else min((s.wall_start for tl in timelines for s in tl), default=0.0)
    )
    events: list[dict] = []
    for rank, segments in enumerate(timelines):
        name = labels[rank] if labels else f"rank {rank}"
        events.append({"ph": "M", "name": "process_name", "pid": rank, "args": {"name": name}})
        events.append({"ph": "M", "name": "process_sort_index", "pid": rank, "args": {"sort_index": rank}})
        for tid, track in enumerate(track_names):
            events.append({"ph": "M", "name": "thread_name", "pid": rank, "tid": tid, "args": {"name": track}})
        for seg in segments:
            args = {"modeled_us": round((seg.end - seg.start) * 1e6, 3)}
            events.append(
                {
                    "ph": "X",
                    "name": seg.label,
                    "cat": seg.kind,
                    "pid": rank,
                    "tid": tids[seg.kind],
                    "ts": seg.start * 1e6,
                    "dur": (seg.end - seg.start) * 1e6,
                    "args": args,
                }
            )
            if seg.kind != "wait":
                events.append(
                    {
                        "ph": "X",
                        "name": seg.label,
                        "cat": seg.kind,
                        "pid": rank,
                        "tid": 3,
                        "ts": (seg.wall_start - origin) * 1e6,
                        "dur": (seg.wall_end - seg.wall_start) * 1e6,
                        "args": {"wall_us": round((seg.wall_end - seg.wall_start) * 1e6, 1)},
                    }
                )
    return tracefile.document(events)


def write_chrome_trace(
    path: str | Path, timelines: Sequence[Sequence[Segment]], labels: Sequence[str] | None = None
) -> Path:
    """Write :func:`chrome_trace` to ``path`` (parents created); open it in Perfetto."""
    return tracefile.write(path, chrome_trace(timelines, labels)["traceEvents"])
