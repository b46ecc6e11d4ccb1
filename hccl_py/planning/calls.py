"""Modeled time of a call as a program would run it, on the schedule simulator
(``hccl_py/modeled/simulator.py``): ``algo="auto"`` resolved by HCCL's rules (``algo_select``),
two-level algorithms on HCCL's partition, an all-to-all-v under each algorithm it has::

    simulate_call(CallSpec.of("allreduce", 1 << 20), Topology.preset("2x8p-roce")).time_s
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Sequence

from topology import Topology

from ..algorithms.alltoallv import VSchedule, as_matrix
from ..algorithms.registry import algos_for
from ..choice.hccl_rules import staged_alltoall
from ..choice.names import groups_for, hier_levels, schedule_fn
from ..choice.select import auto
from ..collectives import CallSpec
from ..modeled.cost_model import CostModel
from ..modeled.simulator import PreparedCall, SimResult, can_simulate_flows, prepare, simulate, simulate_flows


@dataclass(frozen=True)
class CallResult:
    """One modeled call: the result, the algorithm that ran (``auto`` resolved) and how it was
    simulated."""

    result: SimResult
    algo: str
    how: str

    @property
    def time_s(self) -> float:
        """The call's modeled seconds (``result.time_s``)."""
        return self.result.time_s


def simulate_call(
    spec: CallSpec,
    topology: Topology,
    *,
    cost_model: CostModel | None = None,
    world_ranks: Sequence[int] | None = None,
    deterministic: str = "false",
) -> CallResult:
    """Modeled time of one call as a program would run it: ``spec.algo`` is ``auto`` (HCCL's rules,
    ``algo_select.auto``), a flat algorithm, or ``hier:<inner>/<outer>`` (on the partition by
    server; ``...@groups``: HCCL's mesh groups); simulated all ranks at once where the algorithm
    has flows, else rank by rank. ``deterministic``: HCCL_DETERMINISTIC as ``auto`` should see it
    ("false", "true", "strict")::

        simulate_call(CallSpec.of("allreduce", 1 << 20), Topology.preset("2x8p-roce")).time_s
    """

    model = cost_model or CostModel(topology)
    ranks = tuple(range(topology.num_ranks) if world_ranks is None else world_ranks)
    collective, count = spec.collective, spec.count
    name = spec.algo
    if name == "auto":
        name = auto(model, spec, ranks, deterministic=deterministic)
    # a flat algorithm goes by its name (the flow engine's registry), a two-level one as its schedule
    fn = name if hier_levels(name) is None else schedule_fn(topology, collective, name, ranks)
    shape = dict(itemsize=spec.itemsize, cost_model=model, dtype=spec.dtype_name, op=spec.op_name, root=spec.root)
    whole = ranks == tuple(range(topology.num_ranks))
    if whole and can_simulate_flows(collective, fn, len(ranks), count, spec.root):
        return CallResult(simulate_flows(collective, fn, topology, count, **shape), name, "all ranks at once (flows)")
    return CallResult(simulate(collective, fn, topology, count, world_ranks=ranks, **shape), name, "rank by rank")


def simulate_alltoallv(
    topology: Topology,
    counts,
    *,
    algos: Sequence[str] | None = None,
    itemsize: int = 4,
    world_ranks: Sequence[int] | None = None,
    start_clocks: Sequence[float] | None = None,
    cost_model: CostModel | None = None,
) -> dict[str, SimResult]:
    """Modeled clocks of one all-to-all with counts per pair (``counts[i][j]`` elements from rank i
    to rank j, an n x n matrix for the n ranks ``world_ranks``) under each of ``algos`` (default:
    :func:`alltoallv_algos`), in that order: the data exchange alone, as ``all_to_all_vc`` runs it
    (``all_to_all_v`` gathers the counts first)::

        times = simulate_alltoallv(topo, counts)        # {"pairwise": SimResult, "mesh": SimResult, "hier:...": ...}
    """

    matrix = as_matrix(counts)
    model = cost_model or CostModel(topology)
    return {
        algo: prepare_alltoallv(
            topology, matrix, algo, itemsize=itemsize, world_ranks=world_ranks, cost_model=model
        ).run(start_clocks)
        for algo in (alltoallv_algos(topology, world_ranks) if algos is None else algos)
    }


def alltoallv_algos(topology: Topology, world_ranks: Sequence[int] | None = None) -> list[str]:
    """Every algorithm an all-to-all-v has on these ranks: the flat ones, and the two-level ones
    where HCCL's groups are several and equal."""

    ranks = tuple(range(topology.num_ranks) if world_ranks is None else world_ranks)
    return [*algos_for("alltoallv"), *staged_alltoall(topology, ranks, counts=True)]


def prepare_alltoallv(
    topology: Topology,
    counts,
    algo: str,
    *,
    itemsize: int = 4,
    world_ranks: Sequence[int] | None = None,
    cost_model: CostModel | None = None,
) -> PreparedCall:
    """One all-to-all-v (:func:`simulate_alltoallv`) under ``algo``, prepared (:func:`prepare`)
    to walk from any start clocks: alone (``all_to_all_vc``) and after the counts exchange
    (``all_to_all_v``) from one build of the schedules."""

    levels = hier_levels(algo)
    if levels is None:
        schedule = VSchedule(algo, as_matrix(counts))
    else:  # a plain hier: name runs on the partition by server, as in simulate_call
        ranks = tuple(range(topology.num_ranks) if world_ranks is None else world_ranks)
        schedule = VSchedule(
            algo, as_matrix(counts), staged=(groups_for(topology, algo, ranks), *levels), itemsize=itemsize
        )
    return prepare(
        "alltoallv",
        schedule,
        topology,
        0,
        itemsize=itemsize,
        world_ranks=world_ranks,
        cost_model=cost_model or CostModel(topology),
    )
