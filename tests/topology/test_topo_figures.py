"""The link/card figures table and user overrides of it."""

import json
import math

import pytest

from topology import CARD_MODELS, LINK_KINDS, CardModel, LinkSpec, Topology, TopologyError, load_figures


def test_link_table_has_every_required_kind_with_positive_figures():
    assert {"HCCS", "HCCS_910B", "PCIE", "ROCE100", "ROCE200", "HOST"} <= set(LINK_KINDS)
    for name, spec in LINK_KINDS.items():
        assert isinstance(spec, LinkSpec) and spec.kind == name
        assert math.isfinite(spec.bandwidth_Bps) and spec.bandwidth_Bps > 0
        assert math.isfinite(spec.latency_s) and spec.latency_s > 0


def test_card_table_has_every_required_model_with_positive_figures():
    assert {"ascend310p", "ascend910", "ascend910b"} <= set(CARD_MODELS)
    for name, card in CARD_MODELS.items():
        assert isinstance(card, CardModel) and card.name == name
        for value in (card.peak_fp16_flops, card.hbm_bytes, card.hbm_bandwidth_Bps, card.vector_bandwidth_Bps,
                      card.launch_overhead_s):
            assert math.isfinite(value) and value > 0
        assert isinstance(card.hbm_bytes, int)


def test_figures_are_the_cited_ones():
    # Spot checks against the sources in figures.py, so an accidental edit shows up.
    assert LINK_KINDS["HCCS"].bandwidth_Bps == 30e9  # 240 Gb/s per port
    assert LINK_KINDS["HCCS_910B"].bandwidth_Bps == 28e9  # 56 GB/s per pair, both directions
    assert LINK_KINDS["ROCE100"].bandwidth_Bps == 12.5e9
    assert LINK_KINDS["ROCE200"].bandwidth_Bps == 25e9
    assert LINK_KINDS["PCIE"].bandwidth_Bps == pytest.approx(31.5e9, rel=1e-3)
    assert CARD_MODELS["ascend910"].peak_fp16_flops == 256e12
    assert CARD_MODELS["ascend910b"].hbm_bytes == 64 * 2**30
    assert CARD_MODELS["ascend310p"].peak_fp16_flops == 70e12


def test_specs_are_frozen():
    with pytest.raises(AttributeError):
        LINK_KINDS["HCCS"].bandwidth_Bps = 1.0  # type: ignore[misc]


def _write(tmp_path, doc):
    path = tmp_path / "figures.json"
    path.write_text(json.dumps(doc))
    return path


def test_override_changes_only_the_named_figures(tmp_path):
    links, cards = load_figures(_write(tmp_path, {"links": {"ROCE200": {"bandwidth_Bps": 5e9}},
                                                  "cards": {"ascend910b": {"hbm_bytes": 2**34}}}))
    assert links["ROCE200"] == LinkSpec("ROCE200", 5e9, LINK_KINDS["ROCE200"].latency_s)
    assert cards["ascend910b"].hbm_bytes == 2**34
    assert cards["ascend910b"].peak_fp16_flops == CARD_MODELS["ascend910b"].peak_fp16_flops
    assert links["HCCS"] == LINK_KINDS["HCCS"] and LINK_KINDS["ROCE200"].bandwidth_Bps == 25e9  # defaults untouched


def test_topology_uses_overridden_figures(tmp_path):
    path = _write(tmp_path, {"links": {"ROCE200": {"bandwidth_Bps": 5e9}}})
    for figures in (load_figures(path), str(path), path):
        topo = Topology.preset("2x8p-roce", figures=figures)
        assert topo.route(0, 8).bandwidth_Bps == 5e9
        assert topo.link("card0", "card1").bandwidth_Bps == 28e9


@pytest.mark.parametrize("doc, key", [
    ({"link": {}}, "link"),
    ({"links": {"NVLINK": {"bandwidth_Bps": 1e9}}}, "links.NVLINK"),
    ({"cards": {"ascend999": {}}}, "cards.ascend999"),
    ({"links": {"HCCS": {"bandwidth": 1e9}}}, "links.HCCS.bandwidth"),
    ({"cards": {"ascend910": {"name": "x"}}}, "cards.ascend910.name"),
])
def test_unknown_keys_are_named(tmp_path, doc, key):
    with pytest.raises(TopologyError) as info:
        load_figures(_write(tmp_path, doc))
    assert (info.value.field, info.value.rule, info.value.code) == (key, "unknown", 1)
    assert key.rsplit(".", 1)[-1] not in info.value.choices and info.value.choices  # names what is allowed instead


@pytest.mark.parametrize("value", [0, -1, "fast", None, True, float("inf")])
def test_bad_values_are_rejected(tmp_path, value):
    with pytest.raises(TopologyError) as info:
        load_figures(_write(tmp_path, {"links": {"PCIE": {"latency_s": value}}}))
    assert (info.value.field, info.value.rule) == ("links.PCIE.latency_s", "positive")
    assert info.value.value == value and type(info.value.value) is type(value)


def test_hbm_bytes_must_be_whole(tmp_path):
    with pytest.raises(TopologyError) as info:
        load_figures(_write(tmp_path, {"cards": {"ascend910": {"hbm_bytes": 1.5}}}))
    assert (info.value.field, info.value.value, info.value.rule, info.value.expected) == ("cards.ascend910.hbm_bytes", 1.5, "type", "int")


def test_unreadable_or_invalid_file(tmp_path):
    with pytest.raises(TopologyError) as info:
        load_figures(tmp_path / "missing.json")
    assert (info.value.field, info.value.rule, info.value.path) == ("path", "file", str(tmp_path / "missing.json"))
    bad = tmp_path / "bad.json"
    bad.write_text("{nope")
    with pytest.raises(TopologyError) as info:
        load_figures(bad)
    assert (info.value.field, info.value.rule, info.value.path) == (None, "json", str(bad))
    with pytest.raises(TopologyError) as info:
        load_figures(_write(tmp_path, [1, 2]))
    assert (info.value.field, info.value.rule, info.value.expected) == (None, "type", "object")


def test_figures_argument_must_be_a_pair_or_path():
    with pytest.raises(TopologyError) as info:
        Topology.preset("pcie-4p", figures=42)  # type: ignore[arg-type]
    assert info.value.field == "figures"
