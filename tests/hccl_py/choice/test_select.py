"""HCCL_ALGO parsing and the algorithm chosen for a call."""

import pytest

from hccl_py.choice.names import parse_hccl_algo, resolve
from hccl_py.collectives import CallSpec
from hccl_py.errors import HcclNotSupportedError, HcclParamError


@pytest.mark.parametrize(
    "text, table",
    [
        ("", {}),
        ("level0:NA;level1:ring", {"*": "level1:ring"}),  # level 1 alone: auto's level 0, ring across servers
        ("level0:NA;level1:H-D_R", {"*": "level1:hd"}),
        ("level1:NHR", {"*": "level1:nhr"}),
        ("level0:NA;level1:NA", {"*": "auto"}),
        (
            "allreduce=level0:NA;level1:ring/allgather=level0:NA;level1:H-D_R",
            {"allreduce": "level1:ring", "allgather": "level1:hd"},
        ),
        ("allreduce=ring/allgather=mesh", {"allreduce": "ring", "allgather": "mesh"}),
        ("reducescatter=tree/broadcast=fullmesh", {"reduce_scatter": "tree", "broadcast": "mesh"}),
    ],
)
def test_parse_hccl_algo(text, table):
    assert parse_hccl_algo(text) == table


@pytest.mark.parametrize(
    "text, value, rule",
    [
        ("level1:bogus", "bogus", "choices"),  # an unknown algorithm
        ("levelX:ring", "levelX:ring", "format"),  # a part that cannot be read
        ("allreduz=ring", "allreduz=ring", "format"),
        ("allreduce", "allreduce", "choices"),
    ],
)
def test_malformed_hccl_algo_names_the_problem(text, value, rule):
    with pytest.raises(HcclParamError) as info:
        parse_hccl_algo(text)
    assert (info.value.variable, info.value.value, info.value.rule) == ("HCCL_ALGO", value, rule)


def _auto(level1: str | None = None) -> str:
    return "chosen-by-the-cost-model" if level1 is None else f"auto's level 0, {level1} across"


def test_env_choice_applies_to_auto_and_explicit_algo_wins():
    env = parse_hccl_algo("allreduce=mesh")
    assert resolve("allreduce", "auto", _auto, env) == "mesh"
    assert resolve("allreduce", "tree", _auto, env) == "tree"
    assert resolve("allgather", "auto", _auto, env) == _auto()  # not configured: automatic
    assert resolve("allreduce", "H-D_R", _auto, {}) == "hd"  # HCCL's names work as arguments too


def test_hccl_algorithm_hccl_py_lacks_is_refused_not_replaced():
    env = parse_hccl_algo("level0:NA;level1:NHR_V1")
    with pytest.raises(HcclNotSupportedError) as info:
        resolve("allreduce", "auto", _auto, env)
    assert (info.value.collective, info.value.algo, info.value.variable) == ("allreduce", "NHR_V1", "HCCL_ALGO")
    assert "ring" in info.value.choices  # what to use instead
    nhr = parse_hccl_algo("level0:NA;level1:NHR")  # NHR itself is an hccl-py algorithm
    assert resolve("allreduce", "auto", _auto, nhr) == "auto's level 0, nhr across"  # auto, told level 1
    assert resolve("allreduce", "auto", _auto, parse_hccl_algo("level0:fullmesh;level1:NHR")) == "hier:mesh/nhr"
    piped = parse_hccl_algo("level0:NA;level1:pipeline")  # HCCL's pipeline: level 0 is its mesh
    assert resolve("allgather", "auto", _auto, piped) == "hier:mesh/pipeline"
    assert resolve("broadcast", "auto", _auto, piped) == _auto(level1="hd")  # its operator resets a pipeline to H-D_R
    with pytest.raises(HcclNotSupportedError) as info:
        resolve("broadcast", "hier:mesh/pipeline", _auto, {})
    assert info.value.collective == "broadcast" and "allgather" in info.value.choices
    with pytest.raises(HcclNotSupportedError) as info:
        resolve("allreduce", "NB", _auto, {})
    assert (info.value.collective, info.value.algo, info.value.arg) == ("allreduce", "nb", "algo")
    assert resolve("allreduce", "pipeline", _auto, {}) == "hier:mesh/pipeline"  # HCCL's name for it
    assert resolve("allgather", "auto", _auto, parse_hccl_algo("allgather=pipeline")) == "hier:mesh/pipeline"


def test_unknown_algo_argument():
    with pytest.raises(HcclParamError) as info:
        resolve("allreduce", "fast", _auto, {})
    assert (info.value.collective, info.value.arg, info.value.value, info.value.rule) == (
        "allreduce",
        "algo",
        "fast",
        "choices",
    )


# ---------------------------------------------------------------------------------- HCCL's own rules

from hccl_py.algorithms.registry import algos_for  # noqa: E402
from hccl_py.choice.argmin import fastest  # noqa: E402
from hccl_py.choice.hccl_rules import CallShape, call_shape, hccl_choice  # noqa: E402
from hccl_py.choice.select import auto, explain_auto  # noqa: E402
from hccl_py.modeled.cost_model import CostModel  # noqa: E402
from hccl_py.modeled.simulator import simulate  # noqa: E402
from topology import Topology  # noqa: E402

KB, MB, GB = 1024, 1024 * 1024, 1024**3


@pytest.mark.parametrize(
    "preset, collective, nbytes, algo",
    [
        # one server: the topology decides (alg_configurator.cc), with the per-operator size rules
        ("ascend910b-8p", "allreduce", 64 * MB, "mesh"),  # 910B full HCCS mesh: NP mesh
        ("ascend910b-8p", "allgather", 8, "mesh"),
        ("ascend910-8p", "allreduce", 1 * MB, "hd"),  # 910, 8 NPUs, <= 1 MB: AllReduceDoubling
        ("ascend910-8p", "allreduce", 1 * MB + 4, "ring"),  # 910, 8 NPUs: 8P ring
        ("ascend910-8p", "reduce_scatter", 256 * KB, "hd"),  # 910 reduce-scatter <= 256 KB
        ("ascend910-8p", "reduce_scatter", 512 * KB, "ring"),
        ("ascend910-8p", "broadcast", 8, "ring"),
        ("pcie-4p", "allreduce", 256 * KB, "hd"),  # 310P, power of two, inline fp32 sum
        ("pcie-4p", "allreduce", 512 * KB, "ring"),
        ("mixed-4p", "allgather", 8, "ring"),  # standard PCIe cards: single ring
        # several servers: level 0 inside, level 1 across, on the partition by server
        ("2x8p-roce", "allreduce", 1 * MB, "hier:mesh/ring@server"),  # 910B, 2-3 servers: ring
        ("2x8p-roce", "allreduce", 64 * MB, "hier:mesh/pipeline@server"),  # >= 1 MB per slice: the pipeline
        ("2x8p-roce", "allgather", 4 * MB, "hier:mesh/pipeline@server"),  # >= 32 KB (2 MB without RDMA lite)
        ("4x8p-roce", "reduce_scatter", 4 * MB, "hier:mesh/pipeline@server"),
        (
            "2x2p-roce",
            "allreduce",
            64 * MB,
            "hier:mesh/pipeline@server",
        ),  # 2 NPUs per server too (all_reduce_operator.cc L437-446)
        ("3x8p-roce", "allgather", 8, "hier:mesh/ring@server"),
        ("4x8p-roce", "allreduce", 8 * MB, "hier:mesh/nhr@server"),  # 910B, >= 4 servers: NHR
        ("4x8p-roce", "allreduce", 2 * MB, "hier:mesh/tree@server"),  # ... <= 256 KiB per device: NHR one-shot = tree
        ("6x8p-roce", "allgather", 16 * KB, "hier:mesh/nhr@server"),  # ... also where H-D_R would fold
        ("5x1p-roce", "reduce_scatter", 8, "nhr"),  # one NPU per server: level 1 only
        ("3x8p-roce", "broadcast", 8, "hier:mesh/hd@server"),  # broadcast: no server ring, H-D_R
        ("3x8p-roce", "broadcast", 64 * MB, "hier:mesh/hd@server"),  # ... at every size (broadcast_operator.cc)
        ("3x8p-roce", "reduce", 64 * MB, "hier:mesh/ring@server"),  # reduce: GetDefaultAlgoLevel1V1, 3 servers: ring
        ("4x8p-roce", "reduce", 8, "hier:mesh/hd@server"),  # ... a power of two: H-D_R
        ("2x8p-roce-910", "allreduce", 8, "hier:ring/hd@server"),  # 910: power of two -> H-D_R
        ("3x8p-roce-910", "allreduce", 8, "hier:ring/ring@server"),  # 910: otherwise ring
        ("8x8p-roce-910", "allgather", 8, "hier:ring/hd@server"),  # 910: >= 8 servers -> H-D_R
        ("4x1p-roce", "allreduce", 8, "tree"),  # one NPU per server: level 1 only (one-shot)
        ("4x1p-roce", "allreduce", 1 * MB, "nhr"),
        ("4x8p-roce", "broadcast", 8, "hier:mesh/hd@server"),  # broadcast: ring or HD only, never NHR
        # all-to-all (alltoall_operator.cc SelectAlgforAlltoAll): no size rule below 200 MB
        ("ascend910b-8p", "alltoall", 1 * MB, "mesh"),  # RunAlltoAllDirectFullmesh
        ("pcie-4p", "alltoall", 8, "mesh"),  # 310P: DirectFullmesh
        ("mixed-4p", "alltoall", 8, "pairwise"),  # 910 PCIe cards: Staged with groups of one
        ("4x1p-roce", "alltoall", 64 * MB, "pairwise"),  # one rank per server: RunAlltoAllVFullMesh
        ("ascend910-8p", "alltoall", 8, "hier:mesh/pairwise@groups"),  # two 4P islands: RunAlltoAllVStaged
        ("2x8p-roce-910", "alltoall", 8, "hier:mesh/pairwise@groups"),  # 910 across servers: staged
        ("2x8p-roce", "alltoall", 64 * MB, "hier:mesh/pipeline@groups"),  # 910B: RunAlltoAllVTwoLevelPipeline
        ("1489x8p-roce", "alltoall", 8, "hier:mesh/pipeline@groups"),  # m(5(g-1)+8)+5+m <= 65535 tasks ...
        ("1490x8p-roce", "alltoall", 8, "hier:mesh/pairwise@groups"),  # ... past it: RunAlltoAllVStaged
        ("1490x8p-roce", "alltoallv", 8, "hier:mesh/pairwise@groups"),  # AlltoAllVC as AlltoAll: past the task limit
        # scatter (scatter_operator.cc): the topology decides; gather mirrors it (HCCL has no Gather)
        ("ascend910-8p", "scatter", 8, "ring"),  # 8P ring: ScatterRingExecutor
        ("ascend910b-8p", "scatter", 64 * MB, "mesh"),  # NP mesh: ScatterMeshExecutor
        ("pcie-4p", "scatter", 8, "ring"),  # 310P: ScatterCommExecutor
        ("4x1p-roce", "scatter", 8, "ring"),
        ("ascend910b-8p", "gather", 8, "mesh"),
        ("ascend910-8p", "gather", 64 * MB, "ring"),
        ("2x8p-roce", "scatter", 8, "hier:mesh/ring@server"),  # ring across the root's plane, then the server's
        ("2x8p-roce-910", "scatter", 64 * MB, "hier:ring/ring@server"),
        ("2x8p-roce", "gather", 8, "hier:mesh/ring@server"),
    ],
)
def test_auto_follows_hccls_rules(preset, collective, nbytes, algo):
    topo = Topology.preset(preset)
    model = CostModel(topo)
    count = nbytes // 4
    assert auto(model, CallSpec.of(collective, count), tuple(range(topo.num_ranks))) == algo


def test_hccl_level1_tie_breaking_and_unequal_servers():
    # "if same cost, Ring > NHR > HD": 2 servers tie ring and HD; 3 servers tie ring and NHR
    for m in (2, 3):
        shape = CallShape("allreduce", 4 * MB, "ascend910b", m, 8, "mesh")
        assert hccl_choice(shape).algo == "hier:mesh/ring@server"
    shape = CallShape("allreduce", 8, "ascend910b", 2, None, "mesh")
    assert hccl_choice(shape).algo == "ring" and "different NPU counts" in hccl_choice(shape).rule
    big = hccl_choice(CallShape("allgather", 64 * MB, "ascend910b", 4, 8, "mesh"))
    assert big.algo == "hier:mesh/pipeline@server" and not big.estimate
    lite = hccl_choice(CallShape("allgather", 64 * KB, "ascend910b", 4, 8, "mesh"))
    assert lite.algo == big.algo and lite.estimate and "RDMA lite" in lite.rule  # 32 KB - 2 MB: depends on the NIC
    assert hccl_choice(CallShape("allgather", 32 * KB - 4, "ascend910b", 4, 8, "mesh")).algo == "hier:mesh/nhr@server"
    prod = CallShape("reduce_scatter", 64 * MB, "ascend910b", 4, 8, "mesh", "float32", "prod")
    assert hccl_choice(prod).algo == "hier:mesh/nhr@server"  # no SDMA/RDMA reduce for prod: no pipeline
    assert (
        hccl_choice(CallShape("reduce_scatter", 64 * MB, "ascend910b", 4, 8, "mesh", "float64")).algo
        == "hier:mesh/nhr@server"
    )
    assert (
        hccl_choice(CallShape("allgather", 64 * MB, "ascend910b", 4, 8, "mesh", "float64")).algo == big.algo
    )  # no reduction
    # more tasks than HCCL_FFTS_CAPACITY (m(5(g-1)+8)+5 > 65535): the pipeline is not chosen, the alpha-beta comparison is
    assert hccl_choice(CallShape("allgather", 64 * MB, "ascend910b", 1523, 8, "mesh")).algo == big.algo
    assert hccl_choice(CallShape("allgather", 64 * MB, "ascend910b", 1524, 8, "mesh")).algo == "hier:mesh/nhr@server"
    assert hccl_choice(CallShape("allreduce", 64 * GB, "ascend910b", 761, 8, "mesh")).algo == big.algo
    assert hccl_choice(CallShape("allreduce", 64 * GB, "ascend910b", 762, 8, "mesh")).algo == "hier:mesh/nhr@server"
    small = hccl_choice(CallShape("allreduce", 8 * 256 * KB, "ascend910b", 4, 8, "mesh"))
    assert small.algo == "hier:mesh/tree@server" and "one-shot" in small.rule and not small.estimate
    assert (
        hccl_choice(CallShape("allreduce", 8 * 256 * KB + 8, "ascend910b", 4, 8, "mesh")).algo == "hier:mesh/nhr@server"
    )
    # below 512 KB on servers of 3+ NPUs: HCCL's small-count executor, whole buffers by doubling
    # inside and across (a power of two of servers), else the level-1 setting's segmented algorithm
    tiny = hccl_choice(CallShape("allreduce", 256 * KB, "ascend910b", 4, 8, "mesh"))
    assert tiny.algo == "hier:rd/rd@server" and not tiny.estimate and "SmallCount" in tiny.rule
    assert hccl_choice(CallShape("allreduce", 8, "ascend910b", 3, 8, "mesh")).algo == "hier:rd/ring@server"
    assert (
        hccl_choice(CallShape("allreduce", 8, "ascend910b", 5, 8, "mesh")).algo == "hier:rd/nhr@server"
    )  # not one-shot
    six = hccl_choice(CallShape("allreduce", 8, "ascend910b", 4, 6, "mesh"))  # 6 NPUs: gather, fold, broadcast inside
    assert (
        six.algo == "hier:localreducebcast/rd@server" and not six.estimate and "AllReduceLocalReduceBcast" in six.rule
    )
    assert (
        hccl_choice(CallShape("allreduce", 8, "ascend910b", 3, 6, "mesh")).algo == "hier:localreducebcast/ring@server"
    )
    pair = hccl_choice(CallShape("allreduce", 8, "ascend910b", 4, 2, "mesh"))  # 2 NPUs per server: the one-shot
    assert pair.algo == "hier:mesh/tree@server" and not pair.estimate
    assert hccl_choice(CallShape("allreduce", 512 * KB, "ascend910b", 4, 8, "mesh")).algo == "hier:mesh/tree@server"


def test_910b_small_reduce_scatter_across_servers_goes_across_first():
    """reduce_scatter_operator.cc L305-317: below 512 KB in all (and not the pipeline), across
    910B servers with an inline reduce, HCCL's small-count executor: the level-1 algorithm
    across servers first, then HD-stage (4 or 8 NPUs) or NHR inside."""
    cases = (
        (2, 8, 8, "hier:hd/ring-first@server"),
        (2, 8, 32 * KB - 4, "hier:hd/ring-first@server"),
        (4, 8, 1 * KB, "hier:hd/nhr-first@server"),
        (3, 6, 1 * KB, "hier:nhr/ring-first@server"),
        (2, 2, 1 * KB, "hier:nhr/ring-first@server"),
        (2, 8, 32 * KB, "hier:mesh/pipeline@server"),
    )
    for servers, g, nbytes, algo in cases:
        choice = hccl_choice(CallShape("reduce_scatter", nbytes, "ascend910b", servers, g, "mesh"))
        assert choice.algo == algo, (servers, g, nbytes)
        assert ("SmallCountDeterministicExecutor" in choice.rule) == algo.endswith("-first@server")
    # no inline reduce (prod): the inner-first two-level algorithm
    assert (
        hccl_choice(CallShape("reduce_scatter", 8, "ascend910b", 2, 8, "mesh", op="prod")).algo
        == "hier:mesh/ring@server"
    )
    assert not hccl_choice(CallShape("reduce_scatter", 8, "ascend910", 2, 8, "islands")).algo.endswith("-first@server")


def test_hccl_deterministic_changes_what_910b_allreduce_and_reduce_scatter_run():
    """HCCL_DETERMINISTIC (all_reduce_operator.cc DeterministicSelector, reduce_scatter_operator.cc
    L287-317, coll_alg_operator.cc GetDefaultAlgoLevel1V2 L529-569); allgather is unaffected."""

    def pick(collective, nbytes, servers, g, mode, dtype="float32"):
        return hccl_choice(CallShape(collective, nbytes, "ascend910b", servers, g, "mesh", dtype, deterministic=mode))

    # one server, <= 128 KB: recursive doubling with 8 NPUs, else gather-fold-broadcast (reducebcast standing in)
    assert pick("allreduce", 64 * KB, 1, 8, "false").algo == "reducebcast"
    eight = pick("allreduce", 64 * KB, 1, 8, "true")
    assert eight.algo == "rd" and not eight.estimate and "DOUBLING_DIRECT" in eight.rule
    six = pick("allreduce", 64 * KB, 1, 6, "true")
    assert six.algo == "localreducebcast" and not six.estimate
    assert pick("allreduce", 4 * MB, 1, 8, "true").algo == "mesh" and pick("allreduce", 4 * MB, 1, 8, "true").estimate
    strict = pick("allreduce", 64 * KB, 1, 8, "strict")
    assert strict.estimate and "OrderPreserved" in strict.rule
    assert not pick("allreduce", 64 * KB, 1, 8, "strict", "int32").estimate  # integers: no order to preserve
    # across servers: the small-count executor up to and including 512 KB, then the mid-count one
    assert pick("allreduce", 512 * KB, 2, 8, "false").algo == "hier:mesh/ring@server"
    assert pick("allreduce", 512 * KB, 2, 8, "true").algo == "hier:rd/rd@server"
    mid = pick("allreduce", 4 * MB, 2, 8, "true")
    assert mid.algo == "hier:mesh/ring@server" and mid.estimate and "MidCountDeterministic" in mid.rule
    # the deterministic pipeline: allreduce from 1 MB a slice with no RDMA-lite doubt, reduce_scatter from 256 KB;
    # strict takes neither
    piped = pick("allreduce", 24 * MB, 2, 8, "true")  # 1.5 MB a slice
    assert (
        piped.algo == "hier:mesh/pipeline@server" and "Deter pipeline" in piped.rule and "RDMA lite" not in piped.rule
    )
    assert "RDMA lite" in pick("allreduce", 24 * MB, 2, 8, "false").rule
    assert pick("allreduce", 64 * MB, 2, 8, "strict").algo == "hier:mesh/ring@server"
    assert pick("reduce_scatter", 64 * KB, 2, 8, "false").algo == "hier:mesh/pipeline@server"
    assert pick("reduce_scatter", 64 * KB, 2, 8, "true").algo == "hier:hd/ring-first@server"  # <= 512 KB a rank
    assert pick("reduce_scatter", 600 * KB, 2, 8, "true").algo == "hier:mesh/pipeline@server"
    assert pick("reduce_scatter", 64 * KB, 2, 8, "strict").algo == "hier:mesh/ring@server"
    # one server's reduce_scatter: HD-stage up to 32 KB a rank with 4 or 8 NPUs
    assert pick("reduce_scatter", 32 * KB, 1, 8, "true").algo == "hd"
    assert pick("reduce_scatter", 64 * KB, 1, 8, "true").algo == "mesh"
    assert pick("allgather", 64 * KB, 2, 8, "true").algo == pick("allgather", 64 * KB, 2, 8, "false").algo
    # servers of 2 NPUs: level 1 is set to the pipeline, but the Deter executors need more than 2 NPUs
    pair = pick("allreduce", 8 * MB, 2, 2, "true")
    assert pair.algo == "hier:mesh/hd@server" and not pair.estimate and "H-D_R" in pair.rule
    assert pick("reduce_scatter", 300 * KB, 2, 2, "true").algo == "hier:nhr/hd-first@server"  # small count, level 1 HD
    assert pick("reduce_scatter", 600 * KB, 2, 2, "true").algo == "hier:mesh/hd@server"
    assert pick("allreduce", 64 * KB, 1, 2, "true").algo == "localreducebcast"  # MeshTopoSelector's small count
    assert pick("reduce_scatter", 64 * KB, 1, 2, "true").algo == "mesh"  # ReduceScatterDeterExecutor, any NPU count
    # strict: the order-preserved executors of fp16/fp32/bf16 on more than 2 ranks, ahead of every rule
    for collective, servers, g in (("allreduce", 2, 2), ("reduce_scatter", 2, 8), ("reduce_scatter", 1, 8)):
        rule = pick(collective, 16 * KB, servers, g, "strict")
        assert rule.estimate and "OrderPreservedExecutor" in rule.rule, (collective, servers, g)
    # the deterministic pipelines count g-1 local reduces a step and m-1 at the end: fewer servers fit
    assert pick("allreduce", 761 * 8 * 2 * MB, 761, 8, "false").algo == "hier:mesh/pipeline@server"
    assert pick("allreduce", 761 * 8 * 2 * MB, 761, 8, "true").algo != "hier:mesh/pipeline@server"


def test_910b_small_allreduce_in_one_server_reduces_to_one_npu_and_broadcasts():
    """all_reduce_operator.cc NonDeterministicSelector L557-560: <= 256 KB with an inline reduce ->
    AllReduceMeshSmallCountExecutor -> AllReduceReduceBcast; beyond it, or without the inline
    reduce, the mesh."""
    for nbytes, dtype, op, algo in (
        (8, "float32", "sum", "reducebcast"),
        (256 * KB, "bfloat16", "max", "reducebcast"),
        (256 * KB + 4, "float32", "sum", "mesh"),
        (8, "float64", "sum", "mesh"),
        (8, "float32", "prod", "mesh"),
    ):
        choice = hccl_choice(CallShape("allreduce", nbytes, "ascend910b", 1, 8, "mesh", dtype, op))
        assert choice.algo == algo and not choice.estimate, (nbytes, dtype, op)
    assert "AllReduceReduceBcast" in hccl_choice(CallShape("allreduce", 8, "ascend910b", 1, 8, "mesh")).rule


def test_call_shape_reads_the_topology():
    topo = Topology.preset("2x8p-roce-910")
    shape = call_shape(topo, "allreduce", 10, 4, tuple(range(16)))
    assert (shape.servers, shape.per_server, shape.level0_topo, shape.card, shape.nbytes) == (
        2,
        8,
        "islands",
        "ascend910",
        40,
    )
    assert call_shape(topo, "allreduce", 10, 4, (0, 1, 2, 3)).level0_topo == "mesh"
    assert call_shape(Topology.preset("mixed-4p"), "allreduce", 1, 4, (0, 1, 2, 3)).level0_topo == "pcie"


@pytest.mark.parametrize("preset", ["ascend910-8p", "mixed-4p", "ascend910b-8p", "2x4p-roce"])
@pytest.mark.parametrize("collective", ["allreduce", "allgather", "reduce_scatter", "broadcast", "reduce"])
def test_pruned_argmin_picks_what_full_evaluation_picks(preset, collective):
    topo = Topology.preset(preset)
    ranks = tuple(range(topo.num_ranks))
    for count in (1, 100, 40_000, 1 << 20):
        model = CostModel(topo)
        full = {
            a: simulate(collective, a, topo, count, itemsize=4, cost_model=model).time_s for a in algos_for(collective)
        }
        best = min(full.values())
        expected = next(a for a in algos_for(collective) if full[a] == best)  # ties: ALL_ALGOS order
        assert fastest(model, collective, count, 4, ranks) == expected, (collective, count, full)


def test_explain_auto_says_estimate_where_no_rule_applies():
    topo = Topology.preset("ascend910-8p", n=6)  # a 910 server with 6 NPUs: HCCL takes 1, 2, 4 or 8
    choice = explain_auto(CostModel(topo), CallSpec.of("allgather", 100), tuple(range(6)))
    assert choice.algo == "ring" and choice.estimate and "estimate" in choice.rule


def test_alltoallv_auto_follows_the_alltoall_rule():
    from hccl_py.choice.select import alltoallv_auto

    assert alltoallv_auto(Topology.preset("ascend910b-8p"), tuple(range(8))).algo == "mesh"
    assert alltoallv_auto(Topology.preset("4x1p-roce"), tuple(range(4))).algo == "pairwise"
    two = Topology.preset("2x8p-roce"), tuple(range(16))
    chosen = alltoallv_auto(*two)  # AlltoAllVC: the two-level pipeline, as AlltoAll
    assert chosen.algo == "hier:mesh/pipeline@groups" and not chosen.estimate
    # AlltoAllV (counts exchanged): the continuous pipeline, with no task limit (alltoall_operator.cc L725-751)
    for topo, ranks in (two, (Topology.preset("1490x8p-roce"), tuple(range(1490 * 8)))):
        chosen = alltoallv_auto(topo, ranks, exchange=True)
        assert chosen.algo == "hier:mesh/continuous@groups" and not chosen.estimate
        assert "RunAlltoAllVContinuousPipeline" in chosen.rule
    # ... only on 910B servers of two or more NPUs, and not when HCCL_ALGO names NHR for level 1
    assert alltoallv_auto(Topology.preset("4x1p-roce"), tuple(range(4)), exchange=True).algo == "pairwise"
    assert (
        alltoallv_auto(Topology.preset("2x8p-roce-910"), tuple(range(16)), exchange=True).algo
        == "hier:mesh/pairwise@groups"
    )
    assert alltoallv_auto(*two, "nhr", exchange=True).algo == "hier:mesh/pairwise@groups"
    assert alltoallv_auto(Topology.preset("ascend910b-8p"), tuple(range(8)), exchange=True).algo == "mesh"
    from hccl_py.choice.hccl_rules import alltoall_rule

    exact = alltoall_rule(
        CallShape("alltoall", 1 * MB, "ascend910b", 2, 8, "mesh")
    )  # 16 MB a rank: the CCL buffer holds it
    assert exact.algo == "hier:mesh/pipeline@groups" and not exact.estimate
    big = alltoall_rule(CallShape("alltoall", 16 * MB, "ascend910b", 2, 8, "mesh"))  # 256 MB a rank: ping-pong template
    assert big.algo == exact.algo and big.estimate and "ping-pong" in big.rule
    # islands of different sizes (a 910 server with 6 NPUs: 4 + 2): pairwise over all ranks, an estimate
    uneven = alltoallv_auto(Topology.preset("ascend910-8p", n=6), tuple(range(6)))
    assert uneven.algo == "pairwise" and uneven.estimate


def test_the_staged_alltoall_is_hccls_on_its_groups_and_refuses_uneven_ones():
    from hccl_py.algorithms import alltoall_staged
    from hccl_py.choice.names import partition_of

    topo = Topology.preset("2x8p-roce-910")
    assert partition_of(topo, "hier:mesh/pairwise@groups", tuple(range(16))) == tuple(
        tuple(range(i, i + 4)) for i in range(0, 16, 4)
    )  # the 910's 4P islands, across both servers
    assert partition_of(Topology.preset("2x8p-roce"), "hier:mesh/pairwise@groups", tuple(range(16))) == (
        tuple(range(8)),
        tuple(range(8, 16)),
    )
    with pytest.raises(HcclParamError) as info:
        alltoall_staged.schedule_for(((0, 1, 2), (3, 4)))
    assert info.value.rule == "equal groups"
    with pytest.raises(HcclParamError):
        alltoall_staged.schedule_for(((0, 1), (2, 3)), inner="ring")


def test_hccl_algo_naming_level_1_alone_keeps_hccls_level_0():
    """``level0:NA;level1:X``: HCCL keeps its level-0 choice and runs X across servers; inside one
    server level 1 does not apply; X that hccl-py lacks for the collective's level 1 is refused."""
    two = Topology.preset("4x8p-roce")
    model = CostModel(two)
    ranks = tuple(range(two.num_ranks))
    assert (
        auto(model, CallSpec.of("allgather", 1 << 20), ranks, level1="ring") == "hier:mesh/ring@server"
    )  # not the pipeline
    assert auto(model, CallSpec.of("allreduce", 1 << 20), ranks, level1="hd") == "hier:mesh/hd@server"
    assert auto(model, CallSpec.of("allreduce", 1 << 20), ranks, level1="nhr") == "hier:mesh/nhr@server"
    assert (
        auto(model, CallSpec.of("allreduce", 8), ranks, level1="ring") == "hier:rd/rd@server"
    )  # HCCL's small count: doubling
    one = Topology.preset("ascend910b-8p")
    assert (
        auto(CostModel(one), CallSpec.of("allreduce", 1 << 20), tuple(range(8)), level1="ring") == "mesh"
    )  # one server
    flat = Topology.preset("5x1p-roce")
    assert auto(CostModel(flat), CallSpec.of("reduce_scatter", 1 << 20), tuple(range(5)), level1="ring") == "ring"
    with pytest.raises(HcclNotSupportedError) as info:
        auto(model, CallSpec.of("broadcast", 1 << 20), ranks, level1="nhr")  # HCCL has NHR broadcast, hccl-py not
    assert (info.value.collective, info.value.algo, info.value.variable) == ("broadcast", "nhr", "HCCL_ALGO")
    assert (
        auto(model, CallSpec.of("alltoall", 1 << 10), ranks, level1="ring") == "hier:mesh/pipeline@groups"
    )  # HCCL's rule
    assert (
        auto(model, CallSpec.of("alltoall", 1 << 10), ranks, level1="nhr") == "hier:mesh/pairwise@groups"
    )  # no pipeline with NHR
    assert (
        auto(model, CallSpec.of("broadcast", 1 << 20), ranks, level1="ring") == "hier:mesh/hd@server"
    )  # broadcast resets to H-D_R
    assert (
        auto(model, CallSpec.of("reduce", 1 << 20), ranks, level1="nhr") == "hier:mesh/hd@server"
    )  # reduce: NHR becomes H-D_R
    with pytest.raises(HcclNotSupportedError) as info:
        auto(model, CallSpec.of("scatter", 1 << 10), ranks, level1="nhr")  # HCCL's scatter runs NHR across servers
    assert (info.value.collective, info.value.algo) == ("scatter", "nhr")
    assert (
        auto(CostModel(one), CallSpec.of("scatter", 1 << 10), tuple(range(8)), level1="nhr") == "mesh"
    )  # one server: no level 1
    from hccl_py.choice.select import alltoallv_auto

    assert alltoallv_auto(two, ranks, "nhr").algo == "hier:mesh/pairwise@groups"  # AlltoAllV as AlltoAll
    # HCCL ignores level 0 set alone; a pipeline named for broadcast or reduce is reset to H-D_R
    assert parse_hccl_algo("level0:ring;level1:NA") == {"*": "auto"} and parse_hccl_algo("level0:ring") == {"*": "auto"}
    assert resolve("reduce", "auto", _auto, parse_hccl_algo("level0:NA;level1:pipeline")) == "auto's level 0, hd across"
    assert (
        auto(CostModel(Topology.preset("3x8p-roce-910")), CallSpec.of("broadcast", 1 << 20), tuple(range(24)))
        == "hier:ring/hd@server"
    )
    # HCCL ignores fullmesh and pairwise at level 1; hccl-py's own names keep their flat meaning
    assert parse_hccl_algo("level0:NA;level1:fullmesh") == {"*": "auto"}
    assert parse_hccl_algo("level0:NA;level1:pairwise") == {"*": "pairwise"}
    assert parse_hccl_algo("level0:NA;level1:rd") == {"*": "rd"}
