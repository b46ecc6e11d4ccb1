"""What each collective call cost, in modeled and in wall time, kept per rank.

``comm.stats()`` sums the records of one communicator; :func:`write_chrome_trace` writes them as
a Chrome-trace JSON (open it in Perfetto or chrome://tracing): one process per rank, one track
for the modeled timeline and one for the wall-clock timeline. Modeled and wall seconds are never
mixed: they sit in separate fields and separate tracks.
"""

from __future__ import annotations

import json
from collections import deque
from dataclasses import dataclass, field
from pathlib import Path
from typing import NamedTuple

MAX_RECORDS = 200_000  # a long job keeps its latest calls; stats() totals are kept apart, unbounded


class CallRecord(NamedTuple):
    comm: str
    seq: int
    op: str
    algo: str
    nbytes: int
    modeled_start: float
    modeled_end: float
    wall_start: float
    wall_end: float
    peers: tuple[int, ...]  # world ranks of the communicator


@dataclass
class OpStats:
    calls: int = 0
    nbytes: int = 0
    modeled_s: float = 0.0
    wall_s: float = 0.0



@dataclass
class CommStats:
    """Totals of one communicator's calls on this rank; ``by_op`` splits them per operation."""

    calls: int = 0
    nbytes: int = 0
    modeled_s: float = 0.0
    wall_s: float = 0.0
    by_op: dict[str, OpStats] = field(default_factory=dict)



class Recorder:
    """Per-process log of calls: the latest ``MAX_RECORDS`` records and per-communicator totals
    (kept as plain running sums: this runs on every call)."""

    def __init__(self) -> None:
        self.records: deque[CallRecord] = deque(maxlen=MAX_RECORDS)
        self._sums: dict[tuple[str, str], list] = {}  # (comm, op) -> [calls, nbytes, modeled_s, wall_s]

    def add(self, record: CallRecord) -> None:
        self.records.append(record)
        sums = self._sums.get((record.comm, record.op))
        if sums is None:
            sums = self._sums[(record.comm, record.op)] = [0, 0, 0.0, 0.0]
        sums[0] += 1
        sums[1] += record.nbytes
        sums[2] += record.modeled_end - record.modeled_start
        sums[3] += record.wall_end - record.wall_start

    def totals(self, comm: str) -> CommStats:
        stats = CommStats()
        for (name, op), (calls, nbytes, modeled_s, wall_s) in self._sums.items():
            if name == comm:
                stats.by_op[op] = OpStats(calls, nbytes, modeled_s, wall_s)
                stats.calls += calls
                stats.nbytes += nbytes
                stats.modeled_s += modeled_s
                stats.wall_s += wall_s
        return stats


def chrome_trace_events(rank: int, records, wall_origin: float) -> list[dict]:
    """Trace events of one rank: pid = rank, tid 0 = modeled timeline, tid 1 = wall timeline."""
    events = [
        {"ph": "M", "name": "process_name", "pid": rank, "args": {"name": f"rank {rank}"}},
        {"ph": "M", "name": "thread_name", "pid": rank, "tid": 0, "args": {"name": "modeled time"}},
        {"ph": "M", "name": "thread_name", "pid": rank, "tid": 1, "args": {"name": "wall time"}},
    ]
    for r in records:
        args = {"comm": r.comm, "seq": r.seq, "algo": r.algo, "bytes": r.nbytes, "peers": list(r.peers)}
        name = f"{r.op} #{r.seq}"
        events.append({"ph": "X", "name": name, "cat": r.comm, "pid": rank, "tid": 0,
                       "ts": r.modeled_start * 1e6, "dur": (r.modeled_end - r.modeled_start) * 1e6, "args": args})
        events.append({"ph": "X", "name": name, "cat": r.comm, "pid": rank, "tid": 1,
                       "ts": (r.wall_start - wall_origin) * 1e6, "dur": (r.wall_end - r.wall_start) * 1e6, "args": args})
    return events


def write_chrome_trace(path: str | Path, rank: int, records, wall_origin: float) -> Path:
    """Write one rank's trace file; hccl-launch merges the ranks' files into one."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps({"traceEvents": chrome_trace_events(rank, records, wall_origin), "displayTimeUnit": "ms"}))
    return path
