"""``hccl-topo show --png``: draw a topology with link kinds coloured (matplotlib, Agg backend).

matplotlib is an optional extra (``pip install hccl-py[viz]``) imported only here, inside
:func:`draw_png`, so ``topology`` itself needs only numpy and networkx.
"""

from __future__ import annotations

import math
import os

from .errors import TopologyError

# One colour per link kind, chosen to stay distinguishable in print and for common colour-blindness.
KIND_COLORS = {
    "HCCS": "#d62728",
    "HCCS_910B": "#ff7f0e",
    "PCIE": "#1f77b4",
    "HOST": "#7f7f7f",
    "ROCE100": "#2ca02c",
    "ROCE200": "#9467bd",
}
NODE_COLORS = {
    "card": "#fdd49e",
    "pcie": "#c6dbef",
    "rc": "#c6dbef",
    "nic": "#c7e9c0",
    "leaf": "#dadaeb",
    "spine": "#dadaeb",
}
NODE_LABELS = {"pcie": "CPU\nPCIe", "rc": "CPU root\ncomplex", "nic": "NIC", "leaf": None, "spine": "spine"}


def draw_png(topo, path: str | os.PathLike, max_servers: int = 8) -> int:
    """Draw ``topo`` to a PNG at ``path``; return how many servers were drawn (the first
    ``max_servers``: beyond that a picture is unreadable, and servers are alike).

    >>> draw_png(Topology.preset("ascend910-8p"), "topo.png")   # doctest: +SKIP
    1
    """
    try:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
        from matplotlib.lines import Line2D
    except ImportError:
        raise TopologyError(
            "--png needs matplotlib. Fix: pip install 'hccl-py[viz]' (or pip install matplotlib).",
            "png",
            module="matplotlib",
        ) from None

    shown, sub, pos = drawn_part(topo, max_servers)

    fig, ax = plt.subplots(figsize=(3.0 + 3.6 * shown, 6.5), dpi=110)
    kinds_seen: dict[str, float] = {}
    for u, v, spec in sub.edges(data="spec"):
        color = KIND_COLORS.get(spec.kind, "#000000")
        width = 2.2 if spec.kind.startswith("HCCS") else 1.2
        ax.plot([pos[u][0], pos[v][0]], [pos[u][1], pos[v][1]], color=color, linewidth=width, zorder=1, alpha=0.85)
        kinds_seen.setdefault(
            spec.kind, topo.link_kinds[spec.kind].bandwidth_Bps if spec.kind in topo.link_kinds else spec.bandwidth_Bps
        )
    for n, data in sub.nodes(data=True):
        kind = data["type"]
        x, y = pos[n]
        size = {"card": 520, "pcie": 700, "rc": 700, "nic": 260}.get(kind, 900)
        ax.scatter(
            [x],
            [y],
            s=size,
            c=NODE_COLORS.get(kind, "#ffffff"),
            edgecolors="#333333",
            linewidths=0.8,
            zorder=2,
            marker="o" if kind == "card" else "s",
        )
        label = str(data["rank"]) if kind == "card" else (NODE_LABELS.get(kind) or n)
        if kind == "pcie" and topo.template.acs:
            label = "PCIe\nswitch\n(ACS)"
        ax.text(x, y, label, ha="center", va="center", fontsize=9 if kind == "card" else 6.5, zorder=3)
    for s in range(shown):
        cx = s * 4.2
        ax.text(cx, -2.6, f"server {s}", ha="center", va="center", fontsize=10, fontweight="bold")

    handles = [
        Line2D([0], [0], color=KIND_COLORS.get(k, "#000000"), linewidth=2.5, label=f"{k}  {bw / 1e9:.1f} GB/s")
        for k, bw in sorted(kinds_seen.items())
    ]
    handles += [
        Line2D(
            [0],
            [0],
            marker="o",
            linestyle="",
            markerfacecolor=NODE_COLORS["card"],
            markeredgecolor="#333333",
            markersize=10,
            label=f"NPU ({topo.template.card}), number = rank",
        )
    ]
    ax.legend(
        handles=handles,
        loc="upper left",
        bbox_to_anchor=(1.0, 1.0),
        fontsize=8,
        framealpha=0.9,
        title="link kind (per direction)",
        title_fontsize=8,
    )
    title = topo.summary()
    if shown < topo.num_servers:
        title += f"\n(first {shown} of {topo.num_servers} servers drawn)"
    ax.set_title(title, fontsize=10)
    ax.set_aspect("equal")
    ax.axis("off")
    ax.margins(0.08)
    fig.tight_layout()
    fig.savefig(os.fspath(path), bbox_inches="tight")  # keep the legend outside the axes in the file
    plt.close(fig)
    return shown


def drawn_part(topo, max_servers: int):
    """(servers shown, the subgraph drawn, node positions): the first ``max_servers`` servers with
    their NICs' leaf switches and the spine. Shared by every picture of a topology."""
    shown = min(topo.num_servers, max_servers)
    g = topo.graph
    keep = {n for n, d in g.nodes(data=True) if "server" in d and d["server"] < shown}
    keep |= {v for n in keep if g.nodes[n]["type"] == "nic" for v in g[n] if g.nodes[v]["type"] == "leaf"}
    if "spine" in g:
        keep.add("spine")
    sub = g.subgraph(keep)
    return shown, sub, _layout(topo, sub)


def _layout(topo, sub) -> dict[str, tuple[float, float]]:
    """Servers side by side: cards on a circle (device order clockwise from the top, so an
    island is an arc), CPU/PCIe roots below, the cards' NICs in a row above, switches on top."""
    pos: dict[str, tuple[float, float]] = {}
    per = topo.template.num_cards
    leaf_x: dict[str, list[float]] = {}
    for n, data in sub.nodes(data=True):
        kind = data["type"]
        if kind == "card":
            cx = data["server"] * 4.2
            angle = math.pi / 2 - 2 * math.pi * (data["device"] + 0.5) / per
            pos[n] = (cx + 1.3 * math.cos(angle), 0.3 + 1.3 * math.sin(angle))
    for n, data in sub.nodes(data=True):
        kind = data["type"]
        if kind == "pcie":  # under the middle of its own cards, so an island's PCIe links stay beneath it
            xs = [pos[v][0] for v in sub[n] if sub.nodes[v]["type"] == "card"]
            pos[n] = (sum(xs) / len(xs), -1.9)
        elif kind == "nic":
            cx = data["server"] * 4.2
            if topo.template.nic == "card":
                # a row above the cards, in the cards' left-to-right order, keeps the NIC->leaf fan short
                card = next(v for v in sub[n] if sub.nodes[v]["type"] == "card")
                order = sorted(range(per), key=lambda d: math.sin(2 * math.pi * (d + 0.5) / per))
                slot = order.index(sub.nodes[card]["device"])
                pos[n] = (cx + (slot - (per - 1) / 2) * 0.42, 2.35)
            else:
                pos[n] = (cx + 1.6, -1.9)
            leaf = next(v for v in sub[n] if sub.nodes[v]["type"] == "leaf")
            leaf_x.setdefault(leaf, []).append(cx)
    for n, data in sub.nodes(data=True):
        if data["type"] == "rc":  # beside its switch
            switch = next(v for v in sub[n] if sub.nodes[v]["type"] == "pcie")
            pos[n] = (pos[switch][0] + 1.4, pos[switch][1])
    for leaf, xs in leaf_x.items():
        pos[leaf] = (sum(xs) / len(xs), 3.7)
    if "spine" in sub:
        xs = [pos[leaf][0] for leaf in leaf_x] or [0.0]
        pos["spine"] = (sum(xs) / len(xs), 4.9)
    return pos
