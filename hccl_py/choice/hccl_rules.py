"""HCCL's own algorithm selection, rule by rule from CANN hcomm's sources: what it looks at
(:class:`CallShape`), what it picks (:class:`Choice`) for each operator, topology and size."""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Callable

from topology import CARD_MODELS

from .. import env
from ..algorithms.alltoallv_continuous import CCL_BUFFER_BYTES
from ..algorithms.alltoallv_continuous import fits as fits_ccl_buffer
from ..algorithms.hierarchical import (
    FIRST,
    HIER_COLLECTIVES,
    LEVELS,
)
from ..algorithms.pipeline import PIPELINED
from ..algorithms.registry import SCHEDULES, algos_for
from ..dtypes import default_dtype
from ..errors import HcclNotSupportedError
from .names import A2A_CONTINUOUS, A2A_PIPELINE, HIER, SERVER, STAGED, server_partition, topology_partition

GiB = 1 << 30

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
