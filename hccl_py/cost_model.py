"""The cost model: the single home of every modeled-time formula (as NCCL's ``tuning.cc``).

A message of ``n`` bytes over a route takes ``latency(route) + n / share``, where ``share`` is the
smallest, over the route's directed links, of the link's bandwidth divided by the number of
flows of the *same step* crossing that link in that direction (links are full duplex). Every
rank can compute the whole step from the schedule, so the share never depends on OS scheduling.
A reduction costs ``n / vector bandwidth`` of the receiving card (a local one, too); a local copy
reads and writes, ``2n / HBM bandwidth``.

Step k of a collective is the k-th step of every rank's schedule. The clock arithmetic of one
step lives in :func:`step_end`, used verbatim by the executor and by the simulator, so the two
agree to the last bit.
"""

from __future__ import annotations

from collections import Counter
from dataclasses import dataclass
from typing import Callable, NamedTuple, Sequence

from topology import CardModel, Topology

from .algorithms.schedule import Schedule


@dataclass(frozen=True, slots=True)
class StepCost:
    """Modeled seconds of one rank's step: local copies, each send's transfer, each receive's
    reduction (0 for a plain copy-in: the data lands by DMA)."""

    copy_s: float
    send_s: tuple[float, ...]
    recv_s: tuple[float, ...]


class Arrival(NamedTuple):
    """A received message's modeled stamps: when its sender posted it and when it arrives."""

    sent_at: float
    arrival: float


def step_end(t0: float, send_s: Sequence[float], arrivals: Sequence, recv_s: Sequence[float],
             waits: list | None = None) -> tuple[float, float]:
    """(clock at the end, seconds spent waiting) of a step that started, copies done, at ``t0``.

    ``arrivals`` holds one object with ``sent_at`` and ``arrival`` per receive, in schedule
    order: wait for the data, then reduce it. The step is over when its last receive is applied
    and its last send has left. *Waiting* is the part of a wait before the sender even sent (a
    slow or busy peer), as opposed to moving data; ``waits``, if given, gets each receive's share.
    """
    t = t0
    waited = 0.0
    for recv, cost in zip(arrivals, recv_s):
        arrival = recv.arrival
        wait = 0.0
        if arrival > t:
            if recv.sent_at > t:
                wait = (arrival if arrival < recv.sent_at else recv.sent_at) - t
                waited += wait
            t = arrival
        if waits is not None:
            waits.append(wait)
        t += cost
    for send in send_s:
        if t0 + send > t:
            t = t0 + send
    return t, waited


def flow_load(routes) -> Counter:
    """Flows per directed link when every route in ``routes`` carries one flow at once."""
    load: Counter = Counter()
    for route in routes:
        load.update(route.hops)
    return load


def route_share(topology: Topology, route, load, factor: float = 1.0) -> float:
    """Bytes/s one flow on ``route`` gets while ``load`` counts the flows on each directed link:
    its slowest link's bandwidth split evenly among that link's flows; ``factor`` < 1 is a
    degraded route (fault injection). The one link-share formula."""
    share = min(topology.link(u, v).bandwidth_Bps / load[(u, v)] for u, v in route.hops)
    return share * factor if factor != 1.0 else share


def transfer_s(topology: Topology, src: int, dst: int, nbytes: int, load: Counter, factor: float = 1.0) -> float:
    """Seconds for ``nbytes`` from world rank ``src`` to ``dst`` when ``load`` counts the flows of
    the same step on each directed link; ``factor`` < 1 is a degraded route (fault injection)."""
    route = topology.route(src, dst)
    if nbytes == 0:
        return route.latency_s
    return route.latency_s + nbytes / route_share(topology, route, load, factor)


def kernel_s(card: CardModel, flops: float, nbytes: float, slow_factor: float = 1.0) -> float:
    """One device kernel: the roofline max(flops / peak, bytes / HBM bandwidth) plus the launch
    overhead, times ``slow_factor`` (a straggler card, fault injection)."""
    return slow_factor * (max(flops / card.peak_fp16_flops, nbytes / card.hbm_bandwidth_Bps) + card.launch_overhead_s)


class CostModel:
    """Modeled costs of schedules on one topology, cached per call shape."""

    def __init__(self, topology: Topology, degraded: dict[tuple[int, int], float] | None = None):
        self.topology = topology
        # (rank a, rank b) -> share of bandwidth the route between them keeps, both directions
        self.degraded = {**(degraded or {}), **{(b, a): f for (a, b), f in (degraded or {}).items()}}
        self._cache: dict[tuple, tuple[tuple[StepCost, ...], ...]] = {}

    def call_costs(self, fn: Callable[..., Schedule], size: int, count: int, root: int, itemsize: int,
                   world_ranks: tuple[int, ...]) -> tuple[tuple[StepCost, ...], ...]:
        """Every comm rank's ``StepCost`` per step for one call of schedule function ``fn``."""
        key = (fn, size, count, root, itemsize, world_ranks)
        costs = self._cache.get(key)
        if costs is None:
            schedules = [fn(r, size, count, root) for r in range(size)]
            costs = self._cache[key] = self._costs(schedules, itemsize, world_ranks)
        return costs

    def _costs(self, schedules: list[Schedule], itemsize: int, world_ranks: tuple[int, ...]) -> tuple[tuple[StepCost, ...], ...]:
        topo = self.topology
        cards = [topo.card(w) for w in world_ranks]
        nsteps = max((len(s.steps) for s in schedules), default=0)
        per_rank: list[list[StepCost]] = [[] for _ in schedules]
        for k in range(nsteps):
            load: Counter = Counter()
            flows = []
            for r, schedule in enumerate(schedules):
                if k < len(schedule.steps):
                    for send in schedule.steps[k].sends:
                        src, dst = world_ranks[r], world_ranks[send.peer]
                        flows.append((r, src, dst, send.src.count * itemsize))
                        load.update(topo.route(src, dst).hops)
            send_times: dict[int, list[float]] = {}
            for r, src, dst, nbytes in flows:
                send_times.setdefault(r, []).append(transfer_s(topo, src, dst, nbytes, load, self.degraded.get((src, dst), 1.0)))
            for r, schedule in enumerate(schedules):
                if k >= len(schedule.steps):
                    continue
                step = schedule.steps[k]
                card = cards[r]
                copy_s = sum(2 * c.src.count * itemsize / card.hbm_bandwidth_Bps if c.reduce_with is None
                             else c.src.count * itemsize / card.vector_bandwidth_Bps for c in step.copies)
                recv_s = tuple(0.0 if rv.reduce_with is None else rv.dst.count * itemsize / card.vector_bandwidth_Bps for rv in step.recvs)
                per_rank[r].append(StepCost(copy_s, tuple(send_times.get(r, ())), recv_s))
        return tuple(tuple(steps) for steps in per_rank)

    def p2p_costs(self, src: int, dst: int, nbytes: int, *, sender: bool) -> tuple[StepCost]:
        """The one step of a send (``sender``) or of its matching receive: a lone flow."""
        if sender:
            key = ("send", src, dst, nbytes)
            cost = self._cache.get(key)
            if cost is None:
                route = self.topology.route(src, dst)
                factor = self.degraded.get((src, dst), 1.0)
                cost = self._cache[key] = (StepCost(0.0, (transfer_s(self.topology, src, dst, nbytes, Counter(route.hops), factor),), ()),)
            return cost
        return _RECV_COST


_RECV_COST = (StepCost(0.0, (), (0.0,)),)
