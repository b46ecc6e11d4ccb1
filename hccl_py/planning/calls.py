"""Modeled time of a call as a program would run it, on the schedule simulator
(``hccl_py/simulator.py``): ``algo="auto"`` resolved by HCCL's rules (``algo_select``),
two-level algorithms on HCCL's partition, an all-to-all-v under each algorithm it has::

    simulate_call("allreduce", Topology.preset("2x8p-roce"), count=1 << 20).time_s
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Sequence

from topology import Topology

from ..algo_names import hier_levels, partition_of, server_partition
from ..algo_select import auto
from ..algorithms.alltoallv import VSchedule, as_matrix
from ..algorithms.hierarchical import schedule_for
from ..algorithms.registry import algos_for
from ..cost_model import CostModel
from ..hccl_rules import staged_alltoall
from ..simulator import PreparedCall, SimResult, can_simulate_flows, prepare, simulate, simulate_flows


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
    collective: str,
    topology: Topology,
    count: int,
    *,
    algo: str = "auto",
    itemsize: int = 4,
    root: int = 0,
    dtype: str | None = None,
    op: str = "sum",
    cost_model: CostModel | None = None,
    world_ranks: Sequence[int] | None = None,
    deterministic: str = "false",
) -> CallResult:
    """Modeled time of one call as a program would run it: ``algo`` is ``auto`` (HCCL's rules,
    ``algo_select.auto``), a flat algorithm, or ``hier:<inner>/<outer>`` (on the partition by
    server; ``...@groups``: HCCL's mesh groups); simulated all ranks at once where the algorithm has flows, else rank by rank.
    ``deterministic``: HCCL_DETERMINISTIC as ``auto`` should see it ("false", "true", "strict")."""

    model = cost_model or CostModel(topology)
    ranks = tuple(range(topology.num_ranks) if world_ranks is None else world_ranks)
    name = algo
    if name == "auto":
        name = auto(model, collective, count, itemsize, ranks, root, dtype, op, deterministic=deterministic)
    levels = hier_levels(name)
    fn = (
        name
        if levels is None
        else schedule_for(collective, partition_of(topology, name, ranks) or server_partition(topology, ranks), *levels)
    )
    whole = ranks == tuple(range(topology.num_ranks))
    if whole and can_simulate_flows(collective, fn, len(ranks), count, root):
        result = simulate_flows(
            collective, fn, topology, count, itemsize=itemsize, cost_model=model, dtype=dtype, op=op, root=root
        )
        return CallResult(result, name, "all ranks at once (flows)")
    result = simulate(
        collective,
        fn,
        topology,
        count,
        itemsize=itemsize,
        root=root,
        world_ranks=ranks,
        cost_model=model,
        dtype=dtype,
        op=op,
    )
    return CallResult(result, name, "rank by rank")


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
        partition = partition_of(topology, algo, ranks) or server_partition(topology, ranks)
        schedule = VSchedule(algo, as_matrix(counts), staged=(partition, *levels), itemsize=itemsize)
    return prepare(
        "alltoallv",
        schedule,
        topology,
        0,
        itemsize=itemsize,
        world_ranks=world_ranks,
        cost_model=cost_model or CostModel(topology),
    )
