"""Chrome trace files (open them in Perfetto or chrome://tracing): the one place that knows
their JSON envelope, how a rank's file is named and how the ranks' files merge into one.

The events come from elsewhere: a rank's calls (:func:`hccl_py.records.chrome_trace_events`),
the parallel drivers' timelines (:func:`hccl_py.parallel.chrome_trace`)::

    tracefile.write(trace_dir / tracefile.rank_file(3), events)   # each rank at exit
    tracefile.merge(trace_dir)                                     # hccl-launch: trace_dir/trace.json
"""

from __future__ import annotations

import json
from collections.abc import Sequence
from pathlib import Path
from typing import Any

RANK_FILE = "rank_{rank}.trace.json"  # one rank's file in a trace directory
MERGED_FILE = "trace.json"  # the ranks' files merged


def rank_file(rank: int) -> str:
    """The name of rank ``rank``'s trace file in a trace directory."""
    return RANK_FILE.format(rank=rank)


def document(events: Sequence[dict[str, Any]]) -> dict[str, Any]:
    """A Chrome-trace document holding ``events`` (times in microseconds, shown in ms)."""
    return {"traceEvents": list(events), "displayTimeUnit": "ms"}


def write(path: str | Path, events: Sequence[dict[str, Any]]) -> Path:
    """Write ``events`` as a trace file at ``path`` (parent folders created)."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(document(events)))
    return path


def merge(trace_dir: str | Path) -> Path | None:
    """Merge the ranks' files in ``trace_dir`` into ``trace_dir/trace.json``; ``None`` if there
    are none. A file a killed rank left half-written is skipped; the others still merge."""
    parts = sorted(Path(trace_dir).glob(RANK_FILE.format(rank="*")))
    if not parts:
        return None
    events: list[dict[str, Any]] = []
    for part in parts:
        try:
            events.extend(json.loads(part.read_text())["traceEvents"])
        except (OSError, ValueError, KeyError):
            continue
    return write(Path(trace_dir) / MERGED_FILE, events)
