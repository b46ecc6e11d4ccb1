"""Named cluster presets: how one server is wired inside, and how servers are joined.

Server wirings (one :class:`ServerTemplate` each):

``ascend910-8p``  Atlas 800 training server (model 9000), 8 x Ascend 910. NPUs 0-3 and 4-7 form
                  two HCCS islands, each a 4-card full mesh (each 910 has 3 HCCS ports, one per
                  peer); HCCL treats "devices 0 to 3 and devices 4 to 7 [as] separate networks"
                  (CANN TensorFlow migration guide, "Precautions" for Atlas training products).
                  Each island hangs off its own CPU socket over PCIe; the two sockets are joined
                  by the host path (HOST link), so island-to-island traffic goes
                  card -PCIE-> cpu0 -HOST-> cpu1 -PCIE-> card.
``ascend910b-8p`` Atlas 800T A2, 8 x Ascend 910B, HCCS between every pair (npu-smi info -t topo
                  shows HCCS for all pairs), i.e. one 8-card island.
``pcie-4p``       4 x Ascend 310P inference cards under one PCIe switch; no HCCS, no islands.
                  The 310P has no RoCE port: across servers (from a rank table) traffic goes
                  through the host, card -PCIE-> root -HOST-> host NIC -ROCE100-> leaf.
``mixed-4p``      4 x Ascend 910 PCIe cards under one PCIe switch where only cards 1 and 2 share
                  a fast HCCS bridge. HCCL sees no island here, so its automatic grouping
                  pairs {0,1},{2,3} while the fast pair is {1,2} (the effect issue 7 measures).
                  The switch has ACS on (``acs``): as on any host with the IOMMU enabled, the
                  kernel turns on PCIe Access Control Services, which redirect peer-to-peer
                  requests to the CPU root complex, so every card-to-card PCIe flow crosses the
                  switch's one x16 uplink up and back down and concurrent PCIe flows share it.
                  Huawei documents exactly this for NPUs behind a PCIe switch ("[P2P Bandwidth]
                  Low Cross-Ring PIX Bandwidth Due to ACS Triggered by IOMMU", MindCluster
                  toolbox guide, https://www.hiascend.com/document/detail/en/mindcluster/730/toolbox/toolboxug/toolboxug_0254.html:
                  "the unidirectional bandwidth is almost the same as the bidirectional
                  bandwidth"), as does NVIDIA for GPUs (NCCL user guide, Troubleshooting, "PCI
                  Access Control Services (ACS)"). Without it the bridge could not matter: one
                  HCCS port (30 GB/s) is no faster than a card's own PCIe gen4 x16 link (31.5
                  GB/s), and pairs on separate switch ports would never compete.

Multi-server clusters ``NxMp-roce[-910|-910b]``: N servers, the first M cards of each wired as
``ascend910b-8p`` (default, 200 GbE) or ``ascend910-8p`` (``-910``, 100 GbE). NIC choice: every
NPU has its own RoCE port (the 910 integrates 2 x 100 GbE [Hot Chips 31] and Atlas 800 (9000)
servers expose 8 x 100 GE, one per NPU; Atlas 800T A2 has 8 x 200 GE, one per NPU), modeled as
one NIC node per card, so flows of one card share its NIC and cross-card sharing happens at the
switches. Servers' NICs go to a leaf switch, 32 servers per leaf (a chosen group size: 256 NPU
ports, what one leaf group of a spine-leaf AI fabric typically serves); with more than 32 servers
the leaves join one spine. A switch is a node, not a bottleneck: a leaf-spine trunk is one edge
whose bandwidth is the leaf's total downlink bandwidth, i.e. a non-blocking 1:1 Clos. So the
links that flows share are the card->NIC->leaf ports and, across leaves, the trunks.
"""

from __future__ import annotations

import math
import re
from dataclasses import dataclass

from .errors import TopologyError

SERVERS_PER_LEAF = 32
MAX_RANKS = 65536  # far above any Ascend cluster HCCL supports (A2: 1152 servers); guards typos like 100000x8p


@dataclass(frozen=True)
class ServerTemplate:
    """How the cards of one server are wired.

    ``islands``: groups of local device ids joined in an HCCS full mesh of ``island_kind``;
    ``bridges``: extra direct card links ``(a, b, kind)`` that form no island;
    ``roots``: the cards under each CPU socket / PCIe root (roots are joined by HOST links);
    ``nic``: ``"card"`` = one RoCE NIC per card, ``"host"`` = one host NIC on the first root;
    ``acs``: each root is a PCIe switch with ACS on, whose x16 uplink to the CPU root complex
    every card-to-card PCIe flow under it crosses twice (up, then down).
    """

    name: str
    card: str
    num_cards: int
    roots: tuple[tuple[int, ...], ...]
    nic: str
    nic_kind: str
    islands: tuple[tuple[int, ...], ...] = ()
    island_kind: str = "HCCS"
    bridges: tuple[tuple[int, int, str], ...] = ()
    acs: bool = False


TEMPLATES: dict[str, ServerTemplate] = {
    "ascend910-8p": ServerTemplate(
        "ascend910-8p",
        "ascend910",
        8,
        roots=((0, 1, 2, 3), (4, 5, 6, 7)),
        nic="card",
        nic_kind="ROCE100",
        islands=((0, 1, 2, 3), (4, 5, 6, 7)),
        island_kind="HCCS",
    ),
    "ascend910b-8p": ServerTemplate(
        "ascend910b-8p",
        "ascend910b",
        8,
        roots=((0, 1, 2, 3, 4, 5, 6, 7),),
        nic="card",
        nic_kind="ROCE200",
        islands=((0, 1, 2, 3, 4, 5, 6, 7),),
        island_kind="HCCS_910B",
    ),
    "pcie-4p": ServerTemplate("pcie-4p", "ascend310p", 4, roots=((0, 1, 2, 3),), nic="host", nic_kind="ROCE100"),
    "mixed-4p": ServerTemplate(
        "mixed-4p",
        "ascend910",
        4,
        roots=((0, 1, 2, 3),),
        nic="host",
        nic_kind="ROCE100",
        bridges=((1, 2, "HCCS"),),
        acs=True,
    ),
}

PRESETS: dict[str, str] = {
    "ascend910-8p": "1 server, 8 x Ascend 910: HCCS islands 0-3 and 4-7 (4-card full mesh each), islands joined over PCIe and the host",
    "ascend910b-8p": "1 server, 8 x Ascend 910B: HCCS full mesh",
    "pcie-4p": "1 server, 4 x Ascend 310P under one PCIe switch, no HCCS",
    "mixed-4p": "1 server, 4 x Ascend 910 under one PCIe switch (ACS: peer traffic shares its uplink); only ranks 1 and 2 share a fast HCCS bridge (no island)",
    "2x8p-roce": "2 servers like ascend910b-8p, one 200 GbE RoCE port per NPU, one leaf switch",
    "2x8p-roce-910": "2 servers like ascend910-8p, one 100 GbE RoCE port per NPU, one leaf switch",
    "64x8p-roce": "64 servers like ascend910b-8p (512 NPUs): 2 leaves of 32 servers under one spine",
    "512x8p-roce": "512 servers like ascend910b-8p (4096 NPUs): 16 leaves of 32 servers under one spine",
}
PRESET_PATTERN = "NxMp-roce[-910|-910b]"
PRESET_PATTERN_HELP = (
    f"{PRESET_PATTERN}: any N servers x M cards (M <= 8), wired like ascend910b-8p "
    "(default) or ascend910-8p (-910), joined by RoCE leaf/spine switches"
)

_ROCE = re.compile(r"(?P<servers>[0-9]{1,6})x(?P<cards>[0-9]{1,2})p-roce(?:-(?P<card>910b|910))?")


@dataclass(frozen=True)
class PresetSpec:
    """A parsed preset name: ``num_servers`` servers of ``cards_per_server`` cards wired as ``template``."""

    name: str
    template: ServerTemplate
    num_servers: int
    cards_per_server: int

    @property
    def num_ranks(self) -> int:
        """Cards in the whole cluster: ``num_servers * cards_per_server``."""
        return self.num_servers * self.cards_per_server


def parse_preset(name: str) -> PresetSpec:
    """Resolve a preset name.

    >>> parse_preset("64x8p-roce").num_ranks
    512
    """
    if not isinstance(name, str):
        raise TopologyError(
            f"preset must be a name such as 'ascend910-8p', got {type(name).__name__}.",
            "preset",
            rule="type",
            expected="string",
        )
    key = name.strip().lower()
    if key in TEMPLATES:
        template = TEMPLATES[key]
        return PresetSpec(key, template, 1, template.num_cards)
    m = _ROCE.fullmatch(key)
    if m:
        servers, cards = int(m["servers"]), int(m["cards"])
        template = TEMPLATES["ascend910-8p" if m["card"] == "910" else "ascend910b-8p"]
        if servers < 1 or not 1 <= cards <= template.num_cards:
            raise TopologyError(
                f"preset {name!r}: need at least 1 server and 1..{template.num_cards} cards per server. "
                f"Fix: e.g. 2x8p-roce.",
                "preset",
                value=name,
                rule="range",
                expected=f"1..{template.num_cards} cards",
            )
        if servers * cards > MAX_RANKS:
            raise TopologyError(
                f"preset {name!r} has {servers * cards} cards, more than the {MAX_RANKS} this model "
                "builds. Fix: use fewer servers.",
                "preset",
                value=name,
                rule="range",
                expected=f"<= {MAX_RANKS} cards",
            )
        return PresetSpec(key, template, servers, cards)
    raise TopologyError(
        f"unknown preset {name!r}. Fix: use one of {', '.join(PRESETS)}, or {PRESET_PATTERN} "
        "(hccl-topo presets lists them).",
        "preset",
        value=name,
        rule="choices",
        choices=list(PRESETS),
    )


def card_count_check(n: object) -> dict:
    """The check a bad number of cards ``n`` fails, as TopologyError fields: ``type`` (not an
    int) or ``range`` (below 1)."""
    if isinstance(n, int) and not isinstance(n, bool):
        return {"rule": "range", "expected": ">= 1"}
    return {"rule": "type", "expected": "int"}


def default_preset(n: int) -> str:
    """A sensible preset name for ``n`` cards: one Ascend 910 server up to 8, else 8-card 910B servers.

    >>> default_preset(4), default_preset(12)
    ('ascend910-8p', '2x8p-roce')
    """
    if isinstance(n, bool) or not isinstance(n, int) or n < 1:
        raise TopologyError(
            f"number of cards must be a positive integer, got {n!r}.", "n", value=n, **card_count_check(n)
        )
    return "ascend910-8p" if n <= 8 else f"{math.ceil(n / 8)}x8p-roce"
