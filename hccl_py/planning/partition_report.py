"""``hccl-bench partition``: auto vs manual vs optimized communication groups, in modeled time.

    hccl-bench partition --topology mixed-4p --workload dp-infer
    hccl-bench partition --topology mixed-4p --workload allreduce:64M --groups "1,2;0,3" --plot groups.png
    hccl-bench partition --topology ascend910-8p,2x8p-roce,8x8p-roce --workload dp-infer

For each topology it prints one table: every strategy's groups, the workload's modeled time with
hierarchical collectives on those groups, its throughput (samples/s for dp-infer, algbw for a
collective), the speedup over one card (dp-infer) and its time relative to the best strategy.
Strategies: ``auto`` (HCCL's grouping), ``manual`` (``--groups``, repeatable; by default a few
groupings a user would try by hand, e.g. the fast pair {1,2} of mixed-4p), ``optimized``
(``hccl_py.planning.partition.optimize``: exhaustive for small clusters, a link-graph heuristic beyond;
the line under the table says which), and for reference ``flat`` (the flat ring, no groups).
Everything is the simulator: no processes, deterministic, seconds even for 64 cards.

Workloads (``hccl_py.planning.partition``): ``dp-infer`` — one data-parallel inference step of the default
transformer encoder: each card's share in modeled compute, then the per-token outputs
all-gathered to every card with the hierarchical all_gather (see ``DpInferWorkload``) — or one
collective, ``allreduce:64M`` (``<collective>:<size per rank>``).

Exit status: 0, or 2 for bad arguments.
"""

from __future__ import annotations

import argparse
import json
import sys
from dataclasses import dataclass
from pathlib import Path
from typing import Sequence

from topology import Topology, TopologyError

from ..algorithms.hierarchical import format_partition
from ..errors import HcclError
from ..modeled.cost_model import CostModel
from .partition import DEFAULT_BUDGET, auto, manual, optimize, parse_workload

__all__ = ["main", "build_parser", "run", "format_table", "Row", "manual_examples"]

# What a user would try by hand on each preset when --groups is not given (named).
MANUAL_EXAMPLES: dict[str, dict[str, str]] = {
    "mixed-4p": {"fast pair {1,2} together": "1,2;0,3", "interleaved": "0,2;1,3"},
}


@dataclass(frozen=True)
class Row:
    """One line of the table: the ``strategy``, its ``partition`` (None: flat, no groups), the workload's
    modeled ``time_s`` and a ``note``."""

    strategy: str
    partition: tuple[tuple[int, ...], ...] | None  # None: flat (no groups)
    time_s: float
    note: str = ""


def manual_examples(topo) -> dict[str, str]:
    """Named manual groupings for ``topo``: the preset's own examples, else two generic ones —
    ``interleaved`` (member t of every auto group together: the transpose of HCCL's grouping)
    and ``halves`` (every auto group split in two)."""
    if topo.name in MANUAL_EXAMPLES:
        return dict(MANUAL_EXAMPLES[topo.name])
    groups = auto(topo)
    out = {}
    sizes = {len(g) for g in groups}
    if len(groups) > 1 and len(sizes) == 1 and sizes != {1}:
        out["interleaved"] = format_partition([[g[t] for g in groups] for t in range(len(groups[0]))])
    if all(len(g) >= 4 and len(g) % 2 == 0 for g in groups):
        out["halves"] = format_partition([h for g in groups for h in (g[: len(g) // 2], g[len(g) // 2 :])])
    return out


def run(topo_name: str, workload, groups: Sequence[str] = (), budget: int | None = None):
    """(topology, rows, optimize choice) for one topology; rows in table order."""
    topo = Topology.preset(topo_name)
    model = CostModel(topo)
    rows = [Row("auto", auto(topo), 0.0, "HCCL's rule")]
    named = (
        {f"manual {i + 1}" if len(groups) > 1 else "manual": g for i, g in enumerate(groups)}
        if groups
        else {f"manual: {name}": g for name, g in manual_examples(topo).items()}
    )
    rows += [Row(label, manual(spec, topo.num_ranks), 0.0) for label, spec in named.items()]
    rows = [Row(r.strategy, r.partition, workload.time_s(topo, r.partition, model), r.note) for r in rows]
    choice = optimize(topo, workload, budget=budget or DEFAULT_BUDGET, model=model)
    rows.append(Row("optimized", choice.partition, choice.time_s, choice.method))
    rows.append(Row("flat", None, workload.flat_time_s(topo, "ring", model), "ring, no groups (reference)"))
    return topo, rows, choice


def _groups_text(partition, width: int = 44) -> str:
    if partition is None:
        return "-"
    text = " ".join("{" + ",".join(map(str, g)) + "}" for g in partition)
    if len(text) > width:  # 64 cards: summarize
        sizes = sorted({len(g) for g in partition})
        size = "/".join(map(str, sizes))
        text = (
            f"{len(partition)} groups of {size}: "
            + " ".join("{" + ",".join(map(str, g)) + "}" for g in partition[:1])
            + " ..."
        )
    return text


def format_table(topo, workload, rows: Sequence[Row], choice) -> str:
    """The table for one topology (plus a header line and the optimizer's method)."""
    best = min(r.time_s for r in rows)
    one = workload.one_card_s(topo)
    dp = one is not None
    lines = [f"# {topo.summary()}", f"# workload {workload.describe(topo)}"]
    thr_head = "samples/s" if dp else "algbw GB/s"
    sw = max(len("strategy"), *(len(r.strategy) for r in rows))
    gw = max(len("groups"), *(len(_groups_text(r.partition)) for r in rows))
    head = f"{'strategy':<{sw}}  {'groups':<{gw}}  {'modeled ms':>10} {thr_head:>11} {'vs 1 card':>9} {'time/best':>9}"
    lines.append(head)
    for r in rows:
        if dp:
            throughput = f"{workload.batch_per_card * topo.num_ranks / r.time_s:,.0f}"
            speedup = f"{one / r.time_s:.2f}x"
        else:
            throughput = f"{workload.nbytes / r.time_s / 1e9:.2f}"
            speedup = "-"
        mark = " *" if r.time_s == best else ""
        lines.append(
            f"{r.strategy:<{sw}}  {_groups_text(r.partition):<{gw}}  {r.time_s * 1e3:>10.3f} {throughput:>11} "
            f"{speedup:>9} {r.time_s / best:>9.3f}{mark}"
        )
    lines.append(
        f"# optimized: {choice.detail}; {choice.evaluated} partitions simulated. flat: the flat ring, no groups"
    )
    if dp:
        lines.append(
            f"# 1 card: {workload.batch_per_card} samples in {workload.compute_s(topo, 0) * 1e3:.3f} ms "
            f"({workload.batch_per_card / workload.compute_s(topo, 0):,.0f} samples/s); * = best"
        )
    else:
        lines.append("# * = best")
    return "\n".join(lines)


def build_parser() -> argparse.ArgumentParser:
    """The argument parser of ``hccl-bench partition``."""
    p = argparse.ArgumentParser(
        prog="hccl-bench partition",
        description="Compare communication-group partitions (HCCL's auto, manual, optimized) by the modeled time "
        "of a workload with hierarchical collectives; simulator only, no processes.",
        epilog="Example: hccl-bench partition --topology mixed-4p --workload dp-infer --plot groups.png",
    )
    p.add_argument(
        "--topology",
        default="mixed-4p",
        help="preset(s), comma-separated: mixed-4p, ascend910-8p, 2x8p-roce, 8x8p-roce, ... (default mixed-4p)",
    )
    p.add_argument(
        "--workload", default="dp-infer", help="dp-infer (default) or <collective>:<size>, e.g. allreduce:64M"
    )
    p.add_argument(
        "--groups",
        action="append",
        default=[],
        metavar="PARTITION",
        help='a manual partition "0,2;1,3" or a file (JSON [[0,2],[1,3]] or that text); repeatable. '
        "Default: a few hand groupings per topology",
    )
    p.add_argument("--batch-per-card", type=int, default=64, help="dp-infer: samples per card per step (default 64)")
    p.add_argument(
        "--output",
        choices=("hidden", "logits"),
        default="hidden",
        help="dp-infer: what is all-gathered: per-token hidden states (default) or logits",
    )
    p.add_argument(
        "--dtype",
        choices=("fp16", "bf16", "fp32"),
        default=None,
        help="element type on the wire (default: fp16 for dp-infer, fp32 for a collective)",
    )
    p.add_argument(
        "--inner", default="ring", help="level0 algorithm inside groups (ring, hd, mesh, tree), default ring"
    )
    p.add_argument(
        "--outer", default="ring", help="level1 algorithm across groups (ring, hd, mesh, tree; rd for allreduce)"
    )
    p.add_argument(
        "--budget",
        type=int,
        default=None,
        help="most partitions an exhaustive search simulates before the heuristic takes over (default 1200)",
    )
    p.add_argument(
        "--plot",
        metavar="FILE.png",
        help="draw the topology with each strategy's groups (one file per topology when several: FILE-<topology>.png)",
    )
    p.add_argument("--json", metavar="FILE", help="write the rows as JSON")
    return p


def _workload(args):
    text = args.workload.strip().lower()
    itemsize = {"fp16": 2, "bf16": 2, "fp32": 4}
    if text.startswith("dp"):
        return parse_workload(
            text,
            batch_per_card=args.batch_per_card,
            output=args.output,
            dtype_bytes=itemsize[args.dtype or "fp16"],
            inner=args.inner,
            outer=args.outer,
        )
    return parse_workload(text, itemsize=itemsize[args.dtype or "fp32"], inner=args.inner, outer=args.outer)


def main(argv: Sequence[str] | None = None) -> int:
    """Run ``hccl-bench partition``: one table per topology, optionally a plot and JSON; exit status
    0, or 2 for bad arguments."""
    parser = build_parser()
    args = parser.parse_args(argv)
    names = [t.strip() for t in args.topology.split(",") if t.strip()]
    if not names:
        parser.error("--topology: give at least one preset")
    try:
        workload = _workload(args)
        results = [run(name, workload, args.groups, args.budget) for name in names]
    except (HcclError, TopologyError) as err:
        print(f"hccl-bench partition: {err}", file=sys.stderr)
        return 2
    doc = []
    for topo, rows, choice in results:
        print(format_table(topo, workload, rows, choice))
        print()
        doc.append(
            {
                "topology": topo.name,
                "workload": workload.name,
                "method": choice.method,
                "detail": choice.detail,
                "rows": [
                    {
                        "strategy": r.strategy,
                        "groups": None if r.partition is None else [list(g) for g in r.partition],
                        "modeled_s": r.time_s,
                        "note": r.note,
                    }
                    for r in rows
                ],
            }
        )
    if args.plot:
        from .partition_plot import plot_partitions  # lazy: matplotlib

        for topo, rows, _ in results:
            path = (
                args.plot
                if len(results) == 1
                else str(
                    Path(args.plot).with_name(f"{Path(args.plot).stem}-{topo.name}{Path(args.plot).suffix or '.png'}")
                )
            )
            plot_partitions(topo, [r for r in rows if r.partition is not None], path, workload.name)
            print(f"# wrote {path}")
    if args.json:
        Path(args.json).write_text(json.dumps(doc, indent=1) + "\n")
        print(f"# wrote {args.json}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
