"""Partition strategies: which ranks form the groups of the hierarchical collectives.

* ``auto``: HCCL's own rule (:func:`topology.auto_partition`: by server, then HCCS island,
  otherwise consecutive pairs).
* ``manual``: the user's rank lists — ``[[1, 2], [0, 3]]``, the ``--groups`` text ``"1,2;0,3"``
  or a file (:func:`topology.load_partition`).
* ``optimized``: the partition with the least modeled time for a *workload*, found with the
  simulator (no processes). Exhaustive where the candidates are few: every set partition when
  there are at most ``budget`` of them (up to 7 ranks with the default), else every partition
  into equal groups (8 ranks: 142); beyond, a graph heuristic on the topology proposes
  candidates — bandwidth matching coarsened level by level, recursive Kernighan-Lin bisection,
  Louvain communities — and the simulator picks the best of them. :class:`Choice` says which.

Workloads (:class:`Workload`): :class:`CollectiveWorkload` (one hierarchical collective of a
given size) and ``dp-infer``, a data-parallel inference step
(:class:`hccl_py.parallel.workload.DpInferWorkload`, with the inference drivers)::

    topo = Topology.preset("mixed-4p")
    w = CollectiveWorkload("allreduce", 64 << 20)
    best = optimize(topo, w)
    best.partition, best.time_s, best.method     # ((0, 3), (1, 2)), 0.00873..., 'exhaustive'
    evaluate(topo, w, auto(topo))                # HCCL's grouping, modeled seconds

Group order and the order inside a group change only which rank plays which part, so candidates
are canonical: each group ascending, groups by their first rank.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from itertools import combinations
from typing import Iterator, Protocol, Sequence

import numpy as np

from topology import Topology, auto_partition, load_partition, validate_partition
from topology.units import format_size, parse_size

from ..algorithms.hierarchical import HIER_COLLECTIVES, Partition, schedule_for
from ..collectives import collective as lookup
from ..errors import HcclParamError
from ..modeled.cost_model import CostModel, flow_load, route_share
from ..modeled.simulator import simulate
from ..parallel.workload import DpInferWorkload

DEFAULT_BUDGET = 1200  # simulations an exhaustive search may take


class Workload(Protocol):
    """What a partition is judged by: modeled seconds on a topology (no processes)."""

    name: str

    def time_s(self, topo: Topology, partition: Partition, model: CostModel) -> float:
        """Modeled seconds with hierarchical collectives on ``partition``."""

    def flat_time_s(self, topo: Topology, algo: str, model: CostModel) -> float:
        """Modeled seconds with flat collectives of algorithm ``algo`` (the reference without groups)."""

    def one_card_s(self, topo: Topology) -> float | None:
        """Modeled seconds of the same work on one card; None where that is undefined."""

    def describe(self, topo: Topology) -> str:
        """The workload in words, for a report's header."""


@dataclass(frozen=True)
class CollectiveWorkload:
    """One collective of ``nbytes`` per rank (allgather: each rank's input; reduce_scatter: the
    whole input), hierarchical with ``inner``/``outer`` algorithms, started together at clock 0."""

    collective: str
    nbytes: int
    itemsize: int = 4
    inner: str = "ring"
    outer: str = "ring"
    root: int = 0

    def __post_init__(self):
        spec = lookup(self.collective)
        if spec.name not in HIER_COLLECTIVES:
            raise HcclParamError(f"workload collective {self.collective!r}: use one of {', '.join(HIER_COLLECTIVES)}")
        object.__setattr__(self, "collective", spec.name)

    @property
    def name(self) -> str:
        """``<collective>:<size>``, as :func:`parse_workload` reads it."""
        return f"{self.collective}:{format_size(self.nbytes)}"

    def count(self, n: int) -> int:
        """The call's count for ``n`` ranks (``Collective.message_elements``)."""
        return lookup(self.collective).message_elements(self.nbytes, self.itemsize, n)

    def time_s(self, topo: Topology, partition: Partition, model: CostModel) -> float:
        """Modeled seconds of the hierarchical collective on ``partition``."""
        fn = schedule_for(self.collective, partition, self.inner, self.outer)
        return simulate(
            self.collective,
            fn,
            topo,
            self.count(topo.num_ranks),
            itemsize=self.itemsize,
            root=self.root,
            cost_model=model,
        ).time_s

    def flat_time_s(self, topo: Topology, algo: str, model: CostModel) -> float:
        """Modeled seconds of the flat collective with algorithm ``algo``."""
        return simulate(
            self.collective,
            algo,
            topo,
            self.count(topo.num_ranks),
            itemsize=self.itemsize,
            root=self.root,
            cost_model=model,
        ).time_s

    def one_card_s(self, topo: Topology) -> float | None:
        """None: one card alone does no collective."""
        return None

    def describe(self, topo: Topology) -> str:
        """The collective, its size and algorithms in words."""
        return (
            f"one hierarchical {self.collective} of {format_size(self.nbytes)} per rank ({self.itemsize}-byte elements), "
            f"level0 {self.inner}, level1 {self.outer}"
        )


def parse_workload(text: str, **options) -> Workload:
    """``"dp-infer"`` or ``"<collective>:<size>"`` (``allreduce:64M``; K, M, G powers of 1024)."""
    text = text.strip().lower()
    if text in ("dp-infer", "dp_infer", "dpinfer"):
        return DpInferWorkload(**options)
    name, sep, size = text.partition(":")
    try:
        name = lookup(name).name
        nbytes = parse_size(size)
    except (HcclParamError, ValueError):
        name = None
    if not sep or name not in HIER_COLLECTIVES:
        raise HcclParamError(
            f"workload {text!r}: write dp-infer or <collective>:<size>, e.g. allreduce:64M "
            f"(collectives: {', '.join(HIER_COLLECTIVES)}; sizes like 64K, 64M, 1G)"
        )
    return CollectiveWorkload(name, nbytes, **options)


# ----------------------------------------------------------------------------------------- strategies


def canonical(partition: Sequence[Sequence[int]]) -> Partition:
    """Each group ascending, groups ordered by their first rank."""
    return tuple(sorted(tuple(sorted(int(r) for r in g)) for g in partition))


def auto(topo: Topology) -> Partition:
    """HCCL's automatic grouping of all ranks of ``topo``."""
    return tuple(tuple(g) for g in auto_partition(topo))


def manual(groups, num_ranks: int) -> Partition:
    """The user's partition: rank lists, ``"1,2;0,3"`` or a file; checked."""
    parsed = load_partition(groups, num_ranks) if isinstance(groups, str) else validate_partition(groups, num_ranks)
    return tuple(tuple(g) for g in parsed)


def evaluate(
    topo: Topology, workload: Workload, partition: Sequence[Sequence[int]], model: CostModel | None = None
) -> float:
    """Modeled seconds of ``workload`` with hierarchical collectives on ``partition``."""
    part = tuple(tuple(g) for g in validate_partition(partition, topo.num_ranks))
    return workload.time_s(topo, part, model or CostModel(topo))


@dataclass(frozen=True)
class Choice:
    """The result of :func:`optimize`: the best partition, its modeled seconds, how it was found
    (``method``: ``exhaustive`` or ``heuristic``, ``detail``: in words) and every candidate's time."""

    partition: Partition
    time_s: float
    method: str
    detail: str
    times: dict[Partition, float]

    @property
    def evaluated(self) -> int:
        """How many partitions were simulated."""
        return len(self.times)


def bell(n: int) -> int:
    """Number of set partitions of n elements."""
    row = [1]
    for _ in range(n):
        nxt = [row[-1]]
        for x in row:
            nxt.append(nxt[-1] + x)
        row = nxt
    return row[0]


def equal_partition_count(n: int) -> int:
    """Number of partitions of n ranks into groups of one size (every divisor)."""
    return sum(
        math.factorial(n) // (math.factorial(d) ** (n // d) * math.factorial(n // d))
        for d in range(1, n + 1)
        if n % d == 0
    )


def set_partitions(n: int) -> Iterator[Partition]:
    """Every set partition of 0..n-1, canonical."""

    def rec(i: int, groups: list[list[int]]) -> Iterator[Partition]:
        if i == n:
            yield tuple(tuple(g) for g in groups)
            return
        for g in groups:
            g.append(i)
            yield from rec(i + 1, groups)
            g.pop()
        groups.append([i])
        yield from rec(i + 1, groups)
        groups.pop()

    if n:
        yield from rec(0, [])


def equal_partitions(n: int) -> Iterator[Partition]:
    """Every partition of 0..n-1 into groups of one size d (d divides n), canonical."""

    def rec(rest: tuple[int, ...], d: int) -> Iterator[tuple[tuple[int, ...], ...]]:
        if not rest:
            yield ()
            return
        first, others = rest[0], rest[1:]
        for mates in combinations(others, d - 1):
            group = (first, *mates)
            left = tuple(r for r in others if r not in mates)
            for tail in rec(left, d):
                yield (group, *tail)

    for d in range(1, n + 1):
        if n % d == 0:
            yield from rec(tuple(range(n)), d)


def pair_bandwidth(topo: Topology) -> np.ndarray:
    """``[a, b]``: bytes/s the route a -> b keeps when *every* ordered pair of ranks sends at
    once (each directed link split evenly among the routes crossing it): a link-graph affinity
    that sees both link speed and how many ranks share a link (a server's NIC, the host path, a
    PCIe switch uplink under ACS), where raw link bandwidths look alike."""
    n = topo.num_ranks
    routes = [[topo.route(a, b) if a != b else None for b in range(n)] for a in range(n)]
    load = flow_load(route for row in routes for route in row if route is not None)
    out = np.zeros((n, n))
    for a in range(n):
        for b in range(n):
            if a != b:
                out[a, b] = route_share(topo, routes[a][b], load)
    return out


def heuristic_candidates(topo: Topology, seed: int = 0) -> dict[str, Partition]:
    """Candidate partitions from the link graph (networkx), named by how each was made.

    The graph has a node per rank and an edge weight per pair: the mean of
    :func:`pair_bandwidth` both ways (GB/s). Candidates: HCCL's ``auto``; ``matching level L``:
    max-weight matching of ranks, then of the resulting groups (weight: sum over member pairs),
    L times (groups of 2^L); ``kernighan-lin level L``: recursive Kernighan-Lin bisection into 2^L
    equal parts; ``louvain``: Louvain modularity communities.
    """
    import networkx as nx

    n = topo.num_ranks
    bw = pair_bandwidth(topo)
    weight = (bw + bw.T) / 2 / 1e9
    graph = nx.Graph()
    graph.add_nodes_from(range(n))
    graph.add_weighted_edges_from((a, b, float(weight[a, b])) for a in range(n) for b in range(a + 1, n))
    out: dict[str, Partition] = {"auto": canonical(auto(topo))}

    groups = [[r] for r in range(n)]
    level = 0
    while len(groups) > 1:
        level += 1
        g = nx.Graph()
        g.add_nodes_from(range(len(groups)))
        for x, y in combinations(range(len(groups)), 2):
            g.add_edge(x, y, weight=float(sum(weight[a, b] for a in groups[x] for b in groups[y])))
        matched = nx.max_weight_matching(g, maxcardinality=True)
        merged, seen = [], set()
        for x, y in sorted(tuple(sorted(e)) for e in matched):
            merged.append(groups[x] + groups[y])
            seen |= {x, y}
        merged += [groups[x] for x in range(len(groups)) if x not in seen]
        groups = merged
        out[f"matching level {level}"] = canonical(groups)

    parts = [list(range(n))]
    level = 0
    while max(len(p) for p in parts) > 2:
        level += 1
        nxt = []
        for p in parts:
            if len(p) < 2:
                nxt.append(p)
                continue
            a, b = nx.community.kernighan_lin_bisection(graph.subgraph(p), weight="weight", seed=seed)
            nxt += [sorted(a), sorted(b)]
        parts = nxt
        out[f"kernighan-lin level {level}"] = canonical(parts)

    communities = nx.community.louvain_communities(graph, weight="weight", seed=seed)
    out["louvain"] = canonical(communities)
    return out


def optimize(
    topo: Topology, workload: Workload, *, budget: int = DEFAULT_BUDGET, model: CostModel | None = None, seed: int = 0
) -> Choice:
    """The partition with the least modeled time for ``workload`` on ``topo`` (see the module
    docstring for how candidates are chosen); ties go to fewer groups, then to the earlier
    candidate, so the choice is deterministic."""
    n = topo.num_ranks
    model = model or CostModel(topo)
    if bell(n) <= budget:
        method, candidates = "exhaustive", {p: None for p in set_partitions(n)}
        detail = f"exhaustive: all {len(candidates)} set partitions of {n} ranks"
    elif equal_partition_count(n) <= budget:
        method, candidates = "exhaustive", {p: None for p in equal_partitions(n)}
        detail = (
            f"exhaustive over the {len(candidates)} partitions into equal groups "
            f"(of {bell(n)} set partitions of {n} ranks)"
        )
    else:
        named = heuristic_candidates(topo, seed)
        method = "heuristic"
        candidates = {}
        for label, p in named.items():
            candidates.setdefault(p, label)
        detail = (
            f"heuristic: best of {len(candidates)} candidates from bandwidth matching, Kernighan-Lin bisection "
            f"and Louvain communities on the link graph"
        )
    times = {p: workload.time_s(topo, p, model) for p in candidates}
    best = min(times, key=lambda p: (times[p], len(p)))
    if method == "heuristic":
        detail += f" (winner: {candidates[best]})"
    return Choice(best, times[best], method, detail, times)


__all__ = [
    "Choice",
    "CollectiveWorkload",
    "Workload",
    "auto",
    "bell",
    "canonical",
    "equal_partition_count",
    "equal_partitions",
    "evaluate",
    "heuristic_candidates",
    "manual",
    "optimize",
    "pair_bandwidth",
    "parse_workload",
    "set_partitions",
]
