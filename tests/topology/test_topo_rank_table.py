"""Rank tables: round trips, every validation error (its field and the check it failed), and a fuzzed parser."""

import copy
import json

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from topology import RankInfo, RankTable, Topology, TopologyError


def table_doc(servers=2, per=2, version="1.0"):
    """A valid rank-table document: ``servers`` x ``per`` devices, ranks numbered server by server."""
    doc = {"version": version, "server_count": str(servers), "server_list": [], "status": "completed"}
    for s in range(servers):
        devices = []
        for d in range(per):
            dev = {"device_id": str(d), "device_ip": f"192.168.{100 + d}.{s + 1}", "rank_id": str(s * per + d)}
            if version == "1.2":
                dev["super_device_id"] = str(1000 + s * per + d)
            devices.append(dev)
        doc["server_list"].append({"server_id": f"10.0.0.{s + 1}", "host_ip": f"10.0.0.{s + 1}", "device": devices})
    if version == "1.2":
        doc["super_pod_list"] = [
            {"super_pod_id": "0", "server_list": [{"server_id": f"10.0.0.{s + 1}"} for s in range(servers)]}
        ]
    return doc


def rejected(doc):
    with pytest.raises(TopologyError) as info:
        RankTable.from_dict(doc)
    # Every rank-table message ends with a fix for the person who reads it (HCCL's EI report style).
    assert info.value.code == 1 and "Fix:" in str(info.value)
    return info.value


# ------------------------------------------------------------------ good tables


@pytest.mark.parametrize("version", ["1.0", "1.2"])
def test_round_trip(version, tmp_path):
    doc = table_doc(version=version)
    table = RankTable.from_dict(doc)
    assert table.to_dict() == doc
    assert RankTable.loads(table.dumps()) == table
    path = tmp_path / "rank_table.json"
    table.dump(path)
    assert RankTable.load(path) == table and RankTable.load(str(path)).to_dict() == doc


@pytest.mark.parametrize("version", ["1.0", "1.2"])
def test_generated_tables_round_trip(version):
    table = Topology.preset("2x8p-roce", n=12).to_rank_table(version)
    assert table.version == version and table.num_ranks == 12 and table.server_count == 2
    assert RankTable.loads(table.dumps()) == table
    if version == "1.2":
        assert table.super_pods[0].server_ids == (table.servers[0].server_id, table.servers[1].server_id)


def test_views():
    table = RankTable.from_dict(table_doc())
    assert table.num_ranks == 4 and table.server_count == 2 and len(table.servers) == 2
    assert table.ranks[3] == RankInfo(3, 1, 1, "192.168.101.2", "10.0.0.2")
    rank_id, server_index, device_id, device_ip, host_ip = table.ranks[0]
    assert (rank_id, server_index, device_id) == (0, 0, 0)


def test_unknown_keys_are_kept_and_optional_keys_optional():
    doc = table_doc(servers=1)
    doc["server_list"][0]["container_ip"] = "192.168.149.101"
    doc["server_list"][0]["hardware_type"] = "800I-A2-32G"
    doc["server_list"][0]["device"][0]["device_logical_id"] = "0"
    del doc["server_list"][0]["host_ip"]
    for dev in doc["server_list"][0]["device"]:
        del dev["device_ip"]  # optional on a single server
    doc["group_count"] = "1"
    table = RankTable.from_dict(doc)
    assert table.to_dict() == doc and table.servers[0].host_ip is None and table.ranks[0].device_ip is None


def test_ranks_may_be_listed_out_of_order_within_a_server():
    doc = table_doc(servers=1, per=3)
    devices = doc["server_list"][0]["device"]
    devices[0]["rank_id"], devices[2]["rank_id"] = "2", "0"
    assert [r.device_id for r in RankTable.from_dict(doc).ranks] == [2, 1, 0]


def test_ipv6_addresses_are_valid():
    doc = table_doc()
    doc["server_list"][0]["host_ip"] = "fe80::1"
    doc["server_list"][0]["device"][0]["device_ip"] = "2001:db8::7"
    assert RankTable.from_dict(doc).ranks[0].device_ip == "2001:db8::7"


# ------------------------------------------------------------------ every validation error


def test_duplicate_rank_id():
    doc = table_doc()
    doc["server_list"][1]["device"][0]["rank_id"] = "1"
    err = rejected(doc)
    assert (err.field, err.value, err.rule, err.holder) == (
        "server_list[1].device[0].rank_id",
        "1",
        "unique",
        "server_list[0].device[1]",
    )
    assert err.error_id == "EI0014"


def test_missing_rank_id():
    doc = table_doc()
    del doc["server_list"][0]["device"][1]["rank_id"]
    err = rejected(doc)
    assert (err.field, err.rule, err.error_id) == ("server_list[0].device[1].rank_id", "required", "EI0004")


def test_rank_ids_must_be_0_to_n_minus_1():
    doc = table_doc()
    doc["server_list"][1]["device"][1]["rank_id"] = "7"
    err = rejected(doc)
    assert (err.field, err.value, err.rule, err.expected) == ("server_list[1].device[1].rank_id", "7", "range", "0..3")
    assert err.missing_ranks == [3]


def test_ranks_interleaved_across_servers():
    doc = table_doc()
    doc["server_list"][0]["device"][1]["rank_id"] = "2"
    doc["server_list"][1]["device"][0]["rank_id"] = "1"
    err = rejected(doc)
    assert (err.field, err.rule, err.value) == ("server_list[0].device", "consecutive", ["0", "2"])
    assert err.holder == "server_list[1].device[0]"  # where rank 1, the gap, sits


def test_status_must_be_completed():
    doc = table_doc()
    doc["status"] = "initializing"
    err = rejected(doc)
    assert (err.field, err.value, err.rule, err.expected) == ("status", "initializing", "const", "completed")


def test_server_count_mismatch():
    doc = table_doc()
    doc["server_count"] = "3"
    err = rejected(doc)
    assert (err.field, err.value, err.rule, err.expected) == ("server_count", "3", "const", "2")


@pytest.mark.parametrize(
    "path, value, fieldname",
    [
        (("server_count",), 2, "server_count"),
        (("server_list", 0, "device", 1, "rank_id"), 1, "server_list[0].device[1].rank_id"),
        (("server_list", 1, "device", 0, "device_id"), 0, "server_list[1].device[0].device_id"),
        (("server_list", 0, "server_id"), 10, "server_list[0].server_id"),
        (("server_list", 0, "host_ip"), None, "server_list[0].host_ip"),
        (("version",), 1.0, "version"),
    ],
)
def test_values_must_be_strings(path, value, fieldname):
    doc = table_doc()
    target = doc
    for key in path[:-1]:
        target = target[key]
    target[path[-1]] = value
    err = rejected(doc)
    assert (err.field, err.value, err.rule, err.expected) == (fieldname, value, "type", "string")


def test_numbers_must_be_digits():
    doc = table_doc()
    doc["server_list"][0]["device"][0]["rank_id"] = "-1"
    err = rejected(doc)
    assert (err.field, err.value, err.rule, err.expected) == (
        "server_list[0].device[0].rank_id",
        "-1",
        "format",
        "decimal",
    )


def test_unknown_version():
    doc = table_doc()
    doc["version"] = "2.0"
    err = rejected(doc)
    assert (err.field, err.value, err.rule, err.choices) == ("version", "2.0", "choices", ["1.0", "1.2"])


def test_missing_version():
    doc = table_doc()
    del doc["version"]
    err = rejected(doc)
    assert (err.field, err.rule) == ("version", "required")


def test_device_id_out_of_range():
    doc = table_doc()
    doc["server_list"][0]["device"][1]["device_id"] = "16"
    err = rejected(doc)
    assert (err.field, err.value, err.rule, err.expected) == (
        "server_list[0].device[1].device_id",
        "16",
        "range",
        "0..15",
    )


def test_duplicate_device_id_in_a_server():
    doc = table_doc()
    doc["server_list"][1]["device"][1]["device_id"] = "0"
    err = rejected(doc)
    assert (err.field, err.rule, err.holder) == (
        "server_list[1].device[1].device_id",
        "unique",
        "server_list[1].device[0]",
    )


def test_same_device_id_on_two_servers_is_fine():
    assert RankTable.from_dict(table_doc()).ranks[2].device_id == 0


@pytest.mark.parametrize("key, value", [("device_ip", "192.168.1.300"), ("device_ip", "not-an-ip"), ("device_ip", "")])
def test_bad_device_ip(key, value):
    doc = table_doc()
    doc["server_list"][1]["device"][0][key] = value
    err = rejected(doc)
    assert (err.field, err.value, err.rule, err.expected) == (f"server_list[1].device[0].{key}", value, "format", "ip")


def test_bad_host_ip():
    doc = table_doc()
    doc["server_list"][0]["host_ip"] = "10.0.0.01"
    assert rejected(doc).field == "server_list[0].host_ip"


def test_device_ip_required_with_several_servers():
    doc = table_doc()
    del doc["server_list"][1]["device"][1]["device_ip"]
    err = rejected(doc)
    assert (err.field, err.rule, err.error_id) == ("server_list[1].device[1].device_ip", "required", "EI0004")


def test_duplicate_server_id():
    doc = table_doc()
    doc["server_list"][1]["server_id"] = doc["server_list"][0]["server_id"]
    err = rejected(doc)
    assert (err.field, err.rule, err.holder) == ("server_list[1].server_id", "unique", "server_list[0]")


def test_empty_server_id():
    doc = table_doc()
    doc["server_list"][0]["server_id"] = ""
    err = rejected(doc)
    assert (err.field, err.rule) == ("server_list[0].server_id", "nonempty")


@pytest.mark.parametrize("value", [[], {}, "x", None])
def test_server_list_must_be_a_non_empty_list(value):
    doc = table_doc()
    doc["server_list"] = value
    err = rejected(doc)
    assert err.field == "server_list" and err.rule == ("nonempty" if value == [] else "type")


@pytest.mark.parametrize("value", [[], "x"])
def test_device_list_must_be_a_non_empty_list(value):
    doc = table_doc()
    doc["server_list"][0]["device"] = value
    err = rejected(doc)
    assert err.field == "server_list[0].device" and err.rule == ("nonempty" if value == [] else "type")


def test_entries_must_be_objects():
    doc = table_doc()
    doc["server_list"][1] = ["10.0.0.2"]
    assert rejected(doc).field == "server_list[1]"
    doc = table_doc()
    doc["server_list"][0]["device"][0] = "0"
    assert rejected(doc).field == "server_list[0].device[0]"


def test_top_level_must_be_an_object():
    for doc in ([], "x", 3, None):
        err = rejected(doc)
        assert (err.field, err.rule, err.expected, err.error_id) == (None, "type", "object", "EI0004")


def test_unreadable_file_is_not_a_valid_real_path(tmp_path):
    for path in (tmp_path / "missing.json", tmp_path):
        with pytest.raises(TopologyError) as info:
            RankTable.load(path)
        err = info.value
        assert (err.field, err.rule, err.path, err.error_id) == ("path", "file", str(path), "EI0004")


def test_not_json():
    for text in ("{", "", '{"version": "1.0",}', b"\xff\xfe", 42):
        with pytest.raises(TopologyError) as info:
            RankTable.loads(text)  # type: ignore[arg-type]
        assert (info.value.field, info.value.rule, info.value.error_id) == (None, "json", "EI0004")


def test_duplicate_json_keys():
    text = json.dumps(table_doc())[:-1] + ', "status": "completed"}'
    with pytest.raises(TopologyError) as info:
        RankTable.loads(text)
    assert (info.value.field, info.value.rule) == ("status", "unique")


def test_super_pod_list_needs_version_1_2():
    doc = table_doc(version="1.2")
    doc["version"] = "1.0"
    err = rejected(doc)
    assert (err.field, err.value, err.rule, err.expected) == ("version", "1.0", "const", "1.2")


def test_super_device_id_needs_version_1_2():
    doc = table_doc()
    doc["server_list"][0]["device"][0]["super_device_id"] = "5"
    err = rejected(doc)
    assert (err.field, err.rule, err.expected) == ("version", "const", "1.2")


def test_version_1_2_requires_super_pod_list():
    doc = table_doc(version="1.2")
    del doc["super_pod_list"]
    err = rejected(doc)
    assert (err.field, err.rule) == ("super_pod_list", "required")


def test_version_1_2_requires_super_device_id():
    doc = table_doc(version="1.2")
    del doc["server_list"][1]["device"][1]["super_device_id"]
    err = rejected(doc)
    assert (err.field, err.rule) == ("server_list[1].device[1].super_device_id", "required")


def test_duplicate_super_device_id_in_a_super_pod():
    doc = table_doc(version="1.2")
    doc["server_list"][1]["device"][0]["super_device_id"] = "1000"
    err = rejected(doc)
    assert (err.field, err.rule, err.holder) == (
        "server_list[1].device[0].super_device_id",
        "unique",
        "server_list[0].device[0].super_device_id",
    )


def test_server_in_no_super_pod():
    doc = table_doc(version="1.2")
    doc["super_pod_list"][0]["server_list"].pop()
    err = rejected(doc)
    assert (err.field, err.value, err.rule) == ("server_list[1].server_id", "10.0.0.2", "reference")


def test_super_pod_lists_unknown_server():
    doc = table_doc(version="1.2")
    doc["super_pod_list"][0]["server_list"].append({"server_id": "10.9.9.9"})
    err = rejected(doc)
    assert (err.field, err.value, err.rule) == ("super_pod_list[0].server_list[2].server_id", "10.9.9.9", "reference")


def test_server_in_two_super_pods():
    doc = table_doc(version="1.2")
    doc["super_pod_list"].append({"super_pod_id": "1", "server_list": [{"server_id": "10.0.0.1"}]})
    err = rejected(doc)
    assert (err.field, err.rule, err.holder) == (
        "super_pod_list[1].server_list[0].server_id",
        "unique",
        "super_pod_list[0].server_list[0].server_id",
    )


def test_duplicate_super_pod_id():
    doc = table_doc(version="1.2")
    doc["super_pod_list"][0]["server_list"].pop()
    doc["super_pod_list"].append({"super_pod_id": "0", "server_list": [{"server_id": "10.0.0.2"}]})
    err = rejected(doc)
    assert (err.field, err.rule, err.holder) == ("super_pod_list[1].super_pod_id", "unique", "super_pod_list[0]")


def test_generate_rejects_unknown_version():
    with pytest.raises(TopologyError) as info:
        RankTable.generate(Topology.preset("pcie-4p"), version="2.0")
    assert (info.value.field, info.value.value, info.value.rule) == ("version", "2.0", "choices")


# ------------------------------------------------------------------ fuzz: only TopologyError, never another exception

json_values = st.recursive(
    st.none()
    | st.booleans()
    | st.integers()
    | st.floats(allow_nan=False)
    | st.text(max_size=8)
    | st.sampled_from(["0", "1", "15", "16", "1.0", "1.2", "completed", "10.0.0.1", "", "-1", "9" * 12]),
    lambda children: (
        st.lists(children, max_size=4)
        | st.dictionaries(
            st.sampled_from(
                [
                    "version",
                    "status",
                    "server_count",
                    "server_list",
                    "super_pod_list",
                    "server_id",
                    "host_ip",
                    "device",
                    "device_id",
                    "device_ip",
                    "rank_id",
                    "super_device_id",
                    "super_pod_id",
                    "x",
                ]
            ),
            children,
            max_size=5,
        )
    ),
    max_leaves=25,
)


def _parse_or_topology_error(doc):
    try:
        table = RankTable.from_dict(doc)
    except TopologyError as err:
        assert err.code == 1 and isinstance(str(err), str) and err.rule is not None  # every rejection names its check
        return None
    # Whatever parses must survive its own round trip.
    assert RankTable.loads(table.dumps()) == table
    return table


@settings(max_examples=200, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(json_values)
def test_fuzz_random_documents(doc):
    _parse_or_topology_error(doc)


@settings(max_examples=100, deadline=None)
@given(st.text(max_size=60) | st.binary(max_size=60))
def test_fuzz_random_text(text):
    try:
        RankTable.loads(text)
    except TopologyError:
        pass


def _paths(node, prefix=()):
    yield prefix
    if isinstance(node, dict):
        for key, value in node.items():
            yield from _paths(value, prefix + (key,))
    elif isinstance(node, list):
        for i, value in enumerate(node):
            yield from _paths(value, prefix + (i,))


@settings(max_examples=300, deadline=None)
@given(st.sampled_from(["1.0", "1.2"]), st.data())
def test_fuzz_mutations_of_a_valid_table(version, data):
    doc = table_doc(version=version)
    for _ in range(data.draw(st.integers(1, 3), label="mutations")):
        paths = [p for p in _paths(doc) if p]
        if not paths:
            break
        path = data.draw(st.sampled_from(paths), label="path")
        parent = doc
        for key in path[:-1]:
            parent = parent[key]
        op = data.draw(st.sampled_from(["replace", "delete", "duplicate"]), label="op")
        if op == "replace":
            parent[path[-1]] = data.draw(json_values, label="value")
        elif op == "delete":
            del parent[path[-1]]
        elif isinstance(parent, list):
            parent.append(copy.deepcopy(parent[path[-1]]))
    _parse_or_topology_error(doc)
