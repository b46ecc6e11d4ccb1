"""What hccl-bench prints and writes: nccl-tests-style tables, the ratio table, the JSON document.

Data lines carry no ``#``; everything else does, so ``grep -v '^#'`` leaves the numbers.
"""

from __future__ import annotations

import dataclasses
import math
import os
import platform
from collections.abc import Sequence
from typing import Any

from .collectives import get as get_collective
from .config import BenchConfig
from .harness import BenchResult, ImplResult, Row

__all__ = [
    "format_table",
    "format_ratios",
    "format_report",
    "ratios",
    "to_json",
    "SCHEMA",
    "scaling",
    "format_scaling",
    "scaling_to_json",
    "SCALING_SCHEMA",
]

SCHEMA = "hccl-bench/1"
SCALING_SCHEMA = "hccl-bench-scaling/1"  # -n 2,4: one hccl-bench/1 document per world size, and the ratios

_HEAD = ("size", "count", "type", "redop", "root", "time", "algbw", "busbw", "#wrong")
_UNITS = ("(B)", "(elements)", "", "", "", "(us)", "(GB/s)", "(GB/s)", "")
_WIDTHS = (12, 12, 8, 6, 6, 10, 8, 8, 7)


def _redop_root(cfg: BenchConfig) -> tuple[str, int]:
    coll = get_collective(cfg.collective)
    return (cfg.op if coll.reduces else "none"), (cfg.root if coll.rooted else -1)


def _num(value: float, width: int, decimals: int = 2) -> str:
    if value is None or not math.isfinite(value):
        return "-".rjust(width)
    text = f"{value:.{decimals}f}"
    return text.rjust(width)


def format_table(cfg: BenchConfig, impl: ImplResult) -> str:
    """One implementation's rows as nccl-tests prints them (plus its extra columns)."""
    redop, root = _redop_root(cfg)
    cols = impl.extra_columns
    head = "  ".join(h.rjust(w) for h, w in zip(_HEAD, _WIDTHS)) + "".join("  " + c.header.rjust(c.width) for c in cols)
    units = "  ".join(u.rjust(w) for u, w in zip(_UNITS, _WIDTHS)) + "".join("  " + "".rjust(c.width) for c in cols)
    lines = [
        f"# {impl.label}: {impl.version}; {impl.mode}" + (f"; algo={cfg.algo}" if impl.name == "hccl" else ""),
        "#",
        "#" + head[1:],
        "#" + units[1:],
    ]
    for r in impl.rows:
        fields = [
            str(r.size).rjust(12),
            str(r.count).rjust(12),
            cfg.dt.label.rjust(8),
            redop.rjust(6),
            str(root).rjust(6),
            _num(r.time_us, 10),
            _num(r.algbw, 8),
            _num(r.busbw, 8),
            ("N/A" if r.wrong is None else str(r.wrong)).rjust(7),
        ]
        line = "  ".join(fields)
        for c in cols:
            value = r.extra.get(c.key)
            line += "  " + (c.fmt.format(value) if value is not None and math.isfinite(value) else "-").rjust(c.width)
        lines.append(line)
    wrong = _total_wrong(impl.rows)
    avg = sum(r.busbw for r in impl.rows) / len(impl.rows) if impl.rows else float("nan")
    lines.append(
        f"# Out of bounds values : {'N/A' if wrong is None else wrong} "
        f"{'' if wrong is None else ('OK' if wrong == 0 else 'FAILED')}".rstrip()
    )
    lines.append(f"# Avg bus bandwidth    : {avg:.4g} GB/s")
    return "\n".join(lines)


def _total_wrong(rows: Sequence[Row]) -> int | None:
    wrongs = [r.wrong for r in rows]
    return None if any(w is None for w in wrongs) else sum(w for w in wrongs if w is not None)


def ratios(base: ImplResult, peer: ImplResult) -> list[dict[str, float]]:
    """Per size both measured: time base/peer (< 1: base faster) and busbw base/peer (> 1: base faster)."""
    theirs = {r.size: r for r in peer.rows}
    out = []
    for r in base.rows:
        p = theirs.get(r.size)
        if p is None:
            continue
        out.append(
            {
                "size": r.size,
                "time_ratio": r.time_us / p.time_us if p.time_us > 0 else math.inf,
                "busbw_ratio": r.busbw / p.busbw if p.busbw > 0 else math.inf,
            }
        )
    return out


def format_ratios(result: BenchResult) -> str:
    """The --vs table: hccl-py / peer per size, for every peer that ran."""
    base = result.impls.get("hccl")
    peers = [i for i in result.ok if i.name != "hccl"]
    if base is None or base.status != "ok" or not peers:
        return ""
    per_peer = {p.name: {d["size"]: d for d in ratios(base, p)} for p in peers}
    head = "size".rjust(12) + "".join(f"  {'time/' + p.name:>11}  {'busbw/' + p.name:>11}" for p in peers)
    lines = [
        f"# {base.label} / peer, per size (median of {result.cfg.repeats}): "
        "time ratio < 1 and busbw ratio > 1 mean hccl-py is faster",
        "#",
        "#" + head[1:],
    ]
    for r in base.rows:
        line = str(r.size).rjust(12)
        for p in peers:
            d = per_peer[p.name].get(r.size)
            line += "".join(f"  {_num(d[k], 11, 3) if d else '-'.rjust(11)}" for k in ("time_ratio", "busbw_ratio"))
        lines.append(line)
    return "\n".join(lines)


def format_header(cfg: BenchConfig) -> str:
    """The two ``#`` lines above the tables: the collective and its settings (ranks, type, redop and
    root where they apply, warmup, iters, repeats, check), the cores, and what the time column is."""
    coll = get_collective(cfg.collective)
    redop, root = _redop_root(cfg)
    parts = [f"{cfg.nranks} rank{'s' if cfg.nranks != 1 else ''}", f"type {cfg.dt.label}"]
    if coll.reduces:
        parts.append(f"redop {redop}")
    if coll.rooted:
        parts.append(f"root {root}")
    parts += [
        f"warmup {cfg.warmup}",
        f"iters {cfg.iters}",
        f"repeats {cfg.repeats}",
        f"check {'on' if cfg.check else 'off'}",
    ]
    cores = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else os.cpu_count()
    return "\n".join(
        [
            f"# hccl-bench {cfg.collective} ({coll.title}): " + ", ".join(parts),
            f"# {cores} cores{' (ranks oversubscribe them)' if cores and cfg.nranks > cores else ''}; "
            "time = max over ranks of the mean of back-to-back iterations, median over repeats",
        ]
    )


def format_report(result: BenchResult) -> str:
    """Header, one table per implementation that ran, then the ratio table (if any peer ran)."""
    blocks = [format_header(result.cfg)]
    for impl in result.ok:
        blocks.append(format_table(result.cfg, impl))
    ratio = format_ratios(result)
    if ratio:
        blocks.append(ratio)
    return "\n#\n".join(blocks)


def _finite(value: float | None) -> float | None:
    return value if value is not None and math.isfinite(value) else None


def to_json(result: BenchResult) -> dict[str, Any]:
    """The machine-readable result (schema ``hccl-bench/1``; see benchmarks/README.md)."""
    cfg = result.cfg
    coll = get_collective(cfg.collective)
    redop, root = _redop_root(cfg)
    impls: dict[str, Any] = {}
    for impl in result.impls.values():
        impls[impl.name] = {
            "label": impl.label,
            "status": impl.status,
            "reason": impl.reason,
            "version": impl.version,
            "mode": impl.mode,
            "extra_columns": [c.key for c in impl.extra_columns],
            "rows": [
                {
                    "size": r.size,
                    "count": r.count,
                    "type": cfg.dt.label,
                    "redop": redop,
                    "root": root,
                    "time_us": _finite(r.time_us),
                    "algbw_gbps": _finite(r.algbw),
                    "busbw_gbps": _finite(r.busbw),
                    "wrong": r.wrong,
                    "times_us": [_finite(t) for t in r.times_us],
                    "extra": {k: _finite(v) for k, v in r.extra.items()},
                }
                for r in impl.rows
            ],
        }
    base = result.impls.get("hccl")
    ratio_doc = {}
    if base is not None and base.status == "ok":
        for peer in result.ok:
            if peer.name != "hccl":
                ratio_doc[peer.name] = [
                    {k: (_finite(v) if k != "size" else v) for k, v in d.items()} for d in ratios(base, peer)
                ]
    return {
        "schema": SCHEMA,
        "collective": cfg.collective,
        "title": coll.title,
        "bus_factor": coll.bus_factor(cfg.nranks),
        "config": {k: (list(v) if isinstance(v, tuple) else v) for k, v in dataclasses.asdict(cfg).items()},
        "machine": {
            "cores": len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else os.cpu_count(),
            "python": platform.python_version(),
            "platform": platform.platform(),
        },
        "implementations": impls,
        "ratios": ratio_doc,
    }


def scaling(results: Sequence[BenchResult]) -> dict[str, list[dict[str, float]]]:
    """Per implementation that ran at the first world size and at a later one, per size: time at
    the later size / time at the first (``time_ratio``; 1.0 is perfect scaling of the time) and
    busbw at the later / busbw at the first (``busbw_ratio``: the time per bus byte, as nccl-tests
    normalises across world sizes)."""
    first = results[0]
    out: dict[str, list[dict[str, float]]] = {}
    for base in first.ok:
        rows = []
        for later in results[1:]:
            impl = later.impls.get(base.name)
            if impl is None or impl.status != "ok":
                continue
            theirs = {r.size: r for r in impl.rows}
            for r in base.rows:
                p = theirs.get(r.size)
                if p is not None:
                    rows.append(
                        {
                            "nranks": later.cfg.nranks,
                            "size": r.size,
                            "time_ratio": p.time_us / r.time_us if r.time_us > 0 else math.inf,
                            "busbw_ratio": p.busbw / r.busbw if r.busbw > 0 else math.inf,
                        }
                    )
        if rows:
            out[base.name] = rows
    return out


def format_scaling(results: Sequence[BenchResult]) -> str:
    """The -n 2,4 table: per size, every implementation's time at each later world size over its
    time at the first (its own scaling, measured in the same invocation)."""
    table = scaling(results)
    if not table:
        return ""
    n0 = results[0].cfg.nranks
    labels = {impl.name: impl.label for impl in results[0].ok}
    later = [r.cfg.nranks for r in results[1:]]
    columns = [(name, n) for name in table for n in later if any(d["nranks"] == n for d in table[name])]
    heads = [f"{labels[name]} {n}/{n0}" for name, n in columns]
    width = max(12, *(len(h) for h in heads))
    lookup = {(name, d["nranks"], d["size"]): d for name, rows in table.items() for d in rows}
    coll = get_collective(results[0].cfg.collective)
    factors = ", ".join(f"{coll.bus_factor(r.cfg.nranks):.3g} at -n {r.cfg.nranks}" for r in results)
    lines = [
        f"# scaling: each implementation's time at -n N / its time at -n {n0}, per size (medians of "
        f"{results[0].cfg.repeats}, same invocation, alternating); busbw factor {factors}",
        "#",
        "#" + ("size".rjust(12) + "".join("  " + h.rjust(width) for h in heads))[1:],
    ]
    for size in sorted({d["size"] for rows in table.values() for d in rows}):
        line = str(size).rjust(12)
        for name, n in columns:
            d = lookup.get((name, n, size))
            line += "  " + (_num(d["time_ratio"], width, 2) if d else "-".rjust(width))
        lines.append(line)
    return "\n".join(lines)


def scaling_to_json(results: Sequence[BenchResult]) -> dict[str, Any]:
    """-n 2,4 as JSON (schema ``hccl-bench-scaling/1``): every world size's ``hccl-bench/1``
    document, and the scaling ratios per implementation."""
    return {
        "schema": SCALING_SCHEMA,
        "nranks": [r.cfg.nranks for r in results],
        "results": [to_json(r) for r in results],
        "scaling": {
            name: [{k: (_finite(v) if k not in ("size", "nranks") else v) for k, v in d.items()} for d in rows]
            for name, rows in scaling(results).items()
        },
    }
