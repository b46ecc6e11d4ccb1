"""The shared part of hccl-bench (nccl-tests' common.cu): sweep sizes, warm-up, timing, checking,
repeats and medians, progress. Collectives (benchmarks/collectives) and implementations
(benchmarks/peers) stay thin.

Timing, per size, on every rank (:func:`run_sweep`):

1. ``-w`` warm-up iterations, then ``-i`` timed iterations. Every iteration gets its own buffer
   (in-place collectives: a fresh copy of the input; out-of-place: a poisoned output buffer),
   staged before the clock starts, so every iteration's result can be checked afterwards.
2. The timed iterations run back to back after a barrier: ``t = perf_counter()`` before the first
   and after the last, divided by their number. When ``iters`` buffers would exceed
   ``mem_budget`` the iterations run in chunks (barrier, back to back, stop the clock, check,
   restage); the chunks' times add up.
3. The per-rank time is reduced to its **max over ranks** with the implementation's own
   allreduce (outside the clock). #wrong is the number of wrong elements summed over ranks and
   all iterations (warm-up included); the check runs outside the clock.

The driver (:func:`run_benchmark`) runs the whole sweep ``--repeats`` times, alternating the
implementations (hccl, mpi, gloo, hccl, mpi, gloo, ...), and reports per size the median over
repeats. With several world sizes (``-n 2,4``, :func:`run_benchmarks`) the world sizes alternate
too, so a slow stretch of the machine does not fall on one of them only.

Extension point, extra columns: an implementation may report more per-size numbers (hccl-py's
modeled time, say). It lists :class:`ExtraColumn` s (``Backend.extra_columns`` on the driver
side, ``RankComm.extra_columns`` on the rank side: the same tuple) and fills the measured ones in
``RankComm.extra_start`` / ``RankComm.extra_stop``, called right before and right after each timed
chunk (outside the clock); a column with ``derive`` is computed from the finished row instead.
"""

from __future__ import annotations

import math
import statistics
import sys
import threading
import time
from abc import ABC, abstractmethod
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, TextIO

import numpy as np

from .collectives import Case, Collective
from .collectives import get as get_collective
from .config import BenchConfig

__all__ = [
    "ExtraColumn",
    "RankComm",
    "Backend",
    "Row",
    "ImplResult",
    "BenchResult",
    "BackendError",
    "sweep_sizes",
    "size_plan",
    "count_wrong",
    "run_sweep",
    "rank_main",
    "aggregate",
    "run_benchmark",
    "run_benchmarks",
]


# ------------------------------------------------------------------------------------ sizes


def sweep_sizes(cfg: BenchConfig) -> list[int]:
    """nccl-tests' sweep: ``-b``, ``-b*f``, ``-b*f^2``, ... while <= ``-e`` (bytes requested)."""
    sizes = [cfg.minbytes]
    if cfg.stepfactor > 1:
        while sizes[-1] * cfg.stepfactor <= cfg.maxbytes:
            sizes.append(sizes[-1] * cfg.stepfactor)
    return sizes


@dataclass(frozen=True)
class SizePoint:
    """One row of the sweep: bytes reported and the element counts the buffers get."""

    nbytes: int  # the "size" column: max(send, recv) bytes
    count: int  # Case.count
    send_count: int
    recv_count: int

    @property
    def elements(self) -> int:
        """Elements of the larger of the two buffers (what the ``size`` column counts)."""
        return max(self.send_count, self.recv_count)


def size_plan(cfg: BenchConfig) -> list[SizePoint]:
    """The sweep as the collective can run it: counts rounded as nccl-tests does (at least one
    element per rank; collectives of n blocks (allgather, reducescatter, alltoall, scatter, gather)
    to a multiple of n), duplicates after rounding dropped."""
    coll = get_collective(cfg.collective)
    itemsize = cfg.dt.itemsize
    points: list[SizePoint] = []
    for nbytes in sweep_sizes(cfg):
        count, send, recv = coll.counts(nbytes, itemsize, cfg.nranks)
        point = SizePoint(max(send, recv) * itemsize, count, send, recv)
        if not points or point.nbytes != points[-1].nbytes:
            points.append(point)
    return points


# ------------------------------------------------------------------------------- rank side


@dataclass(frozen=True)
class ExtraColumn:
    """An implementation-specific column printed after #wrong (and kept in the JSON).

    Measured columns: ``RankComm.extra_stop`` returns ``{key: value}`` per timed chunk; the
    harness sums chunks, divides by the iterations (a per-iteration value), combines ranks with
    ``reduce`` ("max", "min" or "sum") and takes the median over repeats. Derived columns
    (``derive`` set) are computed on the driver from the finished :class:`Row`, e.g. a busbw
    from a measured time::

        ExtraColumn("modeled_us", "model(us)"),
        ExtraColumn("modeled_busbw", "mbusbw", fmt="{:.2f}",
                    derive=lambda row: row.busbw_for(row.extra["modeled_us"])),
    """

    key: str  # JSON key and extra_stop's key
    header: str  # table header (at most `width` characters)
    fmt: str = "{:.2f}"
    width: int = 10
    reduce: str = "max"
    derive: Callable[["Row"], float] | None = None


class RankComm(ABC):
    """One rank's handle on an implementation: all the harness needs, nothing more.

    ``bind`` is called before the clock starts and returns the one-iteration call the clock
    sees, with everything (buffer wrapping, datatype lookup) done up front, so every
    implementation is timed on its collective call alone.
    """

    rank: int
    size: int
    extra_columns: tuple[ExtraColumn, ...] = ()

    @abstractmethod
    def bind(
        self, coll: Collective, send: np.ndarray, recv: np.ndarray | None, op: str, root: int
    ) -> Callable[[], np.ndarray | None]:
        """One iteration of ``coll``: in place on ``send`` when ``recv`` is None, else send ->
        recv. ``send`` is empty on a rank that sends nothing (scatter off the root), ``recv`` on
        one that receives nothing (gather off the root). The call returns the result array if it
        is not ``send``/``recv`` (hccl_py's all_gather returns a new array), else None."""

    @abstractmethod
    def barrier(self) -> None:
        """Every rank has arrived."""

    @abstractmethod
    def allreduce_scalar(self, value: float, how: str) -> float:
        """``value`` combined over ranks with ``how`` ("max", "min", "sum"); same on every rank."""

    def extra_start(self) -> Any:
        """Called right before a timed chunk (outside the clock); the token goes to extra_stop."""
        return None

    def extra_stop(self, token: Any) -> dict[str, float]:
        """Called right after a timed chunk: ``{key: chunk total}`` for the measured extra columns."""
        return {}

    def close(self) -> None:  # noqa: B027 - optional hook, a no-op unless overridden
        """Release the implementation (end of the rank's work)."""


def count_wrong(result: np.ndarray, expected: np.ndarray) -> int:
    """Elements of ``result`` that differ from ``expected`` (bitwise: NaN is always wrong)."""
    result = result.reshape(-1)
    if result.size != expected.size:
        return max(result.size, expected.size)
    view = {1: np.uint8, 2: np.uint16, 4: np.uint32, 8: np.uint64}[expected.dtype.itemsize]
    return int(np.count_nonzero(result.view(view) != expected.view(view)))


_POISON = 0xA5  # bytes written into output buffers before an iteration: never a valid result


FIRST_CALLS = 20  # the warm-up calls whose times are kept (the first one apart): issue 29's "first 20 calls"


def _measure(comm: RankComm, cfg: BenchConfig, coll: Collective, point: SizePoint) -> dict[str, Any]:
    dtype = cfg.dt.np
    case = Case(comm.rank, comm.size, point.count, dtype, cfg.op, cfg.root)
    src, expected = coll.init(case)
    per_iter = (point.send_count if coll.in_place else point.recv_count) * dtype.itemsize
    # The same on every rank (it sets the chunks, hence the barriers), so from the sizes, not the rank's buffers
    nsets = max(1, min(cfg.iters, cfg.mem_budget // max(per_iter, 1)))
    if coll.in_place:
        bufs = [np.empty_like(src) for _ in range(nsets)]
        calls = [comm.bind(coll, b, None, cfg.op, cfg.root) for b in bufs]
    else:
        recv_count = point.recv_count if coll.receives(case.rank, case.root) else 0
        bufs = [np.empty(recv_count, dtype) for _ in range(nsets)]
        calls = [comm.bind(coll, src, b, cfg.op, cfg.root) for b in bufs]
    check = cfg.check and expected is not None
    wrong = 0
    elapsed = 0.0
    warm_s: list[float] = []  # each warm-up call's time: the first calls, plans and buffers made
    extra_sums = {c.key: 0.0 for c in comm.extra_columns if c.derive is None}

    def chunk(k: int, timed: bool) -> None:
        nonlocal wrong, elapsed
        for b in bufs[:k]:
            if coll.in_place:
                np.copyto(b, src)
            else:
                b.view(np.uint8).fill(_POISON)
        todo = calls[:k]
        comm.barrier()
        token = comm.extra_start() if timed else None
        if timed:
            t0 = time.perf_counter()
            outs = [call() for call in todo]
            elapsed += time.perf_counter() - t0
            for key, value in comm.extra_stop(token).items():
                extra_sums[key] = extra_sums.get(key, 0.0) + value
        else:
            outs = []
            for call in todo:
                t0 = time.perf_counter()
                outs.append(call())
                warm_s.append(time.perf_counter() - t0)
        if check:
            assert expected is not None
            for out, b in zip(outs, bufs):
                wrong += count_wrong(b if out is None else out, expected)

    for done in range(0, cfg.warmup, nsets):
        chunk(min(nsets, cfg.warmup - done), timed=False)
    for done in range(0, cfg.iters, nsets):
        chunk(min(nsets, cfg.iters - done), timed=True)
    time_us = comm.allreduce_scalar(elapsed / cfg.iters, "max") * 1e6
    total_wrong = int(comm.allreduce_scalar(float(wrong), "sum")) if cfg.check else None
    reducers = {c.key: c.reduce for c in comm.extra_columns}
    extra = {
        key: comm.allreduce_scalar(value / cfg.iters, reducers.get(key, "max"))
        for key, value in sorted(extra_sums.items())
    }
    if warm_s:  # the slowest rank's first call, and its mean over the next warm-up calls (up to FIRST_CALLS)
        extra["first_call_us"] = comm.allreduce_scalar(warm_s[0], "max") * 1e6
        following = warm_s[1:FIRST_CALLS]
        if following:
            extra["first_calls_us"] = comm.allreduce_scalar(sum(following) / len(following), "max") * 1e6
    return {
        "size": point.nbytes,
        "count": point.elements,
        "time_us": time_us,
        "wrong": total_wrong,
        "extra": extra,
        "buffers": nsets,
    }


def run_sweep(comm: RankComm, cfg: BenchConfig, progress: Callable[[], None] | None = None) -> list[dict[str, Any]]:
    """Measure every size of ``cfg``'s sweep on this rank; identical rows on every rank.

    ``progress`` (rank 0 only, say) is called after each size.
    """
    if comm.size != cfg.nranks:
        raise ValueError(f"the benchmark was configured for {cfg.nranks} ranks but runs on {comm.size}")
    coll = get_collective(cfg.collective)
    rows = []
    for point in size_plan(cfg):
        rows.append(_measure(comm, cfg, coll, point))
        if progress is not None:
            progress()
    return rows


def file_progress(path: str | None, rank: int) -> Callable[[], None] | None:
    """A ``progress`` callback that appends one byte per size to ``path`` (rank 0 only):
    how ranks in other processes move the driver's progress bar."""
    if path is None or rank != 0:
        return None

    def tick() -> None:
        with open(path, "ab") as f:
            f.write(b".")

    return tick


def rank_main(
    comm: RankComm, cfg: BenchConfig, progress_path: str | None = None, repeats: int = 1
) -> list[list[dict[str, Any]]] | None:
    """A rank's whole job: ``repeats`` sweeps; the rows of each on rank 0, None elsewhere."""
    tick = file_progress(progress_path, comm.rank)
    try:
        runs = [run_sweep(comm, cfg, tick) for _ in range(repeats)]
        comm.barrier()
    finally:
        comm.close()
    return runs if comm.rank == 0 else None


# ----------------------------------------------------------------------------- driver side


class BackendError(RuntimeError):
    """An implementation's run failed (a crash, a timeout, a worker error); the message says why."""


class Backend(ABC):
    """One implementation as the driver sees it: can it run, and one sweep of it."""

    name: str  # hccl, mpi, gloo: the --vs name
    label: str  # for tables and plots
    extra_columns: tuple[ExtraColumn, ...] = ()  # see ExtraColumn

    @abstractmethod
    def unavailable(self) -> str | None:
        """Why it cannot run on this machine (a one-line reason with the fix), or None."""

    def unsupported(self, cfg: BenchConfig) -> str | None:
        """Why it cannot run this collective/dtype/op, or None."""
        return None

    @abstractmethod
    def version(self) -> str:
        """What exactly is measured (library and version), for headers and JSON."""

    @abstractmethod
    def mode(self, coll: Collective) -> str:
        """How the collective is called: ``in place`` or ``out of place`` (and the call's name)."""

    @abstractmethod
    def run(self, cfg: BenchConfig, progress_path: str | None, workdir: str) -> list[dict[str, Any]]:
        """One whole sweep on ``cfg.nranks`` fresh ranks; rank 0's rows (see run_sweep).

        Raises :class:`BackendError` if the run fails or exceeds ``cfg.timeout_s``.
        """


@dataclass(frozen=True)
class Row:
    """One size of one implementation, after the median over repeats."""

    size: int
    count: int
    time_us: float  # median over repeats of (max over ranks of the per-iteration time)
    wrong: int | None  # summed over repeats; None when checking is off
    times_us: tuple[float, ...]  # each repeat's time
    bus_factor: float
    extra: dict[str, float] = field(default_factory=dict)

    @property
    def algbw(self) -> float:
        """GB/s (1e9 bytes/s, as nccl-tests): size / time."""
        return self.size / (self.time_us * 1e-6) / 1e9 if self.time_us > 0 else math.inf

    @property
    def busbw(self) -> float:
        """GB/s as nccl-tests' busbw: ``algbw * bus_factor``."""
        return self.algbw * self.bus_factor

    def busbw_for(self, time_us: float) -> float:
        """The busbw this row would have at ``time_us`` (for derived extra columns)."""
        return self.size / (time_us * 1e-6) / 1e9 * self.bus_factor if time_us > 0 else math.inf


def aggregate(
    runs: Sequence[Sequence[dict[str, Any]]], bus_factor: float, columns: Iterable[ExtraColumn] = ()
) -> list[Row]:
    """Rows of several repeats of one implementation -> one :class:`Row` per size (medians)."""
    if not runs:
        return []
    columns = tuple(columns)
    rows = []
    for per_size in zip(*runs):
        first = per_size[0]
        times = tuple(r["time_us"] for r in per_size)
        wrongs = [r["wrong"] for r in per_size]
        extra = {key: statistics.median(r["extra"][key] for r in per_size) for key in first.get("extra", {})}
        row = Row(
            first["size"],
            first["count"],
            statistics.median(times),
            None if any(w is None for w in wrongs) else sum(wrongs),
            times,
            bus_factor,
            extra,
        )
        for c in columns:
            if c.derive is not None:
                row.extra[c.key] = c.derive(row)
        rows.append(row)
    return rows


@dataclass
class ImplResult:
    """What one implementation gave: its rows, or why it was skipped or failed."""

    name: str  # hccl, mpi, gloo
    label: str  # hccl-py, MPICH (mpi4py), torch gloo
    status: str = "ok"  # ok | skipped | failed
    reason: str = ""
    version: str = ""
    mode: str = ""  # how it was called: "in place", ...
    extra_columns: tuple[ExtraColumn, ...] = ()
    runs: list[list[dict[str, Any]]] = field(default_factory=list)
    rows: list[Row] = field(default_factory=list)


@dataclass
class BenchResult:
    """One configuration's results: each implementation's :class:`ImplResult`, by ``--vs`` name."""

    cfg: BenchConfig
    impls: dict[str, ImplResult]

    @property
    def ok(self) -> list[ImplResult]:
        """The implementations that ran (status "ok")."""
        return [i for i in self.impls.values() if i.status == "ok"]


class _ProgressWatcher:
    """Moves a tqdm bar by the bytes rank 0 appends to a progress file (one per size)."""

    def __init__(self, bar: Any, path: str):
        self._bar, self._path = bar, path
        self._seen = 0
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._loop, daemon=True)

    def __enter__(self) -> "_ProgressWatcher":
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._stop.set()
        self._thread.join()
        self._poll()

    def _loop(self) -> None:
        while not self._stop.wait(0.2):
            self._poll()

    def _poll(self) -> None:
        try:
            size = Path(self._path).stat().st_size
        except OSError:
            return
        if size > self._seen:
            self._bar.update(size - self._seen)
            self._seen = size


def make_progress_bar(total: int, enabled: bool, desc: str = "") -> Any:
    """A tqdm bar on stderr, or None (tqdm missing, disabled, or stderr not a terminal)."""
    if not enabled or not sys.stderr.isatty():
        return None
    try:
        from tqdm import tqdm
    except ImportError:
        return None
    return tqdm(total=total, desc=desc, unit="size", leave=False, file=sys.stderr)


def run_benchmark(
    cfg: BenchConfig,
    backends: Sequence[Backend],
    *,
    log: TextIO | None = None,
    progress: bool = True,
    workdir: str | None = None,
) -> BenchResult:
    """Run every available backend's sweep ``cfg.repeats`` times, alternating; medians per size.

    The first backend is hccl-py: its failure raises :class:`BackendError`. A peer that is not
    installed, cannot run this dtype/op, or fails is reported on ``log`` (default stdout) in one
    line and left out.
    """
    return run_benchmarks([cfg], backends, log=log, progress=progress, workdir=workdir)[0]


def run_benchmarks(
    cfgs: Sequence[BenchConfig],
    backends: Sequence[Backend],
    *,
    log: TextIO | None = None,
    progress: bool = True,
    workdir: str | None = None,
) -> list[BenchResult]:
    """:func:`run_benchmark` for several configurations (``-n 2,4``: the same sweep at each world
    size), interleaved so that slow and fast stretches of the machine fall on all of them alike:
    repeat by repeat, configuration by configuration, backend by backend. One result per config."""
    import tempfile

    log = sys.stdout if log is None else log
    coll = get_collective(cfgs[0].collective)
    impls: list[dict[str, ImplResult]] = [{} for _ in cfgs]
    runnable: list[list[Backend]] = [[] for _ in cfgs]

    def at(cfg: BenchConfig) -> str:  # which world size a line is about, when there are several
        return f" at -n {cfg.nranks}" if len(cfgs) > 1 else ""

    for k, cfg in enumerate(cfgs):
        for i, b in enumerate(backends):
            impl = ImplResult(b.name, b.label, extra_columns=tuple(b.extra_columns))
            impls[k][b.name] = impl
            reason = b.unavailable() or b.unsupported(cfg)
            if reason:
                if i == 0:
                    raise BackendError(f"{b.label}{at(cfg)}: {reason}")
                impl.status, impl.reason = "skipped", reason
                print(f"# skipping {b.name}{at(cfg)}: {reason}", file=log, flush=True)
                continue
            impl.version, impl.mode = b.version(), b.mode(coll)
            runnable[k].append(b)
    repeats = cfgs[0].repeats
    bar = make_progress_bar(
        len(size_plan(cfgs[0])) * repeats * sum(map(len, runnable)), progress, desc=cfgs[0].collective
    )
    try:
        with tempfile.TemporaryDirectory(prefix="hccl-bench-", dir=workdir) as tmp:
            for rep in range(repeats):
                for k, cfg in enumerate(cfgs):
                    for b in list(runnable[k]):
                        impl = impls[k][b.name]
                        if bar is not None:
                            bar.set_description(f"{cfg.collective}{at(cfg)} {b.name} {rep + 1}/{repeats}")
                        progress_path = str(Path(tmp) / f"progress-{b.name}-{cfg.nranks}-{rep}")
                        Path(progress_path).touch()
                        try:
                            if bar is not None:
                                with _ProgressWatcher(bar, progress_path):
                                    rows = b.run(cfg, progress_path, tmp)
                            else:
                                rows = b.run(cfg, None, tmp)
                        except BackendError as err:
                            if b is backends[0]:
                                raise
                            impl.status, impl.reason = "failed", str(err).strip().splitlines()[0]
                            print(f"# {b.name} failed{at(cfg)}, left out: {err}", file=log, flush=True)
                            runnable[k].remove(b)
                            continue
                        impl.runs.append(rows)
    finally:
        if bar is not None:
            bar.close()
    results = []
    for k, cfg in enumerate(cfgs):
        for impl in impls[k].values():
            if impl.status == "ok":
                impl.rows = aggregate(impl.runs, coll.bus_factor(cfg.nranks), impl.extra_columns)
        results.append(BenchResult(cfg, impls[k]))
    return results
