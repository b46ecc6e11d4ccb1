"""Per-rank report data of a parallel run and its text table.

with Measure(comm.device) as m:
    y = dp.forward(x)
report = m.report(rank=comm.rank, role="replica 0", samples=16, segments=timeline.segments)
reports = all_gather_objects(comm, report)          # every rank's, e.g. for rank 0 to print
print(format_rank_table(reports))
"""

from __future__ import annotations

import time
from dataclasses import dataclass, field
from typing import Sequence

from ..modeled.card import Device
from .timeline import Segment


@dataclass
class RankReport:
    """One rank's share of a run; modeled seconds unless the name says wall."""

    rank: int
    role: str
    samples: int
    start_s: float
    end_s: float
    compute_s: float
    comm_s: float
    wait_s: float
    peak_bytes: int
    capacity_bytes: int
    wall_s: float
    segments: list[Segment] = field(default_factory=list)
    exposed_s: float = 0.0  # the compute stream standing still at wait() for asynchronous calls

    @property
    def busy_s(self) -> float:
        """Modeled seconds computing or communicating (``compute_s + comm_s``; waiting excluded)."""
        return self.compute_s + self.comm_s


class Measure:
    """Snapshots a card's clock, time split and wall clock around a block of work."""

    def __init__(self, device: Device):
        self.device = device

    def __enter__(self) -> "Measure":
        dev = self.device
        self.start_s = dev.clock
        self._time = (dev.time.compute_s, dev.time.comm_s, dev.time.wait_s, dev.time.exposed_s)
        self._wall = time.perf_counter()
        return self

    def __exit__(self, *exc) -> None:
        dev = self.device
        self.end_s = dev.clock
        self.compute_s = dev.time.compute_s - self._time[0]
        self.comm_s = dev.time.comm_s - self._time[1]
        self.wait_s = dev.time.wait_s - self._time[2]
        self.exposed_s = dev.time.exposed_s - self._time[3]
        self.wall_s = time.perf_counter() - self._wall

    def report(self, rank: int, role: str, samples: int, segments: Sequence[Segment] = ()) -> RankReport:
        """The measured block as this rank's :class:`RankReport`, with the ``segments`` that started in
        it; the HBM peak is the card's since it was made."""
        dev = self.device
        return RankReport(
            rank,
            role,
            samples,
            self.start_s,
            self.end_s,
            self.compute_s,
            self.comm_s,
            self.wait_s,
            dev.peak_bytes,
            dev.capacity_bytes,
            self.wall_s,
            [s for s in segments if s.start >= self.start_s],
            self.exposed_s,
        )


def makespan_s(reports: Sequence[RankReport]) -> float:
    """Modeled seconds from the first rank's start to the last rank's end."""
    return max(r.end_s for r in reports) - min(r.start_s for r in reports)


def format_rank_table(reports: Sequence[RankReport], *, exposed: bool = False) -> str:
    """One line per rank: role, samples, compute / communication / waiting (modeled ms), HBM peak;
    with ``exposed``, also the communication compute did not hide (asynchronous calls)."""
    head = (
        ("rank", "role", "samples", "compute ms", "comm ms", "wait ms")
        + (("exposed ms",) if exposed else ())
        + ("HBM peak MiB", "of HBM")
    )
    rows = [head]
    for r in reports:
        rows.append(
            (
                str(r.rank),
                r.role,
                str(r.samples),
                f"{r.compute_s * 1e3:.3f}",
                f"{r.comm_s * 1e3:.3f}",
                f"{r.wait_s * 1e3:.3f}",
            )
            + ((f"{r.exposed_s * 1e3:.3f}",) if exposed else ())
            + (f"{r.peak_bytes / 2**20:.2f}", f"{100 * r.peak_bytes / r.capacity_bytes:.2f}%")
        )
    widths = [max(len(row[i]) for row in rows) for i in range(len(rows[0]))]
    lines = []
    for row in rows:
        cells = [row[0].rjust(widths[0]), row[1].ljust(widths[1])] + [c.rjust(w) for c, w in zip(row[2:], widths[2:])]
        lines.append("  ".join(cells))
    return "\n".join(lines)
