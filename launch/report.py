"""The root-cause report hccl-launch prints to stderr when a job does not end cleanly.

Modeled on torchrun's "Root Cause (first observed failure)" block, but the failing rank's last
stderr lines are always included (the launcher keeps a ring buffer per rank), so the report is
never "error_file: <N/A>".

Example::

    print(format_failure(job_id, outcomes, root_rank=1, start_time=t0), file=sys.stderr)
"""

from __future__ import annotations

import time
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

from .proc import describe_returncode, signal_name

_RULE = "=" * 78
_THIN = "-" * 78


@dataclass(frozen=True)
class RankOutcome:
    """How one rank ended, as the launcher observed it.

    ``stopped_by`` is the last signal the launcher sent the rank before it exited (``None`` if
    it ended on its own); ``exit_time`` is wall-clock ``time.time()``.
    """

    rank: int
    pid: int
    returncode: int | None
    exit_time: float | None
    stopped_by: int | None
    stderr_tail: tuple[str, ...] = ()
    log_path: Path | None = None

    def fate(self) -> str:
        """One phrase: "exited ok", "terminated by launcher (SIGTERM)", "exit code 3", ..."""
        if self.returncode is None:
            return "still running (could not be stopped)"
        if self.stopped_by is not None:
            how = "killed" if self.stopped_by == 9 else "terminated"
            if self.returncode == 0:
                return f"exited ok after the launcher sent {signal_name(self.stopped_by)}"
            if self.returncode == -self.stopped_by:
                return f"{how} by launcher ({signal_name(self.stopped_by)})"
            return f"{describe_returncode(self.returncode)} after the launcher sent {signal_name(self.stopped_by)}"
        if self.returncode == 0:
            return "exited ok"
        return f"failed on its own too: {describe_returncode(self.returncode)}"


def _when(t: float | None, start_time: float) -> str:
    if t is None:
        return "?"
    stamp = time.strftime("%Y-%m-%d %H:%M:%S", time.localtime(t)) + f".{int((t % 1) * 1000):03d}"
    return f"{stamp} ({t - start_time:.2f} s after start)"


def _others(outcomes: Sequence[RankOutcome], skip: int | None) -> list[str]:
    lines = []
    for o in outcomes:
        if o.rank != skip:
            lines.append(f"  rank {o.rank:<4} pid {o.pid:<8} {o.fate()}")
    return lines


def format_failure(job_id: str, outcomes: Sequence[RankOutcome], root_rank: int, start_time: float) -> str:
    """The report for a job whose rank ``root_rank`` was the first to fail."""
    root = next(o for o in outcomes if o.rank == root_rank)
    assert root.returncode is not None
    lines = [
        _RULE,
        f"hccl-launch: job {job_id} FAILED",
        _THIN,
        "Root Cause (first observed failure):",
        f"  rank       : {root.rank}",
        f"  exit       : {describe_returncode(root.returncode)}",
        f"  pid        : {root.pid}",
        f"  time       : {_when(root.exit_time, start_time)}",
    ]
    if root.log_path is not None:
        lines.append(f"  log        : {root.log_path}")
    if root.stderr_tail:
        lines.append(f"  last {len(root.stderr_tail)} stderr line(s) of rank {root.rank}:")
        lines.extend(f"    | {line}" for line in root.stderr_tail)
    else:
        lines.append(f"  stderr     : (rank {root.rank} wrote nothing to stderr)")
    others = _others(outcomes, root.rank)
    if others:
        lines += [_THIN, "Other ranks:", *others]
    lines.append(_RULE)
    return "\n".join(lines)


def format_stopped(job_id: str, outcomes: Sequence[RankOutcome], reason: str) -> str:
    """The report for a job the launcher stopped itself (``reason``: signal or --timeout)."""
    lines = [_RULE, f"hccl-launch: job {job_id} stopped: {reason}", _THIN, "Ranks:", *_others(outcomes, None)]
    unfinished = [o.rank for o in outcomes if o.stopped_by is not None]
    if unfinished:
        lines.append(f"Ranks still running when the launcher stopped the job: {unfinished}")
    lines.append(_RULE)
    return "\n".join(lines)
