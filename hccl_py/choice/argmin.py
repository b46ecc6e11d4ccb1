"""The model's choice: the algorithm with the least modeled time for a call (an argmin over the
cost model, as NCCL's tuning picks), where no HCCL rule covers the call."""

from __future__ import annotations

import math
import weakref

from ..algorithms.registry import ALL_ALGOS, algos_for
from ..modeled.simulator import simulate
from .names import schedule_fn

# ----------------------------------------------------------------------------- the argmin of the model

# fastest()'s decisions per cost model (one per rank and topology), per call shape
_choices: "weakref.WeakKeyDictionary" = weakref.WeakKeyDictionary()


def fastest(
    cost_model,
    collective: str,
    count: int,
    itemsize: int,
    world_ranks: tuple[int, ...],
    root: int = 0,
    candidates: "tuple[str, ...] | None" = None,
) -> str:
    """The algorithm with the least modeled time for this call on this topology (an argmin over
    the cost model, as NCCL's tuning picks); ties go to the earlier in ALL_ALGOS.

    Candidates (default: every flat algorithm of ``collective``) are simulated in order of a
    cheap lower bound on their time (:func:`lower_bound_s`); one whose bound exceeds the best time
    found cannot win and is not simulated, so the answer is the full evaluation's."""
    key = (collective, count, itemsize, world_ranks, root, candidates)
    cache = _choices.get(cost_model)
    if cache is None:
        cache = _choices[cost_model] = {}
    best = cache.get(key)
    if best is None:
        algos = candidates or algos_for(collective)
        order = {algo: i for i, algo in enumerate(ALL_ALGOS)}
        bounds = {
            algo: lower_bound_s(cost_model.topology, collective, algo, count, itemsize, world_ranks, root)
            for algo in algos
        }
        best_time = math.inf
        for algo in sorted(algos, key=lambda a: (bounds[a], order.get(a.partition(":")[0], 99))):
            if bounds[algo] > best_time:
                break
            time_s = simulate(
                collective,
                schedule_fn(cost_model.topology, collective, algo, world_ranks),
                cost_model.topology,
                count,
                itemsize=itemsize,
                root=root,
                world_ranks=world_ranks,
                cost_model=cost_model,
            ).time_s
            if time_s < best_time or (
                time_s == best_time and order.get(algo.partition(":")[0], 99) < order.get(best.partition(":")[0], 99)
            ):
                best, best_time = algo, time_s
        cache[key] = best
    return best


def lower_bound_s(
    topology, collective: str, algo: str, count: int, itemsize: int, world_ranks: tuple[int, ...], root: int = 0
) -> float:
    """A cheap bound no simulation of ``algo`` can beat: the launch, then, step by step for the
    root (rank 0 when unrooted) and for the last rank, each step's largest send at the smallest
    hop latency and the largest link bandwidth of the topology (a step ends no earlier than its
    sends have left). Needs only those ranks' schedules."""
    fn = schedule_fn(topology, collective, algo, world_ranks)
    size = len(world_ranks)
    alpha = min(spec.latency_s for spec in topology.link_kinds.values())
    bandwidth = max(spec.bandwidth_Bps for spec in topology.link_kinds.values())
    bound = 0.0
    for r in {root, size - 1}:
        steps = fn(r, size, count, root).steps
        t = topology.card(world_ranks[r]).launch_overhead_s if steps else 0.0
        for step in steps:
            if step.sends:
                t += alpha + max(send.src.count for send in step.sends) * itemsize / bandwidth
        bound = max(bound, t)
    return bound
