"""In-process player: runs every rank of one collective with numpy, checking the schedule.

For tests and the simulator. ``check`` builds every rank's schedule and verifies it against the
rules of ``schedule.py`` without data; ``play`` then moves real numpy data along the order the
check found; ``walk`` lists each rank's steps for a cost model::

    outs = play("allreduce", "ring", 4, [np.arange(10, dtype=np.int32)] * 4, op="sum")

What ``check`` rejects, with a ``ScheduleError`` naming the schedule, rank and step:

* regions out of bounds (IN / OUT sized by the collective, TMP by ``tmp_count``), bad peers;
* writes to IN; writes to OUT by non-root ranks of reduce, by the root of broadcast (whose OUT
  is its input);
* in-step hazards: a receive writing a region a send of the same step reads; overlapping but
  not identical receive destinations; a ``reduce_with`` that overlaps a receive destination
  other than its own identical one; copies (and a local reduction's operand) between
  overlapping but not identical regions
  (IN and OUT are the same memory for in-place collectives and are compared as such);
* unmatched or count-mismatched messages, matched FIFO per ordered pair of ranks;
* deadlock under *synchronous* semantics: a send completes only while its receiver executes
  the step holding the matching receive, and a step completes when all its sends and receives
  have; rounds are simulated until every rank has finished, or no rank can move.
"""

from __future__ import annotations

from functools import lru_cache
from typing import Callable, NamedTuple, Sequence, Union

import numpy as np

from ..collectives import collective as lookup
from ..dtypes import UFUNCS, ReduceOp
from ..errors import HcclParamError
from .registry import get_schedule
from .schedule import IN, OUT, TMP, Recv, Region, Schedule, Send, message_numbers

ScheduleFn = Callable[..., Schedule]


class ScheduleError(AssertionError):
    """A schedule breaks the rules of ``schedule.py``."""


class Enter(NamedTuple):
    """Rank ``rank`` starts step ``step``: its copies run."""

    rank: int
    step: int


class Transfer(NamedTuple):
    """Send ``send`` of (``src``, ``src_step``) meets receive ``recv`` of (``dst``, ``dst_step``)."""

    src: int
    src_step: int
    send: int
    dst: int
    dst_step: int
    recv: int


class Done(NamedTuple):
    """Rank ``rank`` completes step ``step``: its receives are applied in list order."""

    rank: int
    step: int


Event = Union[Enter, Transfer, Done]


class Plan(NamedTuple):
    """Every rank's checked schedule and the order in which a synchronous run took the events."""

    collective: str
    size: int
    count: int
    root: int
    schedules: tuple[Schedule, ...]
    events: tuple[Event, ...]


class StepIO(NamedTuple):
    """One checked step as a cost model walks it: its ``index`` in the schedule,
    its ``sends`` and ``recvs``."""

    index: int
    sends: tuple[Send, ...]
    recvs: tuple[Recv, ...]


def resolve(collective: str, algo: str | ScheduleFn) -> ScheduleFn:
    """The schedule function of ``algo`` (a registry name or a function) for ``collective``."""
    spec = lookup(collective)
    return get_schedule(spec.name, algo) if isinstance(algo, str) else algo


def check(collective: str, algo: str | ScheduleFn, size: int, count: int, root: int = 0) -> Plan:
    """Build and check every rank's schedule; the plan of a synchronous run. Cached."""
    if size < 1 or not 0 <= root < size or count < 0:
        raise HcclParamError(f"bad call: size={size}, count={count}, root={root}")
    return _check(collective, resolve(collective, algo), size, count, root)


def walk(collective: str, algo: str | ScheduleFn, size: int, count: int, root: int = 0) -> list[list[StepIO]]:
    """Per rank, its checked steps in order as (step index, sends, recvs): what a cost model walks."""
    plan = check(collective, algo, size, count, root)
    return [[StepIO(i, s.sends, s.recvs) for i, s in enumerate(sched.steps)] for sched in plan.schedules]


def play(
    collective: str,
    algo: str | ScheduleFn,
    size: int,
    inputs: Sequence[np.ndarray],
    *,
    root: int = 0,
    op: ReduceOp | str = "sum",
) -> list[np.ndarray]:
    """Each rank's OUT after the collective, given each rank's input (inputs are not modified).

    For reduce, non-root outputs are their inputs, untouched. OUT of allgather and
    reduce_scatter starts as garbage (NaN / the integer maximum) so that unwritten elements show.
    """
    if len(inputs) != size:
        raise HcclParamError(f"{len(inputs)} inputs for size {size}")
    arrays = [np.ascontiguousarray(x) for x in inputs]
    shape, dtype = arrays[0].shape, arrays[0].dtype
    varying = hasattr(algo, "buffer_counts")  # counts per pair: every rank's input its own length
    if len(shape) != 1 or any(a.ndim != 1 or a.dtype != dtype or (a.shape != shape and not varying) for a in arrays):
        raise HcclParamError("inputs must be 1-D arrays of one shape and dtype")
    spec = lookup(collective)
    count = shape[0]
    if spec.in_count(size, 1) > 1:  # the input is one block per rank
        if count % size:
            raise HcclParamError(f"{collective} input of {count} elements does not split into {size} blocks")
        count //= size
    plan = check(collective, algo, size, count, root)
    ufunc = UFUNCS[ReduceOp.parse(op)]
    bufs = []
    for r, sched in enumerate(plan.schedules):
        data = arrays[r].copy()
        out = (
            data
            if spec.in_place
            else _garbage(_buffer_counts(spec, resolve(collective, algo), size, count, r, root)[1], dtype)
        )
        bufs.append({IN: data, OUT: out, TMP: _garbage(sched.tmp_count, dtype)})

    def view(rank: int, region: Region) -> np.ndarray:
        return bufs[rank][region.buf][region.offset : region.end]

    incoming: dict[tuple[int, int, int], np.ndarray] = {}
    with np.errstate(all="ignore"):  # overflow and NaN are the data's, as in the executor
        _replay(plan, view, incoming, ufunc)
    return [b[OUT] for b in bufs]


def _replay(plan: "Plan", view, incoming: dict, ufunc) -> None:
    """Move the data of ``plan``'s events, in order (see :func:`play`)."""
    for ev in plan.events:
        if isinstance(ev, Enter):
            for c in plan.schedules[ev.rank].steps[ev.step].copies:
                if c.reduce_with is None:
                    view(ev.rank, c.dst)[...] = view(ev.rank, c.src)
                else:
                    ufunc(view(ev.rank, c.reduce_with), view(ev.rank, c.src), out=view(ev.rank, c.dst))
        elif isinstance(ev, Transfer):
            send = plan.schedules[ev.src].steps[ev.src_step].sends[ev.send]
            incoming[(ev.dst, ev.dst_step, ev.recv)] = view(ev.src, send.src).copy()
        else:
            for j, rv in enumerate(plan.schedules[ev.rank].steps[ev.step].recvs):
                data = incoming.pop((ev.rank, ev.step, j))
                if rv.reduce_with is None:
                    view(ev.rank, rv.dst)[...] = data
                elif rv.incoming_first:
                    ufunc(data, view(ev.rank, rv.reduce_with), out=view(ev.rank, rv.dst))
                else:
                    ufunc(view(ev.rank, rv.reduce_with), data, out=view(ev.rank, rv.dst))


def _fmt(r: Region) -> str:
    return f"{r.buf.name}[{r.offset}:{r.end}]"


def _garbage(n: int, dtype: np.dtype) -> np.ndarray:
    return np.full(n, np.iinfo(dtype).max if dtype.kind in "iu" else np.nan, dtype=dtype)


def _name(fn: ScheduleFn) -> str:
    module = getattr(fn, "__module__", "") or ""
    return module.rsplit(".", 1)[-1] if module.startswith("hccl_py.") else getattr(fn, "__qualname__", repr(fn))


@lru_cache(maxsize=256)  # plans hold every event; the simulator may play thousands of ranks
def _check(collective: str, fn: ScheduleFn, size: int, count: int, root: int) -> Plan:
    where = f"{_name(fn)} ({collective}, size={size}, count={count}, root={root})"
    spec = lookup(collective)
    schedules = []
    for rank in range(size):
        sched = fn(rank, size, count, root)
        if not isinstance(sched, Schedule):
            raise ScheduleError(f"{where}: rank {rank} returned {type(sched).__name__}, not a Schedule")
        in_count, out_count = _buffer_counts(spec, fn, size, count, rank, root)
        limits = {IN: in_count, OUT: out_count, TMP: sched.tmp_count}
        for i, step in enumerate(sched.steps):
            _check_step(collective, rank, size, root, step, limits, f"{where}: rank {rank} step {i}")
        schedules.append(sched)
    send_match, recv_match = _match(schedules, where)
    events = _simulate(schedules, send_match, recv_match, where)
    return Plan(collective, size, count, root, tuple(schedules), tuple(events))


def _buffer_counts(spec, fn: ScheduleFn, size: int, count: int, rank: int, root: int) -> tuple[int, int]:
    """(IN, OUT) elements of ``rank``: the schedule function's own when its blocks vary per pair
    (``alltoallv.VSchedule``), else the collective's."""
    if hasattr(fn, "buffer_counts"):
        return fn.buffer_counts(rank)
    return spec.buffer_counts(size, count, rank, root)


def _check_step(collective: str, rank: int, size: int, root: int, step, limits: dict, where: str) -> None:
    in_place = lookup(collective).in_place

    def mem(r: Region) -> Region:  # IN and OUT are one array for in-place collectives
        return Region(OUT, r.offset, r.count) if in_place and r.buf == IN else r

    def bounds(r: object, what: str) -> Region:
        if not isinstance(r, Region) or r.buf not in limits:
            raise ScheduleError(f"{where}: {what} {r!r} is not a Region of IN, OUT or TMP")
        if r.offset < 0 or r.count < 0 or r.end > limits[r.buf]:
            raise ScheduleError(f"{where}: {what} {_fmt(r)} out of bounds ({r.buf.name} has {limits[r.buf]} elements)")
        return r

    def writable(r: Region, what: str) -> None:
        if r.buf == IN:
            raise ScheduleError(f"{where}: {what} {_fmt(r)} writes IN")
        if r.buf == OUT and collective == "reduce" and rank != root:
            raise ScheduleError(f"{where}: {what} {_fmt(r)} writes OUT on a non-root rank of reduce")
        if r.buf == OUT and collective == "broadcast" and rank == root:
            raise ScheduleError(f"{where}: {what} {_fmt(r)} writes the root's buffer in broadcast")

    def peer(p: object, what: str) -> None:
        if not isinstance(p, int) or not 0 <= p < size or p == rank:
            raise ScheduleError(f"{where}: {what} has peer {p!r} (size {size}, own rank {rank})")

    for c in step.copies:
        bounds(c.src, "copy source")
        writable(bounds(c.dst, "copy destination"), "copy destination")
        if c.src.count != c.dst.count:
            raise ScheduleError(f"{where}: copy {_fmt(c.src)} -> {_fmt(c.dst)} changes the count")
        if mem(c.src).overlaps(mem(c.dst)) and mem(c.src) != mem(c.dst):
            raise ScheduleError(f"{where}: copy {_fmt(c.src)} -> {_fmt(c.dst)} between overlapping regions")
        if c.reduce_with is not None:
            w = mem(bounds(c.reduce_with, "copy reduce_with"))
            if c.reduce_with.count != c.dst.count:
                raise ScheduleError(
                    f"{where}: copy reduce_with {_fmt(c.reduce_with)} and destination {_fmt(c.dst)} differ in count"
                )
            if w.overlaps(mem(c.dst)) and w != mem(c.dst):
                raise ScheduleError(
                    f"{where}: copy reduce_with {_fmt(c.reduce_with)} overlaps destination {_fmt(c.dst)} but differs"
                )
    for s in step.sends:
        peer(s.peer, "send")
        bounds(s.src, "send source")
    dsts = [mem(rv.dst) for rv in step.recvs]
    for j, rv in enumerate(step.recvs):
        peer(rv.peer, "receive")
        writable(bounds(rv.dst, "receive destination"), "receive destination")
        for s in step.sends:
            if dsts[j].overlaps(mem(s.src)):
                raise ScheduleError(
                    f"{where}: hazard: receive from {rv.peer} into {_fmt(rv.dst)} overwrites {_fmt(s.src)}, "
                    f"sent to {s.peer} in the same step"
                )
        for k in range(j):
            if dsts[j].overlaps(dsts[k]) and dsts[j] != dsts[k]:
                raise ScheduleError(
                    f"{where}: hazard: receive destinations {_fmt(step.recvs[k].dst)} and {_fmt(rv.dst)} overlap but differ"
                )
        if rv.reduce_with is not None:
            w = mem(bounds(rv.reduce_with, "reduce_with"))
            if rv.reduce_with.count != rv.dst.count:
                raise ScheduleError(f"{where}: reduce_with {_fmt(w)} and destination {_fmt(rv.dst)} differ in count")
            for other in dsts:
                if w.overlaps(other) and not (w == other == dsts[j]):
                    raise ScheduleError(
                        f"{where}: hazard: reduce_with {_fmt(rv.reduce_with)} overlaps receive destination "
                        f"{_fmt(other)}; the result would depend on arrival order"
                    )


def _match(schedules: list[Schedule], where: str):
    """FIFO matching per ordered pair (``schedule.message_numbers``): {(rank, step, send index):
    (peer, step, recv index)} and back."""
    sends: dict[tuple[int, int, int], tuple[int, int, int]] = {}
    recvs: dict[tuple[int, int, int], tuple[int, int, int]] = {}
    for rank, sched in enumerate(schedules):
        for i, (step, (send_numbers, recv_numbers)) in enumerate(zip(sched.steps, message_numbers(sched))):
            for j, (s, k) in enumerate(zip(step.sends, send_numbers)):
                sends[(rank, s.peer, k)] = (i, j, s.src.count)
            for j, (rv, k) in enumerate(zip(step.recvs, recv_numbers)):
                recvs[(rv.peer, rank, k)] = (i, j, rv.dst.count)
    send_match, recv_match = {}, {}
    for a, b, k in sorted(set(sends) | set(recvs)):
        s, r = sends.get((a, b, k)), recvs.get((a, b, k))
        if r is None:
            raise ScheduleError(
                f"{where}: unmatched send: message #{k + 1} from rank {a} (step {s[0]}) to rank {b}, "
                f"which posts only {k} receive(s) from {a}"
            )
        if s is None:
            raise ScheduleError(
                f"{where}: unmatched receive: rank {b} (step {r[0]}) waits for message #{k + 1} from rank {a}, "
                f"which sends only {k} message(s) to {b}"
            )
        if s[2] != r[2]:
            raise ScheduleError(
                f"{where}: count mismatch: message #{k + 1} from rank {a} to {b} sends {s[2]} elements "
                f"(step {s[0]}), the receive expects {r[2]} (step {r[0]})"
            )
        send_match[(a, s[0], s[1])] = (b, r[0], r[1])
        recv_match[(b, r[0], r[1])] = (a, s[0], s[1])
    return send_match, recv_match


def _simulate(schedules: list[Schedule], send_match: dict, recv_match: dict, where: str) -> list[Event]:
    size = len(schedules)
    pos = [0] * size
    pending_sends: list[set[int]] = [set() for _ in range(size)]
    pending_recvs: list[set[int]] = [set() for _ in range(size)]
    events: list[Event] = []

    def enter(r: int) -> None:
        if pos[r] < len(schedules[r].steps):
            step = schedules[r].steps[pos[r]]
            events.append(Enter(r, pos[r]))
            pending_sends[r] = set(range(len(step.sends)))
            pending_recvs[r] = set(range(len(step.recvs)))

    for r in range(size):
        enter(r)
    while True:
        progress = False
        for r in range(size):
            for j in sorted(pending_sends[r]):
                b, bi, bj = send_match[(r, pos[r], j)]
                if pos[b] == bi:
                    events.append(Transfer(r, pos[r], j, b, bi, bj))
                    pending_sends[r].discard(j)
                    pending_recvs[b].discard(bj)
                    progress = True
        for r in range(size):
            while pos[r] < len(schedules[r].steps) and not pending_sends[r] and not pending_recvs[r]:
                events.append(Done(r, pos[r]))
                pos[r] += 1
                enter(r)
                progress = True
        if all(pos[r] == len(schedules[r].steps) for r in range(size)):
            return events
        if not progress:
            stuck = []
            for r in range(size):
                if pos[r] == len(schedules[r].steps):
                    continue
                waits = [_waiting("send to", send_match[(r, pos[r], j)], pos) for j in sorted(pending_sends[r])]
                waits += [_waiting("receive from", recv_match[(r, pos[r], j)], pos) for j in sorted(pending_recvs[r])]
                stuck.append(f"rank {r} stuck in step {pos[r]} of {len(schedules[r].steps)}: " + ", ".join(waits))
            raise ScheduleError(f"{where}: deadlock under synchronous semantics; " + "; ".join(stuck))


def _waiting(what: str, match: tuple[int, int, int], pos: list[int]) -> str:
    peer, step, _ = match
    return f"{what} {peer} (needs rank {peer} in step {step}, it is in step {pos[peer]})"
