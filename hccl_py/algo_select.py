"""Which algorithm serves a call: the caller's ``algo=``, else ``HCCL_ALGO``, else the auto rule.

``HCCL_ALGO`` is read in HCCL's own syntax, globally (``level0:NA;level1:ring``) or per
operator (``allreduce=level0:NA;level1:ring/allgather=level0:NA;level1:H-D_R``), and in the short
per-operator form ``allreduce=ring/allgather=mesh``. Level 1 alone (``level0:NA;level1:ring``) is
what HCCL does with it: its own level 0 for the topology, that algorithm across servers, nothing
inside one server (``auto(level1=...)``). HCCL's names map onto hccl-py's: ``ring``,
``H-D_R`` -> ``hd``, ``NHR`` -> ``nhr``, ``fullmesh`` -> ``mesh``, ``NA`` -> automatic; ``level1:pipeline``
is HCCL's pipeline, ``hier:mesh/pipeline`` (allgather, reduce_scatter, allreduce; in the global
form the other operators stay automatic, as HCCL resets it). Setting *both* levels
(``level0:ring;level1:H-D_R``) asks for HCCL's two-level algorithm: ``hier:ring/hd``, level0
inside the communicator's groups, level1 across them (``algorithms/hierarchical.py``; the groups
are ``Communicator.partition``). ``algo="hier"`` is ``hier:ring/ring``. HCCL algorithms hccl-py does not
implement (NHR_V1, NB, AHC, ...) are accepted by the parser and refused, with
``HcclNotSupportedError``, by the call that would use them — never silently replaced.
"""

from __future__ import annotations

import math
import weakref
from dataclasses import dataclass
from typing import Callable

from topology import CARD_MODELS, auto_partition

from . import env
from .algorithms.alltoall_staged import CONTINUOUS
from .algorithms.alltoallv_continuous import CCL_BUFFER_BYTES
from .algorithms.alltoallv_continuous import fits as fits_ccl_buffer
from .algorithms.hierarchical import (
    FIRST,
    HIER_COLLECTIVES,
    LEVELS,
    TWO_LEVEL,
    across_first,
    schedule_for,
    whole_buffer,
)
from .algorithms.pipeline import PIPELINED
from .algorithms.registry import ALL_ALGOS, SCHEDULES, algos_for, get_schedule
from .collectives import collective
from .cost_model import default_dtype
from .errors import HcclNotSupportedError, HcclParamError
from .simulator import simulate

GiB = 1 << 30

AUTO = "auto"
HIER = "hier"
# HCCL operators that HCCL_ALGO may name and hccl-py does not have (yet): accepted, never used
_OTHER_HCCL_OPS = ("batchsendrecv",)
_HCCL_ALGOS = {"na": AUTO, "auto": AUTO, "h-d_r": "hd", "fullmesh": "mesh", **{a: a for a in ALL_ALGOS}}
HCCL_ONLY_ALGOS = {"nhr_v1", "nb", "ahc", "star"}
LEVEL1 = "level1:"  # HCCL_ALGO naming level 1 alone: auto's level 0, this algorithm across servers
_LEVEL1_ALGOS = ("ring", "hd", "nhr")  # HCCL's level-1 algorithms hccl-py has (pipeline: PIPELINE)
PIPELINE = f"{HIER}:mesh/pipeline"  # HCCL's pipeline: a two-level algorithm whose level 0 is the mesh
_ALIASES = {"pipeline": PIPELINE}
_PIPELINES = (*PIPELINED, "alltoall", "alltoallv")  # the pipelined all-to-all: algorithms/alltoall_staged.py
# Operators HCCL runs an algorithm for and hccl-py does not: HCCL_ALGO's global form refuses
# them rather than choose another (NHR: broadcast_nhr.cc, reduce_nhr_oneshot.cc, scatter_nhr.cc)
_HCCL_HAS = {"nhr": ("broadcast", "reduce", "scatter")}
# HCCL_ALGO names one operator for a family of calls: its AlltoAll setting serves AlltoAllV(C)
_ENV_KEY = {"alltoallv": "alltoall"}


def _parse_levels(text: str, where: str) -> str:
    """'level0:NA;level1:ring' -> 'level1:ring' (level 1 alone: auto keeps HCCL's level 0 and runs
    ring across servers), 'level0:ring;level1:NA' -> 'auto' (HCCL ignores level 0), both levels
    'level0:ring;level1:H-D_R' -> 'hier:ring/hd' (hccl-py's request for that two-level algorithm),
    'ring' -> 'ring'."""
    text = text.strip()
    if ":" not in text:
        return _algo_name(text, where)
    chosen = AUTO
    levels = {}
    for part in filter(None, (p.strip() for p in text.split(";"))):
        level, sep, value = part.partition(":")
        if not sep or level.strip().lower() not in ("level0", "level1", "level2"):
            raise HcclParamError(
                f"HCCL_ALGO: cannot read {part!r} in {where!r}; expected e.g. 'level0:NA;level1:ring'",
                variable=env.HCCL_ALGO,
                value=part,
                rule="format",
                expected="level0:<algo>;level1:<algo>",
            )
        name = _algo_name(value, where)
        levels[level.strip().lower()] = name
        if name != AUTO:
            chosen = name
    inner, outer = levels.get("level0", AUTO), levels.get("level1", AUTO)
    if outer == PIPELINE:  # HCCL's pipeline: level 0 is its full mesh
        return PIPELINE if inner in (AUTO, "mesh") else f"{HIER}:{inner}/pipeline"
    if inner == AUTO and outer in _LEVEL1_ALGOS:
        return f"{LEVEL1}{outer}"  # level 1 alone: HCCL's level 0 for the topology, this across servers
    if inner == AUTO and outer == "mesh":
        return AUTO  # HCCL ignores level1:fullmesh (alg_configurator.cc L259-265)
    if outer == AUTO and inner != AUTO:
        return AUTO  # HCCL ignores any level-0 setting (alg_configurator.cc SetAlgoLevel0Module L374-386)
    if AUTO not in (inner, outer) and inner.lower() not in HCCL_ONLY_ALGOS and outer.lower() not in HCCL_ONLY_ALGOS:
        return f"{HIER}:{inner}/{outer}"  # both levels set: the two-level algorithm
    return chosen


def _algo_name(value: str, where: str) -> str:
    key = value.strip().lower()
    if key in _ALIASES:
        return _ALIASES[key]
    if key in _HCCL_ALGOS:
        return _HCCL_ALGOS[key]
    if key in HCCL_ONLY_ALGOS:
        return value.strip()  # refused by the call that needs it, with the reason
    raise HcclParamError(
        f"HCCL_ALGO: unknown algorithm {value.strip()!r} in {where!r}; use ring, H-D_R (hd), NHR, tree, mesh or NA",
        variable=env.HCCL_ALGO,
        value=value.strip(),
        rule="choices",
        choices=["ring", "H-D_R", "NHR", "tree", "mesh", "NA"],
    )


def _hccl_op(name: str) -> str | None:
    """hccl-py's collective name for an operator named in HCCL_ALGO, or None if unknown."""
    if name in _OTHER_HCCL_OPS:
        return name
    try:
        return collective(name).name
    except HcclParamError:
        return None


def parse_hccl_algo(text: str | None) -> dict[str, str]:
    """HCCL_ALGO -> {collective: algo}; key '*' holds the global setting.

    >>> parse_hccl_algo("level0:NA;level1:ring")
    {'*': 'level1:ring'}
    >>> parse_hccl_algo("allreduce=ring/allgather=level0:NA;level1:H-D_R")
    {'allreduce': 'ring', 'allgather': 'level1:hd'}
    """
    if not text or not text.strip():
        return {}
    if "=" not in text:
        return {"*": _parse_levels(text, text)}
    table = {}
    for entry in filter(None, (e.strip() for e in text.split("/"))):
        op, sep, levels = entry.partition("=")
        op_key = _hccl_op(op.strip().lower())
        if not sep or op_key is None:
            raise HcclParamError(
                f"HCCL_ALGO: cannot read {entry!r}; expected '<op>=<algo>' with <op> an HCCL operator (allreduce, allgather, broadcast, reduce, reducescatter, ...)",
                variable=env.HCCL_ALGO,
                value=entry,
                rule="format",
                expected="<op>=<algo>",
            )
        table[op_key] = _parse_levels(levels, entry)
    return table


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


def schedule_fn(topology, collective: str, algo: str, world_ranks: tuple[int, ...]):
    """The schedule function of a flat name or of ``hier:<inner>/<outer>@server|@groups`` on
    ``world_ranks`` (what the communicator runs for that name)."""
    levels = hier_levels(algo)
    if levels is None:
        return get_schedule(collective, algo)
    return schedule_for(collective, partition_of(topology, algo, world_ranks), *levels)


def topology_partition(topology, world_ranks) -> tuple[tuple[int, ...], ...]:
    """The communicator's ranks (0..n-1) in HCCL's mesh-aggregation groups: by server, a 910
    server's by HCCS island (``topology.auto_partition``); the groups of the staged all-to-all."""
    index = {w: r for r, w in enumerate(world_ranks)}
    return tuple(tuple(index[w] for w in g) for g in auto_partition(topology, world_ranks))


def partition_of(topology, name: str, world_ranks) -> tuple[tuple[int, ...], ...] | None:
    """The partition a two-level name runs on: by server for ``...@server``, HCCL's mesh groups
    for ``...@groups``; ``None`` for the communicator's own (``Communicator.partition``)."""
    name = name.strip().lower()
    if name.endswith(SERVER):
        return server_partition(topology, world_ranks)
    if name.endswith(GROUPS):
        return topology_partition(topology, world_ranks)
    return None


def server_partition(topology, world_ranks) -> tuple[tuple[int, ...], ...]:
    """The communicator's ranks (0..n-1) grouped by the server of their world rank: the partition
    of HCCL's two-level algorithms (level0 inside a server, level1 across servers)."""
    groups: dict[int, list[int]] = {}
    for r, w in enumerate(world_ranks):
        groups.setdefault(topology.server_of(w), []).append(r)
    return tuple(tuple(g) for g in groups.values())


# ------------------------------------------------------------------------------ HCCL's own selection

SERVER = "@server"  # suffix of a two-level choice on the partition by server
GROUPS = "@groups"  # ... on HCCL's mesh-aggregation groups: servers, a 910 server split by HCCS island
_SMALL_128K, _SMALL_256K, _SMALL_512K, _SMALL_1M = 128 * 1024, 256 * 1024, 512 * 1024, 1024 * 1024
# HCCL's level-1 alpha-beta comparison (coll_alg_operator.cc): LATENCY = 60 us per step and the
# per-NPU level-1 bandwidth GetBandWidthPerNPU(1) of device_capacity.cc, in GiB/s (x GB2B).
_HCCL_LEVEL1_LATENCY_US = 60.0
_HCCL_LEVEL1_GIB = {"ascend910b": 25.0 * 0.8, "ascend910": 12.5 * 0.8}
_HCCL_CCL_BUFFER = CCL_BUFFER_BYTES  # HCCL_BUFFSIZE's default 200 MB: data per loop
# HCCL's pipeline thresholds (coll_alg_operator.cc L31-34): 32 KB for allgather / reduce_scatter,
# 2 MB without RDMA lite; the FFTS task limit beyond which the operator takes H-D_R instead
_PIPELINE_MIN, _PIPELINE_NO_LITE, _HCCL_FFTS_CAPACITY = 32 * 1024, 2 * 1024 * 1024, 65535
_NHR_ONESHOT = _SMALL_256K  # NHR_ALLREDUCE_SMALL_SIZE (op_context.h L18): one-shot NHR at or below, per device


@dataclass(frozen=True)
class CallShape:
    """What HCCL's selection looks at for one call: the operator, its data size in HCCL's sense
    (``nbytes``: the buffer of allreduce/broadcast/reduce, one rank's input of allgather, one
    rank's output of reduce_scatter), the card, the servers the communicator spans (``servers``,
    HCCL's moduleNum), NPUs per server (``per_server``, deviceNumPerAggregation; None when the
    servers hold different numbers) and how a server's NPUs are joined (``level0_topo``: "mesh"
    = HCCS between every pair, "islands" = an Atlas 800 (9000) server's HCCS islands, "pcie" =
    standard PCIe cards); ``deterministic``: HCCL_DETERMINISTIC ("false", "true", "strict")."""

    collective: str
    nbytes: int
    card: str
    servers: int
    per_server: int | None
    level0_topo: str
    dtype: str = "float32"
    op: str = "sum"
    inline_reduce: bool | None = None  # the card's DMA engines reduce this dtype and op; None: from the card
    deterministic: str = "false"

    @property
    def mesh_910b(self) -> bool:
        """910B servers with HCCS between every pair of NPUs: what HCCL's 910B mesh rules look at."""
        return self.card == "ascend910b" and self.level0_topo == "mesh"

    @property
    def deterministic_910b(self) -> bool:
        """HCCL's deterministic selection applies: a 910B with HCCS between its NPUs, more than two
        a server (all_reduce_operator.cc SelectAlgfor910B: two or fewer take their own branch first)."""
        return self.deterministic != "false" and self.mesh_910b and (self.per_server or 0) > 2

    @property
    def reduces_inline(self) -> bool:
        """Whether the card's SDMA and RDMA engines reduce this dtype and op (``inline_reduce``, else
        the card model's rule)."""
        if self.inline_reduce is not None:
            return self.inline_reduce
        card = CARD_MODELS.get(self.card)
        return card is not None and card.reduces_inline(self.dtype, self.op)

    @property
    def ranks(self) -> int:
        """Ranks of the communicator: servers * per_server (0 when the servers hold different numbers)."""
        return self.servers * (self.per_server or 0)


@dataclass(frozen=True)
class Choice:
    """``auto``'s answer: the algorithm (a flat name, or ``hier:<inner>/<outer>@server``) and
    the HCCL rule behind it (``rule``; ``estimate`` says where no rule was found)."""

    algo: str
    rule: str
    estimate: bool = False


def call_shape(
    topology,
    collective: str,
    count: int,
    itemsize: int,
    world_ranks: tuple[int, ...],
    dtype: str | None = None,
    op: str = "sum",
    deterministic: str = "false",
) -> CallShape:
    """The :class:`CallShape` of a call of ``count`` elements on the ranks ``world_ranks``."""
    groups = server_partition(topology, world_ranks)
    sizes = {len(g) for g in groups}
    card = topology.card(world_ranks[0]).name
    first = [world_ranks[r] for r in groups[0]]
    if all(
        len(topology.route(a, b).hops) == 1 and topology.link(*topology.route(a, b).hops[0]).kind.startswith("HCCS")
        for a in first
        for b in first
        if a != b
    ):
        level0 = "mesh"
    elif any(topology.island_of(w) is not None for w in first):
        level0 = "islands"
    else:
        level0 = "pcie"
    nbytes = count * itemsize
    dtype = dtype or default_dtype(itemsize)
    return CallShape(
        collective,
        nbytes,
        card,
        len(groups),
        sizes.pop() if len(sizes) == 1 else None,
        level0,
        dtype,
        op,
        topology.card(world_ranks[0]).reduces_inline(dtype, op),
        deterministic,
    )


def _level0_default(s: CallShape, g: int) -> tuple[str, str]:
    """HCCL's intra-server algorithm from the topology (alg_configurator.cc
    GetDefaultAlgoLevel0Module / GetDefaultAlgoLevel0StandardCard; docs: "Server内 ... 根据硬件拓扑
    自动选择")."""
    if s.mesh_910b:
        return "mesh", "910B with HCCS between every pair: NP mesh"
    if s.level0_topo in ("mesh", "islands") and s.card == "ascend910":
        if g == 8:
            return "ring", "910, 8 NPUs per server: 8P ring"
        if g == 4 and s.level0_topo == "mesh":
            return "mesh", "910, 4 NPUs of one HCCS island: 4P mesh"
        if g <= 2:
            return "ring", "910, 1-2 NPUs: single ring"
        return "ring", "910 with 3, 5, 6 or 7 NPUs per server (HCCL takes 1, 2, 4, 8): ring, estimate"
    if s.level0_topo == "mesh":
        return "mesh", f"{s.card} with HCCS between every pair: mesh (estimate by analogy with the 910B)"
    if g == 2:
        return (
            ("ring", "standard PCIe cards, 2 x 910B: single ring")
            if s.card == "ascend910b"
            else ("mesh", "standard PCIe cards, 2 NPUs: 2P mesh")
        )
    return "ring", "standard PCIe cards: single ring"


def _level0_allreduce(s: CallShape, g: int) -> tuple[str, str]:
    """all_reduce_operator.cc SelectAlgfor910A / SelectAlgfor910B / SelectAlgfor310P3."""
    if s.servers == 1 and s.card == "ascend910" and s.level0_topo != "pcie" and g in (4, 8) and s.nbytes <= _SMALL_1M:
        return "hd", "910, one server, 4 or 8 NPUs, <= 1 MB: halving-doubling (AllReduceDoubling)"
    if s.card == "ascend310p" and s.servers == 1:
        inline = s.dtype in ("float32", "int16", "float16") and s.op == "sum"
        if s.nbytes <= _SMALL_256K and g & (g - 1) == 0 and inline:
            return "hd", "310P, <= 256 KB, power-of-two ranks, inline reduce: AllReduceDoubling"
        return "ring", "310P: AllReduceRing"
    algo, rule = _level0_default(s, g)
    if s.servers == 1 and s.deterministic_910b and s.reduces_inline:
        return _deterministic_allreduce(s, g)
    if (
        s.servers == 1
        and s.deterministic != "false"
        and s.mesh_910b
        and g <= 2
        and s.nbytes <= _SMALL_256K
        and s.reduces_inline
    ):
        # MeshTopoSelector -> AllReduceMeshSmallCountExecutor, whose deterministic template on other than 8 NPUs
        # is TEMPLATE_ALL_REDUCE_LOCAL_REDUCE_BCAST (coll_all_reduce_mesh_small_count_executor.cc L219-227)
        return "localreducebcast", (
            "deterministic, one 910B server of 2, <= 256 KB: AllReduceMeshSmallCountExecutor, "
            "a gather to one NPU, a local fold and a broadcast (AllReduceLocalReduceBcast)"
        )
    if algo == "mesh" and s.card == "ascend910b" and s.servers == 1 and s.nbytes <= _SMALL_256K and s.reduces_inline:
        # NonDeterministicSelector (all_reduce_operator.cc L557-560) -> AllReduceMeshSmallCountExecutor ->
        # TEMPLATE_ALL_REDUCE_REDUCE_BCAST (coll_all_reduce_mesh_small_count_executor.cc L200-203)
        return "reducebcast", (
            "910B mesh, <= 256 KB, inline reduce: AllReduceMeshSmallCountExecutor, every NPU reduces "
            "its buffer into one NPU's, which sends the result to all (AllReduceReduceBcast)"
        )
    return algo, rule


def _deterministic_allreduce(s: CallShape, g: int) -> tuple[str, str]:
    """One 910B server under HCCL_DETERMINISTIC (all_reduce_operator.cc DeterministicSelector
    L598-605, counts by GetCountTypeForDeterAllReduce L28-50: small up to 128 KB)."""
    if s.nbytes <= _SMALL_128K and g == 8:
        return "rd", (
            "deterministic, one 910B server of 8, <= 128 KB: AllReduceMeshSmallCountExecutor, recursive "
            "doubling (TEMPLATE_ALL_REDUCE_DOUBLING_DIRECT)"
        )
    if s.nbytes <= _SMALL_128K:
        return "localreducebcast", (
            "deterministic, one 910B server, <= 128 KB: AllReduceMeshSmallCountExecutor, a gather "
            "to one NPU, a local fold and a broadcast (AllReduceLocalReduceBcast)"
        )
    executor = (
        "AllReduceMeshMidCountLoopExecutor (AllReduceLocalReduce)"
        if g == 8
        else "AllReduceMeshOneshotLoopExecutor (AllReduceChunkMesh)"
    )
    return "mesh", (
        f"deterministic, one 910B server, > 128 KB: {executor}, a reduce-scatter whose chunks are folded in a "
        "fixed order, then an allgather; hccl-py's mesh standing in: estimate"
    )


def _level0_reduce_scatter(s: CallShape, g: int) -> tuple[str, str]:
    """reduce_scatter_operator.cc: the 910's small-data rule, else the topology's algorithm."""
    if s.servers == 1 and s.card == "ascend910" and s.level0_topo != "pcie" and g in (4, 8) and s.nbytes <= _SMALL_256K:
        return "hd", "910, one server, 4 or 8 NPUs, <= 256 KB: halving-doubling (ReduceScatterComm, level-1 HD)"
    if s.servers == 1 and s.deterministic != "false" and s.mesh_910b and s.reduces_inline:
        # ReduceScatterDeterExecutor (op-base: no NPU-count condition) (reduce_scatter_operator.cc L297-304; coll_reduce_scatter_deter_executor.cc L187-200)
        if g in (4, 8) and s.nbytes <= 32 * 1024:
            return (
                "hd",
                "deterministic, one 910B server of 4 or 8, <= 32 KB a rank: ReduceScatterDeterExecutor, HD-stage",
            )
        return "mesh", (
            "deterministic, one 910B server: ReduceScatterDeterExecutor, chunks folded in a fixed order "
            "(REDUCESCATTER_LOCAL_REDUCE), hccl-py's mesh standing in: estimate"
        )
    return _level0_default(s, g)


# One level-0 rule per collective; a collective without an entry takes the topology's algorithm.
LEVEL0_RULES: dict[str, Callable[[CallShape, int], tuple[str, str]]] = {
    "allreduce": _level0_allreduce,
    "reduce_scatter": _level0_reduce_scatter,
}


def _hccl_level1_costs(s: CallShape) -> dict[str, float]:
    """HCCL's level-1 alpha-beta costs (us) of ring, NHR and HD/RHD for a 910B allgather,
    reduce_scatter or allreduce (coll_alg_operator.cc SelectAlgoTypeFor<Op>, called by
    AutoSelectAlgTypeLevel1 for those three operators only)."""
    m, d = s.servers, s.per_server or 1
    delta = _HCCL_LEVEL1_LATENCY_US
    bandwidth = _HCCL_LEVEL1_GIB.get(s.card, 20.0) * GiB
    size = min(s.nbytes, _HCCL_CCL_BUFFER)
    pow2 = m & (m - 1) == 0
    log_up = math.ceil(math.log2(m))
    if s.collective in ("allgather", "reduce_scatter"):
        beta = size * s.ranks / bandwidth * 1e6
        ring = (m - 1) * delta + (m - 1) / m * beta
        nhr = log_up * delta + (m - 1) / m * beta
        hd = math.log2(m) * delta + (m - 1) / m * beta if pow2 else log_up * delta + (2 * m - 1) / m * beta
        return {"ring": ring, "nhr": nhr, "hd": hd}
    beta = size / d / bandwidth * 1e6  # allreduce (broadcast and reduce never run this comparison)
    ring = 2 * (m - 1) * delta + 2 * (m - 1) / m * beta
    nhr = 2 * log_up * delta + 2 * (m - 1) / m * beta
    hd = 2 * math.log2(m) * delta + 2 * (m - 1) / m * beta if pow2 else 2 * log_up * delta + 2 * (2 * m - 1) / m * beta
    return {"ring": ring, "nhr": nhr, "hd": hd}


def _level1(s: CallShape) -> tuple[str, str]:
    """HCCL's inter-server algorithm: per call on the 910B (AutoSelectAlgTypeLevel1 ->
    GetDefaultAlgoLevel1V2), by server count elsewhere (GetDefaultAlgoLevel1V1)."""
    m = s.servers
    if s.collective == "broadcast":
        return "hd", (
            f"{m} servers: HCCL's broadcast runs no ring across servers, level 1 is H-D_R "
            "(broadcast_operator.cc L24-29)"
        )
    if s.card == "ascend910b" and s.collective in ("allgather", "allreduce", "reduce_scatter"):
        costs = _hccl_level1_costs(s)
        # "if same cost, Ring > NHR > HD": NHR must be strictly cheaper than ring, HD than both
        algo = "nhr" if "nhr" in costs and costs["nhr"] < costs["ring"] else "ring"
        if costs["hd"] < min(costs[a] for a in costs if a != "hd"):
            algo = "hd"
        rule = (
            f"910B, {m} servers: HCCL's alpha-beta comparison (60 us per step, 20 GiB/s per NPU) picks "
            f"{'H-D_R' if algo == 'hd' else algo.upper()}"
        )
        return _one_shot(s, algo, rule)
    if m >= 8:
        return "hd", f"{s.card}, {m} >= 8 servers: H-D_R (GetDefaultAlgoLevel1V1)"
    if m & (m - 1):
        return "ring", f"{s.card}, {m} servers, not a power of two: ring (GetDefaultAlgoLevel1V1; HCCL_ALGO docs)"
    return "hd", f"{s.card}, {m} servers, a power of two: H-D_R (GetDefaultAlgoLevel1V1; HCCL_ALGO docs)"


def _named_level1(s: CallShape, algo: str) -> tuple[str, str]:
    """Level 1 as HCCL_ALGO names it (``level0:NA;level1:<algo>``), after the operator's own
    resets (broadcast_operator.cc L24-29: anything but NHR becomes H-D_R; reduce_operator.cc
    L20-25: NHR becomes H-D_R); HcclNotSupportedError when hccl-py has no such level-1 algorithm
    for this collective (NHR broadcast)."""
    if s.collective == "broadcast" and algo != "nhr" or s.collective == "reduce" and algo == "nhr":
        algo = "hd"
    needs = LEVELS[s.collective][1] if s.per_server != 1 else (s.collective,)
    missing = [c for c in needs if (c, algo) not in SCHEDULES]
    if missing:
        raise HcclNotSupportedError(
            f"{s.collective}: HCCL_ALGO names {algo!r} for level 1, which hccl-py has not for "
            f"{', '.join(missing)}; use one of {', '.join(algos_for(missing[0]))}",
            collective=s.collective,
            algo=algo,
            variable=env.HCCL_ALGO,
            choices=list(algos_for(missing[0])),
        )
    return _one_shot(s, algo, f"HCCL_ALGO names {'H-D_R' if algo == 'hd' else algo} for level 1")


def _one_shot(s: CallShape, algo: str, rule: str) -> tuple[str, str]:
    """NHR's one-shot form where HCCL's allreduce executors take it (<= 256 KiB per device:
    coll_all_reduce_mesh_executor.cc L149-160, coll_all_reduce_comm_executor.cc L97-108): a
    binomial reduce of the whole buffer to rank 0, then a binomial broadcast, hccl-py's ``tree``."""
    if algo == "nhr" and s.collective == "allreduce" and s.nbytes // (s.per_server or 1) <= _NHR_ONESHOT:
        return "tree", rule + (
            "; at <= 256 KiB per device its one-shot form (NHR_ALLREDUCE_SMALL_SIZE): a binomial "
            "reduce of the whole buffer to rank 0, then a binomial broadcast, hccl-py's tree"
        )
    return algo, rule


def _pipeline_tasks(collective: str, m: int, g: int, deterministic: bool = False) -> int:
    """HCCL's count of the tasks a pipeline takes on m servers of g NPUs (coll_alg_operator.cc
    CalcContextNumForPipeline L481-519): per step 5(g-1) HCCS, 7 RoCE and 1 copy tasks (and g-1
    local reduces in the deterministic allreduce / reduce_scatter pipeline), then 4 for the closing
    barrier and the first/last copies (and m-1 closing local reduces, deterministic)."""
    tasks = m * (5 * (g - 1) + 7 + 1 + (g - 1 if deterministic else 0)) + 4
    if collective in ("alltoall", "alltoallv"):
        return tasks + 1 + m
    return (tasks + 1) * (2 if collective == "allreduce" else 1) + (m - 1 if deterministic else 0)


def _pipeline(s: CallShape) -> Choice | None:
    """HCCL's two-level pipeline where its 910B selection runs it (coll_alg_operator.cc
    GetDefaultAlgoLevel1V2 L521-569, before the alpha-beta comparison), else None."""
    g, m = s.per_server or 1, s.servers
    if not s.mesh_910b or g < 2 or m < 2 or s.collective not in PIPELINED:
        return None
    reduces = s.collective != "allgather"
    if reduces and not s.reduces_inline:  # IsSupportSDMAReduce and IsSupportRDMAReduce: dtype and op
        return None
    if reduces and s.deterministic == "strict":  # neither the plain nor the deterministic branch takes it (L529-532)
        return None
    deterministic = reduces and s.deterministic == "true"
    if s.collective == "allreduce":
        size, floor, name = s.nbytes // (m * g), _SMALL_1M, "1 MB per slice (PIPELINE_ALLREDUCE_MIN_SIZE)"
    elif deterministic:  # L543-548: deterministic reduce_scatter from 256 KB
        size, floor, name = s.nbytes, _SMALL_256K, "256 KB (deterministic)"
    else:
        size, floor, name = s.nbytes, _PIPELINE_MIN, "32 KB (PIPELINE_MIN_SIZE)"
    if size < floor:
        return None
    # CalcContextNumForPipeline <= HCCL_FFTS_CAPACITY is part of the condition: past it the
    # alpha-beta comparison decides (coll_alg_operator.cc L536-541, L553-562)
    if _pipeline_tasks(s.collective, m, g, deterministic) > _HCCL_FFTS_CAPACITY:
        return None
    rule = (
        f"910B, {m} servers of {g} NPUs, >= {name}: HCCL's pipeline, the ring across servers "
        f"overlapped with the mesh inside (GetDefaultAlgoLevel1V2)"
    )
    lite = size < _PIPELINE_NO_LITE and not (deterministic and s.collective == "allreduce")  # L563-567: no lite rule
    if lite:
        rule += "; below 2 MB only where the NIC has RDMA lite (PIPELINE_MIN_SIZE_NO_LITE), not stated for A2: estimate"
    if deterministic:
        rule += (
            "; deterministic: its Deter pipeline executor, which folds each server's blocks locally in a fixed "
            "order, hccl-py's pipeline standing in: estimate"
        )
    return Choice(f"{HIER}:mesh/pipeline{SERVER}", rule, lite or deterministic)


def _small_count(s: CallShape, level1: str) -> Choice:
    """HCCL's allreduce below 512 KB across servers of 3+ NPUs (all_reduce_operator.cc
    NonDeterministicSelector L576-577): AllReduceMeshOpbaseSmallCountDeterministicExecutor, whole
    buffers at both levels, no allgather after (``hierarchical.whole_buffer``)."""
    m, g = s.servers, s.per_server
    if m & (m - 1) == 0:
        outer, across = "rd", "recursive doubling (any level-1 setting)"
    else:  # the level-1 setting's segmented algorithm: NHR (not its one-shot form), ring or RHD
        outer = "nhr" if level1 == "tree" else level1
        across = f"{'H-D_R' if outer == 'hd' else outer.upper()} on the whole buffer"
    pow2 = g & (g - 1) == 0
    inside = (
        "recursive doubling inside the server (all_reduce_doubling_local_reduce.cc)"
        if pow2
        else (
            "a gather to the server's first NPU, a local fold and a broadcast (AllReduceLocalReduceBcast, "
            "all_reduce_local_reduce_bcast.cc)"
        )
    )
    rule = (
        f"910B, {m} servers of {g} NPUs, below 512 KB: AllReduceMeshOpbaseSmallCountDeterministicExecutor, "
        f"the whole buffer by {inside}, then across servers by {across}"
    )
    return Choice(f"{HIER}:{'rd' if pow2 else 'localreducebcast'}/{outer}{SERVER}", rule)


def hccl_choice(shape: CallShape, level1: str | None = None) -> Choice:
    """What HCCL's own selection rules run for a call of ``shape`` (docs/fidelity.md lists the
    rules and their sources); ``level1``: HCCL_ALGO's level-1 algorithm, where it names one."""
    choice = _hccl_choice(shape, level1)
    if (
        shape.deterministic == "strict"
        and shape.card == "ascend910b"
        and shape.ranks > 2
        and shape.collective in ("allreduce", "reduce_scatter")
        and shape.dtype in ("float16", "float32", "bfloat16")
    ):
        # all_reduce_operator.cc L382-393, reduce_scatter_operator.cc L190-212: ahead of every other rule
        executor = (
            "AllReduceOrderPreservedExecutor"
            if shape.collective == "allreduce"
            else "ReduceScatterOrderPreservedExecutor"
        )
        return Choice(
            choice.algo, f"{choice.rule}; HCCL_DETERMINISTIC=strict: HCCL runs {executor}, not modeled: estimate", True
        )
    return choice


def _hccl_choice(shape: CallShape, level1: str | None) -> Choice:
    if shape.per_server is None:
        return Choice(
            "ring",
            "servers with different NPU counts: HCCL runs one ring over all ranks (multiModuleDiffDeviceNumMode)",
        )
    g = shape.per_server
    rule0 = LEVEL0_RULES.get(shape.collective, _level0_default)
    if shape.servers == 1:
        algo, rule = rule0(shape, g)
        return Choice(algo, rule, "estimate" in rule)
    piped = _pipeline(shape) if level1 is None else None  # HCCL's own level-1 choice only by default
    if piped is not None and shape.deterministic == "true" and g <= 2 and shape.collective != "allgather":
        # level 1 is the pipeline, but the Deter pipeline executors need more than 2 NPUs a server
        # (all_reduce_operator.cc L418-449, reduce_scatter_operator.cc L287-290): the mesh executor
        # runs and its level-1 template falls to H-D_R (coll_all_reduce_mesh_executor.cc L177-180)
        if shape.collective == "reduce_scatter" and shape.nbytes <= _SMALL_512K:
            return _small_count_reduce_scatter(shape, "hd")
        return Choice(
            f"{HIER}:mesh/hd{SERVER}",
            f"deterministic, {shape.servers} servers of {g}: level 1 set to the "
            "pipeline, which needs more than 2 NPUs a server deterministically; the mesh executor's level 1 "
            "falls to H-D_R" + ("" if shape.collective == "allreduce" else " (as allreduce's: estimate)"),
            shape.collective != "allreduce",
        )
    if piped is not None:
        return piped
    outer, rule1 = _level1(shape) if level1 is None else _named_level1(shape, level1)
    if g == 1:
        return Choice(outer, f"one NPU per server: level 1 only; {rule1}", "estimate" in rule1)
    inner, rule = rule0(shape, g)
    if (shape.collective, inner) not in SCHEDULES or (shape.collective not in HIER_COLLECTIVES):
        return Choice(outer, rule1, True)
    small = shape.nbytes <= _SMALL_512K if shape.deterministic_910b else shape.nbytes < _SMALL_512K  # L576 / L608
    if shape.collective == "allreduce" and shape.mesh_910b and g > 2 and small and shape.reduces_inline:
        return _small_count(shape, outer)
    if shape.collective == "allreduce" and shape.deterministic_910b and shape.reduces_inline:
        return Choice(
            f"{HIER}:{inner}/{outer}{SERVER}",
            f"deterministic, {shape.servers} servers, > 512 KB: "
            "AllReduceMeshOpbaseMidCountDeterministicExecutor, a reduce-scatter inside whose chunks are folded "
            f"in a fixed order, {outer} across, an allgather inside; hccl-py's two-level {inner}/{outer} "
            "standing in: estimate",
            True,
        )
    if (
        shape.collective == "reduce_scatter"
        and shape.mesh_910b
        and shape.reduces_inline
        and (
            shape.nbytes * shape.ranks < _SMALL_512K or (shape.deterministic == "true" and shape.nbytes <= _SMALL_512K)
        )
    ):
        return _small_count_reduce_scatter(shape, outer)
    return Choice(f"{HIER}:{inner}/{outer}{SERVER}", f"level 0: {rule}; level 1: {rule1}", "estimate" in rule + rule1)


def _small_count_reduce_scatter(s: CallShape, outer: str) -> Choice:
    """HCCL's reduce_scatter below 512 KB in all (reduce_scatter_operator.cc L305-317, with or
    without deterministic mode): ReduceScatterMeshOpbaseSmallCountDeterministicExecutor, the
    level-1 setting's algorithm across servers on the whole input first, then inside each server
    HD-stage (4 or 8 NPUs) or NHR (coll_reduce_scatter_mesh_opbase_small_count_deterministic_executor.cc
    RunAlgLevel1 / RunAlgLevel0): ``hier:<inner>/<outer>-first``."""
    g = s.per_server
    inner, inside = ("hd", "HD-stage (recursive halving)") if g >= 4 and g & (g - 1) == 0 else ("nhr", "NHR")
    across = "H-D_R" if outer == "hd" else outer.upper() if outer == "nhr" else outer
    return Choice(
        f"{HIER}:{inner}/{outer}{FIRST}{SERVER}",
        f"910B, {s.servers} servers of {g}, below 512 KB in all: ReduceScatterMeshOpbaseSmallCountDeterministic"
        f"Executor, {across} across servers on the whole input first, then {inside} inside each server",
    )


# --------------------------------------------- all-to-all, scatter, gather: rules without a level 1

STAGED = f"{HIER}:mesh/pairwise{GROUPS}"  # HCCL's RunAlltoAllVStaged on its mesh-aggregation groups
A2A_PIPELINE = f"{PIPELINE}{GROUPS}"  # HCCL's RunAlltoAllVTwoLevelPipeline on them
A2A_CONTINUOUS = f"{HIER}:mesh/{CONTINUOUS}{GROUPS}"  # HCCL's RunAlltoAllVContinuousPipeline (AlltoAllV)


def alltoall_rule(s: CallShape) -> Choice:
    """HCCL's all-to-all (AlltoAll, AlltoAllV, AlltoAllVC alike: alltoall_operator.cc
    SelectAlgforAlltoAll), in hccl-py's algorithms."""
    if s.per_server is None:
        return Choice(
            "pairwise",
            "servers with different NPU counts: RunAlltoAllVFullMesh, pairwise over all ranks "
            "(multiModuleDiffDeviceNumMode)",
        )
    if s.ranks <= 2:
        return Choice("pairwise", "<= 2 ranks: RunAlltoAllVFullMesh, pairwise (HCCL_ALLTOALLV_P2P_SIZE = 2)")
    if s.per_server == 1:
        return Choice("pairwise", "one NPU per server, all ranks on one plane: RunAlltoAllVFullMesh, pairwise")
    m, g = s.servers, s.per_server
    rule = (
        f"910B, {m} servers: RunAlltoAllVTwoLevelPipeline, pairwise between the servers' same-index NPUs "
        "overlapped with the in-server mesh"
    )
    if m > 1 and s.card == "ascend910b" and _pipeline_tasks(s.collective, m, g) <= _HCCL_FFTS_CAPACITY:
        # IsSatisfyAlltoallPipelineCondition (alltoall_operator.cc L534-560; the task count of
        # CalcContextNumForPipeline)
        if s.nbytes * s.ranks > _HCCL_CCL_BUFFER:  # a rank's data beyond the CCL buffer: another template
            return Choice(
                A2A_PIPELINE,
                rule + "; beyond HCCL's 200 MB buffer per rank it runs the ping-pong template "
                "(AlltoallPipelineMeshPairwisePingPong), not modeled: estimate",
                True,
            )
        return Choice(A2A_PIPELINE, rule)
    if m > 1 and s.card == "ascend910b":
        return Choice(
            STAGED,
            f"910B, {m} servers: the pipeline would exceed HCCL's {_HCCL_FFTS_CAPACITY} tasks: "
            "RunAlltoAllVStaged, a mesh inside each server, then pairwise among the servers' same-index NPUs",
        )
    if s.servers > 1 or s.level0_topo == "islands":
        where = f"{s.servers} servers" if s.servers > 1 else f"{s.per_server} NPUs in HCCS islands"
        return Choice(
            STAGED,
            f"{s.card}, {where}: RunAlltoAllVStaged, a mesh inside each mesh group (a server, or a 910's "
            "4P island), then pairwise among the groups' same-index NPUs",
        )
    if s.card in ("ascend910b", "ascend310p"):
        return Choice(
            "mesh",
            f"{s.card}, one server: RunAlltoAllDirectFullmesh (every peer at once; "
            "RunAlltoAllVStaged's mesh stage alone on a 910B below 200 MB)",
        )
    if s.card == "ascend910" and s.level0_topo == "mesh":
        return Choice(
            "mesh", "910, one HCCS island: RunAlltoAllVStaged on a single 4P mesh group, its mesh stage alone"
        )
    if s.card == "ascend910" and s.level0_topo == "pcie":
        return Choice(
            "pairwise", "910 standard PCIe cards: RunAlltoAllVStaged with groups of one card, its pairwise stage alone"
        )
    return Choice(
        "mesh", f"{s.card}, one server with HCCS between every pair: mesh (estimate by analogy with the 910B)", True
    )


def staged_alltoall(topology, world_ranks, *, counts: bool = False) -> list[str]:
    """``[STAGED, A2A_PIPELINE]`` when HCCL's mesh groups of ``world_ranks`` are several and of
    one size (the two-level all-to-alls run there), else ``[]``; ``counts``: an all-to-all-v's,
    with ``A2A_CONTINUOUS`` too where the groups have two or more members."""
    groups = topology_partition(topology, world_ranks)
    if len(groups) < 2 or len({len(g) for g in groups}) != 1:
        return []
    continuous = counts and len(groups[0]) > 1 and fits_ccl_buffer(len(world_ranks), len(groups))
    return [STAGED, A2A_PIPELINE, *([A2A_CONTINUOUS] if continuous else [])]


def _rooted_rule(s: CallShape, gather: bool) -> Choice:
    """HCCL's scatter (scatter_operator.cc ScatterOperator::SelectAlg: no size threshold, the
    topology decides), and the same rule for gather, which HCCL does not have."""
    what = (
        "gather: HCCL has no Gather operator (algo_intro.md), its Scatter rule mirrored (GatherMesh/GatherRing, which "
        "its Reduce uses), estimate; "
        if gather
        else ""
    )
    if s.per_server is None or s.card == "ascend310p":
        return Choice(
            "ring",
            what + "servers with different NPU counts or a 310P: ScatterCommExecutor, one ring over all ranks",
            gather,
        )
    if s.per_server == 1:
        return Choice("ring", what + "one NPU per server: ScatterRingExecutor's level-1 ring alone", gather)
    algo, rule = _level0_default(s, s.per_server)
    executor = "ScatterMeshExecutor" if algo == "mesh" else "ScatterRingExecutor"
    if (
        s.servers > 1
    ):  # KernelRunLevel1, then the server's executor; level 1 is RING by default (scatter_operator.cc:22)
        return Choice(
            f"{HIER}:{algo}/ring{SERVER}",
            what + f"{s.servers} servers: {executor}, a ring across the root's "
            f"plane (one NPU per server, whole servers' blocks), then inside each server ({rule})",
            gather or "estimate" in rule,
        )
    return Choice(algo, what + f"{rule}: {executor}", gather or "estimate" in rule)


# HCCL's rule for the collectives whose selection has no level-1 cost comparison
FLAT_RULES: dict[str, Callable[[CallShape], Choice]] = {
    "alltoall": alltoall_rule,
    "alltoallv": alltoall_rule,
    "scatter": lambda s: _rooted_rule(s, gather=False),
    "gather": lambda s: _rooted_rule(s, gather=True),
}


def flat_choice(
    topology, collective: str, count: int, itemsize: int, world_ranks: tuple[int, ...], level1: str | None = None
) -> Choice:
    """HCCL's rule for an all-to-all, scatter or gather on ``world_ranks`` (``level1``: what
    HCCL_ALGO names for level 1 alone)."""
    shape = call_shape(topology, collective, count, itemsize, world_ranks)
    if level1 == "nhr" and collective == "scatter" and shape.servers > 1:  # HCCL's NHR scatter: not in hccl-py
        raise HcclNotSupportedError(
            "scatter: HCCL_ALGO names NHR for level 1, which hccl-py has not for scatter; use ring or auto",
            collective=collective,
            algo="nhr",
            variable=env.HCCL_ALGO,
            choices=list(algos_for(collective)),
        )
    choice = FLAT_RULES[collective](shape)
    if choice.algo in (STAGED, A2A_PIPELINE) and not staged_alltoall(topology, world_ranks):
        return Choice(
            "pairwise",
            "mesh groups of different sizes: pairwise over all ranks, as HCCL does for servers of "
            "different sizes (estimate)",
            True,
        )
    if level1 == "nhr" and choice.algo == A2A_PIPELINE:  # NHR at level 1: no pipelined all-to-all
        return Choice(
            STAGED,
            "HCCL_ALGO names NHR for level 1, so HCCL skips its pipelined all-to-all "
            "(alltoall_operator.cc L540-544): RunAlltoAllVStaged",
        )
    return choice


def is_continuous(name: str) -> bool:
    """Whether ``name`` (with or without its ``@groups``) is HCCL's continuous pipeline."""
    return hier_levels(name) == ("mesh", CONTINUOUS)


def alltoallv_auto(
    topology, world_ranks: tuple[int, ...], level1: str | None = None, *, exchange: bool = False
) -> Choice:
    """``auto`` of an all-to-all-v: HCCL's all-to-all rule, which does not look at the counts.
    ``exchange``: AlltoAllV (every rank passes its own send and receive counts), which across
    910B servers of two or more NPUs runs HCCL's continuous pipeline; else AlltoAllVC (the whole
    matrix), which runs the two-level pipeline as AlltoAll does."""
    choice = flat_choice(topology, "alltoallv", 0, 1, world_ranks, level1)
    s = call_shape(topology, "alltoallv", 0, 1, world_ranks)
    if (
        exchange
        and s.card == "ascend910b"
        and s.servers > 1
        and s.per_server is not None
        and s.per_server > 1
        and choice.algo in (A2A_PIPELINE, STAGED)
        and level1 != "nhr"
    ):
        # IsSatisfyAlltoallContinuousPipelineCondition (alltoall_operator.cc L725-751): 910B,
        # AlltoAllV, level 1 ring/H-D/pipeline, several NPUs per server, several servers of one
        # size, a CCL buffer of 80 MB or more (HCCL_BUFFSIZE's default 200 MB); no task limit
        rule = (
            f"910B, {s.servers} servers of {s.per_server}, AlltoAllV: RunAlltoAllVContinuousPipeline, the "
            "same-index NPUs' RDMA steps overlapped with the copy before and the in-server distribution after"
        )
        if not fits_ccl_buffer(s.ranks, s.servers):
            rule += (
                f"; at {s.ranks} ranks its 200 MB CCL buffer cannot be split, and HCCL fails the call (HCCL_E_MEMORY)"
            )
        return Choice(A2A_CONTINUOUS, rule)
    return choice


# auto's decisions per cost model, per call shape
_auto_choices: "weakref.WeakKeyDictionary" = weakref.WeakKeyDictionary()


def auto(
    cost_model,
    collective: str,
    count: int,
    itemsize: int,
    world_ranks: tuple[int, ...],
    root: int = 0,
    dtype: str | None = None,
    op: str = "sum",
    level1: str | None = None,
    *,
    deterministic: str = "false",
) -> str:
    """``algo="auto"``: the algorithm HCCL's own rules choose for this call (:func:`hccl_choice`,
    :data:`FLAT_RULES`); where no rule covers the call (a barrier, one rank), the argmin of the
    model (:func:`fastest`), labelled an estimate. ``level1``: the algorithm HCCL_ALGO names for
    level 1 alone (HCCL's selection then keeps its level 0 and skips its own level-1 choice);
    ``deterministic``: HCCL_DETERMINISTIC, which changes HCCL's allreduce and reduce_scatter choices."""
    key = (collective, count, itemsize, world_ranks, root, dtype, op, level1, deterministic)
    cache = _auto_choices.get(cost_model)
    if cache is None:
        cache = _auto_choices[cost_model] = {}
    found = cache.get(key)
    if found is None:
        found = cache[key] = explain_auto(
            cost_model, collective, count, itemsize, world_ranks, root, dtype, op, level1, deterministic=deterministic
        ).algo
    return found


def explain_auto(
    cost_model,
    collective: str,
    count: int,
    itemsize: int,
    world_ranks: tuple[int, ...],
    root: int = 0,
    dtype: str | None = None,
    op: str = "sum",
    level1: str | None = None,
    *,
    deterministic: str = "false",
) -> Choice:
    """:func:`auto`'s choice with the rule behind it."""
    if len(world_ranks) > 1 and collective in FLAT_RULES:
        return flat_choice(cost_model.topology, collective, count, itemsize, world_ranks, level1)
    if len(world_ranks) == 1 or collective not in HIER_COLLECTIVES:
        best = fastest(cost_model, collective, count, itemsize, world_ranks, root)
        return Choice(best, "no HCCL rule: the least modeled time (estimate)", True)
    return hccl_choice(
        call_shape(cost_model.topology, collective, count, itemsize, world_ranks, dtype, op, deterministic), level1
    )


def hier_levels(name: str) -> tuple[str, str] | None:
    """``"hier"`` -> ``("ring", "ring")``, ``"hier:ring/H-D_R"`` -> ``("ring", "hd")`` (inner =
    level0, outer = level1; a trailing ``@server`` or ``@groups`` names the partition, see
    :func:`partition_of`);
    ``None`` for any other name."""
    head, sep, rest = name.strip().lower().removesuffix(SERVER).removesuffix(GROUPS).partition(":")
    if head != HIER:
        return None
    if not sep:
        return "ring", "ring"
    inner, slash, outer = rest.partition("/")
    if not slash:
        raise HcclParamError(
            f"algo {name!r}: write hier:<inner>/<outer>, e.g. hier:ring/hd",
            arg="algo",
            value=name,
            rule="format",
            expected="hier:<inner>/<outer>",
        )
    return _HCCL_ALGOS.get(inner.strip(), inner.strip()), _HCCL_ALGOS.get(outer.strip(), outer.strip())


def _resolve_hier(collective: str, levels: tuple[str, str], source: dict) -> str:
    if across_first(levels[1]):
        if collective != "reduce_scatter":
            raise HcclNotSupportedError(
                f"{collective}: across first (hier:<inner>/<outer>{FIRST}) is for reduce_scatter",
                collective=collective,
                algo=f"{HIER}:{levels[0]}/{levels[1]}",
                choices=["reduce_scatter"],
                **source,
            )
        name = _resolve_hier(collective, (levels[0], levels[1][: -len(FIRST)]), source)
        return name + FIRST
    if levels[1] == CONTINUOUS:
        if collective != "alltoallv" or levels[0] != "mesh":
            raise HcclNotSupportedError(
                f"{collective}: HCCL's continuous pipeline is hier:mesh/{CONTINUOUS}, for alltoallv",
                collective=collective,
                algo=f"{HIER}:{levels[0]}/{CONTINUOUS}",
                choices=["alltoallv"],
                **source,
            )
        return f"{HIER}:mesh/{CONTINUOUS}"
    if levels[1] == "pipeline":
        if collective not in _PIPELINES or levels[0] != "mesh":
            raise HcclNotSupportedError(
                f"{collective}: HCCL's pipeline is hier:mesh/pipeline, for {', '.join(_PIPELINES)}",
                collective=collective,
                algo=f"{HIER}:{levels[0]}/pipeline",
                choices=list(_PIPELINES),
                **source,
            )
        return PIPELINE
    if collective not in TWO_LEVEL:
        raise HcclNotSupportedError(
            f"{collective}: no hierarchical algorithm; hier serves {', '.join(TWO_LEVEL)}",
            collective=collective,
            algo=HIER,
            choices=list(TWO_LEVEL),
            **source,
        )
    needs = LEVELS[collective]
    if collective == "allreduce" and whole_buffer(levels[0]):  # whole buffers, an allreduce at each level
        needs = (("allreduce",), ("allreduce",))
    for level, algo, flat in zip(("inner (level0)", "outer (level1)"), levels, needs):
        for c in flat:
            if (c, algo) not in SCHEDULES:
                raise HcclNotSupportedError(
                    f"{collective}: hier's {level} algorithm {algo!r} has no {c}; use one of {', '.join(algos_for(c))}",
                    collective=c,
                    algo=algo,
                    choices=list(algos_for(c)),
                    **source,
                )
    return f"{HIER}:{levels[0]}/{levels[1]}"


def resolve(collective: str, algo: str, choose_auto: Callable[..., str], env_table: dict[str, str]) -> str:
    """The concrete algorithm for one call; raises for names that cannot serve it.

    ``choose_auto`` is called only when the call and HCCL_ALGO both leave the choice open (HCCL
    ignores a level-0 setting alone), or when HCCL_ALGO names level 1 alone
    (``choose_auto(level1=algo)``: HCCL's level 0 for the topology, that algorithm across servers;
    :func:`auto`).
    """
    if not isinstance(algo, str):
        raise HcclParamError(
            f"{collective}: algo must be a string, got {algo!r}",
            collective=collective,
            arg="algo",
            value=repr(algo),
            rule="type",
            expected="string",
        )
    name = algo.strip().lower()
    if name == AUTO:
        name = env_table.get(collective, env_table.get(_ENV_KEY.get(collective, collective)))
        if name is None:
            # The global form (level0/level1 for every operator) serves the operators that have
            # that algorithm; the others (an all-to-all under "level1:ring") choose as HCCL would.
            name = env_table.get("*", AUTO)
            levels = hier_levels(name) if name != AUTO else None
            if levels is not None and levels[1] == "pipeline" and collective in ("broadcast", "reduce"):
                name = f"{LEVEL1}hd"  # their operators reset a pipeline to H-D_R (reduce_operator.cc L20-25)
            elif (
                (name in ALL_ALGOS and name not in algos_for(collective) and collective not in _HCCL_HAS.get(name, ()))
                or (levels is not None and collective not in TWO_LEVEL)
                or (levels is not None and levels[1] == "pipeline" and collective not in _PIPELINES)
            ):
                name = AUTO
        source = env.HCCL_ALGO
        given = {"variable": env.HCCL_ALGO}  # where the name came from, as error fields
        if name == AUTO:
            return choose_auto()
        if name.startswith(LEVEL1):
            return choose_auto(level1=name[len(LEVEL1) :])
    else:
        source = "algo="
        given = {"arg": "algo"}
        name = _ALIASES.get(name, _HCCL_ALGOS.get(name, name))
    levels = hier_levels(name)
    if levels is not None:
        return _resolve_hier(collective, levels, given)
    if name in algos_for(collective):
        return name
    choices = [*algos_for(collective), AUTO]
    if name in ALL_ALGOS:
        raise HcclNotSupportedError(
            f"{collective}: algo {name!r} serves only {', '.join(c for c, a in SCHEDULES if a == name)}; "
            f"use one of {', '.join(algos_for(collective))} or auto",
            collective=collective,
            algo=name,
            choices=choices,
            **given,
        )
    if name.lower() in HCCL_ONLY_ALGOS:
        raise HcclNotSupportedError(
            f"{collective}: {source} asks for HCCL's {name} algorithm, which hccl-py does not implement; "
            f"use one of {', '.join(algos_for(collective))} or auto",
            collective=collective,
            algo=name,
            choices=choices,
            **given,
        )
    raise HcclParamError(
        f"{collective}: unknown algo {algo!r}; use one of {', '.join(algos_for(collective))} or auto",
        collective=collective,
        value=algo,
        rule="choices",
        choices=choices,
        **given,
    )
