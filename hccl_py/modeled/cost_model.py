"""The cost model: the single home of every modeled-time formula (as NCCL's ``tuning.cc``).

A message of ``n`` bytes over a route takes ``fixed(route) + n / share`` (:func:`transfer_s`),
where ``share`` is the smallest, over the route's directed links, of the link's bandwidth divided
by the number of flows of the *same step* crossing that link in that direction (links are full
duplex). The fixed cost of a point-to-point transfer (a send, a batch's item) is the route's
latency, one DMA or RDMA task and its notify handshakes (``topology/figures.py``); a transfer
inside a collective step pays the route's step latency, that plus what each step of HCCL's
collective algorithms waits on besides (``LinkSpec.step_sync_s``: between 910B servers the
notify records and stream synchronisation around every step). Every rank can compute the whole
step from the schedule, so the share never depends on OS scheduling.

A received buffer is reduced *inline* by the transfer engine when the card supports the dtype and
op (HCCL's SDMA reduce: no extra time), else by a vector kernel, ``reduce_launch + n / vector
bandwidth`` (:func:`reduce_s`); a local copy reads and writes, ``2n / HBM bandwidth``. Every
collective call (and every send or receive) first pays the card's op launch,
``launch_overhead_s``, charged with the first step's local work (``StepCost.copy_s``).

Device compute (:func:`kernel_s`) is a roofline: ``launch + max(flops / (peak[dtype] x matmul
efficiency), bytes / HBM bandwidth)``; matmul FLOPs count the cube's 16x16x16 tiles
(:func:`cube_flops`), so shapes that do not fill a tile pay for the whole tile.

A copy between host memory and a card (:func:`host_copy_s`) crosses the card's host route
(``Topology.host_route``: its PCIe link), ``latency + n / bandwidth``. A memory pool that grows
(the npu device's) first synchronises the card (the compute stream waits for the asynchronous
calls issued so far), then pays ``CardModel.segment_alloc_s`` for the segment.

Step k of a collective is the k-th step of every rank's schedule. The clock arithmetic of one
step lives in :func:`step_end`, used verbatim by the executor and by the simulator, so the two
agree to the last bit.
"""

from __future__ import annotations

from collections import Counter
from dataclasses import dataclass
from typing import Callable, NamedTuple, Sequence

import numpy as np

from topology import CardModel, Route, Topology

from ..algorithms.schedule import Schedule
from ..collectives import CallSpec


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


def step_end(
    t0: float, send_s: Sequence[float], arrivals: Sequence, recv_s: Sequence[float], waits: list | None = None
) -> tuple[float, float]:
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


def flow_shares(
    bandwidth: np.ndarray, hops: np.ndarray, factors: np.ndarray | None = None, repeat: int = 1
) -> np.ndarray:
    """:func:`route_share` of every flow f, whose route's links are ``hops[:, f]`` (ids into
    ``bandwidth``, 0 padding: ``Topology.route_ids``), when all of them carry ``repeat`` flows at
    once, as an array (the cluster-scale simulator's form: links counted with bincount, each share
    the minimum over the route's links of bandwidth / flows, times ``factors`` where not 1)."""
    flows = hops.shape[1]
    if hops.shape[0] == 0:
        return np.full(flows, np.inf)
    load = np.bincount(hops.ravel()) * repeat  # up to the highest link taken, not every link numbered
    with np.errstate(divide="ignore"):  # links no flow takes: never looked up
        per_flow = bandwidth[: len(load)] / load
    shares = per_flow[hops[0]]
    for row in hops[1:]:
        np.minimum(shares, per_flow[row], out=shares)
    if factors is not None:
        shares = np.where(factors != 1.0, shares * factors, shares)
    return shares


def transfer_s(
    topology: Topology, src: int, dst: int, nbytes: int, load: Counter, factor: float = 1.0, *, collective: bool
) -> float:
    """Seconds for ``nbytes`` from world rank ``src`` to ``dst`` when ``load`` counts the flows of
    the same step on each directed link; ``factor`` < 1 is a degraded route (fault injection).
    ``collective``: a transfer of a collective step, whose fixed cost is the route's
    ``step_latency_s``; else a point-to-point transfer, the route's ``latency_s``."""
    route = topology.route(src, dst)
    fixed = route.step_latency_s if collective else route.latency_s
    if nbytes == 0:
        return fixed
    return fixed + nbytes / route_share(topology, route, load, factor)


def kernel_s(card: CardModel, flops: float, nbytes: float, slow_factor: float = 1.0, dtype: str | None = None) -> float:
    """One device kernel: the roofline max(flops / (peak of ``dtype`` x the card's matmul
    efficiency), bytes / HBM bandwidth) plus the launch overhead, times ``slow_factor`` (a
    straggler card, fault injection). ``dtype`` is a numpy type name; ``None`` is FP16."""
    rate = card.peak_flops(dtype) * card.matmul_efficiency
    return slow_factor * (max(flops / rate, nbytes / card.hbm_bandwidth_Bps) + card.launch_overhead_s)


def host_copy_s(route: Route, nbytes: int) -> float:
    """Seconds of one copy of ``nbytes`` between host memory and a card over ``route`` (the card's
    ``Topology.host_route``): its latency plus the bytes at its bandwidth, either direction."""
    return route.latency_s + nbytes / route.bandwidth_Bps


CUBE_TILE = 16  # the DaVinci cube multiplies 16x16x16 blocks (the practitioner report; Hot Chips 31)


def cube_flops(m: int, n: int, k: int, batch: int = 1) -> float:
    """FLOPs a (batched) ``m x k`` by ``k x n`` matmul costs on the cube: ``2 m n k`` with each
    dimension rounded up to a whole tile, so a 1-row matmul costs what a 16-row one does."""

    def tiles(d: int) -> int:
        return -(-max(int(d), 1) // CUBE_TILE) * CUBE_TILE

    return 2.0 * batch * tiles(m) * tiles(n) * tiles(k)


def reduce_s(card: CardModel, nbytes: int, dtype: str, op: str) -> float:
    """Seconds a card spends reducing ``nbytes`` it received: none when the transfer engine
    reduces inline (``CardModel.reduces_inline``), else a vector kernel."""
    if card.reduces_inline(dtype, op):
        return 0.0
    return card.reduce_launch_s + nbytes / card.vector_bandwidth_Bps


def local_reduce_s(card: CardModel, nbytes: int, dtype: str, op: str) -> float:
    """Seconds of a local reduction (``Copy`` with ``reduce_with``): a DMA with inline reduce where
    the card has one (read and write, as a copy), else a vector kernel."""
    if card.reduces_inline(dtype, op):
        return 2 * nbytes / card.hbm_bandwidth_Bps
    return card.reduce_launch_s + nbytes / card.vector_bandwidth_Bps


class CostModel:
    """Modeled costs of schedules on one topology, cached per call shape."""

    def __init__(self, topology: Topology, degraded: dict[tuple[int, int], float] | None = None):
        self.topology = topology
        # (rank a, rank b) -> share of bandwidth the route between them keeps, both directions
        # unless the other direction is given its own
        self.degraded = {**{(b, a): f for (a, b), f in (degraded or {}).items()}, **(degraded or {})}
        self._cache: dict[tuple, tuple[tuple[StepCost, ...], ...]] = {}

    def call_costs(
        self,
        fn: Callable[..., Schedule],
        spec: CallSpec,
        world_ranks: tuple[int, ...],
        *,
        schedules: list[Schedule] | None = None,
    ) -> tuple[tuple[StepCost, ...], ...]:
        """Every comm rank's ``StepCost`` per step for the call ``spec`` run by schedule function
        ``fn`` on ``world_ranks`` (its elements of ``spec.dtype``, reduced by ``spec.op``).
        ``schedules``: every rank's schedule of that call, when the caller has built them already
        (the simulator: built once, not twice)."""
        size, dtype, op = len(world_ranks), spec.dtype_name, spec.op_name
        key = (fn, size, spec.count, spec.root, spec.itemsize, world_ranks, dtype, op)
        costs = self._cache.get(key)
        if costs is None:
            if schedules is None:
                schedules = [fn(r, size, spec.count, spec.root) for r in range(size)]
            costs = self._cache[key] = self._costs(schedules, spec.itemsize, world_ranks, dtype, op)
        return costs

    def _costs(
        self,
        schedules: list[Schedule],
        itemsize: int,
        world_ranks: tuple[int, ...],
        dtype: str = "float32",
        op: str = "sum",
    ) -> tuple[tuple[StepCost, ...], ...]:
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
                send_times.setdefault(r, []).append(
                    transfer_s(topo, src, dst, nbytes, load, self.degraded.get((src, dst), 1.0), collective=True)
                )
            for r, schedule in enumerate(schedules):
                if k >= len(schedule.steps):
                    continue
                step = schedule.steps[k]
                card = cards[r]
                copy_s = step_copy_s(card, step, itemsize, dtype, op, first=(k == 0))
                recv_s = tuple(
                    0.0 if rv.reduce_with is None else reduce_s(card, rv.dst.count * itemsize, dtype, op)
                    for rv in step.recvs
                )
                per_rank[r].append(StepCost(copy_s, tuple(send_times.get(r, ())), recv_s))
        return tuple(tuple(steps) for steps in per_rank)

    def p2p_costs(self, src: int, dst: int, nbytes: int, *, sender: bool) -> tuple[StepCost]:
        """The one step of a send (``sender``) or of its matching receive: a lone point-to-point
        flow (the route's ``latency_s``, no collective step's synchronisation); each side pays its
        card's op launch first."""
        key = ("send" if sender else "recv", src, dst, nbytes)
        cost = self._cache.get(key)
        if cost is None:
            if sender:
                route = self.topology.route(src, dst)
                factor = self.degraded.get((src, dst), 1.0)
                send = transfer_s(self.topology, src, dst, nbytes, Counter(route.hops), factor, collective=False)
                cost = (StepCost(self.topology.card(src).launch_overhead_s, (send,), ()),)
            else:
                cost = (StepCost(self.topology.card(dst).launch_overhead_s, (), (0.0,)),)
            self._cache[key] = cost
        return cost


def step_copy_s(card: CardModel, step, itemsize: int, dtype: str, op: str, *, first: bool) -> float:
    """Seconds of a step's local work before its transfers: the op launch on a call's first step,
    then each local copy (``2n / HBM``) or local reduction (``local_reduce_s``), in order."""
    copy_s = card.launch_overhead_s if first else 0.0
    for c in step.copies:
        nbytes = c.src.count * itemsize
        copy_s += (
            2 * nbytes / card.hbm_bandwidth_Bps if c.reduce_with is None else local_reduce_s(card, nbytes, dtype, op)
        )
    return copy_s
