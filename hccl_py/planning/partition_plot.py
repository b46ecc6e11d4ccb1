"""``hccl-bench partition --plot FILE.png``: the topology once per strategy, cards coloured by group
and each group drawn as a translucent band through its members, in ring order, over the links
(matplotlib, Agg)."""

from __future__ import annotations

import math

from topology.draw import KIND_COLORS, NODE_COLORS, NODE_LABELS, drawn_part  # the layout of hccl-topo show --png

__all__ = ["plot_partitions"]

_GROUP_COLORS = [
    "#1b9e77",
    "#d95f02",
    "#7570b3",
    "#e7298a",
    "#66a61e",
    "#e6ab02",
    "#a6761d",
    "#666666",
    "#17becf",
    "#bcbd22",
    "#8c564b",
    "#393b79",
    "#637939",
    "#8c6d31",
    "#843c39",
    "#7b4173",
]


def plot_partitions(topo, rows, path: str, workload: str, max_servers: int = 8) -> None:
    """One panel per row (strategy, partition, modeled time) of ``rows``: the first
    ``max_servers`` servers of ``topo`` with link kinds coloured and the row's groups drawn."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    from matplotlib.lines import Line2D

    shown, sub, pos = drawn_part(topo, max_servers)
    best = min(r.time_s for r in rows)
    cols = 2 if shown == 1 else 1
    nrows = math.ceil(len(rows) / cols)
    fig, axes = plt.subplots(nrows, cols, figsize=((3.0 + 3.6 * shown) * cols, 5.0 * nrows), dpi=100, squeeze=False)
    for ax in axes.flat[len(rows) :]:
        ax.axis("off")
    kinds_seen: dict[str, float] = {}
    for ax, row in zip(axes.flat, rows):
        for u, v, spec in sub.edges(data="spec"):
            ax.plot(
                [pos[u][0], pos[v][0]],
                [pos[u][1], pos[v][1]],
                color=KIND_COLORS.get(spec.kind, "#000000"),
                linewidth=2.0 if spec.kind.startswith("HCCS") else 0.9,
                alpha=0.45,
                zorder=1,
            )
            kinds_seen.setdefault(
                spec.kind,
                topo.link_kinds[spec.kind].bandwidth_Bps if spec.kind in topo.link_kinds else spec.bandwidth_Bps,
            )
        group_of = {r: i for i, grp in enumerate(row.partition) for r in grp}
        for i, grp in enumerate(row.partition):  # the group: a band through its members in ring order
            color = _GROUP_COLORS[i % len(_GROUP_COLORS)]
            pts = [pos[f"card{r}"] for r in grp if f"card{r}" in pos]
            if len(pts) > 1:
                loop = pts + ([pts[0]] if len(pts) > 2 else [])
                ax.plot(
                    [p[0] for p in loop],
                    [p[1] for p in loop],
                    color=color,
                    linewidth=16,
                    alpha=0.22,
                    solid_capstyle="round",
                    solid_joinstyle="round",
                    zorder=2,
                )
        for n, data in sub.nodes(data=True):
            x, y = pos[n]
            if data["type"] == "card":
                color = _GROUP_COLORS[group_of[data["rank"]] % len(_GROUP_COLORS)]
                ax.scatter([x], [y], s=420, c=color, edgecolors="#222222", linewidths=0.8, zorder=3)
                ax.text(
                    x,
                    y,
                    str(data["rank"]),
                    ha="center",
                    va="center",
                    fontsize=8,
                    color="white",
                    fontweight="bold",
                    zorder=4,
                )
            else:
                ax.scatter(
                    [x],
                    [y],
                    s=260,
                    c=NODE_COLORS.get(data["type"], "#dddddd"),
                    edgecolors="#555555",
                    linewidths=0.6,
                    marker="s",
                    zorder=3,
                )
                label = (
                    "PCIe switch\n(ACS)"
                    if data["type"] == "pcie" and topo.template.acs
                    else NODE_LABELS.get(data["type"])
                )
                if label and shown <= 2:
                    ax.text(x + 0.25, y, label, ha="left", va="center", fontsize=6.5, color="#333333", zorder=4)
        groups = len(row.partition)
        sizes = "/".join(str(s) for s in sorted({len(grp) for grp in row.partition}))
        mark = "  (best)" if row.time_s == best else f"  ({row.time_s / best:.2f}x the best)"
        ax.set_title(
            f"{row.strategy}: {groups} group{'s' if groups != 1 else ''} of {sizes} — "
            f"{row.time_s * 1e3:.3f} ms modeled{mark}",
            fontsize=10,
        )
        ax.set_aspect("equal")
        ax.axis("off")
        ax.margins(0.06)
    handles = [
        Line2D([0], [0], color=KIND_COLORS.get(k, "#000000"), linewidth=2.5, label=f"{k}  {bw / 1e9:.1f} GB/s")
        for k, bw in sorted(kinds_seen.items())
    ]
    handles.append(Line2D([0], [0], color="#777777", linewidth=8, alpha=0.3, label="a group (its level0 ring)"))
    axes[0, -1].legend(
        handles=handles,
        loc="upper left",
        bbox_to_anchor=(1.0, 1.0),
        fontsize=8,
        framealpha=0.9,
        title="link kind (per direction)",
        title_fontsize=8,
    )
    title = f"{workload} on {topo.summary()}"
    if shown < topo.num_servers:
        title += f" (first {shown} of {topo.num_servers} servers drawn)"
    fig.suptitle(title, fontsize=11)
    fig.tight_layout(rect=(0, 0, 1, 0.97))
    fig.savefig(path, bbox_inches="tight")
    plt.close(fig)
