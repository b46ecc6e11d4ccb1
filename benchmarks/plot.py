"""``--plot FILE.png``: busbw against size (log2 axis), one line per implementation that ran (and
per world size, for ``-n 2,4``: a line style each)."""

from __future__ import annotations

from collections.abc import Sequence

from topology.units import format_size

from .collectives import get as get_collective
from .harness import BenchResult

__all__ = ["plot_busbw"]

_STYLE = {"hccl": ("tab:red", "o"), "mpi": ("tab:blue", "s"), "gloo": ("tab:green", "^")}
_LINES = ("-", "--", ":", "-.")


def plot_busbw(results: BenchResult | Sequence[BenchResult], path: str) -> None:
    """Write the busbw-vs-size figure of ``results`` (one, or one per world size) to ``path``
    (PNG via matplotlib's Agg)."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    from matplotlib.ticker import FixedLocator, NullLocator

    results = [results] if isinstance(results, BenchResult) else list(results)
    cfg = results[0].cfg
    coll = get_collective(cfg.collective)
    fig, ax = plt.subplots(figsize=(9, 5.2))
    sizes: set[int] = set()
    for k, result in enumerate(results):
        for impl in result.ok:
            color, marker = _STYLE.get(impl.name, (None, "o"))
            xs = [r.size for r in impl.rows]
            sizes.update(xs)
            label = (impl.version or impl.label) + (f", {result.cfg.nranks} ranks" if len(results) > 1 else "")
            ax.plot(
                xs,
                [r.busbw for r in impl.rows],
                marker=marker,
                color=color,
                linestyle=_LINES[k % len(_LINES)],
                linewidth=1.6,
                markersize=4,
                label=label,
            )
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
    ranks = ",".join(str(r.cfg.nranks) for r in results)
    details = f"{ranks} ranks, {cfg.dt.label}" + (f", {cfg.op}" if coll.reduces else "") + f", algo {cfg.algo}"
    repeats = f"median of {cfg.repeats} repeats" if cfg.repeats != 1 else "1 run"
    ax.set_title(f"{coll.title} busbw vs size ({details}; {repeats})")
    ax.grid(True, which="major", alpha=0.35)
    ax.grid(True, which="minor", axis="y", alpha=0.12)
    ax.legend(loc="upper left", fontsize=9)
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    plt.close(fig)
