"""Link and card figures: the one table every modeled time is computed from.

Every number carries its public source in the comment next to it. Where no vendor figure is
public the comment says *estimate* and gives the reasoning. Bandwidths are **per direction**
in bytes/s (links are full duplex: a flow A->B does not slow a flow B->A); latencies are one
hop in seconds. A user overrides any figure from a JSON file with :func:`load_figures`.

Sources cited below:

[HC31]   Huawei, "DaVinci: A Scalable Architecture for Neural Network Computing", Hot Chips 31
         (2019); slide figures as reported live by AnandTech
         (https://www.anandtech.com/show/14756/hot-chips-live-blogs-huawei-da-vinci-architecture)
         and summarised at https://vengineer.hatenablog.com/entry/2019/09/06/070000:
         Ascend 910 256 TFLOPS FP16 / 512 TOPS INT8, PCIe 4.0 x16, 3x 240 Gbps HCCS ports,
         RoCE v2 2x 100 Gbps; cube = 4096 FP16 MACs or 8192 INT8 MACs per cycle.
[LINLEY] Linley Group Microprocessor Report, "Huawei Delivers Powerful AI Training",
         2019-10-08 (https://www.linleygroup.com/newsletters/newsletter_detail.php?num=6076):
         Ascend 910 with four HBM2 stacks, 32 GB HBM2, 256 FP16 TFLOPS, 100 Gbps Ethernet.
[AC-DS]  A. Chiao, "GPU Performance (Data Sheets) Quick Reference (2023)",
         https://arthurchiao.art/blog/gpu-data-sheets/ : Ascend 910B 320 TFLOPS FP16,
         64 GB HBM2e, HCCS 56 GB/s GPU-to-GPU (bidirectional) and 392 GB/s total (= 7 x 56).
[AC-910B] A. Chiao, "GPU 进阶笔记（二）：华为昇腾 910B", https://arthurchiao.art/blog/gpu-advanced-notes-2-zh/ :
         npu-smi on an 8x 910B server shows 65536 MB HBM per NPU, HCCS between every NPU pair
         (full mesh) and 8x 200 Gb/s RoCE ports (one per NPU).
[A300IDUO] Atlas 300I Duo (two Ascend 310P chips): 280 TOPS INT8, 96 GB LPDDR4X, 408 GB/s,
         PCIe 4.0 x16, as reported from Gamers Nexus / ComputerBase teardown coverage,
         e.g. https://avalanchenoticias.com.br/servidores-clusters-supercomputadores-computadores-industriais-e-multiprocessadores/o-acelerador-huawei-atlas-300i-duo-e-equipado-com-um-par-de-chips-ascend-310-ai
[PCIE4]  PCI-SIG PCI Express Base Specification 4.0: 16 GT/s per lane, 128b/130b encoding.
[ETH]    IEEE 802.3 100GBASE / 200GBASE: 100 and 200 Gb/s line rate per direction.
"""

from __future__ import annotations

import dataclasses
import json
import math
import os
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Union

from .errors import TopologyError

GiB = 1 << 30


@dataclass(frozen=True, slots=True)
class LinkSpec:
    """One physical link kind: ``bandwidth_Bps`` per direction (bytes/s), ``latency_s`` per hop.

    >>> LINK_KINDS["PCIE"].bandwidth_Bps
    31507692307.692307
    """

    kind: str
    bandwidth_Bps: float
    latency_s: float


@dataclass(frozen=True, slots=True)
class CardModel:
    """One NPU model: peak FP16 FLOP/s, HBM capacity (bytes) and bandwidth (bytes/s), the rate
    (bytes/s) at which it reduces an incoming buffer into a local one, and the fixed cost of
    launching one device kernel.

    >>> CARD_MODELS["ascend910b"].hbm_bytes // 2**30
    64
    """

    name: str
    peak_fp16_flops: float
    hbm_bytes: int
    hbm_bandwidth_Bps: float
    vector_bandwidth_Bps: float
    launch_overhead_s: float


# A reduction out = a + b streams three buffers through HBM (read a, read b, write out) while the
# vector units could go much faster (a 910B's vector units do ~20 TFLOPS FP16, i.e. tens of TB/s of
# operands), so a reduce is HBM-bound: about HBM bandwidth / 3 bytes of result per second.
# Estimate; no vendor figure exists for "reduce bandwidth".
_REDUCE_HBM_PASSES = 3

# One device kernel launch (task dispatch from the stream to the AI cores). Estimate: a few us when
# tasks are queued on a stream; host-side API overhead is larger but overlaps with device work.
_LAUNCH_S = 5e-6


LINK_KINDS: dict[str, LinkSpec] = {
    # Ascend 910 HCCS: 3 ports of 240 Gb/s [HC31] = 30 GB/s per direction per port; each card of
    # a 4-card island uses one port per peer, so one pair of cards gets one port.
    # Latency estimate: one SerDes hop on the board plus the SDMA descriptor and the notify that
    # HCCL posts per transfer, ~1 us (NVLink-class links are quoted in the same range).
    "HCCS": LinkSpec("HCCS", 240e9 / 8, 1.0e-6),
    # Ascend 910B HCCS: 56 GB/s per NPU pair counting both directions, 392 GB/s = 7 x 56 per NPU
    # [AC-DS] -> 28 GB/s per direction per pair. Latency estimate as for HCCS above.
    "HCCS_910B": LinkSpec("HCCS_910B", 56e9 / 2, 1.0e-6),
    # PCIe gen4 x16: 16 GT/s x 16 lanes x 128/130 / 8 = 31.5 GB/s per direction [PCIE4] (raw; no
    # TLP overhead modeled). Latency estimate: a DMA through one switch or root port is ~1-2 us
    # device to device, so 2 us per hop to the CPU/PCIe root.
    "PCIE": LinkSpec("PCIE", 16e9 * 16 * 128 / 130 / 8, 2.0e-6),
    # RoCE v2 over 100 GbE: 12.5 GB/s per direction [ETH]; Atlas 300T/800 (910) give every NPU a
    # 100 GE port [HC31]. Latency estimate per hop (card->NIC, NIC->switch, ...): an RDMA write
    # through one switch takes ~2-3 us NIC to NIC and HCCL adds a notify write per transfer, so
    # ~6 us card to card through one leaf = 4 hops x 1.5 us.
    "ROCE100": LinkSpec("ROCE100", 100e9 / 8, 1.5e-6),
    # RoCE v2 over 200 GbE: 25 GB/s per direction [ETH]; Atlas 800T A2 (910B) servers have one
    # 200 GE port per NPU [AC-910B]. Latency estimate as ROCE100 (same NIC/switch pipeline).
    "ROCE200": LinkSpec("ROCE200", 200e9 / 8, 1.5e-6),
    # The host path: through the CPU complex, i.e. peer-to-peer forwarding between CPU sockets or
    # staging in host DRAM (device->host, host->device). Estimate, no vendor figure: staging
    # crosses PCIe twice and host memory once, so about half a PCIe gen4 x16 direction minus copy
    # overhead, ~12 GB/s; software/forwarding latency ~5 us.
    "HOST": LinkSpec("HOST", 12e9, 5.0e-6),
}

CARD_MODELS: dict[str, CardModel] = {
    # Ascend 310P (Atlas 300I Pro/Duo inference cards).
    "ascend310p": CardModel(
        "ascend310p",
        # 140 TOPS INT8 per chip (280 for the two-chip Duo [A300IDUO]); the DaVinci cube does half
        # as many FP16 as INT8 MACs [HC31] -> 70 TFLOPS FP16.
        peak_fp16_flops=140e12 / 2,
        # 24 GB LPDDR4X on the single-chip Atlas 300I Pro (Huawei product page); the Duo carries
        # 96 GB over two chips [A300IDUO]. The smaller, single-chip card is the default.
        hbm_bytes=24 * GiB,
        # 408 GB/s over two chips [A300IDUO] -> 204 GB/s per chip.
        hbm_bandwidth_Bps=408e9 / 2,
        vector_bandwidth_Bps=408e9 / 2 / _REDUCE_HBM_PASSES,
        launch_overhead_s=_LAUNCH_S,
    ),
    # Ascend 910 (Atlas 300T / Atlas 800 model 9000).
    "ascend910": CardModel(
        "ascend910",
        peak_fp16_flops=256e12,  # [HC31], [LINLEY]
        hbm_bytes=32 * GiB,  # 32 GB HBM2 [LINLEY]
        # Estimate: four HBM2 stacks [LINLEY] x 1024 bits x 2.4 Gb/s per pin (JEDEC JESD235B top
        # speed grade) / 8 = 1.23 TB/s, in line with the 1.2 TB/s commonly quoted for the 910.
        hbm_bandwidth_Bps=1.2e12,
        vector_bandwidth_Bps=1.2e12 / _REDUCE_HBM_PASSES,
        launch_overhead_s=_LAUNCH_S,
    ),
    # Ascend 910B (Atlas 800T A2).
    "ascend910b": CardModel(
        "ascend910b",
        # 320 TFLOPS FP16 [AC-DS]; the 910B2/B3/B4 bins range ~245-354 TFLOPS, 320 is mid-range.
        peak_fp16_flops=320e12,
        hbm_bytes=64 * GiB,  # 64 GB HBM2e [AC-DS]; npu-smi reports 65536 MB [AC-910B]
        # Estimate: 1.6 TB/s, the figure given for 910B2/910B3 in the hardware tables of public
        # Ascend performance-modeling tools; Huawei publishes no 910B chip datasheet.
        hbm_bandwidth_Bps=1.6e12,
        vector_bandwidth_Bps=1.6e12 / _REDUCE_HBM_PASSES,
        launch_overhead_s=_LAUNCH_S,
    ),
}

Figures = tuple[dict[str, LinkSpec], dict[str, CardModel]]
FiguresArg = Union[Figures, str, os.PathLike, None]

_LINK_FIELDS = ("bandwidth_Bps", "latency_s")
_CARD_FIELDS = tuple(f.name for f in dataclasses.fields(CardModel) if f.name != "name")


def load_figures(path: str | os.PathLike) -> Figures:
    """Read a JSON file that overrides any link or card figure; return ``(link_kinds, card_models)``.

    The file names only what it changes; everything else keeps the table's value::

        {"links": {"ROCE200": {"bandwidth_Bps": 2.0e10, "latency_s": 3e-6}},
         "cards": {"ascend910b": {"hbm_bytes": 34359738368}}}

    >>> links, cards = load_figures("figures.json")          # doctest: +SKIP
    >>> Topology.preset("2x8p-roce", figures=(links, cards))  # doctest: +SKIP

    Unknown sections, link kinds, card models or fields raise :class:`TopologyError` naming the key.
    """
    p = Path(path)
    try:
        text = p.read_text(encoding="utf-8")
    except (OSError, UnicodeDecodeError) as err:
        raise TopologyError(
            f"figures file {os.fspath(path)} is not a valid real path or cannot be read ({err.__class__.__name__}). "
            "Fix: pass an existing, readable JSON file.", "path", value=os.fspath(path), path=os.fspath(path), rule="file") from None
    try:
        doc = json.loads(text)
    except (ValueError, RecursionError) as err:
        raise TopologyError(f"figures file {os.fspath(path)} is not valid JSON: {err}. "
                            "Fix: write {\"links\": {...}, \"cards\": {...}}.", None, path=os.fspath(path), rule="json") from None
    return figures_from_dict(doc)


def figures_from_dict(doc: Any) -> Figures:
    """Apply an override document (the content of a figures file) to the default table."""
    if not isinstance(doc, dict):
        raise TopologyError("figures must be a JSON object with \"links\" and/or \"cards\". "
                            "Fix: write {\"links\": {...}, \"cards\": {...}}.", None, rule="type", expected="object")
    links = dict(LINK_KINDS)
    cards = dict(CARD_MODELS)
    for section, value in doc.items():
        if section == "links":
            table, fields, defaults = links, _LINK_FIELDS, LINK_KINDS
        elif section == "cards":
            table, fields, defaults = cards, _CARD_FIELDS, CARD_MODELS
        else:
            raise TopologyError(f"unknown key {section!r} in figures. Fix: use \"links\" or \"cards\".", section,
                                rule="unknown", choices=["links", "cards"])
        if not isinstance(value, dict):
            raise TopologyError(f"figures {section!r} must map names to objects of fields.", section, rule="type", expected="object")
        for name, override in value.items():
            if name not in defaults:
                raise TopologyError(f"unknown {section[:-1]} {name!r} in figures. "
                                    f"Fix: use one of {', '.join(sorted(defaults))}.", f"{section}.{name}",
                                    rule="unknown", choices=sorted(defaults))
            if not isinstance(override, dict):
                raise TopologyError(f"figures {section}.{name} must be an object of fields.", f"{section}.{name}",
                                    rule="type", expected="object")
            changes = {}
            for field, number in override.items():
                key = f"{section}.{name}.{field}"
                if field not in fields:
                    raise TopologyError(f"unknown field {field!r} for {section[:-1]} {name!r} in figures. "
                                        f"Fix: use one of {', '.join(fields)}.", key, rule="unknown", choices=list(fields))
                changes[field] = _positive(number, key, integral=(field == "hbm_bytes"))
            table[name] = dataclasses.replace(table[name], **changes)
    return links, cards


def resolve_figures(figures: FiguresArg) -> Figures:
    """``None`` -> the default table; a path -> :func:`load_figures`; a pair -> used as given."""
    if figures is None:
        return LINK_KINDS, CARD_MODELS
    if isinstance(figures, (str, os.PathLike)):
        return load_figures(figures)
    if isinstance(figures, tuple) and len(figures) == 2 and all(isinstance(t, dict) for t in figures):
        return figures
    raise TopologyError("figures must be None, a path to a JSON file, or the (link_kinds, card_models) "
                        "pair returned by load_figures.", "figures", rule="type", expected="path or (link_kinds, card_models)")


def _positive(value: Any, key: str, *, integral: bool) -> float | int:
    if isinstance(value, bool) or not isinstance(value, (int, float)) or not math.isfinite(value) or value <= 0:
        raise TopologyError(f"Value [{value!r}] for figure {key} is invalid. Expected value: a positive finite number.", key,
                            value=value, rule="positive")
    if integral:
        if int(value) != value:
            raise TopologyError(f"Value [{value!r}] for figure {key} is invalid. Expected value: a whole number of bytes.", key,
                                value=value, rule="type", expected="int")
        return int(value)
    return float(value)
