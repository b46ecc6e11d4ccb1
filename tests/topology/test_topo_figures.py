"""The link/card figures table and user overrides of it."""

import json
import math

import pytest

from topology import CARD_MODELS, LINK_KINDS, CardModel, LinkSpec, Topology, TopologyError, load_figures
from topology.figures import LEVEL1_PORTS, SERVER_UPLINK


def test_link_table_has_every_required_kind_with_positive_figures():
    assert {"HCCS", "HCCS_910B", "PCIE", "ROCE100", "ROCE200", "HOST"} <= set(LINK_KINDS)
    for name, spec in LINK_KINDS.items():
        assert isinstance(spec, LinkSpec) and spec.kind == name
        assert math.isfinite(spec.bandwidth_Bps) and spec.bandwidth_Bps > 0
        if name in SERVER_UPLINK.values():  # a share of bandwidth: its latency is in the port's hops
            assert spec.latency_s == 0
        else:
            assert math.isfinite(spec.latency_s) and spec.latency_s > 0


def test_card_table_has_every_required_model_with_positive_figures():
    assert {"ascend310p", "ascend910", "ascend910b"} <= set(CARD_MODELS)
    for name, card in CARD_MODELS.items():
        assert isinstance(card, CardModel) and card.name == name
        for value in (
            card.peak_fp16_flops,
            card.hbm_bytes,
            card.hbm_bandwidth_Bps,
            card.vector_bandwidth_Bps,
            card.launch_overhead_s,
            card.segment_alloc_s,
        ):
            assert math.isfinite(value) and value > 0
        assert isinstance(card.hbm_bytes, int)


def test_figures_are_the_cited_ones():
    # Spot checks against the sources in figures.py, so an accidental edit shows up.
    gib = 2**30
    assert LINK_KINDS["HCCS"].bandwidth_Bps == 10.0 * gib  # HCCL's BANDWIDTH_HCCS_910A
    assert LINK_KINDS["HCCS_910B"].bandwidth_Bps == 18.3 * gib  # HCCL's BANDWIDTH_HCCS_910B
    assert LINK_KINDS["ROCE100"].bandwidth_Bps == 12e9  # HCCL's measured single-stream RDMA
    # the fitted cross-server terms stay inside their public bounds (docs/fidelity.md)
    assert 25e9 * 0.7 <= LINK_KINDS["ROCE200"].bandwidth_Bps <= 25e9  # msmodeling x 0.7 .. 200 GbE line rate
    roce = LINK_KINDS["ROCE200"]
    # an RDMA operation (what a send pays): msmodeling's model latency .. HIXL's whole 16 KB block
    assert 1.5e-6 <= 4 * roce.latency_s <= 22.8e-6
    # a collective step's notifies and stream sync: two notifies at HCCL's 7 us .. 60 us less the RDMA operation
    assert 14e-6 <= 4 * roce.step_sync_s <= 60e-6 - 4 * roce.latency_s + 1e-12
    assert 4 * roce.step_latency_s == pytest.approx(60e-6)  # a cross-server step: HCCL's level-1 LATENCY
    assert all(spec.step_sync_s == 0 for name, spec in LINK_KINDS.items() if name != "ROCE200")
    assert 1 <= LEVEL1_PORTS <= 8  # one port .. one per NPU
    assert LINK_KINDS["ROCE200_UPLINK"].bandwidth_Bps == LEVEL1_PORTS * LINK_KINDS["ROCE200"].bandwidth_Bps
    assert LINK_KINDS["PCIE"].bandwidth_Bps == 24.926e9  # FlagPerf ascend-dmi d2h
    assert LINK_KINDS["HCCS_910B"].latency_s == pytest.approx(2.6e-6)  # 2 notify records + SDMA fixed
    assert 4 * LINK_KINDS["ROCE100"].latency_s == pytest.approx(21e-6)  # 3 RDMA operations x 7 us
    assert CARD_MODELS["ascend910"].peak_fp16_flops == 256e12
    assert CARD_MODELS["ascend910b"].hbm_bytes == 64 * 2**30
    assert CARD_MODELS["ascend310p"].peak_fp16_flops == 70e12
    assert CARD_MODELS["ascend910b"].peak_flops("float16") * CARD_MODELS[
        "ascend910b"
    ].matmul_efficiency == pytest.approx(313.182e12)
    assert CARD_MODELS["ascend910b"].launch_overhead_s == 15e-6
    assert CARD_MODELS["ascend910b"].segment_alloc_s == 50e-6  # estimate: cudaMalloc's ~50 us (CUMALLOC)
    assert CARD_MODELS["ascend910b"].vector_bandwidth_Bps == 10e9  # HCCL's CCE reduce estimate


def test_inline_reduction_follows_hccl_per_chip():
    b, a, p = CARD_MODELS["ascend910b"], CARD_MODELS["ascend910"], CARD_MODELS["ascend310p"]
    assert (
        b.reduces_inline("bfloat16", "max")
        and b.reduces_inline("float32", "sum")
        and not b.reduces_inline("float32", "prod")
    )
    assert (
        a.reduces_inline("float32", "sum")
        and not a.reduces_inline("float16", "sum")
        and not a.reduces_inline("float32", "max")
    )
    assert p.reduces_inline("float16", "sum") and not p.reduces_inline("int8", "sum")


def test_peak_by_dtype():
    card = CARD_MODELS["ascend910b"]
    assert card.peak_flops(None) == card.peak_flops("float16") == 320e12
    assert card.peak_flops("int8") == 640e12 and card.peak_flops("bfloat16") == 320e12
    assert card.peak_flops("float32") < card.peak_flops("float16") / 3
    assert card.peak_flops("float64") == card.peak_flops("float32") / 2


def test_specs_are_frozen():
    with pytest.raises(AttributeError):
        LINK_KINDS["HCCS"].bandwidth_Bps = 1.0  # type: ignore[misc]


def _write(tmp_path, doc):
    path = tmp_path / "figures.json"
    path.write_text(json.dumps(doc))
    return path


def test_override_changes_only_the_named_figures(tmp_path):
    links, cards = load_figures(
        _write(tmp_path, {"links": {"ROCE200": {"bandwidth_Bps": 5e9}}, "cards": {"ascend910b": {"hbm_bytes": 2**34}}})
    )
    assert links["ROCE200"] == LinkSpec(
        "ROCE200", 5e9, LINK_KINDS["ROCE200"].latency_s, LINK_KINDS["ROCE200"].step_sync_s
    )
    assert cards["ascend910b"].hbm_bytes == 2**34
    assert cards["ascend910b"].peak_fp16_flops == CARD_MODELS["ascend910b"].peak_fp16_flops
    assert links["HCCS"] == LINK_KINDS["HCCS"] and LINK_KINDS["ROCE200"].bandwidth_Bps == 23.5e9  # defaults untouched


def test_topology_uses_overridden_figures(tmp_path):
    path = _write(tmp_path, {"links": {"ROCE200": {"bandwidth_Bps": 5e9}}})
    for figures in (load_figures(path), str(path), path):
        topo = Topology.preset("2x8p-roce", figures=figures)
        assert topo.route(0, 8).bandwidth_Bps == 5e9
        assert topo.link("card0", "card1").bandwidth_Bps == LINK_KINDS["HCCS_910B"].bandwidth_Bps


@pytest.mark.parametrize(
    "doc, key",
    [
        ({"link": {}}, "link"),
        ({"links": {"NVLINK": {"bandwidth_Bps": 1e9}}}, "links.NVLINK"),
        ({"cards": {"ascend999": {}}}, "cards.ascend999"),
        ({"links": {"HCCS": {"bandwidth": 1e9}}}, "links.HCCS.bandwidth"),
        ({"cards": {"ascend910": {"name": "x"}}}, "cards.ascend910.name"),
    ],
)
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
    if value != 0:  # a step's synchronisation may be 0 (no more than a transfer), nothing less
        with pytest.raises(TopologyError) as info:
            load_figures(_write(tmp_path, {"links": {"ROCE200": {"step_sync_s": value}}}))
        assert (info.value.field, info.value.rule) == ("links.ROCE200.step_sync_s", "positive")


def test_a_collective_step_pays_the_step_sync_a_send_does_not(tmp_path):
    """Between 910B servers a send pays one RDMA operation; a collective step's transfer pays the
    notifies and stream synchronisation on top (LinkSpec.step_sync_s), a figures file may drop them."""
    topo = Topology.preset("2x8p-roce")
    route, roce = topo.route(0, 8), LINK_KINDS["ROCE200"]
    assert route.latency_s == pytest.approx(4 * roce.latency_s)
    assert route.step_latency_s == pytest.approx(4 * (roce.latency_s + roce.step_sync_s))
    inside = topo.route(0, 1)
    assert inside.step_latency_s == inside.latency_s  # inside a server a step pays what a transfer pays
    links, _ = load_figures(_write(tmp_path, {"links": {"ROCE200": {"step_sync_s": 0}}}))
    assert Topology.preset("2x8p-roce", figures=(links, CARD_MODELS)).route(0, 8).step_latency_s == route.latency_s


def test_card_lists_and_fractions_round_trip(tmp_path):
    from topology.figures import figures_to_dict

    doc = {
        "cards": {"ascend910": {"inline_reduce_dtypes": ["float32", "float16"], "matmul_efficiency": 0.5}},
        "links": {"HCCS": {"bandwidth_Bps": 2e10}},
    }
    figures = load_figures(_write(tmp_path, doc))
    assert figures[1]["ascend910"].reduces_inline("float16", "sum") and figures[1]["ascend910"].matmul_efficiency == 0.5
    assert figures_to_dict(figures) == doc
    with pytest.raises(TopologyError, match="fraction"):
        load_figures(_write(tmp_path, {"cards": {"ascend910": {"matmul_efficiency": 2}}}))
    with pytest.raises(TopologyError, match="list of names"):
        load_figures(_write(tmp_path, {"cards": {"ascend910": {"inline_reduce_ops": "sum"}}}))


def test_hbm_bytes_must_be_whole(tmp_path):
    with pytest.raises(TopologyError) as info:
        load_figures(_write(tmp_path, {"cards": {"ascend910": {"hbm_bytes": 1.5}}}))
    assert (info.value.field, info.value.value, info.value.rule, info.value.expected) == (
        "cards.ascend910.hbm_bytes",
        1.5,
        "type",
        "int",
    )


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
