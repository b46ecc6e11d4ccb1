"""HCCL_ALGO parsing and the algorithm chosen for a call."""

import pytest

from hccl_py.algo_select import parse_hccl_algo, resolve
from hccl_py.errors import HcclNotSupportedError, HcclParamError


@pytest.mark.parametrize(
    "text, table",
    [
        ("", {}),
        ("level0:NA;level1:ring", {"*": "ring"}),
        ("level0:NA;level1:H-D_R", {"*": "hd"}),
        ("level0:NA;level1:NA", {"*": "auto"}),
        ("allreduce=level0:NA;level1:ring/allgather=level0:NA;level1:H-D_R", {"allreduce": "ring", "allgather": "hd"}),
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


def _auto() -> str:
    return "chosen-by-the-cost-model"


def test_env_choice_applies_to_auto_and_explicit_algo_wins():
    env = parse_hccl_algo("allreduce=mesh")
    assert resolve("allreduce", "auto", _auto, env) == "mesh"
    assert resolve("allreduce", "tree", _auto, env) == "tree"
    assert resolve("allgather", "auto", _auto, env) == _auto()  # not configured: automatic
    assert resolve("allreduce", "H-D_R", _auto, {}) == "hd"  # HCCL's names work as arguments too


def test_hccl_algorithm_hccl_py_lacks_is_refused_not_replaced():
    env = parse_hccl_algo("level0:NA;level1:NHR")
    with pytest.raises(HcclNotSupportedError) as info:
        resolve("allreduce", "auto", _auto, env)
    assert (info.value.collective, info.value.algo, info.value.variable) == ("allreduce", "NHR", "HCCL_ALGO")
    assert "ring" in info.value.choices  # what to use instead
    with pytest.raises(HcclNotSupportedError) as info:
        resolve("allreduce", "pipeline", _auto, {})
    assert (info.value.collective, info.value.algo, info.value.arg) == ("allreduce", "pipeline", "algo")


def test_unknown_algo_argument():
    with pytest.raises(HcclParamError) as info:
        resolve("allreduce", "fast", _auto, {})
    assert (info.value.collective, info.value.arg, info.value.value, info.value.rule) == ("allreduce", "algo", "fast", "choices")
