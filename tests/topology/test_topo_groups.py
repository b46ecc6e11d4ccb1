"""Group partitions: HCCL's automatic rule on each preset, manual parsing, and validation errors."""

import json

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from topology import PRESETS, Topology, TopologyError, auto_partition, load_partition, validate_partition


@pytest.mark.parametrize(
    "name, n, expected",
    [
        ("ascend910-8p", None, [[0, 1, 2, 3], [4, 5, 6, 7]]),
        ("ascend910-8p", 4, [[0, 1, 2, 3]]),
        ("ascend910-8p", 6, [[0, 1, 2, 3], [4, 5]]),
        ("ascend910b-8p", None, [list(range(8))]),
        ("pcie-4p", None, [[0, 1], [2, 3]]),
        ("pcie-4p", 3, [[0, 1], [2]]),
        ("mixed-4p", None, [[0, 1], [2, 3]]),  # HCCL misses the fast pair {1, 2}
        ("2x8p-roce", None, [list(range(8)), list(range(8, 16))]),
        ("2x8p-roce-910", None, [[0, 1, 2, 3], [4, 5, 6, 7], [8, 9, 10, 11], [12, 13, 14, 15]]),
        ("2x8p-roce", 12, [list(range(8)), [8, 9, 10, 11]]),
    ],
)
def test_auto_partition_on_presets(name, n, expected):
    assert auto_partition(Topology.preset(name, n=n)) == expected


def test_auto_partition_of_chosen_ranks():
    topo = Topology.preset("ascend910-8p")
    assert auto_partition(topo, [5, 4, 1, 0]) == [[1, 0], [5, 4]]
    assert auto_partition(topo, [0, 1, 2]) == [[0, 1, 2]]
    assert auto_partition(Topology.preset("mixed-4p"), np.array([3, 1, 2])) == [[3, 1], [2]]
    for bad in ([0, 0], [8], [], ["1"], [1.0]):
        with pytest.raises(TopologyError) as info:
            auto_partition(topo, bad)
        assert info.value.field == "ranks"


@settings(max_examples=60, deadline=None)
@given(st.sampled_from(sorted(PRESETS)[:6]), st.data())
def test_auto_partition_is_always_a_valid_partition(name, data):
    topo = Topology.preset(name)
    ranks = data.draw(st.lists(st.integers(0, topo.num_ranks - 1), min_size=1, unique=True))
    groups = auto_partition(topo, ranks)
    assert sorted(r for g in groups for r in g) == sorted(ranks)
    assert all(groups)
    remap = {r: i for i, r in enumerate(sorted(ranks))}
    validate_partition([[remap[r] for r in g] for g in groups], len(ranks))


def test_manual_partition_parsing(tmp_path):
    assert load_partition("0,2;1,3") == [[0, 2], [1, 3]]
    assert load_partition(" 0 , 1 ; 2 ,3 ") == [[0, 1], [2, 3]]
    assert load_partition("[[1, 2], [0, 3]]", num_ranks=4) == [[1, 2], [0, 3]]
    as_json = tmp_path / "groups.json"
    as_json.write_text(json.dumps([[0, 3], [1, 2]]))
    assert load_partition(as_json) == [[0, 3], [1, 2]] and load_partition(str(as_json), 4) == [[0, 3], [1, 2]]
    as_text = tmp_path / "groups.txt"
    as_text.write_text("0,1;2,3\n")
    assert load_partition(as_text) == [[0, 1], [2, 3]]


@pytest.mark.parametrize(
    "text, fieldname, rule, value",
    [
        ("0,a;1", "groups[0]", "type", "a"),
        ("0,1;", "groups[1]", "nonempty", None),
        ("", "groups", "nonempty", None),
        ("0,,1", "groups[0]", "type", ""),
        ("1.5;0", "groups[0]", "type", "1.5"),
        ("[[0, 1], 2]", "groups", "type", None),
        ("[[0, 1]", "groups", "json", None),
        ("[[0, true]]", "groups[0]", "type", True),
    ],
)
def test_manual_partition_syntax_errors(text, fieldname, rule, value):
    with pytest.raises(TopologyError) as info:
        load_partition(text)
    assert (info.value.field, info.value.rule, info.value.value, info.value.code) == (fieldname, rule, value, 1)


def test_missing_groups_file(tmp_path):
    with pytest.raises(TopologyError) as info:
        load_partition(tmp_path / "nope.json")
    assert (info.value.field, info.value.rule, info.value.path) == ("groups", "file", str(tmp_path / "nope.json"))
    with pytest.raises(TopologyError):
        load_partition(42)  # type: ignore[arg-type]


def test_validate_partition_normalizes():
    assert validate_partition(((0, 2), [np.int64(1), 3]), 4) == [[0, 2], [1, 3]]
    assert all(type(r) is int for g in validate_partition([np.array([1, 0])], 2) for r in g)


@pytest.mark.parametrize(
    "groups, num_ranks, fieldname, facts",
    [
        ([[0, 3], [1], [2, 3]], 4, "groups[2]", {"rule": "unique", "value": 3, "holder": "groups[0]"}),
        ([[0, 0], [1]], 2, "groups[0]", {"rule": "unique", "value": 0, "holder": "groups[0]"}),
        ([[0, 1], []], 2, "groups[1]", {"rule": "nonempty"}),
        ([[0, 4], [1, 2, 3]], 4, "groups[0]", {"rule": "range", "value": 4, "expected": "0..3"}),
        ([[0, -1]], 2, "groups[0]", {"rule": "range", "value": -1, "expected": "0..1"}),
        ([[0], [2]], 4, "groups", {"rule": "complete", "missing_ranks": [1, 3]}),
        ([[0]], 2, "groups", {"rule": "complete", "missing_ranks": [1]}),
        ([], 2, "groups", {"rule": "nonempty"}),
        ([[0, 1.0]], 2, "groups[0]", {"rule": "type", "value": 1.0, "expected": "int"}),
        ([[0, "1"]], 2, "groups[0]", {"rule": "type", "value": "1", "expected": "int"}),
        ([[0, True]], 2, "groups[0]", {"rule": "type", "value": True, "expected": "int"}),
        ([0, 1], 2, "groups[0]", {"rule": "type", "value": 0, "expected": "list"}),
        ("0,1", 2, "groups", {"rule": "type", "expected": "list"}),
        ([[0, 1]], 0, "num_ranks", {"rule": "range", "value": 0, "expected": ">= 1"}),
    ],
)
def test_validate_partition_errors(groups, num_ranks, fieldname, facts):
    with pytest.raises(TopologyError) as info:
        validate_partition(groups, num_ranks)
    assert info.value.field == fieldname and info.value.code == 1
    assert {name: getattr(info.value, name) for name in facts} == facts


def test_validate_partition_without_num_ranks_takes_the_ranks_listed():
    assert validate_partition(((1, 2), [np.int64(0), 3])) == [[1, 2], [0, 3]]


@pytest.mark.parametrize(
    "groups, facts",
    [
        ([[0, 1], [3]], {"field": "groups[1]", "value": 3, "rule": "range", "expected": "0..2"}),
        ([[0, -1]], {"field": "groups[0]", "value": -1, "rule": "range"}),
        ([[0, 1], [1]], {"field": "groups[1]", "rule": "unique"}),
        ([], {"field": "groups", "rule": "nonempty"}),
    ],
)
def test_validate_partition_without_num_ranks_errors(groups, facts):
    with pytest.raises(TopologyError) as info:
        validate_partition(groups)
    assert info.value.code == 1
    assert {name: getattr(info.value, name) for name in facts} == facts
