"""A per-rank timeline picture (matplotlib, Agg): one row per rank, compute / communication /
waiting segments in modeled milliseconds.

    plot_timelines("timeline.png", [r.segments for r in reports], [f"rank {r.rank}" for r in reports],
                   title="hybrid, 4 x Ascend 910")
"""

from __future__ import annotations

from pathlib import Path
from typing import Sequence

from .timeline import Segment

COLORS = {"compute": "#2f6db5", "comm": "#f28e2b", "wait": "#d9d9d9"}
NAMES = {"compute": "compute", "comm": "communication", "wait": "waiting for a peer"}


def _merge(segments: Sequence[Segment]) -> list[tuple[str, str, float, float]]:
    """Adjacent segments of one kind and one piece (label up to the block name) drawn as one."""
    merged: list[list] = []
    for seg in sorted(segments, key=lambda s: s.start):
        group = seg.label.rsplit(" ", 1)[0] if seg.kind == "compute" and " " in seg.label else seg.label
        if merged and merged[-1][0] == seg.kind and merged[-1][1] == group and abs(merged[-1][3] - seg.start) < 1e-12:
            merged[-1][3] = seg.end
        else:
            merged.append([seg.kind, group, seg.start, seg.end])
    return [tuple(m) for m in merged]


def plot_timelines(
    path: str | Path,
    timelines: Sequence[Sequence[Segment]],
    labels: Sequence[str],
    *,
    title: str = "",
    origin_s: float | None = None,
) -> Path:
    """Draw and save the picture; returns ``path``. ``origin_s``: modeled time shown as 0."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    from matplotlib.patches import Patch

    origin = origin_s if origin_s is not None else min((s.start for tl in timelines for s in tl), default=0.0)
    end = max((s.end for tl in timelines for s in tl), default=origin + 1e-6)
    span_ms = (end - origin) * 1e3
    rows = len(timelines)
    fig, ax = plt.subplots(figsize=(13, 1.4 + 0.62 * rows), dpi=110)
    for row, segments in enumerate(timelines):
        y = rows - 1 - row
        for kind, group, start, stop in _merge(segments):
            x0, width = (start - origin) * 1e3, (stop - start) * 1e3
            height = 0.62 if kind == "compute" else 0.42
            ax.broken_barh(
                [(x0, width)],
                (y - height / 2, height),
                facecolors=COLORS[kind],
                edgecolor="white" if kind == "compute" else "none",
                linewidth=0.6,
                zorder=3 if kind == "comm" else 2,
            )  # asynchronous calls: drawn over the compute they overlap
            if kind == "compute" and width > span_ms * 0.035 and group.startswith(("mb ", "piece ")):
                ax.text(
                    x0 + width / 2,
                    y,
                    group.replace("piece ", "p").replace("mb ", "mb"),
                    ha="center",
                    va="center",
                    fontsize=7,
                    color="white",
                )
    ax.set_yticks(range(rows))
    ax.set_yticklabels(list(reversed(labels)), fontsize=9)
    ax.set_xlim(0, span_ms * 1.01)
    ax.set_ylim(-0.6, rows - 0.4)
    ax.set_xlabel("modeled time (ms)")
    ax.grid(axis="x", alpha=0.3)
    ax.set_axisbelow(True)
    ax.legend(
        handles=[Patch(facecolor=COLORS[k], label=NAMES[k]) for k in COLORS],
        loc="upper center",
        bbox_to_anchor=(0.5, -0.16 if rows > 3 else -0.3),
        ncol=3,
        frameon=False,
        fontsize=9,
    )
    if title:
        ax.set_title(title, fontsize=10)
    fig.tight_layout()
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(path)
    plt.close(fig)
    return path
