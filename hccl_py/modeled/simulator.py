"""Evaluate schedules on a topology without processes or data: modeled time at cluster scale.

The runtime's floor for modeled time, beside ``cost_model.py``: it takes schedules (a registry
name or a schedule function) and the cost model, nothing above them; running a call as a program
would (``auto``'s choice, an all-to-all-v's counts) is ``planning/calls.py``.

The simulator walks every rank's schedule with the executor's clock rules — a message leaves at
its sender's step start plus its transfer time, a receive waits for it and then reduces, and
:func:`cost_model.step_end` closes each step — so for any world the emulator can run, the
simulated clocks equal the emulator's to the last bit::

    result = simulate("allreduce", "ring", Topology.preset("2x8p-roce"), count=64 << 20, itemsize=1)
    print(result.time_s)
"""

from __future__ import annotations

import gc
from contextlib import contextmanager
from dataclasses import dataclass
from typing import Iterator, Sequence

import numpy as np

from topology import Topology

from ..algorithms.hierarchical_flows import flows_of
from ..algorithms.registry import FLOWS, ROOTED_FLOWS, get_schedule
from ..algorithms.schedule import Schedule, StepFlows, message_numbers
from ..collectives import CallSpec
from ..dtypes import default_dtype
from .cost_model import Arrival, CostModel, StepCost, flow_shares, step_end


@dataclass(frozen=True)
class SimResult:
    """End clock of every rank; ``time_s`` is the collective's modeled duration."""

    start_clocks: tuple[float, ...]
    end_clocks: tuple[float, ...]

    @property
    def time_s(self) -> float:
        """Modeled seconds from the first rank's start to the last rank's end."""
        return max(self.end_clocks) - min(self.start_clocks)


class ScheduleDeadlock(RuntimeError):
    """The schedules cannot complete: some receive has no send that can ever be posted."""


@contextmanager
def without_cyclic_gc() -> Iterator[None]:
    """Pause Python's cyclic garbage collector while a simulation builds its schedules, costs and
    stamps: millions of long-lived objects with no cycles among them, which the collector would
    otherwise walk again and again as they accumulate (16,384 ranks: 15.6 s with it, 8.3 s
    without). Reference counting still frees everything; the collector resumes afterwards."""
    if not gc.isenabled():
        yield
        return
    gc.disable()
    try:
        yield
    finally:
        gc.enable()


@without_cyclic_gc()
def simulate(  # params: public, a call's fields by keyword; algo may be a schedule (simulate_call takes a CallSpec)
    collective: str,
    algo: str,
    topology: Topology,
    count: int,
    *,
    itemsize: int = 4,
    root: int = 0,
    world_ranks: Sequence[int] | None = None,
    start_clocks: Sequence[float] | None = None,
    cost_model: CostModel | None = None,
    dtype: str | None = None,
    op: str = "sum",
) -> SimResult:
    """Modeled clocks of one call of ``collective`` with ``algo`` on the ranks ``world_ranks``
    (default: every rank of ``topology``), each starting at ``start_clocks`` (default 0), with
    elements of numpy type ``dtype`` (default by ``itemsize``) reduced by ``op``."""
    return prepare(
        collective,
        algo,
        topology,
        count,
        itemsize=itemsize,
        root=root,
        world_ranks=world_ranks,
        cost_model=cost_model,
        dtype=dtype,
        op=op,
    ).run(start_clocks)


@without_cyclic_gc()
def prepare(  # params: simulate's, less the start clocks
    collective: str,
    algo: str,
    topology: Topology,
    count: int,
    *,
    itemsize: int = 4,
    root: int = 0,
    world_ranks: Sequence[int] | None = None,
    cost_model: CostModel | None = None,
    dtype: str | None = None,
    op: str = "sum",
) -> PreparedCall:
    """:func:`simulate`'s first half: every rank's schedule and step costs, to walk from any start
    clocks (the same all-to-all-v timed alone and after its counts exchange)::

        call = prepare("allreduce", "ring", topo, 1 << 20)
        alone, later = call.run(), call.run([5e-6] * topo.num_ranks)
    """
    ranks = tuple(range(topology.num_ranks) if world_ranks is None else world_ranks)
    size = len(ranks)
    model = cost_model or CostModel(topology)
    fn = get_schedule(collective, algo)
    schedules = [fn(r, size, count, root) for r in range(size)]
    spec = CallSpec.of(collective, count, dtype=dtype, itemsize=itemsize, op=op, root=root)
    if spec.itemsize != itemsize:
        raise ValueError(f"{collective}: dtype {dtype} has {spec.itemsize}-byte elements, not itemsize={itemsize}")
    costs = model.call_costs(fn, spec, ranks, schedules=schedules)
    return PreparedCall(f"{collective}/{algo}", schedules, costs, [message_numbers(s) for s in schedules])


@dataclass(frozen=True, eq=False)
class PreparedCall:
    """Every rank's schedule, step costs and message numbers of one call (:func:`prepare`)."""

    label: str
    schedules: list[Schedule]
    costs: Sequence[Sequence[StepCost]]
    numbers: list

    @without_cyclic_gc()
    def run(self, start_clocks: Sequence[float] | None = None) -> SimResult:
        """Walk every rank's steps from ``start_clocks`` (default 0): the modeled clocks."""
        schedules, costs, numbers = self.schedules, self.costs, self.numbers
        size = len(schedules)
        clocks = [0.0] * size if start_clocks is None else [float(c) for c in start_clocks]
        start = tuple(clocks)
        # Message k from a to b (``message_numbers``) has stamps[(a, b)][k]; each rank walks its steps in order.
        stamps: dict[tuple[int, int], list[Arrival]] = {}
        pos = [0] * size
        posted = [False] * size
        t0s = [0.0] * size
        pending = set(r for r in range(size) if schedules[r].steps)
        while pending:
            progressed = False
            for r in sorted(pending):
                steps, rank_costs = schedules[r].steps, costs[r]
                while pos[r] < len(steps):
                    step, cost = steps[pos[r]], rank_costs[pos[r]]
                    if not posted[r]:
                        t0s[r] = clocks[r] + cost.copy_s
                        for send, send_s in zip(step.sends, cost.send_s):
                            stamps.setdefault((r, send.peer), []).append(Arrival(t0s[r], t0s[r] + send_s))
                        posted[r] = True
                        progressed = True
                    arrivals = []
                    for recv, k in zip(step.recvs, numbers[r][pos[r]][1]):
                        queue = stamps.get((recv.peer, r), ())
                        if k >= len(queue):
                            break
                        arrivals.append(queue[k])
                    if len(arrivals) < len(step.recvs):
                        break
                    clocks[r] = step_end(t0s[r], cost.send_s, arrivals, cost.recv_s)[0]
                    pos[r] += 1
                    posted[r] = False
                    progressed = True
                if pos[r] == len(steps):
                    pending.discard(r)
            if not progressed:
                raise ScheduleDeadlock(f"{self.label} on {size} ranks: ranks {sorted(pending)} cannot finish")
        return SimResult(start, tuple(clocks))


def can_simulate_flows(collective: str, algo, size: int, count: int, root: int = 0) -> bool:
    """Whether :func:`simulate_flows` applies: the algorithm lists its steps for all ranks at
    once (``flows``) for this size and count (no empty step; hierarchical algorithms on equal
    groups whose levels have flows), and for this root (another than 0: ``ROOTED_FLOWS``)."""
    if root and (callable(algo) or (collective, algo) not in ROOTED_FLOWS):
        return False
    try:
        next(iter(_flows_of(collective, algo, size, count)))
    except (ValueError, StopIteration, KeyError):
        return False
    return True


def _flows_of(collective: str, algo, size: int, count: int):
    if callable(algo):
        return flows_of(algo, size, count)
    if (collective, algo) not in FLOWS:
        raise KeyError((collective, algo))
    return FLOWS[(collective, algo)](size, count)


@without_cyclic_gc()
def simulate_flows(  # params: simulate's, for the flow engine
    collective: str,
    algo,
    topology: Topology,
    count: int,
    *,
    itemsize: int = 4,
    start_clocks: Sequence[float] | None = None,
    cost_model: CostModel | None = None,
    dtype: str | None = None,
    op: str = "sum",
    root: int = 0,
) -> SimResult:
    """:func:`simulate` for thousands of ranks: every rank's step at once, with numpy.

    Uses the algorithm's ``flows`` (``StepFlows``: each rank's sends, receives and local copies
    of one step) and the cost model's formulas in the same floating-point order, so it agrees with
    :func:`simulate` exactly (a test holds it); each distinct pattern of destinations is routed
    once. ``algo`` is a registry name or a hierarchical schedule function on equal groups. Flows
    are written for root 0; another ``root`` (a registry name only) runs them on the topology
    seen from the root (``_Rotated``), as the schedules number ranks from their root.
    """
    size = topology.num_ranks
    dtype = dtype or default_dtype(itemsize)
    degraded = cost_model.degraded if cost_model else {}
    clock = np.zeros(size) if start_clocks is None else np.array(start_clocks, dtype=np.float64)
    start = tuple(clock.tolist())
    if root:
        if callable(algo) or (collective, algo) not in ROOTED_FLOWS or not 0 <= root < size:
            raise ValueError(f"{collective}/{algo}: flows serve root 0 only (or 0 <= root < size)")
        topology = _Rotated(topology, root)
        degraded = {((a - root) % size, (b - root) % size): f for (a, b), f in degraded.items()}
        clock = np.roll(clock, -root)  # rank v of the flows is rank (v + root) % size
    engine = _FlowEngine(topology, size, itemsize, dtype, op, degraded)
    for k, step in enumerate(_flows_of(collective, algo, size, count)):
        clock = engine.step(clock, step, first=(k == 0))  # may update ``clock`` in place
    if root:
        clock = np.roll(clock, root)
    return SimResult(start, tuple(clock.tolist()))


class _Rotated:
    """``topology`` with rank v standing for rank (v + root) % n: what a rooted collective's flows,
    written for root 0, see when another rank is the root (its schedules number ranks from the
    root). Routes, cards and links are the topology's own."""

    def __init__(self, topology: Topology, root: int):
        self._topology, self._root, self.num_ranks = topology, root, topology.num_ranks

    def card(self, rank: int):
        return self._topology.card((rank + self._root) % self.num_ranks)

    def route_ids(self, src, dst):
        return self._topology.route_ids(
            (np.asarray(src) + self._root) % self.num_ranks, (np.asarray(dst) + self._root) % self.num_ranks
        )

    def hop_bandwidths(self):
        return self._topology.hop_bandwidths()


_CACHE_ELEMENTS = 1 << 23  # what one of the engine's caches keeps: array elements per kind (~64 MB of float64)


def _make_room(cache: dict, elements: int) -> None:
    """Empty ``cache`` before it passes 64 entries, or ``_CACHE_ELEMENTS`` with entries of
    ``elements`` array elements each: patterns that never recur (an all-to-all's pipeline steps, 8
    lanes of 65,536 ranks) must not pile up."""
    if len(cache) >= max(1, min(64, _CACHE_ELEMENTS // max(elements, 1))):
        cache.clear()


class _FlowEngine:
    """The clock arithmetic of ``simulate`` / ``cost_model.step_end`` on whole steps as arrays."""

    def __init__(self, topology: Topology, size: int, itemsize: int, dtype: str, op: str, degraded: dict):
        self.topology, self.size, self.itemsize, self.degraded = topology, size, itemsize, degraded
        self.ranks = np.arange(size)
        cards = [topology.card(r) for r in range(size)]
        uniform = all(c is cards[0] for c in cards)

        def per_card(get, dt=np.float64):
            return get(cards[0]) if uniform else np.array([get(c) for c in cards], dtype=dt)

        self.launch = per_card(lambda c: c.launch_overhead_s)
        self.hbm = per_card(lambda c: c.hbm_bandwidth_Bps)
        self.inline = per_card(lambda c: c.reduces_inline(dtype, op), bool)
        self.red_launch = per_card(lambda c: c.reduce_launch_s)
        self.vector = per_card(lambda c: c.vector_bandwidth_Bps)
        self._patterns: dict = {}
        self._rows: dict = {}
        self._steps: dict = {}
        self._by_content: dict = {}
        self._shapes: dict = {}
        self._tables: dict = {}
        self._bases: dict = {}
        self._all_inline = bool(np.all(self.inline))
        self._chains: dict = {}

    def _pattern(self, send_to: np.ndarray, repeat: int):
        """(latency, share, valid) of every flow of a step's destinations (rows: lanes, each
        ``repeat`` flows), routed once per distinct pattern (by identity, then by content)."""
        entry = self._patterns.get((id(send_to), repeat))
        if entry is not None and entry[0] is send_to:
            return entry[1]
        lanes = np.atleast_2d(send_to)
        content = lanes.tobytes() + bytes(str((lanes.shape, repeat)), "ascii")
        value = self._by_content.get(content)
        if value is None:
            value = self._route_lanes(lanes, repeat)
            _make_room(self._by_content, lanes.size)
            self._by_content[content] = value
        _make_room(self._patterns, send_to.size)
        self._patterns[(id(send_to), repeat)] = (send_to, value)
        return value

    def _route_lanes(self, lanes: np.ndarray, repeat: int):
        """Latency and bandwidth share (``cost_model.flow_shares``) of every flow r -> lanes[l, r],
        the links counted over all lanes; each lane's routes cached by content (a mesh's lanes
        recur step after step beside a lane that changes)."""
        valid = lanes >= 0
        if len(lanes) == 1:  # the whole pattern is cached already (``_pattern``)
            hops, route_latency = self.topology.route_ids(self.ranks[valid[0]], lanes[0][valid[0]])
        else:
            rows = [self._routed_row(row) for row in lanes]
            hops = np.zeros((max(h.shape[0] for h, _ in rows), sum(h.shape[1] for h, _ in rows)), dtype=np.int64)
            start = 0
            for row_hops, _ in rows:
                hops[: row_hops.shape[0], start : start + row_hops.shape[1]] = row_hops
                start += row_hops.shape[1]
            route_latency = np.concatenate([row_latency for _, row_latency in rows])
        factors = None
        if self.degraded:
            factors = self._factors(np.broadcast_to(self.ranks, lanes.shape)[valid], lanes[valid])
        shares = flow_shares(self.topology.hop_bandwidths(), hops, factors, repeat)
        if valid.all():  # every lane whole: the flows in lane order are the arrays themselves
            return route_latency.reshape(lanes.shape), shares.reshape(lanes.shape), valid
        latency = np.zeros(lanes.shape)
        share = np.full(lanes.shape, np.inf)
        latency[valid], share[valid] = route_latency, shares
        return latency, share, valid

    def _routed_row(self, row: np.ndarray):
        """``Topology.route_ids`` of the flows r -> row[r] (row[r] >= 0), least recently used out."""
        key = row.tobytes()
        entry = self._rows.pop(key, None)
        if entry is None:
            ok = row >= 0
            entry = self.topology.route_ids(self.ranks[ok], row[ok])
            if len(self._rows) >= 16:
                del self._rows[next(iter(self._rows))]
        self._rows[key] = entry
        return entry

    def _factors(self, srcs: np.ndarray, dsts: np.ndarray) -> np.ndarray:
        """The degraded routes' factors (1 elsewhere) of the flows srcs[f] -> dsts[f]."""
        factors = np.ones(len(srcs))
        for (a, b), factor in self.degraded.items():
            factors[(srcs == a) & (dsts == b)] = factor
        return factors

    def _chain(self, send_to: np.ndarray):
        """(latency, share, valid, shift) of a one-lane pattern whose every flow goes ``shift``
        ranks on (r -> r + shift) and shares no link with another, so that any part of it costs
        what it costs in the whole; None otherwise. Cached by identity."""
        entry = self._chains.get(id(send_to))
        if entry is not None and entry[0] is send_to:
            return entry[1]
        value = None
        valid = send_to >= 0
        if send_to.ndim == 1 and valid.any():
            shifts = np.unique(send_to[valid] - self.ranks[valid])
            hops, _ = self.topology.route_ids(self.ranks[valid], send_to[valid])
            links = hops[hops > 0]
            if len(shifts) == 1 and len(np.unique(links)) == len(links):
                latency, share, _ = self._pattern(send_to, 1)
                value = (latency[0], share[0], valid, int(shifts[0]))
        _make_room(self._chains, send_to.size)
        self._chains[id(send_to)] = (send_to, value)
        return value

    def _senders_step(self, clock: np.ndarray, step: StepFlows, first: bool) -> np.ndarray:
        """A step of ``StepFlows.senders``: ``step_end`` on the active ranks only (receive, then
        reduce, then the send's end), in place; a pattern that is not an exclusive shift falls
        back to whole arrays."""
        chain = self._chain(step.send_to) if step.repeat == 1 else None
        src = slice(*step.senders.indices(self.size))
        if chain is None or not chain[2][src].all():
            senders = self.ranks[src]
            senders = senders[step.send_to[senders] >= 0]
            to = np.full(self.size, -1)
            to[senders] = step.send_to[senders]
            frm = np.full(self.size, -1)
            frm[to[senders]] = senders
            plain = StepFlows(to, step.send_count, frm, step.reduce, copies=step.copies, repeat=step.repeat)
            return self.step(clock, plain, first=first)
        latency, share, _, shift = chain
        if first or step.copies:
            clock = clock + self._copy_s(step.copies, first)
        dst = slice(src.start + shift, src.stop + shift, src.step)
        moved = step.send_count[src]
        arrival = clock[src] + (latency[src] + (moved * self.itemsize) / share[src])
        received = np.maximum(clock[dst], arrival)
        if step.reduce and not self._all_inline:
            received = received + self._reduce_s(moved * self.itemsize, dst)
        clock[dst] = received
        clock[src] = np.maximum(clock[src], arrival)
        return clock

    def _prepared(self, step: StepFlows):
        """Everything about a step that does not depend on the clocks, cached by the identity of
        its arrays (algorithms hand the same arrays to every step of the same shape): the
        pattern's routes and receive structure once per pattern, the transfer times once per
        pattern and counts."""
        key = (id(step.send_to), id(step.send_count), id(step.recv_from), id(step.recv_lane), step.reduce, step.repeat)
        entry = self._steps.get(key)
        arrays = (step.send_to, step.send_count, step.recv_from, step.recv_lane)
        if entry is not None and all(a is b for a, b in zip(entry[0], arrays)):
            return entry[1]
        latency, share, valid, recv_shape = self._shape(step)
        counts = np.atleast_2d(step.send_count)
        fast = self._two_valued(step, counts, latency, share, valid, recv_shape)
        if fast is not None:
            return fast
        send_s = latency + (counts * self.itemsize) / share
        sends = [(row, ok_all, ok) for row, ok_all, ok in zip(send_s, valid.all(axis=1), valid)]
        recvs = []
        for lane, s_idx, every, has, shift, reduce in recv_shape:
            if shift > 0 and lane.ndim == 0:  # a ring: take the sender's row shifted, no gather
                offset = np.empty(self.size)
                row = send_s[int(lane)]
                offset[shift:], offset[:shift] = row[:-shift], row[-shift:]
                moved = counts[int(lane)]
                n = np.empty_like(moved)
                n[shift:], n[:shift] = moved[:-shift], moved[-shift:]
            else:
                lanes = np.broadcast_to(lane, s_idx.shape)
                offset, n = send_s[lanes, s_idx], counts[lanes, s_idx]
            red = self._reduce_s(n * self.itemsize) if reduce else None
            recvs.append((s_idx, every, has, offset, red, shift))
        prepared = (recvs, sends)
        _make_room(self._steps, step.send_to.size)
        self._steps[key] = (arrays, prepared)
        return prepared

    def _two_valued(self, step: StepFlows, counts, latency, share, valid, recv_shape):
        """A ring step whose counts take two adjacent values (chunks that differ by one element,
        rotating every step): per-value transfer times computed once per pattern, selected per
        step. None where it does not apply."""
        if counts.shape[0] != 1 or len(recv_shape) != 1 or not valid.all() or step.repeat != 1:
            return None
        lane, s_idx, every, has, shift, reduce = recv_shape[0]
        if shift <= 0 or lane.ndim != 0 or int(lane) != 0:
            return None
        row = counts[0]
        window = self._window(row)
        if window is not None:
            lo, hi, big2, start = window
        else:
            lo, hi = int(row.min()), int(row.max())
        if hi - lo > 1:
            return None
        key = (id(step.send_to), id(step.recv_from), lo, hi, reduce, shift)
        entry = self._tables.get(key)
        if entry is None or entry[0] is not step.send_to or entry[1] is not step.recv_from:
            table = [latency[0] + (n * self.itemsize) / share[0] for n in dict.fromkeys((lo, hi))]
            rolled = [np.concatenate([t[-shift:], t[:-shift]]) for t in table]
            reds = [
                self._reduce_s(np.full(self.size, n * self.itemsize)) if reduce and not self._all_inline else None
                for n in dict.fromkeys((lo, hi))
            ]
            entry = (step.send_to, step.recv_from, table, rolled, reds)
            _make_room(self._tables, 4 * self.size)
            self._tables[key] = entry
        if lo == hi:  # one count on every rank: one table, nothing to select
            return [(s_idx, True, has, entry[3][0], entry[4][0], shift)], [(entry[2][0], True, valid[0])]
        (send_lo, send_hi), (off_lo, off_hi), (red_lo, red_hi) = entry[2], entry[3], entry[4]
        size = self.size
        if window is not None:  # the rotating chunk sizes are windows of one doubled array: no pass to find them
            big = big2[start : start + size]
            back = (start - shift) % size
            moved = big2[back : back + size]
        else:
            big = row == hi
            moved = np.empty_like(big)
            moved[shift:], moved[:shift] = big[:-shift], big[-shift:]
        send_row = np.where(big, send_hi, send_lo)
        offset = np.where(moved, off_hi, off_lo)
        red = None if red_lo is None else np.where(moved, red_hi, red_lo)
        return [(s_idx, True, has, offset, red, shift)], [(send_row, True, valid[0])]

    def _window(self, row: np.ndarray):
        """(lo, hi, base == hi, start) when ``row`` is a window of a doubled array of two adjacent
        values (ring flows hand rotating chunk sizes so), computed once per base; else None."""
        base = row.base
        if base is None or base.ndim != 1 or base.shape[0] != 2 * self.size or row.strides != base.strides:
            return None
        entry = self._bases.get(id(base))
        if entry is None or entry[0] is not base:
            lo, hi = int(base.min()), int(base.max())
            entry = (base, lo, hi, base == hi)
            if len(self._bases) > 16:
                self._bases.clear()
            self._bases[id(base)] = entry
        start = (row.__array_interface__["data"][0] - base.__array_interface__["data"][0]) // row.itemsize
        return entry[1], entry[2], entry[3], start

    def _shape(self, step: StepFlows):
        """The pattern's routes (``_pattern``) and, per receive lane, (sender's lane, sender,
        everyone receives, who receives, ring shift or -1, reduced), cached by identity."""
        key = (id(step.send_to), id(step.recv_from), id(step.recv_lane), step.reduce, step.repeat)
        arrays = (step.send_to, step.recv_from, step.recv_lane)
        entry = self._shapes.get(key)
        if entry is not None and all(a is b for a, b in zip(entry[0], arrays)):
            return entry[1]
        latency, share, valid = self._pattern(step.send_to, step.repeat)
        recv_from = np.atleast_2d(step.recv_from)
        reduce = step.reduce if isinstance(step.reduce, tuple) else (step.reduce,) * recv_from.shape[0]
        recv_shape = []
        for m, src in enumerate(recv_from):
            lane = np.asarray(m) if step.recv_lane is None else np.atleast_2d(step.recv_lane)[m]
            has = src >= 0
            every = bool(has.all())
            s_idx = src if every else np.where(has, src, 0)
            shift = int((self.ranks[0] - s_idx[0]) % self.size) if every else -1
            if shift <= 0 or not np.array_equal(s_idx, (self.ranks - shift) % self.size):
                shift = -1
            recv_shape.append((lane, s_idx, every, has, shift, reduce[m]))
        value = (latency, share, valid, recv_shape)
        _make_room(self._shapes, step.send_to.size)
        self._shapes[key] = (arrays, value)
        return value

    def _reduce_s(self, nbytes: np.ndarray, ranks: slice = slice(None)):
        """``cost_model.reduce_s`` per rank (None when every card reduces this dtype and op inline);
        ``ranks``: of those ranks only, ``nbytes`` being theirs."""
        if self._all_inline:
            return None

        def of(per_card):
            return per_card if np.ndim(per_card) == 0 else per_card[ranks]

        cost = of(self.red_launch) + nbytes / of(self.vector)
        return np.where(of(self.inline), 0.0, cost)

    def _copy_s(self, copies, first: bool):
        """``cost_model.step_copy_s`` for every rank: the launch on the first step, then each plain
        copy's ``2n / HBM`` in order (one number when every rank copies alike on equal cards)."""
        if (
            all(isinstance(n, (int, np.integer)) for n in copies)
            and np.ndim(self.hbm) == 0
            and np.ndim(self.launch) == 0
        ):
            copy_s = float(self.launch) if first else 0.0
            for n in copies:
                copy_s += 2 * (int(n) * self.itemsize) / self.hbm
            return copy_s
        copy_s = np.full(self.size, self.launch) if first else np.zeros(self.size)
        for n in copies:
            copy_s = copy_s + (2 * (n * self.itemsize)) / self.hbm
        return copy_s

    def step(self, clock: np.ndarray, step: StepFlows, *, first: bool) -> np.ndarray:
        """The clocks after one step (``step_end`` per rank: receives in order, then sends)."""
        if step.senders is not None:
            return self._senders_step(clock, step, first)
        if first or step.copies:
            t0 = clock + self._copy_s(step.copies, first)
        else:
            t0 = clock
        recvs, sends = self._prepared(step)
        t = t0
        for s_idx, every, has, offset, red, shift in recvs:
            if shift > 0:  # a ring: the sender is `shift` ranks back
                source = np.empty_like(t0)
                source[shift:] = t0[:-shift]
                source[:shift] = t0[-shift:]
            else:
                source = t0[s_idx]
            arrival = source + offset
            t_new = np.maximum(t, arrival)
            if red is not None:  # a lane's repeated messages arrive together and reduce one by one
                for _ in range(step.repeat):
                    t_new = t_new + red
            t = t_new if every else np.where(has, t_new, t)
        for row, all_ok, ok in sends:
            done = t0 + row
            t = np.maximum(t, done) if all_ok else np.where(ok, np.maximum(t, done), t)
        return t


def simulate_batch(
    topology: Topology,
    sends: Sequence[tuple[int, int, int]],
    *,
    start_clocks: Sequence[float] | None = None,
    cost_model: CostModel | None = None,
) -> SimResult:
    """Modeled clocks of one ``batch_send_recv`` on every rank: ``sends`` are ``(src, dst, nbytes)``
    in world ranks, each the sender's send item and the receiver's receive item. Each item is
    a lone send or receive on its own stream from the rank's start clock (as the emulator's
    batch); a rank ends with its last item, and a rank with none keeps its start clock::

        ring = [(r, (r + 1) % n, 1 << 20) for r in range(n)]
        simulate_batch(topo, ring).time_s
    """
    model = cost_model or CostModel(topology)
    clocks = [0.0] * topology.num_ranks if start_clocks is None else [float(c) for c in start_clocks]
    start = tuple(clocks)
    for src, dst, nbytes in sends:
        (send,) = model.p2p_costs(src, dst, nbytes, sender=True)
        (recv,) = model.p2p_costs(src, dst, nbytes, sender=False)
        t_send = start[src] + send.copy_s
        sender_end = step_end(t_send, send.send_s, (), ())[0]
        arrival = Arrival(t_send, t_send + send.send_s[0])
        receiver_end = step_end(start[dst] + recv.copy_s, (), (arrival,), recv.recv_s)[0]
        clocks[src] = max(clocks[src], sender_end)
        clocks[dst] = max(clocks[dst], receiver_end)
    return SimResult(start, tuple(clocks))


def simulate_p2p(
    topology: Topology, src: int, dst: int, nbytes: int, *, cost_model: CostModel | None = None
) -> SimResult:
    """Modeled clocks of one send of ``nbytes`` from world rank ``src`` to ``dst`` and its receive,
    both posted at clock 0 (the emulator's send/recv costs, ``CostModel.p2p_costs``)."""
    return simulate_batch(topology, [(src, dst, nbytes)], cost_model=cost_model)
