"""The data plane's targets against MPICH and gloo (issue 29's table), checked on one invocation.

``hccl-bench allreduce -n 2,8,16 --vs mpi,gloo --repeats 5`` prints, after its tables, one row per
target: the ratio measured at the target's world size and sizes (the worst of them), the bound, and
whether it holds. A target whose world size, sizes or peer the invocation did not measure says so:
it is never counted as met. The targets are allreduce's; other collectives print none::

    from benchmarks.targets import check_targets, format_targets
    print(format_targets(check_targets(results)))   # results: one BenchResult per -n
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass

from topology.units import format_size

from .harness import FIRST_CALLS, BenchResult

KiB, MiB = 1 << 10, 1 << 20


@dataclass(frozen=True)
class Target:
    """hccl-py against ``peer`` at ``nranks`` ranks, at every measured size in [min_size, max_size]:
    ``metric`` "time" is hccl-py's time / the peer's (at most ``bound``), "busbw" hccl-py's busbw /
    the peer's (at least ``bound``). ``nranks`` None: every world size the invocation ran. Against
    itself (``peer`` "hccl"): "first_calls" is the mean of warm-up calls 2-20 / the timed median
    (at most ``bound``; needs ``-w 20``), "first_call_ms" the first call's milliseconds."""

    what: str
    peer: str
    nranks: int | None
    metric: str
    bound: float
    min_size: int
    max_size: int = 1 << 62


ALLREDUCE_TARGETS = (
    Target("n=2, 8 B: at most 2x MPICH's time", "mpi", 2, "time", 2.0, 8, 8),
    Target("n=2, from 1 MiB: busbw at least 1.3x MPICH's", "mpi", 2, "busbw", 1.3, MiB),
    Target("n=8, 8 B: at most 2x MPICH's time", "mpi", 8, "time", 2.0, 8, 8),
    Target("n=8, from 1 MiB: busbw at least 1.2x MPICH's", "mpi", 8, "busbw", 1.2, MiB),
    Target("n=16, 8 B: at most 3x MPICH's time", "mpi", 16, "time", 3.0, 8, 8),
    Target("n=16, 32 KiB: at most 1.5x MPICH's time", "mpi", 16, "time", 1.5, 32 * KiB, 32 * KiB),
    Target("n=16, 2 MiB: at most MPICH's time", "mpi", 16, "time", 1.0, 2 * MiB, 2 * MiB),
    Target("every n and size: faster than torch gloo", "gloo", None, "time", 1.0, 1),
    Target("n=8, 8 B: calls 2-20 at most 1.5x the median", "hccl", 8, "first_calls", 1.5, 8, 8),
    Target("n=8, 8 B: the first call at most 20 ms", "hccl", 8, "first_call_ms", 20.0, 8, 8),
)
TARGETS = {"allreduce": ALLREDUCE_TARGETS}


@dataclass(frozen=True)
class Verdict:
    """A target's outcome: ``ratio`` the worst measured (None: not measured), at ``nranks``/``size``."""

    target: Target
    ratio: float | None
    nranks: int | None = None
    size: int | None = None
    measured: int = 0  # (world size, size) pairs the target covered

    @property
    def met(self) -> bool | None:
        """True or False once measured; None when the invocation did not measure it."""
        if self.ratio is None:
            return None
        if self.target.metric == "busbw":
            return self.ratio >= self.target.bound
        return self.ratio <= self.target.bound


def check_targets(results: Sequence[BenchResult]) -> list[Verdict]:
    """Every target of the invocation's collective against its results (one per world size)."""
    if not results:
        return []
    verdicts = []
    for target in TARGETS.get(results[0].cfg.collective, ()):
        worst: tuple[float, int, int] | None = None
        measured = 0
        for result in results:
            if target.nranks is not None and result.cfg.nranks != target.nranks:
                continue
            base, peer = result.impls.get("hccl"), result.impls.get(target.peer)
            if base is None or peer is None or base.status != "ok" or peer.status != "ok":
                continue
            theirs = {row.size: row for row in peer.rows}
            for row in base.rows:
                other = theirs.get(row.size)
                if other is None or not target.min_size <= row.size <= target.max_size:
                    continue
                ratio = _ratio(target, row, other, result.cfg.warmup)
                if ratio is None:
                    continue
                worse = worst is None or (ratio < worst[0] if target.metric == "busbw" else ratio > worst[0])
                measured += 1
                if worse:
                    worst = (ratio, result.cfg.nranks, row.size)
        verdicts.append(Verdict(target, *worst, measured) if worst else Verdict(target, None))
    return verdicts


def _ratio(target: Target, row, other, warmup: int) -> float | None:
    """The target's measure at one size (None: this invocation does not give it)."""
    if target.metric == "time":
        return row.time_us / other.time_us if other.time_us > 0 else math.inf
    if target.metric == "busbw":
        return row.busbw / other.busbw if other.busbw > 0 else math.inf
    if target.metric == "first_calls":
        first = row.extra.get("first_calls_us")
        if first is None or warmup < FIRST_CALLS:
            return None
        return first / row.time_us if row.time_us > 0 else math.inf
    first = row.extra.get("first_call_us")  # first_call_ms
    return None if first is None else first / 1e3


def format_targets(verdicts: Sequence[Verdict]) -> str:
    """The targets table: per target the worst ratio measured and where, the bound, met or not."""
    if not verdicts:
        return ""
    lines = [
        "# targets: hccl-py / peer, the worst measured size of each (time: at most the bound; busbw: at least)",
        "#",
        f"# {'target':<48} {'worst':>8} {'at':>14} {'bound':>6}  verdict",
    ]
    for v in verdicts:
        unit = "ms" if v.target.metric == "first_call_ms" else "x"
        bound = f"{'>=' if v.target.metric == 'busbw' else '<='}{v.target.bound:g}"
        if v.ratio is None:
            why = " (the first calls need -w 20)" if v.target.metric == "first_calls" else ""
            lines.append(f"  {v.target.what:<48} {'-':>8} {'-':>14} {bound:>6}  not measured in this invocation{why}")
            continue
        where = f"n={v.nranks} {format_size(v.size)}"
        verdict = "met" if v.met else "NOT MET"
        lines.append(
            f"  {v.target.what:<48} {f'{v.ratio:.2f}{unit}':>8} {where:>14} {bound:>6}  {verdict} ({v.measured} measured)"
        )
    return "\n".join(lines)


def targets_to_json(verdicts: Sequence[Verdict]) -> list[dict]:
    """The verdicts as JSON rows (``met`` null when not measured)."""
    return [
        {
            "target": v.target.what,
            "peer": v.target.peer,
            "metric": v.target.metric,
            "bound": v.target.bound,
            "worst_ratio": v.ratio if v.ratio is None or math.isfinite(v.ratio) else None,
            "nranks": v.nranks,
            "size": v.size,
            "measured": v.measured,
            "met": v.met,
        }
        for v in verdicts
    ]
