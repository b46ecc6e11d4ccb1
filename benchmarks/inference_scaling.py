"""Inference scaling: modeled speedup and parallel efficiency of data- and pipeline-parallel
inference over 1, 2, 4 and 8 simulated cards on several topologies.

    python -m benchmarks.inference_scaling                 # tables on stdout, plot + JSON in bench-out/
    python -m benchmarks.inference_scaling --out DIR --batch 256 --microbatches 16 --cards 1,2,4,8

Every point is a real hccl-py job (``launch.spawn``: one process per card, real send/recv and
all_gather through shared memory) running ``hccl_py.parallel`` on the default transformer
encoder (8 layers, d_model 256, 4 heads, seq 128) on *dry* cards: every kernel advances the
modeled clock exactly as in a real run (a test holds it) but skips the arithmetic, so a sweep
takes seconds. The 1-card time is the whole batch in one forward on one card of the topology's
model (as ``examples/infer.py`` computes it). Modeled times are deterministic: the same command
prints the same tables.
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from dataclasses import asdict, dataclass
from pathlib import Path

TOPOLOGIES = {"ascend910-8p": 8, "ascend910b-8p": 8, "pcie-4p": 4}  # preset -> most cards it has
MODES = ("dp", "pp")


@dataclass(frozen=True)
class Point:
    """One (topology, mode, cards) point: ``modeled_s`` the makespan of the forward and ``one_card_s``
    the 1-card time (modeled seconds), ``bubble`` the pipeline's (pp only), ``wall_s`` the job's
    wall seconds (0 for 1 card: not run)."""

    topology: str
    mode: str
    cards: int
    modeled_s: float
    one_card_s: float
    bubble: float | None
    wall_s: float

    @property
    def speedup(self) -> float:
        """Modeled 1-card time over modeled time on ``cards``."""
        return self.one_card_s / self.modeled_s

    @property
    def efficiency(self) -> float:
        """Speedup per card (1.0: linear scaling)."""
        return self.speedup / self.cards


def _rank(mode: str, batch: int, microbatches: int):
    """One rank's part of a point: (start, end, bubble) in modeled seconds."""
    import hccl_py
    from hccl_py.parallel import DataParallel, PipelineParallel, TransformerEncoder

    comm = hccl_py.init()
    comm.device.dry = True
    model = TransformerEncoder()
    x = model.sample_inputs(batch)
    if mode == "dp":
        driver = DataParallel(comm, model)
    else:
        driver = PipelineParallel(comm, model, microbatches=microbatches)
    comm.barrier()
    start = comm.clock
    driver.forward(x)
    bubble = driver.last.bubble_fraction if mode == "pp" else None
    return start, comm.clock, bubble


def one_card_s(topology: str, batch: int) -> float:
    """The whole batch in one forward on one card of ``topology``'s first card model (dry)."""
    from hccl_py.parallel import TransformerEncoder
    from topology import Topology

    card = Topology.preset(topology, n=1).card(0)
    return sum(TransformerEncoder().estimate(card, batch)[0])


def run_point(topology: str, mode: str, cards: int, batch: int, microbatches: int, baseline: float) -> Point:
    """Run one point as an hccl-py job of ``cards`` ranks on ``topology`` (1 card: ``baseline``, no job)."""
    from hccl_py import env
    from launch import spawn

    if cards == 1:
        return Point(topology, mode, 1, baseline, baseline, None, 0.0)
    wall = time.perf_counter()
    results = spawn(_rank, cards, args=(mode, batch, microbatches), env={env.HCCL_PY_TOPOLOGY: topology}, timeout=300)
    wall = time.perf_counter() - wall
    makespan = max(r[1] for r in results) - min(r[0] for r in results)
    return Point(topology, mode, cards, makespan, baseline, results[0][2], wall)


def format_tables(points: list[Point], cards: list[int]) -> str:
    """The speedup and efficiency tables (modeled)."""
    lines = []
    for title, value in (
        ("speedup over 1 card (modeled)", lambda p: f"{p.speedup:.2f}x"),
        ("parallel efficiency (modeled)", lambda p: f"{100 * p.efficiency:.0f}%"),
    ):
        lines.append(f"# {title}")
        header = f"{'topology':<15} {'mode':<4} {'1 card ms':>9}" + "".join(f"{n:>9}" for n in cards)
        lines.append(header)
        for topo in dict.fromkeys(p.topology for p in points):
            for mode in MODES:
                row = {p.cards: p for p in points if p.topology == topo and p.mode == mode}
                if not row:
                    continue
                base = next(iter(row.values())).one_card_s
                cells = "".join(f"{value(row[n]) if n in row else '-':>9}" for n in cards)
                lines.append(f"{topo:<15} {mode:<4} {base * 1e3:>9.3f}{cells}")
        lines.append("")
    bubbles = [p for p in points if p.bubble is not None]
    if bubbles:
        lines.append("# pipeline bubble (pp; idle share of the pipeline span per stage)")
        for topo in dict.fromkeys(p.topology for p in bubbles):
            cells = "  ".join(f"{p.cards} cards {100 * p.bubble:.1f}%" for p in bubbles if p.topology == topo)
            lines.append(f"{topo:<15} {cells}")
    return "\n".join(lines)


def plot(points: list[Point], cards: list[int], path: Path, title: str) -> None:
    """Write the speedup curves (log-log, one panel per topology, efficiency labels) to ``path`` (PNG)."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    topologies = list(dict.fromkeys(p.topology for p in points))
    fig, axes = plt.subplots(1, len(topologies), figsize=(4.6 * len(topologies), 4.2), sharey=True, squeeze=False)
    for ax, topo in zip(axes[0], topologies):
        mine = [p for p in points if p.topology == topo]
        top = max(p.cards for p in mine)
        ticks = [n for n in cards if n <= top]
        ax.plot(ticks, ticks, color="0.6", linestyle=":", label="ideal")
        for mode, color, marker, dy in (("dp", "tab:blue", "o", 7), ("pp", "tab:orange", "s", -13)):
            row = sorted((p for p in mine if p.mode == mode), key=lambda p: p.cards)
            ax.plot([p.cards for p in row], [p.speedup for p in row], color=color, marker=marker, label=mode)
            for p in row[1:]:
                ax.annotate(
                    f"{100 * p.efficiency:.0f}%",
                    (p.cards, p.speedup),
                    textcoords="offset points",
                    xytext=(0, dy),
                    ha="center",
                    fontsize=8,
                    color=color,
                )
        ax.set_xscale("log", base=2)
        ax.set_yscale("log", base=2)  # log-log: the ideal is the diagonal
        ax.set_xticks(ticks)
        ax.set_xticklabels([str(n) for n in ticks])
        ax.set_yticks([n for n in (0.5, 1, 2, 4, 8) if n <= max(cards)])
        ax.set_yticklabels([f"{n:g}x" for n in (0.5, 1, 2, 4, 8) if n <= max(cards)])
        ax.set_ylim(0.6, max(cards) * 1.25)
        ax.set_title(topo)
        ax.set_xlabel("cards")
        ax.grid(alpha=0.3)
    axes[0][0].set_ylabel("speedup over 1 card (modeled)")
    axes[0][0].legend(loc="upper left", fontsize=9)
    fig.suptitle(title, fontsize=10)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)


def main(argv=None) -> int:
    """Run ``python -m benchmarks.inference_scaling`` with ``argv``: print the tables, write the plot
    and JSON to ``--out``."""
    parser = argparse.ArgumentParser(
        prog="python -m benchmarks.inference_scaling", description=__doc__.split("\n\n")[0]
    )
    parser.add_argument("--out", type=Path, default=Path("bench-out"), help="directory for the plot and JSON")
    parser.add_argument("--batch", type=int, default=256, help="global batch (samples)")
    parser.add_argument("--microbatches", type=int, default=16, help="micro-batches of the pipeline (pp)")
    parser.add_argument("--cards", default="1,2,4,8", help="card counts")
    parser.add_argument("--topologies", default=",".join(TOPOLOGIES), help="presets")
    parser.add_argument("--modes", default=",".join(MODES), help="dp, pp")
    parser.add_argument("--no-progress", action="store_true")
    args = parser.parse_args(argv)
    cards = [int(c) for c in args.cards.split(",")]
    topologies = [t.strip() for t in args.topologies.split(",") if t.strip()]
    modes = [m.strip() for m in args.modes.split(",") if m.strip() in MODES]
    jobs = [(t, m, n) for t in topologies for m in modes for n in cards if n <= TOPOLOGIES.get(t, 8)]
    bar = None
    if not args.no_progress:
        try:
            from tqdm import tqdm

            bar = tqdm(total=len(jobs), unit="job", desc="inference scaling", leave=False, file=sys.stderr)
        except ImportError:
            pass
    started = time.perf_counter()
    baselines = {t: one_card_s(t, args.batch) for t in topologies}
    points = []
    for topo, mode, n in jobs:
        if bar is not None:
            bar.set_postfix_str(f"{topo} {mode} {n} cards")
        points.append(run_point(topo, mode, n, args.batch, args.microbatches, baselines[topo]))
        if bar is not None:
            bar.update()
    if bar is not None:
        bar.close()
    title = (
        f"transformer encoder (8 layers, d_model 256, seq 128), batch {args.batch}, "
        f"{args.microbatches} micro-batches (pp); modeled time"
    )
    print(f"# inference scaling: {title}")
    print(
        f"# command: python -m benchmarks.inference_scaling --batch {args.batch} --microbatches {args.microbatches} "
        f"--cards {args.cards}"
    )
    print(format_tables(points, cards))
    args.out.mkdir(parents=True, exist_ok=True)
    (args.out / "inference_scaling.json").write_text(
        json.dumps(
            {
                "batch": args.batch,
                "microbatches": args.microbatches,
                "points": [{**asdict(p), "speedup": p.speedup, "efficiency": p.efficiency} for p in points],
            },
            indent=1,
        )
    )
    plot(points, cards, args.out / "inference_scaling.png", title)
    print(
        f"# plot {args.out / 'inference_scaling.png'}, data {args.out / 'inference_scaling.json'}; "
        f"{time.perf_counter() - started:.0f} s wall"
    )
    return 0


if __name__ == "__main__":
    sys.exit(main())
