"""The flight recorder: every collective call of this rank, from the moment it is entered.

Each call gets a :class:`CallRecord` when it is *entered* (before any byte moves), marked
*completed* or *failed* when it ends. The recorder keeps the latest ``HCCL_PY_FLIGHT_RECORDS``
(default 20,000) records plus running totals, so:

* ``comm.stats()`` sums a communicator's calls (modeled and wall seconds, never mixed);
* :func:`write_rank_trace` writes a Chrome trace (Perfetto): one process per rank, one track
  for the modeled timeline and one for the wall-clock timeline;
* :meth:`Recorder.dump` writes the records as JSON when a call fails, on SIGTERM, on an uncaught
  exception, or on demand (``hccl_py.dump_flight_recorder()``); hccl-launch merges the ranks'
  dumps into one root-cause report: which rank failed first, which ranks never entered which
  call.
"""

from __future__ import annotations

import json
import os
import socket
import sys
import time
from collections import deque
from dataclasses import dataclass, field
from pathlib import Path

from . import sigterm, tracefile
from .errors import HcclInternalError, HcclParamError, HcclSyscallError

DEFAULT_RECORDS = 20_000


class CallRecord:
    """One call: what it was, its state, and when (modeled and wall seconds, apart)."""

    __slots__ = (
        "comm",
        "seq",
        "op",
        "algo",
        "dtype",
        "count",
        "nbytes",
        "peers",
        "state",
        "error",
        "modeled_start",
        "modeled_end",
        "wall_start",
        "wall_end",
    )

    def __init__(  # params: one per field of the record, built once per call on the call path
        self,
        comm: str,
        seq: int,
        op: str,
        algo: str,
        dtype: str,
        count: int,
        nbytes: int,
        peers: tuple[int, ...],
        modeled_start: float,
        wall_start: float,
    ):
        self.comm = comm
        self.seq = seq
        self.op = op
        self.algo = algo
        self.dtype = dtype
        self.count = count
        self.nbytes = nbytes
        self.peers = peers  # world ranks of the communicator
        self.state = "entered"
        self.error: str | None = None
        self.modeled_start = modeled_start
        self.modeled_end: float | None = None
        self.wall_start = wall_start  # time.monotonic()
        self.wall_end: float | None = None

    def to_dict(self) -> dict:
        """Every field by name, as the flight recorder writes it to JSON."""
        return {name: getattr(self, name) for name in self.__slots__}


@dataclass
class OpStats:
    """Totals of one operation's completed calls on one communicator: calls, bytes, modeled and wall
    seconds."""

    calls: int = 0
    nbytes: int = 0
    modeled_s: float = 0.0
    wall_s: float = 0.0


@dataclass
class CommStats:
    """Totals of one communicator's completed calls on this rank; ``by_op`` splits them."""

    calls: int = 0
    nbytes: int = 0
    modeled_s: float = 0.0
    wall_s: float = 0.0
    by_op: dict[str, OpStats] = field(default_factory=dict)


class Recorder:
    """Per-process flight recorder: the latest records and running totals (kept as plain sums:
    this runs on every call)."""

    def __init__(self, capacity: int = DEFAULT_RECORDS) -> None:
        self.records: deque[CallRecord] = deque(maxlen=capacity)
        self._sums: dict[tuple[str, str], list] = {}  # (comm, op) -> [calls, nbytes, modeled_s, wall_s]

    def enter(self, record: CallRecord) -> CallRecord:
        """Keep ``record`` (state "entered"), dropping the oldest beyond the capacity; returns it."""
        self.records.append(record)
        return record

    def complete(self, record: CallRecord, modeled_end: float, wall_end: float) -> None:
        """Mark ``record`` completed at ``modeled_end`` (modeled seconds) and ``wall_end`` (``time.monotonic()``)
        and add it to its communicator's totals."""
        record.state = "completed"
        record.modeled_end = modeled_end
        record.wall_end = wall_end
        sums = self._sums.get((record.comm, record.op))
        if sums is None:
            sums = self._sums[(record.comm, record.op)] = [0, 0, 0.0, 0.0]
        sums[0] += 1
        sums[1] += record.nbytes
        sums[2] += modeled_end - record.modeled_start
        sums[3] += wall_end - record.wall_start

    def fail(self, record: CallRecord, error: BaseException, modeled_end: float, wall_end: float) -> None:
        """Mark ``record`` failed with ``error`` (kept as "Type: message"); failed calls count in no total."""
        record.state = "failed"
        record.error = f"{type(error).__name__}: {error}"
        record.modeled_end = modeled_end
        record.wall_end = wall_end

    def totals(self, comm: str) -> CommStats:
        """Totals of communicator ``comm``'s completed calls (what ``Communicator.stats()`` returns)."""
        stats = CommStats()
        for (name, op), (calls, nbytes, modeled_s, wall_s) in self._sums.items():
            if name == comm:
                stats.by_op[op] = OpStats(calls, nbytes, modeled_s, wall_s)
                stats.calls += calls
                stats.nbytes += nbytes
                stats.modeled_s += modeled_s
                stats.wall_s += wall_s
        return stats

    def dump(self, path: str | Path, *, rank: int, reason: str, wall_origin: float, extra: dict | None = None) -> Path:
        """Write this rank's records as JSON (atomically: a reader never sees half a file);
        HcclSyscallError naming the path when it cannot be written."""
        path = Path(path)
        now = time.monotonic()
        doc = {
            "rank": rank,
            "pid": os.getpid(),
            "host": socket.gethostname(),
            "reason": reason,
            "dumped_at_s": now - wall_origin,  # wall seconds since the job started
            "wall_origin": wall_origin,
            "records": [r.to_dict() for r in self.records],
            **(extra or {}),
        }
        tmp = path.with_name(path.name + f".{os.getpid()}.tmp")
        try:
            path.parent.mkdir(parents=True, exist_ok=True)
            tmp.write_text(json.dumps(doc))
            os.replace(tmp, path)
        except OSError as err:
            try:
                tmp.unlink(missing_ok=True)
            except OSError:
                pass
            raise HcclSyscallError(
                f"flight recorder: cannot write {path}: {err.strerror or err}; give a path to a file in a "
                "directory this process can write (its parents are made)",
                path=str(path),
                errno=err.errno,
            ) from None
        return path


def chrome_trace_events(rank: int, records, wall_origin: float, kernels=()) -> list[dict]:
    """Trace events of one rank: pid = rank; tid 0 = the card's communication (modeled time),
    tid 2 = its compute stream's kernels (modeled time, ``kernels``: (name, start, seconds)),
    tid 1 = the calls in wall time. Overlap of compute and communication shows as spans of
    tids 0 and 2 side by side."""
    events = [
        {"ph": "M", "name": "process_name", "pid": rank, "args": {"name": f"rank {rank}"}},
        {"ph": "M", "name": "thread_name", "pid": rank, "tid": 0, "args": {"name": "modeled: communication stream"}},
        {"ph": "M", "name": "thread_name", "pid": rank, "tid": 2, "args": {"name": "modeled: compute stream"}},
        {"ph": "M", "name": "thread_name", "pid": rank, "tid": 1, "args": {"name": "wall time"}},
    ]
    for name, start, seconds in kernels:
        events.append(
            {"ph": "X", "name": name, "cat": "compute", "pid": rank, "tid": 2, "ts": start * 1e6, "dur": seconds * 1e6}
        )
    for r in records:
        if r.modeled_end is None:
            continue  # never finished: no span to draw
        args = {
            "comm": r.comm,
            "seq": r.seq,
            "algo": r.algo,
            "bytes": r.nbytes,
            "state": r.state,
            "peers": list(r.peers),
        }
        name = f"{r.op} #{r.seq}"
        events.append(
            {
                "ph": "X",
                "name": name,
                "cat": r.comm,
                "pid": rank,
                "tid": 0,
                "ts": r.modeled_start * 1e6,
                "dur": (r.modeled_end - r.modeled_start) * 1e6,
                "args": args,
            }
        )
        events.append(
            {
                "ph": "X",
                "name": name,
                "cat": r.comm,
                "pid": rank,
                "tid": 1,
                "ts": (r.wall_start - wall_origin) * 1e6,
                "dur": (r.wall_end - r.wall_start) * 1e6,
                "args": args,
            }
        )
    return events


def write_rank_trace(path: str | Path, rank: int, records, wall_origin: float, kernels=()) -> Path:
    """Write one rank's trace file; hccl-launch merges the ranks' files into one."""
    return tracefile.write(path, chrome_trace_events(rank, records, wall_origin, kernels))


# The rank context whose recorder the hooks dump (one per process; the latest init's). Anything
# with ``dump(reason)``, ``recorder``, ``device``, ``wall_origin`` and ``summary()``: a RankContext.
_hooked: list = []


def install_dump_hooks(rc) -> None:
    """Dump the flight recorder when this rank dies of an uncaught exception or is stopped with
    SIGTERM (how hccl-launch stops ranks), so the launcher can say what every rank was doing."""
    _hooked[:] = [rc]
    if not rc.flight_dir or getattr(install_dump_hooks, "installed", False):
        return
    install_dump_hooks.installed = True
    previous_hook = sys.excepthook

    def excepthook(kind, value, tb):
        if _hooked and not isinstance(value, KeyboardInterrupt):
            _hooked[0].dump(f"uncaught {kind.__name__}: {value}")
        previous_hook(kind, value, tb)

    sys.excepthook = excepthook
    sigterm.on_sigterm(_dump_on_sigterm)


def _dump_on_sigterm() -> None:
    if _hooked:
        _hooked[0].dump("stopped by SIGTERM")


def dump_flight_recorder(reason: str = "on demand", path: str | os.PathLike[str] | None = None) -> str | None:
    """Write this rank's flight recorder (its latest collective calls, their state, modeled and
    wall times) as JSON: to ``path``, else into HCCL_PY_FLIGHT_DIR (set by hccl-launch).
    Returns the path written, or None when there is nowhere to write::

        hccl_py.dump_flight_recorder(path="flight.json")

    ``path`` is a str or path-like (HcclParamError otherwise); a path that cannot be written
    raises HcclSyscallError naming it.
    """
    if not isinstance(reason, str):
        raise HcclParamError(
            f"dump_flight_recorder: reason must be a str (it is written into the dump), got {type(reason).__name__}",
            arg="reason",
            value=repr(reason),
            rule="type",
            expected="str",
        )
    if path is not None:
        path = _checked_path(path)
    if not _hooked:
        raise HcclInternalError("dump_flight_recorder: call hccl_py.init() first")
    rc = _hooked[0]
    if path is not None:
        return str(
            rc.recorder.dump(path, rank=rc.device.rank, reason=reason, wall_origin=rc.wall_origin, extra=rc.summary())
        )
    written = rc.dump(reason)
    return None if written is None else str(written)


def _checked_path(path) -> str:
    """``path`` (a str or path-like naming a file) as a str; HcclParamError otherwise."""
    try:
        text = os.fspath(path)
    except TypeError:
        text = None
    if not isinstance(text, str):
        raise HcclParamError(
            f'dump_flight_recorder: path must be a str or path-like (e.g. "flight.json"), got '
            f"{type(path).__name__}: {path!r}",
            arg="path",
            value=repr(path),
            rule="type",
            expected="str or os.PathLike[str]",
        )
    if not text or text.endswith(os.sep) or os.path.isdir(text) or "\0" in text:
        raise HcclParamError(
            f"dump_flight_recorder: path={text!r} does not name a file; give a file name such as "
            f"{os.path.join(text, 'flight.json') if text else 'flight.json'!r}",
            arg="path",
            value=text,
            rule="format",
            expected="a file path",
        )
    return text
