"""Evaluate schedules on a topology without processes or data: modeled time at cluster scale.

The simulator walks every rank's schedule with the executor's clock rules — a message leaves at
its sender's step start plus its transfer time, a receive waits for it and then reduces, and
:func:`cost_model.step_end` closes each step — so for any world the emulator can run, the
simulated clocks equal the emulator's to the last bit::

    result = simulate("allreduce", "ring", Topology.preset("2x8p-roce"), count=64 << 20, itemsize=1)
    print(result.time_s)
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Sequence

import numpy as np

from topology import Topology

from ..algorithms.registry import FLOWS, get_schedule
from ..algorithms.schedule import message_numbers
from ..cost_model import Arrival, CostModel, flow_load, route_share, step_end


@dataclass(frozen=True)
class SimResult:
    """End clock of every rank; ``time_s`` is the collective's modeled duration."""

    start_clocks: tuple[float, ...]
    end_clocks: tuple[float, ...]

    @property
    def time_s(self) -> float:
        return max(self.end_clocks) - min(self.start_clocks)


class ScheduleDeadlock(RuntimeError):
    """The schedules cannot complete: some receive has no send that can ever be posted."""


def simulate(collective: str, algo: str, topology: Topology, count: int, *, itemsize: int = 4, root: int = 0,
             world_ranks: Sequence[int] | None = None, start_clocks: Sequence[float] | None = None,
             cost_model: CostModel | None = None) -> SimResult:
    """Modeled clocks of one call of ``collective`` with ``algo`` on the ranks ``world_ranks``
    (default: every rank of ``topology``), each starting at ``start_clocks`` (default 0)."""
    ranks = tuple(range(topology.num_ranks) if world_ranks is None else world_ranks)
    size = len(ranks)
    model = cost_model or CostModel(topology)
    fn = get_schedule(collective, algo)
    costs = model.call_costs(fn, size, count, root, itemsize, ranks)
    schedules = [fn(r, size, count, root) for r in range(size)]
    clocks = [0.0] * size if start_clocks is None else [float(c) for c in start_clocks]
    start = tuple(clocks)
    # Message k from a to b (``message_numbers``) has stamps[(a, b)][k]; each rank walks its steps in order.
    numbers = [message_numbers(s) for s in schedules]
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
            raise ScheduleDeadlock(f"{collective}/{algo} on {size} ranks: ranks {sorted(pending)} cannot finish")
    return SimResult(start, tuple(clocks))


def can_simulate_flows(collective: str, algo: str, size: int, count: int) -> bool:
    """Whether :func:`simulate_flows` applies: the algorithm lists its steps for all ranks at
    once and this call has no empty step."""
    if (collective, algo) not in FLOWS:
        return False
    try:
        next(iter(FLOWS[(collective, algo)](size, count)))
    except (ValueError, StopIteration):
        return False
    return True


def simulate_flows(collective: str, algo: str, topology: Topology, count: int, *, itemsize: int = 4,
                   start_clocks: Sequence[float] | None = None, cost_model: CostModel | None = None) -> SimResult:
    """:func:`simulate` for thousands of ranks: every rank's step at once, with numpy.

    Uses the algorithm's ``flows`` (one send and one receive per rank per step) and the cost
    model's formulas in the same floating-point order, so it agrees with :func:`simulate`
    exactly (a test holds it); each distinct pattern of destinations is routed once.
    """
    size = topology.num_ranks
    ranks = np.arange(size)
    vector_Bps = np.array([topology.card(r).vector_bandwidth_Bps for r in range(size)])
    clock = np.zeros(size) if start_clocks is None else np.array(start_clocks, dtype=np.float64)
    start = tuple(clock.tolist())
    patterns: dict[bytes, tuple[np.ndarray, np.ndarray]] = {}
    for flows in FLOWS[(collective, algo)](size, count):
        key = flows.send_to.tobytes()
        if key not in patterns:
            patterns[key] = _route_pattern(topology, ranks, flows.send_to, cost_model.degraded if cost_model else {})
        latency_s, share_Bps = patterns[key]
        send_s = latency_s + (flows.send_count * itemsize) / share_Bps
        arrival = (clock + send_s)[flows.recv_from]
        t = np.maximum(clock, arrival)
        if flows.reduce:
            t = t + (flows.send_count[flows.recv_from] * itemsize) / vector_Bps
        clock = np.maximum(t, clock + send_s)
    return SimResult(start, tuple(clock.tolist()))


def _route_pattern(topology: Topology, ranks: np.ndarray, send_to: np.ndarray, degraded: dict) -> tuple[np.ndarray, np.ndarray]:
    """Latency and bandwidth share of every flow r -> send_to[r] of one step (cost_model rules)."""
    pairs = [(int(src), int(dst)) for src, dst in zip(ranks, send_to)]
    routes = [topology.route(src, dst) for src, dst in pairs]
    load = flow_load(routes)
    latency = np.array([route.latency_s for route in routes])
    shares = [route_share(topology, route, load, degraded.get(pair, 1.0)) for pair, route in zip(pairs, routes)]
    return latency, np.array(shares)

