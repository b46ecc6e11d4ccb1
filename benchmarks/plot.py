"""``--plot FILE.png``: busbw against size (log2 axis), one line per implementation that ran."""

from __future__ import annotations

from .collectives import get as get_collective
from .config import format_size
from .harness import BenchResult

__all__ = ["plot_busbw"]

_STYLE = {"hccl": ("tab:red", "o"), "mpi": ("tab:blue", "s"), "gloo": ("tab:green", "^")}


def plot_busbw(result: BenchResult, path: str) -> None:
    """Write the busbw-vs-size figure of ``result`` to ``path`` (PNG via matplotlib's Agg)."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    from matplotlib.ticker import FixedLocator, NullLocator

    cfg = result.cfg
    coll = get_collective(cfg.collective)
    fig, ax = plt.subplots(figsize=(9, 5.2))
    sizes: set[int] = set()
    for impl in result.ok:
        color, marker = _STYLE.get(impl.name, (None, "o"))
        xs = [r.size for r in impl.rows]
        sizes.update(xs)
        ax.plot(xs, [r.busbw for r in impl.rows], marker=marker, color=color, linewidth=1.6, markersize=4,
                label=impl.version or impl.label)
    ax.set_xscale("log", base=2)
    ax.set_yscale("log")  # busbw spans 5 decades from 8 B to 64 MiB
    ticks = sorted(sizes)
    if len(ticks) > 14:  # keep labels readable: every k-th size
        step = -(-len(ticks) // 14)
        ticks = ticks[::step]
    ax.xaxis.set_major_locator(FixedLocator(ticks))
    ax.xaxis.set_minor_locator(NullLocator())
    ax.set_xticklabels([format_size(t) for t in ticks], rotation=45, ha="right")
    ax.set_xlabel("message size (bytes)")
    ax.set_ylabel("bus bandwidth (GB/s)")
    details = f"{cfg.nranks} ranks, {cfg.dt.label}" + (f", {cfg.op}" if coll.reduces else "") + f", algo {cfg.algo}"
    repeats = f"median of {cfg.repeats} repeats" if cfg.repeats != 1 else "1 run"
    ax.set_title(f"{coll.title} busbw vs size ({details}; {repeats})")
    ax.grid(True, which="major", alpha=0.35)
    ax.grid(True, which="minor", axis="y", alpha=0.12)
    ax.legend(loc="upper left", fontsize=9)
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    plt.close(fig)
